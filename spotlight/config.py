"""Run configuration: one dataclass per component, nested under `RunConfig`.

A YAML file in `experiments/` is a `RunConfig` written down. Loading rejects unknown keys and
values of the wrong type or range with a single `ConfigError` line that names the file and the
dotted field (`experiments/x.yaml: train.lr: expected a number > 0, got -1`). The defaults of
`RunConfig()` are the embedded default run: the tiny DiT on CPU.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A bad config value; `str(err)` is the one line a user sees."""


def _check(ok: bool, name: str, expected: str, got: Any) -> None:
    if not ok:
        raise ConfigError(f"{name}: expected {expected}, got {got!r}")


@dataclass
class DiTConfig:
    """The diffusion transformer (diffusers `QwenImageTransformer2DModel`)."""

    preset: Literal["tiny", "qwen-image"] = "tiny"
    """`tiny`: a random 2-layer config that trains on CPU; `qwen-image`: the released 20B config."""
    pretrained_path: str | None = None
    """Local folder of a diffusers Qwen-Image checkpoint (with `transformer/`, and `vae/` and
    `text_encoder/` for real decoding and prompts). Nothing is downloaded."""
    resolution: int = 16
    """Image side in pixels. Tiny preset: latent = pixels (1 latent pixel per image pixel);
    qwen-image: the VAE downsamples by 8. Must give a latent side divisible by the patch size 2."""
    text_tokens: int = 8
    """Prompt length in tokens for the deterministic stand-in text encoder."""

    def __post_init__(self) -> None:
        _check(self.resolution > 0, "resolution", "a positive integer", self.resolution)
        _check(self.latent_side % 2 == 0, "resolution",
               f"a size whose latent side ({self.latent_side}) divides by the patch size 2", self.resolution)
        _check(self.text_tokens > 0, "text_tokens", "a positive integer", self.text_tokens)

    @property
    def vae_scale(self) -> int:
        return 1 if self.preset == "tiny" else 8

    @property
    def latent_side(self) -> int:
        return self.resolution // self.vae_scale


@dataclass
class LLMConfig:
    """The causal language model (a transformers Qwen2 architecture)."""

    pretrained_path: str | None = None
    """Local folder with a transformers causal LM and its tokenizer; empty means the tiny config."""
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    max_new_tokens: int = 4
    """Completion length limit in tokens (answers of the arithmetic task have at most 3 digits)."""
    temperature: float = 1.0

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "max_new_tokens"):
            _check(getattr(self, name) > 0, name, "a positive integer", getattr(self, name))
        _check(self.hidden_size % self.num_heads == 0, "hidden_size",
               f"a multiple of num_heads ({self.num_heads})", self.hidden_size)
        _check(self.num_heads % self.num_kv_heads == 0, "num_kv_heads",
               f"a divisor of num_heads ({self.num_heads})", self.num_kv_heads)
        _check(self.temperature > 0, "temperature", "a number > 0", self.temperature)


@dataclass
class PolicyConfig:
    """Which policy is trained; only the sub-config of that kind is used."""

    kind: Literal["dit", "llm"] = "dit"
    dit: DiTConfig = field(default_factory=DiTConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)


@dataclass
class SamplerConfig:
    """The Flow-GRPO SDE sampler (DiT only)."""

    num_steps: int = 8
    """Denoising steps per sample."""
    noise_level: float = 0.7
    """`a` in the SDE's std `sqrt(sigma / (1 - sigma)) * a`."""
    sde_window: tuple[int, int] | None = None
    """[first, last) steps that are stochastic (and trained on); the rest are ODE steps. None: all."""

    def __post_init__(self) -> None:
        _check(self.num_steps > 0, "num_steps", "a positive integer", self.num_steps)
        _check(self.noise_level > 0, "noise_level", "a number > 0", self.noise_level)
        if self.sde_window is not None:
            lo, hi = self.sde_window
            _check(0 <= lo < hi <= self.num_steps, "sde_window",
                   f"[first, last) with 0 <= first < last <= num_steps ({self.num_steps})", list(self.sde_window))

    @property
    def sde_steps(self) -> range:
        lo, hi = self.sde_window if self.sde_window is not None else (0, self.num_steps)
        return range(lo, hi)


@dataclass
class RewardConfig:
    """The reward; see `spotlight.rewards` for the names."""

    name: str = "colour"
    """colour | jpeg_compressibility | jpeg_incompressibility | arithmetic | clip_score."""
    model_path: str | None = None
    """Local weights for model-based rewards (clip_score: a CLIP/PickScore folder)."""
    colour_width: float = 0.5
    """Colour reward: `exp(-|rgb - target|^2 / colour_width)` per pixel."""

    def __post_init__(self) -> None:
        _check(self.colour_width > 0, "colour_width", "a number > 0", self.colour_width)


