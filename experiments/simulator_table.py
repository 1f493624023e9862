"""The results table of docs/simulator.md, regenerated: `python -m experiments.simulator_table
[--traces FILE ...] [--sizes 4 8] [--policy spotlight] [--jobs N] [--out FILE]`.

Runs `spotlight simulate` at every constant set (`spotlight.sim.assumptions`) on each trace
(default: the shipped ones, `experiments/traces/*.csv|txt|json`) with `--gpus` 16 and each size's
spot GPUs (`--sizes` 4 8: 64 and 128, the CLI's defaults otherwise: 512², 64 prompts x 16 samples,
seed 0, the default step-time profile and price row), the policy, every baseline and the oracle;
and writes one markdown row per trace and size: the policy's hours and dollars to the target and
its speed-up / cost ratio against each baseline its result was compared with (its
`speedup_vs_*` fields), each as the typical figure with the range over the constant sets in
brackets, then the oracle gap. A run takes minutes (three constant sets x the policies); `--jobs`
runs that many at once.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

TRACES = Path(__file__).resolve().parent / "traces"
SUFFIXES = (".csv", ".txt", ".json")


def shipped_traces() -> list[Path]:
    return sorted(p for p in TRACES.iterdir() if p.suffix in SUFFIXES)


def run(trace: str, size: int, policy: str, gpus: int = 16, objective: str = "time") -> dict[str, Any]:
    """`spotlight simulate --trace TRACE --spot-gpus size x gpus --json` for the policy, every
    baseline and the oracle, at every constant set."""
    from schedulers.trace_synth import open_trace
    from spotlight.sim.simulator import BASELINES, POLICIES, SimConfig, simulate

    names = list(dict.fromkeys([policy, *(b for b in BASELINES if b in POLICIES), "oracle"]))
    start = time.perf_counter()
    from spotlight.sim.step_time import notice_s_for, trace_provider

    t = open_trace(trace)
    provider = trace_provider(t)  # the notice the trace's cloud gives, as `spotlight simulate` takes it
    notice = {} if provider is None else {"notice_s": notice_s_for(provider)}
    result = simulate(SimConfig(gpus=gpus, spot_gpus=size * gpus, objective=objective, **notice), t, names)
    print(f"{Path(trace).name} at {size}x: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return result


def _spread(by_set: dict[str, float | None], fmt: str, unit: str = "") -> str:
    """The typical figure, and the range over the sets in brackets: "3.36x (2.40-3.90)", "$1,676
    ($1,502-1,811)"; "-" where the typical run did not reach the target, "(n/r)" after it where
    another set did not."""
    from spotlight.sim.assumptions import span

    typical = by_set.get("typical")
    if typical is None:
        return "-"
    money = unit == "$"
    shown = (unit if money else "") + fmt.format(typical) + ("" if money else unit)
    ends = span(by_set)
    if ends is None:
        return shown + (" (n/r)" if len(by_set) > 1 else "")
    lo, hi = (fmt.format(v) for v in ends)
    return shown + ("" if lo == hi else f" ({unit if money else ''}{lo}-{hi})")


def header(result: dict[str, Any], policy: str) -> list[str]:
    """The table's head: its columns follow the baselines the policy was compared with."""
    bases = [k[len("speedup_vs_"):] for k in result["policies"][policy] if k.startswith("speedup_vs_")]
    cols = (["trace", "spot GPUs at peak", "available", f"`{policy}` to target", "its cost"]
            + [f"vs `{b}`" for b in bases] + ["oracle gap"])
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]


