"""The fleet engine: the one place the orchestration of a spot fleet is written.

It owns the fleet — nodes (spot or on-demand) and the workers an executor runs on them — and what
happens to it: a node gets a preemption notice, dies, joins (from a replayed trace, a notice
watcher, or the cluster); and it runs the phases of an iteration over the pull queue: a rollout,
critical-path exploration, and a train phase in which idle spot workers explore the next
iteration's seeds until the new weights are published. It takes a `Clock` and an `Executor` — the
thing that computes requests — so the live runtimes (in-process, Ray actors, elastic SP groups)
and the simulator (a modelled executor on a `ManualClock`) run this same code.

What the engine does, and only here:
- dispatch: every idle worker allowed in the phase is told to serve the phase's request kinds at
  the weight version it holds (workers then pull; `schedulers.queue.PullQueue` balances). The
  update's gradient work (`Kind.TRAIN`) is served by nodes, not single workers: a node's idle
  workers, at most the update's `per_request` of them, form a *crew* (`Executor.serve_crew`) whose
  lead pulls each request and whose members compute its micro-batches together; the lead sends the
  one gradient. Nothing else is served by a crew, and a worker serving other kinds pulls no
  exploration while gradient work waits (the queue's rule), so it comes back to join its node's crew;
- a notice on a node: every worker touching the node is told (it gives its request back at the
  next step boundary and pulls nothing more), counted once per node in `notices`;
- a node's death: its workers are lost, their requests re-queued from the last commit
  (`PullQueue.worker_lost`); a death without a notice first counts in `workers_lost`;
- a worker that dies by itself (the executor reports it): the same, as a death without notice;
- a node that joins: the executor starts workers on it, which pull as soon as they are ready;
- a planned release (`release`: the run gives a spot node back because it no longer pays): its
  workers retire as on a notice, and it is neither a notice nor a preemption (`releases` counts it);
  the node stays on offer and `rent` takes it again, paying a join as any joining node;
- no capacity left and none coming back: one clear error instead of a hang.

What an executor does (`Executor`): start workers on a node's devices, make an idle worker serve,
tell it of a notice, end it, and wait for what happens (a worker ready, done serving, dead). How a
worker computes — a `RolloutWorker` in this process or in a Ray actor, an SP group, a model of
step times — is the executor's business; so is grouping devices into SP groups.

Time: actions are due on the *replay clock*, which runs `speedup` times faster than the engine's
clock, and only during the phases named in `replay_phases` (a live replay runs the trace only while
rolling out, when a preemption costs something; the simulator runs it always).

Invariants (tests/schedulers/test_fleet_contract.py runs one scenario through every executor):
- a request is computed by at most one live worker at a time, and committed exactly once (the
  queue's invariants; the engine never completes anything itself);
- every worker the engine registered is in exactly one phase (`WorkerPhase`);
- the counters (`notices`, `kills`, `workers_lost`) and the queue's are the same for every executor
  given the same scenario where compute does not enter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from schedulers.clock import Clock
from schedulers.preemption import Cause, PreemptionNotice
from schedulers.request import Kind, Request

# ---- what the engine keeps ----------------------------------------------------------------------


class WorkerPhase(Enum):
    """A worker's life. Transitions (anything else is impossible):

    ==========  =======================================================  ==========
    from        event                                                    to
    ==========  =======================================================  ==========
    (start)     the executor starts it                                   STARTING
    STARTING    `Ready`                                                  IDLE
    IDLE        dispatch (`Executor.serve`)                              SERVING
    SERVING     `Served` (the queue had nothing more for it)             IDLE
    any         a notice on its node, once it holds no request           (retired)
    any         its node dies, or `Died`                                 (lost)
    IDLE        the executor dissolves it (`Dissolved`: SP regrouping)   (gone)
    ==========  =======================================================  ==========
    """

    STARTING = "starting"
    IDLE = "idle"
    SERVING = "serving"


@dataclass
class Worker:
    """One puller of requests: a Ray actor, an SP group, an in-process worker, a modelled group."""

    name: str
    """Unique over the engine's life (a restarted worker gets a new name, so a zombie's late
    commits are refused by the queue)."""
    nodes: tuple[str, ...]
    """The nodes whose devices it runs on (more than one only for an SP group across nodes)."""
    spot: bool
    phase: WorkerPhase = WorkerPhase.STARTING
    noticed: bool = False
    handle: Any = None
    """The executor's own data for this worker (an actor, a group, a modelled state)."""