@dataclass
class GRPOConfig:
    """Group-relative policy optimisation: advantages and the clipped loss."""

    clip_low: float = 1e-3
    """The ratio is clipped to [1 - clip_low, 1 + clip_high]."""
    clip_high: float = 1e-3
    adv_clip: float = 5.0
    """Advantages are clipped to [-adv_clip, adv_clip]."""
    adv_eps: float = 1e-4
    """`A = (r - mean_g) / (std_g + adv_eps)`."""
    kl_beta: float = 0.0
    """Weight of the KL penalty to the reference (warm-started) policy; 0 disables it."""

    def __post_init__(self) -> None:
        for name in ("clip_low", "clip_high", "adv_clip", "adv_eps"):
            _check(getattr(self, name) > 0, name, "a number > 0", getattr(self, name))
        _check(self.clip_low < 1, "clip_low", "a number in (0, 1)", self.clip_low)
        _check(self.kl_beta >= 0, "kl_beta", "a number >= 0", self.kl_beta)


@dataclass
class TrainConfig:
    """The iteration loop and the optimiser."""

    steps: int = 30
    """GRPO iterations."""
    prompts_per_step: int = 8
    group_size: int = 8
    """G: samples per prompt."""
    lr: float = 1e-4
    updates_per_step: int = 2
    """Optimiser steps per iteration, each over the whole rollout."""
    grad_clip: float = 1.0
    checkpoint_every: int = 10
    """Iterations between checkpoints (the last iteration is always checkpointed)."""
    micro_batch: int = 64
    """Samples per forward pass in rollout and update (bounds memory, not results)."""
    eval_prompts: int = 0
    """Prompts of a fixed evaluation set scored at the start of every iteration (0: no evaluation).
    `eval_reward` is the policy's mean reward on fixed prompts and seeds, unbiased by how an
    iteration chose its own seeds (exploration picks contrasting ones: their mean is not the policy's)."""
    eval_seeds: int = 8
    """Seeds per evaluation prompt."""

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "updates_per_step", "checkpoint_every", "micro_batch"):
            _check(getattr(self, name) > 0, name, "a positive integer", getattr(self, name))
        _check(self.group_size >= 2, "group_size", "an integer >= 2 (GRPO needs a group)", self.group_size)
        _check(self.lr > 0, "lr", "a number > 0", self.lr)
        _check(self.eval_prompts >= 0, "eval_prompts", "an integer >= 0", self.eval_prompts)
        _check(self.eval_seeds > 0, "eval_seeds", "a positive integer", self.eval_seeds)
        _check(self.grad_clip > 0, "grad_clip", "a number > 0", self.grad_clip)


@dataclass
class PromptsConfig:
    """The prompt set; prompts are drawn per iteration from it, deterministically from the seed."""

    name: Literal["colours", "arithmetic"] = "colours"
    count: int = 8
    """Size of the prompt set (colours: at most the number of named colours)."""

    def __post_init__(self) -> None:
        _check(self.count > 0, "count", "a positive integer", self.count)


@dataclass
class WarmStartConfig:
    """The short supervised start that gives a random tiny model something for GRPO to improve.

    DiT: flow matching on synthetic prompt-conditioned images; LLM: next-token training on worked
    examples. The result is cached on disk, keyed by everything that determines it.
    """

    steps: int = 2400
    """Optimiser steps; 0 disables the warm start."""
    batch_size: int = 32
    lr: float = 1e-3
    cache_dir: str | None = None
    """Where warm-started weights are cached; None means $SPOTLIGHT_CACHE or ~/.cache/spotlight."""

    def __post_init__(self) -> None:
        _check(self.steps >= 0, "steps", "an integer >= 0", self.steps)
        _check(self.batch_size > 0, "batch_size", "a positive integer", self.batch_size)
        _check(self.lr > 0, "lr", "a number > 0", self.lr)


