"""The one door between the controller and a runtime: what `spotlight.train.trainer.Trainer` (and
`spotlight.train.training_iteration`) may ask of the local runtime (`spotlight.runtime.local`) and the
Ray runtime (`spotlight.runtime.ray_runtime`). Nothing outside a runtime reaches past this protocol
(`tests/spotlight/runtime/test_runtime_protocol.py` checks that both runtimes declare every member and that no caller
uses another)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from cloud.cost import Fleet
from schedulers.fleet import FleetEngine
from schedulers.request import Request
from spotlight.iteration.exploration import ExplorationSession
from spotlight.rl.policy import Rollout
from spotlight.rl.rewards import Scores


Progress = Callable[[dict[str, Any], dict[str, tuple[int, Any]]], None]
"""Receives a running rollout's committed state: (results by id, (step, state) by id)."""


class Runtime(Protocol):
    engine: FleetEngine
    """The fleet engine that drives the rollout workers (after `build`): the controller asks it
    `before_iteration` (the cost control's decision) and reads its counters for the status."""

    def build(self, checkpoints: Path) -> dict[str, Any]:
        """Start the roles (logging what it waits for, `spotlight.waiting`); the learner resumes
        from `checkpoints` if it can. Returns Learner.build's info."""
        ...

    def watch_fleet(self, paid: Callable[[Fleet], None]) -> None:
        """After `build`: call `paid(fleet)` with what the run's nodes cost now and whenever they
        change — on a joined cluster, whose nodes come and go; a runtime whose fleet is the
        configured one never calls it (the cost meter prices the configured fleet)."""
        ...

    @property
    def version(self) -> int:
        """Weight version = iterations the learner has applied."""
        ...

    def rollout(self, requests: list[Request], progress: Progress | None = None, every_s: float = 30.0) -> Any:
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
               exploration: ExplorationSession | None = None, on_fleet: bool = False) -> dict[str, float]:
        """One learner update, its gradient computed by the learner alone or, `on_fleet`, by the
        workers through the queue (`schedulers.update`; the controller decides:
        `spotlight.iteration.iteration_controller`). With `exploration`, the workers idle meanwhile run
        its requests with the weights they hold. The new weights go out with `publish`."""
        ...

    def publish(self) -> None:
        """Send the weights of the last update to every rollout worker (exploration still running
        with the old ones is cancelled)."""
        ...

    def explore(self, session: ExplorationSession) -> dict[str, float]:
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