@dataclass
class Node:
    name: str
    spot: bool
    devices: int = 1
    alive: bool = True
    noticed: bool = False
    generation: int = 0
    """How many times the node has joined: worker names carry it."""
    cluster_id: str | None = None
    """The cluster's own id for the node (a Ray node id), where the fleet follows a real cluster;
    None for a fleet replayed on one machine or modelled."""
    released: bool = False
    """On offer but not rented: the run released it (`FleetEngine.release`) or declined it when it
    joined (`FleetEngine.admit`). Not alive; `rent` takes it; a notice or a death withdraws the offer."""


def fleet_nodes(ondemand: int, spot: int, devices: int = 1) -> list[Node]:
    """`ondemand` on-demand nodes `ondemand0..` and `spot` spot nodes `spot0..`, `devices` each."""
    return ([Node(f"ondemand{i}", spot=False, devices=devices) for i in range(ondemand)]
            + [Node(f"spot{i}", spot=True, devices=devices) for i in range(spot)])


@dataclass(frozen=True)
class FleetAction:
    """Something that happens to a node at replay-clock time `at_s`: "notice", "kill" or "add"."""

    at_s: float
    node: str
    action: str


# ---- what executors report ----------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    worker: Worker


@dataclass(frozen=True)
class Served:
    """The worker stopped serving: the queue had nothing for it, or it stopped on a notice —
    `noticed` when the worker saw one the engine did not send (its own notice watcher)."""

    worker: str
    noticed: bool = False


@dataclass(frozen=True)
class Died:
    """The worker died by itself (its process or node is gone): a death without notice. `nodes`:
    the nodes that went with it (they count as gone until they join again)."""

    worker: str
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Dissolved:
    """The executor ended an idle worker to regroup its devices (elastic SP)."""

    worker: str


Event = Ready | Served | Died | Dissolved


class Pending(Protocol):
    """Something the engine waits on besides the workers: the learner's update. One the fleet
    computes (`schedulers.update.FleetUpdate`) also names the request kinds its workers serve for
    it (`kinds`); `done()` may move it on (put its next round)."""

    def done(self) -> bool: ...

    @property
    def deadline(self) -> float | None:
        """Engine-clock time it is done at, when known (a modelled update), else None."""
        ...


class Executor(Protocol):
    """Computes requests on the fleet's devices (see the module docstring)."""

    def start(self, node: Node, spot: bool) -> list[Worker]:
        """Start workers on `node`'s devices; they report `Ready` when they can pull. An SP
        executor may instead re-plan its groups and report new workers as `Ready` later."""
        ...

    def serve(self, worker: Worker, kinds: Collection[Kind], version: int) -> bool:
        """Make idle `worker` pull and compute requests of `kinds` (never `Kind.TRAIN`: see
        `serve_crew`) at weight `version` until the queue has nothing for it (then `Served`) or it is
        told of a notice. False when it found nothing to pull at once (it stays idle; no `Served`
        follows): the engine then stops dispatching, as every idle worker would find the same nothing."""
        ...

    def serve_crew(self, workers: Sequence[Worker], version: int, at_most: int | None = None) -> bool:
        """Make idle `workers` — of one node, the first the lead — a crew that pulls `Kind.TRAIN`
        requests at weight `version` until the queue has none for it, or it has completed `at_most`
        (None: no limit), or the lead is told of a notice (then `Served` for each): the lead pulls a
        request, every member computes a share of its micro-batches, the lead folds them in
        micro-batch order and completes it with one gradient. False when it found nothing to pull
        at once (they stay idle; no `Served` follows). An executor whose workers cannot compute
        gradients (SP groups) raises."""
        ...

    def changed(self, nodes: Collection[Node]) -> None:
        """The engine has applied a notice, death or join to every worker of `nodes`: an SP
        executor re-plans its groups there (nothing to do for one worker per node)."""
        ...

    def cancelled(self, kind: Kind) -> None:
        """Every open request of `kind` was just cancelled: a worker computing one drops it at its
        next step boundary (live workers learn it from their heartbeat)."""
        ...

    def notify(self, worker: Worker, notice: PreemptionNotice) -> None:
        """`worker` gives back what it holds at the next step boundary and pulls nothing more."""
        ...

    def stop(self, worker: Worker, lost: bool) -> None:
        """End `worker`: `lost` when its node died under it (the engine re-queues its requests),
        else retired (noticed and idle) or dissolved."""
        ...

    def wait(self, until: float | None, pending: Sequence[Pending] = ()) -> list[Event]:
        """Block until something happens to a worker, a `pending` is done, or the clock reaches
        `until` (None: no bound); return what happened."""
        ...


class Queue(Protocol):
    """What the engine asks of the pull queue (`PullQueue`, or a client of its Ray actor)."""

    def put(self, requests: Iterable[Request]) -> None: ...

    def open(self, kind: Kind) -> int: ...

    def queued(self, kinds: Collection[Kind] | None = None) -> int: ...

    def worker_lost(self, worker: str) -> list[str]: ...

    def cancel(self, kind: Kind) -> int: ...

    def committed(self, ids: Iterable[str]) -> tuple[dict[str, Any], dict[str, tuple[int, Any]]]: ...

    def completed(self, ids: Iterable[str]) -> list[str]: ...


