"""The SP coordinator: group membership, in-place regrouping, and serving the pull queue with groups.

It sees every member of every node agent, forms groups as the regroup policy says, and keeps one
event loop (`poll`) over what the agents expose (`agent.Agent`: for an agent in this process, the
members' pipes and process sentinels; for an agent in its own process, its connection, which
relays them). A member's death (`agent.Lost`) is a member lost without notice; it is noticed as soon as the process is gone (~25 ms after a SIGKILL on a
loaded 2-core machine, most of it the kernel tearing the process down), not when a collective
times out. A group whose collective failed first (gloo saw the dead peer's sockets reset) reports
itself broken; that is handled the same way.

On a membership change only the affected groups change: a broken group's request goes back to
the queue at its committed step (`PullQueue.worker_lost`), the survivors are told to leave
(`Halt`, which also interrupts a collective they are blocked in), and the policy re-plans the
survivors, idle groups and free members into new groups. A new group gets a new generation, a
new rendezvous store, and a new queue worker name, so nothing of the old generation can commit.
A new member's weights come from its node's live copy, else over its first group from a member
that has them (and it then exports them to its node), and only with no live copy anywhere from
the checkpoint store.

A group computes one request at a time; it *leases* it from the pull queue under its name and
commits after every step (rank 0 reports the step's new trajectory entries and log-probs, which
the coordinator appends to the committed `SampleState` and checkpoints into the queue), so a group
that breaks loses at most the step in flight, and the group that resumes the request continues
bit-identically from the committed step (the sampler's noise is a function of the step). The last
step completes it with the committed `SampleState`, or with `spec.finish` with what rank 0
computed from it (the builder's `finish`: what a single-process worker commits). The queue is a
`GroupQueue`: a `PullQueue` in this process, or the run's queue actor through its client (Ray).

Group lifecycle (`GroupPhase`): FORMING -> READY once every member reported Formed; READY -> BUSY on
a lease; BUSY -> READY on completion; any -> dissolved (broken, re-planned, or retired).

Who decides that a group serves: standalone (`bench sp-regroup`, the elastic_sp tests), every idle
group leases whatever is queued, fastest group first. Driven by the fleet engine (`engine_driven`,
`fleet_executor.SPExecutor`), a group leases only after `serve(group, kinds, version)` told it to;
it then pulls on after each completion, like a live `RolloutWorker.serve` loop, and reports
`served` when the queue has nothing more for it (or, `noticed`, when a retiring member made it give
its request back). Either way the group leases one request at a time and commits every step.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from enum import Enum
from multiprocessing.connection import wait as wait_any
from typing import Any, Protocol

import torch
import torch.distributed as dist

from elastic_sp import protocol as P
from elastic_sp.agent import Agent, Lost, MemberHandle, Source
from elastic_sp.regroup_policy import (
    StepTimeModel,
    UlyssesStepTime,
    check_degree,
    regroup,
)
from elastic_sp.spec import ServeSpec
from schedulers.clock import Clock, WallClock
from schedulers.queue import Lease
from schedulers.request import Kind
from schedulers.sample_state import SampleState

BROKEN_GRACE_S = 0.02
"""How long a group that broke by itself waits for the death behind it to be reported (20 ms: a
SIGKILLed process's sockets reset at exit, its sentinel fires microseconds to milliseconds later)."""


class GroupQueue(Protocol):
    """What the coordinator asks of the pull queue: `schedulers.queue.PullQueue` in this process,
    or `schedulers.queue_actor.QueueClient`, the same calls on the run's queue actor (Ray)."""

    def pull(self, worker: str, max_requests: int = 1, kinds: Collection[Kind] | None = None,
             weight_version: int | None = None) -> list[Lease]: ...

    def heartbeat(self, worker: str, progress: dict[str, int] | None = None,
                  report_cancelled: bool = False) -> Any: ...

    def checkpoint(self, worker: str, request_id: str, state: Any, step: int) -> bool: ...

    def give_back(self, worker: str, request_id: str, state: Any, step: int) -> bool: ...

    def complete(self, worker: str, request_id: str, result: Any) -> bool: ...

    def worker_lost(self, worker: str) -> list[str]: ...

    def stats(self) -> dict[str, int]: ...


class MemberFailed(RuntimeError):
    """A member reported an unexpected error (its traceback is the message)."""


class GroupPhase(Enum):
    """FORMING -> READY -> BUSY -> READY ...; dissolving removes a group in any phase."""

    FORMING = "forming"
    READY = "ready"
    BUSY = "busy"


@dataclass
class GroupState:
    name: str
    generation: int
    members: list[str]
    """In rank order."""
    phase: GroupPhase = GroupPhase.FORMING
    store: Any = None
    """The rendezvous TCPStore server of this generation (None for a group of one)."""
    formed: dict[str, P.Formed] = field(default_factory=dict)
    lease: Lease | None = None
    committed: SampleState | None = None
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)
    draining: bool = False
    """A member got a preemption notice: give the request back at the next committed step."""
    serving: tuple[tuple[Kind, ...], int] | None = None
    """Engine-driven: the request kinds and weight version `serve` told the group to pull, until
    the queue has nothing more for it (None: idle, it leases nothing by itself)."""

    @property
    def degree(self) -> int:
        return len(self.members)


