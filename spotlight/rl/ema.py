"""An exponential moving average (EMA) of the trained parameters (`train.ema_decay`).

After every optimiser step, `ema = decay * ema + (1 - decay) * param`, tensor by tensor, over
`spotlight.rl.lora.trained_state` (every weight, or the adapters alone with LoRA). The learner
keeps it (`spotlight.runtime.learner.Learner.ema`); evaluation samples with it and `final/` holds
it (`swapped_in`); checkpoints carry it (`ema.safetensors`, `spotlight.checkpoints.checkpoint`).

Invariants:
- The average is kept in float32 whatever the model's dtype (a bfloat16 average has 8 bits of
  mantissa: with decay 0.999 an update of 1e-3 of the difference rounds away), and starts equal
  to the weights it averages.
- An update is written as `torch.lerp`, one rounding per element, element by element (no
  reduction: the same inputs give the same bits, on any number of threads). A parameter that has
  not moved leaves its average exactly where it is: `lerp(e, e, w) == e`, where
  `decay * e + (1 - decay) * e` drifts (measured here: 174 of 1,037 float32 elements moved by an
  ulp at decay 0.999). tests/spotlight/rl/test_ema.py checks the closed form and the fixed point.
- `swapped_in` puts the model's own tensors back bit for bit, and touches no parameter object
  (an optimiser's state is keyed by them).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch

from spotlight.rl.lora import trained_state


def ema_step(ema: torch.Tensor, param: torch.Tensor, decay: float) -> torch.Tensor:
    """One EMA update, out of place: `decay * ema + (1 - decay) * param`, as
    `lerp(ema, param, 1 - decay)` (= `ema + (1 - decay) * (param - ema)`).

    ema: any shape S, floating point; param: shape S, any floating dtype (cast to ema's).
    Returns shape S in ema's dtype. decay in [0, 1]: 0 gives `param`, 1 gives `ema`."""
    if ema.shape != param.shape:
        raise ValueError(f"ema_step: ema is {tuple(ema.shape)}, param {tuple(param.shape)}")
    return torch.lerp(ema, param.to(ema.dtype), 1.0 - decay)


def ema_init(params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A new average equal to `params`: float32 copies of the floating tensors (on their device),
    exact copies of the others (an integer buffer is not averaged: it follows the model)."""
    return {k: (v.detach().float() if v.is_floating_point() else v.detach()).clone() for k, v in params.items()}


@torch.no_grad()
def ema_update_(ema: dict[str, torch.Tensor], params: Mapping[str, torch.Tensor], decay: float) -> None:
    """`ema_step` on every tensor of `ema`, in place (`lerp_`: no second copy of the weights).
    `params` must have exactly `ema`'s names and shapes; a non-floating tensor is copied."""
    if ema.keys() != params.keys():
        diff = sorted(ema.keys() ^ params.keys())
        raise KeyError(f"ema_update_: the parameters' names differ from the average's ({', '.join(diff[:3])}...)")
    for name, avg in ema.items():
        p = params[name].detach()
        if avg.shape != p.shape:
            raise ValueError(f"ema_update_: {name} is {tuple(p.shape)}, its average {tuple(avg.shape)}")
        if avg.is_floating_point():
            avg.lerp_(p.to(avg.dtype), 1.0 - decay)
        else:
            avg.copy_(p)


@contextmanager
def swapped_in(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> Iterator[None]:
    """Inside the block `model`'s trained tensors hold `state` (cast to each tensor's dtype: a
    float32 average into a bfloat16 model rounds once); after it, exactly what they held before.
    Copies into the tensors in place: parameter objects, and so an optimiser's state, are untouched.
    Memory: one extra copy of the trained tensors (the adapters alone with LoRA)."""
    own = trained_state(model)
    if own.keys() != state.keys():
        diff = sorted(own.keys() ^ state.keys())
        raise KeyError(f"swapped_in: the state's names differ from the model's ({', '.join(diff[:3])}...)")
    held = {k: v.detach().clone() for k, v in own.items()}
    try:
        with torch.no_grad():
            for name, tensor in own.items():
                tensor.copy_(state[name])
        yield
    finally:
        with torch.no_grad():
            for name, tensor in own.items():
                tensor.copy_(held[name])