class Session(Protocol):
    """One phase's exploration rounds (`spotlight.iteration.exploration.ExplorationSession`)."""

    critical_path: bool
    samples: int
    cancelled: int
    budget: int

    @property
    def time_bounded(self) -> bool: ...

    def begin(self, estimated_samples: int | None = None) -> None: ...

    def next_requests(self) -> list[Request]: ...

    def record(self, requests: list[Request], rewards: Any) -> None: ...


class FleetSource(Protocol):
    """What tells the engine, while it runs, that the fleet changed — a live cluster's own view of
    its nodes (`spotlight.runtime.ray_fleet.ClusterFleet`). Polled once per turn of the loop (it
    rate-limits itself); it applies what happened with `FleetEngine.notice` / `kill` / `add`."""

    def poll(self, engine: "FleetEngine") -> None: ...

    def capacity_may_come(self) -> bool:
        """True while a node may still join: the engine waits for capacity instead of giving up."""
        ...


class NoCapacity(RuntimeError):
    """Every worker is gone and no capacity is coming back."""


class ExplorationRate:
    """What the engine measured of its last train phases, to size a `train_time` budget: the
    update's seconds and the exploration samples scored per second by the idle workers together."""

    def __init__(self) -> None:
        self.update_s: float | None = None
        self.samples_per_s: float | None = None

    def estimate(self) -> int | None:
        """Samples the idle workers should score during the next update (None: not measured yet)."""
        if self.update_s is None or not self.samples_per_s:
            return None
        return max(1, math.floor(self.update_s * self.samples_per_s))

    def explored(self, samples: int, seconds: float) -> None:
        if samples > 0 and seconds > 0:
            self.samples_per_s = samples / seconds


_GRADIENT = (Kind.TRAIN,)


def crew_size(update: Pending | None) -> int:
    """The most workers of a node that compute one request of `update` together: its requests'
    micro-batches (`schedulers.update.FleetUpdate.per_request`); 1 for an update the fleet does not
    compute."""
    return getattr(update, "per_request", 1)


def exploration_stats(session: Session, seconds: float) -> dict[str, float]:
    """The exploration part of an update's stats (metrics.jsonl)."""
    return {"explored_samples": session.samples, "explore_cancelled": session.cancelled,
            "explore_budget": session.budget, "time_explore_s": seconds}


# ---- the engine ---------------------------------------------------------------------------------


class ReplayClock:
    """Trace time: `speedup` x the engine clock's seconds, counted only while running."""

    def __init__(self, clock: Clock, speedup: float = 1.0) -> None:
        self.clock, self.speedup = clock, speedup
        self._banked = 0.0
        self._since: float | None = None

    def now(self) -> float:
        running = self.clock.now() - self._since if self._since is not None else 0.0
        return (self._banked + running) * self.speedup

    def run(self) -> None:
        if self._since is None:
            self._since = self.clock.now()

    def pause(self) -> None:
        if self._since is not None:
            self._banked += self.clock.now() - self._since
            self._since = None

    def engine_time(self, replay_s: float) -> float | None:
        """Engine-clock time at which replay time `replay_s` is reached if it keeps running."""
        if self._since is None:
            return None
        return self._since + replay_s / self.speedup - self._banked


