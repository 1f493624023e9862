"""An a-priori lower bound on the seconds of one GRPO iteration, known before anything starts.

It lets a budget too small for even one iteration be rejected up front. It is deliberately a
*lower* bound, so a budget that could pay for an iteration is never rejected; the budget policy
forecasts from measured iterations as soon as there are some (`cloud.cost.BudgetPolicy`).

Two models, by what dominates:
- tiny presets (the CPU configs): time per *unit* — one sample through one denoising step (DiT) or
  one generated token (LLM), counted once in the rollout and once per update — calibrated on this
  project's 2-core CPU machine and divided by about 3 (measured on 2026-11-22 with
  `runtime: local`, 1 torch thread: tiny DiT 0.72 ms/unit (64 samples x 8 steps, 1.1 s per
  iteration), the tests' small DiT 0.94 ms/unit; tiny LLM 0.080 ms/unit (256 completions x 4
  tokens, 0.25 s), small LLM 0.17 ms/unit). On an accelerator they are divided by another 10.
- the real Qwen-Image (20.4B parameters): FLOPs at the GPU's dense bf16 peak, which no run
  exceeds — 2 x parameters x tokens per forward of a sample step, 3 forwards' worth for a trained
  step (forward + backward); rollout spread over every worker GPU, the update on the head's GPUs.

Exploration samples are left out (they may overlap the update): a lower bound still.
"""

from __future__ import annotations

from spotlight.config import RunConfig

S_PER_DIT_UNIT_CPU = 0.25e-3
"""Tiny DiT on CPU: measured 0.72-0.94 ms per sample-step (module docstring); ~1/3 of the fastest."""
S_PER_LLM_UNIT_CPU = 0.025e-3
"""Tiny LLM on CPU: measured 0.080-0.17 ms per sample-token; ~1/3 of the fastest."""
ACCELERATOR_SPEEDUP = 10.0
"""How much faster than the 2-core CPU a tiny model could conceivably run on an accelerator."""
TINY_DIT_TOKENS = 64
"""Image tokens of the calibrated tiny DiT (16x16 latents, 2x2 patches); other sizes scale linearly."""
QWEN_IMAGE_PARAMS = 20.4e9
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "B200": 2250e12, "A100": 312e12, "A100-80GB": 312e12,
                   "L40S": 362e12, "L4": 121e12, "A10G": 125e12, "V100": 125e12, "T4": 65e12}
"""Dense bf16/fp16 tensor-core peaks from NVIDIA's data sheets; an unknown GPU gets the largest."""
CHECKPOINT_BYTES_PER_PARAM = 2 + 8
"""bf16 weights + Adam's two fp32 moments, what a Qwen-Image checkpoint writes per parameter."""
CHECKPOINT_BYTES_PER_S = 5e9
"""A fast local NVMe disk: no checkpoint is written faster."""
TINY_CHECKPOINT_S = 0.005
"""Tiny models' checkpoints measured here: 0.005-0.016 s."""


def _units(cfg: RunConfig, per_sample: int, trained_per_sample: int) -> tuple[int, int]:
    """(rollout units, trained units) of one iteration, evaluation included."""
    t = cfg.train
    samples = t.prompts_per_step * t.group_size
    evaluated = t.eval_prompts * t.eval_seeds
    return (samples + evaluated) * per_sample, t.updates_per_step * samples * trained_per_sample


def iteration_seconds_lower_bound(cfg: RunConfig) -> float:
    """Seconds one iteration of `cfg` takes at least (module docstring)."""
    accelerated = cfg.device != "cpu"
    if cfg.policy.kind == "llm":
        tokens = cfg.policy.llm.max_new_tokens
        rollout, trained = _units(cfg, tokens, tokens)
        seconds = (rollout + trained) * S_PER_LLM_UNIT_CPU
        return seconds / ACCELERATOR_SPEEDUP if accelerated else seconds
    dit = cfg.policy.dit
    image_tokens = (dit.latent_side // 2) ** 2
    rollout, trained = _units(cfg, cfg.sampler.num_steps, len(cfg.sampler.sde_steps))
    if dit.preset == "tiny":
        seconds = (rollout + trained) * S_PER_DIT_UNIT_CPU * image_tokens / TINY_DIT_TOKENS
        return seconds / ACCELERATOR_SPEEDUP if accelerated else seconds
    peak = PEAK_BF16_FLOPS.get(cfg.cloud.gpu, max(PEAK_BF16_FLOPS.values()))
    forward = 2 * QWEN_IMAGE_PARAMS * (image_tokens + dit.text_tokens)
    rollout_gpus = (cfg.runtime.spot_workers + cfg.runtime.ondemand_workers) * cfg.cloud.gpus_per_node
    return rollout * forward / (rollout_gpus * peak) + 3 * trained * forward / (cfg.cloud.gpus_per_node * peak)


def checkpoint_seconds_estimate(cfg: RunConfig) -> float:
    """Seconds one checkpoint write takes at least: the tiny figure measured here, or the real
    model's bytes at a fast disk's speed."""
    if cfg.policy.kind == "dit" and cfg.policy.dit.preset != "tiny":
        return QWEN_IMAGE_PARAMS * CHECKPOINT_BYTES_PER_PARAM / CHECKPOINT_BYTES_PER_S
    return TINY_CHECKPOINT_S
