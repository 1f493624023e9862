"""The step-time model: how long each piece of a GRPO iteration takes, per resolution, SP degree
and GPU type. It is what the trace-replay simulator puts in place of executing requests.

The denoising step's dependence on the sequence length and the SP degree is
`elastic_sp.regroup_policy.UlyssesStepTime` (the regroup policy's own model, Qwen-Image on H100s:
compute split over the group plus the Ulysses all-to-alls), scaled to other GPUs by their dense
bf16 peak (`spotlight.train.iteration_time.PEAK_BF16_FLOPS`). Everything else is a per-sample or fixed cost
documented field by field below, with its source. `StepTimes.load(yaml)` overrides any field.

Profiles: `qwen-image` (the default: the real 20.4B model, figures from published numbers and the
FLOP model) and `tiny-cpu` (the tiny DiT on this project's 2-core CPU machine, every figure
measured here: docs/measurements.md).

Every field is finite and in a documented range (`LIMITS`); the GPU must be one the FLOP table
knows (`spotlight.train.iteration_time.PEAK_BF16_FLOPS`), or any name when `denoise_step_s` gives a measured
figure (no FLOP scaling is used then) — an unknown GPU is refused, not silently modelled as an H100.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from spotlight.train.iteration_time import PEAK_BF16_FLOPS
from elastic_sp.regroup_policy import MeasuredStepTime, UlyssesStepTime
from spotlight.config import ConfigError, from_dict
from schedulers.input_file import InputFileError, load_yaml, short

MAX_STEP_TIMES_BYTES = 1 << 20
"""Largest step-time file read (1 MiB)."""
LIMITS: dict[str, tuple[float, float]] = {
    "heads": (1, 1024), "gpus_per_node": (1, 64), "denoise_steps": (1, 1000), "trained_steps": (0, 1000),
    "cfg_factor": (0, 16), "train_flops_factor": (0, 100), "train_efficiency": (1e-6, 1),
    "reward_s_per_sample": (0, 86400), "weight_sync_s": (0, 86400), "regroup_s": (0, 86400),
    "cold_start_s": (0, 86400), "restore_s": (0, 86400), "denoise_step_s": (1e-9, 86400),
    "fleet_update_efficiency": (1e-6, 1), "update_round_s": (0, 86400),
}
"""[low, high] of every numeric field: counts bound the loops over SP degrees and steps, seconds
are at most a day, and the update's efficiency is a fraction (it divides)."""

LATENT_PIXELS_PER_TOKEN = 16
"""Qwen-Image: an 8x VAE then 2x2 patches, so one image token per 16x16 pixels: 512² -> 1024
tokens, 1280² -> 6400."""


