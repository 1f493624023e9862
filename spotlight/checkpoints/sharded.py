"""Checkpoints of a learner group (issue 40, `spotlight.runtime.learner_group`): every rank writes
its own shard of the weights and of Adam's moments with torch's distributed checkpoint, in
safetensors (`HuggingFaceStorageWriter`, one file per rank; its reader builds the checkpoint's
layout from the files' JSON headers — DCP's default format keeps it in a pickle, and nothing in a
checkpoint is a pickle: a planted file may fail to load, never run code).

Layout: DIR/checkpoints/step-000010/
    shard-00001-model-00001-of-00001.safetensors ...   one per rank: "model/<name>" (the float32
                                                        master weights) and "optim/<name>/<key>"
                                                        (Adam's step, exp_avg, exp_avg_sq)
    state.json        {"step": 10, "identity": ..., "learner_gpus": N}
    MANIFEST.json     {"step": 10, "format": "sharded", "files": {NAME: {"size", "sha256"}}}, last

What holds for today's checkpoints (`spotlight.checkpoints.checkpoint`) holds here: the folder is
renamed into place complete, `checkpoint.read` verifies it (manifest, sizes, hashes, headers,
state.json), a damaged one is set aside, the store syncs its files, another run's is refused.
`load` applies nothing until every tensor is read and finite: it reads into new tensors, then
copies. The layout is the global one — names and full shapes, each file holding its rank's
offsets — so a group of another size loads it (torch reshards), and so does a plain model with
no process group (`no_dist`): a run can change `train.learner_gpus` between sessions.
"""

from __future__ import annotations

import json
import shutil
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from spotlight.checkpoints.checkpoint import (FILES, MANIFEST, PREFIX, SHARDED, Checkpoint, CheckpointError,
                                              CheckpointMismatch, read, refuse_foreign, seal)

ADAM = ("step", "exp_avg", "exp_avg_sq")
"""Adam's state of a parameter (torch.optim.Adam, amsgrad off), as it makes it at its first step."""


def is_sharded(ckpt: Checkpoint) -> bool:
    """Whether `ckpt`'s manifest says it is a learner group's (unverified: `read` verifies)."""
    try:
        return json.loads((ckpt.path / MANIFEST).read_text()).get("format") == SHARDED
    except (OSError, ValueError, AttributeError):
        return False


def _dist() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


@contextmanager
def _quiet() -> Iterator[None]:
    """Without a process group DCP warns that it assumes one process: that is what is meant here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def flat_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """The tensors a checkpoint holds, by checkpoint name, as the model's own (DTensors in a group):
    every parameter, and Adam's state of each trained one — made here, as Adam's first step makes
    it, where no step was taken yet (the state of a step-0 Adam: nothing changes)."""
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        out[f"model/{name}"] = p.detach()
        if not p.requires_grad:
            continue
        state = optimizer.state[p]
        if not state:
            state.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p, memory_format=torch.preserve_format),
                         exp_avg_sq=torch.zeros_like(p, memory_format=torch.preserve_format))
        for key in ADAM:
            out[f"optim/{name}/{key}"] = state[key]
    return out


def save(root: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         extra: dict[str, Any] | None = None, keep: int = 2) -> Checkpoint:
    """Every rank of the group calls it: each writes its shard; rank 0 writes state.json (with
    `extra`) and the manifest, then renames the folder into place and keeps the newest `keep`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter

    dist = _dist()
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist else (0, 1)
    final, tmp = root / f"{PREFIX}{step:06d}", root / f".tmp-{PREFIX}{step:06d}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    if dist:
        dist.barrier()
    with _quiet():
        dcp.save(flat_state(model, optimizer), storage_writer=HuggingFaceStorageWriter(str(tmp), save_distributed=True),
                 no_dist=dist is None)
    if dist:
        dist.barrier()  # every shard is written
    if rank == 0:
        (tmp / FILES[2]).write_text(json.dumps({"step": step, **(extra or {}), "learner_gpus": world}))
        seal(root, tmp, step, tuple(sorted(p.name for p in tmp.iterdir())), keep, {"format": SHARDED})
    if dist:
        dist.barrier()  # no rank goes on before the checkpoint is in place
    return Checkpoint(final, step)


