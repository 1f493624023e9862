"""Runtimes: who executes the roles of an iteration. The controller (`trainer.Trainer`) sees only
this interface, so the local and the Ray runtime run the same loop, the same queue and the same
worker code — they differ in where the learner, rollout workers and reward worker live.

`LocalRuntime` hosts everything in this process: the pull queue, one rollout worker that shares
the learner's policy (no weight copies), and the reward worker. It never sees preemptions. It has
no idle workers either: it explores (`update(..., exploration=...)`) serially before the update,
with the weights the update is about to replace — the results equal the Ray runtime's, where
exploration overlaps the update; a `train_time` budget lasts as long as the previous update did.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from schedulers.clock import WallClock
from schedulers.queue import PullQueue
from schedulers.request import Request
from spotlight.config import RunConfig
from spotlight.learner import Learner
from spotlight.policy import Rollout
from spotlight.rewards import RewardWorker
from spotlight.rollout_worker import RolloutWorker

if TYPE_CHECKING:
    from spotlight.exploration import ExplorationSession


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

    def rollout(self, requests: list[Request], progress: "Progress | None" = None, every_s: float = 30.0) -> list[Rollout]:
        """Compute every request at the current weights; results in request order. While it runs,
        `progress(results, partial)` gets what is committed (`PullQueue.committed`) every `every_s`
        seconds (a runtime that computes the whole rollout in one call never calls it)."""
        ...

    def rewards(self, parts: list[Rollout]) -> torch.Tensor: ...

    def update(self, parts: list[Rollout], advantages: torch.Tensor,
               exploration: "ExplorationSession | None" = None) -> dict[str, float]:
        """One learner update; the new weights are published to the rollout workers. With
        `exploration`, the workers idle meanwhile run its requests with the weights they hold."""
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
    }


class ExplorationRate:
    """What the runtime measured of its last train phases, to size a `train_time` budget: the
    update's seconds and the exploration samples scored per second by all idle workers together."""

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


def exploration_stats(session: "ExplorationSession", seconds: float) -> dict[str, float]:
    """The exploration part of an update's stats (metrics.jsonl)."""
    return {"explored_samples": session.samples, "explore_cancelled": session.cancelled,
            "explore_budget": session.budget, "time_explore_s": seconds}


class LocalRuntime:
    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.queue = PullQueue(WallClock(), cfg.runtime.lease_s)
        self.learner = Learner(cfg)
        self.rate = ExplorationRate()

    def build(self, checkpoints: Path) -> dict[str, Any]:
        info = self.learner.build(checkpoints)
        self.worker = RolloutWorker("local", self.cfg, self.queue, policy=self.learner.policy,
                                    commit_every=self.cfg.runtime.commit_every)
        self.worker.set_weights(self.learner.version)
        self.reward = RewardWorker(self.cfg.reward)
        return info

    @property
    def version(self) -> int:
        return self.learner.version

    def rollout(self, requests: list[Request], progress: Progress | None = None, every_s: float = 30.0) -> list[Rollout]:
        # One worker serves the whole rollout in this call: there is no mid-way state to report.
        self.queue.put(requests)
        self.worker.serve()
        return self.queue.results([r.id for r in requests])

    def rewards(self, parts: list[Rollout]) -> torch.Tensor:
        return self.reward.score(parts)

    def update(self, parts: list[Rollout], advantages: torch.Tensor,
               exploration: "ExplorationSession | None" = None) -> dict[str, float]:
        explored = self.explore(exploration) if exploration is not None else {}
        start = time.perf_counter()
        stats = self.learner.update(parts, advantages)
        self.rate.update_s = time.perf_counter() - start
        self.worker.set_weights(self.learner.version)
        return {**stats, **explored}

    def explore(self, session: "ExplorationSession") -> dict[str, float]:
        """Run `session`'s rounds with the weights held (before an update replaces them)."""
        start = time.perf_counter()
        session.begin(self.rate.estimate())
        # No idle worker here: a train_time budget lasts as long as the last update took.
        deadline = start + self.rate.update_s if session.time_bounded and self.rate.update_s else math.inf
        while time.perf_counter() < deadline:
            requests = session.next_requests()
            if not requests:
                break
            parts = self.rollout(requests)
            session.record(requests, self.rewards(parts))
        seconds = time.perf_counter() - start
        if not session.critical_path:
            self.rate.explored(session.samples, seconds)
        return exploration_stats(session, seconds)

    def save_checkpoint(self, root: Path) -> str:
        return self.learner.save_checkpoint(root)

    def save_final(self, path: Path) -> None:
        self.learner.save_final(path)

    def use_ondemand(self) -> None:
        pass  # one in-process worker, never preempted: only the cost meter changes

    def stats(self) -> dict[str, int]:
        return scheduler_stats(self.queue.stats(), 0, 0)

    def shutdown(self) -> None:
        pass
