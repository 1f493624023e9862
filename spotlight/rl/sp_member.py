"""The builder of elastic SP members for the DiT policy: what `elastic_sp` serves, seen from spotlight.

`elastic_sp` sits below `spotlight/` and knows only the transformer's attention; a member process
imports the module its `elastic_sp.spec.ServeSpec` names (`spec.builder`, this one by default) and
gets from it the transformer, the policy that samples with it, the prompt type and the forward
(`elastic_sp.spec.Builder`). The run config travels in the spec as YAML text (`spec.config`) and
is read here only.

Invariant: a member's model and samples are those of the single-process policy of the same run
config — `build_model` is `dit_model.build_transformer`'s model: loaded from the run's
`policy.dit.pretrained_path` when it has one (each node's own copy — the folder, or a remote one's
copy in the node's model cache, `cloud.model_cache` — as every rollout worker loads it), else initialised from the run seed as it does (so the stock tiny arch gives the trainer's
initial weights); `build_policy` is the trainer's `DiTPolicy` on the same sampler, text encoder
and decoder (`dit_policy.conditioning`: a pipeline folder's own). With degree-1 groups, results
are bit-identical to a `RolloutWorker`'s (tests/schedulers/test_fleet_contract.py); a degree-2 group on a
pipeline folder gives the images of degree 1 (tests/spotlight/rl/test_dit_pipeline.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from elastic_sp.spec import ServeSpec
from schedulers.request import Kind
from spotlight.config import RunConfig, config_from_yaml, to_yaml
from spotlight.rl.dit_model import _MODEL_INIT, TINY_TRANSFORMER, build_transformer, transformer_arch, velocity
from spotlight.rl.dit_policy import DiTPolicy, conditioning
from spotlight.rl.lora import add_lora
from spotlight.rl.policy import Rollout
from spotlight.rl.prompts import Prompt
from spotlight.rl.seeding import derive_seed

__all__ = ["PRELOAD", "build_model", "build_policy", "explorer", "finish", "prompt", "run_config", "serve_spec",
           "tiny_arch", "velocity"]

PRELOAD = ["diffusers.models.transformers.transformer_qwenimage"]
"""What the agent's fork server imports besides this module (which imports torch and the policy):
the transformer's module, which `build_model` imports lazily — 3.0 s after torch on the 2-core dev
machine, which a member forked from the server does not pay."""


def tiny_arch(heads: int = 2) -> dict[str, Any]:
    """The tiny CPU transformer (`dit_model.TINY_TRANSFORMER`) with `heads` attention heads of the
    same size: Ulysses of degree d needs d | heads, and the stock tiny model has only 2.
    attention_head_dim stays 16 = sum(axes_dims_rope), as Qwen-Image's RoPE requires."""
    if heads < 1:
        raise ValueError(f"heads must be >= 1, got {heads}")
    return dict(TINY_TRANSFORMER, num_attention_heads=heads)


def serve_spec(cfg: RunConfig, arch: dict[str, Any] | None = None, device: str = "cpu", host: str = "127.0.0.1",
               timeout_s: float = 30.0, finish: bool = False) -> ServeSpec:
    """The spec that serves run `cfg` on SP members. `arch`: the transformer's keyword arguments
    (default: `dit_model.transformer_arch`, the pretrained folder's config or the preset's,
    `TINY_TRANSFORMER` or `QWEN_IMAGE_TRANSFORMER`); `device`, `host`, `timeout_s`, `finish`: see
    `ServeSpec`."""
    if arch is None:
        arch = transformer_arch(cfg.policy.dit)
    ex = cfg.exploration
    return ServeSpec(arch=arch, config=to_yaml(cfg), side=cfg.policy.dit.latent_side, num_steps=cfg.sampler.num_steps,
                     builder=__name__,
                     explore_num_steps=None if ex.num_steps in (None, cfg.sampler.num_steps) else ex.num_steps,
                     explore_ode=ex.ode, finish=finish, device=device, host=host, timeout_s=timeout_s)


def run_config(spec: ServeSpec) -> RunConfig:
    """The run config the spec carries."""
    return config_from_yaml(spec.config, "serve spec config")


def build_model(spec: ServeSpec) -> torch.nn.Module:
    """The run's transformer as `dit_model.build_transformer` builds it — loaded from the run's
    `policy.dit.pretrained_path` (this node's copy) when it has one, else `spec.arch` randomly
    initialised from the run seed the same way — with the run's LoRA adapters (`policy.lora`)
    injected as the learner injects them; eval mode, no gradients. With LoRA the node's weights
    are the learner's whole model (`Learner.full_state`) once, then its adapters at every publish."""
    from diffusers import QwenImageTransformer2DModel

    cfg = run_config(spec)
    if cfg.policy.dit.pretrained_path:
        model = build_transformer(cfg.policy.dit, cfg.seed)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(cfg.seed, _MODEL_INIT))
            model = QwenImageTransformer2DModel(**spec.arch)
    if cfg.policy.lora.enabled:  # the learner's structure: its whole state dict copies in by name
        add_lora(model, cfg)
    return model.eval().requires_grad_(False)


def build_policy(spec: ServeSpec, model: torch.nn.Module, device: str) -> DiTPolicy:
    """A `DiTPolicy` on `device` sampling with `model` (SP applied or not), the text encoder and
    the decoder the learner has (`dit_policy.conditioning`: a pipeline folder's own, else the
    stand-in encoder and the pixel decoder). The member computes with `runtime.torch_threads`
    threads, as every role of the run does (a float sum's rounding depends on how it is split
    over threads)."""
    cfg = dataclasses.replace(run_config(spec), device=device)
    torch.set_num_threads(cfg.runtime.torch_threads)
    return DiTPolicy(cfg, model, *conditioning(cfg, model))


def explorer(spec: ServeSpec, policy: DiTPolicy) -> DiTPolicy:
    """The policy exploration samples with: `exploration.num_steps` steps, ODE when `exploration.ode`
    (`DiTPolicy.for_exploration`, as `RolloutWorker.policy_for` does)."""
    return policy.for_exploration(spec.explore_num_steps, spec.explore_ode)


def finish(spec: ServeSpec, policy: DiTPolicy, prompts: list[Prompt], state: Any, kind: Kind) -> Rollout:
    """What a `RolloutWorker` commits for a finished request (`RolloutWorker.compute`, `_complete`):
    the policy's rollout of the samples — decoded images, trajectory and log-probs — and for an
    exploration request only what the reward reads (no trajectories to ship)."""
    result = policy.finish(prompts, state)
    if kind is Kind.EXPLORATION:
        result = dataclasses.replace(result, data={})
    return result


def prompt(prompt_id: int, text: str) -> Prompt:
    """A request's prompt (`Request.prompt_id`, `Request.prompt_text`) as the policy takes it."""
    return Prompt(prompt_id, text)
