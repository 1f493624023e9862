"""The Policy protocol: what the training loop needs from a DiT or an LLM policy.

A policy owns its model (and a frozen reference copy when a KL penalty is on). The loop calls
`rollout` -> reward -> advantages -> `backward` (then clips and steps the optimiser itself). A
rollout is self-contained: the reward and the update need nothing but it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence

import torch

from spotlight.prompts import Prompt


@dataclass
class Rollout:
    """Samples of one iteration, flattened: sample i answers prompts[i] with seed seeds[i].

    Groups are contiguous: samples [g*G, (g+1)*G) share a prompt.
    """

    prompts: list[Prompt]
    seeds: list[int]
    images: torch.Tensor | None = None
    """DiT: decoded images (N, 3, H, W) in [0, 1]."""
    completions: list[str] | None = None
    """LLM: decoded completion text, without the prompt."""
    data: dict[str, Any] = field(default_factory=dict)
    """Policy-specific tensors needed by the update (latents, old log-probs, token ids, masks...)."""

    def __len__(self) -> int:
        return len(self.prompts)


class Policy(Protocol):
    model: torch.nn.Module

    def rollout(self, prompts: Sequence[Prompt], seeds: Sequence[int]) -> Rollout:
        """Sample once per (prompt, seed) pair with the current weights, under no_grad."""
        ...

    def backward(self, rollout: Rollout, advantages: torch.Tensor) -> dict[str, float]:
        """Accumulate gradients of the GRPO loss over the whole rollout (in micro-batches);
        returns scalar stats (loss, clip_frac, kl, ...)."""
        ...

    def warm_start(self, prompts: Sequence[Prompt], steps: int, batch_size: int, lr: float, seed: int) -> dict[str, float]:
        """Supervised training from scratch on synthetic data; returns final-loss stats."""
        ...

    def set_reference(self) -> None:
        """Freeze a copy of the current weights as the KL reference."""
        ...

    def save_pretrained(self, path: Path) -> None:
        """Write the model (safetensors + config) so the library that built it can load it back."""
        ...
