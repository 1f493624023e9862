"""The GPU path end to end in one command: `spotlight train` of Qwen-Image-sized iterations on one
GPU, timed phase by phase (`make gpu-check`, `experiments/gpu_check.sh`).

    python -m experiments.gpu_check [--out runs/gpu-check] [--folder DIR] [--steps 3] [--size real|tiny]

1. Builds the check pipeline folder if it is not there (`experiments.build_check_pipeline`: the
   released transformer's size with random weights; default folder ~/.cache/spotlight/check-<size>).
2. Runs `spotlight train` on it with `experiments/qwen_image_ocr_lora.yaml`'s values at 512², the
   local runtime on one GPU — the batch sized down so that the whole check fits a device session
   (`CHECK`: 2 prompts x 4 samples, the recipe's micro-batch of 4, an evaluation and a checkpoint
   every iteration) — for `--steps - 1` iterations, then resumes it for the last one (the resume
   path runs on the GPU too).
3. Prints one table: seconds per phase (the first iteration apart: it compiles and warms the
   allocator; the rollout split into the prompt encoding, the denoising and the VAE decode), per
   sample, the samples a pass holds, the peak GPU memory against the memory estimate's, and where
   the run folder is; and writes it as `gpu-check.json` in the run folder (what
   docs/measurements.md and the simulator's step times take their figures from).
4. On CUDA, records the GPU constants it measured (the memory outside torch's allocator, the
   allocator's slack) in spotlight/gpu_measured.json, which the memory estimate reads from then on
   (`spotlight.device_constants`), and says how far the estimate is from the measured peak with
   the assumed constants and with the measured ones (issue 39's bar: within 15%).

Without CUDA it says so in one line and runs the tiny CPU version of the same (seconds; CI runs it:
tests/experiments/test_gpu_check.py), then exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import asdict
from datetime import date
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "experiments" / "qwen_image_ocr_lora.yaml"
PROMPTS = ROOT / "experiments" / "tiny_dit_ocr.txt"
PHASES = ("eval", "encode", "rollout", "decode", "reward", "advantage", "update", "publish", "checkpoint")
"""The phases the table times, in the order an iteration runs them (`time_<phase>_s` of metrics.jsonl;
the checkpoint's from summary.json's `checkpoint_s`). `rollout` is the rollout phase less the
`encode` and `decode` inside it: the denoising (and the queue's bookkeeping)."""
WITHIN = 0.15
"""How close the memory estimate must come to the measured peak (issue 39, item 4)."""

CHECK = {"train": {"prompts_per_step": 2, "group_size": 4, "eval_prompts": 2, "eval_seeds": 2, "eval_every": 1,
                   "checkpoint_every": 1},
         "prompts": {"path": str(PROMPTS)},
         "runtime": {"kind": "local"}}
"""What the check changes of the recipe beyond the model folder: 8 samples an iteration instead of
512 (32 prompts x 16), so that three iterations of the 20B transformer fit a device session of
minutes; the passes keep the recipe's micro-batch (4) and guidance, so their shapes are the
recipe's. The prompts: two-digit numbers on a sign (the OCR task's kind)."""
TINY = {"device": "cpu", "policy": {"dit": {"preset": "tiny", "resolution": 32}, "lora": {"rank": 4, "alpha": 8}},
        "sampler": {"num_steps": 4}}
"""The CPU version: the tiny pipeline at 32 px, 4 steps, rank-4 adapters (the tiny transformer is 32
wide); every phase still runs."""


def check_config(folder: Path, size: str) -> dict[str, Any]:
    """The run config the check trains: the recipe, `CHECK`, the folder (and `TINY` for the CPU)."""
    from spotlight.config import merge_sections

    cfg = merge_sections(yaml.safe_load(RECIPE.read_text()), CHECK)
    cfg = merge_sections(cfg, {"policy": {"dit": {"pretrained_path": str(folder)}}})
    return merge_sections(cfg, TINY) if size == "tiny" else cfg


def _train(config: Path, out: Path, steps: int) -> None:
    """`spotlight train` in a process of its own (its GPU memory is its own), output shown."""
    argv = [sys.executable, "-m", "spotlight.cli", "train", str(config), "--out", str(out), "--steps", str(steps),
            "--runtime", "local", "--no-progress"]
    print("$ " + " ".join(argv[2:]), flush=True)
    # The estimate is what the check compares with its measured peak: it must not stop the run first.
    env = {**os.environ, "SPOTLIGHT_MEMORY_CHECK": "off"}
    done = subprocess.run(argv, cwd=ROOT, env=env)
    if done.returncode != 0:
        raise SystemExit(f"gpu-check: spotlight train exited {done.returncode}")


def memory(summary: dict[str, Any], est: Any, gpu: str | None) -> dict[str, Any]:
    """The run's GPU memory (summary.json's `device_*` fields) against the estimate `est`, with the
    assumed constants and with the ones this run measured (`constants`, for `record`); on a
    CPU run only the host estimate."""
    from spotlight.device_constants import ASSUMED, DeviceConstants

    peak, allocated, outside = (summary.get(k) for k in ("device_peak_bytes", "device_peak_allocated_bytes",
                                                         "device_outside_bytes"))
    if peak is None or not allocated or outside is None:
        return {"estimate_host_bytes": est.host}
    measured = peak + outside  # what the process held on its GPU at its peak
    constants = DeviceConstants(outside, peak / allocated - 1, f"{gpu}, {date.today().isoformat()} (make gpu-check)")
    with_assumed, with_measured = ASSUMED.device_bytes(est.device_tensors), constants.device_bytes(est.device_tensors)
    return {"estimate_host_bytes": est.host, "measured_bytes": measured, "peak_reserved_bytes": peak,
            "peak_allocated_bytes": allocated, "outside_allocator_bytes": outside,
            "estimate_tensors_bytes": est.device_tensors,
            "estimate_assumed_bytes": with_assumed, "error_assumed": with_assumed / measured - 1,
            "estimate_measured_bytes": with_measured, "error_measured": with_measured / measured - 1,
            "within": WITHIN, "within_met": abs(with_measured / measured - 1) <= WITHIN,
            "constants": asdict(constants)}


def table(out: Path, config: dict[str, Any], gpu: str | None = None) -> dict[str, Any]:
    """The check's figures from run folder `out` (module docstring, step 3); `gpu`: the device's name."""
    from spotlight.config import default_config
    from spotlight.memory_estimate import estimate

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary = json.loads((out / "summary.json").read_text())
    seconds = {p: [r.get(f"time_{p}_s") for r in rows] for p in PHASES if p != "checkpoint"}
    seconds["rollout"] = [r["time_rollout_s"] - r.get("time_encode_s", 0) - r.get("time_decode_s", 0) for r in rows]
    seconds["checkpoint"] = list(summary.get("checkpoint_s") or [])
    samples = rows[-1]["samples"]
    phases = {}
    for phase in PHASES:
        got = [s for s in seconds[phase] if s is not None]
        later = got[1:] or got
        phases[phase] = {"first_s": got[0] if got else None, "later_s": statistics.mean(later) if later else None,
                         "per_sample_s": statistics.mean(later) / samples if later else None}
    cfg = default_config(config)
    return {"size": "real" if cfg.policy.dit.preset == "qwen-image" else "tiny", "device": cfg.device,
            "iterations": len(rows), "samples_per_iteration": samples,
            "samples_per_pass": {"rollout": cfg.train.group_size, "update": cfg.train.micro_batch},
            "phases": phases, "iteration_s": statistics.mean(r["wall_s"] for r in rows[1:] or rows),
            "memory": memory(summary, estimate(cfg), gpu), "run_folder": str(out),
            "reward_first": summary.get("reward_first"),
            "reward_last": summary.get("reward_last"), "resumed_from": summary.get("resumed_from")}


def show(t: dict[str, Any]) -> str:
    """The table as a user reads it."""
    per_pass = t["samples_per_pass"]
    lines = [f"gpu-check ({t['size']} Qwen-Image, {t['device']}): {t['iterations']} iterations of "
             f"{t['samples_per_iteration']} samples, {per_pass['rollout']} a rollout pass (a prompt's group), "
             f"{per_pass['update']} an update pass; "
             f"{t['iteration_s']:.2f} s an iteration after the first",
             f"{'phase':<11}{'first s':>10}{'later s':>10}{'per sample s':>14}"]
    for phase, p in t["phases"].items():
        cells = [f"{p[k]:.3f}" if p[k] is not None else "-" for k in ("first_s", "later_s", "per_sample_s")]
        lines.append(f"{phase:<11}{cells[0]:>10}{cells[1]:>10}{cells[2]:>14}")
    m = t["memory"]
    if "measured_bytes" in m:
        gib = {k: m[k] / 2**30 for k in m if k.endswith("_bytes")}
        met = "within" if m["within_met"] else "NOT within"
        lines.append(f"peak GPU memory {gib['measured_bytes']:.1f} GiB (tensors {gib['peak_allocated_bytes']:.1f}, "
                     f"allocator slack {m['constants']['allocator_slack']:.0%}, outside the allocator "
                     f"{gib['outside_allocator_bytes']:.2f}); estimated {gib['estimate_assumed_bytes']:.1f} GiB with "
                     f"the assumed constants ({m['error_assumed']:+.0%}), {gib['estimate_measured_bytes']:.1f} GiB "
                     f"with these ({m['error_measured']:+.0%}: {met} {m['within']:.0%})")
    lines.append(f"the run: {t['run_folder']} (resumed from iteration {t['resumed_from']}; gpu-check.json there)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="runs/gpu-check", help="the run folder (new; default runs/gpu-check)")
    parser.add_argument("--folder", help="the check pipeline folder (default ~/.cache/spotlight/check-SIZE)")
    parser.add_argument("--steps", type=int, default=3, help="iterations, at least 2 (the last one resumed)")
    parser.add_argument("--size", choices=("real", "tiny"), help="default: real on a CUDA GPU, else tiny")
    args = parser.parse_args(argv)
    import torch

    from experiments.build_check_pipeline import build

    cuda = torch.cuda.is_available()
    if not cuda:
        print("gpu-check: no CUDA GPU here: running the tiny CPU version only", flush=True)
    size = args.size or ("real" if cuda else "tiny")
    cache = Path(os.environ.get("SPOTLIGHT_CACHE", Path.home() / ".cache" / "spotlight"))
    folder = build(Path(args.folder) if args.folder else cache / f"check-{size}", size, "dit")
    out = Path(args.out).resolve()
    if out.exists():
        raise SystemExit(f"gpu-check: {out} exists (expected a new run folder: --out)")
    config = check_config(folder, size)
    if size == "real" and not cuda:
        config["device"] = "cpu"
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.with_name(out.name + ".yaml")
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    steps = max(2, args.steps)
    _train(path, out, steps - 1)
    _train(path, out, steps)  # resumes from the checkpoint of iteration steps - 1
    result = table(out, config, torch.cuda.get_device_name() if cuda else None)
    (out / "gpu-check.json").write_text(json.dumps(result, indent=2))
    print(show(result))
    if "constants" in result["memory"]:
        from spotlight.device_constants import DeviceConstants, record

        path = record(DeviceConstants(**result["memory"]["constants"]))
        print(f"gpu-check: the memory estimate now uses the constants measured here ({path}; commit it with "
              f"docs/measurements.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
