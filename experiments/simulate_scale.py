"""How fast the simulator is: `python -m experiments.simulate_scale [--gpus 4096] [--iterations 1000]
[--policy spotlight] [--resolution 512]` simulates one policy on the shipped bamboo-p3 trace with
`gpus` GPUs in all (a quarter on-demand, the rest spot at the trace's peak) and prompts scaled with
the fleet (one 16-sample group per 4 GPUs, one request per group), running every iteration, and prints the seconds it took
(one core: run it with OMP_NUM_THREADS=1). The scheduler, planner, regroup policy and cost meter
are the real ones, so their cost counts."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from spotlight.sim.progress_model import ProgressModel
from spotlight.sim.simulator import POLICIES, SimConfig, gpu_prices, make_simulation
from schedulers.traces import load_trace

TRACE = Path(__file__).resolve().parent / "traces" / "bamboo-p3.csv"


def run_scale(gpus: int = 4096, iterations: int = 1000, policy: str = "spotlight", resolution: int = 512) -> dict:
    ondemand = gpus // 4
    cfg = SimConfig(gpus=ondemand, spot_gpus=gpus - ondemand, iterations=iterations, resolution=resolution,
                    prompts=max(16, gpus // 4), samples_per_request=16, stop_at_target=False)
    trace = load_trace(TRACE)
    od, spot, _ = gpu_prices(cfg)
    sim = make_simulation(cfg, POLICIES[policy], trace, ProgressModel.calibrated(iterations_scale=cfg.iterations_scale),
                          (od, spot))
    start = time.perf_counter()
    r = sim.run()
    seconds = time.perf_counter() - start
    return {"gpus": gpus, "iterations": r["iterations"], "policy": policy, "resolution": resolution,
            "seconds": seconds, "requests_per_iteration": sim.requests_per_iteration,
            "simulated_hours": r["wall_h"], "preemptions": r["preemptions"]}


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
