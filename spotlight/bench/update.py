"""`spotlight bench update`: the update's gradient computed by the fleet (`train.update_on: fleet`)
against the learner alone — seconds per update with 1, 2, 4... gradient executors, the speedup and
the per-executor efficiency (what `spotlight.sim.step_time.StepTimes.train_efficiency` models: the
update's data-parallel efficiency over its executors), and what losing an executor mid-update costs.

Setup: the tiny DiT on this machine's CPU, `prompts` x `group_size` samples per iteration,
`sampler_steps` denoising steps (every one an SDE step the update trains on), `train.micro_batch`
(sample, SDE step) rows per gradient part, one part a request (`train.parts_per_request: 1`: every
executor is a node of one device), `train.updates_per_step` rounds per update (each its own parts); `runtime.torch_threads: 1` in every role. All runs share one local Ray cluster started
here (`ray_cluster.connect`), so none pays Ray's start.

1. Baseline: `train.update_on: learner`, one on-demand rollout worker — the learner actor alone
   computes every part.
2. For n in `executors`: `train.update_on: fleet` with n on-demand rollout workers and no spot
   worker (on-demand: nothing is preempted, so no replay schedule is needed); the learner only sums
   the parts and steps.
3. Figures per setting: the median `time_update_s` over the iterations after the first (the first
   pays one-off warm-ups: the rollout fetched by each worker, the policy copied for round 1);
   speedup(n) = T_learner / T_n, efficiency(n) = speedup(n) / n. `efficiency_bound` is what the
   cores allow: min(n, cpus) / n — on a 2-core machine 4 executors cannot beat 0.5, whatever the
   fleet does; a GPU fleet has one device per executor and no such bound. With n = 1 measured,
   `fleet_overhead_s` = T_1 - T_learner: one executor computes what the learner alone would, so
   the difference is the fleet path's own cost per update (each part's actor calls and gradient
   through the queue, the rounds' hand-offs, round 1's weights loaded on the worker) — what the
   simulator's `StepTimes.update_round_s` stands for; per part too.
4. kill_cost_s: a fleet of 2 spot workers and 1 on-demand; on the train phases' replay clock
   (`replay_phases=("train",)`), spot0 is killed without notice a quarter of the previous update's
   length into the third update and added back at the start of the fifth (scheduled on the engine as the
   run reaches them, `FleetEngine.schedule`; the iteration the kill landed in is read back from
   the replay clock).
   The cost is the killed update's seconds minus the median of the same run's undisturbed ones
   (after the first; before the kill, or from the second update after the replacement joined):
   its lost part recomputed, the rest of the update on one executor fewer.
5. weights_equal: every run's final weights are bit-identical to the baseline's (the parts are
   summed in micro-batch order, whoever computed them: `spotlight.rl.gradient`).

Wall-clock figures of this machine; the runs share its cores with everything else on it (the load
average is reported).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from spotlight.config import RunConfig, default_config
from spotlight.logs import silenced


def _config(update_on: str, ondemand: int, spot: int, iterations: int, prompts: int, group_size: int,
            sampler_steps: int, micro_batch: int, resolution: int) -> RunConfig:
    # One micro-batch a request: each executor here is a node of one device, so requests of several
    # (`train.parts_per_request`, served by a node's crew) would only lengthen the update on it.
    return default_config({
        "warm_start": {"steps": 20, "batch_size": 8},
        "train": {"steps": iterations, "prompts_per_step": prompts, "group_size": group_size,
                  "checkpoint_every": iterations, "micro_batch": micro_batch, "update_on": update_on,
                  "parts_per_request": 1},
        "prompts": {"count": max(4, prompts)},
        "sampler": {"num_steps": sampler_steps},
        "policy": {"dit": {"resolution": resolution}},
        "runtime": {"kind": "ray", "spot_workers": spot, "ondemand_workers": ondemand, "torch_threads": 1},
    })


def _runtime_class() -> type:
    from schedulers.fleet import FleetAction
    from spotlight.runtime.ray_runtime import RayRuntime

    class ReplayTimed(RayRuntime):
        """The Ray runtime, noting the train phases' replay clock at the end of each update (where
        a replayed action landed is read from it); with `kill_in` set, spot0 is killed without
        notice `kill_fraction` of the previous update's length into update `kill_in`, and added
        back at the start of update `kill_in + 2` (scheduled on the engine as the run reaches
        them, so they land where aimed whatever this run's pace)."""

        kill_in: int | None = None
        kill_fraction = 0.25
        """A quarter, not a half: the kill must land in update `kill_in`, whose own length is not known
        when it starts. Half missed it in a CI run (2026-11-29), the previous update slowed by the
        machine's load to over twice the next one's, so the kill fell into the update after, with its
        replacement; a quarter misses only when the previous update took four times as long."""

        def __post_init__(self) -> None:
            super().__post_init__()
            self.replay_ends: list[float] = []
            self.kill_at: float | None = None
            self.add_at: float | None = None

        def update(self, *args: Any, **kwargs: Any) -> dict[str, float]:
            k, now = len(self.replay_ends), self.engine.replay.now()
            if self.kill_in is not None and k == self.kill_in:
                last = self.replay_ends[-1] - (self.replay_ends[-2] if k >= 2 else 0.0)
                self.kill_at = now + self.kill_fraction * last
                self.engine.schedule(FleetAction(self.kill_at, "spot0", "kill"))
            if self.kill_in is not None and k == self.kill_in + 2:
                self.add_at = now
                self.engine.schedule(FleetAction(now, "spot0", "add"))
            stats = super().update(*args, **kwargs)
            self.replay_ends.append(self.engine.replay.now())
            return stats

    return ReplayTimed


def _train(cfg: RunConfig, out: Path, kill_in: int | None = None) \
        -> tuple[list[dict], dict[str, torch.Tensor], Any, dict[str, Any]]:
    """Run `cfg` with the replay clock running in train phases (and spot0 killed in update
    `kill_in`, see `ReplayTimed`). Returns metrics.jsonl's rows, the final weights, the runtime's
    replay record (ends of the updates, kill and add times) and summary counters."""
    from types import SimpleNamespace

    from safetensors.torch import load_file

    from spotlight.train.trainer import Trainer

    runtime = _runtime_class()(cfg, replay_phases=("train",))
    runtime.kill_in = kill_in
    summary = Trainer(cfg, out, progress=False).build(runtime).train()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    (weights,) = (out / "final").glob("*.safetensors")
    ends = SimpleNamespace(ends=list(runtime.replay_ends), kill_at=runtime.kill_at, add_at=runtime.add_at)
    del runtime
    gc.collect()  # the run's actors end with their last handle: before the next run starts its own
    return rows, load_file(str(weights)), ends, summary


def _median_update_s(rows: list[dict]) -> float:
    """The median `time_update_s` over the iterations after the first (all of them if only one)."""
    timed = rows[1:] if len(rows) > 1 else rows
    return statistics.median(r["time_update_s"] for r in timed)


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def run_update_bench(executors: tuple[int, ...] = (1, 2, 4), iterations: int = 6, repeats: int = 1,
                     prompts: int = 4, group_size: int = 8, sampler_steps: int = 8, micro_batch: int = 32,
                     resolution: int = 32, progress: bool = False) -> dict[str, Any]:
    """The figures described in the module docstring, as one dict; with `progress`, a bar and the
    runs' log lines on stderr. `repeats`: runs per setting (the median of their medians is
    reported; the kill run is made once)."""
    import ray

    from spotlight.runtime import ray_cluster

    if not executors or min(executors) < 1:
        raise ValueError(f"--executors must be positive integers, got {list(executors)}")
    if iterations < 5:
        raise ValueError(f"--iterations must be >= 5 (a warm-up, an undisturbed update, the killed one, the "
                         f"replacement's two updates later), got {iterations}")
    executors = tuple(sorted(set(executors)))
    shape = dict(iterations=iterations, prompts=prompts, group_size=group_size, sampler_steps=sampler_steps,
                 micro_batch=micro_batch, resolution=resolution)
    load_before = os.getloadavg()[0]
    bar = tqdm(total=(1 + len(executors)) * repeats + 1, desc="bench update",
               unit="run", disable=not progress, file=sys.stderr)
    if ray.is_initialized():  # the runs share the cluster started here
        ray.shutdown()
    baseline_cfg = _config("learner", 1, 0, **shape)
    started = ray_cluster.connect(baseline_cfg.runtime)
    seconds: dict[int, list[float]] = {}  # 0: the learner alone
    weights_equal = True
    with bar, tempfile.TemporaryDirectory(prefix="bench-update-") as tmp:
        try:
            runs = 0

            def run(cfg: RunConfig, kill_in: int | None = None) -> tuple[list[dict], Any, dict[str, Any]]:
                nonlocal runs, weights_equal, reference
                runs += 1
                with silenced(not progress):  # the runs' lines: on stderr (the CLI's) with the bar only
                    rows, weights, record, summary = _train(cfg, Path(tmp) / f"run{runs}", kill_in)
                if reference is None:
                    reference = weights
                weights_equal = weights_equal and _same(reference, weights)
                bar.update()
                return rows, record, summary

            reference: dict[str, torch.Tensor] | None = None
            parts = None
            for _ in range(repeats):
                rows, _, _ = run(baseline_cfg)
                seconds.setdefault(0, []).append(_median_update_s(rows))
                for n in executors:
                    rows, _, _ = run(_config("fleet", n, 0, **shape))
                    seconds.setdefault(n, []).append(_median_update_s(rows))
                    parts = rows[-1]["gradient_parts"]
            # spot0 killed in the third update (index 2), back at the start of the fifth.
            rows, record, summary = run(_config("fleet", 1, 2, **shape), kill_in=2)
        finally:
            if started:
                ray_cluster.shutdown()
    ends, at, at_add = record.ends, record.kill_at, record.add_at
    landed = next((i for i, end in enumerate(ends) if end >= at), None)
    if landed is None or summary["workers_lost"] < 1:
        raise RuntimeError(f"the kill at replay time {at:.2f} s did not land in an update (updates ended at "
                           f"{[round(e, 2) for e in ends]} s; workers lost: {summary['workers_lost']})")
    # Undisturbed: after the first, before the kill, or once the replacement has joined and
    # computed its first parts (its start and its warm-ups are in the two updates after the add).
    added = next((i for i, end in enumerate(ends) if at_add is not None and end >= at_add), len(ends))
    calm = [r["time_update_s"] for i, r in enumerate(rows) if 1 <= i < landed or i >= added + 2]
    if not calm:
        raise RuntimeError(f"the kill landed in iteration {landed} and its replacement in {added}: no undisturbed "
                           f"update to compare with in {len(rows)} iterations (more --iterations give more room)")
    undisturbed = statistics.median(calm)
    learner_s = statistics.median(seconds[0])
    cpus = os.cpu_count() or 1
    per_n = {}
    for n in executors:
        t = statistics.median(seconds[n])
        per_n[f"n{n}"] = {"executors": n, "update_s": t, "speedup": learner_s / t, "efficiency": learner_s / t / n,
                          "efficiency_bound": min(n, cpus) / n, "update_s_all": seconds[n]}
    start = ends[landed - 1] if landed else 0.0
    # One executor does the learner's work over the fleet's path: the difference is that path's cost.
    overhead = {"fleet_overhead_s": per_n["n1"]["update_s"] - learner_s,
                "fleet_overhead_s_per_part": (per_n["n1"]["update_s"] - learner_s) / parts} if 1 in executors else {}
    return {
        **shape,
        "updates_per_step": baseline_cfg.train.updates_per_step,
        "rows_per_round": prompts * group_size * sampler_steps,
        "gradient_parts": parts,
        "learner_update_s": learner_s,
        "learner_update_s_all": seconds[0],
        "fleet": per_n,
        **overhead,
        "kill_cost_s": rows[landed]["time_update_s"] - undisturbed,
        "kill_iteration": landed,
        "kill_replacement_iteration": added,
        "kill_undisturbed_iterations": len(calm),
        "kill_at_fraction_of_update": (at - start) / (ends[landed] - start),
        "kill_update_s": rows[landed]["time_update_s"],
        "kill_undisturbed_update_s": undisturbed,
        "kill_workers_lost": summary["workers_lost"],
        "kill_requests_lost": summary["requests_lost"],
        "weights_equal": weights_equal,
        "note": f"{cpus} CPU cores: efficiency above {cpus} executors is bounded by the cores "
                "(efficiency_bound), not by the fleet",
        "machine": {"cpus": cpus, "loadavg_1min_before": load_before, "loadavg_1min_after": os.getloadavg()[0],
                    "torch": torch.__version__},
    }
