"""What an evaluation shows a person: a DiT's samples as one image grid with their prompts, an LLM's
completions as JSON lines, both under the run folder's `eval/` (`train.eval_every`).

The grid has a row per evaluation prompt and a column per evaluation seed, each cell the sample
scaled up (nearest neighbour) to at least `CELL_PX` pixels so a 16-pixel tiny-DiT sample is
visible, with its reward under it and the prompt above the row. Prompts and seeds are fixed for
the run, so grids of successive evaluations compare cell by cell.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

CELL_PX = 128
"""Smallest side of a grid cell in pixels."""
CAPTION_PX = 14
"""Height of one caption line (the prompt above a row, the reward under a cell)."""
_PAD = 4


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)  # Pillow >= 10.1: a scalable font
    except TypeError:
        return ImageFont.load_default()


def image_grid(images: torch.Tensor, prompts: Sequence[str], rewards: Sequence[float], columns: int):
    """A PIL image: `images` (N, 3, H, W) in [0, 1], N = rows x `columns` with sample i in row
    i // columns; `prompts` one per row; `rewards` one per sample."""
    from PIL import Image, ImageDraw

    n, _, h, w = images.shape
    rows = n // columns
    scale = max(1, -(-CELL_PX // max(h, w)))
    cell_w, cell_h = w * scale, h * scale
    chars = max(20, (cell_w + _PAD) * columns // 7)  # ~7 px a character at CAPTION_PX
    wrapped = [textwrap.wrap(p, chars)[:3] or [""] for p in prompts]
    heights = [len(lines) * CAPTION_PX + _PAD + cell_h + CAPTION_PX + _PAD for lines in wrapped]
    width = columns * (cell_w + _PAD) + _PAD
    grid = Image.new("RGB", (width, sum(heights) + _PAD), "white")
    draw = ImageDraw.Draw(grid)
    font = _font(CAPTION_PX - 2)
    pixels = (images.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    y = _PAD
    for r in range(rows):
        for k, line in enumerate(wrapped[r]):
            draw.text((_PAD, y + k * CAPTION_PX), line, fill="black", font=font)
        top = y + len(wrapped[r]) * CAPTION_PX + _PAD
        for c in range(columns):
            i = r * columns + c
            cell = Image.fromarray(np.ascontiguousarray(pixels[i])).resize((cell_w, cell_h), Image.NEAREST)
            x = _PAD + c * (cell_w + _PAD)
            grid.paste(cell, (x, top))
            draw.text((x, top + cell_h + 1), f"{rewards[i]:.3f}", fill="black", font=font)
        y += heights[r]
    return grid


def write_evaluation(folder: Path, step: int, rollout, seeds_per_prompt: int, rewards: torch.Tensor) -> Path:
    """Write evaluation `step`'s samples under `folder` (`eval/`): `step-NNNNNN.png` for a rollout with
    images, `step-NNNNNN.jsonl` for one with completions: a line per sample with its `prompt`, `line`
    (the prompt's line in its file, 1-based; null for a built-in set), `prompt_id` (its index in the
    training set, or `EVAL_PROMPT_ID0` = 2**32 + its index in an evaluation file of its own, so that
    evaluation never shares a random stream with training), `seed`, `completion` and `reward`.
    Returns the file written."""
    folder.mkdir(parents=True, exist_ok=True)
    rewards = rewards.float().tolist()
    if rollout.images is not None:
        path = folder / f"step-{step:06d}.png"
        prompts = [p.text for p in rollout.prompts[::seeds_per_prompt]]
        image_grid(rollout.images, prompts, rewards, seeds_per_prompt).save(path)
        return path
    path = folder / f"step-{step:06d}.jsonl"
    with open(path, "w") as f:
        for p, seed, completion, reward in zip(rollout.prompts, rollout.seeds, rollout.completions, rewards):
            f.write(json.dumps({"prompt": p.text, "line": p.line, "prompt_id": p.id, "seed": seed,
                                "completion": completion, "reward": reward}) + "\n")
    return path
