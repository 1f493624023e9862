"""The Ray runtime: the controller (this process) drives the roles as Ray actors.

- learner (on-demand): a `Learner` actor — it trains, checkpoints and hands out weights; with
  `train.learner_gpus` > 1 a `LearnerGroup` actor, whose rank processes run on its node;
- request queue: a `QueueActor` (the pull queue on the wall clock);
- rollout workers: `RolloutWorker` actors, `spot_workers` of them needing the `spot` custom
  resource (a real cluster's spot nodes advertise it; a local cluster is started with plenty) and
  `ondemand_workers` without it;
- reward workers: `reward.workers` stateless `RewardWorker` actors on the controller's node, each
  holding `reward.num_gpus` (`RewardPool`).

Each actor is Ray's wrapper over the plain class of the same name, tested without Ray.

The fleet — which worker serves when, what a notice, a death or a join does, the train phase's
exploration and its cancel-on-publish — is `schedulers.fleet.FleetEngine`'s, on the wall clock;
this module only adds `RayExecutor` (the rollout workers as actors) and the other roles.
Preemptions come as `ReplayAction`s (from a trace via `traces.replay_schedule`, or from a chaos
test) on spot slot k = fleet node `spotK`: "notice" posts a `PreemptionNotice` to its worker
through the queue (it gives its in-flight request back at the next step boundary and stops
pulling); "kill" ends the actor with `ray.kill` — a death *without* notice when none came first,
after which the queue re-queues its requests from their last committed state; "add" starts a
fresh actor on the node (new name, so a zombie's late commits are refused), which pulls at once.
The replay clock runs only while a rollout phase runs (spot workers idle during the train phase,
so that is when a preemption costs something), scaled by `runtime.trace_speedup` inside the schedule.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray
import torch

from cloud.cost import Fleet
from schedulers.clock import WallClock
from schedulers.fleet import Died, FleetAction, FleetEngine, Node, Ready, Served, Worker, fleet_nodes
from schedulers.preemption import PreemptionNotice
from schedulers.queue_actor import QueueActor, QueueClient
from schedulers.request import Kind, Request
from schedulers.update import FleetUpdate
from spotlight.config import ConfigError, RunConfig
from spotlight.iteration.exploration import ExplorationSession
from spotlight.runtime.learner import Learner
from spotlight.runtime.learner_group import LearnerGroup
from spotlight.rl.policy import Rollout
from spotlight.reward_names import component, spec
from spotlight.rl.rewards import RewardError, RewardWorker, Scores, split_parts
from spotlight.runtime.rollout_worker import CrewMemberLost, RolloutWorker
from spotlight.runtime import ray_cluster
from spotlight.runtime.local import gradient_split, scheduler_stats
from spotlight.runtime.protocol import Progress
from spotlight.runtime.ray_fleet import ClusterFleet, placement
from spotlight.text import plural
from spotlight.waiting import waiting
from schedulers.traces import ReplayAction

logger = logging.getLogger(__name__)

_POLL_S = 0.01
START_TIMEOUT_S = 300.0
"""A rollout worker Ray has not placed and started this long after it was asked for counts as
lost (its node is then started again by `ClusterFleet`): no silent wait on an actor that never
starts. Starting takes seconds (imports, the policy); a cold node pulling a container, minutes."""
_GONE = (ray.exceptions.RayActorError, ray.exceptions.ActorUnschedulableError)
"""What a call to a worker raises when its actor is gone, or could not be placed (its node is)."""

# The actor facades, made once (each `ray.remote` call re-exports the class). num_cpus=0: the
# roles share the node's cores and torch runs one thread in each.
LearnerActor = ray.remote(num_cpus=0)(Learner)
LearnerGroupActor = ray.remote(num_cpus=0)(LearnerGroup)
RewardActor = ray.remote(num_cpus=0)(RewardWorker)
RolloutWorkerActor = ray.remote(num_cpus=0)(RolloutWorker)


@ray.remote(num_cpus=0)
def _shares(parts: list[Rollout], n: int) -> list[list[Rollout]]:
    """A batch in the object store split for n reward workers (`num_returns=n`), where it lives:
    each worker then receives its share alone, not the whole batch."""
    return split_parts(parts, n)


def _own_error(refs: Any) -> Any:
    """`ray.get(refs)`, with a reward's `RewardError` or `ConfigError` raised as itself (one line),
    not as Ray's wrapper of it (whose text is the actor's traceback)."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as err:
        if isinstance(err.cause, (RewardError, ConfigError)):
            raise err.cause from None
        raise


