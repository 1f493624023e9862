"""An update's gradient, computed in micro-batches anywhere and summed in one fixed order.

Whoever computes micro-batch i — the learner itself, or a spot worker that pulled it as a
`Kind.TRAIN` request — computes it the same way (`part_gradient`: gradients zeroed, one
`Policy.backward_part`, the gradients taken out), and the learner adds the parts up in index order
(`GradientSum`), whatever order they arrive in. Floating-point addition is not associative, so a
fixed order is what makes the sum, hence the weights, independent of who computed what: an update
spread over a fleet with preemptions ends bit-identical to one the learner computed alone.
"""

from __future__ import annotations

import torch

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


class GradientSum:
    """The sum of an update's `parts` micro-batch gradients, added in index order as they come in."""

    def __init__(self, parts: int) -> None:
        if parts < 1:
            raise ValueError(f"an update has at least one micro-batch, got {parts}")
        self.parts = parts
        self.added = 0
        self.grads: Gradients = {}
        self._stats: list[dict[str, float]] = []
        self._early: dict[int, tuple[Gradients, dict[str, float]]] = {}
        """Parts that came in before one of a lower index: held until it does."""

    @property
    def complete(self) -> bool:
        return self.added == self.parts

    def add(self, index: int, grads: Gradients, stats: dict[str, float]) -> None:
        if not self.added <= index < self.parts or index in self._early:
            raise ValueError(f"micro-batch {index} of {self.parts} added twice or out of range")
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
            raise RuntimeError(f"the update has {self.added} of its {self.parts} micro-batches")
        for name, p in model.named_parameters():
            g = self.grads.get(name)
            p.grad = None if g is None else g.to(device=p.device, dtype=p.dtype)
