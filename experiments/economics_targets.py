"""Issue 37's targets, checked on traces the project has not tuned on: `python -m
experiments.economics_targets --traces FILE [FILE ...] [--size 4] [--constants typical|all] [--json OUT]
[--out TABLE.md]`, or `--spot-traces DIR` for the held-out set made from a checkout of
skypilot-org/spot-traces (`heldout`).

Every run is `spotlight simulate`'s: 16 on-demand GPUs and about `size` x 16 spot ones at the
trace's peak, in whole nodes of 1, 2, 4, 8 or 16 GPUs (`spot_gpus`: 72 on a nine-node trace), the default LoRA profile at the runtime's grain (`SimConfig`'s defaults: micro-batches of 4
rows, requests of 8), the trace's provider notice, and the price range (`--price-rows range`:
spot/on-demand 0.49, 0.27, 0.23, each a sourced row of cloud/prices.csv). Per trace:

- `--objective time` and `--objective cost`, every policy and baseline and the oracle (under
  `cost` each price row simulated again: the rentals read the prices);
- `ondemand` at on-demand counts 1 .. 512 (`ONDEMAND_COUNTS`), no spot: the all-on-demand fleets a
  buyer could rent instead, each priced at every row.

The targets (the issue's words; "S" is `spotlight` under the objective asked, typical constants):
- T1 not dominated: at every price row no baseline — `ondemand` at any of those counts,
  `ondemand_total`, `near_all_spot`, `managed_restart`, `spot_restart`, `sync_explore` — is both
  sooner and cheaper to the target than S (under `time` and under `cost`).
- T2 cost at equal deadline: S under `cost` costs at most 0.90x the cheapest all-on-demand fleet
  that reaches the target no later than it at ratio 0.49, at most 0.67x at 0.27.
- T3 S under `time` at least 3x sooner than `ondemand` at the same on-demand count where at least
  60% of the spot fleet is available over its run (`simulator_table.available`), else at least 75%
  of the capacity bound (G + available spot GPUs) / G.
- T4 S within 10% of the oracle (same objective, same grain) in hours and in dollars.
- T5 `--json` prices an hour saved against `near_all_spot` and `managed_restart` ($ per hour sooner).

Each check prints its figures, whether it holds, and by how much it falls short where it does not.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from experiments.simulator_table import available

ONDEMAND_COUNTS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
"""The all-on-demand fleets priced against S (T1, T2): enough counts that the cheapest one reaching
the target by S's time is found to within a step of ~1.5x."""
GPUS = 16
BASELINES_T1 = ("ondemand_total", "near_all_spot", "managed_restart", "spot_restart", "sync_explore")
T2_BOUND = {0.49: 0.90, 0.27: 0.67}
"""The T2 bound at each spot/on-demand ratio (rounded to two places, as the rows' ratios are named)."""


def heldout(spot_traces: Path, out: Path) -> list[Path]:
    """The held-out traces from a checkout of skypilot-org/spot-traces (files on disk; not shipped:
    the repository carries no licence): its three 4-node AWS preemption traces (2023-08-03) as they
    are, and its nine 1-node V100 availability traces of 2023-02-15 (every zone of us-east-1,
    us-east-2 and us-west-2) as one fleet of nine nodes, one per zone (written to `out`)."""
    four = sorted((spot_traces / "preemption" / "4-node" / "aws-08-03-2023").glob("*.json"))
    zones = sorted((spot_traces / "availability" / "1-node" / "aws-02-15-2023").glob("*_v100_1.json"))
    if len(four) != 3 or len(zones) != 9:
        raise SystemExit(f"{spot_traces}: expected skypilot-org/spot-traces' 3 four-node preemption and 9 one-node "
                         f"availability files, found {len(four)} and {len(zones)}")
    docs = [json.loads(p.read_text()) for p in zones]
    gaps = {d["metadata"]["gap_seconds"] for d in docs}
    if len(gaps) != 1:
        raise SystemExit(f"{spot_traces}: the nine zones' ticks differ ({sorted(gaps)}): expected one gap")
    out.mkdir(parents=True, exist_ok=True)
    fleet = out / "us-9zones-aws-02-15-2023_v100_9.json"  # the name says AWS (zones) to `trace_provider`
    fleet.write_text(json.dumps({"metadata": {"gap_seconds": gaps.pop(), "zones": [p.stem for p in zones]},
                                 "data": [d["data"] for d in docs]}))
    return four + [fleet]


