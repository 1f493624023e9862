"""Resumable, deterministic SDE sampling with per-step log-probs (the DiT rollout).

A `SampleState` (defined in `schedulers.sample_state`, beside the requests that carry it, and
re-exported here) is everything a batch of samples needs to continue: the trajectory so far, the
step reached and the log-probs of the stochastic steps taken. The random stream of sample i at step
k is `seeding.generator(run_seed, prompt_id_i, seed_i, k)`, so the generator state at a step
boundary is a function of (keys, step) and needs no storing. Invariant: stopping after any step and
resuming from the state gives a bit-identical result to never stopping.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

import torch

from schedulers.sample_state import SampleState
from spotlight.config import SamplerConfig
from spotlight.rl.flow_sde import ode_step, sde_mean_std
from spotlight.rl.grpo import gaussian_logprob
from spotlight.rl.seeding import INITIAL_NOISE, randn

__all__ = ["FlowSDESampler", "SampleState", "VelocityFn"]

VelocityFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(x (B, S, C) packed latents, sigma (B,)) -> velocity (B, S, C); the prompt is bound in."""


class FlowSDESampler:
    """Walks a sigma schedule with SDE steps inside `cfg.sde_window` and ODE steps outside it."""

    def __init__(self, cfg: SamplerConfig, sigmas: torch.Tensor, run_seed: int) -> None:
        if sigmas.shape != (cfg.num_steps + 1,):
            raise ValueError(f"sigmas must be ({cfg.num_steps + 1},), got {tuple(sigmas.shape)}")
        self.cfg = cfg
        self.sigmas = sigmas
        self.run_seed = run_seed
        self.sde_steps = cfg.sde_steps
        self._on: dict[torch.device, torch.Tensor] = {}

    def init(self, prompt_ids: Sequence[int], seeds: Sequence[int], token_shape: tuple[int, int],
             device: str = "cpu") -> SampleState:
        """Fresh samples at pure noise. token_shape: (S, C) of the packed latent."""
        noise = torch.stack([randn(token_shape, self.run_seed, p, s, INITIAL_NOISE) for p, s in zip(prompt_ids, seeds)])
        return SampleState(tuple(prompt_ids), tuple(seeds), 0, noise.unsqueeze(1).to(device),
                           torch.zeros(len(seeds), 0, device=device))

    def sigmas_on(self, device: torch.device | str) -> torch.Tensor:
        """The schedule on `device`, copied there once (the model takes its timestep there, and a
        copy per step would be a host-to-device transfer the profile does not need)."""
        device = torch.device(device)
        if device not in self._on:
            self._on[device] = self.sigmas.to(device)
        return self._on[device]

    def step_noise(self, state: SampleState, step: int) -> torch.Tensor:
        shape = tuple(state.trajectory.shape[2:])
        return torch.stack([randn(shape, self.run_seed, p, s, step) for p, s in zip(state.prompt_ids, state.seeds)])

    def advance(self, velocity: VelocityFn, state: SampleState, until: int | None = None) -> SampleState:
        """Run steps state.step .. until-1 (default: to the end) and return the new state."""
        until = self.cfg.num_steps if until is None else until
        if not state.step <= until <= self.cfg.num_steps:
            raise ValueError(f"cannot advance from step {state.step} to {until} of {self.cfg.num_steps}")
        xs, lps = [state.trajectory], [state.log_probs]
        x = state.latest
        sigmas = self.sigmas_on(x.device)
        for k in range(state.step, until):
            b = x.shape[0]
            sigma, sigma_next = sigmas[k].expand(b), sigmas[k + 1].expand(b)
            v = velocity(x, sigma)
            if k in self.sde_steps:
                mean, std = sde_mean_std(x, v, sigma, sigma_next, self.cfg.noise_level, float(self.sigmas[1]))
                x = mean + std * self.step_noise(state, k).to(x.device, x.dtype)
                lps.append(gaussian_logprob(x, mean, std).unsqueeze(1))
            else:
                x = ode_step(x, v, sigma, sigma_next)
            xs.append(x.unsqueeze(1))
        return replace(state, step=until, trajectory=torch.cat(xs, dim=1), log_probs=torch.cat(lps, dim=1))