class RewardPool:
    """`reward.workers` `RewardWorker` actors, each holding `reward.num_gpus`, pinned to the
    controller's node (`ray_fleet`'s placement rule: on-demand roles run there). A batch is split
    between them in request order (`rewards.split_parts`) and their `Scores` concatenated: each
    request is scored on its own, so the scores are those of one worker, bit for bit
    (tests/spotlight/rl/test_rewards.py::test_split_workers_score_what_one_worker_scores). A batch still in
    the object store (an ObjectRef) is split there (`_shares`) and never passes through here."""

    def __init__(self, cfg: RunConfig, pinned: dict[str, Any], gpus_free: float,
                 metadata: Mapping[int, dict] | None) -> None:
        rc = self.cfg = cfg.reward
        if rc.num_gpus and rc.workers * rc.num_gpus > gpus_free:
            raise ConfigError(f"reward.num_gpus: {rc.workers} reward worker{'s' * (rc.workers > 1)} x {rc.num_gpus:g} "
                              f"GPU need {rc.workers * rc.num_gpus:g} GPUs on the controller's node, which has "
                              f"{gpus_free:g} free (expected at most that, or 0: the CPU)")
        self.pinned, self.metadata = pinned, metadata
        # A user function's file path is relative to this process's working directory, not an actor's.
        self.cwd = str(Path.cwd())
        self.actors = self._start()

    def _start(self) -> list[Any]:
        rc = self.cfg
        return [RewardActor.options(**self.pinned, num_gpus=rc.num_gpus).remote(rc, self.metadata, self.cwd)
                for _ in range(rc.workers)]

    def build(self) -> None:
        """Every worker builds its components: a bad one is its own one-line `ConfigError` here."""
        _own_error([a.build.remote() for a in self.actors])

    def score(self, parts: Any) -> Scores:
        """`parts`: a list of rollouts or an ObjectRef of one. A reward worker that dies while it
        scores (killed for memory, a segfault, a user's `os._exit`) is a reward failure: the batch is
        scored again on new workers, and a second death is a `RewardError` naming the reward."""
        try:
            return self._score(parts)
        except _GONE as err:
            logger.warning(f"a reward worker died while scoring ({type(err).__name__}); scoring the batch again "
                           "on new ones")
        self._end_workers()  # a dead one's partners too: a batch is split between them
        self.actors = self._start()
        self.build()
        try:
            return self._score(parts)
        except _GONE as err:
            self._end_workers()
            why = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
            terms = ", ".join(f"{component(self.cfg, i)} ({spec(t)})" for i, t in enumerate(self.cfg.terms))
            raise RewardError(f"{terms}: a reward worker died while scoring ({type(err).__name__}: {why}), tried "
                              "twice (the second time on new workers)") from None

    def _end_workers(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)

    def _score(self, parts: Any) -> Scores:
        n = len(self.actors)
        if n == 1:
            return _own_error(self.actors[0].score.remote(parts))
        if isinstance(parts, ray.ObjectRef):
            shares = _shares.options(num_returns=n, **self.pinned).remote(parts, n)
        else:
            shares = split_parts(parts, n)
        return Scores.concat(_own_error([a.score.remote(s) for a, s in zip(self.actors, shares)]))


class RayPending:
    """The learner's update in flight (an ObjectRef), as the fleet engine waits on it."""

    deadline = None

    def __init__(self, ref: Any) -> None:
        self.ref = ref

    def done(self) -> bool:
        return bool(ray.wait([self.ref], timeout=0)[0])


