"""An update's gradient, computed in micro-batches anywhere and summed in one fixed tree.

Whoever computes micro-batch i — the learner itself, or a spot worker that pulled it as a
`Kind.TRAIN` request — computes it the same way (`part_gradient`: gradients zeroed, one
`Policy.backward_part`, the gradients taken out). The micro-batches are summed in one fixed tree
(`GradientSum`): consecutive chunks of k = `train.parts_per_request` (`schedulers.update.chunks`),
each folded left in index order (`fold_parts`: first + second + ...), then the chunk sums
folded in chunk order, whatever order they arrive in. On the fleet a node computes a chunk — its
crew of GPUs a share of the micro-batches each, the crew's lead folding them in index order — and
sends its sum (one transfer per chunk); the learner alone computes the same chunks in the same
tree. Floating-point addition is not associative, so a fixed tree is what makes the sum, hence the
weights, independent of who computed what: an update spread over a fleet with preemptions ends
bit-identical to one the learner computed alone with the same k (tests/spotlight/runtime/test_fleet_update.py).
With k = 1 every chunk is one micro-batch and the tree is the plain fold in index order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from schedulers.update import chunks
from spotlight.rl.policy import Policy, Rollout, sum_stats

Gradients = dict[str, torch.Tensor]
"""Parameter name -> gradient, for the trainable parameters a micro-batch reached."""


def part_gradient(policy: Policy, rollout: Rollout, advantages: torch.Tensor, index: int,
                  device: str | None = None) -> tuple[Gradients, dict[str, float]]:
    """Micro-batch `index`'s gradient (on `device`, default where the parameters are) and stats;
    the model's own gradients are left empty."""
    model = policy.model
    model.zero_grad(set_to_none=True)
    stats = policy.backward_part(rollout, advantages, index)
    grads = {name: p.grad.detach().to(device) if device else p.grad.detach()
             for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads, stats


def fold_parts(parts: Iterable[tuple[Gradients, dict[str, float]]],
               device: str | None = None) -> tuple[Gradients, dict[str, float]]:
    """Micro-batch gradients folded left in the order given (first + second + ...), where the first
    part's tensors are, then moved to `device` (one transfer: what a node sends), and their stats
    summed in the same order; one part's are returned unchanged. A part's tensors are its own
    (`part_gradient` makes fresh ones): the first is added into, not copied. Addition is the same
    correctly rounded operation on every device, so where a part was computed or is added never
    changes a bit; only the order does. Holds one gradient besides the part in hand: the running sum."""
    total: Gradients = {}
    stats = []
    for grads, part_stats in parts:
        for name, g in grads.items():
            if name in total:
                total[name] += g.to(total[name].device)
            else:
                total[name] = g
        stats.append(part_stats)
    if not stats:
        raise ValueError("a chunk has at least one micro-batch")
    if device:
        total = {name: g.to(device) for name, g in total.items()}
    return total, stats[0] if len(stats) == 1 else sum_stats(stats)


def chunk_gradient(policy: Policy, rollout: Rollout, advantages: torch.Tensor, indices: Sequence[int],
                   device: str | None = None) -> tuple[Gradients, dict[str, float]]:
    """The sum of micro-batches `indices`' gradients, each computed here in turn and folded left in
    the order given where the parameters are (`fold_parts`), then moved to `device`. One index:
    `part_gradient`'s, unchanged. A node's crew folds the same parts, computed by several of its
    GPUs, in the same order (`spotlight.runtime.rollout_worker`): the same bits."""
    return fold_parts((part_gradient(policy, rollout, advantages, i) for i in indices), device)


class GradientSum:
    """The sum of an update's `parts` micro-batch gradients in the fixed tree (module docstring):
    `chunk` consecutive micro-batches per chunk (`ranges`), each chunk's sum (`chunk_gradient`)
    added in chunk order as they come in."""

    def __init__(self, parts: int, chunk: int = 1) -> None:
        if parts < 1:
            raise ValueError(f"an update has at least one micro-batch, got {parts}")
        self.parts = parts
        self.ranges = chunks(parts, chunk)
        """The micro-batches of each chunk, in chunk order."""
        self.added = 0
        """Chunks added so far (in chunk order)."""
        self.grads: Gradients = {}
        self._stats: list[dict[str, float]] = []
        self._early: dict[int, tuple[Gradients, dict[str, float]]] = {}
        """Chunks that came in before one of a lower index: held until it does."""

    @property
    def complete(self) -> bool:
        return self.added == len(self.ranges)

    def add(self, index: int, grads: Gradients, stats: dict[str, float]) -> None:
        """Chunk `index`'s sum (with one micro-batch per chunk: micro-batch `index`'s gradient)."""
        if not self.added <= index < len(self.ranges) or index in self._early:
            raise ValueError(f"chunk {index} of {len(self.ranges)} added twice or out of range")
        self._early[index] = (grads, stats)
        while self.added in self._early:
            grads, stats = self._early.pop(self.added)
            for name, g in grads.items():
                if name in self.grads:
                    self.grads[name] += g.to(self.grads[name].device)
                else:
                    self.grads[name] = g.clone()
            self._stats.append(stats)
            self.added += 1

    def stats(self) -> dict[str, float]:
        return sum_stats(self._stats)

    def apply_to(self, model: torch.nn.Module) -> None:
        """Make the sum the model's gradients (before the optimiser steps)."""
        if not self.complete:
            raise RuntimeError(f"the update has {self.added} of its {len(self.ranges)} chunks of micro-batches")
        for name, p in model.named_parameters():
            g = self.grads.get(name)
            p.grad = None if g is None else g.to(device=p.device, dtype=p.dtype)