@dataclass(frozen=True)
class Event:
    t: float
    """Clock seconds."""
    kind: str
    """spawned, ready, killed, lost, stopped, forming, formed, dissolved, leased, committed,
    completed, given_back, served, exported. A `dissolved` event says `lost` when a member's death
    broke the group (else it was re-planned, retired, cancelled or its lease ran out); `served`
    (engine-driven only) says `noticed` when a retiring member ended the serving."""
    data: dict[str, Any]


class Coordinator:
    def __init__(self, spec: ServeSpec, agents: Sequence[Agent], queue: GroupQueue,
                 step_time: StepTimeModel | None = None, clock: Clock | None = None,
                 max_tokens_per_device: int | None = None, auto_regroup: bool = True,
                 weight_version: int | None = None, engine_driven: bool = False) -> None:
        self.spec = spec
        self.agents = {a.node: a for a in agents}
        self.queue = queue
        self.step_time = step_time or UlyssesStepTime()
        self.clock = clock or WallClock()
        self.max_tokens_per_device = max_tokens_per_device
        self.auto_regroup = auto_regroup
        """Re-plan by the policy on every membership change (off: groups only by `form`)."""
        self.weight_version = weight_version
        """Standalone: lease only requests for these weights (None: any)."""
        self.engine_driven = engine_driven
        """A group leases only when `serve` tells it to (see the module docstring)."""
        self.members: dict[str, MemberHandle] = {}
        self.has_weights: dict[str, bool] = {}
        self.retiring: set[str] = set()
        self.groups: dict[str, GroupState] = {}
        self.group_of: dict[str, str] = {}
        self.events: list[Event] = []
        self.digests: dict[str, str] = {}
        self._generations = itertools.count(1)
        self._replan_at: float | None = None
        """When a deferred re-plan is due (after a group reported itself broken)."""
        self.regroups: list[float] = []
        """Seconds of every in-place regroup: a group formed (READY) with a member whose group was
        dissolved, from that dissolution (the earliest, among its members) — the member's death or
        notice seen, a re-plan, a cancel — to the new group ready; its process, model and weights stayed."""
        self._left: dict[str, float] = {}
        """Member -> when the group it was in was dissolved (until it is in a formed group again)."""

    # ---- membership -----------------------------------------------------------------------------

    def attach(self, agent: Agent) -> None:
        """Add `agent`'s node (a node that joins); an agent the node had before — its members all
        dead or stopped, as after a preemption — is closed and replaced."""
        old = self.agents.get(agent.node)
        if old is not None and old is not agent:
            if any(self.members[m].alive for m in old.members if m in self.members):
                raise ValueError(f"node {agent.node} still has live members; it cannot join again")
            old.close()
        self.agents[agent.node] = agent

    def add(self, node: str, name: str, source: Source | None = None, start_method: str | None = None) -> MemberHandle:
        """Start member `name` on `node`. Its weights (unless `source` says): the node's live copy,
        else a peer's over its first group, else — no live copy anywhere — the checkpoint."""
        agent = self.agents[node]
        if source is None:
            if agent.has_weights:
                source = "node"
            elif any(a.has_weights for a in self.agents.values()) or any(
                    self.has_weights.get(m) for m, h in self.members.items() if h.alive):
                source = "peer"
            else:
                source = "checkpoint"
        handle = agent.spawn(name, source, start_method)
        self.members[name] = handle
        self.has_weights[name] = False
        self._event("spawned", member=name, node=node, source=source)
        return handle

    def kill(self, name: str) -> float:
        """SIGKILL member `name` (a loss without notice); returns the clock time of the kill."""
        t = self.clock.now()
        self.agents[self.members[name].node].kill(name)
        self._event("killed", member=name)
        return t

    def retire(self, *names: str) -> None:
        """Members `names` got a preemption notice: a group of theirs that computes finishes the
        step in flight, gives the request back at that step, and re-forms without them; then they
        are stopped. (All are marked first, so no re-plan in between puts one in a new group.)"""
        self.retiring.update(names)
        stopped = False
        for name in names:
            if not self.members[name].alive:
                self.retiring.discard(name)
                continue
            g = self.groups.get(self.group_of.get(name, ""))
            if g is not None and g.lease is not None:
                g.draining = True  # stopped when the group gives its request back (`_on_committed`)
                continue
            if g is not None:
                self._dissolve(g, "retired")
            self._stop(name)
            stopped = True
        if stopped and self.auto_regroup:
            self._replan()

    def ready_members(self) -> list[str]:
        return [m for m, h in self.members.items() if h.alive and h.ready is not None and m not in self.retiring]

    def wait_ready(self, names: Sequence[str] | None = None, timeout_s: float = 120.0) -> None:
        """Wait until members `names` (default: all started) have their model and weights."""
        names = list(self.members) if names is None else list(names)

        def done() -> bool:
            for n in names:
                h = self.members[n]
                if h.ready is None and not h.alive:
                    raise RuntimeError(f"member {n} died while starting (exit code {h.exitcode})")
            return all(self.members[n].ready is not None for n in names)

        self.run_until(done, timeout_s, f"members {names} to be ready")

    # ---- groups ---------------------------------------------------------------------------------

    def plan(self) -> None:
        """Form groups from the free members as the regroup policy says."""
        self._replan()

    def form(self, groups: Sequence[Sequence[str]]) -> list[str]:
        """Form exactly `groups` (member names in rank order), dissolving the idle groups their
        members are in; returns the new group names."""
        named = [m for members in groups for m in members]
        if len(set(named)) != len(named):
            raise ValueError(f"a member may be in one group only: {[list(g) for g in groups]}")
        ready = set(self.ready_members())
        for members in groups:
            check_degree(self.spec.heads, len(members))
            if not set(members) <= ready:
                raise ValueError(f"members {sorted(set(members) - ready)} are not alive and ready")
        for members in groups:
            for m in members:
                g = self.groups.get(self.group_of.get(m, ""))
                if g is not None and g.lease is not None:
                    raise ValueError(f"member {m} is computing a request in group {g.name}")
                if g is not None:
                    self._dissolve(g, "re-formed")
        return [self._form(list(members)) for members in groups]

    def wait_formed(self, names: Sequence[str] | None = None, timeout_s: float = 60.0) -> None:
        def done() -> bool:
            wanted = self.groups if names is None else {n: self.groups.get(n) for n in names}
            for n, g in wanted.items():
                if g is None:
                    raise RuntimeError(f"group {n} broke while forming")
                if g.phase is GroupPhase.FORMING:
                    return False
            return True

        self.run_until(done, timeout_s, "groups to form")

    def serve(self, group: str, kinds: Sequence[Kind], version: int) -> bool:
        """Engine-driven: idle READY group `group` leases a request of `kinds` at weight `version`
        now and pulls on after each completion until the queue has nothing more for it (then a
        `served` event). False, and the group stays idle, when nothing can be leased now."""
        if not self.engine_driven:
            raise RuntimeError("serve() is for a coordinator driven by the fleet engine (engine_driven=True); "
                               "a standalone coordinator leases to idle groups by itself")
        g = self.groups[group]
        if g.phase is not GroupPhase.READY or g.lease is not None or g.draining:
            raise ValueError(f"group {group} is {g.phase.value}, not idle: it cannot be told to serve")
        leases = self.queue.pull(g.name, 1, kinds, weight_version=version)
        if not leases:
            return False
        g.serving = (tuple(kinds), version)
        self._lease(g, leases[0])
        return True

    def cancelled(self, kind: Kind) -> None:
        """Every open request of `kind` was just cancelled: a group computing one is dissolved (the
        Halt stops its members at the next step boundary; re-forming costs one rendezvous, far less
        than finishing the request) and its members re-planned."""
        hit = [g for g in self.groups.values() if g.lease is not None and g.lease.request.kind is kind]
        for g in hit:
            g.lease = None
            self._dissolve(g, f"its {kind.name.lower()} request was cancelled")
        if hit and self.auto_regroup:
            self._replan()

    def forward(self, group: str, x: torch.Tensor, sigma: torch.Tensor, emb: torch.Tensor,
                mask: torch.Tensor | None, side: int, timeout_s: float = 60.0) -> list[torch.Tensor]:
        """One velocity evaluation on `group`; every rank's output, by rank."""
        g = self.groups[group]
        g.outputs = {}
        for m in g.members:
            self._send(m, P.Forward(g.generation, x, sigma, emb, mask, side))
        self.run_until(lambda: len(g.outputs) == g.degree, timeout_s, f"group {group}'s forward")
        return [g.outputs[r] for r in range(g.degree)]

    def digest(self, name: str, timeout_s: float = 60.0) -> str:
        """A hash of member `name`'s weights (`weights.digest`)."""
        self.digests.pop(name, None)
        self._send(name, P.Digest())
        self.run_until(lambda: name in self.digests, timeout_s, f"{name}'s digest")
        return self.digests[name]

    # ---- the event loop ------------------------------------------------------------------------

    def poll(self, timeout_s: float = 0.05) -> None:
        """Handle what the members reported and who died, waiting up to `timeout_s` for anything."""
        waitables: dict[Any, Agent] = {obj: a for a in self.agents.values() for obj in a.waitables()}
        if self._replan_at is not None:
            timeout_s = max(0.0, min(timeout_s, self._replan_at - self.clock.now()))
        if any(getattr(a, "buffered", False) for a in self.agents.values()):
            timeout_s = 0.0  # reports already read off a connection wait for nothing
        if waitables:
            ready = wait_any(list(waitables), timeout_s)
        else:  # no member alive anywhere: nothing can report, only time passes
            ready = []
            self.clock.sleep(timeout_s)
        reports = [r for a in self.agents.values() if getattr(a, "buffered", False) for r in a.receive(None)]
        for obj in ready:
            reports += waitables[obj].receive(obj)
        for name, msg in reports:
            h = self.members.get(name)
            if h is None:
                continue
            if isinstance(msg, Lost):
                self._lost(h)
            else:  # also what a member said just before it died: its last commit counts
                self._on_message(h, msg)
        if self._replan_at is not None and self.clock.now() >= self._replan_at:
            self._replan()
        self._dispatch()  # requests put since the last look go to idle groups

    def run_until(self, done: Callable[[], bool], timeout_s: float = 60.0, what: str = "condition") -> None:
        deadline = self.clock.now() + timeout_s
        while not done():
            if self.clock.now() > deadline:
                raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}; {self.describe()}")
            self.poll(0.05)

    def describe(self) -> str:
        groups = ", ".join(f"{g.name}({g.phase.value}: {'+'.join(g.members)})" for g in self.groups.values())
        alive = [m for m, h in self.members.items() if h.alive]
        return f"groups [{groups}], alive {alive}, queue {self.queue.stats()}"

    def close(self) -> None:
        for agent in self.agents.values():
            agent.close()
        for g in list(self.groups.values()):
            g.store = None
        self.groups.clear()

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals ------------------------------------------------------------------------------

    def _event(self, kind: str, **data: Any) -> None:
        self.events.append(Event(self.clock.now(), kind, data))

    def _send(self, name: str, msg: Any) -> None:
        """Send a command; a member whose pipe is closed has died, which its agent reports."""
        self.agents[self.members[name].node].send(name, msg)

    def _on_message(self, h: MemberHandle, msg: Any) -> None:
        if isinstance(msg, P.Ready):
            h.ready = msg
            self.has_weights[h.name] = msg.source != "none"
            self._event("ready", member=h.name, source=msg.source, seconds=msg.seconds)
            starting = [m for m, x in self.members.items() if x.alive and x.ready is None]
            if self.auto_regroup and not starting:  # members started together are planned together
                self._replan()
        elif isinstance(msg, P.Formed):
            g = self.groups.get(msg.group)
            if g is None or g.generation != msg.generation:
                return  # a generation dissolved since
            g.formed[h.name] = msg
            if len(g.formed) == g.degree:
                g.phase = GroupPhase.READY
                newly = [m for m in g.members if not self.has_weights[m]]
                for m in g.members:
                    self.has_weights[m] = True
                for m in newly:  # weights came over the network: make them the node's live copy
                    if not self.agents[self.members[m].node].has_weights:
                        self._send(m, P.Export())
                self._event("formed", group=g.name, generation=g.generation, degree=g.degree,
                            rendezvous_s=max(f.rendezvous_s for f in g.formed.values()),
                            weights_s=max(f.weights_s for f in g.formed.values()))
                left = [self._left.pop(m) for m in g.members if m in self._left]
                if left:  # re-formed in place from members of dissolved groups
                    self.regroups.append(self.clock.now() - min(left))
                    self._event("regrouped", group=g.name, seconds=self.regroups[-1])
                self._dispatch()
        elif isinstance(msg, P.Committed):
            self._on_committed(h, msg)
        elif isinstance(msg, P.Output):
            g = self.groups.get(self.group_of.get(h.name, ""))
            if g is not None and g.generation == msg.generation:
                g.outputs[msg.rank] = msg.output
        elif isinstance(msg, P.Broken):
            g = self.groups.get(self.group_of.get(h.name, ""))
            if g is not None and g.generation == msg.generation:  # not one we dissolved ourselves
                self._dissolve(g, f"broken: {msg.reason}", lost=True)
                # Usually a peer died and gloo saw its sockets reset a moment before its process
                # sentinel fires: re-plan once that has had BROKEN_GRACE_S to arrive, or the new
                # group would include the dead member and break again.
                if self.auto_regroup:
                    self._replan_at = self.clock.now() + BROKEN_GRACE_S
        elif isinstance(msg, P.Exported):  # its agent has adopted them as the node's copy
            self._event("exported", member=h.name, node=h.node)
        elif isinstance(msg, P.Digested):
            self.digests[h.name] = msg.digest
        elif isinstance(msg, P.Failed):
            raise MemberFailed(f"member {h.name} failed:\n{msg.error}")
        else:
            raise TypeError(f"unknown report {type(msg).__name__} from {h.name}")

    def _on_committed(self, h: MemberHandle, msg: P.Committed) -> None:
        g = self.groups.get(self.group_of.get(h.name, ""))
        if g is None or g.generation != msg.generation or g.lease is None or g.lease.request.id != msg.request_id:
            return  # from a generation that has been re-formed since: its step is not committed
        req = g.lease.request
        if g.committed is None:
            state = SampleState((req.prompt_id,) * len(req.seeds), tuple(req.seeds), msg.step, msg.latents, msg.log_probs)
        else:
            state = dataclasses.replace(g.committed, step=msg.step,
                                        trajectory=torch.cat([g.committed.trajectory, msg.latents], dim=1),
                                        log_probs=torch.cat([g.committed.log_probs, msg.log_probs], dim=1))
        g.committed = state
        final = msg.step >= self.spec.steps(req.kind)
        self._event("committed", group=g.name, generation=g.generation, degree=g.degree, request=req.id,
                    step=msg.step)
        if final:
            # Refused if cancelled meanwhile: nothing lost. With `spec.finish`, rank 0 sent the result.
            self.queue.complete(g.name, req.id, msg.result if msg.result is not None else state)
            g.lease, g.committed, g.phase = None, None, GroupPhase.READY
            self._event("completed", group=g.name, request=req.id)
        elif g.draining:
            self.queue.give_back(g.name, req.id, state, msg.step)
            g.lease = None
            self._event("given_back", group=g.name, request=req.id, step=msg.step)
        elif self.queue.checkpoint(g.name, req.id, state, msg.step):
            self.queue.heartbeat(g.name, {req.id: msg.step})
        else:  # the lease ran out (no commit for lease_s): the request is someone else's now
            g.lease = None
            self._dissolve(g, "lease expired")
            if self.auto_regroup:
                self._replan()
            return
        if g.draining:
            if g.serving is not None:
                g.serving = None
                self._event("served", group=g.name, noticed=True)
            self._dissolve(g, "a member retired")
            for m in [m for m in self.retiring if self.members[m].alive]:
                self._stop(m)
            if self.auto_regroup:
                self._replan()
        elif final and self.engine_driven:
            self._pull_on(g)
        elif final:
            self._dispatch()

    def _lost(self, h: MemberHandle) -> None:
        """Member `h` died (its agent has collected it)."""
        h.alive = False
        self.retiring.discard(h.name)
        self._left.pop(h.name, None)
        self._event("lost", member=h.name, exitcode=h.exitcode)
        g = self.groups.get(self.group_of.get(h.name, ""))
        if g is not None:
            self._dissolve(g, f"member {h.name} lost", lost=True)
        if self.auto_regroup:
            self._replan()

    def _stop(self, name: str) -> None:
        h = self.members[name]
        self.agents[h.node].stop(name)
        self.retiring.discard(name)
        self._left.pop(name, None)
        self._event("stopped", member=name)

    def _dissolve(self, g: GroupState, reason: str, lost: bool = False) -> None:
        """Take `g` out of service: its request back to the queue at the committed step, its
        surviving members told to leave it (interrupting whatever collective they are in).
        `lost`: a member's death broke it."""
        if self.groups.pop(g.name, None) is None:
            return
        requeued = self.queue.worker_lost(g.name) if g.lease is not None else []
        now = self.clock.now()
        for m in g.members:
            if self.group_of.get(m) == g.name:
                del self.group_of[m]
            if self.members[m].alive:
                self._send(m, P.Halt(g.generation))
                if g.phase is not GroupPhase.FORMING:  # a group that never formed was no group to leave
                    self._left.setdefault(m, now)
        g.store = None
        self._event("dissolved", group=g.name, generation=g.generation, reason=reason, requeued=requeued,
                    lost=lost)

    def _replan(self) -> None:
        self._replan_at = None
        # A draining group (a member noticed mid-request) is not the plan's: it gives its request
        # back at its next commit and dissolves itself (`_on_committed`). Planned, it would count
        # as broken (its retiring member is not ready) and be dissolved now, its request re-queued
        # as if lost instead of given back; its other members stay out of new groups until then.
        draining = {m for g in self.groups.values() if g.draining for m in g.members}
        alive = {m: self.members[m].node for m in self.ready_members() if m not in draining}
        current = [g for g in self.groups.values() if not g.draining]
        busy = {i for i, g in enumerate(current) if g.lease is not None or g.phase is GroupPhase.FORMING}
        plan = regroup([g.members for g in current], busy, alive, self.spec.seq_len, self.spec.heads,
                       self.step_time, pending=self.queue.stats()["queued"],
                       max_tokens_per_device=self.max_tokens_per_device)
        kept = {frozenset(members) for members in plan.keep}
        for g in current:
            if frozenset(g.members) not in kept:
                self._dissolve(g, "re-planned")
        for members in self._with_weight_holders(plan.form):
            self._form(members)
        self._dispatch()

    def _with_weight_holders(self, groups: list[list[str]]) -> list[list[str]]:
        """Every group needs a member with weights to send them to the others: swap holders in
        from groups that have two or more; a group left without one is not formed now."""
        groups = [list(g) for g in groups]
        holds = self.has_weights
        for g in groups:
            if any(holds[m] for m in g):
                continue
            donor = next((d for d in groups if sum(holds[m] for m in d) >= 2), None)
            if donor is None:
                continue
            i = next(i for i, m in enumerate(donor) if holds[m])
            g[0], donor[i] = donor[i], g[0]
        return [g for g in groups if any(holds[m] for m in g)]

    def _form(self, members: list[str]) -> str:
        generation = next(self._generations)
        name = f"g{generation}"
        store = None
        port = 0
        if len(members) > 1:  # a new store per generation: re-using a store for a new group hangs in torch
            store = dist.TCPStore(self.spec.host, 0, None, True, timedelta(seconds=self.spec.timeout_s),
                                  wait_for_workers=False)
            port = store.port
        g = GroupState(name, generation, members, store=store)
        self.groups[name] = g
        holders = [r for r, m in enumerate(members) if self.has_weights[m]]
        needs = tuple(r for r, m in enumerate(members) if not self.has_weights[m])
        if not holders:
            raise RuntimeError(f"group {name} ({members}) has no member with weights to share")
        for rank, m in enumerate(members):
            self.group_of[m] = name
            self._send(m, P.Form(name, generation, rank, len(members), self.spec.host, port,
                                 self.spec.timeout_s, holders[0] if needs else None, needs))
        self._event("forming", group=name, generation=generation, members=list(members))
        return name

    def _step_s(self, g: GroupState) -> float:
        return self.step_time(self.spec.seq_len, g.degree)

    def _dispatch(self) -> None:
        """Standalone: lease queued requests to idle groups, fastest first (by the step-time model);
        a group waits while a faster one is still forming (it would serve the request sooner).
        Engine-driven: nothing (groups lease by `serve` and pull on by `_pull_on`)."""
        if self.engine_driven:
            return
        forming = [self._step_s(g) for g in self.groups.values() if g.phase is GroupPhase.FORMING]
        idle = [g for g in self.groups.values() if g.phase is GroupPhase.READY and not g.draining]
        for g in sorted(idle, key=lambda g: (self._step_s(g), g.generation)):
            if any(t < self._step_s(g) for t in forming):
                continue
            leases = self.queue.pull(g.name, 1, weight_version=self.weight_version)
            if not leases:
                return
            self._lease(g, leases[0])

    def _pull_on(self, g: GroupState) -> None:
        """Engine-driven: a serving group that completed a request leases the next one of its
        kinds and version, or reports `served` when the queue has nothing more for it."""
        if g.serving is None:
            return
        kinds, version = g.serving
        leases = self.queue.pull(g.name, 1, kinds, weight_version=version)
        if leases:
            self._lease(g, leases[0])
        else:
            g.serving = None
            self._event("served", group=g.name, noticed=False)

    def _lease(self, g: GroupState, lease: Lease) -> None:
        g.lease, g.committed, g.phase = lease, lease.request.state, GroupPhase.BUSY
        for m in g.members:
            self._send(m, P.Run(g.generation, lease.request))
        self._event("leased", group=g.name, generation=g.generation, degree=g.degree,
                    request=lease.request.id, step=lease.request.step)
