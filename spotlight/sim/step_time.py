"""The step-time model: how long each piece of a GRPO iteration takes, per resolution, SP degree
and GPU type. It is what the trace-replay simulator puts in place of executing requests.

The denoising step's dependence on the sequence length and the SP degree is the regroup policy's
own model, `elastic_sp.regroup_policy.UlyssesStepTime` (compute split over the group plus the
Ulysses all-to-alls), with its compute fitted to the step times measured on an H100
(`H100_STEP_TIME`, docs/measurements.md) and scaled to other GPUs by their dense bf16 peak
(`spotlight.iteration.iteration_time.PEAK_BF16_FLOPS`). The transfers — the weight sync and
the learner's gather of the fleet's gradient parts — are bytes over links
(`spotlight.sim.transfers`): derived from the model's shape, the LoRA rank and the link fields
unless a figure is given. Everything else is a per-sample or fixed cost documented field by field
below, with its source. `StepTimes.load(yaml)` overrides any field.

Profiles (`PROFILES`):
- `qwen-image-lora` (the default, `StepTimes()`): Flow-GRPO's own Qwen-Image recipe — LoRA rank 64
  on the attention and MLP linears, 10 denoising steps at 512², true CFG, 2 SDE steps trained
  (yifan123/flow_grpo, config/grpo.py `pickscore_qwenimage`: num_steps 10, resolution 512,
  guidance_scale 4, 16 images per prompt, sde_window_size 2, use_lora, activation checkpointing;
  rank 64 / alpha 128 as verl's Flow-GRPO Qwen-Image example sets it);
- `qwen-image-full` (alias `qwen-image`, the default before LoRA had a profile): full-parameter
  training of the 20.4B transformer with the earlier figures (20 denoising steps). Its fleet
  update does not fit a spot H100 (`update_memory_refusal`);
- `tiny-cpu`: the tiny DiT on this project's 2-core CPU machine, every figure measured here
  (docs/measurements.md).

Every field is finite and in a documented range (`LIMITS`); the GPU must be one the FLOP table
knows (`spotlight.iteration.iteration_time.PEAK_BF16_FLOPS`), or any name when `denoise_step_s` gives a measured
figure (no FLOP scaling is used then) — an unknown GPU is refused, not silently modelled as an H100.

Derived fields (`DERIVED`: `weight_sync_s`, `update_round_s`): None, or left out of a file, means
"from bytes over links"; the value then held is a `Derived` float, which `dataclasses.replace` and
`StepTimes.load` derive again from the new fields (a plain number is kept as given:
tests/spotlight/sim/test_transfer_bytes.py::test_a_given_figure_wins_and_a_derived_one_follows_its_fields).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from spotlight.iteration.iteration_time import PEAK_BF16_FLOPS
from elastic_sp.regroup_policy import MeasuredStepTime, UlyssesStepTime
from spotlight.config import ConfigError, from_dict
from spotlight.sim import transfers
from schedulers.input.files import InputFileError, load_yaml, short

MAX_STEP_TIMES_BYTES = 1 << 20
"""Largest step-time file read (1 MiB)."""
LIMITS: dict[str, tuple[float, float]] = {
    "heads": (1, 1024), "gpus_per_node": (1, 64), "denoise_steps": (1, 1000), "trained_steps": (0, 1000),
    "cfg_factor": (0, 16), "train_flops_factor": (0, 100), "train_efficiency": (1e-6, 1),
    "reward_s_per_sample": (0, 86400), "weight_sync_s": (0, 86400), "regroup_s": (0, 86400),
    "cold_start_s": (0, 86400), "restore_s": (0, 86400), "denoise_step_s": (1e-9, 86400),
    "fleet_update_efficiency": (1e-6, 1), "update_round_s": (0, 86400),
    "lora_rank": (0, 4096), "trained_params": (1, 1e13), "weight_dtype_bytes": (1, 8), "adapter_dtype_bytes": (1, 8),
    "gradient_parts": (1, 1_000_000), "parts_per_request": (1, 4096), "node_gbps": (1e-3, 1e6),
    "learner_gbps": (1e-3, 1e6), "group_gbps": (1e-3, 1e6), "cross_zone_factor": (1e-6, 1), "load_gbps": (1e-3, 1e6),
    "learner_step_s": (0, 86400),
    "activation_gib": (0, 1e4), "gpu_memory_gib": (1e-3, 1e4),
    "step_overhead_s": (0, 3600), "commit_overhead_s": (0, 3600), "request_overhead_s": (0, 3600),
    "train_request_overhead_s": (0, 3600), "host_cores": (0, 4096), "reward_call_s": (0, 86400), "worker_warmup_s": (0, 86400),
}
"""[low, high] of every numeric field: counts bound the loops over SP degrees and steps, seconds
are at most a day, efficiencies and the cross-zone factor are fractions (they divide), link speeds
are positive (they divide)."""
_INTEGERS = ("heads", "gpus_per_node", "denoise_steps", "trained_steps", "lora_rank", "trained_params",
             "weight_dtype_bytes", "adapter_dtype_bytes", "gradient_parts", "parts_per_request")
_NAMES = ("gpu", "model")
"""The fields that are names, not numbers."""

LATENT_PIXELS_PER_TOKEN = 16
"""Qwen-Image: an 8x VAE then 2x2 patches, so one image token per 16x16 pixels: 512² -> 1024
tokens, 1280² -> 6400."""

GPU_MEMORY_GIB = {"H100": 80, "H200": 141, "B200": 180, "A100": 40, "A100-80GB": 80, "L40S": 48, "L4": 24,
                  "A10G": 24, "V100": 16, "T4": 16}
"""Memory per GPU from NVIDIA's data sheets, whose "GB" is GiB here (an H100 80GB reports 81,559 MiB:
79.6 GiB usable). V100: the 16 GB part AWS p3 nodes carry; A100: the 40 GB part (A100-80GB apart)."""


def image_tokens(resolution: int) -> int:
    return (resolution // LATENT_PIXELS_PER_TOKEN) ** 2


H100_MEASURED_STEP_S = {512: 0.043227, 1280: 0.321204}
"""Seconds of one sample's denoising step (one pass, degree 1) of the real Qwen-Image transformer in
bfloat16 on an NVIDIA H100 80GB HBM3, measured 2026-11-27 by `experiments.measure_step_times`
(torch 2.11, random weights; docs/measurements.md): 512² in passes of 8 samples (43.2 ms a sample;
one sample alone takes 164.8 ms, launch-bound), 1280² in passes of 2 (321.2 ms; alone 328.4 ms).
Files: experiments/step_times/."""


def _fit_compute(measured: dict[int, float]) -> UlyssesStepTime:
    """The Ulysses model whose compute, a·S + b·S², passes through two measured (resolution, seconds)
    points; its all-to-all terms (unmeasured: one GPU) stay as the regroup policy has them."""
    (r1, t1), (r2, t2) = sorted(measured.items())
    s1, s2 = image_tokens(r1), image_tokens(r2)
    b = (t2 / s2 - t1 / s1) / (s2 - s1)
    return UlyssesStepTime(s_per_token=t1 / s1 - b * s1, s_per_token_pair=b)


H100_STEP_TIME = _fit_compute(H100_MEASURED_STEP_S)
"""The simulator's step-time model on an H100: 4.07e-5 s per image token (about 2 FLOP x the ~10B
parameters of the image stream at ~500 TFLOP/s) and 1.49e-9 s per token pair. The regroup
policy's own defaults (1e-4, 2e-9: 20B parameters at 400 TFLOP/s) gave steps 2.4x (512²) and 2.2x
(1280²) slower than measured."""


class Derived(float):
    """A figure the model derived (a transfer's seconds from bytes over links), not one a file or a
    caller set: `dataclasses.replace` and `StepTimes.load` derive it again from the new fields,
    where a plain number is kept as given. Arithmetic on it gives plain floats."""


@dataclass(frozen=True)
class StepTimes:
    gpu: str = "H100"
    """GPU type; UlyssesStepTime is an H100 model, other GPUs scale by peak bf16 FLOP/s."""
    heads: int = 24
    """Attention heads (Qwen-Image: 24); SP degrees must divide it."""
    gpus_per_node: int = 8
    denoise_steps: int = 10
    """Denoising steps per rollout sample: Flow-GRPO's Qwen-Image recipe samples 10 (`pickscore_qwenimage`:
    num_steps 10; 50 for evaluation); the full-parameter profile keeps the earlier 20."""
    trained_steps: int = 2
    """SDE steps per sample that the update trains on (`sampler.sde_window`): Flow-GRPO's Qwen-Image
    recipe trains a window of 2 (sde_window_size 2); Flow-GRPO-Fast and MixGRPO 1-4. The result
    depends on this most: it sets how long the train phase is next to the rollout (docs/simulator.md)."""
    cfg_factor: float = 2.0
    """Transformer passes per step: true classifier-free guidance runs the conditional and the
    unconditional input (Qwen-Image's true_cfg_scale; the recipe's guidance 4), in the rollout and
    in the update. Measured on an H100: 1.99 (512², 8 a pass), 2.00 (1280², 2 a pass)."""
    train_flops_factor: float = 6.24
    """A trained step in plain forwards of the same samples. LoRA (this profile): measured on an
    H100, 512², 8 samples a pass — forward and backward into peft's rank-64 float32 adapters over
    the bf16 base with gradient checkpointing, 269.9 ms a sample against a 43.2 ms forward (1280²,
    2 a pass: 5.75). The roofline guess was 3 (the backward's two forwards, one recomputed); the
    adapters' casts and small matmuls, in every target linear and three times (forward, recompute,
    backward), cost the rest. The full fine-tune profile keeps 3, an assumption: its row did not
    fit 8 samples a pass beside 38 GiB of gradients (one sample alone: 949 ms, 5.8x a lone
    sample's launch-bound 165 ms forward)."""
    train_efficiency: float = 0.8
    """Data-parallel (FSDP) efficiency of the update over the trainer's GPUs."""
    fleet_update_efficiency: float = 0.8
    """A fleet executor's throughput on the update's micro-batches (`train.update_on: fleet`), on-demand
    and spot GPUs alike (the same hardware computing the same requests), as a fraction of one GPU's
    measured rate (`train_flops_factor`): a request's dispatch, micro-batches smaller than the
    measured pass, the weights it reloads when it lacks a round's. `train_efficiency` does not apply
    to it: that is FSDP's data-parallel efficiency (its all-gathers and reduce-scatters), and the
    fleet path does no FSDP — what it moves instead, one gradient per request, is modelled byte for
    byte (`gradient_transfer_s`). `spotlight bench update` measures it on CPU (docs/measurements.md)."""
    update_round_s: float | None = None
    """What an update spread over the fleet adds per round besides the micro-batches, were nothing
    overlapped: the learner receiving one gradient per request, ceil(`gradient_parts` /
    `parts_per_request`) of them (`ingress_bytes` over `learner_gbps` across zones), summing them in
    order and stepping (`learner_step_s`) before the weights go out. None: derived
    (`transfers.gather_s`; 18.3 s at rank 64 for 64 requests, 209 s full for 32) — and then the
    simulation overlaps each gradient's transfer with the compute still running, as the runtime
    does (`round_tail_s`); a number: given, and added after the round's compute as it is."""
    reward_s_per_sample: float = 0.05
    """OCR / GenEval reward models score an image in ~50 ms on one GPU (a VLM or detector forward);
    computed by the worker right after its group."""
    weight_sync_s: float | None = None
    """Publishing θ(t+1) to the rollout workers, once per iteration by every policy:
    `publication_bytes` (rank-64 adapters 1.70 GB in float32, or 40.9 GB of bf16 weights) over the
    slower of `node_gbps` and `learner_gbps` across zones, then `load_gbps` into the GPU. None:
    derived (`transfers.publication_s`; 0.34 s at rank 64, 8.2 s full); a number: given."""
    regroup_s: float = 0.5
    """In-place SP regroup (new NCCL communicator, weights from a node peer): measured 0.078 s on the
    tiny CPU model (gloo); NCCL communicator init on 8 GPUs takes a few hundred ms."""
    cold_start_s: float = 300.0
    """A fresh node serving again: provisioning and container start (~2-3 min on managed spot),
    then 41 GB of weights from object storage at ~1 GB/s; measured 7-10 s on the tiny CPU model."""
    restore_s: float = 25.0
    """Restoring the trainer from a checkpoint, what a restart of the whole job (spot_restart) adds to
    a cold start: with LoRA the base (41 GB) and the adapters with their Adam state (0.42B x 12 B =
    5 GB) at ~2 GB/s: ~25 s; full-parameter training's weights and Adam (20.4B x 10 B = 204 GB): 120 s."""
    denoise_step_s: float | None = None
    """Override: seconds of one sample's denoising step at degree 1 at the chosen resolution
    (None: from UlyssesStepTime); a measured figure when you have one."""
    model: str = "qwen-image"
    """The transformer whose parameters the transfers count: a `transfers.ARCHITECTURES` name
    (qwen-image: 20,430,401,088 parameters; tiny)."""
    lora_rank: int = 64
    """LoRA rank on the default targets (`spotlight.config.DIT_LORA_TARGETS`), 0..4,096; 0: every
    parameter trains (full fine-tune). Flow-GRPO's Qwen-Image recipes: 64 (alpha 128)."""
    trained_params: int | None = None
    """Override: the parameters the optimiser steps (None: from `model` and `lora_rank`; Qwen-Image:
    424,673,280 at rank 64, every one of the 20.4B at rank 0)."""
    weight_dtype_bytes: int = 2
    """Bytes per weight of the model as the workers hold it: bfloat16 (the tiny CPU model: float32)."""
    adapter_dtype_bytes: int = 4
    """Bytes per LoRA parameter and its gradient: the adapters train in float32 over the bf16 base
    (`spotlight.rl.lora.add_lora`)."""
    gradient_parts: int = 512
    """Micro-batches (`train.micro_batch` rows each) per round of a fleet update; the learner
    receives one gradient per request of `parts_per_request` of them. A simulation sets it from its
    run (`spotlight.sim.config.SimConfig.gradient_parts`: 1,024 samples x 2 trained steps in
    micro-batches of 4 rows at the defaults); given alone, it is the byte model's."""
    parts_per_request: int = 8
    """Micro-batches per `TRAIN` request (`train.parts_per_request`, 1..4,096, default 8): a node's
    crew computes them and its lead sends their sum, so the learner's ingress per round is
    ceil(`gradient_parts` / this) gradients. A simulation sets it from its run
    (`SimConfig.parts_per_request`): its requests are the runtime's, one event and one gradient each."""
    node_gbps: float = transfers.NODE_GBPS
    """A GPU node's link for the transfers in Gbit/s (`transfers.NODE_GBPS`: an assumption, sourced there)."""
    learner_gbps: float = transfers.LEARNER_GBPS
    """The learner's ingress in Gbit/s (`transfers.LEARNER_GBPS`: an assumption, sourced there)."""
    cross_zone_factor: float = transfers.CROSS_ZONE_FACTOR
    """The fraction of a link a transfer between the learner and a spot node gets, in (0, 1]
    (`transfers.CROSS_ZONE_FACTOR`: an assumption, sourced there)."""
    load_gbps: float = transfers.LOAD_GBPS
    """Host memory to GPU when a worker loads a publication, in Gbit/s (`transfers.LOAD_GBPS`)."""
    group_gbps: float = transfers.GROUP_GBPS
    """A full fine-tune's learner group: its collectives between the GPUs of its node, in Gbit/s
    (`transfers.GROUP_GBPS`: an assumption, sourced there; `group_round_s`)."""
    learner_step_s: float = transfers.LEARNER_STEP_S
    """The learner's sum, clip and optimiser step per round besides receiving the parts (an assumption)."""
    activation_gib: float = 7.2
    """GPU memory a fleet update's micro-batch needs besides weights and gradients, in GiB: the
    activations with gradient checkpointing at 512², one row, true CFG — 2.24 GiB measured on an
    H100 (the LoRA row's 3.82 GiB peak over the model less the adapters' 1.58 GiB of gradients) —
    plus two assumptions: the CUDA context and cuBLAS workspaces (~1 GiB, outside the allocator's
    count) and the caching allocator's slack (~5% of 80 GiB). Measured beside it: a full
    fine-tune's row of one sample with CFG ran out of an H100's memory (39.5 GiB over the
    weights); without CFG it peaked at 76.7 GiB allocated of the card's 79.2. The refusal of
    qwen-image-full on an H100 is measured for the recipe's true CFG."""
    gpu_memory_gib: float | None = None
    """Override: memory per GPU in GiB (None: `GPU_MEMORY_GIB` of `gpu`)."""
    # -- what a live runtime pays besides compute (docs/simulator-validation.md) ----------------------
    # Each is 0 in every shipped profile: against a Qwen-Image step of 0.2-1.4 s a Ray actor round
    # trip (~1-2 ms) is under 1% and was not measured on GPUs; on the tiny CPU model it is most of a
    # request. `python -m experiments.validate_simulator` measures each on this machine and writes
    # them as a step-time file (experiments/step_times/cpu-2core-tiny.yaml, each figure's source
    # in a comment).
    step_overhead_s: float = 0.0
    """Seconds per denoising step a request computes, besides the step's compute: the worker's
    heartbeat to the queue before each step (`RolloutWorker._stop`: one actor round trip on Ray),
    0..3,600. Part of the step, so a notice is heeded and a death loses at that step's boundary."""
    commit_overhead_s: float = 0.0
    """Seconds per commit of a request's partial state (`queue.checkpoint`, every
    `runtime.commit_every` steps before the last: one actor round trip carrying the state), 0..3,600;
    spread over the request's steps in the model, as the live worker commits between them."""
    request_overhead_s: float = 0.0
    """Seconds per rollout or exploration request a worker computes, besides its steps, heartbeats
    and commits: the pull, the completion carrying its result (the samples' trajectories), starting
    and finishing its samples, 0..3,600."""
    train_request_overhead_s: float = 0.0
    """Seconds per `TRAIN` request besides its micro-batches: the pull, what the worker fetches to
    compute it — the iteration's rollout from the object store (round 0) or the weights of the
    round before (later rounds), merged or loaded (`RolloutWorker._update_inputs`) — the fold and
    the completion carrying the gradient. The fetch is paid live once per worker and round, here
    per request: the same while each worker computes one request a round (the validated run: 4
    requests on 4 nodes), more otherwise. 0..3,600."""
    host_cores: float = 0.0
    """CPU devices only: the cores the devices of one host share, as measured (effective cores: the
    work of k busy worker processes takes k / host_cores of one's time when k > host_cores). Every
    request a worker starts is slowed by max(1, busy devices / host_cores), the busy devices counted
    when it starts: those holding a request, plus one per request still queued, at most every live
    device. 0: devices do not share cores (GPUs), no slow-down. 0..4,096."""
    reward_call_s: float = 0.0
    """Seconds of an iteration's reward phase besides `reward_s_per_sample` (which the workers' requests
    carry): the live runtime scores the rollout in the reward actor after it, one call, 0..86,400."""
    worker_warmup_s: float = 0.0
    """Seconds a fresh worker's first request takes beyond the steady ones (its first forward, its
    first calls to the queue actor), 0..86,400: waited before the first iteration's rollout (a
    joining node's is part of its join time, `SimConfig.join_s`)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in _NAMES:
                if not isinstance(v, str) or not v:
                    raise ConfigError(f"step_times.{f.name}: expected a name, got {short(v)}")
            elif v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0):
                raise ConfigError(f"step_times.{f.name}: expected a number >= 0, got {short(v)}")
        for name in _INTEGERS:
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < LIMITS[name][0]):
                raise ConfigError(f"step_times.{name}: expected an integer >= {LIMITS[name][0]:g}, got {short(v)}")
        for name, (low, high) in LIMITS.items():
            v = getattr(self, name)
            if v is not None and not isinstance(v, Derived) and not low <= v <= high:
                raise ConfigError(f"step_times.{name}: expected a number in [{low:g}, {high:g}], got {short(v)}")
        if self.gpu not in PEAK_BF16_FLOPS and self.denoise_step_s is None:
            raise ConfigError(f"step_times.gpu: expected a GPU the step-time model knows "
                              f"({', '.join(PEAK_BF16_FLOPS)}) or a measured denoise_step_s, got {short(self.gpu)}")
        if self.model not in transfers.ARCHITECTURES:
            raise ConfigError(f"step_times.model: expected one of {', '.join(transfers.ARCHITECTURES)}, "
                              f"got {short(self.model)}")
        # The transfers' seconds, derived where no figure was given (`Derived`). Set here, once, so
        # that every reader (the simulation, the oracle, the constant sets) reads a number.
        for name, derive in DERIVED.items():
            v = getattr(self, name)
            if v is None or isinstance(v, Derived):
                seconds = derive(self)
                if not LIMITS[name][0] <= seconds <= LIMITS[name][1]:
                    raise ConfigError(f"step_times.{name}: derived {seconds:,.0f} s from bytes over links, beyond "
                                      f"{LIMITS[name][1]:,.0f} s (expected faster links or a given {name})")
                object.__setattr__(self, name, Derived(seconds))

    @classmethod
    def profile(cls, name: str) -> StepTimes:
        """The named profile (`PROFILES`, module docstring)."""
        if name == "qwen-image-lora":
            return cls()
        if name in ("qwen-image-full", "qwen-image"):
            # Every parameter trains: the publication and each gradient part are 40.9 GB of bf16, a
            # restore reads 204 GB of weights and Adam state; 20 denoising steps as before.
            return cls(lora_rank=0, denoise_steps=20, restore_s=120.0, train_flops_factor=3.0)
        if name == "tiny-cpu":
            # The tiny DiT on 2 CPU cores (docs/measurements.md): 3676 denoising steps/s micro-batched
            # (0.27 ms per sample-step), 229 trained samples/s at 8 SDE steps (0.55 ms per
            # sample-step, forward + backward); regroup 0.078 s, cold start 7.1 s; 4 heads.
            # The update on the fleet: one rollout worker computes the gradient at 0.77 of the
            # learner's rate (`spotlight bench update`: its Ray calls and gradient transfers are
            # in that figure, so nothing more per iteration). Full-parameter, float32.
            return cls(gpu="tiny-cpu", heads=4, gpus_per_node=1, denoise_steps=8, trained_steps=8,
                       train_flops_factor=0.55 / 0.27, train_efficiency=1.0, cfg_factor=1.0, reward_s_per_sample=1e-5,
                       weight_sync_s=0.01, regroup_s=0.078, cold_start_s=7.1, restore_s=0.02,
                       denoise_step_s=0.27e-3, fleet_update_efficiency=0.77, update_round_s=0.0,
                       model="tiny", lora_rank=0, weight_dtype_bytes=4)
        raise ConfigError(f"unknown step-time profile {short(name)} (expected one of {', '.join(PROFILES)})")

    @classmethod
    def load(cls, path: str | Path, base: StepTimes | None = None) -> StepTimes:
        """`base` (default: the qwen-image-lora profile) with the fields a YAML mapping sets; `profile:
        NAME` in it picks the base. The file is read by `schedulers.input.files.load_yaml` (bounded,
        no aliases or duplicate keys; an empty file is refused). A derived field the file does not
        set is derived again from the file's fields."""
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
            return from_dict(cls, {**base.given(), **data})
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None

    def given(self) -> dict[str, Any]:
        """Every field as a mapping, a derived figure as None (so that a rebuild derives it again)."""
        return {k: None if isinstance(getattr(self, k), Derived) else v for k, v in asdict(self).items()}

    def is_derived(self, name: str) -> bool:
        """Whether field `name` holds a figure derived from bytes over links (not one given)."""
        return isinstance(getattr(self, name), Derived)

    # -- transfers (spotlight.sim.transfers) ---------------------------------------------------------

    @property
    def shape(self) -> transfers.DiTShape:
        return transfers.ARCHITECTURES[self.model]

    @property
    def trained(self) -> int:
        """Parameters the optimiser steps: `trained_params`, or the adapters (rank > 0) or every parameter."""
        return self.trained_params if self.trained_params is not None else self.shape.trained_params(self.lora_rank)

    @property
    def trained_dtype_bytes(self) -> int:
        """Bytes per trained parameter and per gradient element: float32 adapters, or the model's dtype."""
        return self.adapter_dtype_bytes if self.lora_rank > 0 else self.weight_dtype_bytes

    @property
    def publication_bytes(self) -> int:
        """Bytes of one weight publication: what training changes, as the learner hands it out."""
        return self.trained * self.trained_dtype_bytes

    @property
    def part_bytes(self) -> int:
        """Bytes of one gradient part: the gradient of every trained parameter the backward reaches,
        in its dtype (`transfers.DiTShape.gradient_params`; all of `trained_params` when given)."""
        reached = self.trained_params if self.trained_params is not None else self.shape.gradient_params(self.lora_rank)
        return reached * self.trained_dtype_bytes

    @property
    def gradient_requests(self) -> int:
        """`TRAIN` requests per round of a fleet update: one gradient each reaches the learner."""
        return transfers.requests(self.gradient_parts, self.parts_per_request)

    @property
    def ingress_bytes(self) -> int:
        """Bytes the learner receives per round of a fleet update: a part's bytes per request."""
        return transfers.ingress_bytes(self.gradient_parts, self.part_bytes, self.parts_per_request)

    def derived_weight_sync_s(self) -> float:
        """`weight_sync_s` from bytes over links (`transfers.publication_s`)."""
        return transfers.publication_s(self.publication_bytes, self.node_gbps, self.learner_gbps,
                                       self.cross_zone_factor, self.load_gbps)

    def derived_update_round_s(self) -> float:
        """`update_round_s` from bytes over links (`transfers.gather_s`)."""
        return transfers.gather_s(self.ingress_bytes, self.learner_gbps, self.cross_zone_factor, self.learner_step_s)

    def gradient_transfer_s(self, spot: bool, queued: bool = False) -> float:
        """One request's gradient into the learner's node: alone, across zones from a spot node (a
        transfer is a handful of flows, each capped outside a placement group: `cross_zone_factor`)
        and at the link's full rate from an on-demand one (the learner's zone and placement group);
        `queued` behind others (several transfers at once), at the learner's full rate whatever the
        zone — "traffic within the Region can utilize the full network bandwidth available to the
        instance" (EC2 User Guide, "Amazon EC2 instance network bandwidth", multi-flow traffic)."""
        factor = self.cross_zone_factor if spot and not queued else 1.0
        return transfers.transfer_s(self.part_bytes, self.learner_gbps, factor)

    def round_tail_s(self, compute_s: float) -> float:
        """What a fleet update's round adds after `compute_s` seconds of the fleet's compute. A given
        `update_round_s` is that figure. Derived: every request's gradient reaches the learner as the
        request completes, through its ingress, while others still compute (the runtime's results
        travel at completion: `queue.complete`), so what is left is the last one's transfer, or the
        ingress the compute could not hide (the others at the link's aggregate rate,
        `gradient_transfer_s`), then the learner's step (`learner_step_s`). An estimate for
        pricing a round (the rental rule): the simulation itself follows each request
        (`Simulation._done`), and the update's placement and the oracle price a round request by
        request (`spotlight.sim.crews`)."""
        if not self.is_derived("update_round_s"):
            return self.update_round_s
        one, queued = self.gradient_transfer_s(spot=True), self.gradient_transfer_s(spot=True, queued=True)
        return max(one, one + (self.gradient_requests - 1) * queued - compute_s) + self.learner_step_s

    @property
    def label(self) -> str:
        """The model and how it trains, for a message: "qwen-image LoRA rank 64", "qwen-image full fine-tune"."""
        return f"{self.model} " + (f"LoRA rank {self.lora_rank}" if self.lora_rank > 0 else "full fine-tune")

    # -- derived -----------------------------------------------------------------------------------

    @property
    def speed(self) -> float:
        """This GPU's speed relative to the H100 the Ulysses model describes (a GPU without a FLOP
        figure is accepted only with a measured `denoise_step_s`, which does not use this)."""
        return PEAK_BF16_FLOPS.get(self.gpu, PEAK_BF16_FLOPS["H100"]) / PEAK_BF16_FLOPS["H100"]

    def step_model(self, resolution: int):
        """A `StepTimeModel` (seq_len, degree) -> seconds of one sample's denoising step."""
        if self.denoise_step_s is not None:
            base = H100_STEP_TIME
            tokens = image_tokens(resolution)
            # keep Ulysses' degree dependence, anchored to the measured degree-1 figure
            return MeasuredStepTime(tokens, {d: self.denoise_step_s * base(tokens, d) / base(tokens, 1)
                                             for d in range(1, self.heads + 1) if self.heads % d == 0})
        ulysses, speed = H100_STEP_TIME, self.speed
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

    def group_round_s(self, resolution: int, samples: int, n: int) -> float:
        """One round of a full fine-tune's update on a learner group of `n` GPUs, at the runtime's
        grain (`spotlight.runtime.learner_group`): the round's `gradient_parts` micro-batches dealt
        round-robin, ceil(parts / n) lockstep passes a rank, each the longer of its micro-batch's
        compute and its FSDP2 traffic (`transfers.group_pass_bytes` over `group_gbps`: the next
        block's gather and the last one's reduce-scatter overlap the compute). One learner: its
        micro-batches one after the other, no collective. In place of `train_s`'s flat
        `train_efficiency`, which stays for a LoRA learner (adapters, no sharding)."""
        if n == 1:
            return self.train_gpu_s(resolution, samples)
        parts = self.gradient_parts
        compute = self.train_gpu_s(resolution, samples) / parts
        traffic = transfers.transfer_s(transfers.group_pass_bytes(self.shape, n, self.weight_dtype_bytes),
                                       self.group_gbps)
        return -(-parts // n) * max(compute, traffic)

    def slowdown(self, busy_devices: float) -> float:
        """How much slower each busy device computes with `busy_devices` busy on the host
        (`host_cores`; 1 on GPUs, or while the busy devices fit the cores)."""
        if not self.host_cores:
            return 1.0
        return max(1.0, busy_devices / self.host_cores)


DERIVED = {"weight_sync_s": StepTimes.derived_weight_sync_s, "update_round_s": StepTimes.derived_update_round_s}
"""The fields derived from bytes over links when not given, and how (module docstring)."""

PROFILES = ("qwen-image-lora", "qwen-image-full", "qwen-image", "tiny-cpu")
"""The named profiles, the default first; `qwen-image` is `qwen-image-full` (its name before LoRA had a profile)."""


def update_memory_refusal(st: StepTimes) -> str | None:
    """Why one spot GPU of `st.gpu` cannot compute a micro-batch of the fleet update, in one line
    (None: it can, or the GPU's memory is unknown and not given — the tiny CPU profile). A worker
    holds the whole model in its dtype, with LoRA the float32 adapters too, the trained parameters'
    gradients in their dtype (twice with `parts_per_request` > 1: the running sum beside the
    micro-batch's), and `activation_gib`; the optimiser's state stays on the learner.
    Qwen-Image full fine-tune on an H100: 38 + 38 + 7.2 = 83 GiB > 80; at rank 64: 38 + 1.6 + 1.6 +
    7.2 = 48 GiB. The string is what `schedulers.update_placement.fleet_update_refusal` takes as `memory`."""
    memory = st.gpu_memory_gib if st.gpu_memory_gib is not None else GPU_MEMORY_GIB.get(st.gpu)
    if memory is None:
        return None
    weights = st.shape.params() * st.weight_dtype_bytes + (st.trained * st.adapter_dtype_bytes if st.lora_rank else 0)
    grads = st.part_bytes * (2 if st.parts_per_request > 1 else 1)
    need = (weights + grads) / transfers.GIB + st.activation_gib
    if need <= memory:
        return None
    return (f"{st.label}: a spot {st.gpu} ({memory:g} GiB) cannot hold {weights / transfers.GIB:.0f} GiB of weights, "
            f"{grads / transfers.GIB:.0f} GiB of gradients and {st.activation_gib:g} GiB of activations and runtime "
            f"({need:.0f} GiB); the update runs on the learner's GPUs")


# -- the provider's figures ----------------------------------------------------------------------------

NOTICE_S = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
"""Seconds between a spot preemption's notice and the machine going: AWS's two-minute Spot Instance
interruption notice (EC2 User Guide, "Spot Instance interruption notices"); GCP's 30 s for Spot and
preemptible VMs (Compute Engine, "Spot VMs": "preemption notice"); Azure's Scheduled Events give
Spot VMs at least 30 s ("Preempt")."""


def notice_s_for(provider: str) -> float:
    """The provider's preemption notice in seconds (`NOTICE_S`); an unknown provider is a ConfigError."""
    if provider not in NOTICE_S:
        raise ConfigError(f"provider: expected one of {', '.join(NOTICE_S)}, got {short(provider)}")
    return NOTICE_S[provider]


_GCP_WORDS = re.compile(r"gcloud|gcp|google")
_AWS_WORDS = re.compile(r"aws|amazon|(?<![a-z0-9])(?:p2|p3|p3dn|p4d|p4de|p5|p5e|p5en|g4dn|g5|g6|g6e|trn1)(?![a-z0-9])")
_AWS_ZONE = re.compile(r"(?<![a-z])[a-z]{2}-[a-z]+-\d[a-z](?![a-z0-9])")  # us-east-2b
_GCP_ZONE = re.compile(r"(?<![a-z])[a-z]+-[a-z]+\d-[a-z](?![a-z0-9])")  # us-east1-b


def trace_provider(trace: Any) -> str | None:
    """The cloud a `schedulers.traces.Trace` was recorded on, where its format or file name says so:
    a GCP counts file (nodes `gcp-<k>`) or a name with gcloud/gcp; a name with aws or an AWS
    instance family (Bamboo's `bamboo-p3.csv`, `bamboo-g4dn.csv`); a SkyPilot file named by its zone
    (`us-east-2b_v100_1.json`: AWS's zone style; `us-east1-b`: GCP's). None: it does not say (a
    synthetic trace, a counts file of our own)."""
    if any(node.startswith("gcp-") for node in trace.nodes[:1]):
        return "gcp"
    name = str(trace.source).lower()
    if _GCP_WORDS.search(name):
        return "gcp"
    if _AWS_WORDS.search(name):
        return "aws"
    if _GCP_ZONE.search(name):
        return "gcp"
    if _AWS_ZONE.search(name):
        return "aws"
    return None
