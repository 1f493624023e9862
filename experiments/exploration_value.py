"""What exploration buys, priced in time to target: `python -m experiments.exploration_value
[--trace FILE] [--sizes 4] [--profiles qwen-image-lora qwen-image-full] [--jobs N] [--out FILE]
[--json FILE]`.

The ablation of docs/simulator.md#what-exploration-buys. For each step-time profile and spot-fleet
size it simulates, on one trace at the typical constants (`simulate(..., constants="typical")`),
the policies that differ only in what the spot GPUs do during an update (`ARMS`):

- `spotlight`: each iteration the priced choice (`Simulation.fleet_update_pays`) between computing
  the update's gradient parts on the fleet and exploring the next iteration's seeds;
- `spotlight_noexplore`: the same fleet, never explores (gradient parts wherever they are sooner);
- `spotlight_learner_update`: always explores, the update on the on-demand GPUs alone;
- `sync_explore` and `ondemand`: on-demand only, for reference;

and writes two markdown tables: each arm's iterations to target, hours, dollars, samples explored
and iterations whose update ran on the fleet; and **what exploration buys**, `spotlight` against
`spotlight_noexplore` (the same fleet and update placement rule, less the exploration): the
iterations, hours and dollars it saves — negative where exploring costs, 0 where it buys nothing.

Invariant: every "buys" figure is `spotlight_noexplore`'s minus `spotlight`'s of the same run
(`tests/experiments/test_exploration_value.py`). A run of the five arms at one profile and size takes 1-2 min
on this project's machine (one core).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from schedulers.traces import Trace

TRACE = str(Path(__file__).resolve().parent / "traces" / "bamboo-p3.csv")
PROFILES = ("qwen-image-lora", "qwen-image-full")
ARMS = ("spotlight", "spotlight_noexplore", "spotlight_learner_update", "sync_explore", "ondemand")
"""The policies compared: the first two differ only in exploring (`buys`)."""
COLUMNS = ("profile", "spot GPUs", "policy", "iterations to target", "to target", "its cost", "s / iteration",
           "explored samples", "fleet-update iterations")
BUYS_COLUMNS = ("profile", "spot GPUs", "iterations saved", "hours saved", "dollars saved",
                "fleet-update iterations (`spotlight` / `spotlight_noexplore`)")


def measure(trace: str | Trace, profile: str, size: int, gpus: int = 16, policies: tuple[str, ...] = ARMS,
            **config: Any) -> dict[str, Any]:
    """`simulate` of `policies` on `trace` (a file, a `synth:` spec or a `Trace`) with the step-time
    `profile`, `gpus` on-demand GPUs and `size` x `gpus` spot GPUs at the trace's peak, at the typical
    constants; `config`: other `SimConfig` fields (a test's small run). Returns simulate's result
    with "profile" and "size" added."""
    from schedulers.trace_synth import open_trace
    from spotlight.sim.simulator import SimConfig, simulate
    from spotlight.sim.step_time import StepTimes

    cfg = SimConfig(gpus=gpus, spot_gpus=size * gpus, step_times=StepTimes.profile(profile), **config)
    start = time.perf_counter()
    result = simulate(cfg, trace if isinstance(trace, Trace) else open_trace(trace), list(policies),
                      constants="typical")
    print(f"{profile} at {size}x: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return {**result, "profile": profile, "size": size}


def _measure(trace: str, gpus: int, config: dict[str, Any], job: tuple[str, int]) -> dict[str, Any]:
    return measure(trace, job[0], job[1], gpus, **config)


def buys(result: dict[str, Any]) -> dict[str, float | None]:
    """What exploration buys in one run: `spotlight_noexplore`'s iterations, hours and dollars to
    target minus `spotlight`'s (positive: exploring saves; negative: it costs); None where either
    did not reach the target."""
    explore, plain = result["policies"]["spotlight"], result["policies"]["spotlight_noexplore"]
    out: dict[str, float | None] = {}
    for name, field in (("iterations", "iterations_to_target"), ("hours", "time_to_target_h"),
                        ("dollars", "cost_usd")):
        a, b = plain[field], explore[field]
        out[name] = None if a is None or b is None else a - b
    return out


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _share(saved: float | None, of: float | None) -> str:
    """" (8.4%)": what was saved as a share of `spotlight_noexplore`'s figure; "" where there is none."""
    return "" if saved is None or not of or saved == 0 else f" ({100 * saved / of:+.1f}%)"


def _signed_usd(value: float | None) -> str:
    return "-" if value is None else f"{'-' if value < 0 else '+'}${abs(value):,.0f}"


def arm_rows(result: dict[str, Any]) -> list[str]:
    """One markdown row per arm of a run (`COLUMNS`); "-" where the target was not reached."""
    lines = []
    for name in ARMS:
        r = result["policies"].get(name)
        if r is None:
            continue
        k, hours = r["iterations_to_target"], r["time_to_target_h"]
        per = None if k is None or hours is None or k == 0 else hours * 3600 / k
        cells = [f"`{result['profile']}`", str(result["config"]["spot_gpus_peak"]), f"`{name}`", _cell(k, "{:d}"),
                 _cell(hours, "{:.2f} h"), _cell(r["cost_usd"], "${:,.0f}"), _cell(per, "{:.0f}"),
                 f"{r['explored_samples']:,}", f"{r['fleet_update_iterations']} of {r['iterations']}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def buys_row(result: dict[str, Any]) -> str:
    """The run's row of the "what exploration buys" table (`BUYS_COLUMNS`): signed, "-" where a
    target was not reached; "nothing" where exploring saves no iteration."""
    b, p = buys(result), result["policies"]
    plain = p["spotlight_noexplore"]
    it = b["iterations"]
    cells = [f"`{result['profile']}`", str(result["config"]["spot_gpus_peak"]),
             "-" if it is None else ("0 (nothing)" if it == 0 else f"{it:+d}")
             + _share(it, plain["iterations_to_target"]),
             _cell(b["hours"], "{:+.2f} h") + _share(b["hours"], plain["time_to_target_h"]),
             _signed_usd(b["dollars"]) + _share(b["dollars"], plain["cost_usd"]),
             f"{p['spotlight']['fleet_update_iterations']} / {p['spotlight_noexplore']['fleet_update_iterations']}"]
    return "| " + " | ".join(cells) + " |"


def _head(columns: tuple[str, ...]) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def table(results: list[dict[str, Any]]) -> str:
    """Both tables, markdown, with a caption naming the trace, the fleet and the price row."""
    c = results[0]["config"]
    price = c["price_per_gpu_h"]
    caption = (f"{Path(results[0]['trace']).name if results[0]['trace'] else 'trace'}, {c['gpus']} on-demand "
               f"{c['gpu']} GPUs + spot, {c['resolution']}², {c['prompts']} prompts x {c['group_size']} samples, "
               f"seed {c['seed']}, the typical constants, ${price['ondemand']:.2f} / ${price['spot']:.2f} per "
               f"GPU-hour ({price['priced_from']}); - : the target not reached.")
    lines = [caption, "", *_head(COLUMNS)]
    for r in results:
        lines += arm_rows(r)
    lines += ["", "What exploration buys: `spotlight_noexplore` minus `spotlight` (positive: exploring saves).", "",
              *_head(BUYS_COLUMNS), *(buys_row(r) for r in results)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=TRACE, help="a trace file or synth: spec (default: bamboo-p3.csv)")
    p.add_argument("--sizes", nargs="+", type=int, default=[4], help="spot GPUs per on-demand GPU (default 4)")
    p.add_argument("--profiles", nargs="+", default=list(PROFILES), help="step-time profiles (default both Qwen-Image)")
    p.add_argument("--gpus", type=int, default=16, help="on-demand GPUs (default 16)")
    p.add_argument("--prompts", type=int, default=64, help="prompts per iteration (default 64, as simulate's)")
    p.add_argument("--iterations-scale", type=float, default=10.0,
                   help="the progress model's iteration axis stretch (default 10, as simulate's)")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
    p.add_argument("--out", help="write the tables here (default: stdout)")
    p.add_argument("--json", help="also write the runs' results here (without their timelines)")
    a = p.parse_args(argv)
    jobs = [(profile, size) for profile in a.profiles for size in a.sizes]
    one = partial(_measure, a.trace, a.gpus, {"prompts": a.prompts, "iterations_scale": a.iterations_scale})
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        results = list(pool.map(one, jobs))
    text = table(results)
    if a.json:
        lists = ("timeline", "progress", "preemption_times_h")
        Path(a.json).write_text(json.dumps([{**r, "policies": {n: {k: v for k, v in x.items() if k not in lists}
                                                               for n, x in r["policies"].items()}}
                                            for r in results], indent=1))
    if a.out:
        Path(a.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
