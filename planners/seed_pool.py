"""The seed pool: the candidate seeds of one iteration's prompts and the rewards seen for them.

A seed fixes a sample's whole noise sequence, so (prompt, seed, weight version) fixes its reward.
Explorers score candidate seeds with stale weights while the trainer trains (docs/design.md, idea 1);
the pool collects those scores for the planner and for the final seed selection.

Invariants:
- a prompt's candidates are distinct and keep their given order; every query answers in it;
- a prompt holds at most one observation per seed, and it is never replaced by one from older
  weights (a late result from a slow explorer cannot overwrite a fresher score).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Observation:
    """`seed` scored `reward` under weight version `version`."""

    seed: int
    reward: float
    version: int


class SeedPool:
    """Candidate seeds per prompt (prompt_id -> seeds, in order) and one observation per seed."""

    def __init__(self, candidates: Mapping[int, Sequence[int]]) -> None:
        self._candidates: dict[int, list[int]] = {}
        self._position: dict[int, dict[int, int]] = {}
        """prompt_id -> seed -> index in its candidates (observations are kept in this order)."""
        self._observed: dict[int, dict[int, Observation]] = {}
        for prompt_id, seeds in candidates.items():
            prompt_id = _as_int(prompt_id, "prompt id")
            if prompt_id in self._candidates:
                raise ValueError(f"prompt {prompt_id} is given twice")
            seeds = [_as_int(s, f"candidate seed of prompt {prompt_id}") for s in seeds]
            position = {seed: i for i, seed in enumerate(seeds)}
            if len(position) != len(seeds):
                repeated = sorted({s for s in seeds if seeds.count(s) > 1})
                raise ValueError(f"prompt {prompt_id} lists candidate seeds more than once: {repeated}")
            self._candidates[prompt_id] = seeds
            self._position[prompt_id] = position
            self._observed[prompt_id] = {}

    @property
    def prompt_ids(self) -> list[int]:
        """The prompts, in insertion order."""
        return list(self._candidates)

    def candidates(self, prompt_id: int) -> list[int]:
        return list(self._candidates[self._known(prompt_id)])

    def record(self, prompt_id: int, seed: int, reward: float, version: int) -> bool:
        """Store `seed`'s `reward` under weight `version`; returns whether it was stored.

        An existing observation of the seed is replaced only by one from the same or newer weights.
        """
        position = self._position[self._known(prompt_id)]
        if seed not in position:
            raise ValueError(f"seed {seed} is not a candidate of prompt {prompt_id}")
        reward = float(reward)
        version = _as_int(version, "weight version")
        if not math.isfinite(reward):
            raise ValueError(f"reward of prompt {prompt_id}, seed {seed} must be finite, got {reward}")
        observed = self._observed[prompt_id]
        old = observed.get(seed)
        if old is not None and version < old.version:
            return False
        observed[seed] = Observation(int(seed), reward, version)
        return True

    def observations(self, prompt_id: int) -> list[Observation]:
        """The prompt's observations, in candidate order."""
        observed = self._observed[self._known(prompt_id)]
        return [observed[s] for s in self._candidates[prompt_id] if s in observed]

    def rewards(self, prompt_id: int) -> dict[int, float]:
        """seed -> reward of the prompt's observed seeds, in candidate order."""
        return {o.seed: o.reward for o in self.observations(prompt_id)}

    def unexplored(self, prompt_id: int) -> list[int]:
        """The prompt's candidate seeds without an observation, in candidate order."""
        observed = self._observed[self._known(prompt_id)]
        return [s for s in self._candidates[prompt_id] if s not in observed]

    def explored_count(self, prompt_id: int) -> int:
        return len(self._observed[self._known(prompt_id)])

    def total_explored(self) -> int:
        return sum(len(observed) for observed in self._observed.values())

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable state; `from_dict` restores it exactly."""
        return {
            "candidates": {str(p): list(seeds) for p, seeds in self._candidates.items()},
            "observations": {
                str(p): [[o.seed, o.reward, o.version] for o in self.observations(p)]
                for p in self._candidates
            },
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SeedPool:
        pool = cls({int(p): seeds for p, seeds in d["candidates"].items()})
        for p, rows in d.get("observations", {}).items():
            for seed, reward, version in rows:
                pool.record(int(p), int(seed), float(reward), int(version))
        return pool

    def _known(self, prompt_id: int) -> int:
        if prompt_id not in self._candidates:
            raise KeyError(f"prompt {prompt_id} is not in this seed pool")
        return prompt_id


def _as_int(value: Any, what: str) -> int:
    """`value` as a Python int (numpy integers included); bools and non-integers are rejected."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    return int(value.__index__())
