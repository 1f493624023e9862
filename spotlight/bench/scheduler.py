"""`spotlight bench scheduler`: the pull scheduler's overhead and what resuming saves.

1. Queue operations: pull + complete round trips per second, in-process and through the Ray actor
   (`schedulers.bench_queue`).
2. A shipped preemption trace replayed on a live tiny-DiT Ray run (spot slots + one on-demand
   worker), once with AWS-style 2-minute notices and once with none: denoising steps recomputed
   per preemption and per interrupted in-flight request by this scheduler (resume from the
   committed step) against the baseline of
   restarting each preempted request from step 0 — what the same run would have redone had every
   resumed request started over (`steps_recomputed + steps_resumed`).

With `progress`, each part says on stderr what it runs, and each replayed run draws its trainer's bar.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from spotlight.config import default_config
from spotlight.logs import silenced

SHIPPED_TRACE = Path(__file__).resolve().parents[2] / "experiments" / "traces" / "bamboo-p3.csv"


def replay_run(trace: Path, notice_s: float, iterations: int, speedup: float,
               spot: int, progress: bool = False, shape: dict[str, Any] | None = None) \
        -> tuple[dict[str, Any], dict[str, int]]:
    """One tiny-DiT Ray run with `trace` replayed; returns its summary and the queue's own counters.
    `shape`: run-config sections laid over the tiny DiT's defaults (a test's smaller iteration)."""
    from spotlight.runtime.ray_runtime import RayRuntime
    from schedulers.traces import load_trace, replay_schedule
    from spotlight.train.trainer import Trainer

    shape = shape or {}
    cfg = default_config({
        **shape,
        "warm_start": {"steps": 0},  # scheduling does not depend on what the weights are
        "train": {**shape.get("train", {}), "steps": iterations, "checkpoint_every": iterations},
        "runtime": {"kind": "ray", "spot_workers": spot, "ondemand_workers": 1, "notice_s": notice_s},
    })
    runtime = RayRuntime(cfg, actions=replay_schedule(load_trace(trace), spot, speedup, notice_s))
    with tempfile.TemporaryDirectory() as out, silenced():  # the figures are the answer, not the run's lines
        summary = Trainer(cfg, Path(out), progress=progress).build(runtime).train()
    return summary, runtime.queue_stats


def run_scheduler_bench(ops: int = 2000, iterations: int = 6, speedup: float = 3600.0, spot: int = 4,
                        trace: Path = SHIPPED_TRACE, progress: bool = False,
                        shape: dict[str, Any] | None = None) -> dict[str, Any]:
    from schedulers.bench_queue import run_queue_bench

    say = (lambda msg: print(f"bench scheduler: {msg}", file=sys.stderr, flush=True)) if progress else (lambda _: None)
    say(f"{ops} queue round trips, in-process and through the Ray actor")
    result: dict[str, Any] = {"queue": run_queue_bench(ops), "trace": str(trace), "trace_speedup": speedup,
                              "spot_workers": spot, "iterations": iterations}
    for name, notice_s in (("with_notice", 120.0), ("without_notice", 0.0)):
        say(f"replaying {trace.name} on a tiny-DiT Ray run, {'%g s notices' % notice_s if notice_s else 'no notices'}")
        s, q = replay_run(trace, notice_s, iterations, speedup, spot, progress, shape)
        hits, cut = s["preemptions"] + s["workers_lost"], max(s["requests_interrupted"], 1)
        result[name] = {
            **{k: s[k] for k in ("preemptions", "workers_lost", "requests_completed", "requests_interrupted",
                                 "requests_resumed", "requests_lost", "requests_duplicated", "steps_recomputed",
                                 "steps_recomputed_restart_baseline")},
            "steps_recomputed_per_preemption": s["steps_recomputed"] / max(hits, 1),
            "restart_steps_recomputed_per_preemption": s["steps_recomputed_restart_baseline"] / max(hits, 1),
            "steps_recomputed_per_interrupted_request": s["steps_recomputed"] / cut,
            "restart_steps_recomputed_per_interrupted_request": s["steps_recomputed_restart_baseline"] / cut,
            # The notice path alone: requests given back at a step boundary on a notice.
            "requests_given_back": q["requests_given_back"],
            "steps_recomputed_per_given_back_request": q["steps_recomputed_given_back"]
            / max(q["requests_given_back"], 1),
        }
    return result
