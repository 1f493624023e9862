"""Write a model folder to check the GPU path on, built offline with random weights.

    python -m experiments.build_check_pipeline --size real|tiny [--kind dit|llm] --out DIR

`--kind dit` (default): a diffusers QwenImagePipeline folder (`experiments.qwen_image_folder`):
`real` is the released transformer (20B, bfloat16, written in 5 GiB shards as it is drawn, so host
memory stays near one shard), the text encoder at Qwen2.5-VL-7B's width with a few of its layers,
the released VAE config, an offline tokenizer; `tiny` the same architecture at toy size (what CI
trains). `--kind llm`: a Qwen2.5-7B-shaped causal LM folder, or the tiny one
(`experiments.qwen_lm_folder`). The real weights cannot be downloaded on the machines Spotlight is
checked on, and random ones time and size a run as well as released ones do.

A folder that already holds a finished build of the same size and kind (its `check-build.json`)
is kept; one this script began and did not finish (its mark says so) is built again; anything else
at `--out` that is not empty — a user's own model folder above all — is refused, never removed.
Exit 0 with the folder's path on the last line; 2 with one line for bad input.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

MARK = "check-build.json"
"""Written first into the folder a build makes (`finished: false`) and rewritten last (`true`):
what was built (size, kind, seed), and whether the build got to its end."""


def _mark(out: Path) -> dict | None:
    try:
        mark = json.loads((out / MARK).read_text())
    except (OSError, ValueError):
        return None
    return mark if isinstance(mark, dict) else None


def built(out: Path, size: str, kind: str, seed: int = 0) -> bool:
    """Whether `out` holds a finished build of that size, kind and seed."""
    return _mark(out) == {"size": size, "kind": kind, "seed": seed, "finished": True}


def build(out: str | Path, size: str = "tiny", kind: str = "dit", seed: int = 0, say=print) -> Path:
    """Write the folder (module docstring) at `out` unless a finished one of the same build is there;
    returns `out`. A folder left by a build cut short is removed and built again."""
    out = Path(out)
    if built(out, size, kind, seed):
        say(f"{out}: already built ({size} {kind})")
        return out
    if out.exists() or out.is_symlink():
        mark = _mark(out) if out.is_dir() and not out.is_symlink() else None
        if mark is not None and mark.get("finished") is False:
            shutil.rmtree(out)  # a build of this script's, cut short
        elif not (out.is_dir() and not out.is_symlink() and not any(out.iterdir())):
            raise ValueError(f"--out: {out} exists and is not a check build of this size and kind (expected a new "
                             "folder; nothing was removed)")
    what = {"size": size, "kind": kind, "seed": seed}
    out.mkdir(parents=True, exist_ok=True)
    (out / MARK).write_text(json.dumps({**what, "finished": False}))
    start = time.perf_counter()

    def progress(what: str, done: int, total: int) -> None:
        say(f"  {what}: {done / 2**30:.1f} of {total / 2**30:.1f} GiB written ({time.perf_counter() - start:.0f} s)")

    if kind == "dit":
        from experiments.qwen_image_folder import save_real_qwen_pipeline, save_tiny_qwen_pipeline

        save_real_qwen_pipeline(out, seed, progress) if size == "real" else save_tiny_qwen_pipeline(out, seed)
    else:
        from experiments.qwen_lm_folder import save_real_lm, save_tiny_lm

        save_real_lm(out, seed, progress) if size == "real" else save_tiny_lm(out, seed)
    (out / MARK).write_text(json.dumps({**what, "finished": True}))
    gib = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 2**30
    say(f"{out}: {size} {kind} folder built, {gib:.2f} GiB in {time.perf_counter() - start:.0f} s")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.build_check_pipeline",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=("real", "tiny"), required=True)
    parser.add_argument("--kind", choices=("dit", "llm"), default="dit")
    parser.add_argument("--out", required=True, help="the folder to write (new, or a finished build of the same)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        build(args.out, args.size, args.kind, args.seed)
    except ValueError as err:
        print(f"build_check_pipeline: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
