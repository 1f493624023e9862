"""How fast the simulator is: `python -m experiments.simulate_scale [--gpus 4096] [--iterations 1000]
[--policy spotlight] [--resolution 512]` simulates one policy on the shipped bamboo-p3 trace, looped
so that nodes are preempted and join all through the run (`looped`), with `gpus` GPUs in all (a
quarter on-demand, the rest spot at the trace's peak) and prompts scaled with the fleet (one
16-sample group per 4 GPUs, one request per group), running every iteration, and prints the
seconds it took with what the run went through: preemptions, requests re-queued, regroups,
explored samples, iterations whose update ran on the fleet (one core: run it with
OMP_NUM_THREADS=1 taskset -c 0). The scheduler, planner, regroup policy and cost meter are the
real ones, so their cost counts."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from schedulers.traces import Trace, TraceEvent, load_trace
from spotlight.sim.progress_model import ProgressModel
from spotlight.sim.simulator import POLICIES, SimConfig, gpu_prices, make_simulation

TRACE = Path(__file__).resolve().parent / "traces" / "bamboo-p3.csv"

HOURS_PER_ITERATION = 0.2
"""How much trace `run_scale` loops per iteration: 12 minutes, far above an iteration at 512² (a
1,000-iteration run at 4,096 GPUs lasts ~28 simulated hours, 0.03 h each); `run_scale` reports
`churn_until_h` so that a run outlasting its trace shows."""


def looped(trace: Trace, until_s: float) -> Trace:
    """`trace` played again and again until `until_s`. Each repetition replays the events after the
    trace's first instant on renamed nodes, after a wrap that restores the first instant's live
    count: the nodes live at the end stand in for as many of the starting nodes (their later events
    are theirs), the starting nodes left over join at the wrap, and nodes beyond the starting count
    are removed there. bamboo-p3 (18 nodes at the start, 10 at the end) wraps with 8 joins and no
    removal, so the looped trace's preemptions are the trace's, and its peak (`max_live`, which
    sizes the spot blocks) is the trace's."""
    if not trace.events:
        return trace
    first = trace.events[0].t_s
    period = trace.duration_s - first
    start = [e.node for e in trace.events if e.t_s == first and e.action == "add"]
    rest = [e for e in trace.events if e.t_s > first]
    events = list(trace.events)
    live = _live(events)
    k = 1
    while period > 0 and first + k * period < until_s:
        offset = k * period
        names = dict(zip(start, live))  # a starting node's part is played by a node still live
        events += [TraceEvent(first + offset, "remove", n) for n in live[len(start):]]
        for n in start[len(live):]:
            names[n] = f"{n}~{k}"
            events.append(TraceEvent(first + offset, "add", names[n]))
        events += [TraceEvent(e.t_s + offset, e.action, names.get(e.node, f"{e.node}~{k}")) for e in rest]
        live = _live(events)
        k += 1
    return Trace(events, f"{trace.source} looped x{k}")


def _live(events: list[TraceEvent]) -> list[str]:
    """The nodes live after `events`, in the order they joined."""
    live: dict[str, None] = {}
    for e in events:
        if e.action == "add":
            live[e.node] = None
        else:
            live.pop(e.node, None)
    return list(live)


def run_scale(gpus: int = 4096, iterations: int = 1000, policy: str = "spotlight", resolution: int = 512) -> dict:
    ondemand = gpus // 4
    cfg = SimConfig(gpus=ondemand, spot_gpus=gpus - ondemand, iterations=iterations, resolution=resolution,
                    prompts=max(16, gpus // 4), samples_per_request=16, stop_at_target=False)
    trace = looped(load_trace(TRACE), iterations * HOURS_PER_ITERATION * 3600)
    od, spot, _ = gpu_prices(cfg)
    sim = make_simulation(cfg, POLICIES[policy], trace, ProgressModel.calibrated(iterations_scale=cfg.iterations_scale),
                          (od, spot))
    start = time.perf_counter()
    r = sim.run()
    seconds = time.perf_counter() - start
    times = r.get("preemption_times_h", [])
    return {"gpus": gpus, "iterations": r["iterations"], "policy": policy, "resolution": resolution,
            "seconds": seconds, "requests_per_iteration": sim.requests_per_iteration,
            "simulated_hours": r["wall_h"], "churn_until_h": trace.duration_s / 3600.0,
            "preemptions": r["preemptions"], "last_preemption_h": max(times, default=None),
            "requests_requeued": r["requests_requeued"], "requests_given_back": r["requests_given_back"],
            "regroups": r["regroups"], "explored_samples": r["explored_samples"],
            "fleet_update_iterations": r["fleet_update_iterations"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--gpus", type=int, default=4096)
    p.add_argument("--iterations", type=int, default=1000)
    p.add_argument("--policy", default="spotlight", choices=list(POLICIES))
    p.add_argument("--resolution", type=int, default=512)
    a = p.parse_args()
    print(json.dumps(run_scale(a.gpus, a.iterations, a.policy, a.resolution)))


if __name__ == "__main__":
    main()
