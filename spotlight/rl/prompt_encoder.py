"""Prompt conditioning for the DiT: text -> (embeddings (B, T, D), mask (B, T)).

Two implementations behind one call signature:
- `HashedWordEncoder` — a deterministic stand-in for a text encoder, used when no encoder weights
  exist (the tiny CPU config). Each word maps to a fixed random vector seeded by a hash of the
  word, so prompts that share a word share a token; it learns nothing and knows no semantics.
- `QwenPromptEncoder` — Qwen-Image's real text encoder (Qwen2.5-VL) through diffusers'
  `QwenImagePipeline.encode_prompt`, loaded from a local pipeline folder.

Invariant of both: a prompt's conditioning does not depend on the prompts it is batched with —
its embedding rows are the same numbers alone or in any batch; only the zero padding after them
(mask 0) can (the real encoder pads to the batch's longest prompt, the stand-in to `text_tokens`)
(tests/spotlight/rl/test_dit_pipeline.py, test_an_equal_length_batch_through_the_real_encoder_is_its_prompts_alone).
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
    """Qwen-Image's text encoder, loaded from a local diffusers pipeline folder (no download):
    its text_encoder/, tokenizer/ (and scheduler/, which `from_pretrained` reads too).

    Each distinct prompt of a batch is encoded alone, as `QwenImagePipeline` encodes one prompt,
    then the batch is zero-padded to its longest prompt with mask 0. Why not one padded batch: a
    prompt's numbers would then depend on its batch-mates (a padded batch's matmuls round
    differently), and the rollout (one request's prompt), exploration and the update (the
    iteration's prompts together) batch the same prompt differently, while the update's recomputed
    log-probs should be the rollout's (what is left is the transformer's longer padding: a mean
    |log-ratio| of ~1e-8 before the first step on the tiny pipeline). A request's G copies of one
    prompt are encoded once.

    diffusers 0.42's `encode_prompt` returns `mask=None` whenever no token of its batch is padding
    (so for every single prompt, and every equal-length batch: `pipeline_qwenimage.py`,
    `if prompt_embeds_mask.all(): prompt_embeds_mask = None`): that mask is all ones here.
    """

    max_tokens = 512
    """Prompt tokens kept after the chat template's (`encode_prompt`'s max_sequence_length): 512,
    the default of `QwenImagePipeline.__call__`, so that the pipeline conditions a sample of
    ours exactly as we did."""

    def __init__(self, path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> None:
        from diffusers import QwenImagePipeline

        self.pipe = QwenImagePipeline.from_pretrained(
            str(path), transformer=None, vae=None, dtype=dtype, local_files_only=True
        ).to(device)
        self.device = device

    @torch.no_grad()
    def encode_one(self, text: str) -> torch.Tensor:
        """One prompt's embeddings (T, D), float32, T its own token count (at most `max_tokens`)."""
        emb, mask = self.pipe.encode_prompt([text], device=self.device, max_sequence_length=self.max_tokens)
        mask = real_tokens(emb, mask)
        return emb[0, mask[0].bool()].float()

    @torch.no_grad()
    def __call__(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        encoded = {text: self.encode_one(text) for text in dict.fromkeys(texts)}
        length = max(e.shape[0] for e in encoded.values())
        dim = next(iter(encoded.values())).shape[1]
        emb = torch.zeros(len(texts), length, dim, device=self.device)
        mask = torch.zeros(len(texts), length, dtype=torch.long, device=self.device)
        for i, text in enumerate(texts):
            n = encoded[text].shape[0]
            emb[i, :n] = encoded[text]
            mask[i, :n] = 1
        return emb, mask


def real_tokens(emb: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """`encode_prompt`'s mask as a (B, T) long tensor: None — diffusers' "no padding in this
    batch" — is all ones. emb: (B, T, D)."""
    if mask is None:
        return torch.ones(emb.shape[:2], dtype=torch.long, device=emb.device)
    return mask.long()
