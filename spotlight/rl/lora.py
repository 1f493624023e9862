"""LoRA adapters (peft) on a policy's model, and the state that training moves around.

With `policy.lora.rank` > 0 the model's base weights are frozen and peft's LoRA layers are injected
into the target linears (`inject_adapter_in_model`: the model stays the diffusers / transformers
class it was, so every forward call is unchanged). Only the adapters are trained, published to the
workers and checkpointed: `trained_state` is what leaves the learner, `load_trained_state` what a
worker or a checkpoint puts back. Without LoRA both are the whole `state_dict`, as before.

Everything here is deterministic: the adapters' initial values (peft draws lora_A from the global
RNG) come from a generator keyed by the run seed, and the global RNG is left as it was.

The KL reference with LoRA is the base itself — the same model with its adapters switched off
(`Reference`) — so it costs no copy of the weights (a 20B DiT cannot afford a second one).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from schedulers.input.files import short
from spotlight.config import ConfigError, RunConfig
from spotlight.rl.seeding import derive_seed

ADAPTER = "default"
"""peft's adapter name: the one `save_lora_weights` / `PeftModel.save_pretrained` write."""
_LORA_INIT = 0x10A  # stream tag of the adapters' initial values


def peft_config(cfg: RunConfig):
    """The peft `LoraConfig` of `policy.lora` (its target modules, or the policy's defaults)."""
    from peft import LoraConfig

    lora = cfg.policy.lora
    return LoraConfig(r=lora.rank, lora_alpha=lora.lora_alpha, target_modules=cfg.policy.lora_targets,
                      lora_dropout=0.0, bias="none")


def lora_metadata(cfg: RunConfig) -> dict[str, Any]:
    """The adapter's peft config as a dict (diffusers keeps it in its LoRA file, so a loader gets
    the rank and alpha back: without it, alpha would default to the rank)."""
    return peft_config(cfg).to_dict()


def add_lora(model: torch.nn.Module, cfg: RunConfig) -> torch.nn.Module:
    """Freeze `model` and inject LoRA adapters (`policy.lora`) into its target linears, in place;
    returns it. lora_B starts at zero (peft's default), so the model still computes its base."""
    from peft import inject_adapter_in_model

    if cfg.policy.lora.target_modules:  # the user's names: each must name a layer (the defaults need not all)
        check_names(model, cfg)
    model.requires_grad_(False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(cfg.seed, _LORA_INIT))
        try:
            inject_adapter_in_model(peft_config(cfg), model, adapter_name=ADAPTER)
        except ValueError as err:  # peft's: no target found, or a target that is no layer it adapts (a norm)
            first = " ".join(str(err).split())[:200]
            raise ConfigError(f"policy.lora.target_modules: peft cannot adapt these layers: {first}") from None
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    if not has_lora(model):
        raise ConfigError(f"policy.lora.target_modules: none of {short(cfg.policy.lora_targets)} names a layer of "
                          f"the model (expected names of its linear layers, e.g. {_examples(model)})")
    # Adapters train in float32 over a bfloat16 base (as diffusers' LoRA scripts cast them): a
    # bfloat16 weight has 8 bits of mantissa, and Adam's small steps on it would round away.
    # peft's layers cast their input to the adapters' dtype and the result back.
    for p in _adapters(model).values():
        if p.dtype != torch.float32:
            p.data = p.data.float()
    return model


