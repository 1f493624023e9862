"""Measured denoising-step seconds of a Qwen-Image-class transformer, as step-time files for the
simulator: `python -m experiments.measure_step_times --out DIR [--preset qwen-image] [--device cuda]
[--resolutions 512 1280] [--batch 1] [--steps 10] [--guidance 4] [--lora-rank 64] [--full-row]`.

For each resolution, one sample's denoising step (or `--batch` samples in one pass, every figure then
divided by the batch: per sample) — a transformer forward on random packed latents
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
GPU memory is recorded as such. `--lora-rank 0` skips this part. On CUDA each row also records the
memory it needed besides what the model held before it (`*_extra_gib`: activations, recomputed
block, workspaces, the allocator's slack) — the simulator's `activation_gib`.

`--full-row` first times the same row with every parameter trained (a full fine-tune's micro-batch
on a fleet worker: weights, their gradients and the activations on one GPU), plain and guided, at
the first resolution; it records the peak memory, or that the GPU ran out (`full_train_s` None). With LoRA
it then times what the learner does per round besides receiving the parts (`learner`): one part
added onto the sum of the adapters' gradients, the clip and an AdamW step over the adapters, and
their copy to host memory for the publication.

Writes DIR/<gpu>-<resolution>.yaml for each resolution — a step-time file that `spotlight simulate
--step-times FILE --resolution R` reads (`gpu`, `denoise_step_s`: one pass at degree 1,
`cfg_factor`: the guided step over the plain one, `train_flops_factor`: the LoRA row over the
plain forward, all measured) — and DIR/measured.json with every figure. Not measured here: the
NCCL Ulysses path (tests/elastic_sp/test_elastic_sp_gpu.py checks it on two GPUs).
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
from spotlight.sim.transfers import GIB

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


def _inputs(model: torch.nn.Module, preset: str, resolution: int, device: str, batch: int = 1) -> dict:
    """`batch` samples' random packed latents at `resolution`, their prompt and negative prompt
    embeddings, masks and sigmas (values do not change a step's time)."""
    side = resolution // VAE_SCALE[preset]
    if side % 2:
        raise ValueError(f"--resolutions: {resolution} px gives a latent side of {side}, not divisible by 2")
    gen = torch.Generator(device="cpu").manual_seed(0)
    text = (batch, TEXT_TOKENS[preset], model.config.joint_attention_dim)
    return {"side": side, "x": torch.randn(batch, (side // 2) ** 2, model.config.in_channels, generator=gen).to(device),
            "emb": torch.randn(*text, generator=gen).to(device), "neg": torch.randn(*text, generator=gen).to(device),
            "mask": torch.ones(batch, TEXT_TOKENS[preset], dtype=torch.long, device=device),
            "sigma": torch.full((batch,), 0.5, device=device)}


def _velocities(model: torch.nn.Module, i: dict, guidance: float | None) -> torch.Tensor:
    """The step's velocity: one pass, or (with `guidance`) the guided pair combined by `true_cfg`."""
    v = velocity(model, i["x"], i["sigma"], i["emb"], i["mask"], i["side"])
    if guidance is None:
        return v
    return true_cfg(v, velocity(model, i["x"], i["sigma"], i["neg"], i["mask"], i["side"]), guidance)


def _extra_gib(device: str, before: int) -> float | None:
    """GiB the work since `torch.cuda.reset_peak_memory_stats` held at its peak over `before` bytes."""
    return (torch.cuda.max_memory_allocated() - before) / GIB if device.startswith("cuda") else None


def _reset_peak(device: str) -> int:
    """Start a peak-memory reading; returns the bytes allocated now (0 off CUDA)."""
    if not device.startswith("cuda"):
        return 0
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


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
                 warmup: int, guidance: float, batch: int = 1) -> dict[str, float]:
    """Seconds of one sample's denoising step at `resolution`, plain and guided (mean of `steps`
    passes of `batch` samples, divided by `batch`)."""
    i = _inputs(model, preset, resolution, device, batch)
    out = {"image_tokens": i["x"].shape[1]}
    for name, scale in (("plain_s", None), ("guided_s", guidance)):
        out[name] = _seconds(lambda: _velocities(model, i, scale), device, steps, warmup) / batch
    return out


def lora_row_seconds(model: torch.nn.Module, preset: str, resolution: int, device: str, steps: int,
                     warmup: int, guidance: float, batch: int = 1) -> dict[str, float | None]:
    """Seconds of one (sample, SDE step) row of the update with LoRA: forward and backward into
    the adapters (the base frozen), plain and guided (mean of `steps`); None where the GPU ran out
    of memory."""
    return train_row_seconds(model, "lora_train", preset, resolution, device, steps, warmup, guidance, batch)


def train_row_seconds(model: torch.nn.Module, prefix: str, preset: str, resolution: int, device: str, steps: int,
                      warmup: int, guidance: float, batch: int = 1) -> dict[str, float | None]:
    """Seconds of one update row (forward and backward into what requires grad; rows of `batch`
    samples, divided by `batch`), plain and guided, and on CUDA the memory each needed besides
    what was held before it (`<prefix>_s`, `<prefix>_guided_s`, `..._extra_gib`); None where the
    GPU ran out of memory."""
    i = _inputs(model, preset, resolution, device, batch)
    out: dict[str, float | None] = {}
    for name, scale in ((prefix, None), (f"{prefix}_guided", guidance)):
        before = _reset_peak(device)
        try:
            out[f"{name}_s"] = _seconds(lambda: _velocities(model, i, scale).float().square().mean().backward(),
                                        device, steps, warmup) / batch
        except torch.OutOfMemoryError:
            out[f"{name}_s"] = None
        out[f"{name}_extra_gib"] = _extra_gib(device, before)
        model.zero_grad(set_to_none=True)
    return out


def full_row_seconds(model: torch.nn.Module, preset: str, resolution: int, device: str, steps: int,
                     warmup: int, guidance: float, batch: int = 1) -> dict[str, float | None]:
    """The update row with every parameter trained (gradient checkpointing on the real preset), plain
    and guided: a full fine-tune's micro-batch on one GPU; the model is frozen again afterwards."""
    model.requires_grad_(True)
    if preset != "tiny":
        model.enable_gradient_checkpointing()
    model.train()
    try:
        return train_row_seconds(model, "full_train", preset, resolution, device, steps, warmup, guidance, batch)
    finally:
        model.requires_grad_(False).eval()
        if preset != "tiny":
            model.disable_gradient_checkpointing()


def learner_seconds(model: torch.nn.Module, device: str, steps: int, warmup: int) -> dict[str, float]:
    """What the learner does per round with the adapters' gradients besides receiving them: one part
    added onto the sum (`part_sum_s`), the norm clip and an AdamW step (`optimizer_step_s`), and the
    adapters' copy to host memory for the publication, per tensor into fresh pageable memory as
    `tensor.to("cpu")` does (`publish_to_host_s`) and into pinned buffers allocated once
    (`publish_to_pinned_s`), and its size (`publication_bytes`)."""
    from spotlight.rl.lora import trainable

    params = trainable(model)
    for p in params:
        p.grad = torch.randn_like(p)
    part = [torch.randn_like(p) for p in params]
    grads = [p.grad for p in params]
    opt = torch.optim.AdamW(params, lr=1e-4)
    pinned = [torch.empty(p.shape, dtype=p.dtype, pin_memory=device.startswith("cuda")) for p in params]

    def step() -> None:
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    out = {"part_sum_s": _seconds(lambda: torch._foreach_add_(grads, part), device, steps, warmup),
           "optimizer_step_s": _seconds(step, device, steps, warmup),
           "publish_to_host_s": _seconds(lambda: [p.detach().to("cpu") for p in params], device, steps, warmup),
           "publish_to_pinned_s": _seconds(lambda: [b.copy_(p.detach(), non_blocking=True) for b, p in zip(pinned, params)],
                                           device, steps, warmup),
           "publication_bytes": sum(p.numel() * p.element_size() for p in params)}
    del opt, part, pinned
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
    """The device's own name: the CUDA device's ("NVIDIA H100 80GB HBM3"), else "cpu"."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu"


def simulator_gpu(name: str) -> str:
    """The step-time `gpu` field for a device name: the simulator's GPU it names ("NVIDIA H100 80GB
    HBM3" -> "H100", "NVIDIA A100-SXM4-80GB" -> "A100-80GB"), so that its memory and prices apply;
    the name itself where it names none."""
    from spotlight.iteration.iteration_time import PEAK_BF16_FLOPS

    words = set(re.split(r"[^A-Za-z0-9]+", name.upper()))
    known = [k for k in PEAK_BF16_FLOPS if set(k.upper().split("-")) <= words]
    return max(known, key=len) if known else name


def measure(out: Path, preset: str = "qwen-image", device: str = "cuda", resolutions: tuple[int, ...] = (512, 1280),
            steps: int = 10, warmup: int = 2, guidance: float = 4.0, lora_rank: int = 64,
            full_row: bool = False, batch: int = 1) -> dict:
    """Measure, write the step-time files and measured.json into `out`; returns what measured.json holds."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("measure_step_times: --device cuda, but this machine has no CUDA GPU "
                         "(use --preset tiny --device cpu for a smoke run)")
    out.mkdir(parents=True, exist_ok=True)
    model = build(preset, device)
    device_name = gpu_name(device)
    gpu = simulator_gpu(device_name)
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")
    rows = []
    for resolution in resolutions:
        figures = step_seconds(model, preset, resolution, device, steps, warmup, guidance, batch)
        rows.append({"resolution": resolution, **figures, "cfg_factor": figures["guided_s"] / figures["plain_s"]})
    full = full_row_seconds(model, preset, resolutions[0], device, steps, warmup, guidance, batch) if full_row else None
    if full is not None:
        rows[0].update(full)
        for name in ("full_train", "full_train_guided"):
            took = "out of GPU memory" if full[f"{name}_s"] is None else f"{full[f'{name}_s'] * 1e3:.2f} ms"
            peak = "" if full[f"{name}_extra_gib"] is None else f", {full[f'{name}_extra_gib']:.1f} GiB over the weights"
            print(f"{resolutions[0]} px full fine-tune row{' with CFG' if 'guided' in name else ''}: {took}{peak}")
    adapter_params = add_adapters(model, preset, lora_rank) if lora_rank else 0
    for row in rows:
        step_times = {"gpu": gpu, "denoise_step_s": row["plain_s"], "cfg_factor": row["cfg_factor"]}
        lora = ""
        if lora_rank:
            row.update(lora_row_seconds(model, preset, row["resolution"], device, steps, warmup, guidance, batch))
            if row["lora_train_s"] is not None:
                row["train_flops_factor"] = step_times["train_flops_factor"] = row["lora_train_s"] / row["plain_s"]
                lora = f"; LoRA update row {row['lora_train_s'] * 1e3:.2f} ms ({row['train_flops_factor']:.2f}x)"
            else:
                lora = "; LoRA update row: out of GPU memory"
        step_file = out / f"{slug}-{row['resolution']}.yaml"
        step_file.write_text(
            f"# {preset} transformer, {row['resolution']}x{row['resolution']} px, per sample at batch {batch}, measured on "
            f"{device_name} by experiments/measure_step_times.py\n" + yaml.safe_dump(step_times, sort_keys=False))
        print(f"{row['resolution']} px ({row['image_tokens']} tokens): {row['plain_s'] * 1e3:.2f} ms per step, "
              f"{row['guided_s'] * 1e3:.2f} ms with CFG ({row['cfg_factor']:.2f}x){lora} -> {step_file}")
    learner = learner_seconds(model, device, steps, warmup) if lora_rank else None
    if learner is not None:
        print(f"learner per round: part sum {learner['part_sum_s'] * 1e3:.2f} ms, clip + AdamW "
              f"{learner['optimizer_step_s'] * 1e3:.2f} ms, adapters to host {learner['publish_to_host_s'] * 1e3:.2f} ms "
              f"({learner['publication_bytes'] / 1e9:.2f} GB)")
    memory = {"gpu_memory_gib": torch.cuda.get_device_properties(torch.device(device)).total_memory / GIB} \
        if device.startswith("cuda") else {}
    result = {"preset": preset, "gpu": gpu, "device_name": device_name, **memory, "batch": batch, "device": device, "dtype": str(next(model.parameters()).dtype),
              "torch": torch.__version__, "steps": steps, "warmup": warmup, "guidance": guidance,
              "lora_rank": lora_rank, "lora_params": adapter_params,
              "gradient_checkpointing": bool(lora_rank) and preset != "tiny", "rows": rows, "learner": learner}
    (out / "measured.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for the step-time files and measured.json")
    p.add_argument("--preset", choices=sorted(VAE_SCALE), default="qwen-image")
    p.add_argument("--device", default="cuda")
    p.add_argument("--resolutions", type=int, nargs="+", default=[512, 1280], help="image sides in pixels")
    p.add_argument("--batch", type=int, default=1, help="samples per pass (figures are per sample)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per figure")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--guidance", type=float, default=4.0, help="the CFG scale of the guided figure")
    p.add_argument("--lora-rank", type=int, default=64, help="rank of the LoRA update's row (0: not measured)")
    p.add_argument("--full-row", action="store_true",
                   help="also time the update row with every parameter trained, at the first resolution")
    a = p.parse_args(argv)
    if a.steps < 1 or a.warmup < 0 or a.guidance < 1 or not 0 <= a.lora_rank <= 4096 or not 1 <= a.batch <= 1024:
        p.error("expected --steps >= 1, --warmup >= 0, --guidance >= 1, --lora-rank in 0..4096 and --batch in 1..1024")
    measure(a.out, a.preset, a.device, tuple(a.resolutions), a.steps, a.warmup, a.guidance, a.lora_rank, a.full_row, a.batch)


if __name__ == "__main__":
    main()
