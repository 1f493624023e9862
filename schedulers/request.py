"""A unit of schedulable work and its resumable state.

A `Request` is one group: G samples of one prompt with fixed seeds, at one weight version. The
group is also the batch it is computed in, whoever computes it, which keeps results bit-identical
across workers. `state` is the last committed partial state (opaque to the scheduler; for a DiT a
`SampleState` with latent trajectory, step and log-probs — the generator state at a step boundary
is a function of the step); `step` is the denoising step that state has reached. Requests are
immutable values: committing progress makes a new one with `dataclasses.replace`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any


class Kind(IntEnum):
    """What a request is for; the lower value is served first (rollout outranks exploration)."""

    ROLLOUT = 0
    EXPLORATION = 1


@dataclass(frozen=True)
class Request:
    id: str
    """Unique and deterministic (e.g. "it3/p5"): commits are idempotent by id."""
    kind: Kind
    prompt_id: int
    prompt_text: str
    seeds: tuple[int, ...]
    weight_version: int
    """The weights this request must be computed with (the iteration that created it)."""
    order: int = 0
    """Tie-break within a kind: lower is served first (keeps pulls deterministic in tests)."""
    state: Any = None
    """Last committed partial state; None means start from scratch."""
    step: int = 0
    """Denoising steps the committed state has completed (0 with no state)."""

    @property
    def priority(self) -> tuple[int, int]:
        return (int(self.kind), self.order)
