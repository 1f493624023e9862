"""Runtimes: who executes the roles of an iteration. The controller (`trainer.Trainer`) sees only
this interface, so the local and the Ray runtime run the same loop, the same queue and the same
worker code — they differ in where the learner, rollout workers and reward worker live.

Both drive their rollout workers through the fleet engine (`schedulers.fleet.FleetEngine`), the
one place the orchestration is written; a runtime adds its executor and the other roles.

`LocalRuntime` hosts everything in this process: the pull queue, one rollout worker that shares
the learner's policy (no weight copies, `InProcessExecutor`), and the reward worker. It never sees
preemptions. It has no idle workers either: it explores (`update(..., exploration=...)`) serially
before the update, with the weights the update is about to replace — the results equal the Ray
runtime's, where exploration overlaps the update; a `train_time` budget lasts as long as the
previous update did.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from schedulers.clock import WallClock
from schedulers.fleet import FleetEngine, Node, Ready, Served, Worker, fleet_nodes
from schedulers.preemption import PreemptionNotice
from schedulers.queue import PullQueue
from schedulers.request import Kind, Request
from schedulers.update import Done, FleetUpdate
from spotlight.config import RunConfig
from spotlight.runtime.learner import Learner
from spotlight.rl.policy import Rollout
from spotlight.rl.rewards import RewardWorker, Scores
from spotlight.runtime.rollout_worker import LocalCrewMember, RolloutWorker

if TYPE_CHECKING:
    from spotlight.iteration.exploration import ExplorationSession


Progress = Callable[[dict[str, Any], dict[str, tuple[int, Any]]], None]
"""Receives a running rollout's committed state: (results by id, (step, state) by id)."""


class Runtime(Protocol):
    def build(self, checkpoints: Path) -> dict[str, Any]:
        """Start the roles; the learner resumes from `checkpoints` if it can. Returns Learner.build's info."""
        ...

    @property
    def version(self) -> int:
        """Weight version = iterations the learner has applied."""
        ...

    def rollout(self, requests: list[Request], progress: "Progress | None" = None, every_s: float = 30.0) -> Any:
        """Compute every request at the current weights; returns the results in request order, as
        the runtime holds them: a list, or a handle (Ray: an ObjectRef in the object store) that
        `rewards` and `update` take as it is — the trajectories go from the workers to the reward
        worker and the learner without passing through the controller. While it runs,
        `progress(results, partial)` gets what is committed (`PullQueue.committed`) every `every_s`
        seconds (a runtime that computes the whole rollout in one call never calls it)."""
        ...

    def fetch(self, parts: Any) -> list[Rollout]:
        """The results `rollout` returned, as a list here (to merge with results kept elsewhere)."""
        ...

    def evaluate(self, requests: list[Request]) -> Any:
        """Evaluation samples of `requests`, one result per request in order, held as `rollout`
        holds them (`rewards` and `fetch` take them). Without `train.ema_decay` it is
        `rollout(requests)`: the workers sample with the current weights. With it the learner
        samples them itself with its EMA of the weights (`Learner.evaluate`: the results carry the
        images or completions, no trajectories), and its training weights and optimiser are left
        exactly as they were. The caller `release`s the requests afterwards, as after a rollout."""
        ...

    def rewards(self, parts: list[Rollout]) -> Scores:
        """The reward of every sample of `parts` (as `rollout` or `evaluate` returned them), in order,
        with each component's scores and the time spent (`rewards.Scores`); a component that fails
        raises `rewards.RewardError`."""
        ...

    def release(self, requests: list[Request]) -> None:
        """The queue keeps the results of `requests` no longer (`PullQueue.release`): the trainer
        is done with them (an iteration's rollout after its update, an evaluation after its score)."""
        ...

    def update(self, parts: list[Rollout], advantages: torch.Tensor,
               exploration: "ExplorationSession | None" = None, on_fleet: bool = False) -> dict[str, float]:
        """One learner update, its gradient computed by the learner alone or, `on_fleet`, by the
        workers through the queue (`schedulers.update`; the controller decides:
        `spotlight.iteration.iteration_controller`). With `exploration`, the workers idle meanwhile run
        its requests with the weights they hold. The new weights go out with `publish`."""
        ...

    def publish(self) -> None:
        """Send the weights of the last update to every rollout worker (exploration still running
        with the old ones is cancelled)."""
        ...

    def explore(self, session: "ExplorationSession") -> dict[str, float]:
        """Run a critical-path exploration session (`session.critical_path`) with the current weights
        on every worker; its stats for metrics.jsonl."""
        ...

    def save_checkpoint(self, root: Path) -> str: ...

    def save_final(self, path: Path) -> None: ...

    def use_ondemand(self) -> None:
        """Fall back from spot: from now on every rollout worker runs on on-demand capacity (the
        deadline policy's one-way switch, between iterations)."""
        ...

    def stats(self) -> dict[str, int]:
        """The scheduler and preemption counters that summary.json reports."""
        ...

    def shutdown(self) -> None: ...


