"""What every member of an elastic SP deployment builds: the transformer's architecture and the
run config its sampler follows. One immutable value, handed to each member process at start, so
that all members — and the single-process reference in tests — compute the same function.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from spotlight.config import RunConfig, default_config
from spotlight.rl.dit_model import _MODEL_INIT, TINY_TRANSFORMER
from spotlight.rl.seeding import derive_seed


def tiny_arch(heads: int = 2) -> dict[str, Any]:
    """The tiny CPU transformer (`dit_model.TINY_TRANSFORMER`) with `heads` attention heads of the
    same size: Ulysses of degree d needs d | heads, and the stock tiny model has only 2.
    attention_head_dim stays 16 = sum(axes_dims_rope), as Qwen-Image's RoPE requires."""
    if heads < 1:
        raise ValueError(f"heads must be >= 1, got {heads}")
    return dict(TINY_TRANSFORMER, num_attention_heads=heads)


@dataclass(frozen=True)
class ServeSpec:
    arch: dict[str, Any] = field(default_factory=tiny_arch)
    """`QwenImageTransformer2DModel` keyword arguments."""
    run: RunConfig = field(default_factory=default_config)
    """Seed (model initialisation and sampling streams), sampler and resolution (tokens)."""
    device: str = "cpu"
    """Members' device: cpu (gloo) or cuda (NCCL; member i of a node uses cuda:i)."""
    host: str = "127.0.0.1"
    """Address the rendezvous stores and gloo listen on."""
    timeout_s: float = 30.0
    """Rendezvous and collective timeout: how long a member waits on a peer that says nothing."""

    def __post_init__(self) -> None:
        if sum(self.arch.get("axes_dims_rope", ())) != self.arch.get("attention_head_dim"):
            raise ValueError(f"arch: attention_head_dim ({self.arch.get('attention_head_dim')}) must equal "
                             f"sum(axes_dims_rope) ({sum(self.arch.get('axes_dims_rope', ()))})")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s}")

    @property
    def heads(self) -> int:
        return int(self.arch["num_attention_heads"])

    @property
    def side(self) -> int:
        """Latent side; the transformer sees (side/2)² image tokens."""
        return self.run.policy.dit.latent_side

    @property
    def seq_len(self) -> int:
        return (self.side // 2) ** 2

    def build_model(self) -> torch.nn.Module:
        """The transformer, randomly initialised from `run.seed` the way `dit_model.build_transformer`
        does (so the stock tiny arch gives the same weights as the trainer's model)."""
        from diffusers import QwenImageTransformer2DModel

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.run.seed, _MODEL_INIT))
            model = QwenImageTransformer2DModel(**self.arch)
        return model.eval().requires_grad_(False)

    def build_policy(self, model: torch.nn.Module) -> Any:
        """A `DiTPolicy` sampling with `model` (SP applied or not) and the stand-in text encoder."""
        from spotlight.rl.dit_model import PixelDecoder
        from spotlight.rl.dit_policy import DiTPolicy
        from spotlight.rl.prompt_encoder import HashedWordEncoder

        cfg = self.run
        encoder = HashedWordEncoder(model.config.joint_attention_dim, cfg.policy.dit.text_tokens)
        return DiTPolicy(cfg, model, encoder, PixelDecoder())
