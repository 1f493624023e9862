"""`spotlight bench sp-regroup`: how fast an SP group recovers from losing a member, in place,
against recovering by a restart; and how close SP output is to the single-process output.

Setup: one node agent with the tiny DiT's weights in shared memory (loaded once from a checkpoint
file), `world` member processes, one SP group of degree `world` serving a rollout request. With
`agent="ray"` (the default, as `spotlight train` deploys it) the agent is a Ray actor
(`elastic_sp.ray_agent`) on a local Ray cluster the bench starts (or the one this process has
joined), and every command and report is a Ray call; with `agent="local"` it lives in the bench's
process.

1. max_abs_err: for each degree the heads allow (up to `world`), one forward on a group of that
   degree against the single-process forward, at 64 image tokens and at 25 (padded).
2. rendezvous_s: forming a fresh group of `world` members on a new store, nothing else (the
   floor any regroup pays).
3. regroup_s: SIGKILL one member after step `kill_at_step` is committed; the time until the
   re-formed group (survivors, in place, at the degree the policy picks) has committed the next
   step of the same request. Then a replacement member joins (intra-node weight copy) for the
   next repeat.
4. cold_start_s: the same loss recovered the restart way (what torchelastic does): the group's
   members are restarted as fresh interpreters (start method spawn) that load the weights from
   the checkpoint file, rendezvous, and resume the request — until the next step is committed.

The timings are wall-clock on this machine; other processes competing for its cores slow both
paths (the load average is reported).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from elastic_sp.agent import NodeAgent
from elastic_sp.coordinator import Coordinator
from elastic_sp.regroup_policy import UlyssesStepTime, valid_degrees
from elastic_sp.spec import ServeSpec
from elastic_sp.weights import NodeWeights, load_checkpoint, save_checkpoint
from schedulers.clock import WallClock
from schedulers.queue import PullQueue
from schedulers.request import Kind, Request
from spotlight.config import RuntimeConfig, default_config
from spotlight.rl.dit_model import velocity
from spotlight.rl.sp_member import serve_spec, tiny_arch


def _request(rid: str) -> Request:
    return Request(rid, Kind.ROLLOUT, prompt_id=1, prompt_text="a red image", seeds=(1, 2), weight_version=0)


def _inputs(side: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, (side // 2) ** 2, 16, generator=g)
    emb = torch.randn(2, 8, 32, generator=g)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, 3:] = 0
    return x, torch.tensor([0.25, 0.75]), emb, mask


class _Run:
    """The bench's cluster: one agent, its members, the coordinator, the queue."""

    def __init__(self, spec: ServeSpec, checkpoint: Path, world: int, agent: str) -> None:
        self.spec, self.world = spec, world
        self.queue = PullQueue(WallClock(), lease_s=3600.0)
        if agent == "ray":
            from elastic_sp.ray_agent import RayAgent

            self.agent = RayAgent.start("node0", spec, load_checkpoint(checkpoint), checkpoint=str(checkpoint))
        else:
            self.agent = NodeAgent("node0", spec, NodeWeights.from_checkpoint(checkpoint), checkpoint=checkpoint)
        self.coord = Coordinator(spec, [self.agent], self.queue, step_time=UlyssesStepTime())
        self._names = (f"m{i}" for i in range(10 ** 6))

    def add(self, count: int, start_method: str | None = None, source: str | None = None) -> list[str]:
        names = [next(self._names) for _ in range(count)]
        for n in names:
            self.coord.add("node0", n, source, start_method)  # type: ignore[arg-type]
        return names

    def full_group(self) -> str:
        """One group of every ready member (dissolving what else is formed)."""
        members = self.coord.ready_members()
        self.coord.run_until(lambda: not any(g.phase.value == "forming" for g in self.coord.groups.values()), 60)
        name = self.coord.form([members])[0]
        self.coord.wait_formed([name])
        return name

    def serve(self, rid: str, until_step: int) -> int:
        """Put request `rid` and run until it has committed `until_step`; returns its group's generation."""
        self.queue.put(_request(rid))
        self.coord.run_until(lambda: any(e.kind == "committed" and e.data["request"] == rid
                                         and e.data["step"] >= until_step for e in self.coord.events), 120,
                             f"{rid} to reach step {until_step}")
        return next(e.data["generation"] for e in reversed(self.coord.events)
                    if e.kind == "committed" and e.data["request"] == rid)

    def next_commit_after(self, rid: str, t0: float, generation: int) -> Any:
        def found() -> Any:
            return next((e for e in self.coord.events if e.kind == "committed" and e.t > t0
                         and e.data["request"] == rid and e.data["generation"] > generation), None)

        self.coord.run_until(lambda: found() is not None, 300, f"{rid} to commit a step on a new group")
        return found()

    def finish(self, rid: str) -> Any:
        self.coord.run_until(lambda: self.queue.is_done([rid]), 300, f"{rid} to finish")
        return self.queue.result(rid)


