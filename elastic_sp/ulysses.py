"""Ulysses sequence parallelism for diffusers' `QwenImageTransformer2DModel`, applied from outside.

`apply(model, group)` makes every forward of `model` on the members of `group` compute the
single-process output together, each member holding 1/degree of the image tokens:

- the image tokens (B, S, C) are padded to a multiple of the degree and each rank keeps its slice
  of S/degree tokens (a forward pre-hook); the image rotary embeddings are sliced the same way (a
  hook on `pos_embed`), as is `modulate_index` for zero_cond_t models (a hook on each block);
- the text tokens (B, T, ·) stay replicated on every rank: T is short (a prompt) next to S;
- attention is head-parallel (the custom processor): each rank projects its tokens to q, k, v for
  all heads, one all-to-all trades "my tokens, all heads" for "all tokens, my heads/degree heads",
  each rank runs joint [text, image] attention over the whole sequence for its heads — padded
  image keys masked out — and a second all-to-all trades back; the same exchange also hands each
  rank the text output of everyone's heads, so the replicated text stream stays whole;
- the output tokens are gathered from all ranks and the padding dropped (a forward hook), so the
  caller sees the single-process (B, S, C) output on every rank.

Invariant: for any degree dividing the heads and any S (divisible or not), the output equals the
single-process one up to float reassociation in the linear layers (same kernels, different row
blocking); with degree 1 nothing is split at all. Everything but attention is per token, so it
needs no communication. The model is not modified: `remove` restores its processors and hooks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from elastic_sp.regroup_policy import check_degree


class CollectiveGroup(Protocol):
    """What Ulysses needs of a group (`group.SPGroup`, `group.TorchGroup`)."""

    rank: int
    size: int

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        """(size, ...) -> (size, ...): slice i goes to / came from rank i."""
        ...

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """(...) -> (size, ...): slice i is rank i's x."""
        ...


class _Single:
    """Degree 1: no communication at all."""

    rank, size = 0, 1

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return x.unsqueeze(0)


@dataclass
class _Shard:
    """How the image tokens of the forward in progress are split."""

    seq: int
    """S: real image tokens."""
    local: int
    """Tokens per rank: ceil(S / degree)."""
    degree: int
    rank: int

    @property
    def padded(self) -> int:
        return self.local * self.degree

    def take(self, x: torch.Tensor, dim: int, fill: complex = 0) -> torch.Tensor:
        """This rank's slice of x along `dim` (length S), after padding to `padded` with `fill`."""
        if x.shape[dim] != self.seq:
            raise ValueError(f"expected {self.seq} image tokens along dim {dim}, got {tuple(x.shape)}")
        pad = self.padded - self.seq
        if pad:
            shape = list(x.shape)
            shape[dim] = pad
            x = torch.cat([x, torch.full(shape, fill, dtype=x.dtype, device=x.device)], dim=dim)
        return x.narrow(dim, self.rank * self.local, self.local)


