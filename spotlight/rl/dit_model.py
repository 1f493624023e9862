"""The DiT: a diffusers `QwenImageTransformer2DModel`, its latent packing, and latent decoding.

Latents are (B, C, h, w) images in latent space; the transformer sees them packed into 2x2 patches
as a token sequence (B, (h/2)·(w/2), 4C) and predicts the velocity in the same packed layout.

A DiT comes from the preset's architecture (random weights from the run seed) or from a folder
(`policy.dit.pretrained_path`, local or fetched once per node into its model cache:
`pretrained_folder`): a transformer alone, or a whole diffusers Qwen-Image
pipeline folder, whose text encoder, VAE and scheduler the policy then uses as well
(`DiTPolicy.from_config`). `check_pipeline_folder` refuses a folder that cannot work before
anything is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cloud.bounded_json import load_file
from spotlight.config import MAX_CONFIG_BYTES, ConfigError, DiTConfig, InputError, RunConfig
from spotlight.dit_presets import QWEN_IMAGE_TRANSFORMER, TINY_TRANSFORMER  # noqa: F401 - the presets, here too
from spotlight.rl.seeding import derive_seed

_MODEL_INIT = 0x1417  # stream tag for the random initialisation of a tiny model


def model_dtype(cfg: DiTConfig) -> torch.dtype:
    """What the DiT's transformer and text encoder compute in (the VAE decodes in float32 always,
    `dit_policy.conditioning`): float32 for the tiny preset (CPU bfloat16 matmuls are slow and too
    coarse for 1e-3 PPO ratios), bfloat16 for qwen-image (its released dtype; 41 GB of transformer
    weights). The preset decides, not the folder: a tiny pipeline folder on CPU runs in float32,
    the released one in bfloat16."""
    return torch.float32 if cfg.preset == "tiny" else torch.bfloat16


def transformer_folder(path: str | Path) -> Path:
    """Where a checkpoint folder keeps its transformer: transformer/ (a pipeline folder, or one
    holding only that), else the folder itself (a `save_pretrained` transformer)."""
    path = Path(path)
    return path / "transformer" if (path / "transformer").is_dir() else path


def pretrained_folder(cfg: DiTConfig) -> Path:
    """The local folder of `cfg.pretrained_path` on this node: the folder itself, or a remote
    source's cache folder, fetched first unless a fetch completed there
    (`cloud.model_cache.model_folder`). A source that cannot be had is one ConfigError line."""
    from cloud.model_cache import model_folder
    from cloud.store import StoreError

    try:
        return model_folder(str(cfg.pretrained_path))
    except (InputError, StoreError) as err:
        raise ConfigError(f"policy.dit.pretrained_path: {' '.join(str(err).split())}") from None


def transformer_arch(cfg: DiTConfig) -> dict[str, Any]:
    """The transformer's `QwenImageTransformer2DModel` keyword arguments: the folder's config.json
    when `cfg.pretrained_path` is set, else the preset's (`TINY_TRANSFORMER`, `QWEN_IMAGE_TRANSFORMER`)."""
    if not cfg.pretrained_path:
        return dict(TINY_TRANSFORMER if cfg.preset == "tiny" else QWEN_IMAGE_TRANSFORMER)
    config = load_file(transformer_folder(pretrained_folder(cfg)) / "config.json", max_bytes=MAX_CONFIG_BYTES)
    return {k: tuple(v) if isinstance(v, list) else v for k, v in config.items() if not k.startswith("_")}


def check_pipeline_folder(cfg: RunConfig, where: str = "") -> None:
    """ConfigError (one line naming the field) unless the DiT's `pretrained_path` can be used as
    it is: the folder's layout and configs (`DiTConfig.folder_problem`: missing components,
    shapes that do not fit together), and no synthetic warm start over a pipeline's weights (it
    trains the tiny random model on colour squares: it would overwrite what the pipeline learned).
    Reads file names and JSON configs only. `where`: the config file's "name: ", when there is one.
    `spotlight train` calls it before anything starts, `DiTPolicy.from_config` before it builds."""
    dit = cfg.policy.dit
    if cfg.policy.kind != "dit" or not dit.pretrained_path:
        return
    problem = dit.folder_problem()
    if problem is not None:
        raise ConfigError(f"{where}policy.dit.pretrained_path: {problem}")
    if dit.pipeline and cfg.warm_start.steps:
        raise ConfigError(f"{where}warm_start.steps: expected 0 with a pipeline folder as policy.dit.pretrained_path "
                          f"(the synthetic warm start is for the tiny random model; a pipeline starts from its "
                          f"own weights), got {cfg.warm_start.steps}")


def build_transformer(cfg: DiTConfig, seed: int, device: str = "cpu"):
    """The transformer of `cfg`: loaded from `cfg.pretrained_path` when set (its transformer/, or
    the folder itself), else randomly initialised (deterministically from `seed`), in
    `model_dtype(cfg)`."""
    from diffusers import QwenImageTransformer2DModel

    dtype = model_dtype(cfg)
    if cfg.pretrained_path:
        model = QwenImageTransformer2DModel.from_pretrained(
            str(transformer_folder(pretrained_folder(cfg))), dtype=dtype, local_files_only=True)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(seed, _MODEL_INIT))
            model = QwenImageTransformer2DModel(**transformer_arch(cfg))
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
    """A pipeline folder's VAE (`AutoencoderKLQwenImage`, its vae/): latents to pixels as
    `QwenImagePipeline` decodes them (un-normalised by the VAE's latents_mean and latents_std)."""

    def __init__(self, path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        from diffusers import AutoencoderKLQwenImage

        path = Path(path)
        sub = "vae" if (path / "vae").is_dir() else None
        self.vae = AutoencoderKLQwenImage.from_pretrained(str(path), subfolder=sub, dtype=dtype,
                                                          local_files_only=True).to(device).eval()

    @torch.no_grad()
    def __call__(self, latents: torch.Tensor) -> torch.Tensor:
        """(B, z, h, w) normalised latents -> (B, 3, s·h, s·w) in [0, 1], s the VAE's downsampling
        (8 for Qwen-Image's)."""
        conf = self.vae.config
        mean = torch.tensor(conf.latents_mean).view(1, conf.z_dim, 1, 1, 1)
        std = torch.tensor(conf.latents_std).view(1, conf.z_dim, 1, 1, 1)
        z = latents.unsqueeze(2).float() * std.to(latents.device) + mean.to(latents.device)
        image = self.vae.decode(z.to(self.vae.dtype), return_dict=False)[0][:, :, 0]
        return ((image.float() + 1) / 2).clamp(0, 1)
