"""Rewards: a rollout in, one float per sample out.

Built in, needing no downloaded weights:
- `colour` — prompt-conditioned: mean over pixels of exp(-|rgb - target|² / width), target named
  by the prompt (see `prompts.COLOURS`); 1 for a perfect solid image of the named colour.
- `jpeg_compressibility` / `jpeg_incompressibility` — as in DDPO: minus / plus the JPEG size in kB.
- `arithmetic` — the LLM's verifiable reward: 1 when the completion is the right sum, else 0.

Model-based rewards plug in by name. `clip_score` (CLIP or PickScore weights, a local folder given
as `reward.model_path`) ships here; other packages register theirs (OCR, GenEval, ...) under the
`spotlight.rewards` entry-point group as a factory `f(RewardConfig) -> Reward`.
"""

from __future__ import annotations

import io
from importlib.metadata import entry_points
from pathlib import Path
from typing import Callable, Protocol

import numpy as np
import torch

from spotlight.config import ConfigError, RewardConfig
from spotlight.rl.policy import Rollout
from spotlight.rl.prompts import arithmetic_answer, colour_of


class Reward(Protocol):
    def __call__(self, rollout: Rollout) -> torch.Tensor:
        """rollout of N samples -> rewards (N,) float32."""
        ...


def _images(rollout: Rollout) -> torch.Tensor:
    if rollout.images is None:
        raise ValueError("this reward scores images, and the rollout has none (is the policy an LLM?)")
    return rollout.images


class ColourReward:
    def __init__(self, width: float) -> None:
        self.width = width

    def __call__(self, rollout: Rollout) -> torch.Tensor:
        images = _images(rollout).float()
        target = torch.tensor([colour_of(p.text) for p in rollout.prompts], device=images.device)
        dist2 = ((images - target[:, :, None, None]) ** 2).sum(dim=1)
        return torch.exp(-dist2 / self.width).mean(dim=(1, 2)).cpu()


def jpeg_kilobytes(images: torch.Tensor, quality: int = 95) -> torch.Tensor:
    """(N, 3, H, W) in [0, 1] -> (N,) JPEG sizes in kB at `quality` (DDPO's setting: 95)."""
    from PIL import Image

    arrays = (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    sizes = []
    for arr in arrays:
        buf = io.BytesIO()
        Image.fromarray(np.ascontiguousarray(arr)).save(buf, format="JPEG", quality=quality)
        sizes.append(buf.tell() / 1000)
    return torch.tensor(sizes, dtype=torch.float32)


class JpegReward:
    def __init__(self, sign: float) -> None:
        self.sign = sign

    def __call__(self, rollout: Rollout) -> torch.Tensor:
        return self.sign * jpeg_kilobytes(_images(rollout))


class ArithmeticReward:
    def __call__(self, rollout: Rollout) -> torch.Tensor:
        if rollout.completions is None:
            raise ValueError("the arithmetic reward scores completions, and the rollout has none")
        return torch.tensor(
            [float(c.strip() == str(arithmetic_answer(p.text))) for p, c in zip(rollout.prompts, rollout.completions)]
        )


class ClipScoreReward:
    """PickScore-style preference: logit_scale · cos(text, image) from a local CLIP checkpoint."""

    def __init__(self, path: str | Path, device: str = "cpu") -> None:
        from transformers import AutoModel, AutoProcessor

        self.processor = AutoProcessor.from_pretrained(str(path), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(path), local_files_only=True).to(device).eval()
        self.device = device

    @torch.no_grad()
    def __call__(self, rollout: Rollout) -> torch.Tensor:
        images = list((_images(rollout).clamp(0, 1) * 255).round().to(torch.uint8).cpu())
        inputs = self.processor(text=[p.text for p in rollout.prompts], images=images, return_tensors="pt",
                                padding=True, truncation=True).to(self.device)
        out = self.model(**inputs)
        img = torch.nn.functional.normalize(out.image_embeds, dim=-1)
        txt = torch.nn.functional.normalize(out.text_embeds, dim=-1)
        return (self.model.logit_scale.exp() * (img * txt).sum(dim=-1)).float().cpu()


def _clip_score(cfg: RewardConfig) -> Reward:
    if not cfg.model_path or not Path(cfg.model_path).is_dir():
        raise ConfigError(f"reward.model_path: expected a local CLIP/PickScore folder for clip_score, got {cfg.model_path!r}")
    return ClipScoreReward(cfg.model_path)


BUILTIN: dict[str, Callable[[RewardConfig], Reward]] = {
    "colour": lambda cfg: ColourReward(cfg.colour_width),
    "jpeg_compressibility": lambda cfg: JpegReward(-1.0),
    "jpeg_incompressibility": lambda cfg: JpegReward(1.0),
    "arithmetic": lambda cfg: ArithmeticReward(),
    "clip_score": _clip_score,
}


def available() -> dict[str, Callable[[RewardConfig], Reward]]:
    """Built-in rewards plus those registered under the `spotlight.rewards` entry-point group."""
    found = dict(BUILTIN)
    for ep in entry_points(group="spotlight.rewards"):
        found.setdefault(ep.name, ep.load())
    return found


def build_reward(cfg: RewardConfig) -> Reward:
    factories = available()
    if cfg.name not in factories:
        raise ConfigError(f"reward.name: expected one of {', '.join(sorted(factories))}, got {cfg.name!r}")
    return factories[cfg.name](cfg)


class RewardWorker:
    """The stateless reward role: scores per-request rollouts (a Ray actor in the ray runtime)."""

    def __init__(self, cfg: RewardConfig) -> None:
        self.reward = build_reward(cfg)

    def score(self, parts: list[Rollout]) -> torch.Tensor:
        """Rewards of all samples of `parts`, in order: (sum of len(part),)."""
        return torch.cat([self.reward(p).float() for p in parts])