@dataclass
class RuntimeConfig:
    """Where the roles run. `local`: one process; `ray`: the learner, rollout workers, the reward
    worker and the request queue are Ray actors (a local cluster is started when none is given)."""

    kind: Literal["ray", "local"] = "ray"
    address: str | None = None
    """Ray cluster to join (e.g. "auto" or "ray://head:10001"); None starts a local one."""
    spot_workers: int = 2
    """Rollout worker slots on spot capacity (actors that need the `spot` custom resource)."""
    ondemand_workers: int = 1
    """Rollout workers on on-demand capacity: they keep the run going when every spot slot is gone."""
    commit_every: int = 1
    """Denoising steps between partial-state commits: a death without notice loses at most this many."""
    lease_s: float = 30.0
    """A pulled request's lease; heartbeats (one per step) renew it; an expired lease re-queues it."""
    notice_s: float = 120.0
    """Warning a replayed trace gives before each removal, in trace seconds (AWS: 120; 0: none)."""
    trace_speedup: float = 1.0
    """A replayed trace runs this many times faster than real time."""
    notice_sources: list[Literal["aws", "gcp", "sigterm"]] = field(default_factory=list)
    """Where each rollout worker watches for a preemption notice: AWS IMDSv2 (spot instance-action,
    rebalance recommendation), GCP (instance/preempted), SIGTERM to its process. Empty off the cloud."""
    notice_poll_s: float = 5.0
    """Seconds between polls of the notice sources."""

    def __post_init__(self) -> None:
        _check(self.spot_workers >= 0, "spot_workers", "an integer >= 0", self.spot_workers)
        _check(self.ondemand_workers >= 0, "ondemand_workers", "an integer >= 0", self.ondemand_workers)
        _check(self.spot_workers + self.ondemand_workers > 0, "ondemand_workers",
               "at least one rollout worker in all (spot_workers + ondemand_workers > 0)", self.ondemand_workers)
        _check(self.commit_every > 0, "commit_every", "a positive integer", self.commit_every)
        _check(self.lease_s > 0, "lease_s", "a number > 0", self.lease_s)
        _check(self.notice_s >= 0, "notice_s", "a number >= 0", self.notice_s)
        _check(self.trace_speedup > 0, "trace_speedup", "a number > 0", self.trace_speedup)
        _check(self.notice_poll_s > 0, "notice_poll_s", "a number > 0", self.notice_poll_s)


@dataclass
class ExplorationConfig:
    """Seed exploration on stale weights (DESIGN.md, idea 1): while the learner trains θ(t+1), idle
    rollout workers score candidate seeds of the next iteration's prompts with θ(t); the next rollout
    uses, per prompt, the G seeds whose rewards contrast most."""

    enabled: bool = False
    """Off: every iteration uses fresh seeds and no exploration runs (plain GRPO)."""
    planner: Literal["bandit", "uniform", "random"] = "bandit"
    """How exploration samples are spread over prompts: `bandit` (to where they add the most group
    reward variance), `uniform` (the same number per prompt), or `random` (none: random seeds, with
    only the stale-rank monitor's few probe samples explored)."""
    candidates_per_prompt: int = 32
    """Most seeds explored per prompt and iteration (>= train.group_size)."""
    budget_source: Literal["samples", "train_time"] = "samples"
    """`samples`: exactly `samples_per_step` exploration samples per iteration, finished before the next
    rollout starts (deterministic: same config and seed, same weights); `train_time`: as many as the
    idle rollout workers compute while the learner trains — the rest is cancelled when new weights
    are published, so exploration never delays an iteration (not deterministic)."""
    samples_per_step: int = 128
    """The `samples` budget: exploration samples per iteration over all prompts."""
    request_size: int = 16
    """Most seeds per exploration request (computed as one batch by one worker): a planner's
    allocation to a prompt is cut into requests of this size."""
    round_samples: int = 64
    """Bandit: samples handed out per planning round (results of a round steer the next)."""
    num_steps: int | None = None
    """Denoising steps of an exploration sample (DiT); None: sampler.num_steps. Fewer steps replay the
    seed's first SDE noise draws on a coarser schedule."""
    ode: bool = False
    """DiT: explore with the deterministic ODE from the seed's initial noise (no SDE noise)."""
    prompt_candidates: int = 1
    """Prompts explored per rollout prompt: > 1 explores that many times more prompts and rolls out
    those whose stale groups vary most (an LLM skips prompts its stale weights always or never solve)."""
    monitor_seeds: int = 4
    """Probe seeds per prompt the `random` planner explores, so the stale-rank monitor can measure."""
    stale_rank_threshold: float = 0.3
    """When the mean Spearman between seed rankings under θ(t-1) and θ(t) falls below this, seeds
    are chosen at random until it recovers."""
    optimism: float = 1.0
    """Bandit: how much the spread of a little-explored prompt is inflated (UCB-style)."""
    explore_first: bool = True
    """Explore the first iteration's seeds with the starting weights before its rollout. There is no
    train phase yet to hide it in, so it is on the critical path, once per run; it spends
    `samples_per_step` samples whatever the budget source (no update time has been measured yet)."""

    def __post_init__(self) -> None:
        for name in ("candidates_per_prompt", "samples_per_step", "request_size", "round_samples",
                     "prompt_candidates"):
            _check(getattr(self, name) > 0, name, "a positive integer", getattr(self, name))
        _check(self.monitor_seeds >= 0, "monitor_seeds", "an integer >= 0", self.monitor_seeds)
        _check(self.num_steps is None or self.num_steps > 0, "num_steps", "a positive integer or null", self.num_steps)
        _check(-1 <= self.stale_rank_threshold <= 1, "stale_rank_threshold", "a number in [-1, 1]",
               self.stale_rank_threshold)
        _check(self.optimism >= 0, "optimism", "a number >= 0", self.optimism)


