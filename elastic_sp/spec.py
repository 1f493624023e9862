"""What every member of an elastic SP deployment builds: one immutable value, handed to each member
process at start (and to an agent on another node, through Ray), so that all members — and the
single-process reference in tests — compute the same function.

elastic_sp knows nothing of the model it serves beyond the transformer's attention: the heads and
the sequence length (which degrees are valid, how the tokens split), the latent side and the number
of denoising steps (when a request is done). Everything else — building the transformer and its
weights, the policy that samples with it, the prompt a request names — comes from the spec's
*builder*: a module, named by its import path, that the member process imports at run time
(`Builder` below says what it provides). The workload's run config travels as opaque text that
only the builder reads. This is so because imports point down (docs/design.md, "Rules"): elastic_sp sits below
`spotlight/` and must not import it — tests/test_imports.py checks that — while the model,
sampler and config it serves are spotlight's (`spotlight.rl.sp_member` is the builder for the
DiT policy, and `sp_member.serve_spec(cfg, ...)` fills a spec from a `RunConfig`).

A spec is plain data (strings, numbers, a dict of numbers), so it reaches an agent on another node
without any of the workload's classes.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

import torch

from schedulers.request import Kind

DEFAULT_BUILDER = "spotlight.rl.sp_member"
"""The builder of the DiT policy. A module path is data, not an import: nothing here imports it."""

_MODULE_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class Builder(Protocol):
    """What a builder module provides (module attributes; `spotlight.rl.sp_member` is one)."""

    PRELOAD: list[str]
    """Modules the agent's fork server imports once, so that a member starts without importing
    them (the transformer's module, the policy's)."""

    def build_model(self, spec: ServeSpec) -> torch.nn.Module:
        """The transformer of `spec.arch`, eval mode, no gradients; its initial weights are a
        function of the spec alone (every member builds the same ones) — or read from a local
        folder the workload's config names, which every node holds the same copy of."""
        ...

    def build_policy(self, spec: ServeSpec, model: torch.nn.Module, device: str) -> Any:
        """The sampler over `model` on `device` (SP applied or not): `init_state(prompts, seeds)`,
        `advance(prompts, state, until)` returning a `schedulers.sample_state.SampleState`, and
        `num_steps` (= `spec.num_steps`)."""
        ...

    def prompt(self, prompt_id: int, text: str) -> Any:
        """The policy's prompt for a request's (`prompt_id`, `prompt_text`)."""
        ...

    def velocity(self, model: torch.nn.Module, x: torch.Tensor, sigma: torch.Tensor, emb: torch.Tensor,
                 mask: torch.Tensor | None, side: int) -> torch.Tensor:
        """One forward of the transformer: x (B, S, C) packed latents, sigma (B,), emb (B, T, D),
        mask (B, T) -> velocity (B, S, C)."""
        ...

    def explorer(self, spec: ServeSpec, policy: Any) -> Any:
        """The policy an exploration request is sampled with (`spec.explore_num_steps` steps, ODE
        when `spec.explore_ode`): `policy` itself when those are the rollout's."""
        ...

    def finish(self, spec: ServeSpec, policy: Any, prompts: list[Any], state: Any, kind: Kind) -> Any:
        """What a request of `kind` whose samples reached the last step completes with (with
        `spec.finish`): what the workload's single-process worker commits for it."""
        ...


@dataclass(frozen=True)
class ServeSpec:
    arch: dict[str, Any]
    """`QwenImageTransformer2DModel` keyword arguments (elastic_sp reads the heads and the head
    dimension; the builder builds the model from all of them, or loads it from a folder whose
    config they are)."""
    config: str
    """The workload's run config as YAML text: opaque here, read only by the builder (the seed of
    the model's initialisation and of the sampling streams, the sampler, the text conditioning)."""
    side: int
    """Latent side; the transformer sees (side/2)² image tokens."""
    num_steps: int
    """Denoising steps of a request: it is complete when a group has committed this many."""
    builder: str = DEFAULT_BUILDER
    """Import path of the module that builds what members run (`Builder`)."""
    explore_num_steps: int | None = None
    """The workload's exploration steps when they differ from `num_steps` (None: the same): members
    sample an exploration request with the builder's `explorer`."""
    explore_ode: bool = False
    """Whether the workload explores with deterministic ODE steps (the builder's `explorer`)."""
    finish: bool = False
    """Complete a request with the builder's `finish` (rank 0 computes it at the last step: decoded
    images and all, what a single-process worker commits) instead of the bare committed
    `SampleState` (a `schedulers.sample_state.SampleState`)."""
    device: str = "cpu"
    """Members' device: cpu (gloo) or cuda (NCCL; member i of a node uses cuda:i)."""
    host: str = "127.0.0.1"
    """Address the rendezvous stores and gloo listen on."""
    timeout_s: float = 30.0
    """Rendezvous and collective timeout: how long a member waits on a peer that says nothing."""

    def __post_init__(self) -> None:
        if sum(self.arch.get("axes_dims_rope", ())) != self.arch.get("attention_head_dim"):
            raise ValueError(f"arch: attention_head_dim ({self.arch.get('attention_head_dim')}) must equal "
                             f"sum(axes_dims_rope) ({sum(self.arch.get('axes_dims_rope', ()))})")
        if not isinstance(self.arch.get("num_attention_heads"), int) or self.arch["num_attention_heads"] < 1:
            raise ValueError(f"arch: num_attention_heads must be an integer >= 1, "
                             f"got {self.arch.get('num_attention_heads')!r}")
        if self.side < 2 or self.side % 2:
            raise ValueError(f"side must be an even number >= 2 (2x2 patches), got {self.side}")
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if self.explore_num_steps is not None and self.explore_num_steps < 1:
            raise ValueError(f"explore_num_steps must be >= 1 or None, got {self.explore_num_steps}")
        if not _MODULE_PATH.fullmatch(self.builder):
            raise ValueError(f"builder must be a module path such as {DEFAULT_BUILDER!r}, got {self.builder!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s}")

    @property
    def heads(self) -> int:
        return int(self.arch["num_attention_heads"])

    @property
    def seq_len(self) -> int:
        return (self.side // 2) ** 2

    def steps(self, kind: Kind) -> int:
        """Denoising steps of a request of `kind`: it is complete once a group has committed them."""
        if kind is Kind.EXPLORATION and self.explore_num_steps is not None:
            return self.explore_num_steps
        return self.num_steps

    def builder_module(self) -> Builder:
        """The builder, imported (once per process: Python caches modules)."""
        module: ModuleType = importlib.import_module(self.builder)
        return module  # type: ignore[return-value]  # a module satisfies the Protocol by its attributes

    def build_model(self) -> torch.nn.Module:
        """The transformer (`Builder.build_model`)."""
        return self.builder_module().build_model(self)

    def build_policy(self, model: torch.nn.Module, device: str = "cpu") -> Any:
        """The sampler over `model` on `device` (`Builder.build_policy`)."""
        return self.builder_module().build_policy(self, model, device)