def spot_gpus(asked: int, nodes: int) -> int:
    """The spot GPUs at the trace's peak for `asked` of them over `nodes` trace nodes: whole nodes
    of a size a cloud rents (1, 2, 4, 8, 16 GPUs: the power of two nearest `asked / nodes`). The
    simulator spreads `asked` evenly (`spot_block`: 64 over nine nodes is nodes of 7 GPUs), and
    a request of 8 micro-batches then takes two micro-batch times on a node (8 of its 14 GPU-slots
    busy): measured on the nine-zone fleet, `--objective cost` took 11.23 h at 7 GPUs a node, 7.17
    h with requests of 7, 6.58 h at 8 GPUs a node — a property of the node no cloud rents, not of
    the policy."""
    return nodes * 2 ** max(0, round(math.log2(max(asked, 1) / max(nodes, 1))))


def _figures(result: dict[str, Any], policy: str) -> dict[str, dict[str, tuple[float | None, float | None]]]:
    """{price row: (hours, dollars) to the target} of `policy` in a result with a price range."""
    rows = result["price_range"]["policies"][policy]
    return {row: (r["time_to_target_h"], r["cost_usd"]) for row, r in rows.items()}


def _ratios(result: dict[str, Any]) -> dict[str, float]:
    return {r["name"]: round(r["ratio"], 2) for r in result["price_range"]["rows"]}


def evaluate(trace_path: str, size: int, constants: str) -> dict[str, Any]:
    """Every run and check of the module docstring for one trace."""
    from schedulers.trace_synth import open_trace
    from spotlight.sim.simulator import SimConfig, simulate
    from spotlight.sim.step_time import notice_s_for, trace_provider

    trace = open_trace(trace_path)
    provider = trace_provider(trace)
    notice = {} if provider is None else {"notice_s": notice_s_for(provider)}
    start = time.perf_counter()
    spot = spot_gpus(size * GPUS, trace.max_live)
    runs = {objective: simulate(SimConfig(gpus=GPUS, spot_gpus=spot, objective=objective, **notice), trace,
                                constants=constants if objective == "time" else "typical", price_rows="range")
            for objective in ("time", "cost")}
    frontier = {n: _figures(simulate(SimConfig(gpus=n, spot_gpus=0, **notice), trace, ["ondemand"],
                                     constants="typical", price_rows="range"), "ondemand")
                for n in ONDEMAND_COUNTS}
    ratios = _ratios(runs["time"])
    checks: dict[str, Any] = {"trace": Path(trace_path).name, "provider": provider, "size": size,
                              "seconds": time.perf_counter() - start, "ratios": ratios}
    for objective, res in runs.items():
        s = _figures(res, "spotlight")
        t1 = {}
        for row in ratios:
            hours, usd = s[row]
            rivals = {f"ondemand x{n}": f[row] for n, f in frontier.items()}
            rivals.update({b: _figures(res, b)[row] for b in BASELINES_T1 if b in res["policies"]})
            t1[row] = sorted(name for name, (h, c) in rivals.items()
                             if h is not None and c is not None and hours is not None and h < hours and c < usd)
        checks[objective] = {"spotlight": s, "oracle": _figures(res, "oracle"), "T1_dominated_by": t1,
                             "price_of_an_hour_saved": res.get("price_of_an_hour_saved")}
    # T2: under cost, against the cheapest all-on-demand fleet that is no later.
    t2 = {}
    for row, ratio in ratios.items():
        hours, usd = checks["cost"]["spotlight"][row]
        meets = [(f[row][1], n) for n, f in frontier.items() if f[row][0] is not None and hours is not None
                 and f[row][0] <= hours]
        cheapest = min(meets) if meets else None
        t2[row] = {"ratio": ratio, "spotlight_usd": usd, "spotlight_h": hours,
                   "ondemand_gpus": None if cheapest is None else cheapest[1],
                   "ondemand_usd": None if cheapest is None else cheapest[0],
                   "cost_ratio": None if cheapest is None or usd is None else usd / cheapest[0],
                   "bound": T2_BOUND.get(ratio)}
    checks["T2"] = t2
    # T3: time, against ondemand at the same count.
    r = runs["time"]["policies"]["spotlight"]
    avail = available(runs["time"], "spotlight")
    bound = (GPUS + avail * runs["time"]["config"]["spot_gpus_peak"]) / GPUS
    speedup = r.get("speedup_vs_ondemand")
    need = 3.0 if avail >= 0.6 else 0.75 * bound
    checks["T3"] = {"available": avail, "capacity_bound": bound, "speedup": speedup, "need": need,
                    "ranges": runs["time"].get("ranges", {}).get("spotlight", {}).get("speedup_vs_ondemand")}
    checks["T4"] = {objective: {row: _gap(checks[objective]["spotlight"][row], checks[objective]["oracle"][row])
                                for row in ratios} for objective in runs}
    checks["ranges"] = {k: runs["time"].get("ranges", {}).get("spotlight", {}).get(k)
                        for k in ("time_to_target_h", "cost_usd", "cost_ratio_vs_ondemand")}
    return checks


