"""The local runtime: every role of an iteration in this process. The controller
(`spotlight.train.trainer.Trainer`) sees only the `Runtime` protocol (`spotlight.runtime.protocol`),
so the local and the Ray runtime run the same loop, the same queue and the same worker code — they
differ in where the learner, rollout workers and reward worker live.

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

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from cloud.cost import Fleet
from schedulers.clock import WallClock
from schedulers.fleet import FleetEngine, Node, Ready, Served, Worker, fleet_nodes
from schedulers.preemption import PreemptionNotice
from schedulers.queue import PullQueue
from schedulers.request import Kind, Request
from schedulers.update import Done, FleetUpdate
from spotlight.config import RunConfig
from spotlight.runtime.learner import Learner
from spotlight.runtime.learner_group import LearnerGroup
from spotlight.rl.policy import Rollout
from spotlight.rl.rewards import RewardWorker, Scores
from spotlight.runtime.protocol import Progress
from spotlight.runtime.rollout_worker import LocalCrewMember, RolloutWorker
from spotlight.iteration.exploration import ExplorationSession
from spotlight.waiting import waiting

logger = logging.getLogger(__name__)


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
        # A full fine-tune sharded over several learner processes, or the learner in this process.
        self.learner: Learner | LearnerGroup = LearnerGroup(cfg) if cfg.train.learner_gpus > 1 else Learner(cfg)

    def build(self, checkpoints: Path) -> dict[str, Any]:
        # Loading a real model folder is minutes of nothing on the terminal otherwise.
        with waiting("loading the model for the learner and the workers (in this process)"):
            self.reward = RewardWorker(self.cfg.reward, self.metadata)
            self.reward.build()  # a bad reward spec fails here, before the warm start
            info = self.learner.build(checkpoints)
        self.executor = InProcessExecutor(self.cfg, self.queue, self.learner.policy, self.learner.version)
        self.engine = FleetEngine(self.clock, self.queue, self.executor, fleet_nodes(1, 0))
        self.engine.start()
        return info

    def watch_fleet(self, paid: Callable[[Fleet], None]) -> None:
        pass  # the configured fleet: one in-process worker, priced by the meter as configured

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
               exploration: ExplorationSession | None = None, on_fleet: bool = False) -> dict[str, float]:
        learner, queue = self.learner, self.queue
        before = queue.completions_by_worker(Kind.TRAIN) if on_fleet else {}  # for `gradient_split`

        def start() -> FleetUpdate | Done:
            if not on_fleet:
                return Done(learner.update(parts, advantages))
            # through the queue, as on a fleet (here: one worker)
            return FleetUpdate(queue, self.version, self.cfg.train.updates_per_step,
                               learner.update_parts(parts), (parts, advantages),
                               lambda r, ids: Done(learner.step_added(r)),
                               weights=learner.weights, per_request=self.cfg.train.parts_per_request,
                               add=lambda r, c, n, i: learner.add_part(r, c, n, queue.results([i], release=True)))

        # No idle worker here: exploration runs before the update, with the weights it replaces.
        update, explored = self.engine.update(start, self.version, exploration, self._score, serial=True)
        if isinstance(update, FleetUpdate):
            stats = {**update.last_step.value, **gradient_split(self.engine, queue, before)}
        else:
            stats = update.value
        return {**stats, "update_on_fleet": on_fleet, **explored}

    def publish(self) -> None:
        self.executor.publish(self.learner.version, list(self.engine.workers.values()))

    def explore(self, session: ExplorationSession) -> dict[str, float]:
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
        if isinstance(self.learner, LearnerGroup):
            self.learner.close()  # its processes
