"""Measured denoising-step seconds of a Qwen-Image-class transformer, as step-time files for the
simulator: `python -m experiments.measure_step_times --out DIR [--preset qwen-image] [--device cuda]
[--resolutions 512 1280] [--steps 10] [--guidance 4] [--lora-rank 64]`.

For each resolution, one sample's denoising step — a transformer forward on random packed latents
with random weights (a forward's time does not depend on the values) — is timed without and with
true classifier-free guidance (the prompt's and the negative prompt's passes combined by
`spotlight.rl.dit_model.true_cfg`, as `sampler.guidance` > 1 samples), after warm-up steps, with
CUDA synchronised around the timed loop. The real preset runs in bfloat16 (as training does) and
is built directly on the device (20.4B parameters: 41 GB; an H100 or H200 holds it with the
activations of a 1280² image), the tiny preset in float32 (the CPU smoke test).

Then the update's cost with LoRA: peft adapters of `--lora-rank` (alpha 2x rank) are injected on
the default targets (`spotlight.rl.lora.add_lora`, as `policy.lora` trains), and one (sample, SDE
step) row of the update — forward and backward through the frozen base into the adapters, plain
and guided — is timed the same way (`lora_train_s`, `lora_train_guided_s`). The update's seconds
per sample are that row's times the SDE steps it trains on (`sampler.sde_window`). The real preset
turns on the transformer's gradient checkpointing first (without it the backward's activations
of a 1280² image do not fit beside 41 GB of weights); a resolution whose row still runs out of
GPU memory is recorded as such. `--lora-rank 0` skips this part.

Writes DIR/<gpu>-<resolution>.yaml for each resolution — a step-time file that `spotlight simulate
--step-times FILE --resolution R` reads (`gpu`, `denoise_step_s`: one pass at degree 1,
`cfg_factor`: the guided step over the plain one, `train_flops_factor`: the LoRA row over the
plain forward, all measured) — and DIR/measured.json with every figure. Not measured here: the
NCCL Ulysses path (tests/test_elastic_sp_gpu.py checks it on two GPUs).
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


def _inputs(model: torch.nn.Module, preset: str, resolution: int, device: str) -> dict:
    """One sample's random packed latents at `resolution`, its prompt and negative prompt
    embeddings, mask and sigma (values do not change a step's time)."""
    side = resolution // VAE_SCALE[preset]
    if side % 2:
        raise ValueError(f"--resolutions: {resolution} px gives a latent side of {side}, not divisible by 2")
    gen = torch.Generator(device="cpu").manual_seed(0)
    text = (1, TEXT_TOKENS[preset], model.config.joint_attention_dim)
    return {"side": side, "x": torch.randn(1, (side // 2) ** 2, model.config.in_channels, generator=gen).to(device),
            "emb": torch.randn(*text, generator=gen).to(device), "neg": torch.randn(*text, generator=gen).to(device),
            "mask": torch.ones(1, TEXT_TOKENS[preset], dtype=torch.long, device=device),
            "sigma": torch.full((1,), 0.5, device=device)}


def _velocities(model: torch.nn.Module, i: dict, guidance: float | None) -> torch.Tensor:
    """The step's velocity: one pass, or (with `guidance`) the guided pair combined by `true_cfg`."""
    v = velocity(model, i["x"], i["sigma"], i["emb"], i["mask"], i["side"])
    if guidance is None:
        return v
    return true_cfg(v, velocity(model, i["x"], i["sigma"], i["neg"], i["mask"], i["side"]), guidance)


def _seconds(fn, device: str, steps: int, warmup: int) -> float:
    """Mean seconds of `fn()` over `steps` calls after `warmup` ones, CUDA synchronised around them."""
    for _ in range(warmup):
        fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / steps


@torch.no_grad()
def step_seconds(model: torch.nn.Module, preset: str, resolution: int, device: str, steps: int,
                 warmup: int, guidance: float) -> dict[str, float]:
    """Seconds of one sample's denoising step at `resolution`, plain and guided (mean of `steps`)."""
    i = _inputs(model, preset, resolution, device)
    out = {"image_tokens": i["x"].shape[1]}
    for name, scale in (("plain_s", None), ("guided_s", guidance)):
        out[name] = _seconds(lambda: _velocities(model, i, scale), device, steps, warmup)
    return out


def lora_row_seconds(model: torch.nn.Module, preset: str, resolution: int, device: str, steps: int,
                     warmup: int, guidance: float) -> dict[str, float | None]:
    """Seconds of one (sample, SDE step) row of the update with LoRA: forward and backward into
    the adapters (the base frozen), plain and guided (mean of `steps`); None where the GPU ran out
    of memory."""
    i = _inputs(model, preset, resolution, device)
    out: dict[str, float | None] = {}
    for name, scale in (("lora_train_s", None), ("lora_train_guided_s", guidance)):
        try:
            out[name] = _seconds(lambda: _velocities(model, i, scale).float().square().mean().backward(),
                                 device, steps, warmup)
        except torch.OutOfMemoryError:
            out[name] = None
        model.zero_grad(set_to_none=True)
    return out


def add_adapters(model: torch.nn.Module, preset: str, rank: int) -> int:
    """Inject LoRA adapters of `rank` (alpha 2x rank) on the default targets, as `policy.lora`
    does; returns their parameter count."""
    from spotlight.config import default_config
    from spotlight.rl.lora import add_lora, trainable

    add_lora(model, default_config({"policy": {"lora": {"rank": rank, "alpha": 2 * rank}}}))
    if preset != "tiny":
        model.enable_gradient_checkpointing()
    model.train()
    return sum(p.numel() for p in trainable(model))


def gpu_name(device: str) -> str:
    """A name for the file and the step-time `gpu` field: the CUDA device's, else "cpu"."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"


def measure(out: Path, preset: str = "qwen-image", device: str = "cuda", resolutions: tuple[int, ...] = (512, 1280),
            steps: int = 10, warmup: int = 2, guidance: float = 4.0, lora_rank: int = 64) -> dict:
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
        rows.append({"resolution": resolution, **figures, "cfg_factor": figures["guided_s"] / figures["plain_s"]})
    adapter_params = add_adapters(model, preset, lora_rank) if lora_rank else 0
    for row in rows:
        step_times = {"gpu": gpu, "denoise_step_s": row["plain_s"], "cfg_factor": row["cfg_factor"]}
        lora = ""
        if lora_rank:
            row.update(lora_row_seconds(model, preset, row["resolution"], device, steps, warmup, guidance))
            if row["lora_train_s"] is not None:
                row["train_flops_factor"] = step_times["train_flops_factor"] = row["lora_train_s"] / row["plain_s"]
                lora = f"; LoRA update row {row['lora_train_s'] * 1e3:.2f} ms ({row['train_flops_factor']:.2f}x)"
            else:
                lora = "; LoRA update row: out of GPU memory"
        step_file = out / f"{slug}-{row['resolution']}.yaml"
        step_file.write_text(
            f"# {preset} transformer, {row['resolution']}x{row['resolution']} px, measured by "
            "experiments/measure_step_times.py\n" + yaml.safe_dump(step_times, sort_keys=False))
        print(f"{row['resolution']} px ({row['image_tokens']} tokens): {row['plain_s'] * 1e3:.2f} ms per step, "
              f"{row['guided_s'] * 1e3:.2f} ms with CFG ({row['cfg_factor']:.2f}x){lora} -> {step_file}")
    result = {"preset": preset, "gpu": gpu, "device": device, "dtype": str(next(model.parameters()).dtype),
              "torch": torch.__version__, "steps": steps, "warmup": warmup, "guidance": guidance,
              "lora_rank": lora_rank, "lora_params": adapter_params,
              "gradient_checkpointing": bool(lora_rank) and preset != "tiny", "rows": rows}
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
    p.add_argument("--lora-rank", type=int, default=64, help="rank of the LoRA update's row (0: not measured)")
    a = p.parse_args(argv)
    if a.steps < 1 or a.warmup < 0 or a.guidance < 1 or not 0 <= a.lora_rank <= 4096:
        p.error("expected --steps >= 1, --warmup >= 0, --guidance >= 1 and --lora-rank in 0..4096")
    measure(a.out, a.preset, a.device, tuple(a.resolutions), a.steps, a.warmup, a.guidance, a.lora_rank)


if __name__ == "__main__":
    main()
