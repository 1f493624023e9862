"""The Ray runtime: the controller (this process) drives the roles as Ray actors.

- learner (on-demand): a `Learner` actor — it trains, checkpoints and hands out weights;
- request queue: a `QueueActor` (the pull queue on the wall clock);
- rollout workers: `RolloutWorker` actors, `spot_workers` of them needing the `spot` custom
  resource (a real cluster's spot nodes advertise it; a local cluster is started with plenty) and
  `ondemand_workers` without it;
- reward worker: a stateless `RewardWorker` actor.

Each actor is Ray's wrapper over the plain class of the same name, tested without Ray.

Preemptions come as `ReplayAction`s (from a trace via `traces.replay_schedule`, or from a chaos
test): "notice" posts a `PreemptionNotice` to the worker through the queue (it gives its in-flight
request back at the next step boundary and stops pulling); "kill" ends the actor with `ray.kill` —
a death *without* notice when none came first, after which the queue re-queues its requests from
their last committed state; "add" starts a fresh actor in a dead slot (new name, so a zombie's late
commits are refused), which pulls at once. The replay clock runs only while a rollout phase runs
(spot workers idle during the train phase, so that is when a preemption costs something), scaled
by `runtime.trace_speedup` inside the schedule.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
import torch

from schedulers.preemption import Cause, PreemptionNotice
from schedulers.queue import Status
from schedulers.queue_actor import QueueActor, QueueClient
from schedulers.request import Kind, Request
from spotlight.config import ConfigError, RunConfig
from spotlight.exploration import ExplorationSession
from spotlight.learner import Learner
from spotlight.policy import Rollout
from spotlight.rewards import RewardWorker
from spotlight.rollout_worker import RolloutWorker
from spotlight.runtime import ExplorationRate, Progress, exploration_stats, scheduler_stats
from spotlight.traces import ReplayAction

SPOT_RESOURCE = "spot"
"""Ray custom resource that spot nodes advertise; each spot rollout worker needs a sliver of it."""
_SPOT_SLIVER = 0.001
_POLL_S = 0.01

# The actor facades, made once (each `ray.remote` call re-exports the class). num_cpus=0: the
# roles share the node's cores and torch runs one thread in each.
LearnerActor = ray.remote(num_cpus=0)(Learner)
RewardActor = ray.remote(num_cpus=0)(RewardWorker)
RolloutWorkerActor = ray.remote(num_cpus=0)(RolloutWorker)


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a `host:port` nobody listens on: ray.init retries such an address for minutes."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # "auto", "ray://...": Ray resolves these itself and fails fast
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ConfigError(f"runtime.address: cannot join the Ray cluster at {address!r} "
                          f"({err.strerror or err})") from None


@dataclass
class Slot:
    """One rollout worker place: spot slots come and go, on-demand ones stay."""

    index: int
    spot: bool
    generation: int = 0
    actor: Any = None
    alive: bool = False
    noticed: bool = False
    serving: Any = None
    """ObjectRef of the running `serve()` call, if any."""

    @property
    def name(self) -> str:
        return f"{'spot' if self.spot else 'ondemand'}{self.index}.{self.generation}"


@dataclass
class RayRuntime:
    cfg: RunConfig
    actions: list[ReplayAction] = field(default_factory=list)
    """Preemption schedule over spot slots, in replay-clock seconds (sorted)."""
    preemptions: int = 0
    workers_lost: int = 0

    def __post_init__(self) -> None:
        self._started_ray = False
        self._trace_s = 0.0
        self._next_action = 0
        self._weights: Any = None
        self.queue_stats: dict[str, int] = {}
        self.rate = ExplorationRate()

    # ---- start-up -------------------------------------------------------------------------------

    def build(self, checkpoints: Path) -> dict[str, Any]:
        rt = self.cfg.runtime
        if not ray.is_initialized():
            if rt.address:
                _check_reachable(rt.address)
                try:
                    ray.init(address=rt.address, log_to_driver=False)
                except (ConnectionError, RuntimeError, ray.exceptions.RayError) as err:
                    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                    raise ConfigError(f"runtime.address: cannot join the Ray cluster at {rt.address!r} ({first})") from None
            else:
                # Every torch process gets one thread: several 2-thread processes on 2 cores spin
                # in OpenMP (measured here: a tiny-DiT update went from 0.9 s to 21 s).
                ray.init(num_cpus=os.cpu_count(), resources={SPOT_RESOURCE: 1000.0}, include_dashboard=False,
                         log_to_driver=False, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
            self._started_ray = True
        self.queue = QueueActor.remote(lease_s=rt.lease_s)
        self.learner = LearnerActor.remote(self.cfg)
        self.reward = RewardActor.remote(self.cfg.reward)
        info = ray.get(self.learner.build.remote(checkpoints))
        self.version = info["step"]
        self._weights = self.learner.weights.remote()
        self.slots = ([Slot(i, spot=True) for i in range(rt.spot_workers)]
                      + [Slot(i, spot=False) for i in range(rt.ondemand_workers)])
        # Wait for the first fleet to be up, so the replay clock starts with workers ready to pull.
        # A spot worker can vanish during start-up too: that is a worker lost, not a failed run.
        for slot, ready in [(slot, self._start(slot)) for slot in self.slots]:
            try:
                ray.get(ready)
            except ray.exceptions.RayActorError:
                self._lost(slot)
        return info

    def _start(self, slot: Slot) -> Any:
        """Start a fresh actor in `slot`; returns the ObjectRef that resolves when it holds the weights."""
        slot.generation += 1
        actor_cls = RolloutWorkerActor.options(resources={SPOT_RESOURCE: _SPOT_SLIVER}) if slot.spot \
            else RolloutWorkerActor
        slot.actor = actor_cls.remote(slot.name, self.cfg, QueueClient(self.queue),
                                      commit_every=self.cfg.runtime.commit_every)
        # Actor calls from one caller run in order: build, then the weights, then (later) serve.
        slot.actor.build.remote()
        slot.alive, slot.noticed, slot.serving = True, False, None
        return slot.actor.set_weights.remote(self.version, self._weights)

    # ---- preemptions ----------------------------------------------------------------------------

    def _apply_due(self, now_s: float) -> None:
        spot = {s.index: s for s in self.slots if s.spot}
        while self._next_action < len(self.actions) and self.actions[self._next_action].at_s <= now_s:
            action = self.actions[self._next_action]
            self._next_action += 1
            slot = spot.get(action.slot)
            if slot is None:
                continue
            if action.action == "notice" and slot.alive and not slot.noticed:
                ray.get(self.queue.notify.remote(slot.name, PreemptionNotice(Cause.TRACE, None, slot.name)))
                slot.noticed = True
                self.preemptions += 1
            elif action.action == "kill" and slot.alive:
                self._kill(slot)
            elif action.action == "add" and not slot.alive:
                self._start(slot)

    def _kill(self, slot: Slot) -> None:
        """The trace's removal: end the actor; a death without notice if none came first."""
        ray.kill(slot.actor, no_restart=True)
        self._lost(slot, without_notice=not slot.noticed)

    def _lost(self, slot: Slot, without_notice: bool = True) -> None:
        """`slot`'s actor is gone (killed, or reported dead by Ray): re-queue its work."""
        slot.alive, slot.serving = False, None
        self.workers_lost += without_notice
        ray.get(self.queue.worker_lost.remote(slot.name))

    def _more_capacity_coming(self) -> bool:
        return any(a.action == "add" for a in self.actions[self._next_action:])

    def use_ondemand(self) -> None:
        """Fall back from spot (between iterations): the preemption schedule stops, and every spot
        slot, live or preempted, is restarted as an on-demand worker — an actor without the `spot`
        resource, which a real cluster places on an on-demand node — under a new name. A live spot
        actor is retired, not lost: nothing is in flight between iterations (whatever it might
        still lease goes back to the queue all the same), so no death is counted."""
        self.actions = self.actions[:self._next_action]
        index = sum(not s.spot for s in self.slots)
        started = []
        for slot in [s for s in self.slots if s.spot]:
            if slot.alive:
                ray.kill(slot.actor, no_restart=True)
                ray.get(self.queue.worker_lost.remote(slot.name))
            slot.spot, slot.index, slot.generation = False, index, 0
            index += 1
            started.append((slot, self._start(slot)))
        for slot, ready in started:
            try:
                ray.get(ready)
            except ray.exceptions.RayActorError:
                self._lost(slot)

    # ---- the roles --------------------------------------------------------------------------------

    def _pump(self, slots: list[Slot], kinds: list[Kind] | None = None) -> bool:
        """One turn of keeping `slots` busy: start `serve(kinds)` on each live, un-noticed, idle slot,
        wait up to a poll interval, and reap the serve calls that ended (a slot whose actor died on
        its own was lost without notice). Returns whether any slot was serving."""
        for slot in slots:
            if slot.alive and not slot.noticed and slot.serving is None:
                slot.serving = slot.actor.serve.remote(kinds)
        serving = {s.serving: s for s in self.slots if s.serving is not None}
        if not serving:
            time.sleep(_POLL_S)
            return False
        ready, _ = ray.wait(list(serving), num_returns=len(serving), timeout=_POLL_S)
        for ref in ready:
            slot = serving[ref]
            slot.serving = None
            try:
                slot.noticed = slot.noticed or ray.get(ref)["noticed"]
            except ray.exceptions.RayActorError:
                if slot.alive:  # died on its own (node lost): no notice came
                    self._lost(slot)
        return True

    def rollout(self, requests: list[Request], progress: Progress | None = None, every_s: float = 30.0) -> list[Rollout]:
        ids = [r.id for r in requests]
        ray.get(self.queue.put.remote(requests))
        start = reported = time.monotonic()
        while True:
            if progress is not None and time.monotonic() - reported >= every_s:
                progress(*ray.get(self.queue.committed.remote(ids)))
                reported = time.monotonic()
            self._apply_due(self._trace_s + time.monotonic() - start)
            if not self._pump(self.slots) and not self._more_capacity_coming():
                raise RuntimeError("no rollout capacity left: every spot worker is gone, none is coming back, "
                                   "and runtime.ondemand_workers is 0")
            if ray.get(self.queue.is_done.remote(ids)):
                break
        self._trace_s += time.monotonic() - start
        return ray.get(self.queue.results.remote(ids))

    def rewards(self, parts: list[Rollout]) -> torch.Tensor:
        return ray.get(self.reward.score.remote(parts))

    def update(self, parts: list[Rollout], advantages: torch.Tensor,
               exploration: ExplorationSession | None = None) -> dict[str, float]:
        start = time.monotonic()
        ref = self.learner.update.remote(parts, advantages)
        explored = self._explore(exploration, ref, start) if exploration is not None else {}
        stats = ray.get(ref)
        if exploration is None:
            self.rate.update_s = time.monotonic() - start
        self.version += 1
        self._weights = self.learner.weights.remote()
        for slot in self.slots:
            if slot.alive:
                slot.actor.set_weights.remote(self.version, self._weights)
        return {**stats, **explored}

    def explore(self, session: ExplorationSession) -> dict[str, float]:
        """Run `session` to its end on every worker, with nothing training meanwhile (the critical-path
        exploration before a run's first rollout)."""
        return self._explore(session, None, time.monotonic())

    def _explore(self, session: ExplorationSession, update: Any | None, start: float) -> dict[str, float]:
        """Run `session`'s rounds on the idle spot workers (every worker when the run has no spot
        slots) while the learner computes `update`. A time-bounded session ends when the update
        does: what is in flight is cancelled (workers drop it at their next heartbeat), so the new
        weights go out at once. A sample-bounded one is finished first (deterministic), with every
        worker helping once the update is done. With no `update`, every worker explores at once."""
        explorers = [s for s in self.slots if s.spot] or self.slots
        session.begin(self.rate.estimate())
        requests = session.next_requests()
        ray.get(self.queue.put.remote(requests))
        updating = update is not None
        while requests:
            self._pump(explorers if updating else self.slots, [Kind.EXPLORATION])
            if updating and ray.wait([update], timeout=0)[0]:
                updating = False
                updated = time.monotonic()
                self.rate.update_s = updated - start
                if session.time_bounded:
                    session.cancelled += ray.get(self.queue.cancel.remote(Kind.EXPLORATION))
                    self._record(session, [r for r, st in zip(requests, ray.get(
                        [self.queue.status.remote(r.id) for r in requests])) if st is Status.COMPLETED])
                    break
            ids = [r.id for r in requests]
            if ray.get(self.queue.is_done.remote(ids)):
                self._record(session, requests)
                requests = session.next_requests()
                ray.get(self.queue.put.remote(requests))
            elif not any(s.alive and not s.noticed for s in self.slots):
                raise RuntimeError("no worker left to finish exploration (exploration.budget_source: samples)")
        seconds = time.monotonic() - start
        if update is None:  # all workers, not the idle ones a train phase has: not its rate
            return exploration_stats(session, seconds)
        self.rate.explored(session.samples, seconds)
        if updating:  # exploration ran out before the update did
            ray.wait([update])
            self.rate.update_s = time.monotonic() - start
            return {**exploration_stats(session, seconds), "time_publish_wait_s": 0.0}
        # How long the new weights waited for exploration after the update was done.
        return {**exploration_stats(session, seconds), "time_publish_wait_s": time.monotonic() - updated}

    def _record(self, session: ExplorationSession, requests: list[Request]) -> None:
        if requests:
            # The reward actor reads the results straight from the queue actor's reply.
            results = self.queue.results.remote([r.id for r in requests])
            session.record(requests, ray.get(self.reward.score.remote(results)))

    def save_checkpoint(self, root: Path) -> str:
        return ray.get(self.learner.save_checkpoint.remote(root))

    def save_final(self, path: Path) -> None:
        ray.get(self.learner.save_final.remote(path))

    def stats(self) -> dict[str, int]:
        return scheduler_stats(ray.get(self.queue.stats.remote()), self.preemptions, self.workers_lost)

    def shutdown(self) -> None:
        self.queue_stats = ray.get(self.queue.stats.remote())  # the queue's own counters outlive the cluster
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False