def partial_crew_pays(size: int, per_request: int, waiting: int, full: int) -> bool:
    """Whether a crew of `size` < `per_request` GPUs should take one of `waiting` gradient requests
    while `full` crews of `per_request` GPUs could: it computes one in ceil(per_request / size)
    request times, the full crews clear the waiting ones in ceil(waiting / full) — it takes one
    only where that is no later (a crew of one GPU taking a round's last request from eight-GPU
    crews made the round ~60% longer in the simulator: tests/spotlight/runtime/test_node_crews.py). Where no full
    crew exists, every crew takes what it can. The engine's rule, and the simulator's pricing of
    a round (`spotlight.sim.crews`)."""
    return full == 0 or -(-waiting // full) >= -(-per_request // size)


class FleetEngine:
    """See the module docstring. Cheap to construct; `start()` brings the first fleet up."""

    def __init__(self, clock: Clock, queue: Queue, executor: Executor, nodes: Sequence[Node],
                 actions: Sequence[FleetAction] = (), speedup: float = 1.0,
                 replay_phases: Collection[str] = ("rollout",), spot_devices: int = 1,
                 poll_s: float | None = None, on_fleet: Callable[[], None] | None = None) -> None:
        self.clock, self.queue, self.executor = clock, queue, executor
        self.nodes: dict[str, Node] = {n.name: n for n in nodes}
        self.spot_devices_per_node = spot_devices
        """Devices of a spot node that first appears in `actions` (a trace node)."""
        self.actions = sorted(actions, key=lambda a: a.at_s)
        self._next_action = 0
        self.replay = ReplayClock(clock, speedup)
        self.replay_phases = frozenset(replay_phases)
        self.poll_s = poll_s
        """Longest single wait (None: until the next event); a live executor polls its queue."""
        self.workers: dict[str, Worker] = {}
        self._idle: dict[bool, dict[str, None]] = {False: {}, True: {}}
        """Idle workers, on-demand (False) and spot (True), in the order they became idle."""
        self.counters = {"notices": 0, "kills": 0, "workers_lost": 0}
        self.rate = ExplorationRate()
        self.on_fleet = on_fleet
        """Called after the live fleet changed (the cost meter follows it); None: nobody is told."""
        self.spot_allowed = True
        """False once the run fell back to on-demand (`use_ondemand`): no spot node joins again."""
        self.sources: list[FleetSource] = []
        """Live sources of notices, deaths and joins besides the replayed `actions`."""
        self.on_kill: Callable[[str], None] | None = None
        """Called when a node died, after its workers were lost, before the executor re-plans
        (a restart-from-checkpoint baseline restarts the whole job here)."""
        self.admit: Callable[[Node], bool] | None = None
        """Asked when a spot node joins by `add`: False leaves it on offer, not rented (`Node.released`);
        None rents every node (a renting rule: `spotlight.sim.rental`)."""
        self.releases = 0
        """Nodes the run released (`release`): planned, so not in `counters` with the preemptions."""

    # ---- the fleet ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start workers on every node — and the nodes a replayed trace has at its start — and
        wait until each is ready or gone (a spot node may vanish while starting: that is a worker
        lost, not a failed run), so the first phase starts with the whole first fleet."""
        for node in list(self.nodes.values()):
            self._join(node)
        self._apply_due()
        while True:
            self.poll_sources()
            starting = any(w.phase is WorkerPhase.STARTING for w in self.workers.values())
            # With live sources, wake up now and then to hear of a node that died while starting.
            until = (self.clock.now() + 1.0 if self.sources else None) if starting else self.clock.now()
            events = self.executor.wait(until)
            if not events and not starting:
                return
            self._handle(events)

    def settle(self) -> None:
        """Take in what the executor reports now (workers it just started), without waiting."""
        self._handle(self.executor.wait(self.clock.now()))

    def spot_devices(self) -> int:
        return sum(n.devices for n in self.nodes.values() if n.spot and n.alive)

    def _join(self, node: Node) -> None:
        node.alive, node.noticed = True, False
        node.generation += 1
        for w in self.executor.start(node, node.spot):
            self.workers[w.name] = w
        if self.on_fleet is not None:
            self.on_fleet()

    def schedule(self, action: FleetAction) -> None:
        """Add an action to the replay while the run goes on (one decided from what the run has
        done so far: a benchmark killing a node in the middle of a chosen update). Its time must
        not be before the replay clock's now: the past is not replayed."""
        if action.at_s < self.replay.now():
            raise ValueError(f"action at replay time {action.at_s:g} s is in the past (now {self.replay.now():g} s)")
        i = self._next_action
        while i < len(self.actions) and self.actions[i].at_s <= action.at_s:
            i += 1
        self.actions.insert(i, action)

    def _apply_due(self) -> None:
        """Apply every action whose replay time has come (by the replay clock, or by the engine
        time `_next_due` promised: the two agree up to rounding, and a wait bounded by the latter
        must find its action applied)."""
        while self._next_action < len(self.actions) and (
                self.actions[self._next_action].at_s <= self.replay.now()
                or (due := self._next_due()) is not None and self.clock.now() >= due):
            a = self.actions[self._next_action]
            self._next_action += 1
            node = self.nodes.get(a.node)
            if node is not None and node.released and a.action in ("notice", "kill"):
                node.released = False  # the provider takes back a node the run does not hold: no preemption
            elif a.action == "notice" and node is not None and node.alive and not node.noticed:
                self.notice(node.name, PreemptionNotice(Cause.TRACE, None, node.name))
            elif a.action == "kill" and node is not None and node.alive:
                self.kill(node.name)
            elif a.action == "add":
                self.add(a.node)

    def add(self, node: str, spot: bool = True, devices: int | None = None, cluster_id: str | None = None) -> None:
        """`node` joins (a replayed trace's add, the cluster reporting a new node); a node seen
        before joins again with its own kind and size. Nothing happens to a node that is alive."""
        n = self.nodes.get(node)
        if n is None:
            n = self.nodes[node] = Node(node, spot=spot, alive=False, cluster_id=cluster_id,
                                        devices=self.spot_devices_per_node if devices is None else devices)
        if not n.alive:
            if n.spot and self.admit is not None and not self.admit(n):
                n.released = True
                return
            n.released = False
            self._join(n)

    def release(self, node: str) -> None:
        """Give live spot node `node` back (its work no longer pays for it): planned, so it counts in
        `releases`, not as a notice or a kill; its workers retire at once and it is paid no more
        (`spot_devices` leaves it out). Meant for between phases, when no worker holds a request (the
        simulator releases before an iteration); a worker that still holds one is ended as
        `use_ondemand` ends one: its request goes back to the queue at its last commit. The node
        stays on offer (`Node.released`) until a notice or a death withdraws it.
        (tests/schedulers/test_fleet_release.py)"""
        n = self.nodes[node]
        if not (n.spot and n.alive):
            raise ValueError(f"release: {node} is not a live spot node")
        self.releases += 1
        n.alive, n.noticed, n.released = False, False, True
        if self.on_fleet is not None:
            self.on_fleet()
        hit = self._on(node)
        for w in hit:
            self._remove(w)
            self.executor.stop(w, lost=w.phase is WorkerPhase.SERVING)
            if w.phase is WorkerPhase.SERVING:
                self.queue.worker_lost(w.name)
        self._changed(self._affected(node, hit))

    def rent(self, node: str) -> None:
        """Take node `node`, on offer (`Node.released`), again: it joins as a new node does (an
        executor's join time before it serves), paid from now."""
        n = self.nodes[node]
        if not n.released:
            raise ValueError(f"rent: {node} is not on offer")
        n.released = False
        self._join(n)

    def restart(self, node: str) -> None:
        """`node` lives on though a worker of it died (the engine counted the node gone then): end
        its other workers as lost and join it again with fresh ones (a live cluster's source calls
        this once the cluster has reported the node alive for a while after the death)."""
        for w in self._on(node):
            self._remove(w)
            self.executor.stop(w, lost=True)
            self.queue.worker_lost(w.name)
        self.nodes[node].alive = False
        self._join(self.nodes[node])

    def notice(self, node: str, notice: PreemptionNotice) -> None:
        """`node` will go away: its workers give back at the next step boundary and pull no more."""
        n = self.nodes[node]
        n.noticed = True
        self.counters["notices"] += 1
        hit = self._on(node)
        for w in hit:  # all told first: a regroup must not see a half-noticed group as intact
            if not w.noticed:
                w.noticed = True
                self.executor.notify(w, notice)
        for w in hit:
            if w.phase is not WorkerPhase.SERVING:  # holds nothing: retire it now
                self._remove(w)
                self.executor.stop(w, lost=False)
        self._changed(self._affected(node, hit))

    def kill(self, node: str) -> None:
        """`node` is gone: its workers' requests go back to the queue at their last commit."""
        n = self.nodes[node]
        self.counters["kills"] += 1
        if not n.noticed:
            self.counters["workers_lost"] += 1
        n.alive = False
        if self.on_fleet is not None:
            self.on_fleet()
        hit = self._on(node)
        for w in hit:
            self._remove(w)
            self.executor.stop(w, lost=True)
            self.queue.worker_lost(w.name)
        if self.on_kill is not None:
            self.on_kill(node)
        self._changed(self._affected(node, hit))

    def reset(self) -> list[Worker]:
        """End every worker at once, as a job torn down for a restart: they are stopped as lost and
        returned; what they leased is the caller's to account for (`PullQueue.worker_lost`)."""
        gone = list(self.workers.values())
        for w in gone:
            self._remove(w)
            self.executor.stop(w, lost=True)
        return gone

    def _changed(self, names: Iterable[str]) -> None:
        self.executor.changed([self.nodes[n] for n in names if n in self.nodes])

    @staticmethod
    def _affected(node: str, hit: list[Worker]) -> list[str]:
        """`node` and every node a worker of it spans (its other members may regroup), in order."""
        seen = dict.fromkeys([node])
        for w in hit:
            seen.update(dict.fromkeys(w.nodes))
        return list(seen)

    def _on(self, node: str) -> list[Worker]:
        return [w for w in self.workers.values() if node in w.nodes]

    def _remove(self, w: Worker) -> None:
        self.workers.pop(w.name, None)
        self._idle[w.spot].pop(w.name, None)

    def _handle(self, events: list[Event]) -> None:
        for ev in events:
            if isinstance(ev, Ready):
                w = ev.worker
                self.workers[w.name] = w
                w.phase = WorkerPhase.IDLE
                self._idle[w.spot][w.name] = None
                continue
            w = self.workers.get(ev.worker)
            if w is None:
                continue  # already retired or lost: a late report
            if isinstance(ev, Served):
                w.noticed = w.noticed or ev.noticed
                if w.noticed:
                    self._remove(w)
                    self.executor.stop(w, lost=False)
                    self._changed(w.nodes)
                else:
                    w.phase = WorkerPhase.IDLE
                    self._idle[w.spot][w.name] = None
            elif isinstance(ev, Died):
                self._remove(w)
                if not w.noticed:
                    self.counters["workers_lost"] += 1
                self.queue.worker_lost(w.name)
                for name in ev.nodes:  # a node's death learned from its worker's: one of `kills` too
                    self.counters["kills"] += self.nodes[name].alive
                    self.nodes[name].alive = False
                if ev.nodes and self.on_fleet is not None:
                    self.on_fleet()
                self._changed(w.nodes)
            elif isinstance(ev, Dissolved):
                self._remove(w)

    def use_ondemand(self) -> None:
        """Fall back from spot (between phases): the replay stops, and every spot node, live or
        preempted, is replaced by an on-demand node (`ondemandK`, numbered on from the existing
        ones) with fresh workers. A live spot worker is retired, not lost: nothing is in flight
        between phases (whatever it might still lease goes back to the queue all the same)."""
        self.actions = self.actions[:self._next_action]
        self.spot_allowed = False
        index = sum(not n.spot for n in self.nodes.values())
        for n in [n for n in self.nodes.values() if n.spot]:
            for w in self._on(n.name):
                self._remove(w)
                self.executor.stop(w, lost=True)
                self.queue.worker_lost(w.name)
            del self.nodes[n.name]
            node = self.nodes[f"ondemand{index}"] = Node(f"ondemand{index}", spot=False, devices=n.devices)
            index += 1
            self._join(node)
        while any(w.phase is WorkerPhase.STARTING for w in self.workers.values()):
            self._handle(self.executor.wait(None))

    def before_iteration(self, cost: Any, step: int, total: int) -> Any:
        """The cost control's question before iteration `step` of `total` (`cloud.cost.CostControl`:
        a budget or a deadline may stop the run first); when it asks for a switch, every spot node
        is replaced by an on-demand one (`use_ondemand`) and the meter is told. Returns its Decision."""
        decision = cost.before_iteration(step, total)
        if decision.stop is None and decision.switch:
            self.use_ondemand()
            cost.switched(step)
        return decision

    # ---- the loop -------------------------------------------------------------------------------

    def _more_capacity_coming(self) -> bool:
        return (any(a.action == "add" for a in self.actions[self._next_action:])
                or any(s.capacity_may_come() for s in self.sources))

    def poll_sources(self) -> None:
        for source in self.sources:
            source.poll(self)

    def _dispatch(self, kinds: Collection[Kind], ondemand_kinds: Collection[Kind], version: int,
                  crew_size: int = 1) -> None:
        """Every idle worker (on-demand ones first) serves its kinds — `kinds` on a spot worker,
        `ondemand_kinds` on an on-demand one — while there is work of them to pull: gradient work
        (`Kind.TRAIN`) first, by crews of at most `crew_size` of a node's idle workers (`_crews`;
        a smaller crew one request at a time, and only where it pays: `partial_crew_pays`), then
        the other kinds by whichever workers are left (no exploration while gradient work waits:
        the queue would give them none)."""
        for spot, ks in ((False, ondemand_kinds), (True, kinds)):
            idle = self._idle[spot]
            if not idle or not ks:
                continue
            waiting = self.queue.queued(_GRADIENT) if Kind.TRAIN in ks else 0
            if waiting:
                full: int | None = None
                for crew in self._crews(idle, crew_size):
                    partial = len(crew) < crew_size
                    if partial:
                        full = self._full_crews(crew_size) if full is None else full
                        if not partial_crew_pays(len(crew), crew_size, waiting, full):
                            continue
                    if not self.executor.serve_crew(crew, version, 1 if partial else None):
                        break  # the gradient work is all taken: the rest may serve other kinds
                    waiting -= 1
                    for w in crew:
                        del idle[w.name]
                        w.phase = WorkerPhase.SERVING
                    if waiting <= 0:
                        break
            ks = tuple(k for k in ks if k is not Kind.TRAIN and not (waiting > 0 and k is Kind.EXPLORATION))
            if not idle or not ks or not self.queue.queued(ks):
                continue
            while idle:
                name = next(iter(idle))
                w = self.workers[name]
                if not self.executor.serve(w, ks, version):
                    return
                del idle[name]
                w.phase = WorkerPhase.SERVING

    def _full_crews(self, size: int) -> int:
        """Crews of `size` the live, unnoticed nodes' workers can form (busy ones included: they come
        back to their node's crew when gradient work waits)."""
        per_node: dict[str, int] = {}
        for w in self.workers.values():
            if len(w.nodes) == 1 and not w.noticed:
                per_node[w.nodes[0]] = per_node.get(w.nodes[0], 0) + 1
        return sum(n // size for node, n in per_node.items() if self.nodes[node].alive and not self.nodes[node].noticed)

    def _crews(self, idle: dict[str, None], size: int) -> list[list[Worker]]:
        """The crews `idle` workers form, in the order their nodes' first idle worker became idle: a
        node's idle workers in groups of at most `size`, the first of each its lead. A worker that
        spans nodes (an SP group) is no crew's: it computes no gradient."""
        by_node: dict[str, list[Worker]] = {}
        for name in idle:
            w = self.workers[name]
            if len(w.nodes) == 1:
                by_node.setdefault(w.nodes[0], []).append(w)
        return [ws[i:i + size] for ws in by_node.values() for i in range(0, len(ws), max(1, size))]

    def _step(self, done: Callable[[], bool], kinds: Collection[Kind] = (), version: int = 0,
              spot_only: bool = False, pending: Sequence[Pending] = (),
              ondemand_kinds: Collection[Kind] | None = None, crew_size: int = 1) -> bool:
        """One turn of every phase: apply the actions due; return True if `done()` then holds;
        else let idle workers serve `kinds` (none: only wait; on-demand workers serve
        `ondemand_kinds` where given, else `kinds` unless `spot_only`; gradient work by crews of at
        most `crew_size`) and wait for the next thing to happen — a worker's report, a `pending`
        done, an action due — and return False."""
        # The simulator turns this loop about once per request (4,096 GPUs x 1,000 iterations: ~2M
        # times), so the next action's time is computed once per turn.
        clock = self.clock
        if self.sources:
            self.poll_sources()
        due = self._next_due()
        if due is not None and clock.now() >= due:
            self._apply_due()
            due = self._next_due()
        if done():
            return True
        if ondemand_kinds is None:
            ondemand_kinds = () if spot_only else kinds
        if kinds or ondemand_kinds:
            self._dispatch(kinds, ondemand_kinds, version, crew_size)
            if not self.workers and not self._more_capacity_coming():
                # An executor may report workers late (an SP re-plan's groups form after a death
                # ended the old ones): take in what it has before giving up, then dispatch them.
                self.settle()
                if not self.workers:
                    raise NoCapacity("no rollout capacity left: every spot worker is gone, none is coming back, "
                                     "and there are no on-demand workers")
                return False
        limit = due
        for p in pending:
            if p.deadline is not None and (limit is None or p.deadline < limit):
                limit = p.deadline
        if self.poll_s is not None and (limit is None or limit > clock.now() + self.poll_s):
            limit = clock.now() + self.poll_s
        self._handle(self.executor.wait(limit, pending))
        if due is not None and clock.now() >= due:
            self._apply_due()  # what is due now comes before anything else at this time
        return False

    def _next_due(self) -> float | None:
        if self._next_action >= len(self.actions):
            return None
        return self.replay.engine_time(self.actions[self._next_action].at_s)

    def _phase(self, name: str) -> None:
        if name in self.replay_phases:
            self.replay.run()
        else:
            self.replay.pause()

    def rollout(self, requests: list[Request], version: int,
                progress: Callable[[dict[str, Any], dict[str, tuple[int, Any]]], None] | None = None,
                every_s: float = 30.0) -> None:
        """Compute every request (at weight `version`) on every live worker; while it runs,
        `progress(results, partial)` gets what is committed every `every_s` seconds."""
        ids = [r.id for r in requests]
        self.queue.put(requests)
        self._phase("rollout")
        reported = self.clock.now()
        # Rollout requests of earlier phases are all done: every open one is one of `requests`.
        done = lambda: not self.queue.open(Kind.ROLLOUT)
        try:
            while True:
                if progress is not None and self.clock.now() - reported >= every_s:
                    progress(*self.queue.committed(ids))
                    reported = self.clock.now()
                if self._step(done, (Kind.ROLLOUT,), version):
                    break
        finally:
            self._phase("idle")

    def explore(self, session: Session, score: Callable[[list[Request]], Any], version: int,
                update: Pending | None = None, until: float | None = None) -> dict[str, float]:
        """Run `session`'s rounds at weight `version`. With `update` (the learner computing the next
        weights), only the idle spot workers explore (every worker when the fleet has no spot
        nodes) until the update is done; a time-bounded session then ends — what is in flight is
        cancelled, so the new weights go out at once — and a sample-bounded one is finished with
        every worker helping (deterministic). Without `update`, every worker explores at once
        (the critical-path exploration before a run's first rollout), and with `until` no round
        starts after that clock time (an executor with no idle workers explores before the update,
        for as long as the last update took). `score(requests)` gives the rewards of completed
        exploration requests."""
        start = self.clock.now()
        spot_fleet = any(n.spot for n in self.nodes.values())
        session.begin(self.rate.estimate())
        requests = session.next_requests()
        self.queue.put(requests)
        updating = update is not None
        updated: float | None = None
        self._phase("train")
        try:
            while requests:
                if not self.queue.open(Kind.EXPLORATION):  # the round is done (or cancelled)
                    session.record(requests, score(requests))
                    if until is not None and self.clock.now() >= until:
                        break
                    requests = session.next_requests()
                    self.queue.put(requests)
                    continue
                if updating and update.done():
                    updating, updated = False, self.clock.now()
                    self.rate.update_s = updated - start
                    if session.time_bounded:
                        session.cancelled += self.queue.cancel(Kind.EXPLORATION)
                        self.executor.cancelled(Kind.EXPLORATION)
                        done = set(self.queue.completed([r.id for r in requests]))
                        finished = [r for r in requests if r.id in done]
                        if finished:
                            session.record(finished, score(finished))
                        break
                    continue
                if not self.workers and not self._more_capacity_coming():
                    self.settle()  # workers reported late (see `_step`)
                    if not self.workers:
                        raise NoCapacity("no worker left to finish exploration (exploration.budget_source: samples)")
                # While the update runs, its own work (a fleet update's gradients) goes to every
                # node's crews, and exploration only to spot workers (the on-demand ones are the
                # learner's; every worker explores on a fleet without spot nodes) and only while no
                # gradient work waits to be pulled: a request shortens the critical path for sure,
                # and one re-queued after a death must not wait behind exploration (the queue's
                # rule stops exploring workers pulling more while one waits, so they come back
                # to their node's crew). Once every request is taken, nodes whose crews are done
                # explore while the others finish theirs and the learner gathers and steps.
                work = tuple(getattr(update, "kinds", ())) if updating else ()
                busy = self.queue.queued(work) > 0 if work else False
                explorers = work if busy else (*work, Kind.EXPLORATION)
                self._step(lambda: not self.queue.open(Kind.EXPLORATION) or (updating and update.done()),
                           explorers, version, pending=[update] if updating else (),
                           ondemand_kinds=work if updating and spot_fleet else explorers,
                           crew_size=crew_size(update))
        finally:
            self._phase("idle")
        seconds = self.clock.now() - start
        if not session.critical_path:  # the critical path has every worker, not a train phase's
            self.rate.explored(session.samples, seconds)
        if update is None:
            return exploration_stats(session, seconds)
        if updating:  # exploration ran out before the update did
            self.wait(update, version)
            self.rate.update_s = self.clock.now() - start
            return {**exploration_stats(session, seconds), "time_publish_wait_s": 0.0}
        # How long the new weights waited for exploration after the update was done.
        return {**exploration_stats(session, seconds), "time_publish_wait_s": self.clock.now() - updated}

    def update(self, start: Callable[[], Pending], version: int, session: Session | None = None,
               score: Callable[[list[Request]], Any] | None = None,
               serial: bool = False) -> tuple[Pending, dict[str, float]]:
        """The learner's update at weight `version` — `start()` starts it and returns what to wait
        on — with idle workers exploring `session` meanwhile (`explore`): explore-during-update,
        written once for both runtimes and the simulator. Returns the update's `Pending` (its stats
        are the caller's to read) and the exploration's stats. `serial`: an executor with no idle
        worker (the local runtime's one in-process worker) explores first instead, a `train_time`
        budget lasting as long as the last update took, and starts the update after (a fleet
        update queues its requests when it starts: they must not wait behind exploration). The
        update's seconds are measured for the next budget (`rate`)."""
        if session is not None and not serial:
            update = start()
            return update, self.explore(session, score, version, update=update)
        explored: dict[str, float] = {}
        if session is not None:
            rate = self.rate
            until = self.clock.now() + rate.update_s if session.time_bounded and rate.update_s else None
            explored = self.explore(session, score, version, until=until)
        begun = self.clock.now()
        update = start()
        self.wait(update, version)
        self.rate.update_s = self.clock.now() - begun
        return update, explored

    def wait(self, pending: Pending, version: int = 0) -> None:
        """Wait for `pending` (the learner's update) while the fleet lives on: notices, deaths
        and joins are handled; workers compute the update's own work (`pending.kinds`, a fleet
        update's gradients at weight `version`) or idle."""
        self._phase("train")
        try:
            while not self._step(pending.done, tuple(getattr(pending, "kinds", ())), version, pending=[pending],
                                 crew_size=crew_size(pending)):
                pass
        finally:
            self._phase("idle")
