"""The modelled executor: the fleet engine's workers as SP groups whose compute takes modelled time.

The simulator runs the live fleet engine (`schedulers.fleet.FleetEngine`) and the live pull queue
on a `ManualClock`; this executor stands in for the devices. A worker is an SP group of devices
planned by the live regroup policy (`elastic_sp.regroup_policy.regroup` / `plan_degrees`); a request
it pulls ends `(steps - committed step) x step time + reward time` later (`spotlight.sim.step_time`).
Nothing is computed: steps are accounted arithmetically, as the live worker would report them —
at a death its reached step by heartbeat and its last commit (every `commit_every` steps) by
`checkpoint`; on a notice it gives the request back at the next step boundary.

Devices and groups, as the live elastic SP coordinator keeps them: a spot node's devices can serve
`join_s` after the node joins (start its agent and members, weights from a peer); a changed node's
groups and free devices are re-planned in place, a new group serving `regroup_s` later; a busy,
intact group is never broken. On-demand devices are grouped once, at the start. With `elastic`
off (the restart-from-checkpoint baseline) nothing is re-planned: the spot groups are planned over
the devices live at the start and at each restart (`restart_groups`), a node that joins in between
serves only after the next restart, and a worker's commits die with it.

Granularity, so that 4,096 GPUs x 1,000 iterations stay cheap: events only at request ends,
give-backs and joins. Determinism: no wall clock, ties break by insertion order.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from elastic_sp.regroup_policy import plan_degrees, regroup
from schedulers.clock import ManualClock
from schedulers.fleet import Dissolved, Node, Ready, Served, Worker
from schedulers.preemption import PreemptionNotice
from schedulers.queue import PullQueue
from schedulers.request import Kind, Request
from spotlight.sim.step_time import StepTimes

_DONE, _GIVEBACK, _READY, _NODE = range(4)
_GRADIENT = (Kind.TRAIN,)


@dataclass
class Group:
    """A modelled SP group: the handle of one of the engine's workers."""

    members: list[str]
    step_s_per_sample: float
    lease: Request | None = None
    start: float = 0.0
    """When it began computing the leased request (from `lease.step`)."""
    step_s: float = 0.0
    busy_s: float = 0.0
    """GPU-seconds per member of the leased request (a TRAIN micro-batch: of the whole group)."""
    gen: int = 0
    """Bumped whenever a scheduled end becomes void (given back, cancelled, dissolved)."""
    kinds: Collection[Kind] = ()
    version: int = 0
    retiring: bool = False
    crew: list[Worker] = field(default_factory=list)
    """As a crew's lead (`serve_crew`): the crew, itself first; empty otherwise."""
    lead: str | None = None
    """As another member of a crew: its lead's name (busy: it computes the lead's parts)."""
    left: int | None = None
    """As a crew's lead: the requests it may still pull (None: any; `serve_crew`'s `at_most`)."""


