"""Text rendering on CPU (experiments/tiny_dit_ocr.yaml): the text warm start's images, its cache key,
and the tiny DiT learning two-digit numbers from the OCR reward."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spotlight.config import ConfigError, RunConfig, default_config, load_config, to_yaml
from spotlight.rl.prompt_file import run_prompts
from spotlight.rl.synthetic_images import TEXT_SWAP, _ink, synthetic_text_images

ROOT = Path(__file__).resolve().parents[3]


def test_text_images_draw_the_quoted_digits_black_on_white_some_swapped():
    g = torch.Generator().manual_seed(0)
    images = synthetic_text_images(['a sign that says "42"'] * 400, 16, g)
    assert images.shape == (400, 3, 16, 16) and images.min() == 0 and images.max() == 1
    assert (images[:, :, 0, :] == 1).all()  # white margins
    exact = (images == 1 - _ink("42", 16)).flatten(1).all(dim=1).float().mean().item()
    # Both digits kept: each is kept, or swapped for itself (1 in 10), with chance 1 - 0.9 x TEXT_SWAP.
    assert exact == pytest.approx((1 - 0.9 * TEXT_SWAP) ** 2, abs=0.07)


def test_ocr_reads_two_digits_in_a_16_pixel_render():
    from PIL import Image

    from spotlight.rl.ocr_reward import OcrReward

    pixels = (1 - _ink("42", 16)).mul(255).round().to(torch.uint8).numpy()
    assert OcrReward().score([Image.fromarray(pixels).convert("RGB")], ["42"]) == [1.0]


def test_the_text_warm_start_has_its_own_cache_and_leaves_colour_caches_where_they_were(monkeypatch):
    from spotlight.rl.warm_start import cache_path

    colours = cache_path(default_config())
    assert cache_path(default_config({"warm_start": {"data": "text"}})) != colours
    # A config written before `warm_start.data` existed (no such key) finds the same colour cache.
    to_dict = RunConfig.to_dict

    def without_data(self):
        d = to_dict(self)
        del d["warm_start"]["data"]
        return d

    monkeypatch.setattr(RunConfig, "to_dict", without_data)
    assert cache_path(default_config()) == colours


def test_the_text_warm_start_refuses_prompts_with_no_quoted_text(tmp_path):
    from spotlight.rl.warm_start import apply_warm_start

    (tmp_path / "p.txt").write_text('a sign that says "42"\na red image\n')
    cfg = default_config({"prompts": {"path": str(tmp_path / "p.txt")},
                          "warm_start": {"data": "text", "cache_dir": str(tmp_path)}})
    with pytest.raises(ConfigError, match=r"warm_start.data: .*/p.txt line 2 \('a red image'\) has none"):
        apply_warm_start(None, cfg, run_prompts(cfg.prompts, cfg.seed))


def test_the_recipe_runs_from_the_repository_root_and_scores_every_sample_by_ocr(tmp_path):
    """A smoke run of the recipe as a user starts it (from the repository root, where its relative
    prompts.path points), shortened: a 60-step text warm start and 2 iterations. That it *learns* is
    a measurement, not a test (3.5 min on one core: docs/measurements.md, "Your own task")."""
    cfg = load_config(ROOT / "experiments/tiny_dit_ocr.yaml", {
        "runtime": {"kind": "local"}, "train": {"steps": 2, "prompts_per_step": 4, "group_size": 4},
        "warm_start": {"steps": 60, "cache_dir": str(tmp_path / "cache")}})
    (tmp_path / "run.yaml").write_text(to_yaml(cfg))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "spotlight.cli", "train", str(tmp_path / "run.yaml"), "--out", str(out),
                           "--json", "--no-progress"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["samples"] for r in rows] == [16, 16]
    assert all(r["reward_ocr_mean"] == r["reward_mean"] and 0 <= r["reward_mean"] <= 1 for r in rows)
    assert (out / "final" / "diffusion_pytorch_model.safetensors").is_file()