def _gap(s: tuple[float | None, float | None], o: tuple[float | None, float | None]) -> dict[str, float | None]:
    """S over the oracle, minus 1, in hours and in dollars."""
    return {"hours": None if s[0] is None or not o[0] else s[0] / o[0] - 1,
            "dollars": None if s[1] is None or not o[1] else s[1] / o[1] - 1}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def table(results: list[dict[str, Any]]) -> str:
    """One markdown table: a row per trace, a column per target, each with its figure and a verdict."""
    head = ("| trace | available | T1: dominated by (time / cost objective) | T2: cost vs cheapest on-demand "
            "meeting its time (0.49 / 0.27 / 0.23) | T3: sooner than `ondemand` (need) | T4: vs oracle, "
            "hours / dollars (time; cost at 0.49) | T5: $ per hour sooner vs `near_all_spot` / `managed_restart` |")
    lines = [head, "|" + "---|" * 7]
    for c in results:
        rows = list(c["ratios"])
        dominated = [sorted(set().union(*c[o]["T1_dominated_by"].values())) for o in ("time", "cost")]
        t1 = " / ".join(", ".join(d) if d else "none" for d in dominated)
        t2 = " / ".join("-" if c["T2"][row]["cost_ratio"] is None else
                        f"{c['T2'][row]['cost_ratio']:.2f}" + (
                            "" if c["T2"][row]["bound"] is None else
                            (" ok" if c["T2"][row]["cost_ratio"] <= c["T2"][row]["bound"] else
                             f" (>{c['T2'][row]['bound']:.2f})")) for row in rows)
        t3 = c["T3"]
        t3s = "-" if t3["speedup"] is None else (f"{t3['speedup']:.2f}x ({t3['need']:.2f}x) "
                                                  + ("ok" if t3["speedup"] >= t3["need"] else
                                                     f"short {t3['need'] - t3['speedup']:.2f}x"))
        t4 = c["T4"]
        t4s = (f"{_pct(t4['time'][rows[0]]['hours'])} / {_pct(t4['time'][rows[0]]['dollars'])}; "
               f"{_pct(t4['cost'][rows[0]]['hours'])} / {_pct(t4['cost'][rows[0]]['dollars'])}")
        saved = c["time"]["price_of_an_hour_saved"] or {}
        t5 = " / ".join(_usd_h(saved.get(f"usd_per_hour_sooner_vs_{b}"), rows[0])
                        for b in ("near_all_spot", "managed_restart"))
        lines.append(f"| `{c['trace']}` | {t3['available']:.0%} | {t1} | {t2} | {t3s} | {t4s} | {t5} |")
    return "\n".join(lines) + "\n"


def _usd_h(values: Any, row: str) -> str:
    if not isinstance(values, dict):
        return "-"
    v = values.get("by_price_row", {}).get(row)
    return "- (not sooner)" if v is None else f"${v:,.0f}/h"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--traces", nargs="+", default=[], help="trace files (any format `spotlight simulate` reads)")
    p.add_argument("--spot-traces", type=Path, help="a checkout of skypilot-org/spot-traces: its held-out set")
    p.add_argument("--workdir", type=Path, default=Path("runs/economics"), help="where the held-out fleet file goes")
    p.add_argument("--size", type=int, default=4, help="spot GPUs per on-demand GPU (default 4)")
    p.add_argument("--constants", choices=["typical", "all"], default="typical",
                   help="the constant sets of the time runs (all: the pessimistic-optimistic ranges too)")
    p.add_argument("--json", type=Path, help="write every figure here")
    p.add_argument("--out", type=Path, help="write the table here (default: stdout)")
    a = p.parse_args(argv)
    traces = [str(t) for t in a.traces] + ([str(t) for t in heldout(a.spot_traces, a.workdir)] if a.spot_traces else [])
    if not traces:
        p.error("give --traces or --spot-traces")
    results = []
    for t in traces:
        results.append(evaluate(t, a.size, a.constants))
        print(f"{Path(t).name}: {results[-1]['seconds']:.0f} s", file=sys.stderr, flush=True)
    if a.json:
        a.json.write_text(json.dumps(results, indent=1, default=str))
    text = table(results)
    if a.out:
        a.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
