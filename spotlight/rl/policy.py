"""The Policy protocol: what the training loop needs from a DiT or an LLM policy.

A policy owns its model (and a frozen reference copy when a KL penalty is on). The loop calls
`rollout` -> reward -> advantages -> `backward` (then clips and steps the optimiser itself). A
rollout is self-contained: the reward and the update need nothing but it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence

import torch

from spotlight.rl.prompts import Prompt


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
    seconds: dict[str, float] = field(default_factory=dict)
    """Seconds its policy spent on it outside the denoising (a DiT: `encode`, `decode`;
    `spotlight.rl.phase_seconds`); of several parts, their sums."""

    def __len__(self) -> int:
        return len(self.prompts)

    @staticmethod
    def concat(parts: Sequence["Rollout"], pad: dict[str, float] | None = None) -> "Rollout":
        """Samples of `parts` in order. Tensors in `data` are concatenated on dim 0; where their
        dim 1 differs (LLM completions of different lengths), they are right-padded first with
        `pad[key]` (0 by default)."""
        data: dict[str, Any] = {}
        for key in parts[0].data:
            tensors = [p.data[key] for p in parts]
            width = max(t.shape[1] for t in tensors) if tensors[0].ndim > 1 else None
            if width is not None:
                fill = (pad or {}).get(key, 0)
                tensors = [torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill) if t.ndim == 2 else t
                           for t in tensors]
            data[key] = torch.cat(tensors)
        images = torch.cat([p.images for p in parts]) if parts[0].images is not None else None
        completions = [c for p in parts for c in p.completions] if parts[0].completions is not None else None
        return Rollout([q for p in parts for q in p.prompts], [s for p in parts for s in p.seeds],
                       images=images, completions=completions, data=data, seconds=sum_stats(p.seconds for p in parts))


def sum_stats(parts: Iterable[dict[str, float]]) -> dict[str, float]:
    """Numbers by name added up, in order: the stats of an update from its micro-batches'
    (`Policy.backward_part`), the seconds of rollouts from their parts' (`Rollout.seconds`)."""
    total: dict[str, float] = {}
    for stats in parts:
        for key, value in stats.items():
            total[key] = total.get(key, 0.0) + value
    return total


class Policy(Protocol):
    model: torch.nn.Module
    resumable: bool
    """True when a rollout can stop after a step and resume from a state (DiT: init_state / advance /
    finish); False when a request is computed whole (LLM)."""

    def rollout(self, prompts: Sequence[Prompt], seeds: Sequence[int]) -> Rollout:
        """Sample once per (prompt, seed) pair with the current weights, under no_grad."""
        ...

    def merge(self, parts: Sequence[Rollout]) -> Rollout:
        """One rollout from per-request parts, in order."""
        ...

    def for_exploration(self, num_steps: int | None, ode: bool) -> "Policy":
        """The policy as exploration samples with it (sharing the weights): possibly cheaper, with
        every sample's seed keeping its noise."""
        ...

    def backward(self, rollout: Rollout, advantages: torch.Tensor) -> dict[str, float]:
        """Accumulate gradients of the GRPO loss over the whole rollout (in micro-batches);
        returns scalar stats (loss, clip_frac, kl, ...)."""
        ...

    def update_parts(self, rollout: Rollout) -> int:
        """How many micro-batches the update over `rollout` has (`backward_part`'s indices)."""
        ...

    def backward_part(self, rollout: Rollout, advantages: torch.Tensor, index: int,
                      scale: float = 1.0) -> dict[str, float]:
        """Accumulate `scale` x the gradient of micro-batch `index` of the loss `backward` takes over
        the whole rollout (the same loss: its gradient is the sum of the parts' gradients; `scale` 0:
        a pass that adds nothing, which a learner group's rank runs to keep its collectives in
        step, `spotlight.runtime.learner_group`); returns the
        part's share of the stats (`sum_stats` of every part's are `backward`'s)."""
        ...

    def warm_start(self, prompts: Sequence[Prompt], steps: int, batch_size: int, lr: float, seed: int,
                   on_step: Callable[[], None] | None = None) -> dict[str, float]:
        """Supervised training from scratch on synthetic data; returns final-loss stats. `on_step`
        is called after every optimiser step (a progress bar)."""
        ...

    def set_reference(self) -> None:
        """Freeze a copy of the current weights as the KL reference."""
        ...

    def save_pretrained(self, path: Path) -> None:
        """Write the model (safetensors + config) so the library that built it can load it back."""
        ...
