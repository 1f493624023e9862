"""Prompt conditioning for the DiT: text -> (embeddings (B, T, D), mask (B, T)).

Two implementations behind one call signature:
- `HashedWordEncoder` — a deterministic stand-in for a text encoder, used when no encoder weights
  exist (the tiny CPU config). Each word maps to a fixed random vector seeded by a hash of the
  word, so prompts that share a word share a token; it learns nothing and knows no semantics.
- `QwenPromptEncoder` — Qwen-Image's real text encoder (Qwen2.5-VL) through diffusers'
  `QwenImagePipeline.encode_prompt`, loaded from a local checkpoint folder.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Protocol, Sequence

import torch

from spotlight.rl.seeding import generator


class PromptEncoder(Protocol):
    def __call__(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """texts (B) -> embeddings (B, T, D) float, mask (B, T) long with 1 for real tokens."""
        ...


class HashedWordEncoder:
    """Deterministic per-word embeddings — a stand-in, not a learned text encoder.

    dim: the DiT's `joint_attention_dim`. max_tokens: T; longer prompts are truncated. Vectors
    have unit RMS so their scale matches what a normalised text encoder would hand over.
    """

    def __init__(self, dim: int, max_tokens: int) -> None:
        self.dim = dim
        self.max_tokens = max_tokens
        self._cache: dict[str, torch.Tensor] = {}

    def word_vector(self, word: str) -> torch.Tensor:
        if word not in self._cache:
            key = int.from_bytes(hashlib.sha256(word.encode()).digest()[:7], "little")
            self._cache[word] = torch.randn(self.dim, generator=generator(key))
        return self._cache[word]

    def __call__(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        emb = torch.zeros(len(texts), self.max_tokens, self.dim)
        mask = torch.zeros(len(texts), self.max_tokens, dtype=torch.long)
        for i, text in enumerate(texts):
            words = text.lower().split()[: self.max_tokens] or [""]
            for j, word in enumerate(words):
                emb[i, j] = self.word_vector(word)
                mask[i, j] = 1
        return emb, mask


class QwenPromptEncoder:
    """Qwen-Image's text encoder, loaded from a local diffusers checkpoint (no download)."""

    def __init__(self, path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> None:
        from diffusers import QwenImagePipeline

        self.pipe = QwenImagePipeline.from_pretrained(
            str(path), transformer=None, vae=None, torch_dtype=dtype, local_files_only=True
        ).to(device)
        self.device = device

    @torch.no_grad()
    def __call__(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        emb, mask = self.pipe.encode_prompt(list(texts), device=self.device)
        return emb.float(), mask.long()
