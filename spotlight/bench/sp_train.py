"""`spotlight bench sp-train`: elastic SP groups inside a training run on a real multi-node Ray cluster —
how fast a group re-forms in place after losing a member, against a cold restart of the group, and
rollout throughput at SP degree 1 against degree 2.

Setup: a loopback cluster started here (`loopback_cluster.LoopbackCluster`: a head and `nodes`
nodes, each advertising `spot: devices`), or the cluster at `address`; the tiny DiT at
`resolution` (its image tokens: (resolution/2)²), `prompts` rollout requests of 4 samples per
iteration, `sampler_steps` denoising steps, no exploration.

1. sp_degree 1: `spotlight train` with one rollout-worker actor per device (`RayExecutor`).
2. sp_degree 2: the same run served by SP groups (`ray_sp.RaySPExecutor`: one node agent actor
   per node, its members forked once); in the last iteration rank 1 of a group computing a request
   is SIGKILLed mid-request (`_Killer`). Its survivor re-forms in place: `regroup_s` is the coordinator's
   figure (the loss seen -> the new group ready), `detect_s` the SIGKILL -> the loss seen (the
   report crosses the agent actor's long poll), `recover_s` the SIGKILL -> the new group ready,
   `resume_s` the SIGKILL -> the interrupted request's next step committed on another group
   (`resumed_on`: the survivor's new group, or a group that was idle and pulled it first — then
   possibly before the survivor has re-formed).
3. Throughput: rollout requests per second of rollout phase, over the iterations before the last
   (and after the first when there are three or more: the first pays one-off warm-ups), per degree.
4. cold_restart_s: the same group brought back the restart way — a fresh agent actor on a spot
   node, fresh member interpreters (start method spawn) loading the run's final weights from a
   checkpoint file, a rendezvous — until the group is ready (`repeats` times; median).
5. weights_equal: the two runs' final weights are bit-identical (the sp_degree-2 run lost a member
   mid-request; Ulysses is exact where the tokens divide by the degree).

Wall-clock figures of this machine; the runs share its cores with everything else on it (the load
average is reported).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm import tqdm

from spotlight.config import RunConfig, default_config
from spotlight.logs import silenced


def _config(address: str, sp_degree: int, iterations: int, prompts: int, sampler_steps: int,
            resolution: int) -> RunConfig:
    return default_config({
        "warm_start": {"steps": 20, "batch_size": 8},
        "train": {"steps": iterations, "prompts_per_step": prompts, "group_size": 4, "checkpoint_every": iterations},
        "prompts": {"count": max(4, prompts)},
        "sampler": {"num_steps": sampler_steps},
        "policy": {"dit": {"resolution": resolution}},
        "runtime": {"kind": "ray", "address": address, "spot_workers": 1, "ondemand_workers": 0,
                    "sp_degree": sp_degree},
    })


def _train(cfg: RunConfig, out: Path,
           during: Callable[[Any], None] | None = None) -> tuple[list[dict], dict[str, torch.Tensor], Any]:
    """Run `cfg`; `during(runtime)` in a thread meanwhile. Returns metrics.jsonl's rows, the final
    weights and the runtime."""
    from safetensors.torch import load_file

    from spotlight.runtime.ray_runtime import RayRuntime
    from spotlight.train.trainer import Trainer

    runtime = RayRuntime(cfg)
    thread = threading.Thread(target=during, args=(runtime,), daemon=True) if during else None
    if thread is not None:
        thread.start()
    Trainer(cfg, out, progress=False).build(runtime).train()
    if thread is not None:
        thread.join(5.0)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    (weights,) = (out / "final").glob("*.safetensors")
    return rows, load_file(str(weights)), runtime


def _throughput(rows: list[dict], prompts: int) -> float:
    """Rollout requests per second of rollout phase, the last iteration left out (and the first
    when three or more ran)."""
    timed = rows[:-1] if len(rows) > 1 else rows
    if len(timed) > 1:
        timed = timed[1:]
    return prompts * len(timed) / sum(r["time_rollout_s"] for r in timed)


class _Killer:
    """In the last iteration, SIGKILL rank 1 of a degree-2 group in the middle of a request; then
    the recovery is read from the coordinator's events (`figures`).

    "In the middle" for sure: the group's members are SIGSTOPped first, and the kill lands only if,
    once the coordinator has caught up with what they had sent (its view of the group has not moved
    for `QUIET_S`: it commits each step with two calls to the queue actor, which lag behind on a
    loaded machine), the group still holds the request with steps left (else they go on, and
    another group is tried). The survivor is SIGCONTed at the kill: the figures count from the
    SIGKILL.

    A group is tried as soon as it holds a request of the last iteration, before the coordinator
    has seen a commit of it: a loaded coordinator reads a node's reports in batches, so a request's
    commits and its end can reach it in one poll, and a group seen only "with a commit" was, on
    such a machine, never seen at all (CI, 2026-11-29). Killed before its first commit, the request
    resumes from step 0: what the bench times — detection, regroup, the resumed commit — is the same."""

    QUIET_S = 1.0

    def __init__(self, last: int, steps: int) -> None:
        self.last, self.steps = last, steps
        self.victim: str | None = None
        self.request: str | None = None
        self.t: float | None = None

    def __call__(self, runtime: Any) -> None:
        deadline = time.monotonic() + 1800
        while not hasattr(runtime, "executor") and time.monotonic() < deadline:
            time.sleep(0.01)
        runtime.executor.sp.keep_events = True  # the recovery is read from the coordinator's events
        coord = runtime.executor.coord
        while self.t is None and time.monotonic() < deadline:
            try:
                g = next((g for g in list(coord.groups.values())
                          if g.degree == 2 and g.lease is not None and g.lease.request.id.startswith(f"it{self.last}/")),
                         None)
            except RuntimeError:  # a dict changed while we looked: look again
                g = None
            if g is not None:
                self._kill(coord, g)
            time.sleep(0.002)

    def _kill(self, coord: Any, g: Any) -> None:
        survivor, victim = (coord.members[m] for m in g.members)
        lease = g.lease
        if lease is None:  # done since it was seen
            return
        rid = lease.request.id
        for h in (survivor, victim):
            os.kill(h.pid, signal.SIGSTOP)
        seen, since, deadline = None, time.monotonic(), time.monotonic() + 10 * self.QUIET_S
        while time.monotonic() < deadline and time.monotonic() - since < self.QUIET_S:
            now = (coord.groups.get(g.name) is g, g.lease is not None, g.committed.step if g.committed else None)
            if now != seen:
                seen, since = now, time.monotonic()
            time.sleep(0.05)
        lease, committed = g.lease, g.committed
        if (coord.groups.get(g.name) is g and lease is not None and lease.request.id == rid
                and (committed is None or committed.step < self.steps)):
            self.victim, self.request = victim.name, rid
            self.t = time.monotonic()  # the coordinator's clock (`WallClock`: monotonic)
            os.kill(victim.pid, signal.SIGKILL)
        os.kill(survivor.pid, signal.SIGCONT)
        if self.t is None:
            os.kill(victim.pid, signal.SIGCONT)

    def figures(self, coord: Any) -> dict[str, float]:
        if self.t is None:
            raise RuntimeError("no degree-2 group was mid-request in the last iteration: nothing was killed")
        ev = [e for e in coord.events if e.t >= self.t]

        def first(what: str, match: Callable[[Any], bool]) -> Any:
            found = next((e for e in ev if match(e)), None)
            if found is None:
                seen = "\n".join(f"  {e.t - self.t:+.3f} s {e.kind} {e.data}" for e in ev
                                 if e.kind not in ("leased", "committed") or e.data.get("request") == self.request)
                raise RuntimeError(f"after {self.victim} was killed holding {self.request}, the coordinator "
                                   f"recorded no {what}; its events since the kill:\n{seen}")
            return found

        lost = first("loss of the victim", lambda e: e.kind == "lost" and e.data["member"] == self.victim)
        regrouped = first("regroup", lambda e: e.kind == "regrouped")
        broken = first("dissolution requeueing the request",
                       lambda e: e.kind == "dissolved" and self.request in e.data["requeued"]).data["generation"]
        # Whichever group pulls the re-queued request first resumes it: the survivor's new group,
        # or another group that was idle (then possibly before the survivor has re-formed).
        resumed = first("commit of the request on another group",
                        lambda e: e.kind == "committed" and e.data["request"] == self.request
                        and e.data["generation"] != broken)
        return {"regroup_s": regrouped.data["seconds"], "detect_s": lost.t - self.t,
                "recover_s": regrouped.t - self.t, "resume_s": resumed.t - self.t,
                "resumed_on": "the survivor's new group" if resumed.data["group"] == regrouped.data["group"]
                else "another group"}


def _cold_restart(cfg: RunConfig, weights: dict[str, torch.Tensor], folder: Path, node_id: str,
                  devices: int) -> dict[str, float]:
    """One cold restart of a group of `devices` on cluster node `node_id` (see the module docstring)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from elastic_sp.coordinator import Coordinator
    from elastic_sp.ray_agent import RayAgent
    from elastic_sp.regroup_policy import TargetDegree
    from elastic_sp.weights import save_checkpoint
    from schedulers.clock import WallClock
    from schedulers.queue import PullQueue
    from spotlight.rl.sp_member import serve_spec

    checkpoint = folder / "weights.safetensors"
    if not checkpoint.is_file():
        save_checkpoint(weights, checkpoint)
    spec = serve_spec(cfg, host=ray.util.get_node_ip_address())
    t0 = time.monotonic()
    agent = RayAgent.start("cold", spec, None, checkpoint=str(checkpoint),
                           options={"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)})
    t_agent = time.monotonic()
    coord = Coordinator(spec, [agent], PullQueue(WallClock(), 3600.0), step_time=TargetDegree(devices),
                        auto_regroup=False)
    try:
        names = [f"cold#{j}" for j in range(devices)]
        for name in names:
            coord.add("cold", name, "checkpoint", "spawn")
        coord.wait_ready(names, timeout_s=600)
        t_ready = time.monotonic()
        coord.wait_formed(coord.form([names]))
        t_formed = time.monotonic()
    finally:
        coord.close()
    return {"cold_restart_s": t_formed - t0, "agent_s": t_agent - t0, "members_ready_s": t_ready - t_agent}


def run_sp_train_bench(nodes: int = 2, devices: int = 2, iterations: int = 4, prompts: int = 8,
                       sampler_steps: int = 8, resolution: int = 16, repeats: int = 3, address: str | None = None,
                       progress: bool = False) -> dict[str, Any]:
    """The figures described in the module docstring, as one dict; with `progress`, a bar and the
    runs' log lines on stderr."""
    import ray

    from spotlight.bench.loopback_cluster import LoopbackCluster

    if devices < 2:
        raise ValueError(f"--devices must be >= 2 (a degree-2 group on a node), got {devices}")
    if iterations < 2:
        raise ValueError(f"--iterations must be >= 2 (one to time, the last to lose a member in), got {iterations}")
    load_before = os.getloadavg()[0]
    bar = tqdm(total=3 + repeats, desc="bench sp-train", unit="step", disable=not progress, file=sys.stderr)
    cluster = None
    if ray.is_initialized():  # each run joins the cluster itself
        ray.shutdown()
    with bar, tempfile.TemporaryDirectory(prefix="sp-train-") as tmp:
        try:
            if address is None:
                cluster = LoopbackCluster()
                for _ in range(nodes):
                    cluster.add_node({"spot": devices})
                address = cluster.address
            bar.update()
            sp1 = _config(address, 1, iterations, prompts, sampler_steps, resolution)
            with silenced(not progress):  # the runs' lines: on stderr (the CLI's) with the bar only
                rows1, weights1, _ = _train(sp1, Path(tmp) / "sp1")
            bar.update()
            killer = _Killer(last=iterations - 1, steps=sampler_steps)
            sp2 = _config(address, 2, iterations, prompts, sampler_steps, resolution)
            with silenced(not progress):
                rows2, weights2, runtime = _train(sp2, Path(tmp) / "sp2", killer)
            regroup = killer.figures(runtime.executor.coord)
            stats = runtime.executor.stats()
            spot_ids = [n.cluster_id for n in runtime.engine.nodes.values() if n.spot and n.alive and n.cluster_id]
            bar.update()
            ray.init(address=address, log_to_driver=False)
            try:
                cold = []
                for _ in range(repeats):
                    cold.append(_cold_restart(sp2, weights2, Path(tmp), spot_ids[0], devices))
                    bar.update()
            finally:
                ray.shutdown()
        finally:
            if cluster is not None:
                cluster.close()
    t1, t2 = _throughput(rows1, prompts), _throughput(rows2, prompts)
    cold_s = statistics.median(c["cold_restart_s"] for c in cold)
    return {
        "nodes": nodes,
        "devices_per_node": devices,
        "iterations": iterations,
        "requests_per_iteration": prompts,
        "samples_per_request": 4,
        "sampler_steps": sampler_steps,
        "tokens": (resolution // 2) ** 2,
        "throughput_sp1_rps": t1,
        "throughput_sp2_rps": t2,
        "throughput_sp2_over_sp1": t2 / t1,
        **regroup,
        "sp_regroups": stats["sp_regroups"],
        "cold_restart_s": cold_s,
        "cold_agent_s": statistics.median(c["agent_s"] for c in cold),
        "cold_members_ready_s": statistics.median(c["members_ready_s"] for c in cold),
        "cold_restart_over_regroup": cold_s / regroup["regroup_s"],
        "cold_restart_over_recover": (regroup["detect_s"] + cold_s) / regroup["recover_s"],
        "cold_restart_s_all": [c["cold_restart_s"] for c in cold],
        "weights_equal": weights1.keys() == weights2.keys() and all(torch.equal(weights1[k], weights2[k])
                                                                    for k in weights1),
        "machine": {"cpus": os.cpu_count(), "loadavg_1min_before": load_before,
                    "loadavg_1min_after": os.getloadavg()[0], "torch": torch.__version__},
    }