def check_names(model: torch.nn.Module, cfg: RunConfig) -> None:
    """ConfigError unless each of `policy.lora.target_modules` names a module of `model` as peft
    matches one (`check_target_module_exists` for a list: the full name, or its last parts)."""
    modules = [name for name, _ in model.named_modules() if name]
    missing = [t for t in cfg.policy.lora.target_modules or ()
               if not any(name == t or name.endswith("." + t) for name in modules)]
    if missing:
        names = ", ".join(short(m, 60) for m in missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        raise ConfigError(f"policy.lora.target_modules: no layer of the {cfg.policy.kind} model is named {names} "
                          f"(expected names of its linear layers, e.g. {_examples(model)})")


def _examples(model: torch.nn.Module, most: int = 6) -> str:
    """A few names of `model`'s linear layers as a target list would give them (their last part)."""
    seen: list[str] = []
    for name, module in model.named_modules():
        parts = name.split(".")
        last = ".".join(parts[-2:] if parts[-1].isdigit() else parts[-1:])  # `to_out.0`, not `0`
        if isinstance(module, torch.nn.Linear) and last not in seen:
            seen.append(last)
    return ", ".join(seen[:most]) or "none: it has no linear layer"


def has_lora(model: torch.nn.Module) -> bool:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return any(isinstance(m, BaseTunerLayer) for m in model.modules())


def _adapters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    # By name, not requires_grad: peft flips that flag while the adapters are off (`adapters_off`).
    return {name: p for name, p in model.named_parameters() if "lora_" in name}


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the optimiser steps: all of them, or the adapters' with LoRA."""
    return list(_adapters(model).values()) if has_lora(model) else list(model.parameters())


def trained_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What training changes, by name: the whole state dict, or only the adapters with LoRA.
    The tensors are the model's own (callers copy them when they must not change)."""
    return _adapters(model) if has_lora(model) else model.state_dict()


def load_trained_state(model: torch.nn.Module, state: dict[str, Any]) -> None:
    """Put a `trained_state` back; its names must be exactly the model's (a full state dict into
    a LoRA model, or adapters into a plain one, is refused rather than half loaded)."""
    if not has_lora(model):
        model.load_state_dict(state)
        return
    own = set(_adapters(model))
    if set(state) != own:
        diff = sorted(set(state) ^ own)
        raise KeyError(f"the state's tensor names differ from the model's adapters ({', '.join(diff[:3])}...)")
    model.load_state_dict(state, strict=False)


def storable(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` as safetensors' `save_file` takes it: detached, contiguous, on the CPU, and no two
    tensors sharing storage (a model with tied embeddings, such as Qwen2.5-0.5B..3B, holds
    `lm_head.weight` and `embed_tokens.weight` in one; save_file refuses that). A shared tensor is
    copied once; the others are not copied beyond the move to the CPU."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in state.items():
        t = tensor.detach().contiguous().cpu()
        where = t.untyped_storage().data_ptr()
        if where in seen:
            t = t.clone()
        seen.add(where)
        out[name] = t
    return out


def base_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The frozen base's state dict under the names the model had before `add_lora` (peft moves a
    wrapped linear's weights to `<name>.base_layer.*`): what a worker loads before its own `add_lora`."""
    return {name.replace(".base_layer.", "."): t for name, t in model.state_dict().items() if "lora_" not in name}


def fingerprint(state: dict[str, torch.Tensor]) -> str:
    """A checksum of a state dict's names, dtypes, shapes and bytes (CRC-64/NVME, ~24 GB/s on a
    CPU core: seconds for a 41 GB base), so two processes can tell they hold the same weights
    without moving them."""
    from awscrt.checksums import crc64nvme

    crc = 0
    for name in sorted(state):
        t = state[name].detach().contiguous().cpu()
        crc = crc64nvme(f"{name}:{t.dtype}:{tuple(t.shape)};".encode(), crc)
        crc = crc64nvme(memoryview(t.reshape(-1).view(torch.uint8).numpy()), crc)
    return f"crc64nvme:{crc:016x}"


@dataclass(frozen=True)
class LocalBase:
    """What the learner sends a worker instead of its base when every node can build the same
    base itself (`policy.*.pretrained_path` or the seed's random weights, no warm start): the base's
    `fingerprint`, which the worker's own build must match."""

    fingerprint: str


@contextmanager
def adapters_off(model: torch.nn.Module) -> Iterator[None]:
    """The model computes its base's outputs inside the block (every adapter disabled)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def frozen_reference(model: torch.nn.Module) -> Any:
    """The KL reference for `model` as it is now: with LoRA the base (`Reference`: the adapters are
    all the change training makes), else a frozen copy."""
    if has_lora(model):
        return Reference(model)
    import copy

    return copy.deepcopy(model).eval().requires_grad_(False)


class Reference:
    """The KL reference of a LoRA policy: its model with the adapters off (no copy of the weights).
    Called like the model; `dtype` is the model's, as the velocity / log-prob helpers read it."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with adapters_off(self.model):
            return self.model(*args, **kwargs)