@contextlib.contextmanager
def _ray_if(needed: bool) -> Iterator[None]:
    """A local Ray cluster for the agent actor while inside, unless this process has joined one
    already (then it is left as it was)."""
    if not needed:
        yield
        return
    from spotlight.runtime import ray_cluster

    started = ray_cluster.connect(RuntimeConfig())  # no address: a new local cluster
    try:
        yield
    finally:
        if started:
            ray_cluster.shutdown()


def run_sp_regroup_bench(world: int = 4, repeats: int = 3, heads: int = 4, steps: int = 8, kill_at_step: int = 2,
                         rendezvous_repeats: int = 5, cold: bool = True, agent: str = "ray",
                         progress: bool = False) -> dict[str, Any]:
    """The figures described in the module docstring, as one dict (medians over `repeats`); with
    `progress`, a bar on stderr counts its measurements."""
    if world < 2:
        raise ValueError(f"--world must be >= 2 (a group must lose a member and go on), got {world}")
    if agent not in ("ray", "local"):
        raise ValueError(f"--agent must be ray or local, got {agent!r}")
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    if not 0 < kill_at_step < steps:
        raise ValueError(f"kill_at_step must be within the {steps} steps, got {kill_at_step}")
    degrees = valid_degrees(heads, world)
    if world not in degrees:
        raise ValueError(f"--world {world} must divide --heads {heads}: the first group has degree {world}")
    spec = serve_spec(default_config({"sampler": {"num_steps": steps}}), arch=tiny_arch(heads), timeout_s=60.0)
    load_before = os.getloadavg()[0]
    # the members up, one group per degree, the rendezvous repeats, the reference sample, the repeats
    # of the in-place regroup and of the restart
    bar = tqdm(total=1 + len(degrees) + rendezvous_repeats + 1 + repeats + (repeats if cold else 0),
               desc="bench sp-regroup", unit="step", disable=not progress, file=sys.stderr)
    with bar, tempfile.TemporaryDirectory(prefix="sp-regroup-") as tmp, _ray_if(agent == "ray"):
        model = spec.build_model()
        checkpoint = save_checkpoint(model.state_dict(), Path(tmp) / "model.safetensors")
        run = _Run(spec, checkpoint, world, agent)
        try:
            run.add(world)
            run.coord.wait_ready(timeout_s=300)
            members = run.coord.ready_members()
            bar.update()

            # 1. SP output against the single-process output, per degree.
            errors: dict[str, float] = {}
            for d in degrees:
                run.coord.run_until(lambda: not any(g.phase.value == "forming" for g in run.coord.groups.values()), 60)
                name = run.coord.form([members[:d]])[0]
                run.coord.wait_formed([name])
                err = 0.0
                for side in (16, 10):  # 64 tokens; 25 tokens, padded to a multiple of d
                    x, sigma, emb, mask = _inputs(side)
                    with torch.no_grad():
                        ref = velocity(model, x, sigma, emb, mask, side)
                    outs = run.coord.forward(name, x, sigma, emb, mask, side)
                    err = max(err, max((o - ref).abs().max().item() for o in outs))
                errors[str(d)] = err
                bar.update()

            # 2. The bare rendezvous of a fresh group of `world`.
            rendezvous = []
            for _ in range(rendezvous_repeats):
                run.full_group()
                rendezvous.append(next(e.data["rendezvous_s"] for e in reversed(run.coord.events) if e.kind == "formed"))
                bar.update()

            # The undisturbed sample every disturbed one is compared with.
            run.full_group()
            run.serve("reference", steps)
            reference = run.finish("reference")
            bar.update()

            # 3. In-place regroup after a SIGKILL.
            regroup, detect, formed, joins, resume_err, regroup_degrees = [], [], [], [], 0.0, []
            for k in range(repeats):
                rid = f"elastic-{k}"
                run.full_group()
                generation = run.serve(rid, kill_at_step)
                group = run.coord.groups[run.coord.group_of[members[0]]]
                victim = group.members[1]
                t0 = run.coord.kill(victim)
                first = run.next_commit_after(rid, t0, generation)
                regroup.append(first.t - t0)
                detect.append(next(e.t for e in run.coord.events if e.kind in ("lost", "dissolved") and e.t >= t0) - t0)
                formed.append(next(e.t for e in run.coord.events if e.kind == "formed" and e.t >= t0
                                   and e.data["generation"] == first.data["generation"]) - t0)
                regroup_degrees = sorted((g.degree for g in run.coord.groups.values()), reverse=True)
                result = run.finish(rid)
                resume_err = max(resume_err, (result.trajectory - reference.trajectory).abs().max().item())
                (joiner,) = run.add(1)  # the replacement: forked, weights copied from node memory
                run.coord.wait_ready([joiner])
                joins.append(run.coord.members[joiner].ready.seconds)
                members = run.coord.ready_members()
                bar.update()

            # 4. The same loss recovered by a restart from the checkpoint.
            cold_start, cold_ready = [], []
            for k in range(repeats if cold else 0):
                rid = f"cold-{k}"
                run.full_group()
                generation = run.serve(rid, kill_at_step)
                group = run.coord.groups[run.coord.group_of[run.coord.ready_members()[0]]]
                victim, survivors = group.members[1], [m for m in group.members if m != group.members[1]]
                t0 = run.coord.kill(victim)
                for m in survivors:  # a restart replaces the whole worker group
                    run.coord.kill(m)
                fresh = run.add(len(survivors), start_method="spawn", source="checkpoint")
                first = run.next_commit_after(rid, t0, generation)
                cold_start.append(first.t - t0)
                cold_ready += [run.coord.members[m].ready.seconds for m in fresh]
                run.finish(rid)
                (joiner,) = run.add(1)
                run.coord.wait_ready([joiner])
                bar.update()
        finally:
            run.coord.close()

    regroup_s = statistics.median(regroup)
    rendezvous_s = statistics.median(rendezvous)
    out: dict[str, Any] = {
        "world": world,
        "agent": agent,
        "heads": heads,
        "tokens": spec.seq_len,
        "steps": steps,
        "kill_at_step": kill_at_step,
        "repeats": repeats,
        "degrees": degrees,
        "max_abs_err": max(errors.values()),
        "max_abs_err_by_degree": errors,
        "rendezvous_s": rendezvous_s,
        "regroup_s": regroup_s,
        "regroup_detect_s": statistics.median(detect),
        "regroup_formed_s": statistics.median(formed),
        "regroup_degrees": regroup_degrees,
        "regroup_over_rendezvous": regroup_s / rendezvous_s,
        "resume_max_abs_err": resume_err,
        "join_s": statistics.median(joins),
        "regroup_s_all": regroup,
    }
    if cold_start:
        out.update({
            "cold_start_s": statistics.median(cold_start),
            "cold_member_ready_s": statistics.median(cold_ready),
            "cold_start_over_regroup": statistics.median(cold_start) / regroup_s,
            "cold_start_s_all": cold_start,
        })
    out["machine"] = {"cpus": os.cpu_count(), "loadavg_1min_before": load_before,
                      "loadavg_1min_after": os.getloadavg()[0], "torch": torch.__version__}
    return out
