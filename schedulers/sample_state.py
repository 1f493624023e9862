"""A DiT request's resumable state: a batch of samples between two denoising steps.

A `SampleState` is everything a batch of samples needs to continue: the trajectory so far, the
step reached and the log-probs of the stochastic steps taken. It is what a worker commits into
the pull queue after a step (`Request.state`), what an SP group's rank 0 reports, and what a
snapshot of the in-flight rollouts holds; the sampler that produces it (`spotlight.rl.dit_sampler`)
keeps the invariant that stopping after any step and resuming from the state gives a bit-identical
result to never stopping (the random stream of a step is a function of the step, so no generator
state is stored here). tests/spotlight/rl/test_dit_sampler.py checks it.

It lives with the scheduler, not the sampler, because the lower packages that carry it — the queue,
the SP coordinator and its wire format — must not import `spotlight/`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class SampleState:
    """A batch of samples between two denoising steps."""

    prompt_ids: tuple[int, ...]
    seeds: tuple[int, ...]
    step: int
    """Denoising steps completed; `trajectory` holds step + 1 latents."""
    trajectory: torch.Tensor
    """(B, step + 1, S, C): x_0 (pure noise) .. x_step."""
    log_probs: torch.Tensor
    """(B, stochastic steps completed): log π(x_{k+1} | x_k) for each SDE step k taken so far."""

    @property
    def latest(self) -> torch.Tensor:
        return self.trajectory[:, -1]

    def select(self, index: Sequence[int]) -> SampleState:
        """The sub-batch of samples at `index` (a sample's state does not depend on its batch)."""
        idx = torch.as_tensor(list(index), dtype=torch.long)
        return replace(self, prompt_ids=tuple(self.prompt_ids[i] for i in idx.tolist()),
                       seeds=tuple(self.seeds[i] for i in idx.tolist()),
                       trajectory=self.trajectory[idx], log_probs=self.log_probs[idx])
