"""Measured denoising-step seconds of a Qwen-Image-class transformer, as step-time files for the
simulator: `python -m experiments.measure_step_times --out DIR [--preset qwen-image] [--device cuda]
[--resolutions 512 1280] [--steps 10] [--guidance 4]`.

For each resolution, one sample's denoising step — a transformer forward on random packed latents
with random weights (a forward's time does not depend on the values) — is timed without and with
true classifier-free guidance (the prompt's and the negative prompt's passes combined by
`spotlight.rl.dit_model.true_cfg`, as `sampler.guidance` > 1 samples), after warm-up steps, with
CUDA synchronised around the timed loop. The real preset runs in bfloat16 (as training does) and
is built directly on the device (20.4B parameters: 41 GB; an H100 or H200 holds it with the
activations of a 1280² image), the tiny preset in float32 (the CPU smoke test).

Writes DIR/<gpu>-<resolution>.yaml for each resolution — a step-time file that `spotlight simulate
--step-times FILE --resolution R` reads (`gpu`, `denoise_step_s`: one pass at degree 1,
`cfg_factor`: the guided step over the plain one, measured) — and DIR/measured.json with every
figure. Not measured here: the update's seconds per sample with LoRA (no LoRA yet) and the NCCL
Ulysses path (tests/test_elastic_sp_gpu.py checks it on two GPUs).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import torch
import yaml

from spotlight.rl.dit_model import QWEN_IMAGE_TRANSFORMER, TINY_TRANSFORMER, true_cfg, velocity

VAE_SCALE = {"tiny": 1, "qwen-image": 8}
"""Pixels per latent cell: the tiny DiT's latent is the image; Qwen-Image's VAE downsamples 8x."""
TEXT_TOKENS = {"tiny": 8, "qwen-image": 64}
"""Prompt tokens the transformer attends to (a short prompt for Qwen-Image)."""


def build(preset: str, device: str) -> torch.nn.Module:
    """The preset's transformer with random weights, made on `device` in its run dtype (bfloat16 for
    qwen-image: built on the device directly, never 82 GB of float32 in host memory)."""
    from diffusers import QwenImageTransformer2DModel

    arch = TINY_TRANSFORMER if preset == "tiny" else QWEN_IMAGE_TRANSFORMER
    dtype = torch.float32 if preset == "tiny" else torch.bfloat16
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = QwenImageTransformer2DModel(**arch)
    finally:
        torch.set_default_dtype(before)
    return model.eval().requires_grad_(False)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@torch.no_grad()
def step_seconds(model: torch.nn.Module, preset: str, resolution: int, device: str, steps: int,
                 warmup: int, guidance: float) -> dict[str, float]:
    """Seconds of one sample's denoising step at `resolution`, plain and guided (mean of `steps`)."""
    side = resolution // VAE_SCALE[preset]
    if side % 2:
        raise ValueError(f"--resolutions: {resolution} px gives a latent side of {side}, not divisible by 2")
    gen = torch.Generator(device="cpu").manual_seed(0)
    tokens, channels = (side // 2) ** 2, model.config.in_channels
    x = torch.randn(1, tokens, channels, generator=gen).to(device)
    emb = torch.randn(1, TEXT_TOKENS[preset], model.config.joint_attention_dim, generator=gen).to(device)
    neg = torch.randn(1, TEXT_TOKENS[preset], model.config.joint_attention_dim, generator=gen).to(device)
    mask = torch.ones(1, TEXT_TOKENS[preset], dtype=torch.long, device=device)
    sigma = torch.full((1,), 0.5, device=device)

    def plain() -> torch.Tensor:
        return velocity(model, x, sigma, emb, mask, side)

    def guided() -> torch.Tensor:
        return true_cfg(plain(), velocity(model, x, sigma, neg, mask, side), guidance)

    out = {"image_tokens": tokens}
    for name, fn in (("plain_s", plain), ("guided_s", guided)):
        for _ in range(warmup):
            fn()
        _sync(device)
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        _sync(device)
        out[name] = (time.perf_counter() - start) / steps
    return out


def gpu_name(device: str) -> str:
    """A name for the file and the step-time `gpu` field: the CUDA device's, else "cpu"."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"


def measure(out: Path, preset: str = "qwen-image", device: str = "cuda", resolutions: tuple[int, ...] = (512, 1280),
            steps: int = 10, warmup: int = 2, guidance: float = 4.0) -> dict:
    """Measure, write the step-time files and measured.json into `out`; returns what measured.json holds."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("measure_step_times: --device cuda, but this machine has no CUDA GPU "
                         "(use --preset tiny --device cpu for a smoke run)")
    out.mkdir(parents=True, exist_ok=True)
    model = build(preset, device)
    gpu = gpu_name(device)
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    rows = []
    for resolution in resolutions:
        figures = step_seconds(model, preset, resolution, device, steps, warmup, guidance)
        row = {"resolution": resolution, **figures, "cfg_factor": figures["guided_s"] / figures["plain_s"]}
        rows.append(row)
        step_file = out / f"{slug}-{resolution}.yaml"
        step_file.write_text(
            f"# {preset} transformer, {resolution}x{resolution} px, measured by experiments/measure_step_times.py\n"
            + yaml.safe_dump({"gpu": gpu, "denoise_step_s": figures["plain_s"], "cfg_factor": row["cfg_factor"]},
                             sort_keys=False))
        print(f"{resolution} px ({figures['image_tokens']} tokens): {figures['plain_s'] * 1e3:.2f} ms per step, "
              f"{figures['guided_s'] * 1e3:.2f} ms with CFG ({row['cfg_factor']:.2f}x) -> {step_file}")
    result = {"preset": preset, "gpu": gpu, "device": device, "dtype": str(next(model.parameters()).dtype),
              "torch": torch.__version__, "steps": steps, "warmup": warmup, "guidance": guidance, "rows": rows}
    (out / "measured.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for the step-time files and measured.json")
    p.add_argument("--preset", choices=sorted(VAE_SCALE), default="qwen-image")
    p.add_argument("--device", default="cuda")
    p.add_argument("--resolutions", type=int, nargs="+", default=[512, 1280], help="image sides in pixels")
    p.add_argument("--steps", type=int, default=10, help="timed steps per figure")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--guidance", type=float, default=4.0, help="the CFG scale of the guided figure")
    a = p.parse_args(argv)
    if a.steps < 1 or a.warmup < 0 or a.guidance < 1:
        p.error("expected --steps >= 1, --warmup >= 0 and --guidance >= 1")
    measure(a.out, a.preset, a.device, tuple(a.resolutions), a.steps, a.warmup, a.guidance)


if __name__ == "__main__":
    main()
