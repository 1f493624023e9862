"""Synthetic prompt-conditioned images for the tiny DiT's warm start.

An image for "a red image" is red *mixed with a random other colour* by a random amount, plus a
smooth texture. The warm-started model therefore follows its prompt only loosely — its samples
scatter between the named colour and others — which leaves GRPO (with the colour reward) real
room to improve. A model trained on pure colours would start near the reward ceiling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from spotlight.rl.prompts import colour_of

MIX_RANGE = (0.25, 1.0)
"""Weight λ of the named colour: pixel = λ·target + (1-λ)·random colour (+ texture)."""
TEXTURE_AMPLITUDE = 0.1


def synthetic_images(texts: list[str], side: int, g: torch.Generator) -> torch.Tensor:
    """(B,) prompts -> (B, 3, side, side) images in [0, 1], drawn from generator g."""
    b = len(texts)
    target = torch.tensor([colour_of(t) for t in texts]).view(b, 3, 1, 1)
    other = torch.rand(b, 3, 1, 1, generator=g)
    lo, hi = MIX_RANGE
    lam = lo + (hi - lo) * torch.rand(b, 1, 1, 1, generator=g)
    coarse = torch.randn(b, 3, 4, 4, generator=g) * TEXTURE_AMPLITUDE
    texture = F.interpolate(coarse, size=(side, side), mode="bilinear", align_corners=False)
    return (lam * target + (1 - lam) * other + texture).clamp(0, 1)


def images_to_latents(images: torch.Tensor, channels: int) -> torch.Tensor:
    """(B, 3, h, w) in [0, 1] -> tiny-config latents (B, channels, h, w) in [-1, 1]; extra channels 0."""
    b, _, h, w = images.shape
    out = torch.zeros(b, channels, h, w)
    out[:, :3] = images * 2 - 1
    return out