class RayCrewMember:
    """A crew member as its node's lead reaches it (`rollout_worker.CrewMember`): its actor computes
    its share of a request's micro-batches while the lead computes its own; the parts come back
    through the node's object store (both actors run on the node), not across the network."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def submit(self, work: Any, indices: list[int]) -> Any:
        return self.actor.gradient_parts.remote(work, indices)

    def collect(self, handle: Any) -> list[Any]:
        try:
            return ray.get(handle)
        except _GONE as err:
            raise CrewMemberLost(str(err).splitlines()[0]) from None


class RayExecutor:
    """Rollout workers as Ray actors, one per device of a node of the fleet (`schedulers.fleet.Executor`).

    A worker is a `RolloutWorker` actor named NODE.GENERATION (NODE.GENERATION#j on a node of
    several devices; a restarted node's new actors have new names, so a zombie's late commits are
    refused). Where it runs is `ray_fleet.placement`: pinned to its node where the node is a real
    one (`Node.cluster_id`), holding a unit of `spot` on a spot node and a GPU on a GPU node.
    `serve` is the actor's `serve()` call; it ends when the queue has nothing for the worker or a
    notice stopped it. A call that fails because the actor died is the worker's death without
    notice, and its node counts as gone (on a cluster, `ClusterFleet` starts it again if Ray says
    the node lives on)."""

    def __init__(self, cfg: RunConfig, queue: Any, version: int, weights: Any, clock: Any,
                 home: str | None = None, gpus: Any = None,
                 base: Any = None) -> None:
        self.cfg, self.queue, self.clock = cfg, queue, clock
        self.version, self.weights = version, weights
        self.base = base
        """With LoRA, the learner's frozen base (an ObjectRef): each worker loads it once, at start."""
        self.home = home
        """The node a worker of a replayed fleet runs on (the one-node local cluster's)."""
        self.gpus = gpus or (lambda node_id: 0)
        self._starting: dict[Any, Worker] = {}
        self._serving: dict[Any, list[Worker]] = {}
        """A serve call in flight -> its worker, or its crew (the lead first)."""
        self._since: dict[Any, float] = {}
        """When each starting worker was asked for (`START_TIMEOUT_S`)."""

    def start(self, node: Node, spot: bool) -> list[Worker]:
        local = node.cluster_id is None
        options = placement(self.home if local else node.cluster_id, spot, self.gpus(node.cluster_id), local)
        workers = []
        for j in range(node.devices):
            name = f"{node.name}.{node.generation}" + (f"#{j}" if node.devices > 1 else "")
            actor = RolloutWorkerActor.options(**options).remote(
                name, self.cfg, QueueClient(self.queue), commit_every=self.cfg.runtime.commit_every)
            # Actor calls from one caller run in order: build, then the weights, then (later) serve.
            actor.build.remote(self.base)
            worker = Worker(name, (node.name,), spot, handle=actor)
            ref = actor.set_weights.remote(self.version, self.weights)
            self._starting[ref], self._since[ref] = worker, self.clock.now()
            workers.append(worker)
        return workers

    def serve(self, worker: Worker, kinds: Any, version: int) -> bool:
        self._serving[worker.handle.serve.remote(list(kinds))] = [worker]
        return True  # the actor pulls by itself; whether it finds work shows when serve() returns

    def serve_crew(self, workers: Sequence[Worker], version: int, at_most: int | None = None) -> bool:
        """The lead's actor serves gradient work with its node's other idle actors as its crew
        (Ray runs an actor's calls one at a time: a member computes the lead's parts between none
        of its own, as the engine gives it nothing else while the crew serves)."""
        lead, *members = workers
        ref = lead.handle.serve.remote([Kind.TRAIN], [RayCrewMember(w.handle) for w in members], at_most)
        self._serving[ref] = list(workers)
        return True

    def changed(self, nodes: Any) -> None:
        pass  # one worker per node: nothing to regroup

    def cancelled(self, kind: Any) -> None:
        pass  # the actors learn it from their next heartbeat

    def notify(self, worker: Worker, notice: PreemptionNotice) -> None:
        ray.get(self.queue.notify.remote(worker.name, notice))

    def stop(self, worker: Worker, lost: bool) -> None:
        ray.kill(worker.handle, no_restart=True)
        for ref in [r for r, w in self._starting.items() if w is worker]:
            del self._starting[ref]
            self._since.pop(ref, None)
        for ref, crew in list(self._serving.items()):
            if worker in crew:  # a crew's lead or member: the rest of it hears when the lead's call ends
                crew.remove(worker)
                if not crew:
                    del self._serving[ref]

    def publish(self, version: int, weights: Any, workers: list[Worker]) -> None:
        """New weights for every worker (and every worker started from now on)."""
        self.version, self.weights = version, weights
        for w in workers:
            w.handle.set_weights.remote(version, weights)

    def worker_nodes(self, worker: str) -> tuple[str, ...]:
        """The node queue worker `worker` ran on (its name is NODE.GENERATION[#j])."""
        return (worker.rsplit(".", 1)[0],)

    def stats(self) -> dict[str, float]:
        return {}  # one worker per device: nothing regroups

    def wait(self, until: float | None, pending: Any = ()) -> list[Any]:
        watched = [*self._starting, *self._serving]
        timeout = None if until is None else max(0.0, until - self.clock.now())
        if self._since:  # wake up when the oldest starting worker runs out of time to start
            left = max(0.0, min(self._since.values()) + START_TIMEOUT_S - self.clock.now()) + 0.01
            timeout = left if timeout is None else min(timeout, left)
        # A fleet update between steps has nothing in flight on the learner (its `ref` is None).
        refs = watched + [p.ref for p in pending if p.ref is not None]
        if not refs:
            self.clock.sleep(_POLL_S if timeout is None else timeout)
            return []
        ray.wait(refs, num_returns=1, timeout=timeout)
        ready = ray.wait(watched, num_returns=len(watched), timeout=0)[0] if watched else []
        events: list[Any] = []
        now = self.clock.now()
        for ref in [r for r, t in self._since.items() if r not in ready and now - t > START_TIMEOUT_S]:
            worker = self._starting.pop(ref)
            del self._since[ref]
            ray.kill(worker.handle, no_restart=True)
            logger.warning(f"rollout executor {worker.name} did not start within {START_TIMEOUT_S:.0f} s "
                           "(Ray could not place or start it): counted as lost")
            events.append(Died(worker.name, worker.nodes))
        for ref in ready:
            if ref in self._starting:
                worker = self._starting.pop(ref)
                del self._since[ref]
                events.append(Ready(worker) if self._ended(ref) else Died(worker.name, worker.nodes))
            elif ref in self._serving:
                lead, *members = crew = self._serving.pop(ref)
                try:
                    noticed = ray.get(ref)["noticed"]
                    events.extend(Served(w.name, noticed=noticed) for w in crew)
                except _GONE:  # the lead died on its own (node lost): no notice came
                    events.append(Died(lead.name, lead.nodes))
                    events.extend(Served(w.name) for w in members)
        return events

    @staticmethod
    def _ended(ref: Any) -> bool:
        try:
            ray.get(ref)
            return True
        except _GONE:
            return False


