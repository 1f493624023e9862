"""GRPO math as pure functions (in the manner of verl's core_algos): advantages, the clipped
policy-gradient loss, and KL penalties. Shapes are in the docstrings; nothing here touches a model.
"""

from __future__ import annotations

import math

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4, clip: float = 5.0) -> torch.Tensor:
    """Group-normalised advantages `(r - mean_g) / (std_g + eps)`, clipped to [-clip, clip].

    rewards: (N,) with N = num_groups * group_size, groups contiguous. Returns (N,).
    std_g is the population std (ddof=0) of the group, so a group whose rewards are all equal gets
    advantage 0 for every sample — it carries no gradient, which is exactly GRPO's point.
    """
    if rewards.ndim != 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"rewards must be (num_groups * {group_size},), got {tuple(rewards.shape)}")
    r = rewards.view(-1, group_size).double()
    adv = (r - r.mean(dim=1, keepdim=True)) / (r.std(dim=1, unbiased=False, keepdim=True) + eps)
    return adv.clamp(-clip, clip).view(-1).to(rewards.dtype)


def informative_groups(advantages: torch.Tensor, group_size: int) -> list[int]:
    """Indices of the groups with a non-zero advantage (equal rewards give a group all zeros), or of
    every group when none has one (an update over nothing is not taken away).

    advantages: (N,) with N = num_groups * group_size, groups contiguous. A group of zeros adds no
    policy gradient but does count in the loss's denominator (all samples' or tokens' mean), so
    keeping it shrinks the step by the share of such groups; flow_grpo drops them."""
    if advantages.ndim != 1 or advantages.numel() % group_size != 0:
        raise ValueError(f"advantages must be (num_groups * {group_size},), got {tuple(advantages.shape)}")
    keep = (advantages.view(-1, group_size) != 0).any(dim=1).nonzero().flatten().tolist()
    return keep or list(range(advantages.numel() // group_size))


def group_std(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Per-group population std of rewards: (N,) -> (N / group_size,). The learning signal of a group."""
    return rewards.view(-1, group_size).std(dim=1, unbiased=False)


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-element PPO-clip surrogate `max(-A·ρ, -A·clip(ρ, 1-clip_low, 1+clip_high))`, ρ = exp(logp - old_logp).

    logp, old_logp: (...); advantages broadcastable to them. Returns (loss, clipped) of the same
    shape, `clipped` a float mask of elements where the clipped branch was taken. The caller
    aggregates: over samples and SDE steps for a DiT, over tokens for an LLM. Separate low and high
    clips give DAPO's "clip-higher"; with clip_low == clip_high it is the PPO loss.
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    return loss, (clipped > unclipped).float()


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over elements where mask is 1 (token-level aggregation). x, mask: same shape -> scalar."""
    return (x * mask).sum() / mask.sum().clamp_min(1.0)


def gaussian_kl_same_std(mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """KL(N(mean, std²) || N(ref_mean, std²)) per sample, averaged over non-batch dims.

    mean, ref_mean: (B, ...); std broadcastable. Returns (B,). This is the DiT's KL to a reference:
    both policies share the SDE's std, so the KL is the squared mean gap over 2·std².
    """
    kl = (mean - ref_mean) ** 2 / (2 * std**2)
    return kl.flatten(1).mean(dim=1)


def flow_grpo_kl(mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
    """flow_grpo's KL penalty of one SDE step: the exact KL (`gaussian_kl_same_std`) times |dt|.

    mean, ref_mean: (B, ...); std broadcastable, the step's std `std_dev_t * sqrt(|dt|)`; dt: (B,)
    the step's sigma_next - sigma. Returns (B,). flow_grpo divides the squared mean gap by
    `2 * std_dev_t**2`, the SDE's std *without* the step's sqrt(|dt|), so its value is |dt| times the
    exact KL: 5-50x smaller on the tiny config's 8-step schedule (|dt| 0.02-0.2). A `kl_beta` from
    flow_grpo's configs means this scale (`grpo.kl_estimator: flow_grpo`)."""
    return gaussian_kl_same_std(mean, ref_mean, std) * dt.abs().to(mean.dtype)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(π || π_ref) from samples of π: `exp(r) - r - 1`, r = ref_logp - logp.

    Elementwise, same shape as the inputs; non-negative and unbiased. Used per token for LLMs."""
    r = ref_logp - logp
    return torch.exp(r) - r - 1.0


def gaussian_logprob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """log N(x; mean, std²) averaged over all non-batch elements.

    x, mean: (B, ...); std broadcastable. Returns (B,). The per-element mean (not the sum) keeps
    log-ratios O(1) independent of resolution, as Flow-GRPO does, which is what the small PPO clip
    ranges (1e-3) are tuned for.
    """
    lp = -((x - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)
    return lp.flatten(1).mean(dim=1)