def _layout(folder: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Checkpoint name -> (global shape, dtype), from the shards' headers."""
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader

    try:
        meta = HuggingFaceStorageReader(str(folder)).read_metadata()
    except Exception as err:  # a header the reader cannot make a layout of: damage, nothing ran
        raise CheckpointError(f"the shards' layout does not read ({type(err).__name__}: {str(err)[:100]})") from None
    return {k: (tuple(v.size), v.properties.dtype) for k, v in meta.state_dict_metadata.items()}


def _all_finite(tensors: dict[str, torch.Tensor]) -> bool:
    """Whether every value of `tensors` is finite — on every rank of the group (each checks its
    shards, then they agree), so that all refuse together or none does."""
    from torch.distributed.tensor import DTensor

    ok = all(bool(torch.isfinite(t.to_local() if isinstance(t, DTensor) else t).all())
             for t in tensors.values() if t.is_floating_point())
    dist = _dist()
    if dist is None:
        return ok
    flag = torch.tensor([int(ok)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def load_plain(ckpt: Checkpoint, model: torch.nn.Module, optimizer: torch.optim.Optimizer, hashes: bool = True,
               belongs: Callable[[dict[str, Any]], str | None] | None = None) -> dict[str, Any]:
    """A checkpoint of one learner process (`checkpoint.save`: the whole weights, Adam's state by
    parameter index) into a group's shards: every rank reads the files and keeps its own slice
    (no communication). The same refusals as `checkpoint.load`'s, applied before anything is."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    loaded = read(ckpt, hashes)
    refuse_foreign(loaded.state, belongs)
    named = [(n, p) for n, p in model.named_parameters()]
    if set(loaded.weights) != {n for n, _ in named} or any(tuple(loaded.weights[n].shape) != tuple(p.shape)
                                                           for n, p in named):
        raise CheckpointMismatch(f"{FILES[0]}: its tensors are not the model's")
    trained = [(n, p) for n, p in named if p.requires_grad]
    state = loaded.optimizer.get("state", {})
    if not set(state) <= set(range(len(trained))) or any(set(state[i]) != set(ADAM) for i in state):
        raise CheckpointError(f"{FILES[1]}: its Adam state is not Adam's state of the trained parameters")
    full = {f"model/{n}": loaded.weights[n] for n, _ in named}
    # A parameter no gradient ever reached has no state (Adam makes it at its first step): step 0.
    full.update({f"optim/{n}/{k}": state[i][k] for i, (n, _) in enumerate(trained) if i in state for k in ADAM})
    if not all(bool(torch.isfinite(t).all()) for t in full.values() if t.is_floating_point()):
        raise CheckpointError("its weights or optimiser state hold NaN or infinite values")
    own = flat_state(model, optimizer)
    with torch.no_grad():
        for k, tensor in own.items():
            if k not in full:  # left as `flat_state` made it
                continue
            value = full[k].to(tensor.dtype)
            if isinstance(tensor, DTensor):  # this rank's slice of the whole, cut here
                value = distribute_tensor(value.to(tensor.device), tensor.device_mesh, tensor.placements,
                                          src_data_rank=None)
            tensor.copy_(value)
    return loaded.state


def load(ckpt: Checkpoint, model: torch.nn.Module, optimizer: torch.optim.Optimizer, hashes: bool = True,
         belongs: Callable[[dict[str, Any]], str | None] | None = None) -> dict[str, Any]:
    """Restore the weights and Adam's state of `ckpt` (sharded) into `model` and `optimizer` — a
    group's ranks all call it, a plain model alone (the same files: torch reshards); returns
    state.json's contents. CheckpointMismatch for another run's (`belongs`, or other names or
    shapes); CheckpointError for damage (a file, a non-finite value), with nothing applied."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader

    state = read(ckpt, hashes, weights=False).state
    refuse_foreign(state, belongs)
    own = flat_state(model, optimizer)
    stored = _layout(ckpt.path)
    shapes = {k: tuple(v.shape) for k, v in own.items()}
    if shapes != {k: shape for k, (shape, _) in stored.items()}:
        diff = sorted(set(shapes) ^ set(stored)) or sorted(k for k in shapes if shapes[k] != stored[k][0])
        raise CheckpointMismatch(f"its tensors are not the model's ({', '.join(diff[:3])}...)")
    fresh = {k: torch.empty_like(v, dtype=stored[k][1]) for k, v in own.items()}
    try:
        with _quiet():
            dcp.load(fresh, storage_reader=HuggingFaceStorageReader(str(ckpt.path)), no_dist=_dist() is None)
    except Exception as err:
        raise CheckpointError(f"the shards do not load ({type(err).__name__}: {str(err)[:100]})") from None
    if not _all_finite(fresh):
        raise CheckpointError("its weights or optimiser state hold NaN or infinite values")
    with torch.no_grad():
        for k, tensor in own.items():  # read whole and checked: now it cannot fail half-way
            tensor.copy_(fresh[k])
    return state
