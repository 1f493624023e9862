"""Deterministic random streams.

Every random draw of a sample comes from a generator seeded by (run seed, prompt id, sample seed,
step) — nothing draws from torch's global RNG. So a sample's noise does not depend on which batch,
worker or process computes it, and a sample resumed at step k draws exactly what the
uninterrupted one drew: the generator state at a step boundary is a function of the step.
"""

from __future__ import annotations

import hashlib
import struct

import torch


def derive_seed(*keys: int) -> int:
    """A 63-bit seed from integer keys; distinct key tuples give independent-looking seeds."""
    digest = hashlib.blake2b(struct.pack(f"<{len(keys)}q", *keys), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def generator(*keys: int) -> torch.Generator:
    """A fresh CPU generator seeded from `keys` (CPU so results match across devices)."""
    return torch.Generator(device="cpu").manual_seed(derive_seed(*keys))


def randn(shape: tuple[int, ...], *keys: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Standard normal draws from the stream named by `keys`, moved to `device`."""
    return torch.randn(shape, generator=generator(*keys)).to(device)


# Stream tags: the last key says what the draw is for, so the streams never collide.
INITIAL_NOISE = -1
"""Tag for a DiT sample's initial latent noise (SDE steps use the step index, >= 0)."""
