"""The DiT: a diffusers `QwenImageTransformer2DModel`, its latent packing, and latent decoding.

Latents are (B, C, h, w) images in latent space; the transformer sees them packed into 2x2 patches
as a token sequence (B, (h/2)·(w/2), 4C) and predicts the velocity in the same packed layout.
"""

from __future__ import annotations

from pathlib import Path

import torch

from spotlight.config import DiTConfig
from spotlight.rl.seeding import derive_seed

# A random 2-layer config that trains on 2 CPU cores (sum(axes_dims_rope) == attention_head_dim;
# in_channels = 4 latent channels x 2x2 packing). 16x16 latents -> 64 image tokens.
TINY_TRANSFORMER = dict(
    patch_size=2,
    in_channels=16,
    out_channels=4,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=32,
    axes_dims_rope=(8, 4, 4),
)

# The released Qwen-Image transformer (20B): diffusers' defaults for QwenImageTransformer2DModel.
QWEN_IMAGE_TRANSFORMER = dict(
    patch_size=2,
    in_channels=64,
    out_channels=16,
    num_layers=60,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=3584,
    axes_dims_rope=(16, 56, 56),
)

_MODEL_INIT = 0x1417  # stream tag for the random initialisation of a tiny model


def build_transformer(cfg: DiTConfig, seed: int, device: str = "cpu"):
    """The transformer of `cfg`: loaded from `cfg.pretrained_path` when set, else randomly
    initialised (deterministically from `seed`). The real config runs in bfloat16, the tiny one in
    float32 (CPU bfloat16 matmuls are slow and too coarse for 1e-3 PPO ratios)."""
    from diffusers import QwenImageTransformer2DModel

    dtype = torch.float32 if cfg.preset == "tiny" else torch.bfloat16
    if cfg.pretrained_path:
        path = Path(cfg.pretrained_path)
        sub = "transformer" if (path / "transformer").is_dir() else None
        model = QwenImageTransformer2DModel.from_pretrained(
            str(path), subfolder=sub, torch_dtype=dtype, local_files_only=True
        )
    else:
        arch = TINY_TRANSFORMER if cfg.preset == "tiny" else QWEN_IMAGE_TRANSFORMER
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(seed, _MODEL_INIT))
            model = QwenImageTransformer2DModel(**arch)
    if model.dtype != dtype:
        model = model.to(dtype)
    return model.to(device)


def pack(latents: torch.Tensor) -> torch.Tensor:
    """(B, C, h, w) -> (B, (h/2)·(w/2), 4C), 2x2 patches in Qwen-Image's channel order."""
    b, c, h, w = latents.shape
    x = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack(tokens: torch.Tensor, side: int) -> torch.Tensor:
    """(B, (side/2)², 4C) -> (B, C, side, side); the inverse of `pack`."""
    b, _, c4 = tokens.shape
    c, half = c4 // 4, side // 2
    x = tokens.view(b, half, half, c, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, c, side, side)


def velocity(model, x: torch.Tensor, sigma: torch.Tensor, emb: torch.Tensor, mask: torch.Tensor, side: int) -> torch.Tensor:
    """Predicted velocity ε - x0. x: (B, S, 4C) packed; sigma: (B,) in [0, 1]; emb (B, T, D); mask (B, T)."""
    out = model(
        hidden_states=x.to(model.dtype),
        encoder_hidden_states=emb.to(model.dtype),
        encoder_hidden_states_mask=mask,
        timestep=sigma.to(model.dtype),
        img_shapes=[[(1, side // 2, side // 2)]] * x.shape[0],
        return_dict=False,
    )[0]
    return out.to(x.dtype)


def true_cfg(cond: torch.Tensor, uncond: torch.Tensor, scale: float) -> torch.Tensor:
    """True classifier-free guidance with norm rescale, as Qwen-Image's pipeline combines its two
    passes: `g = uncond + scale * (cond - uncond)`, then each token's vector rescaled to the
    conditional's norm, `g * |cond| / |g|` (norms over the last dim, the packed channels).

    cond, uncond: (B, S, 4C) velocities for the prompt and for the negative prompt. Returns (B, S, 4C).
    At scale 1 it is `cond` itself (the rescale is then 1)."""
    guided = uncond + scale * (cond - uncond)
    return guided * (cond.norm(dim=-1, keepdim=True) / guided.norm(dim=-1, keepdim=True))


class PixelDecoder:
    """Tiny config: the latent *is* the image. Channels 0-2 are RGB in [-1, 1]; channel 3 is unused."""

    def __call__(self, latents: torch.Tensor) -> torch.Tensor:
        """(B, C, h, w) -> (B, 3, h, w) in [0, 1]."""
        return ((latents[:, :3].float() + 1) / 2).clamp(0, 1)


class QwenVAEDecoder:
    """Real config: Qwen-Image's VAE (`AutoencoderKLQwenImage`) from a local checkpoint folder."""

    def __init__(self, path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> None:
        from diffusers import AutoencoderKLQwenImage

        path = Path(path)
        sub = "vae" if (path / "vae").is_dir() else None
        self.vae = AutoencoderKLQwenImage.from_pretrained(str(path), subfolder=sub, torch_dtype=dtype,
                                                          local_files_only=True).to(device).eval()

    @torch.no_grad()
    def __call__(self, latents: torch.Tensor) -> torch.Tensor:
        """(B, z, h, w) normalised latents -> (B, 3, 8h, 8w) in [0, 1]."""
        conf = self.vae.config
        mean = torch.tensor(conf.latents_mean).view(1, conf.z_dim, 1, 1, 1)
        std = torch.tensor(conf.latents_std).view(1, conf.z_dim, 1, 1, 1)
        z = latents.unsqueeze(2).float() * std.to(latents.device) + mean.to(latents.device)
        image = self.vae.decode(z.to(self.vae.dtype), return_dict=False)[0][:, :, 0]
        return ((image.float() + 1) / 2).clamp(0, 1)
