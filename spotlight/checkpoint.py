"""Training checkpoints: weights (safetensors), optimiser state, RNG states and the step.

Layout: DIR/checkpoints/step-000010/{model.safetensors, optimizer.pt, state.json}. A checkpoint is
written to a temporary folder and renamed into place, so a folder named step-* is always complete:
a run killed mid-write leaves the previous checkpoint as the newest one.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

PREFIX = "step-"


@dataclass
class Checkpoint:
    path: Path
    step: int
    """Iterations completed; training resumes at this iteration index."""


def _rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def save(root: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         extra: dict[str, Any] | None = None, keep: int = 2) -> Checkpoint:
    """Write the checkpoint after `step` completed iterations; keep the newest `keep`."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:06d}"
    tmp = root / f".tmp-{PREFIX}{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    # safetensors refuses shared or non-contiguous storage; state_dict tensors are plain parameters.
    save_file({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"))
    torch.save({"optimizer": optimizer.state_dict(), "rng": _rng_state()}, tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, **(extra or {})}))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old.path, ignore_errors=True)
    return Checkpoint(final, step)


def list_checkpoints(root: Path) -> list[Checkpoint]:
    """Complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [Checkpoint(p, int(p.name[len(PREFIX):])) for p in root.iterdir()
             if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit()]
    return sorted(found, key=lambda c: c.step)


def latest(root: Path) -> Checkpoint | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def load(ckpt: Checkpoint, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore weights, optimiser and RNG states in place; returns state.json's contents."""
    model.load_state_dict(load_file(str(ckpt.path / "model.safetensors")))
    blob = torch.load(ckpt.path / "optimizer.pt", weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    _set_rng_state(blob["rng"])
    return json.loads((ckpt.path / "state.json").read_text())