def image_tokens(resolution: int) -> int:
    return (resolution // LATENT_PIXELS_PER_TOKEN) ** 2


@dataclass(frozen=True)
class StepTimes:
    gpu: str = "H100"
    """GPU type; UlyssesStepTime is an H100 model, other GPUs scale by peak bf16 FLOP/s."""
    heads: int = 24
    """Attention heads (Qwen-Image: 24); SP degrees must divide it."""
    gpus_per_node: int = 8
    denoise_steps: int = 20
    """Denoising steps per rollout sample (Flow-GRPO's rollouts use 10-20 on Qwen-Image-class models)."""
    trained_steps: int = 2
    """SDE steps per sample that the update trains on (`sampler.sde_window`): Flow-GRPO-Fast and
    MixGRPO train on a window of 1-4 of the sampled steps. The result depends on this most: it sets
    how long the train phase is next to the rollout (docs/simulator.md)."""
    cfg_factor: float = 2.0
    """Transformer passes per step: true classifier-free guidance runs the conditional and the
    unconditional input (Qwen-Image's true_cfg_scale), in the rollout and in the update."""
    train_flops_factor: float = 3.0
    """A trained step costs forward + backward = 3 forwards."""
    train_efficiency: float = 0.8
    """Data-parallel (FSDP) efficiency of the update over the trainer's GPUs."""
    fleet_update_efficiency: float = 0.8
    """A spot executor's throughput on the update's micro-batches (`train.update_on: fleet`), as a
    fraction of a trainer GPU's (`train_efficiency` applies to both): its gradients travel to the
    learner instead of an all-reduce inside the trainer's fabric, and it reloads weights it lacks.
    `spotlight bench update` measures it (docs/measurements.md)."""
    update_round_s: float = 10.0
    """What an update spread over the fleet adds per iteration besides the micro-batches: the
    learner gathering and summing the gradients in order and stepping, before the weights go out."""
    reward_s_per_sample: float = 0.05
    """OCR / GenEval reward models score an image in ~50 ms on one GPU (a VLM or detector forward);
    computed by the worker right after its group."""
    weight_sync_s: float = 8.0
    """Publishing θ(t+1) to the rollout workers: 20.4B bf16 parameters = 41 GB, broadcast over a
    ~50 GB/s (400 Gb/s) fabric in a pipelined tree ~1 s, plus loading into the workers' models;
    8 s covers a slower network. Paid once per iteration by every policy."""
    regroup_s: float = 0.5
    """In-place SP regroup (new NCCL communicator, weights from a node peer): measured 0.078 s on the
    tiny CPU model (gloo); NCCL communicator init on 8 GPUs takes a few hundred ms."""
    cold_start_s: float = 300.0
    """A fresh node serving again: provisioning and container start (~2-3 min on managed spot),
    then 41 GB of weights from object storage at ~1 GB/s; measured 7-10 s on the tiny CPU model."""
    restore_s: float = 120.0
    """Restoring the trainer from a checkpoint (weights and Adam: 20.4B x 10 B = 204 GB at ~2 GB/s):
    what a restart of the whole job (spot_restart) adds to a cold start."""
    denoise_step_s: float | None = None
    """Override: seconds of one sample's denoising step at degree 1 at the chosen resolution
    (None: from UlyssesStepTime); a measured figure when you have one."""

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "gpu":
                if not isinstance(v, str) or not v:
                    raise ConfigError(f"step_times.gpu: expected a GPU name, got {short(v)}")
            elif v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0):
                raise ConfigError(f"step_times.{f.name}: expected a number >= 0, got {short(v)}")
        for name in ("heads", "gpus_per_node", "denoise_steps", "trained_steps"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < LIMITS[name][0]:
                raise ConfigError(f"step_times.{name}: expected an integer >= {LIMITS[name][0]}, "
                                  f"got {short(getattr(self, name))}")
        for name, (low, high) in LIMITS.items():
            v = getattr(self, name)
            if v is not None and not low <= v <= high:
                raise ConfigError(f"step_times.{name}: expected a number in [{low:g}, {high:g}], got {short(v)}")
        if self.gpu not in PEAK_BF16_FLOPS and self.denoise_step_s is None:
            raise ConfigError(f"step_times.gpu: expected a GPU the step-time model knows "
                              f"({', '.join(PEAK_BF16_FLOPS)}) or a measured denoise_step_s, got {short(self.gpu)}")

    @classmethod
    def profile(cls, name: str) -> StepTimes:
        if name == "qwen-image":
            return cls()
        if name == "tiny-cpu":
            # The tiny DiT on 2 CPU cores (docs/measurements.md): 3676 denoising steps/s micro-batched
            # (0.27 ms per sample-step), 229 trained samples/s at 8 SDE steps (0.55 ms per
            # sample-step, forward + backward); regroup 0.078 s, cold start 7.1 s; 4 heads.
            # The update on the fleet: one rollout worker computes the gradient at 0.77 of the
            # learner's rate (`spotlight bench update`: its Ray calls and gradient transfers are
            # in that figure, so nothing more per iteration).
            return cls(gpu="tiny-cpu", heads=4, gpus_per_node=1, denoise_steps=8, trained_steps=8,
                       train_flops_factor=0.55 / 0.27, train_efficiency=1.0, cfg_factor=1.0, reward_s_per_sample=1e-5,
                       weight_sync_s=0.01, regroup_s=0.078, cold_start_s=7.1, restore_s=0.02,
                       denoise_step_s=0.27e-3, fleet_update_efficiency=0.77, update_round_s=0.0)
        raise ConfigError(f"unknown step-time profile {short(name)} (expected qwen-image or tiny-cpu)")

    @classmethod
    def load(cls, path: str | Path, base: StepTimes | None = None) -> StepTimes:
        """`base` (default: the qwen-image profile) with the fields a YAML mapping sets; `profile:
        NAME` in it picks the base. The file is read by `schedulers.input_file.load_yaml` (bounded,
        no aliases or duplicate keys; an empty file is refused)."""
        path = Path(path)
        try:
            data = load_yaml(path, "step-time", MAX_STEP_TIMES_BYTES)
        except InputFileError as err:
            raise ConfigError(str(err)) from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping of step-time fields, got {type(data).__name__}")
        try:
            base = cls.profile(data.pop("profile")) if "profile" in data else (base or cls())
            # The run config's loader: unknown keys and mistyped values are refused the same way.
            return from_dict(cls, {**asdict(base), **data})
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None

    # -- derived -----------------------------------------------------------------------------------

    @property
    def speed(self) -> float:
        """This GPU's speed relative to the H100 the Ulysses model describes (a GPU without a FLOP
        figure is accepted only with a measured `denoise_step_s`, which does not use this)."""
        return PEAK_BF16_FLOPS.get(self.gpu, PEAK_BF16_FLOPS["H100"]) / PEAK_BF16_FLOPS["H100"]

    def step_model(self, resolution: int):
        """A `StepTimeModel` (seq_len, degree) -> seconds of one sample's denoising step."""
        if self.denoise_step_s is not None:
            base = UlyssesStepTime()
            tokens = image_tokens(resolution)
            # keep Ulysses' degree dependence, anchored to the measured degree-1 figure
            return MeasuredStepTime(tokens, {d: self.denoise_step_s * base(tokens, d) / base(tokens, 1)
                                             for d in range(1, self.heads + 1) if self.heads % d == 0})
        ulysses, speed = UlyssesStepTime(), self.speed
        return lambda seq_len, degree: ulysses(seq_len, degree) / speed

    def sample_s(self, resolution: int, degree: int) -> float:
        """One sample's rollout on a group of `degree` GPUs: every denoising step, then its reward."""
        return (self.denoise_steps * self.cfg_factor * self.step_model(resolution)(image_tokens(resolution), degree)
                + self.reward_s_per_sample)

    def denoise_s(self, resolution: int, degree: int) -> float:
        """One sample's denoising step (all its CFG passes) on a group of `degree` GPUs."""
        return self.cfg_factor * self.step_model(resolution)(image_tokens(resolution), degree)

    def train_gpu_s(self, resolution: int, samples: int) -> float:
        """The update's work on `samples` samples (each trained on `trained_steps` steps), in
        seconds of one GPU at full efficiency."""
        return samples * (self.trained_steps * self.train_flops_factor * self.cfg_factor
                          * self.step_model(resolution)(image_tokens(resolution), 1))

    def train_s(self, resolution: int, samples: int, gpus: int) -> float:
        """The update on `samples` samples over the trainer's `gpus` GPUs."""
        return self.train_gpu_s(resolution, samples) / (max(gpus, 1) * self.train_efficiency)
