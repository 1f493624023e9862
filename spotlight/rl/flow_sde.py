"""The Flow-GRPO SDE step for flow-matching models, with its Gaussian log-prob.

Convention (Qwen-Image, diffusers' FlowMatchEulerDiscreteScheduler): x_σ = (1-σ)·x0 + σ·ε, the
model predicts the velocity v = ε - x0, and sampling walks σ from 1 down to 0 with dt = σ' - σ < 0.
The ODE step is `x' = x + v·dt`. The SDE step with the same marginals is

    s    = sqrt(σ / (1-σ)) · noise_level
    mean = x·(1 + s²/(2σ)·dt) + v·(1 + s²(1-σ)/(2σ))·dt
    x'   = mean + s·sqrt(-dt)·ε

and log π(x' | x) is the Gaussian log-density of x' under (mean, s·sqrt(-dt)). At σ = 1 the
std is infinite, so (as Flow-GRPO does) the 1 - σ in the denominator uses the next sigma instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

# Qwen-Image's released scheduler config (Qwen/Qwen-Image, scheduler/scheduler_config.json): dynamic
# exponential shift between base_shift at 256 image tokens and max_shift at 8192, ending at 0.02.
QWEN_IMAGE_SCHEDULER: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 0.9,
    "base_image_seq_len": 256,
    "max_image_seq_len": 8192,
    "shift_terminal": 0.02,
    "time_shift_type": "exponential",
}


def qwen_image_sigmas(num_steps: int, image_seq_len: int, scheduler_config: dict[str, Any] | None = None) -> torch.Tensor:
    """The sigma schedule Qwen-Image's pipeline uses: (num_steps + 1,) float32, from 1 to 0.

    image_seq_len: packed image tokens ((H/16)·(W/16) for Qwen-Image). The schedule is computed by
    diffusers' own scheduler from the released config (or `scheduler_config`, read from a local
    checkpoint), with mu linear in the sequence length as in `QwenImagePipeline`.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler

    conf = dict(QWEN_IMAGE_SCHEDULER, **(scheduler_config or {}))
    conf = {k: v for k, v in conf.items() if not k.startswith("_")}
    sched = FlowMatchEulerDiscreteScheduler(**conf)
    slope = (conf["max_shift"] - conf["base_shift"]) / (conf["max_image_seq_len"] - conf["base_image_seq_len"])
    mu = conf["base_shift"] + slope * (image_seq_len - conf["base_image_seq_len"])
    sched.set_timesteps(sigmas=np.linspace(1.0, 1.0 / num_steps, num_steps), mu=mu)
    return sched.sigmas.to(torch.float32).clone()


def sde_mean_std(
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    noise_level: float,
    sigma_after_one: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std of the SDE transition x -> x'.

    x, v: (B, ...); sigma, sigma_next: (B,) per-sample sigmas (rows of a batch may sit at different
    steps). Returns mean (B, ...) and std (B, 1, ..., 1). sigma_after_one: the schedule's second
    sigma, used in place of σ in `1 - σ` where σ == 1.
    """
    shape = (-1,) + (1,) * (x.ndim - 1)
    sigma = sigma.to(x.dtype).view(shape)
    sigma_next = sigma_next.to(x.dtype).view(shape)
    dt = sigma_next - sigma
    denom = 1.0 - torch.where(sigma >= 1.0, torch.full_like(sigma, sigma_after_one), sigma)
    s = torch.sqrt(sigma / denom) * noise_level
    mean = x * (1 + s**2 / (2 * sigma) * dt) + v * (1 + s**2 * (1 - sigma) / (2 * sigma)) * dt
    return mean, s * torch.sqrt(-dt)


def ode_step(x: torch.Tensor, v: torch.Tensor, sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
    """Deterministic Euler step of the flow ODE. x, v: (B, ...); sigma, sigma_next: (B,)."""
    shape = (-1,) + (1,) * (x.ndim - 1)
    return x + v * (sigma_next - sigma).to(x.dtype).view(shape)