@dataclass
class CloudConfig:
    """The fleet a run is launched onto and priced with: `spotlight launch` turns it into SkyPilot
    tasks (an on-demand head, spot worker pools), and the cost meter prices its instance-seconds.
    Nothing here changes what a run computes, so a resume may change any of it."""

    gpu: str = "H100"
    """Accelerator of the head (learner) and the workers' first choice, as SkyPilot and the price
    table name it (e.g. H100, A100-80GB, L4)."""
    gpus_per_node: int = 1
    """Accelerators per node (head and workers); a node is one instance of the price table."""
    fallback_gpus: list[str] = field(default_factory=list)
    """Further accelerators a spot worker pool may take when `gpu` has no spot capacity."""
    accelerator_order: Literal["any_of", "ordered"] = "any_of"
    """How SkyPilot picks among `gpu` + `fallback_gpus`: the cheapest available (`any_of`) or the
    first available in this order (`ordered`)."""
    instance_type: str | None = None
    """Price-table row the meter uses for every node; None: the cheapest row with `gpu` x `gpus_per_node`."""
    provider: Literal["aws", "gcp"] | None = None
    """Cloud to launch on; None lets SkyPilot choose among those enabled."""
    region: str | None = None
    worker_pools: int = 1
    """Spot worker pools (one SkyPilot managed job each); runtime.spot_workers nodes are split among them."""
    job_recovery: Literal["FAILOVER", "EAGER_NEXT_REGION"] = "EAGER_NEXT_REGION"
    """SkyPilot's recovery strategy for a preempted spot pool."""
    max_restarts_on_errors: int = 3
    """SkyPilot restarts of a pool whose job failed by itself (not preempted)."""
    checkpoint_uri: str | None = None
    """Where checkpoints and committed in-flight state live besides the run folder: s3://bucket/prefix
    (honours $AWS_ENDPOINT_URL) or file:///path; None: the run folder only."""
    inflight_every_s: float = 30.0
    """With a checkpoint_uri: seconds between snapshots of a running rollout's committed state (finished
    results, partial states) in the store, which a restarted controller resumes the iteration from
    (`spotlight.inflight`); 0: none."""
    budget_usd: float | None = None
    """Stop cleanly (final checkpoint, summary says why) before the metered cost would exceed this."""
    deadline_h: float | None = None
    """Hours from the start the run must finish in: spot workers fall back to on-demand when the
    run falls behind uniform progress toward it."""
    prices: str | None = None
    """Price table CSV; None: the shipped table (cloud/prices.csv)."""
    price_scale: float = 1.0
    """Multiplies every price (tests scale prices so a budget binds on a tiny CPU run)."""

    def __post_init__(self) -> None:
        _check(self.gpus_per_node > 0, "gpus_per_node", "a positive integer", self.gpus_per_node)
        _check(self.worker_pools > 0, "worker_pools", "a positive integer", self.worker_pools)
        _check(self.max_restarts_on_errors >= 0, "max_restarts_on_errors", "an integer >= 0",
               self.max_restarts_on_errors)
        _check(self.budget_usd is None or self.budget_usd > 0, "budget_usd", "a number > 0 or null", self.budget_usd)
        _check(self.deadline_h is None or self.deadline_h > 0, "deadline_h", "a number > 0 or null", self.deadline_h)
        _check(self.price_scale > 0, "price_scale", "a number > 0", self.price_scale)
        _check(self.inflight_every_s >= 0, "inflight_every_s", "a number >= 0", self.inflight_every_s)
        if self.checkpoint_uri is not None:
            from cloud.store import StoreURIError, parse_store_uri

            try:
                parse_store_uri(self.checkpoint_uri)
            except StoreURIError as err:
                raise ConfigError(f"checkpoint_uri: {err}") from None


