import math

import pytest
import torch

from spotlight.rl.flow_sde import ode_step, qwen_image_sigmas, sde_mean_std
from spotlight.rl.grpo import gaussian_logprob


def test_sigmas_follow_qwen_image_schedule():
    sig = qwen_image_sigmas(8, 64)
    assert sig.shape == (9,) and sig[0].item() == 1.0 and sig[-1].item() == 0.0
    assert torch.all(sig[1:] < sig[:-1])
    assert sig[-2].item() == pytest.approx(0.02, abs=1e-6)  # shift_terminal
    # exponential time shift with mu linear in the token count, before the terminal stretch
    mu = 0.5 + (0.9 - 0.5) / (8192 - 256) * (64 - 256)
    t = torch.linspace(1.0, 1 / 8, 8, dtype=torch.float64)
    shifted = math.exp(mu) / (math.exp(mu) + (1 / t - 1))
    stretched = 1 - (1 - shifted) / ((1 - shifted[-1]) / (1 - 0.02))
    assert torch.allclose(sig[:-1].double(), stretched, atol=1e-6)
    # longer sequences shift toward high noise
    assert qwen_image_sigmas(8, 4096)[4] > sig[4]


def test_sde_mean_and_std_by_hand():
    x, v = torch.tensor([[1.0, -2.0]]), torch.tensor([[0.5, 0.25]])
    sigma, nxt, a = 0.6, 0.4, 0.7
    mean, std = sde_mean_std(x, v, torch.tensor([sigma]), torch.tensor([nxt]), a, sigma_after_one=0.9)
    s = math.sqrt(sigma / (1 - sigma)) * a
    dt = nxt - sigma
    expect = x * (1 + s**2 / (2 * sigma) * dt) + v * (1 + s**2 * (1 - sigma) / (2 * sigma)) * dt
    assert torch.allclose(mean, expect)
    assert std.item() == pytest.approx(s * math.sqrt(-dt))


def test_sde_at_sigma_one_uses_next_sigma_in_the_denominator():
    x = v = torch.ones(1, 3)
    _, std = sde_mean_std(x, v, torch.tensor([1.0]), torch.tensor([0.9]), 0.7, sigma_after_one=0.9)
    assert math.isfinite(std.item()) and std.item() == pytest.approx(math.sqrt(1 / 0.1) * 0.7 * math.sqrt(0.1))


def test_sde_step_log_prob_is_the_closed_form_gaussian():
    g = torch.Generator().manual_seed(3)
    x, v = torch.randn(4, 16, 8, generator=g), torch.randn(4, 16, 8, generator=g)
    sigma, nxt = torch.full((4,), 0.7), torch.full((4,), 0.55)
    mean, std = sde_mean_std(x, v, sigma, nxt, 0.7, 0.9)
    x_next = mean + std * torch.randn(x.shape, generator=g)
    closed = torch.distributions.Normal(mean, std.expand_as(mean)).log_prob(x_next).flatten(1).mean(1)
    assert torch.allclose(gaussian_logprob(x_next, mean, std), closed, atol=1e-5)


def test_small_noise_level_approaches_the_ode_step():
    x, v = torch.randn(2, 5), torch.randn(2, 5)
    sigma, nxt = torch.full((2,), 0.5), torch.full((2,), 0.3)
    mean, std = sde_mean_std(x, v, sigma, nxt, 1e-4, 0.9)
    assert torch.allclose(mean, ode_step(x, v, sigma, nxt), atol=1e-6) and std.max() < 1e-4
