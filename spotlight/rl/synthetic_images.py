"""Synthetic prompt-conditioned images for the tiny DiT's warm start.

An image for "a red image" is red *mixed with a random other colour* by a random amount, plus a
smooth texture. The warm-started model therefore follows its prompt only loosely — its samples
scatter between the named colour and others — which leaves GRPO (with the colour reward) real
room to improve. A model trained on pure colours would start near the reward ceiling.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from spotlight.rl.prompts import colour_of, quoted_text

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


TEXT_SWAP = 0.3
"""Chance that each character of a text image is a random digit instead of the prompt's own. At 0
the tiny DiT (16 px, 2400 steps) draws its prompts' two digits so that OCR reads every one: no room
for GRPO; at 0.3 its samples score 0.35; with a 1-pixel jitter as well as 0.5, ~0."""


@functools.lru_cache(maxsize=4096)
def _ink(text: str, side: int) -> torch.Tensor:
    """(side, side) coverage in [0, 1] of `text` drawn centred, as large as fits in 90% of the side,
    in Pillow's built-in font (no system font needed, so every machine draws the same pixels)."""
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("L", (side, side), 0)
    draw = ImageDraw.Draw(image)
    for size in range(side, 0, -1):
        font = ImageFont.load_default(size=size)
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        if right - left <= 0.9 * side and bottom - top <= 0.9 * side:
            break
    draw.text(((side - (right - left)) / 2 - left, (side - (bottom - top)) / 2 - top), text, fill=255, font=font)
    return torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8).view(side, side).float() / 255


def synthetic_text_images(texts: list[str], side: int, g: torch.Generator) -> torch.Tensor:
    """(B,) prompts -> (B, 3, side, side) images of each prompt's quoted text, black on white, drawn
    from generator g. Each character is a random digit with chance TEXT_SWAP — so, as with the colour
    images, the warm-started model follows its prompt only loosely and the OCR reward has room to
    improve it."""
    out = torch.empty(len(texts), 3, side, side)
    for i, text in enumerate(texts):
        chars = list(quoted_text(text))
        swap = torch.rand(len(chars), generator=g) < TEXT_SWAP
        digits = torch.randint(10, (len(chars),), generator=g)
        shown = "".join(str(int(d)) if s else c for c, s, d in zip(chars, swap, digits))
        out[i] = 1 - _ink(shown, side)
    return out