@dataclass
class RunConfig:
    """One training run. `RunConfig()` is the tiny DiT run."""

    seed: int = 0
    """Run seed: every random draw of the run derives from it."""
    device: str = "cpu"
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    exploration: ExplorationConfig = field(default_factory=ExplorationConfig)
    cloud: CloudConfig = field(default_factory=CloudConfig)

    def __post_init__(self) -> None:
        ex = self.exploration
        _check(ex.candidates_per_prompt >= self.train.group_size, "exploration.candidates_per_prompt",
               f"at least train.group_size ({self.train.group_size})", ex.candidates_per_prompt)
        _check(ex.monitor_seeds <= ex.candidates_per_prompt, "exploration.monitor_seeds",
               f"at most exploration.candidates_per_prompt ({ex.candidates_per_prompt})", ex.monitor_seeds)
        llm_rewards = {"arithmetic"}
        if self.policy.kind == "llm":
            _check(self.reward.name in llm_rewards, "reward.name", f"one of {sorted(llm_rewards)} for an llm policy",
                   self.reward.name)
            _check(self.prompts.name == "arithmetic", "prompts.name", "'arithmetic' for an llm policy", self.prompts.name)
        else:
            _check(self.reward.name not in llm_rewards, "reward.name", "an image reward for a dit policy",
                   self.reward.name)
            _check(self.prompts.name == "colours", "prompts.name", "'colours' for a dit policy", self.prompts.name)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fingerprint(self, *sections: str) -> str:
        """A short hash of the named sections (all when none), for cache keys and resume checks."""
        d = self.to_dict()
        picked = {k: d[k] for k in sections} if sections else d
        return hashlib.sha256(json.dumps(picked, sort_keys=True).encode()).hexdigest()[:16]


# ---- building dataclasses from plain data, with one-line errors ---------------------------------


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is tuple:
        return "a list [" + ", ".join(_type_name(a) for a in typing.get_args(tp)) + "]"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            type(None): "null"}.get(tp, getattr(tp, "__name__", str(tp)))


def _coerce(value: Any, tp: Any, name: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: expected a mapping of {tp.__name__} fields, got {value!r}")
        return from_dict(tp, value, prefix=name + ".")
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, name)
            except ConfigError:
                continue
        raise ConfigError(f"{name}: expected {_type_name(tp)}, got {value!r}")
    if origin is Literal:
        _check(value in typing.get_args(tp), name, _type_name(tp), value)
        return value
    if origin is list:
        (arg,) = typing.get_args(tp)
        _check(isinstance(value, (list, tuple)), name, f"a list of {_type_name(arg)}", value)
        return [_coerce(v, arg, f"{name}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        args = typing.get_args(tp)
        _check(isinstance(value, (list, tuple)) and len(value) == len(args), name, _type_name(tp), value)
        return tuple(_coerce(v, a, f"{name}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if tp is type(None):
        _check(value is None, name, "null", value)
        return None
    if tp is bool:
        _check(isinstance(value, bool), name, "true or false", value)
        return value
    if tp is int:
        _check(isinstance(value, int) and not isinstance(value, bool), name, "an integer", value)
        return value
    if tp is float:
        _check(isinstance(value, (int, float)) and not isinstance(value, bool), name, "a number", value)
        return float(value)
    if tp is str:
        _check(isinstance(value, str), name, "a string", value)
        return value
    raise TypeError(f"config field {name} has unsupported type {tp!r}")  # a bug in this module, not in the input


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass `cls` from `data`, rejecting unknown keys and mistyped values."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{prefix}{unknown[0]}: unknown field (expected one of {', '.join(fields)})")
    kwargs = {k: _coerce(v, hints[k], prefix + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError as err:
        # __post_init__ names the field relative to its own dataclass; make it dotted from the root.
        raise ConfigError(f"{prefix}{err}") from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML run config. Every error is one `ConfigError` line starting with the file name."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config ({err.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise ConfigError(f"{path}: {where}not valid YAML ({getattr(err, 'problem', err)})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of RunConfig fields at the top level, got {type(data).__name__}")
    try:
        return from_dict(RunConfig, _merge(data, overrides or {}))
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def default_config(overrides: dict[str, Any] | None = None) -> RunConfig:
    """The embedded default run (the tiny DiT), with optional overrides."""
    try:
        return from_dict(RunConfig, overrides or {})
    except ConfigError as err:
        raise ConfigError(f"<default config>: {err}") from None


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def to_yaml(cfg: RunConfig) -> str:
    def plain(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, tuple):
            return [plain(v) for v in x]
        return x

    return yaml.safe_dump(plain(cfg.to_dict()), sort_keys=False)