@dataclass
class RayRuntime:
    cfg: RunConfig
    actions: list[ReplayAction] = field(default_factory=list)
    """Preemption schedule over spot slots (slot k is fleet node `spotK`), in replay seconds (sorted)."""
    replay_phases: tuple[str, ...] = ("rollout",)
    """The phases the schedule's clock runs in (`FleetEngine.replay_phases`): the rollout, where a
    preemption used to cost something; add "train" when the fleet computes the update too."""
    metadata: Mapping[int, dict] | None = None
    """Prompt id -> that prompt's metadata (a jsonl prompt's other fields), handed to the reward
    workers (`RewardWorker`); None: none."""

    def __post_init__(self) -> None:
        self._started_ray = False
        self._watcher: Callable[[Fleet], None] | None = None
        """Who pays for a joined cluster's nodes (`watch_fleet`)."""
        self.queue_stats: dict[str, int] = {}

    # ---- start-up -------------------------------------------------------------------------------

    def build(self, checkpoints: Path) -> dict[str, Any]:
        rt = self.cfg.runtime
        with waiting(f"joining the Ray cluster at {rt.address}" if rt.address
                     else "starting a local Ray cluster"):
            self._started_ray = ray_cluster.connect(rt)
        self.clock = WallClock()
        # The on-demand roles run where this controller runs: the learner's checkpoints land on the
        # disk the run folder is on, and a spot node's loss never takes a role the run needs.
        home = ray.get_runtime_context().get_node_id()
        pinned = placement(home, spot=False, gpus=0, local=True)
        # Joined to a cluster, the fleet is the cluster's (`ray_fleet`); a cluster started here has
        # one node, on which the configured fleet and its replayed trace run.
        self.cluster = ClusterFleet(rt, self.clock) if rt.address else None
        self.queue_actor = QueueActor.options(**pinned).remote(lease_s=rt.lease_s)
        self.queue = QueueClient(self.queue_actor)
        # A sharded learner (`train.learner_gpus`) is one actor whose rank processes share its node and GPUs.
        group = self.cfg.train.learner_gpus
        on_gpus = self.cluster and self.cluster.gpus(home) and self.cfg.device.startswith("cuda")
        learner_gpus = group if on_gpus else 0
        actor = LearnerGroupActor if group > 1 else LearnerActor
        self.learner = actor.options(**pinned, num_gpus=learner_gpus).remote(self.cfg)
        home_gpus = self.cluster.gpus(home) if self.cluster else ray.cluster_resources().get("GPU", 0)
        self.reward = RewardPool(self.cfg, pinned, home_gpus - learner_gpus, self.metadata)
        info = self.learner.build.remote(checkpoints)
        with waiting(f"starting the learner (it loads the model and the newest checkpoint) and "
                     f"{plural(self.cfg.reward.workers, 'reward worker')} as Ray actors"):
            self.reward.build()  # a bad reward spec fails here, while the learner builds
            info = ray.get(info)
        self.version = info["step"]
        if rt.sp_degree > 1:  # elastic SP groups serve the requests (spotlight/runtime/ray_sp.py)
            from spotlight.runtime.ray_sp import RaySPExecutor
        # With LoRA the base goes into the object store once (SP nodes: the whole model, the
        # structure their members copy by name); publishes carry the adapters alone.
        lora = {}
        if self.cfg.policy.lora.enabled:
            lora["base"] = (self.learner.full_state if rt.sp_degree > 1 else self.learner.base).remote()
        self.executor = (RaySPExecutor if rt.sp_degree > 1 else RayExecutor)(
            self.cfg, self.queue_actor, self.version, self.learner.weights.remote(),
            self.clock, home=home, gpus=self.cluster.gpus if self.cluster else None, **lora)
        nodes = self.cluster.nodes() if self.cluster else fleet_nodes(rt.ondemand_workers, rt.spot_workers)
        self.engine = FleetEngine(self.clock, self.queue, self.executor, nodes,
                                  actions=[FleetAction(a.at_s, f"spot{a.slot}", a.action) for a in self.actions],
                                  poll_s=_POLL_S, replay_phases=self.replay_phases, on_fleet=self._fleet_changed)
        if self.cluster:
            self.engine.sources.append(self.cluster)
        # The first fleet is up before the replay clock starts, so it starts with workers ready to pull.
        with waiting(f"starting the rollout workers on {plural(len(nodes), 'node')}"):
            self.engine.start()
        return info

    def watch_fleet(self, paid: Callable[[Fleet], None]) -> None:
        """A joined cluster's fleet is its nodes: the meter pays for them as they come and go
        (`ClusterFleet.paid_fleet`, told by the engine at every change: `_fleet_changed`); a cluster
        started here runs the configured fleet."""
        if self.cluster is not None:
            self._watcher = paid
            self._fleet_changed()

    def _fleet_changed(self) -> None:
        if self._watcher is not None:
            self._watcher(self.cluster.paid_fleet())

    def use_ondemand(self) -> None:
        """Fall back from spot (between iterations): the preemption schedule stops, and every spot
        node, live or preempted, is replaced by an on-demand worker — an actor without the `spot`
        resource, which a real cluster places on an on-demand node (`FleetEngine.use_ondemand`)."""
        self.engine.use_ondemand()

    # ---- the roles --------------------------------------------------------------------------------

    def rollout(self, requests: list[Request], progress: Progress | None = None, every_s: float = 30.0) -> Any:
        """The results stay in the object store: the ObjectRef returned goes to the reward actor and
        the learner as it is, and Ray hands them the results from the queue actor's reply directly
        (measured before: every trajectory crossed the controller three times)."""
        self.engine.rollout(requests, self.version, progress, every_s)
        return self.queue_actor.results.remote([r.id for r in requests])

    def fetch(self, parts: Any) -> list[Rollout]:
        return ray.get(parts) if isinstance(parts, ray.ObjectRef) else parts

    def evaluate(self, requests: list[Request]) -> Any:
        """As `rollout` without an EMA; with one, the learner actor samples them (its EMA never
        leaves it), and the ObjectRef of its results goes on to the reward actor as a rollout's does."""
        if not self.cfg.train.ema_decay:
            return self.rollout(requests)
        return self.learner.evaluate.remote(requests)

    def rewards(self, parts: list[Rollout]) -> Scores:
        return self.reward.score(parts)

    def release(self, requests: list[Request]) -> None:
        self.queue.release([r.id for r in requests])

    def update(self, parts: list[Rollout], advantages: torch.Tensor,
               exploration: ExplorationSession | None = None, on_fleet: bool = False) -> dict[str, float]:
        learner, queue = self.learner, self.queue_actor
        # For `gradient_split`; a learner-only update needs no call to the queue actor.
        before = self.queue.completions_by_worker(Kind.TRAIN) if on_fleet else {}

        def add(round: int, chunk: int, chunks: int, rid: str) -> None:
            # As the request completes, its gradient goes queue -> learner directly, and the
            # learner folds it while the fleet computes the rest (calls run in order).
            learner.add_part.remote(round, chunk, chunks, queue.results.remote([rid], True))

        def step(round: int, ids: list[str]) -> RayPending:
            return RayPending(learner.step_added.remote(round))

        def start() -> FleetUpdate | RayPending:
            if not on_fleet:
                return RayPending(learner.update.remote(parts, advantages))
            # the fleet computes the gradient (schedulers/update.py)
            return FleetUpdate(self.queue, self.version, self.cfg.train.updates_per_step,
                               ray.get(learner.update_parts.remote(parts)), (parts, advantages), step,
                               weights=lambda: learner.weights.remote(),
                               per_request=self.cfg.train.parts_per_request, add=add)

        update, explored = self.engine.update(start, self.version, exploration, self._score)
        if isinstance(update, FleetUpdate):
            stats = {**ray.get(update.last_step.ref), **gradient_split(self.engine, self.queue, before)}
        else:
            stats = ray.get(update.ref)
        stats["update_on_fleet"] = on_fleet
        self.version += 1
        return {**stats, **explored}

    def publish(self) -> None:
        self.executor.publish(self.version, self.learner.weights.remote(), list(self.engine.workers.values()))

    def explore(self, session: ExplorationSession) -> dict[str, float]:
        """Run `session` to its end on every worker, with nothing training meanwhile (the critical-path
        exploration before a run's first rollout)."""
        return self.engine.explore(session, self._score, self.version)

    def _score(self, requests: list[Request]) -> torch.Tensor:
        # The reward actor reads the results straight from the queue actor's reply.
        # Scored once: released from the queue as they are read.
        return self.reward.score(self.queue_actor.results.remote([r.id for r in requests], True)).total

    def save_checkpoint(self, root: Path) -> str:
        return ray.get(self.learner.save_checkpoint.remote(root))

    def save_final(self, path: Path) -> None:
        ray.get(self.learner.save_final.remote(path))

    def stats(self) -> dict[str, Any]:
        c = self.engine.counters
        stats: dict[str, Any] = scheduler_stats(self.queue.stats(), c["notices"], c["workers_lost"])
        # Which node computed how many requests: where the work went (a node's workers are NODE.*).
        # An SP group spans nodes: each of them is counted as having computed its requests.
        by_node: dict[str, int] = {}
        for worker, n in self.queue.completions_by_worker().items():
            for node in self.executor.worker_nodes(worker):
                by_node[node] = by_node.get(node, 0) + n
        stats["requests_by_node"] = dict(sorted(by_node.items()))
        stats.update(self.executor.stats())  # SP: sp_regroups, sp_regroup_s
        return stats

    def shutdown(self) -> None:
        """Stop what this run started. It runs in the trainer's `finally`, often because a role
        died: a queue that cannot answer keeps the counters it last gave, and raises nothing that
        would bury the error that ended the run."""
        try:
            self.queue_stats = self.queue.stats()  # the queue's own counters outlive the cluster
        except (AttributeError, ray.exceptions.RayError):
            pass
        if self.cfg.train.learner_gpus > 1 and hasattr(self, "learner"):
            try:  # the group's rank processes, asked to stop before their actor goes
                ray.get(self.learner.close.remote(), timeout=30)
            except ray.exceptions.RayError:
                pass  # a dead actor's ranks saw their connection close and ended themselves
        if self._started_ray:
            ray_cluster.shutdown()
            self._started_ray = False