def gradient_split(engine: FleetEngine, queue: Any, before: dict[str, int]) -> dict[str, int]:
    """Per-iteration metrics of a fleet update: the gradients sent since `before` (the TRAIN
    completions by worker before the update: one per request, each `train.parts_per_request`
    micro-batches summed), and how many of them by spot workers (a worker is NODE.GENERATION[#j]:
    its node says)."""
    after = queue.completions_by_worker(Kind.TRAIN)
    new = {w: n - before.get(w, 0) for w, n in after.items() if n > before.get(w, 0)}
    spot = sum(n for w, n in new.items() if getattr(engine.nodes.get(w.rsplit(".", 1)[0]), "spot", False))
    return {"gradient_parts": sum(new.values()), "gradient_parts_spot": spot}


def scheduler_stats(queue_stats: dict[str, int], preemptions: int, workers_lost: int) -> dict[str, int]:
    """summary.json's counters. requests_lost: put, neither completed nor cancelled — after a
    finished run, any such request is work that vanished."""
    return {
        "preemptions": preemptions,
        "workers_lost": workers_lost,
        "requests_completed": queue_stats["requests_completed"],
        "requests_resumed": queue_stats["requests_resumed"],
        "requests_duplicated": queue_stats["requests_duplicated"],
        "requests_lost": queue_stats["requests_put"] - queue_stats["requests_completed"]
        - queue_stats["requests_cancelled"],
        "requests_interrupted": queue_stats["requests_given_back"] + queue_stats["requests_requeued"]
        + queue_stats["leases_expired"],
        "steps_recomputed": queue_stats["steps_recomputed"],
        # What restarting every preempted request from step 0 would have recomputed instead.
        "steps_recomputed_restart_baseline": queue_stats["steps_recomputed"] + queue_stats["steps_resumed"],
        # Results the queue still holds: released as the run uses them, so 0 after a whole run.
        "queue_results_held": queue_stats["results_held"],
    }


class InProcessExecutor:
    """Rollout workers in this process, one per node, all sharing one policy (no weight copies), as
    the fleet engine's executor: serving computes everything the queue has for the worker, then
    returns. `workers` holds every worker it started (a test looks at what each computed)."""

    def __init__(self, cfg: RunConfig, queue: Any, policy: Any, version: int = 0) -> None:
        self.cfg, self.queue, self.policy, self.version = cfg, queue, policy, version
        self.workers: list[RolloutWorker] = []
        self._events: list[Any] = []

    def start(self, node: Node, spot: bool) -> list[Worker]:
        worker = RolloutWorker(f"{node.name}.{node.generation}", self.cfg, self.queue, policy=self.policy,
                               commit_every=self.cfg.runtime.commit_every)
        worker.set_weights(self.version)
        self.workers.append(worker)
        w = Worker(worker.name, (node.name,), spot, handle=worker)
        self._events.append(Ready(w))
        return [w]

    def publish(self, version: int, workers: list[Worker]) -> None:
        """The shared policy holds weight version `version` now."""
        self.version = version
        for w in workers:
            w.handle.set_weights(version)

    def serve(self, worker: Worker, kinds: Any, version: int) -> bool:
        done = worker.handle.serve(kinds)
        self._events.append(Served(worker.name, noticed=done["noticed"]))
        return True

    def serve_crew(self, workers: Sequence[Worker], version: int, at_most: int | None = None) -> bool:
        lead, *members = workers
        done = lead.handle.serve([Kind.TRAIN], [LocalCrewMember(w.handle) for w in members], at_most)
        self._events.extend(Served(w.name, noticed=done["noticed"]) for w in workers)
        return True

    def changed(self, nodes: Any) -> None:
        pass

    def cancelled(self, kind: Any) -> None:
        pass

    def notify(self, worker: Worker, notice: PreemptionNotice) -> None:
        worker.handle.notify(notice)

    def stop(self, worker: Worker, lost: bool) -> None:
        pass  # nothing to end: the worker is this process

    def wait(self, until: float | None, pending: Any = ()) -> list[Any]:
        events, self._events = self._events, []
        return events


