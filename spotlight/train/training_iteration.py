"""What each phase of a training iteration does on a runtime: the `IterationWork` of
`spotlight train` (`spotlight.iteration.iteration_controller` orders the phases and places the
update; the simulator's counterpart is `spotlight.sim.simulated_iteration.SimulatedIteration`).

State passes from phase to phase on the object: the requests, the rollout's results as the runtime
holds them, the scores, the advantages and the metrics row.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Protocol

from cloud.cost import CostControl
from schedulers.request import Request
from spotlight.config import RunConfig
from spotlight.iteration.exploration import Explorer
from spotlight.iteration.iteration_controller import IterationController
from spotlight.rl.grpo import group_advantages, group_std, informative_groups
from spotlight.runtime.protocol import Runtime


class TrainingRun(Protocol):
    """What a training iteration's phases use of the run they belong to (`spotlight.train.trainer.Trainer`)."""

    cfg: RunConfig
    runtime: Runtime
    explorer: Explorer | None
    controller: IterationController
    cost: CostControl
    out: Path
    """The run folder (metrics.jsonl)."""
    started: float
    """When this session's iterations started (`time.perf_counter`)."""

    def requests(self, step: int) -> list[Request]:
        """Iteration `step`'s rollout requests (without an explorer)."""
        ...

    def rollout(self, step: int, requests: list[Request]) -> Any:
        """The rollout of `requests`, resumed from the in-flight store when it holds some."""
        ...

    def evaluate(self, step: int) -> dict[str, Any]:
        """Score the weights of iteration `step` on the evaluation prompts; their metrics."""
        ...

    def checkpoint(self, done: int) -> None:
        """Checkpoint the weights after `done` iterations."""
        ...


class TrainingIteration:
    def __init__(self, trainer: TrainingRun, step: int) -> None:
        """`trainer`: the run whose iteration `step` this is (its runtime, explorer, controller and
        run folder)."""
        self.trainer, self.step = trainer, step
        self.started = time.perf_counter()
        self.requests: list[Any] = []
        self.parts: Any = None
        self.scores: Any = None
        self.rewards: Any = None
        self.advantages: Any = None
        self.stats: dict[str, Any] = {}
        """What the phases report for the metrics row, in the order they ran."""
        self.row: dict[str, Any] | None = None
        self.checkpoint_s: float | None = None

    def explore_first(self, step: int) -> None:
        # Nothing trained before this iteration to hide its exploration behind.
        tr = self.trainer
        session = tr.explorer.first_session(step, tr.runtime.version)
        done = tr.runtime.explore(session) if session is not None else {"explored_samples": 0}
        self.stats["explored_first_samples"] = done["explored_samples"]

    def eval(self, step: int) -> None:
        self.stats.update(self.trainer.evaluate(step))

    def rollout(self, step: int) -> None:
        tr = self.trainer
        self.requests = tr.explorer.plan(step) if tr.explorer is not None else tr.requests(step)
        self.parts = tr.rollout(step, self.requests)

    def reward(self, step: int) -> None:
        tr = self.trainer
        self.scores = tr.runtime.rewards(self.parts)
        self.rewards = self.scores.total.float()
        if tr.explorer is not None:
            self.stats.update(tr.explorer.observe(step, self.requests, self.rewards))

    def advantage(self, step: int) -> None:
        cfg, g = self.trainer.cfg, self.trainer.cfg.train.group_size
        self.advantages = group_advantages(self.rewards, g, cfg.grpo.adv_eps, cfg.grpo.adv_clip)
        if not cfg.grpo.drop_zero_advantage_groups:
            return
        keep = informative_groups(self.advantages, g)
        self.stats["groups_dropped"] = len(self.advantages) // g - len(keep)
        if self.stats["groups_dropped"]:
            # One result per request, a request per prompt's group. On Ray the results come
            # through the controller here (they otherwise go from the queue to the learner).
            results = self.trainer.runtime.fetch(self.parts)
            assert len(results) * g == len(self.advantages), \
                f"{len(results)} rollout results for {len(self.advantages) // g} groups"
            self.parts = [results[i] for i in keep]
            self.advantages = self.advantages.view(-1, g)[keep].flatten()

    def update(self, step: int, on_fleet: bool) -> None:
        tr = self.trainer
        rt, ex = tr.runtime, tr.explorer
        # While the learner trains, idle workers explore the next iteration's seeds with these
        # weights — after the last iteration too: a run extended later (--steps) resumes with them.
        session = ex.session(step + 1, rt.version) if ex is not None else None
        self.stats.update(rt.update(self.parts, self.advantages, session, on_fleet))
        rt.release(self.requests)  # the update has used them: the queue must not keep every iteration's

    def publish(self, step: int) -> None:
        self.trainer.runtime.publish()

    def record(self, step: int) -> None:
        """The metrics row, written (and synced) before the checkpoint that covers its iteration: a
        kill between the two resumes from the previous checkpoint, which drops the row and redoes
        the iteration."""
        tr = self.trainer
        g, rewards = tr.cfg.train.group_size, self.rewards
        seconds = tr.controller.last.seconds
        self.row = {
            "step": step,
            "reward_mean": rewards.mean().item(),
            "reward_std": rewards.std(unbiased=False).item(),
            **self.scores.component_stats(),  # reward_<label>_mean, reward_<label>_std
            "group_reward_std": group_std(rewards, g).mean().item(),
            "samples": len(rewards),
            "explored_samples": 0,
            "stale_rank_spearman": None,
            **self.stats,
            "phases": tr.controller.plan(step),
            **{f"time_{k}_s": v for k, v in seconds.items()},
            "time_reward_score_s": self.scores.seconds,
            # Inside the rollout phase, added over its requests (a DiT: time_encode_s, time_decode_s).
            **{f"time_{k}_s": v for k, v in self.scores.rollout_seconds.items()},
            "wall_s": time.perf_counter() - self.started,
            "elapsed_s": time.perf_counter() - tr.started,
            "cost_usd": tr.cost.spent_usd(),
        }
        with open(tr.out / "metrics.jsonl", "a") as metrics:
            metrics.write(json.dumps(self.row) + "\n")
            metrics.flush()
            os.fsync(metrics.fileno())

    def checkpoint(self, step: int) -> None:
        start = time.perf_counter()
        self.trainer.checkpoint(step + 1)
        self.checkpoint_s = time.perf_counter() - start
