"""Seed exploration on stale weights, the controller's side (docs/design.md, idea 1).

A sample's seed fixes its whole noise sequence (initial noise and every SDE step's noise; see
`seeding`), and which seeds of a prompt score high or low barely changes from one weight version to
the next. So while the learner turns θ(t) into θ(t+1), the rollout workers — idle otherwise — score
candidate seeds of iteration t+1's prompts with θ(t); iteration t+1 then rolls out, per prompt, the
G seeds whose stale rewards contrast most (GRPO learns only from the reward variance in a group).

- `Explorer` is the controller's planner state across iterations: which candidate prompts and
  seeds an iteration has (a deterministic function of (run seed, iteration)), the seed pool of the
  next iteration, the allocation planner (`planners.allocation`) and the stale-rank monitor.
- `ExplorationSession` is one train phase's exploration: rounds of exploration requests (chosen by
  the planner from the results of the rounds before), which the runtime computes on its idle
  workers and scores, until the budget is spent or new weights are published.

Determinism: with `budget_source: samples` every round is finished before the next is planned and
before the next rollout starts, so the seeds chosen — and the final weights — depend only on the
config and the seed. With `train_time` the runtime cancels what is in flight when the weights are
published; how far exploration got then depends on timing.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from cloud.bounded_json import load_file
from planners.allocation import make_planner, planner_from_dict
from planners.seed_pool import SeedPool
from planners.selection import contrast_group, group_variance, max_variance_subset
from planners.stale_rank import StaleRankMonitor
from schedulers.request import Kind, Request
from spotlight.config import RunConfig
from spotlight.rl.prompts import Prompt, draw_prompts
from spotlight.rl.seeding import generator

logger = logging.getLogger(__name__)

_FALLBACK = 0xFA11  # stream tag of the random seed choice while the stale ranking is unhealthy
MAX_STATE_BYTES = 256 << 20
"""The largest explorer state read back (256 MiB). It grows with the seed pool: at most 2**20
exploration samples an iteration (`samples_per_step`'s maximum; ~40 bytes each as [seed, reward,
version]: ~42 MB) plus the candidate seeds (~9 bytes each; 128 prompts, the largest shipped
config's, x 65,536 `candidates_per_prompt`: ~75 MB); the tiny runs write ~10 KB. A larger file is
refused unread (a ValueError) and the controller starts a fresh explorer."""


class ExplorationSession:
    """The exploration of one train phase: candidate seeds of iteration `step`'s prompts, scored
    with weight version `version` (the weights the workers hold while the learner trains)."""

    def __init__(self, explorer: "Explorer", step: int, version: int, pool: SeedPool, prompts: list[Prompt],
                 critical_path: bool = False) -> None:
        self.explorer = explorer
        self.step = step
        self.version = version
        self.critical_path = critical_path
        """True for the exploration before a run's first rollout: nothing trains meanwhile, so it is
        bounded by `samples_per_step` (there is no train time to fill) and every worker helps."""
        self.pool = pool
        self.prompts = {p.id: p for p in prompts}
        self.samples = 0
        """Exploration samples scored so far."""
        self.cancelled = 0
        """Exploration requests the runtime cancelled (weights were published first)."""
        self.budget = 0
        self._round = 0
        self._order = 0
        self._started = False

    @property
    def time_bounded(self) -> bool:
        """True when the runtime stops this session when new weights are out (not a sample count)."""
        return self.explorer.cfg.exploration.budget_source == "train_time" and not self.critical_path

    def begin(self, estimated_samples: int | None = None) -> None:
        """Start planning. `estimated_samples`: what the runtime expects its idle workers to score
        during the train phase (used by the `train_time` budget; None: not measured yet)."""
        ex, planner = self.explorer.cfg.exploration, self.explorer.planner
        if ex.planner == "random":
            self.budget = ex.monitor_seeds * len(self.prompts)
        elif self.time_bounded:
            everything = ex.candidates_per_prompt * len(self.prompts)
            self.budget = everything if estimated_samples is None else max(1, min(estimated_samples, everything))
        else:
            self.budget = ex.samples_per_step
        if planner is not None:
            planner.start(self.pool, self.explorer.cfg.train.group_size, self.budget)
        self._started = True

    def next_requests(self) -> list[Request]:
        """The next round's exploration requests; [] when this iteration's exploration is done.
        Call only after every request of the round before was recorded (or the session is over)."""
        if not self._started:
            self.begin()
        ex = self.explorer.cfg.exploration
        if self.explorer.planner is None:  # random: only the monitor's probe seeds, in one round
            alloc = {pid: ex.monitor_seeds for pid in self.prompts} if self._round == 0 else {}
        else:
            alloc = self.explorer.planner.next_round(self.pool)
        self._round += 1
        requests = []
        for pid, count in alloc.items():
            seeds = self.pool.unexplored(pid)[:count]
            for lo in range(0, len(seeds), ex.request_size):
                chunk = tuple(seeds[lo:lo + ex.request_size])
                prompt = self.prompts[pid]
                requests.append(Request(f"ex{self.step}/p{pid}/s{chunk[0]}", Kind.EXPLORATION, pid, prompt.text,
                                        chunk, weight_version=self.version, order=self._order))
                self._order += 1
        return requests

    def record(self, requests: list[Request], rewards: torch.Tensor) -> None:
        """Rewards of completed exploration requests: flat, in the order of `requests` and their seeds."""
        flat = rewards.flatten().tolist()
        i = 0
        for req in requests:
            for seed in req.seeds:
                self.pool.record(req.prompt_id, seed, float(flat[i]), self.version)
                i += 1
        if i != len(flat):
            raise ValueError(f"{len(flat)} rewards for {i} exploration samples")
        self.samples += i


def explores_first(ex: Any, step: int, start_step: int, explored: int | None = None) -> bool:
    """Whether iteration `step` begins by exploring its seeds on the critical path — the rule,
    written once (`exploration` config section `ex`): with `explore_first`, the first iteration of a
    session (`start_step`: nothing trained before it to hide exploration behind), unless the random
    planner runs (it chooses no seeds) or that iteration was `explored` already (a resumed explorer's
    saved pool)."""
    return (ex.enabled and ex.explore_first and ex.planner != "random" and step == start_step
            and explored != step)


class Explorer:
    """The planner state of a run with `exploration.enabled`."""

    def __init__(self, cfg: RunConfig, prompts: list[Prompt]) -> None:
        ex = cfg.exploration
        self.cfg = cfg
        self.prompts = prompts
        self.planner = None if ex.planner == "random" else make_planner(
            ex.planner, **({"round_samples": ex.round_samples, "chunk": max(1, cfg.train.group_size // 2),
                            "optimism": ex.optimism, "seed": cfg.seed} if ex.planner == "bandit" else {}))
        self.monitor = StaleRankMonitor(ex.stale_rank_threshold)
        self.pool: SeedPool | None = None
        """Seeds explored for iteration `pool_step`."""
        self.pool_step = -1

    # ---- what an iteration may use ---------------------------------------------------------------

    def candidate_prompts(self, step: int) -> list[Prompt]:
        """Iteration `step`'s candidate prompts: `prompt_candidates` per rollout prompt (the random
        planner does not choose prompts, so it draws only the rollout's)."""
        ex, n = self.cfg.exploration, self.cfg.train.prompts_per_step
        k = n if ex.planner == "random" else n * ex.prompt_candidates
        return draw_prompts(self.prompts, k, self.cfg.seed, step)

    def candidate_seeds(self, step: int) -> list[int]:
        """Iteration `step`'s candidate seeds (the same numbers for every prompt: a sample's noise is
        keyed by its prompt too). Fresh every iteration, so no seed is trained on twice."""
        c = self.cfg.exploration.candidates_per_prompt
        return [step * c + k for k in range(c)]

    def session(self, step: int, version: int, critical_path: bool = False) -> ExplorationSession:
        """Exploration of iteration `step`'s candidates with weight version `version`."""
        prompts = self.candidate_prompts(step)
        seeds = self.candidate_seeds(step)
        self.pool = SeedPool({p.id: seeds for p in prompts})
        self.pool_step = step
        return ExplorationSession(self, step, version, self.pool, prompts, critical_path)

    def first_session(self, step: int, version: int) -> ExplorationSession | None:
        """The critical-path exploration of a run's first iteration `step` (`explore_first`), when
        nothing explored it during a train phase before; None when there is nothing to do."""
        if not explores_first(self.cfg.exploration, step, step, self.pool_step):
            return None
        return self.session(step, version, critical_path=True)

    # ---- choosing the rollout ---------------------------------------------------------------------

    def plan(self, step: int) -> list[Request]:
        """Iteration `step`'s rollout requests: its prompts and, per prompt, G seeds — the most
        contrasting explored ones, or random ones (no exploration for this iteration yet, the random
        planner, or the stale ranking is unhealthy)."""
        g, n = self.cfg.train.group_size, self.cfg.train.prompts_per_step
        candidates = self.candidate_prompts(step)
        pool = self.pool if self.pool_step == step else None
        choose = pool is not None and self.planner is not None and self.monitor.healthy
        if choose and len(candidates) > n:
            # Prompts whose stale groups can vary most first (a prompt the stale weights always or
            # never solve has none); the rollout keeps them in draw order.
            score = {p.id: self._selectable_variance(pool, p.id) for p in candidates}
            keep = sorted(range(len(candidates)), key=lambda i: (-score[candidates[i].id], i))[:n]
            prompts = [candidates[i] for i in sorted(keep)]
        else:
            prompts = candidates[:n]
        requests = []
        for i, p in enumerate(prompts):
            seeds = self._seeds(pool, step, p.id, choose) if pool is not None else self.candidate_seeds(step)[:g]
            requests.append(Request(f"it{step}/p{p.id}", Kind.ROLLOUT, p.id, p.text, tuple(seeds),
                                    weight_version=step, order=i))
        return requests

    def _selectable_variance(self, pool: SeedPool, prompt_id: int) -> float:
        rewards = list(pool.rewards(prompt_id).values())
        g = min(self.cfg.train.group_size, len(rewards))
        return group_variance([rewards[i] for i in max_variance_subset(rewards, g)]) if g >= 2 else 0.0

    def _seeds(self, pool: SeedPool, step: int, prompt_id: int, choose: bool) -> list[int]:
        g = self.cfg.train.group_size
        explored = [o.seed for o in pool.observations(prompt_id)]
        fresh = pool.unexplored(prompt_id)
        if choose:  # the contrasting explored seeds, topped up with fresh ones
            rewards = [o.reward for o in pool.observations(prompt_id)]
            kept = [explored[i] for i in contrast_group(rewards, g, len(fresh), self.monitor.min_pairs)]
            return kept + fresh[:g - len(kept)]
        if len(explored) > g:  # random among the explored, so the monitor can still measure
            order = torch.randperm(len(explored), generator=generator(self.cfg.seed, step, prompt_id, _FALLBACK))
            return sorted(explored[i] for i in order[:g].tolist())
        return explored + fresh[:g - len(explored)]

    def observe(self, step: int, requests: list[Request], rewards: torch.Tensor) -> dict[str, Any]:
        """After iteration `step`'s rollout: feed the planner the fresh group rewards and the monitor
        the (stale, fresh) reward pairs of seeds that were explored. Returns metrics for the row."""
        g = self.cfg.train.group_size
        pool = self.pool if self.pool_step == step else None
        groups = []
        for i, req in enumerate(requests):
            fresh = rewards[i * g:(i + 1) * g].tolist()
            if self.planner is not None:
                self.planner.observe_group(req.prompt_id, fresh)
            if pool is not None:
                # Only rewards of older weights say how stale ranks hold (not a critical-path pass).
                stale = {o.seed: o.reward for o in pool.observations(req.prompt_id) if o.version < req.weight_version}
                pairs = [(stale[s], r) for s, r in zip(req.seeds, fresh) if s in stale]
                if pairs:
                    groups.append(([a for a, _ in pairs], [b for _, b in pairs]))
        spearman = self.monitor.observe(groups)
        if self.monitor.message:  # set only when the health state changed
            logger.info(f"iteration {step}: {self.monitor.message}")
        return {"stale_rank_spearman": spearman, "exploration_fallback": not self.monitor.healthy,
                "explored_for_this_step": pool.total_explored() if pool is not None else 0}

    # ---- checkpoints ------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        return {"pool_step": self.pool_step, "pool": self.pool.to_dict() if self.pool is not None else None,
                "planner": self.planner.to_dict() if self.planner is not None else None,
                "monitor": self.monitor.to_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.pool_step = state["pool_step"]
        self.pool = SeedPool.from_dict(state["pool"]) if state["pool"] is not None else None
        if self.planner is not None and state["planner"] is not None:
            self.planner = planner_from_dict(state["planner"])
        self.monitor = StaleRankMonitor.from_dict(state["monitor"])

    def save(self, folder: Path, step: int, keep: int = 2) -> Path:
        """Write the state that iteration `step` starts from (atomically; keeps the newest `keep`)."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"step-{step:06d}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state()))
        tmp.replace(path)
        for old in sorted(folder.glob("step-*.json"))[:-keep]:
            old.unlink()
        return path

    def load(self, folder: Path, step: int) -> bool:
        """Load the state saved for iteration `step`; False if there is none. A state that is not
        one raises ValueError (over `MAX_STATE_BYTES`, nested deeper than 64 levels, not JSON:
        `cloud.bounded_json`), KeyError, TypeError, ...: the controller then starts afresh."""
        path = folder / f"step-{step:06d}.json"
        if not path.is_file():
            return False
        self.load_state(load_file(path, max_bytes=MAX_STATE_BYTES))
        return True