class LocalRuntime:
    """`metadata`: prompt id -> that prompt's metadata (a jsonl prompt's other fields), for the
    rewards (`RewardWorker`); None: none. One in-process reward worker, whatever `reward.workers`."""

    def __init__(self, cfg: RunConfig, metadata: Mapping[int, dict] | None = None) -> None:
        self.cfg = cfg
        self.metadata = dict(metadata or {})
        self.clock = WallClock()
        self.queue = PullQueue(self.clock, cfg.runtime.lease_s)
        self.learner = Learner(cfg)

    def build(self, checkpoints: Path) -> dict[str, Any]:
        self.reward = RewardWorker(self.cfg.reward, self.metadata)
        self.reward.build()  # a bad reward spec fails here, before the warm start
        info = self.learner.build(checkpoints)
        self.executor = InProcessExecutor(self.cfg, self.queue, self.learner.policy, self.learner.version)
        self.engine = FleetEngine(self.clock, self.queue, self.executor, fleet_nodes(1, 0))
        self.engine.start()
        return info

    @property
    def version(self) -> int:
        return self.learner.version

    def rollout(self, requests: list[Request], progress: Progress | None = None, every_s: float = 30.0) -> list[Rollout]:
        # One worker serves the whole rollout in one call: there is no mid-way state to report.
        self.engine.rollout(requests, self.version)
        return self.queue.results([r.id for r in requests])

    def fetch(self, parts: list[Rollout]) -> list[Rollout]:
        return parts

    def evaluate(self, requests: list[Request]) -> list[Rollout]:
        if not self.cfg.train.ema_decay:
            return self.rollout(requests)
        return self.learner.evaluate(requests)

    def rewards(self, parts: list[Rollout]) -> Scores:
        return self.reward.score(parts)

    def release(self, requests: list[Request]) -> None:
        self.queue.release([r.id for r in requests])

    def update(self, parts: list[Rollout], advantages: torch.Tensor,
               exploration: "ExplorationSession | None" = None, on_fleet: bool = False) -> dict[str, float]:
        explored = {}
        if exploration is not None:
            # No idle worker here: a train_time budget lasts as long as the last update took.
            rate = self.engine.rate
            until = self.clock.now() + rate.update_s if exploration.time_bounded and rate.update_s else None
            explored = self.engine.explore(exploration, self._score, self.version, until=until)
        start = self.clock.now()
        if on_fleet:  # through the queue, as on a fleet (here: one worker)
            learner, queue = self.learner, self.queue
            before = queue.completions_by_worker(Kind.TRAIN)
            update = FleetUpdate(queue, self.version, self.cfg.train.updates_per_step,
                                 learner.update_parts(parts), (parts, advantages),
                                 lambda r, ids: Done(learner.step_added(r)),
                                 weights=learner.weights, per_request=self.cfg.train.parts_per_request,
                                 add=lambda r, c, n, i: learner.add_part(r, c, n, queue.results([i], release=True)))
            self.engine.wait(update, self.version)
            stats = {**update.last_step.value, **gradient_split(self.engine, queue, before)}
        else:
            stats = self.learner.update(parts, advantages)
        self.engine.rate.update_s = self.clock.now() - start
        return {**stats, "update_on_fleet": on_fleet, **explored}

    def publish(self) -> None:
        self.executor.publish(self.learner.version, list(self.engine.workers.values()))

    def explore(self, session: "ExplorationSession") -> dict[str, float]:
        """Run `session`'s rounds with the weights held (before an update replaces them)."""
        return self.engine.explore(session, self._score, self.version)

    def _score(self, requests: list[Request]) -> torch.Tensor:
        return self.reward.score(self.queue.results([r.id for r in requests], release=True)).total  # scored once

    def save_checkpoint(self, root: Path) -> str:
        return self.learner.save_checkpoint(root)

    def save_final(self, path: Path) -> None:
        self.learner.save_final(path)

    def use_ondemand(self) -> None:
        pass  # one in-process worker, never preempted: only the cost meter changes

    def stats(self) -> dict[str, int]:
        c = self.engine.counters
        return scheduler_stats(self.queue.stats(), c["notices"], c["workers_lost"])

    def shutdown(self) -> None:
        pass