class ModelledExecutor:
    """See the module docstring. `on_done(worker, request)` hears of every request that counted."""

    def __init__(self, clock: ManualClock, queue: PullQueue, st: StepTimes, resolution: int, seq: int,
                 commit_every: int, join_s: float, pending_per_iteration: int, ondemand_devices: int,
                 on_done: Callable[[Worker, Request], None] | None = None, elastic: bool = True) -> None:
        self.clock, self.queue, self.st = clock, queue, st
        self.resolution, self.seq, self.model = resolution, seq, st.step_model(resolution)
        self.commit_every, self.join_s = commit_every, join_s
        self.pending_per_iteration = pending_per_iteration
        """The work regrouping plans for, at least (see `_regroup`)."""
        self.ondemand_devices = ondemand_devices
        self.on_done = on_done
        self.elastic = elastic
        self.heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self.workers: dict[str, Worker] = {}
        self._wid = 0
        self.member_worker: dict[str, str] = {}
        self.alive: dict[str, str] = {}
        """Spot member -> its placement node ("spotK/j" per `gpus_per_node`), for members ready to serve."""
        self.noticed: set[str] = set()
        self.node_members: dict[str, list[str]] = {}
        self.live_spot: set[str] = set()
        self.generation: dict[str, int] = {}
        """Spot node -> the generation (`Node.generation`) of its last join."""
        self.out: list[Any] = []
        """Events for the engine, collected until `wait` returns them."""
        self.regroups = 0
        self.busy_gpu_s = 0.0
        self._leasing: dict[Kind, dict[str, None]] = {kind: {} for kind in Kind}
        """Per kind, the workers holding a request of it: what `cancelled` visits (not every worker)."""

    # ---- the executor interface -------------------------------------------------------------------

    def start(self, node: Node, spot: bool) -> list[Worker]:
        members = [f"{node.name}#{j}" for j in range(node.devices)]
        self.node_members[node.name] = members
        if not spot:  # on-demand: grouped once, for the rollout's work, serving at once
            started = []
            for d in plan_degrees(len(members), self.seq, self.st.heads, self.model, pending=self.pending_per_iteration):
                started.append(self._new_worker(members[:d], False, self.clock.now()))
                members = members[d:]
            return started
        self.live_spot.add(node.name)
        # The join carries the node's generation: a node gone and back within join_s (a trace's
        # remove and add, a release and a rent) serves join_s after its last join, not its first.
        if self.clock.now() == 0.0:
            self._push(0.0, _NODE, (node.name, node.generation))
        elif self.elastic:
            self._push(self.clock.now() + self.join_s, _NODE, (node.name, node.generation))
        self.generation[node.name] = node.generation
        return []

    def serve(self, worker: Worker, kinds: Collection[Kind], version: int) -> bool:
        g: Group = worker.handle
        g.kinds, g.version = kinds, version
        return self._pull(worker)

    def serve_crew(self, workers: Sequence[Worker], version: int, at_most: int | None = None) -> bool:
        """The lead pulls gradient requests (`at_most` of them: None, any); each takes
        ceil(micro-batches / crew) parts' time, every member computing whole micro-batches as the
        live crew does (`rollout_worker.shares`)."""
        lead = workers[0]
        g: Group = lead.handle
        g.kinds, g.version, g.crew, g.left = _GRADIENT, version, list(workers), at_most
        for w in workers[1:]:
            w.handle.lead = lead.name
        if self._pull(lead):
            return True
        self._disband(g)
        return False

    def notify(self, worker: Worker, notice: PreemptionNotice) -> None:
        g: Group = worker.handle
        self.queue.notify(worker.name, notice)
        g.retiring = True
        if g.lease is not None and g.lease.kind is not Kind.TRAIN:  # a micro-batch started is finished
            reached = self._reached(g)
            if reached + 1 < self.st.denoise_steps:
                self._push(g.start + (reached - g.lease.step + 1) * g.step_s, _GIVEBACK, (worker.name, g.gen))

    def stop(self, worker: Worker, lost: bool) -> None:
        g: Group = worker.handle
        if lost and g.lease is not None:
            # What the live worker would have reported before it died: the step it reached by
            # heartbeat, its last commit by checkpoint. The engine then re-queues the request.
            reached = self._reached(g)
            committed = g.lease.step + (reached - g.lease.step) // self.commit_every * self.commit_every
            self.queue.heartbeat(worker.name, {g.lease.id: reached})
            if committed > g.lease.step and self.elastic:  # a restarted job keeps no partial work
                self.queue.checkpoint(worker.name, g.lease.id, None, committed)
        g.gen += 1
        self._unlease(worker)
        self._disband(g)
        g.lead = None
        self._drop(worker)

    def _unlease(self, w: Worker) -> None:
        """`w` holds its request no more."""
        g: Group = w.handle
        if g.lease is not None:
            self._leasing[g.lease.kind].pop(w.name, None)
            g.lease = None

    def _disband(self, g: Group) -> None:
        """`g` leads no crew any more: its members are free."""
        for w in g.crew[1:]:
            w.handle.lead = None
        g.crew = []

    def _served(self, w: Worker) -> None:
        """`w` stopped serving: it, and its crew where it leads one, are idle (the engine hears)."""
        g: Group = w.handle
        if g.crew:
            self.out.extend(Served(m.name) for m in g.crew if m.name in self.workers)
            self._disband(g)
        elif w.name in self.workers:
            self.out.append(Served(w.name))
        g.left = None

    def changed(self, nodes: Collection[Node]) -> None:
        for n in nodes:
            members = self.node_members.get(n.name, ())
            if not n.alive:
                self.live_spot.discard(n.name)
                for m in members:
                    self.alive.pop(m, None)
                    self.noticed.discard(m)
            elif n.noticed:
                self.noticed.update(members)
        if self.elastic:
            self._regroup({n.name for n in nodes if n.spot})

    def cancelled(self, kind: Kind) -> None:
        """Requests of `kind` in flight are dropped at once (live: at the next step boundary, <= 1 step later)."""
        for name in list(self._leasing[kind]):
            w = self.workers.get(name)
            if w is None:  # dropped with its lease (a restart's regroup): nothing to tell
                self._leasing[kind].pop(name, None)
                continue
            w.handle.gen += 1
            self._unlease(w)
            self.out.append(Served(name))

    def wait(self, until: float | None, pending: Any = ()) -> list[Any]:
        """Handle events before `until` (strictly: what the engine has due at `until` — a trace
        action, the end of a phase — comes first) or due now, until one has something to report
        (a request ending only makes its worker pull the next one, which the engine need not
        hear of); else move the clock to `until`."""
        heap, clock = self.heap, self.clock
        while not self.out:
            if heap and (until is None or heap[0][0] < until or heap[0][0] <= clock.now()):
                t, _, code, data = heapq.heappop(heap)
                clock.advance(max(0.0, t - clock.now()))
                self._handle(code, data)
            elif until is not None:
                clock.advance(max(0.0, until - clock.now()))
                break
            else:
                raise RuntimeError("the simulation has nothing left to happen but the phase is not done")
        # What else happens at this same instant comes in the same report while nothing is queued:
        # then the engine could dispatch nothing in between, so the order is the same (a fleet of
        # thousands ends a wave of requests together: one turn of the engine instead of one each).
        now = clock.now()
        if heap and heap[0][0] <= now and not self.queue.queued():  # (a completion queues nothing)
            while heap and heap[0][0] <= now and heap[0][2] == _DONE:
                _, _, code, data = heapq.heappop(heap)
                self._handle(code, data)
        out, self.out = self.out, []
        return out

    # ---- modelled compute -------------------------------------------------------------------------

    def _push(self, t: float, code: int, data: Any) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, self._seq, code, data))

    def _pull(self, worker: Worker) -> bool:
        g: Group = worker.handle
        leases = self.queue.pull(worker.name, 1, g.kinds, g.version)
        if not leases:
            return False
        r = leases[0].request
        g.lease, g.start, g.gen = r, self.clock.now(), g.gen + 1
        self._leasing[r.kind][worker.name] = None
        st = self.st
        slow = 1.0
        if st.host_cores:  # CPU devices sharing the host's cores (`StepTimes.host_cores`; 0 on GPUs: skipped)
            # Busy while the request runs: the devices holding one (not those whose request ends now:
            # a wave's last requests end together, and the one pulled after them runs alone) and
            # one per request still queued, at most every live device. O(workers + events): CPU
            # fleets are a few devices.
            now = self.clock.now()
            ending = {data[0] for t, _, code, data in self.heap if code == _DONE and t <= now}
            live = [w for w in self.workers.values() if not w.handle.retiring]
            busy = sum(len(w.handle.crew) or len(w.handle.members) for w in live
                       if w.handle.lease is not None and w.name not in ending)
            slow = st.slowdown(min(sum(len(w.handle.members) for w in live), busy + self.queue.queued(g.kinds)))
        if r.kind is Kind.TRAIN:  # a chunk of the update: `work.count` micro-batches of `work.data` GPU-seconds
            g.step_s = 0.0
            part_s = r.work.data / st.fleet_update_efficiency  # an executor, on-demand or spot alike
            g.busy_s = r.work.count * part_s
            compute = -(-r.work.count // max(1, len(g.crew))) * part_s
            self._push(g.start + (compute + st.train_request_overhead_s) * slow, _DONE, (worker.name, g.gen))
            return True
        # A step is its compute, the worker's heartbeat and its share of the commits (one every
        # `commit_every` steps, none after the last: the difference is settled at the end, with the
        # pull and the completion; `StepTimes` overheads), so a notice is heeded at the step the
        # live worker reaches.
        g.step_s = (len(r.seeds) * g.step_s_per_sample + st.step_overhead_s
                    + st.commit_overhead_s / self.commit_every) * slow
        g.busy_s = len(r.seeds) * (st.denoise_steps * g.step_s_per_sample + st.reward_s_per_sample)
        steps = st.denoise_steps - r.step
        commits = (st.denoise_steps - 1) // self.commit_every - r.step // self.commit_every
        end = g.start + steps * g.step_s + (len(r.seeds) * st.reward_s_per_sample + st.request_overhead_s
                                            + (commits - steps / self.commit_every) * st.commit_overhead_s) * slow
        self._push(end, _DONE, (worker.name, g.gen))
        return True

    def _reached(self, g: Group) -> int:
        done = int((self.clock.now() - g.start) / g.step_s + 1e-9) if g.step_s > 0 else 0
        return min(self.st.denoise_steps, g.lease.step + done)

    def _handle(self, code: int, data: Any) -> None:
        if code == _DONE:
            self._done(*data)
        elif code == _GIVEBACK:
            self._give_back(*data)
        elif code == _READY:
            w = self.workers.get(data)
            if w is not None:
                self.out.append(Ready(w))
        elif code == _NODE:
            if self.generation.get(data[0]) == data[1]:
                self._node_ready(data[0])

    def _done(self, name: str, gen: int) -> None:
        w = self.workers.get(name)
        if w is None or w.handle.gen != gen or w.handle.lease is None:
            return
        g: Group = w.handle
        r = g.lease
        if self.queue.complete(name, r.id, None):
            self.busy_gpu_s += len(g.members) * g.busy_s if r.kind is not Kind.TRAIN else g.busy_s
            if self.on_done is not None:
                self.on_done(w, r)
        self._unlease(w)
        if g.left is not None:
            g.left -= 1
        # A live worker pulls on until the queue has nothing for it (the count spares a failed pull).
        if g.retiring or g.left == 0 or not self.queue.queued(g.kinds) or not self._pull(w):
            self._served(w)

    def _give_back(self, name: str, gen: int) -> None:
        w = self.workers.get(name)
        if w is None or w.handle.gen != gen or w.handle.lease is None:
            return
        g: Group = w.handle
        reached = self._reached(g)
        self.queue.heartbeat(name, {g.lease.id: reached})
        self.queue.give_back(name, g.lease.id, None, reached)
        self._unlease(w)
        self.out.append(Served(name, noticed=True))

    # ---- devices and groups -----------------------------------------------------------------------

    def _node_ready(self, node: str) -> None:
        if node not in self.live_spot:
            return  # gone before its devices were up
        for j, m in enumerate(self.node_members[node]):
            self.alive[m] = f"{node}/{j // self.st.gpus_per_node}"
        if self.elastic:
            self._regroup({node})
        else:
            self._static_groups()

    def restart_groups(self, ondemand: Node) -> None:
        """After a restart (not elastic): every live node's devices serve, grouped afresh."""
        for node in self.live_spot:
            for j, m in enumerate(self.node_members[node]):
                self.alive[m] = f"{node}/{j // self.st.gpus_per_node}"
        self.start(ondemand, False)  # its groups report Ready at once
        self._static_groups()

    def _static_groups(self) -> None:
        """The restart baseline's cluster: spot groups planned once over the spot devices live now."""
        for w in [w for w in self.workers.values() if w.spot]:
            w.handle.gen += 1
            self._drop(w)
            self.out.append(Dissolved(w.name))
        plan = regroup([], set(), self.alive, self.seq, self.st.heads, self.model, self.pending_per_iteration)
        for members in plan.form:
            self._new_worker(members, True, self.clock.now())

    def _new_worker(self, members: list[str], spot: bool, ready_at: float) -> Worker:
        self._wid += 1
        g = Group(list(members), self.st.denoise_s(self.resolution, len(members)))
        w = Worker(f"w{self._wid}", tuple(dict.fromkeys(m.split("#", 1)[0] for m in members)), spot, handle=g)
        self.workers[w.name] = w
        for m in members:
            self.member_worker[m] = w.name
        if ready_at > self.clock.now():
            self._push(ready_at, _READY, w.name)
        else:
            self.out.append(Ready(w))
        return w

    def _drop(self, w: Worker) -> None:
        self.workers.pop(w.name, None)
        for m in w.handle.members:
            if self.member_worker.get(m) == w.name:
                del self.member_worker[m]

    def _regroup(self, nodes: set[str]) -> None:
        """Re-plan the SP groups of the spot members on `nodes` (where membership just changed)
        with the live regroup policy. Only those nodes' groups and free members are passed: the
        policy's placement is quadratic in the groups it sees, and a change on one node leaves
        groups elsewhere alone anyway (it never touches a busy intact group, and re-planning idle
        groups far away would only pay their regroup again)."""
        if not nodes:
            return
        names = {self.member_worker[m] for n in nodes for m in self.node_members.get(n, ()) if m in self.member_worker}
        spot = [self.workers[x] for x in sorted(names, key=lambda x: int(x[1:])) if not self.workers[x].handle.retiring]
        members = [m for w in spot for m in w.handle.members]
        members += [m for n in sorted(nodes) for m in self.node_members.get(n, ())
                    if m in self.alive and m not in self.member_worker and m not in self.noticed]
        alive = {m: self.alive[m] for m in members if m in self.alive and m not in self.noticed}
        busy = {i for i, w in enumerate(spot) if w.handle.lease is not None or w.handle.crew or w.handle.lead}
        # The work the groups will serve: their share of what is queued, and never less than their
        # share of one iteration's rollout (a regroup during the train phase plans for the rollout
        # that follows; with pending = 1 the policy would rightly pick the widest group for a lone
        # request).
        devices = self.ondemand_devices + sum(len(self.node_members[n]) for n in self.live_spot)
        share = len(alive) / max(1, devices)
        pending = max(1, round(max(self.queue.queued(), self.pending_per_iteration) * share))
        plan = regroup([w.handle.members for w in spot], busy, alive, self.seq, self.st.heads, self.model, pending)
        keep = {tuple(g) for g in plan.keep}
        for w in spot:
            if tuple(w.handle.members) not in keep:
                assert w.handle.lease is None, "the regroup policy never breaks a busy intact group"
                w.handle.gen += 1
                self._drop(w)
                self.out.append(Dissolved(w.name))
        if plan.form:
            self.regroups += 1
        setup = self.st.regroup_s if self.clock.now() > 0 else 0.0  # the fleet at t = 0 is up and grouped
        for members in plan.form:
            self._new_worker(members, True, self.clock.now() + setup)


def requests_of(iteration: int, prompts: int, group_size: int, size: int, attempt: int = 0) -> list[Request]:
    """Iteration `iteration`'s rollout requests: `size` samples of one prompt each."""
    return [Request(f"it{iteration}.{attempt}/p{p}/s{s}", Kind.ROLLOUT, p, "", tuple(range(s, min(s + size, group_size))),
                    weight_version=iteration)
            for p in range(prompts) for s in range(0, group_size, size)]


def request_size(peak_devices: int, prompts: int, group_size: int, seq: int, st: StepTimes, resolution: int) -> int:
    """Samples per request: the group, halved while there are fewer requests than 6x the SP groups
    at the fleet's peak (so the pull queue can balance: the last round's tail is then <= 1/6)."""
    groups = len(plan_degrees(peak_devices, seq, st.heads, st.step_model(resolution), pending=prompts))
    size = group_size
    while size > 1 and prompts * math.ceil(group_size / size) < 6 * groups:
        size = math.ceil(size / 2)
    return size
