"""Seed-exploration ablation: how many GRPO iterations each exploration planner needs to reach a
reward target, on the tiny DiT and the tiny LLM.

Arms (all with `exploration.enabled`, in-process `runtime: local`, so every run is deterministic):
- `random`: random seeds; only the stale-rank monitor's probe seeds are explored (the baseline).
- `uniform`: `samples_per_step` exploration samples per iteration, the same number per prompt.
- `bandit`: the same budget, spent where it adds the most group reward variance.

    python -m experiments.exploration_ablation [--models dit,llm] [--arms random,uniform,bandit]
        [--seeds 0,1,2] [--steps N] [--samples-per-step N] [--out DIR] [--fresh] [--quick] [--json]
        [--no-progress] [--no-explore-first]

Writes OUT/<model>/<arm>/seed<k>/ (one Trainer run each; a finished run with the same config is
reused, so re-running after a crash is cheap), OUT/results.json, OUT/table.md and OUT/ablation.png.
With --json, stdout holds exactly one JSON object (the results); everything else goes to stderr.
Each run draws its warm-start and training bars on stderr; --json and --no-progress silence them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import time
import warnings
from pathlib import Path
from statistics import mean
from typing import Any

from spotlight.config import ConfigError, RunConfig, load_config
from spotlight.logs import configure

MODELS = ("dit", "llm")
ARMS = ("random", "uniform", "bandit")
HERE = Path(__file__).resolve().parent
WINDOW = 3  # iterations in the trailing reward average, and in the first/last windows of the target
TARGET_FRACTION = 0.75  # the target is 75% of the way from the random arm's first to its last window
# dit: 8 x G=8 per prompt x 8 prompts — what 2 idle spot workers score during a train phase here
# (update ~0.75 s; 64 samples ~0.15 s in-process); llm: 8 per candidate prompt x 64 candidates, twice
# the bandit's first round (G/2 each), so its allocation has something to decide.
SAMPLES_PER_STEP = {"dit": 512, "llm": 512}
METRIC = "eval_reward"  # fixed prompts and seeds: the policy's own reward, not the chosen seeds' mean
EVAL = {"dit": {"eval_prompts": 8, "eval_seeds": 16}, "llm": {"eval_prompts": 64, "eval_seeds": 4}}
PROMPT_CANDIDATES = {"dit": 1, "llm": 2}  # the llm also skips prompts its stale weights always/never solve
# --quick: 4 iterations (3 of them on explored seeds), 20/100 warm-start steps, 2-4 prompts x 4
# samples, 16 exploration samples per iteration; 2 models x 3 arms take ~15 s on 2 idle CPU cores.
QUICK = {
    "dit": {"train": {"steps": 4, "prompts_per_step": 2, "group_size": 4, "checkpoint_every": 4},
            "warm_start": {"steps": 20, "batch_size": 8}, "sampler": {"num_steps": 4}, "prompts": {"count": 4}},
    "llm": {"train": {"steps": 4, "prompts_per_step": 4, "group_size": 4, "checkpoint_every": 4},
            "warm_start": {"steps": 100, "batch_size": 8}, "prompts": {"count": 16}},  # 20: every answer wrong
}
QUICK_SAMPLES = 16


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def arm_overrides(model: str, arm: str, base: RunConfig, samples: int, explore_first: bool = True) -> dict[str, Any]:
    """The exploration section of one arm. Candidates per prompt C = max(G, 2 S / (N P)): twice
    what the uniform planner spends per candidate prompt (S / (N P)), so neither the uniform nor the
    bandit arm is capped by C — the bandit may put up to twice the uniform share on one prompt.
    Without `explore_first` an exploring arm's first iteration rolls out random seeds, as the
    random arm's does: the arms then differ only in the seeds chosen by exploration."""
    if arm == "random":
        return {"enabled": True, "planner": "random"}
    n, g, pc = base.train.prompts_per_step, base.train.group_size, PROMPT_CANDIDATES[model]
    return {"enabled": True, "planner": arm, "budget_source": "samples", "samples_per_step": samples,
            "candidates_per_prompt": max(g, 2 * samples // (n * pc)), "prompt_candidates": pc,
            "explore_first": explore_first}


def read_rows(out: Path) -> list[dict[str, Any]]:
    path = out / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def saved_config(out: Path) -> dict[str, Any] | None:
    """The config a run folder was trained with; None if it has none or it no longer parses."""
    try:
        return load_config(out / "config.yaml").to_dict()
    except ConfigError:
        return None


def run(cfg: RunConfig, out: Path, fresh: bool, progress: bool = False) -> tuple[list[dict[str, Any]], float]:
    """Train one run (or reuse a finished one); its metrics rows and its training wall time (s)."""
    from spotlight.train.trainer import Trainer  # imports torch: only when something is trained

    same = saved_config(out) == cfg.to_dict()
    if out.exists() and (fresh or not same):
        shutil.rmtree(out)  # --fresh, or another config's run: the Trainer would refuse (or extend) it
    steps = [r["step"] for r in read_rows(out)]
    if same and not fresh and (out / "summary.json").is_file() and steps == list(range(cfg.train.steps)):
        _err(f"{out}: reusing the finished run")
    else:
        _err(f"{out}: training {cfg.train.steps} iterations")
        Trainer(cfg, out, progress=progress).build().train()  # resumes a crashed run's checkpoint
    # Wall time of the iterations only (the summary's sum), so a cached warm start does not count.
    return read_rows(out), json.loads((out / "summary.json").read_text())["wall_s"]


def iterations_to_target(rewards: list[float], target: float) -> tuple[int, bool]:
    """First i (1-based) whose trailing mean of the last min(WINDOW, i) rewards is >= target;
    (len(rewards), False) if none is."""
    for i in range(1, len(rewards) + 1):
        if mean(rewards[max(0, i - WINDOW):i]) >= target:
            return i, True
    return len(rewards), False


def random_target(runs: list[tuple[list[dict], float]]) -> float:
    """Mean over seeds of first + 0.75 (last - first), first/last = the first/last WINDOW iterations."""
    def one(rows: list[dict]) -> float:
        r = [row[METRIC] for row in rows]
        return mean(r[:WINDOW]) + TARGET_FRACTION * (mean(r[-WINDOW:]) - mean(r[:WINDOW]))
    return mean(one(rows) for rows, _ in runs)


def summarize_arm(runs: list[tuple[list[dict], float]], target: float) -> dict[str, Any]:
    hits = [iterations_to_target([r[METRIC] for r in rows], target) for rows, _ in runs]
    rows = [r for rs, _ in runs for r in rs]
    spearman = [r["stale_rank_spearman"] for r in rows if r.get("stale_rank_spearman") is not None]
    return {
        "iterations_to_target": float(mean(i for i, _ in hits)),
        "iterations_to_target_per_seed": [i for i, _ in hits],
        "reached": all(ok for _, ok in hits),
        "final_reward": mean(mean(r[METRIC] for r in rs[-WINDOW:]) for rs, _ in runs),
        "mean_group_reward_std": mean(r["group_reward_std"] for r in rows),
        "stale_rank_spearman_mean": mean(spearman) if spearman else None,
        "explored_samples_per_step": float(mean(r.get("explored_samples", 0) for r in rows)),
        "fallback_fraction": float(mean(bool(r.get("exploration_fallback")) for r in rows)),
        "wall_s": mean(w for _, w in runs),
    }


def ratios(arms: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Iterations-to-target of uniform and bandit relative to random: ratio of the means, and the
    spread of the per-seed ratios."""
    if "random" not in arms:
        return {}
    base = arms["random"]
    out = {}
    for arm in (a for a in ("uniform", "bandit") if a in arms):
        per_seed = [a / b for a, b in zip(arms[arm]["iterations_to_target_per_seed"],
                                          base["iterations_to_target_per_seed"])]
        out[arm] = {"mean": arms[arm]["iterations_to_target"] / base["iterations_to_target"],
                    "min": min(per_seed), "max": max(per_seed)}
    return out


def table(results: dict[str, dict]) -> str:
    lines = ["| model | arm | iterations to target (per seed) | reached | final reward | group reward std "
             "| stale-rank Spearman | explored / step | wall s / run | vs random |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for model, res in results.items():
        for arm, a in res["arms"].items():
            sp = "-" if a["stale_rank_spearman_mean"] is None else f"{a['stale_rank_spearman_mean']:.3f}"
            r = res["ratio_vs_random"].get(arm)
            vs = f"{r['mean']:.2f} ({r['min']:.2f}-{r['max']:.2f})" if r else "-"
            lines.append(f"| {model} (target {res['target']:.3f}) | {arm} | {a['iterations_to_target']:.1f} "
                         f"({', '.join(map(str, a['iterations_to_target_per_seed']))}) | {a['reached']} "
                         f"| {a['final_reward']:.3f} | {a['mean_group_reward_std']:.4f} | {sp} "
                         f"| {a['explored_samples_per_step']:.1f} | {a['wall_s']:.1f} | {vs} |")
    return "\n".join(lines) + "\n"


def plot(curves: dict[str, dict[str, list[list[dict]]]], results: dict[str, dict], path: Path) -> None:
    """One row per model: reward, group reward std and stale-rank Spearman per iteration; a line
    per arm (mean over seeds) with the min-max over seeds shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    keys = [(METRIC, "eval reward (fixed prompts and seeds)"), ("group_reward_std", "group reward std"),
            ("stale_rank_spearman", "stale-rank Spearman")]
    fig, axes = plt.subplots(len(curves), 3, figsize=(15, 4 * len(curves)), squeeze=False)
    for row, (model, arms) in zip(axes, curves.items()):
        for ax, (key, label) in zip(row, keys):
            for arm, runs in arms.items():
                y = np.array([[np.nan if r.get(key) is None else r[key] for r in rows] for rows in runs], float)
                x = np.arange(1, y.shape[1] + 1)
                if np.isnan(y).all():
                    continue  # e.g. no Spearman yet: nothing to draw, and nanmean would warn
                with warnings.catch_warnings():  # an iteration no seed measured: NaN, not a warning
                    warnings.simplefilter("ignore", RuntimeWarning)
                    mid, lo, hi = np.nanmean(y, 0), np.nanmin(y, 0), np.nanmax(y, 0)
                ax.plot(x, mid, label=arm)
                ax.fill_between(x, lo, hi, alpha=0.2)
            if key == METRIC:
                ax.axhline(results[model]["target"], ls="--", c="k", lw=1, label="target")
            ax.set(title=f"{model}: {label}", xlabel="iteration")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="exploration_ablation", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated: dit, llm")
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated: random, uniform, bandit")
    p.add_argument("--seeds", help="comma-separated training seeds (the config's `seed`; default 0,1,2, "
                   "with --quick 0)")
    p.add_argument("--steps", type=int, metavar="N", help="GRPO iterations per run (default: the config's train.steps)")
    p.add_argument("--samples-per-step", type=int, metavar="N", help="exploration samples per iteration for uniform and "
                   f"bandit (default: dit {SAMPLES_PER_STEP['dit']}, llm {SAMPLES_PER_STEP['llm']})")
    p.add_argument("--out", type=Path, default=Path("runs/exploration_ablation"), metavar="DIR",
                   help="where runs and results go (default: runs/exploration_ablation)")
    p.add_argument("--fresh", action="store_true", help="delete and re-run finished runs")
    p.add_argument("--no-explore-first", action="store_true",
                   help="exploring arms roll out random seeds in their first iteration too (exploration.explore_first: "
                        "false), so that no arm starts ahead; use another --out")
    p.add_argument("--quick", action="store_true", help="toy sizes and one seed, for a smoke test (< 1 minute)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object on stdout "
                   "(and no progress bars on stderr)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    for m in MODELS:
        p.add_argument(f"--config-{m}", type=Path, default=HERE / f"tiny_{m}.yaml", metavar="PATH",
                       help=f"base run config (default: experiments/tiny_{m}.yaml)")
        p.add_argument(f"--target-{m}", type=float, metavar="X", help=f"reward target for {m} (default: from the random arm)")
    args = p.parse_args(argv)

    def names(flag: str, value: str, allowed: tuple[str, ...]) -> list[str]:
        got = [v.strip() for v in value.split(",") if v.strip()]
        bad = [v for v in got if v not in allowed]
        if bad or not got or len(set(got)) != len(got):
            p.error(f"--{flag}: expected distinct names from {', '.join(allowed)}, got {value!r}")
        return [a for a in allowed if a in got]  # canonical order: random first, it sets the target

    args.models, args.arms = names("models", args.models, MODELS), names("arms", args.arms, ARMS)
    args.progress = not (args.json or args.no_progress)
    args.seeds = args.seeds or ("0" if args.quick else "0,1,2")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds: expected comma-separated integers, got {args.seeds!r}")
    if any(s < 0 for s in args.seeds) or len(set(args.seeds)) != len(args.seeds):
        p.error(f"--seeds: expected distinct integers >= 0, got {args.seeds}")
    for flag in ("steps", "samples_per_step"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')}: expected a positive integer, got {getattr(args, flag)}")
    if args.steps is not None and args.steps < WINDOW:
        p.error(f"--steps: expected at least {WINDOW} (the reward window), got {args.steps}")
    for m in args.models:
        if not getattr(args, f"config_{m}").is_file():
            p.error(f"--config-{m}: no such file: {getattr(args, f'config_{m}')}")
        if "random" not in args.arms and getattr(args, f"target_{m}") is None:
            p.error(f"--arms: without the random arm, --target-{m} is needed (random sets the target)")
    return args


def ablate(model: str, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, list[list[dict]]]]:
    """Train (or reuse) every arm x seed run of one model; its results and its metrics rows."""
    path = getattr(args, f"config_{model}")
    common = dict(QUICK[model]) if args.quick else {}
    common["train"] = {**common.get("train", {}), **EVAL[model]}
    if args.steps is not None:
        common["train"] = {**common.get("train", {}), "steps": args.steps}
    samples = args.samples_per_step or (QUICK_SAMPLES if args.quick else SAMPLES_PER_STEP[model])
    base = load_config(path, common)
    # `common` sets train/warm_start/sampler/prompts; an arm sets seed/runtime/exploration: no overlap.
    runs = {arm: [run(load_config(path, {**common, "seed": s, "runtime": {"kind": "local"},
                                         "exploration": arm_overrides(model, arm, base, samples,
                                                                      not args.no_explore_first)}),
                      args.out / model / arm / f"seed{s}", args.fresh, args.progress) for s in args.seeds]
            for arm in args.arms}
    target = getattr(args, f"target_{model}")
    target = random_target(runs["random"]) if target is None else target
    arms = {arm: summarize_arm(r, target) for arm, r in runs.items()}
    result = {"target": target, "steps": base.train.steps, "seeds": args.seeds, "samples_per_step": samples,
              "arms": arms, "ratio_vs_random": ratios(arms)}
    return result, {arm: [rows for rows, _ in r] for arm, r in runs.items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure("stderr")  # the runs' lines, with this script's own (`_err`)
    start = time.perf_counter()
    results, curves = {}, {}
    try:
        # Anything a library prints goes to stderr, so that --json leaves exactly one object on stdout.
        from spotlight.cli import hub_progress

        with contextlib.redirect_stdout(sys.stderr), hub_progress(args.progress, diffusers="dit" in args.models):
            for model in args.models:
                results[model], curves[model] = ablate(model, args)
    except ConfigError as err:  # a bad config file (or a run folder's): one line, no traceback
        _err(f"exploration_ablation: error: {err}")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    text = table(results)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    (args.out / "table.md").write_text(text)
    plot(curves, results, args.out / "ablation.png")
    _err(f"\n{text}")
    for name in ("results.json", "table.md", "ablation.png"):
        _err(f"wrote {args.out / name}")
    _err(f"done in {time.perf_counter() - start:.0f} s")
    if args.json:
        print(json.dumps(results))
    return 0

if __name__ == "__main__":
    sys.exit(main())