class UlyssesAttnProcessor:
    """Joint [text, image] attention of a Qwen-Image block with the heads split over the group.

    Shapes (B batch, Sl = S/degree local image tokens, T text tokens, H heads of size D, P the
    degree, Hp = H/P): in hidden_states (B, Sl, H·D) and encoder_hidden_states (B, T, H·D);
    out (image (B, Sl, H·D), text (B, T, H·D)) as the stock processor returns them."""

    def __init__(self, sp: UlyssesParallel) -> None:
        self.sp = sp

    def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor | None = None,
                 encoder_hidden_states_mask: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                 image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        from diffusers.models.transformers.transformer_qwenimage import (
            apply_rotary_emb_qwen,
        )

        if encoder_hidden_states is None:
            raise ValueError("Ulysses attention for Qwen-Image needs encoder_hidden_states (the text stream)")
        if attention_mask is not None:
            raise ValueError("Ulysses attention builds the joint mask itself; pass encoder_hidden_states_mask")
        group, shard = self.sp.group, self.sp.shard
        if shard is None:
            raise RuntimeError("Ulysses attention called outside a forward of the model it was applied to")
        heads, p = attn.heads, group.size
        d = attn.inner_dim // heads
        hp = heads // p
        b, sl, _ = hidden_states.shape
        t = encoder_hidden_states.shape[1]

        def project(x: torch.Tensor, proj: Any, norm: Any) -> torch.Tensor:
            y = proj(x).unflatten(-1, (heads, d))
            return norm(y) if norm is not None else y

        iq = project(hidden_states, attn.to_q, attn.norm_q)
        ik = project(hidden_states, attn.to_k, attn.norm_k)
        iv = project(hidden_states, attn.to_v, None)
        tq = project(encoder_hidden_states, attn.add_q_proj, attn.norm_added_q)
        tk = project(encoder_hidden_states, attn.add_k_proj, attn.norm_added_k)
        tv = project(encoder_hidden_states, attn.add_v_proj, None)
        if image_rotary_emb is not None:
            img_freqs, txt_freqs = image_rotary_emb  # img_freqs: this rank's Sl rows (see _on_rotary)
            iq, ik = (apply_rotary_emb_qwen(x, img_freqs, use_real=False) for x in (iq, ik))
            tq, tk = (apply_rotary_emb_qwen(x, txt_freqs, use_real=False) for x in (tq, tk))

        # All-to-all 1: (3, B, Sl, P, Hp, D) by destination rank -> from each source rank its
        # Sl tokens of my Hp heads; the source's position is its token block in the sequence.
        qkv = torch.stack([iq, ik, iv]).view(3, b, sl, p, hp, d).permute(3, 0, 1, 2, 4, 5)
        qkv = group.all_to_all(qkv).permute(1, 2, 0, 3, 4, 5).reshape(3, b, p * sl, hp, d)
        h0 = group.rank * hp
        q, k, v = (torch.cat([txt[:, :, h0:h0 + hp], img], dim=1) for txt, img in zip((tq, tk, tv), qkv))

        mask = None
        if encoder_hidden_states_mask is not None or shard.padded != shard.seq:
            txt_mask = (torch.ones(b, t, dtype=torch.bool, device=q.device) if encoder_hidden_states_mask is None
                        else encoder_hidden_states_mask.to(torch.bool))
            img_mask = (torch.arange(shard.padded, device=q.device) < shard.seq).expand(b, -1)
            mask = torch.cat([txt_mask, img_mask], dim=1)[:, None, None, :]  # padded keys get no weight
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=mask, dropout_p=0.0, is_causal=False)
        out = out.transpose(1, 2).to(q.dtype)  # (B, T + P·Sl, Hp, D)

        # All-to-all 2: to rank j its Sl image tokens and the whole text, for my Hp heads; back come
        # my Sl tokens and the text for every rank's heads, in head order.
        n_img = b * sl * hp * d
        img = out[:, t:].reshape(b, p, sl, hp, d).permute(1, 0, 2, 3, 4).reshape(p, n_img)
        txt = out[:, :t].reshape(1, -1).expand(p, -1)
        back = group.all_to_all(torch.cat([img, txt], dim=1))
        img = back[:, :n_img].view(p, b, sl, hp, d).permute(1, 2, 0, 3, 4).reshape(b, sl, heads * d)
        txt = back[:, n_img:].view(p, b, t, hp, d).permute(1, 2, 0, 3, 4).reshape(b, t, heads * d)

        img_out = attn.to_out[0](img)
        if len(attn.to_out) > 1:
            img_out = attn.to_out[1](img_out)  # dropout
        return img_out, attn.to_add_out(txt)


