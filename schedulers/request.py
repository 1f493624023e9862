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
    """What a request is for. Served in `rank` order: the rollout, then the update's gradient work
    (it is on the critical path: the next rollout waits for the new weights), then exploration
    (it fills what is left)."""

    ROLLOUT = 0
    EXPLORATION = 1
    TRAIN = 2
    """A chunk of the update's gradient: one micro-batch or a few summed (`GradientWork`)."""

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Kind.ROLLOUT: 0, Kind.TRAIN: 1, Kind.EXPLORATION: 2}


@dataclass(frozen=True)
class GradientWork:
    """What a `Kind.TRAIN` request computes: the `count` micro-batches from `index` on (`indices`)
    of update round `round` (one optimiser step of the iteration's update), summed in index order
    into one gradient (`train.parts_per_request`), over the iteration's rollout and advantages
    (`data`). Round 0 uses the weights of the rollout (the request's `weight_version`, which
    every worker already holds); a later round uses `weights`, the learner's weights after the
    round before. `data` and `weights` are whatever the runtime hands around: the objects
    themselves in one process, object-store references on Ray."""

    round: int
    index: int
    data: Any
    weights: Any = None
    count: int = 1

    @property
    def indices(self) -> range:
        """The micro-batches this request sums, in the order it adds them."""
        return range(self.index, self.index + self.count)


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
    work: GradientWork | None = None
    """A `Kind.TRAIN` request's chunk of micro-batches (None for every other kind)."""

    @property
    def priority(self) -> tuple[int, int]:
        return (self.kind.rank, self.order)