def row(name: str, result: dict[str, Any], policy: str) -> str:
    """One markdown row: the policy's hours and dollars, its speed-up / cost ratio against each
    baseline, and its hours over the oracle's minus 1; each the typical figure (range)."""
    ranges, r = result["ranges"][policy], result["policies"][policy]
    bases = [k[len("speedup_vs_"):] for k in r if k.startswith("speedup_vs_")]
    cells = [f"`{name}`", str(result["config"]["spot_gpus_peak"]), f"{available(result, policy):.0%}",
             _spread(ranges["time_to_target_h"], "{:.2f}", " h"), _spread(ranges["cost_usd"], "{:,.0f}", "$")]
    cells += [f"{_spread(ranges[f'speedup_vs_{b}'], '{:.2f}', 'x')} / {_spread(ranges[f'cost_ratio_vs_{b}'], '{:.2f}')}"
              for b in bases]
    oracle = result["ranges"].get("oracle", {}).get("time_to_target_h", {})
    hours = ranges["time_to_target_h"]
    gap = {s: hours[s] / oracle[s] - 1 for s in hours
           if hours.get(s) is not None and oracle.get(s)} if oracle else {}
    cells.append(_spread({s: 100 * g for s, g in gap.items()}, "{:.1f}", "%") if len(gap) == len(hours) else "-")
    return "| " + " | ".join(cells) + " |"


def available(result: dict[str, Any], policy: str) -> float:
    """The spot GPUs the policy had live on average over its run to the target (the whole run when
    it did not reach it), over the spot fleet's peak: what "where >= 60% of the spot fleet is
    available" reads (typical constants)."""
    r, c = result["policies"][policy], result["config"]
    end = r["time_to_target_h"] or r["wall_h"]
    points = [(t, n) for t, n in r["timeline"] if t <= end] + [(end, 0)]
    live = sum(n * (t1 - t0) for (t0, n), (t1, _) in zip(points, points[1:]))
    return (live / end - c["gpus"]) / c["spot_gpus_peak"] if end > 0 and c["spot_gpus_peak"] else 0.0


def caption(result: dict[str, Any], policy: str) -> str:
    c = result["config"]
    price = c["price_per_gpu_h"]
    return (f"`{policy}` (objective {c['objective']}) on {c['gpus']} on-demand + spot {c['gpu']} GPUs, {c['resolution']}², {c['prompts']} prompts x "
            f"{c['group_size']} samples, seed {c['seed']}, at ${price['ondemand']:.2f} / ${price['spot']:.2f} per "
            f"GPU-hour ({price['priced_from']}); each cell the typical constants' figure with the range over the "
            "pessimistic, typical and optimistic sets in brackets (spotlight/sim/assumptions.py); a ratio cell is "
            "speed-up / cost ratio (above 1x sooner, below 1 cheaper); - : the target not reached, "
            "n/r: not reached at one of the sets.")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", nargs="+", help="trace files or synth: specs (default: the shipped traces)")
    p.add_argument("--sizes", nargs="+", type=int, default=[4, 8], help="spot GPUs per on-demand GPU (default 4 8)")
    p.add_argument("--policy", default="spotlight")
    p.add_argument("--objective", default="time", choices=["time", "cost"],
                   help="spotlight simulate --objective for every run (default time)")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
    p.add_argument("--out", help="write the table here (default: stdout)")
    a = p.parse_args(argv)
    traces = a.traces or [str(t) for t in shipped_traces()]
    jobs = [(t, size) for t in traces for size in a.sizes]
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        results = list(pool.map(partial(run, policy=a.policy, objective=a.objective),
                                [t for t, _ in jobs], [s for _, s in jobs]))
    lines = [caption(results[0], a.policy), "", *header(results[0], a.policy)]
    # A trace whose nodes are all one GPU reaches the same peak at every size (bamboo's v100: 80
    # nodes); its second run is the first again, so it gets one row.
    seen: set[tuple[str, int]] = set()
    for (t, _), r in zip(jobs, results):
        key = (t, r["config"]["spot_gpus_peak"])
        if key not in seen:
            seen.add(key)
            lines.append(row(Path(t).name, r, a.policy))
    text = "\n".join(lines) + "\n"
    if a.out:
        Path(a.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