class UlyssesParallel:
    """The hooks and processor that `apply` put on a model; `set_group` re-points them at a new
    group in place (a regroup), `remove` takes them off."""

    def __init__(self, model: Any, group: CollectiveGroup) -> None:
        self.model = model
        self.heads: int = model.config.num_attention_heads
        self.group: CollectiveGroup = group
        self.shard: _Shard | None = None
        self._processors = model.attn_processors
        self._hooks: list[Any] = []

    def install(self) -> UlyssesParallel:
        m = self.model
        m.set_attn_processor(UlyssesAttnProcessor(self))
        self._hooks = [
            m.register_forward_pre_hook(self._on_input, with_kwargs=True),
            m.pos_embed.register_forward_hook(self._on_rotary),
            *(blk.register_forward_pre_hook(self._on_block, with_kwargs=True) for blk in m.transformer_blocks),
            m.register_forward_hook(self._on_output),
        ]
        return self

    def set_group(self, group: CollectiveGroup | None) -> None:
        group = group if group is not None else _Single()
        check_degree(self.heads, group.size)
        self.group = group

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.model.set_attn_processor(self._processors)
        del self.model._elastic_sp

    # ---- hooks ------------------------------------------------------------------------------------

    def _on_input(self, module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        x = args[0] if args else kwargs["hidden_states"]
        self.shard = _Shard(seq=x.shape[1], local=math.ceil(x.shape[1] / self.group.size),
                            degree=self.group.size, rank=self.group.rank)
        x = self.shard.take(x, dim=1)  # padded tokens are zeros; their keys are masked in attention
        if args:
            return (x, *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": x}

    def _on_rotary(self, module: Any, inputs: tuple, output: tuple[torch.Tensor, torch.Tensor]) -> tuple:
        img_freqs, txt_freqs = output
        if self.shard is None or img_freqs.shape[0] != self.shard.seq:
            raise ValueError(f"img_shapes give {img_freqs.shape[0]} image tokens, hidden_states has "
                             f"{None if self.shard is None else self.shard.seq}")
        return self.shard.take(img_freqs, dim=0, fill=1.0), txt_freqs  # rotation by 1: a no-op on padding

    def _on_block(self, module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        index = kwargs.get("modulate_index")
        if index is None or self.shard is None:
            return None
        return args, {**kwargs, "modulate_index": self.shard.take(index, dim=1)}

    def _on_output(self, module: Any, args: tuple, output: Any) -> Any:
        shard, self.shard = self.shard, None
        if shard is None:
            return output
        sample = output[0] if isinstance(output, tuple) else output.sample
        parts = self.group.all_gather(sample)  # (P, B, Sl, C)
        full = parts.permute(1, 0, 2, 3).reshape(sample.shape[0], shard.padded, sample.shape[2])[:, :shard.seq]
        if isinstance(output, tuple):
            return (full, *output[1:])
        output.sample = full
        return output


def apply(model: Any, group: CollectiveGroup | None) -> UlyssesParallel:
    """Make `model` (a diffusers QwenImageTransformer2DModel) run Ulysses SP over `group` (None:
    degree 1). Applying again only swaps the group: that is all a regroup changes. Raises
    ValueError when the group's size does not divide the model's heads."""
    for name in ("transformer_blocks", "pos_embed", "set_attn_processor", "config"):
        if not hasattr(model, name):
            raise TypeError(f"elastic_sp.apply needs a diffusers QwenImageTransformer2DModel, got "
                            f"{type(model).__name__} (no {name!r})")
    existing: UlyssesParallel | None = getattr(model, "_elastic_sp", None)
    if existing is not None:
        existing.set_group(group)
        return existing
    sp = UlyssesParallel(model, _Single())
    sp.set_group(group)  # checks the degree before anything is hooked
    model._elastic_sp = sp
    return sp.install()


def remove(model: Any) -> None:
    """Undo `apply`: the model runs single-process again."""
    sp: UlyssesParallel | None = getattr(model, "_elastic_sp", None)
    if sp is not None:
        sp.remove()
