"""Training checkpoints: weights, optimiser state, RNG states and the step — data only, verified
before anything of them is used.

Layout: DIR/checkpoints/step-000010/
    model.safetensors       the weights
    optimizer.safetensors   the optimiser's state dict and the RNG states (`cloud.codec`: tensors and
                            a JSON tree; nothing in a checkpoint is a pickle, so a planted file can
                            fail to load but never run code)
    state.json              {"step": 10, ...}
    ema.safetensors         with `train.ema_decay` only: the EMA of the weights (float32, the
                            names of model.safetensors)
    MANIFEST.json           {"step": 10, "files": {NAME: {"size", "sha256"}}}, written last

Invariants:
- A folder named step-* is complete: files are written to a temporary folder, each file and the
  folder are fsynced, then the folder is renamed and its parent fsynced — a kill or a host crash
  mid-write leaves the previous checkpoint as the newest one (tests/spotlight/train/test_trainer.py).
- A checkpoint is used only once it verifies (`verify`): its manifest parses and names this step,
  every file has the listed size (and SHA-256), every file decodes; and `load` applies nothing
  unless the weights match the model's names, shapes and dtypes, the optimiser and RNG states
  load, and — for a run that keeps an EMA — the EMA is there with the names, shapes and dtypes of
  the run's (a run without one ignores a checkpoint's: tests/spotlight/rl/test_ema.py). Resuming walks back
  from the newest checkpoint to the newest one that verifies and loads;
  each one skipped is moved aside to `.skipped-step-N` with the reason logged, so it is never taken
  again and never pushed (tests/spotlight/checkpoints/test_checkpoint_recovery.py truncates and empties each file in turn).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from cloud.bounded_json import JsonRefused, load_file
from cloud.codec import DecodeError, read_file, write_file
from spotlight.rl.lora import load_trained_state, storable, trained_state

PREFIX = "step-"
SKIPPED = ".skipped-"
"""A checkpoint that failed verification is renamed to SKIPPED + its name: kept for a look, never listed."""
MANIFEST = "MANIFEST.json"
FILES = ("model.safetensors", "optimizer.safetensors", "state.json")
"""The files every checkpoint holds."""
EMA = "ema.safetensors"
"""The one optional file: a checkpoint of a run with `train.ema_decay` holds it, others do not."""
SHARDED = "sharded"
"""MANIFEST.json's `format` of a learner group's checkpoint (`spotlight.checkpoints.sharded`):
state.json and one `SHARD` file per rank, in place of the weights and optimiser files."""
SHARD = re.compile(r"shard-\d{5}-model-\d{5}-of-\d{5}\.safetensors")
"""A rank's file of a sharded checkpoint, as torch's distributed checkpoint names it
(`HuggingFaceStorageWriter` with `save_distributed`): its weights and Adam moments."""

MAX_MANIFEST_BYTES = 1 << 20
"""MANIFEST.json and state.json are read with at most this (1 MiB): a manifest names 4-5 files in
~500 bytes and state.json is {"step": N}, so a larger one is not ours and the checkpoint is skipped."""


def is_checkpoint_file(name: str) -> bool:
    """Whether a file of that name belongs in a checkpoint folder (of either format): what a store
    holding one may install, and what a push sends."""
    return name in (*FILES, EMA, MANIFEST) or SHARD.fullmatch(name) is not None


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; `str(err)` is one line saying why."""


class CheckpointMismatch(CheckpointError):
    """A sound checkpoint of another run (`spotlight.checkpoints.resume_identity`: another config, seed or
    model shapes): refused, and never set aside — it is someone's work, not damage."""


@dataclass
class Checkpoint:
    path: Path
    step: int
    """Iterations completed; training resumes at this iteration index."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in `path` durable (a renamed folder is only as durable as its parent)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- RNG states as plain data -------------------------------------------------------------------


def _rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(), "numpy": (name, keys.tolist(), pos, has_gauss, cached),
            "python": random.getstate()}


def _set_rng_state(state: dict[str, Any]) -> None:
    name, keys, pos, has_gauss, cached = state["numpy"]
    torch.set_rng_state(state["torch"])
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])


# ---- write ----------------------------------------------------------------------------------------


def save(root: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         extra: dict[str, Any] | None = None, keep: int = 2,
         ema: dict[str, torch.Tensor] | None = None) -> Checkpoint:
    """Write the checkpoint after `step` completed iterations (and `ema`, the weights' EMA, when
    given); keep the newest `keep`."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{PREFIX}{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    # What training changed (`trained_state`: the adapters alone with LoRA; the base is rebuilt).
    save_file(storable(trained_state(model)), str(tmp / FILES[0]))
    write_file({"optimizer": optimizer.state_dict(), "rng": _rng_state()}, tmp / FILES[1])
    (tmp / FILES[2]).write_text(json.dumps({"step": step, **(extra or {})}))
    names = FILES
    if ema is not None:
        save_file(storable(ema), str(tmp / EMA))
        names = (*FILES, EMA)
    return seal(root, tmp, step, names, keep)


def seal(root: Path, tmp: Path, step: int, names: tuple[str, ...], keep: int = 2,
         manifest: dict[str, Any] | None = None) -> Checkpoint:
    """Make the files `names` written in `tmp` the checkpoint after `step` iterations: each synced
    and hashed into MANIFEST.json (with `manifest`'s fields), written last; the folder synced and
    renamed into place, its parent synced; the newest `keep` kept (the module docstring's invariant)."""
    give_own_modes(tmp)
    files = {}
    for name in names:
        fsync_file(tmp / name)
        files[name] = {"size": (tmp / name).stat().st_size, "sha256": sha256_of(tmp / name)}
    (tmp / MANIFEST).write_text(json.dumps({"step": step, **(manifest or {}), "files": files}, indent=1))
    fsync_file(tmp / MANIFEST)
    fsync_dir(tmp)
    final = root / f"{PREFIX}{step:06d}"
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    fsync_dir(root)
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old.path, ignore_errors=True)
    return Checkpoint(final, step)


OWN_MODE = 0o666
"""What the run's files are created with, before the umask (Python's `open` default)."""


def own_mode() -> int:
    """The mode the run's own files get here: `OWN_MODE` less this process's umask."""
    mask = os.umask(0)
    os.umask(mask)
    return OWN_MODE & ~mask


def give_own_modes(folder: Path) -> None:
    """The files in `folder` (and its subfolders: a pipeline's) get `own_mode()`: safetensors writes
    its files 0600, so a run's weights were the one thing in its folder that another user (or a web
    server, a sync tool) could not read beside its 0644 config (issue 42)."""
    mode = own_mode()
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(mode)


def list_checkpoints(root: Path) -> list[Checkpoint]:
    """Checkpoint folders under `root` (not yet verified), oldest first."""
    if not root.is_dir():
        return []
    found = [Checkpoint(p, int(p.name[len(PREFIX):])) for p in root.iterdir()
             if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX):].isdigit()]
    return sorted(found, key=lambda c: c.step)


def latest(root: Path) -> Checkpoint | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


# ---- verify and load ------------------------------------------------------------------------------


def verify(ckpt: Checkpoint, hashes: bool = True) -> str | None:
    """None when `ckpt` is usable, else one line saying why not: the manifest, every file's size
    (and SHA-256 when `hashes`), and that every file decodes (the weights' header, the optimiser
    file, state.json)."""
    try:
        read(ckpt, hashes, weights=False)
    except CheckpointError as err:
        return str(err)
    return None


@dataclass
class Loaded:
    """A checkpoint read into memory and decoded, nothing applied yet."""

    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: dict[str, Any]
    state: dict[str, Any]
    ema: dict[str, torch.Tensor] | None = None
    """The weights' EMA (`EMA`); None when the checkpoint has none, or `read` read no tensor."""


def _tensors(path: Path, weights: bool) -> dict[str, torch.Tensor] | None:
    """The tensors of safetensors file `path` (None unless `weights`: then it is only parsed, for
    `verify`). CheckpointError when safetensors' own parser refuses it: a damaged file, nothing ran."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()} if weights else None
    except Exception as err:
        raise CheckpointError(f"{path.name} does not load ({type(err).__name__}: {str(err)[:100]})") from None


def read(ckpt: Checkpoint, hashes: bool = True, weights: bool = True, states: bool = True) -> Loaded:
    """Verify and decode `ckpt` (see `verify`); raises CheckpointError. Without `weights`, the
    weights file's header is parsed (names, shapes, offsets within the file) but no tensor is read;
    without `states`, the optimiser file is not decoded (the optimiser and RNG states are empty)."""
    folder = ckpt.path
    try:
        manifest = load_file(folder / MANIFEST, max_bytes=MAX_MANIFEST_BYTES)
        files = manifest["files"]
        sharded = manifest.get("format") == SHARDED
        if sharded:
            shards = sorted(n for n in files if SHARD.fullmatch(n)) if isinstance(files, dict) else []
            if manifest["step"] != ckpt.step or not shards or set(files) != {FILES[2], *shards}:
                raise CheckpointError(f"{MANIFEST} does not describe iteration {ckpt.step}'s {FILES[2]} and "
                                      "its ranks' shard files")
        elif (manifest["step"] != ckpt.step or not isinstance(files, dict)
                or set(files) not in (set(FILES), {*FILES, EMA})):
            raise CheckpointError(f"{MANIFEST} does not describe iteration {ckpt.step}'s {', '.join(FILES)} "
                                  f"(and optionally {EMA})")
    except FileNotFoundError:
        legacy = " (written by an older Spotlight: its optimizer.pt is a pickle, never loaded)" \
            if (folder / "optimizer.pt").exists() else ""
        raise CheckpointError(f"no {MANIFEST}{legacy}") from None
    except JsonRefused as err:  # too large, too deep (issue 27: a 100k-deep one was a RecursionError), not JSON
        raise CheckpointError(f"unreadable {err}") from None
    except (ValueError, KeyError, TypeError, OSError) as err:
        raise CheckpointError(f"unreadable {MANIFEST} ({type(err).__name__})") from None
    for name in files:
        want, path = files[name], folder / name
        if not (isinstance(want, dict) and isinstance(want.get("size"), int) and isinstance(want.get("sha256"), str)):
            raise CheckpointError(f"{MANIFEST}: entry {name} lacks an integer size and a sha256")
        if not path.is_file():
            raise CheckpointError(f"{name} is missing")
        size = path.stat().st_size
        if size != want["size"]:
            raise CheckpointError(f"{name} has {size} bytes, {MANIFEST} says {want['size']} (truncated?)")
        if hashes and sha256_of(path) != want["sha256"]:
            raise CheckpointError(f"{name} does not match its SHA-256 in {MANIFEST}")
    if sharded:  # each shard's header parses; the learner group reads the tensors (`sharded.load`)
        for shard in shards:
            _tensors(folder / shard, weights=False)
        return Loaded({}, {}, {}, _state(folder, ckpt.step), None)
    tensors = _tensors(folder / FILES[0], weights) or {}
    ema = _tensors(folder / EMA, weights) if EMA in files else None
    try:
        blob = read_file(folder / FILES[1]) if states else {"optimizer": {}, "rng": {}}
        optimizer, rng = blob["optimizer"], blob["rng"]
        state = load_file(folder / FILES[2], max_bytes=MAX_MANIFEST_BYTES)
        if not (isinstance(optimizer, dict) and isinstance(rng, dict) and isinstance(state, dict)
                and state.get("step") == ckpt.step):
            raise CheckpointError(f"{FILES[1]} or {FILES[2]} does not hold iteration {ckpt.step}'s state")
    except DecodeError as err:
        raise CheckpointError(f"{FILES[1]}: {err}") from None
    except JsonRefused as err:
        raise CheckpointError(f"unreadable {err}") from None
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{FILES[1]} or {FILES[2]} is malformed ({type(err).__name__})") from None
    return Loaded(tensors, optimizer, rng, state, ema)


def _state(folder: Path, step: int) -> dict[str, Any]:
    """A sharded checkpoint's state.json, which must hold iteration `step`'s state."""
    try:
        state = load_file(folder / FILES[2], max_bytes=MAX_MANIFEST_BYTES)
    except JsonRefused as err:
        raise CheckpointError(f"unreadable {err}") from None
    except (ValueError, TypeError, UnicodeDecodeError, OSError) as err:
        raise CheckpointError(f"{FILES[2]} is malformed ({type(err).__name__})") from None
    if not (isinstance(state, dict) and state.get("step") == step):
        raise CheckpointError(f"{FILES[2]} does not hold iteration {step}'s state")
    return state


def refuse_foreign(state: dict[str, Any], belongs: Callable[[dict[str, Any]], str | None] | None) -> None:
    """CheckpointMismatch when `belongs(state)` (state.json's contents) says why the checkpoint is not
    this run's; nothing when it is, or when there is no `belongs`."""
    why = belongs(state) if belongs is not None else None
    if why is not None:
        raise CheckpointMismatch(f"not this run's checkpoint: {why}")


def _check_fits(file: str, tensors: dict[str, torch.Tensor], own: dict[str, torch.Tensor], whose: str) -> None:
    """CheckpointError unless `tensors` (read from `file`) have exactly the names, shapes and dtypes of `own`."""
    if tensors.keys() != own.keys():
        diff = sorted(tensors.keys() ^ own.keys())
        raise CheckpointError(f"{file}: tensor names differ from {whose} ({', '.join(diff[:3])}...)")
    for name, tensor in tensors.items():
        if tensor.shape != own[name].shape or tensor.dtype != own[name].dtype:
            raise CheckpointError(f"{file}: {name} is {tuple(tensor.shape)} {tensor.dtype}, {whose} "
                                  f"{tuple(own[name].shape)} {own[name].dtype}")


def _check_finite(file: str, tensors: dict[str, torch.Tensor]) -> None:
    """CheckpointError when a floating-point tensor of `tensors` holds a NaN or an infinity."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(f"{file}: {name} holds NaN or infinite values")


def _check_optimizer(state: dict[str, Any], optimizer: torch.optim.Optimizer) -> None:
    """CheckpointError unless optimiser state dict `state` is one `optimizer` (built from the run's
    config) can take as it is: the same parameter groups with the same hyper-parameters (they come
    from the config: a stored lr of 1e9 is a damaged file, not a setting), and for every parameter,
    state tensors of the parameter's shape and dtype (scalars such as Adam's step aside), all finite."""
    own = optimizer.state_dict()
    groups, mine = state.get("param_groups"), own["param_groups"]
    if not (isinstance(groups, list) and len(groups) == len(mine)
            and all(isinstance(g, dict) and g.get("params") == m["params"] for g, m in zip(groups, mine))):
        raise CheckpointError(f"{FILES[1]}: its parameter groups are not the model's")
    for g, m in zip(groups, mine):  # a key another torch version lacks is the config's, below
        for key in (m.keys() & g.keys()) - {"params"}:
            if _plain(g[key]) != _plain(m[key]):
                raise CheckpointError(f"{FILES[1]}: {key} is {str(g[key])[:40]}, the config's is {m[key]}")
    params = {i: p for group, m in zip(optimizer.param_groups, mine) for i, p in zip(m["params"], group["params"])}
    per_param = state.get("state")
    if not isinstance(per_param, dict) or not set(per_param) <= set(params):
        raise CheckpointError(f"{FILES[1]}: its state names parameters the model does not have")
    for i, entries in per_param.items():
        if not isinstance(entries, dict):
            raise CheckpointError(f"{FILES[1]}: the state of parameter {i} is not a mapping")
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                if value.dim() > 0 and (value.shape != params[i].shape or value.dtype != params[i].dtype):
                    raise CheckpointError(f"{FILES[1]}: {key} of parameter {i} is {tuple(value.shape)} {value.dtype}, "
                                          f"the parameter {tuple(params[i].shape)} {params[i].dtype}")
                if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                    raise CheckpointError(f"{FILES[1]}: {key} of parameter {i} holds NaN or infinite values")
            elif isinstance(value, (int, float)) and not math.isfinite(value):
                raise CheckpointError(f"{FILES[1]}: {key} of parameter {i} is {value}")


def _plain(value: Any) -> Any:
    """`value` with tuples as lists: how a hyper-parameter reads back from `cloud.codec`."""
    return [_plain(v) for v in value] if isinstance(value, (tuple, list)) else value


def _check_rng(rng: dict[str, Any]) -> None:
    """CheckpointError unless `rng` holds RNG states of the shapes this process's RNGs have."""
    torch_state, own = rng.get("torch"), torch.get_rng_state()
    if not (isinstance(torch_state, torch.Tensor) and torch_state.dtype == own.dtype and torch_state.shape == own.shape):
        raise CheckpointError(f"{FILES[1]}: the torch RNG state is not a {tuple(own.shape)} {own.dtype} tensor")


def load(ckpt: Checkpoint, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         hashes: bool = True, ema: dict[str, torch.Tensor] | None = None,
         belongs: Callable[[dict[str, Any]], str | None] | None = None) -> dict[str, Any]:
    """Restore weights, optimiser and RNG states in place — and, given the run's `ema` (its EMA
    of the weights), the checkpoint's EMA into it; returns state.json's contents. Raises
    CheckpointError — with model, optimiser, RNGs and `ema` untouched — when anything does not
    fit: for an `ema`, a checkpoint without one (written by a run without `train.ema_decay`) does
    not; non-finite weights or optimiser state, optimiser state of other shapes or other
    hyper-parameters than `optimizer`'s (`_check_optimizer`) do not. Without `ema`, a checkpoint's
    EMA is ignored.

    `belongs(state)` says why state.json's `state` is not this run's (None when it is: e.g.
    `resume_identity.mismatch`); a checkpoint it refuses, or one whose tensor names, shapes or
    dtypes differ from the model's, raises CheckpointMismatch: it is another run's."""
    loaded = read(ckpt, hashes)
    refuse_foreign(loaded.state, belongs)
    try:
        _check_fits(FILES[0], loaded.weights, trained_state(model), "the model's")
    except CheckpointError as err:
        raise CheckpointMismatch(str(err)) from None
    _check_finite(FILES[0], loaded.weights)
    if ema is not None:
        if loaded.ema is None:
            raise CheckpointError(f"no {EMA}: written by a run without train.ema_decay, and this run keeps an EMA "
                                  "of the weights it cannot rebuild")
        _check_fits(EMA, loaded.ema, ema, "the run's EMA's")
        _check_finite(EMA, loaded.ema)
    _check_optimizer(loaded.optimizer, optimizer)
    _check_rng(loaded.rng)
    rng_before, optimizer_before = _rng_state(), copy.deepcopy(optimizer.state_dict())
    hyper = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    try:
        optimizer.load_state_dict(loaded.optimizer)
        for group, own in zip(optimizer.param_groups, hyper):  # the config's, always
            group.update(own)
        _set_rng_state(loaded.rng)
    except Exception as err:  # a malformed state: put back what was there and refuse the checkpoint
        optimizer.load_state_dict(optimizer_before)
        _set_rng_state(rng_before)
        raise CheckpointError(f"{FILES[1]}: the optimiser or RNG state does not load "
                              f"({type(err).__name__}: {str(err)[:100]})") from None
    load_trained_state(model, loaded.weights)  # names, shapes and dtypes checked above: cannot fail half-way
    if ema is not None:
        for name, tensor in loaded.ema.items():
            ema[name].copy_(tensor)
    return loaded.state


def set_aside(ckpt: Checkpoint) -> Path:
    """Move a checkpoint that failed verification out of the way (`.skipped-step-N`)."""
    target = ckpt.path.with_name(SKIPPED + ckpt.path.name)
    shutil.rmtree(target, ignore_errors=True)
    ckpt.path.rename(target)
    return target


def newest_usable(root: Path, refused: Callable[[str], None], use: Callable[[Checkpoint], Any] | None = None,
                  hashes: bool = True) -> Checkpoint | None:
    """Walk back from the newest checkpoint under `root` to the newest one that verifies — and that
    `use` takes, when given (it raises CheckpointError to refuse one: `load` into a model does).
    Each one refused is set aside, with one line to `refused` (the learner, in a Ray actor, collects
    them for the controller to log); None when none is usable (the run starts fresh).
    A CheckpointMismatch (another run's checkpoint) is raised, and nothing is set aside for it."""
    for ckpt in reversed(list_checkpoints(root)):
        try:
            if use is None:
                read(ckpt, hashes, weights=False)
            else:
                use(ckpt)
            return ckpt
        except CheckpointMismatch as err:
            raise CheckpointMismatch(f"{ckpt.path}: {err}") from None
        except CheckpointError as err:
            moved = set_aside(ckpt)
            refused(f"checkpoint {ckpt.path} skipped: {err}; moved to {moved.name}")
    return None


def newest_sound(root: Path) -> tuple[Checkpoint, dict[str, Any]] | None:
    """The newest checkpoint under `root` whose manifest, file sizes, weights header and state.json
    verify, with its state.json; None when none does. A look before a run starts: no hash, and the
    optimiser file — the largest, decoded when the run loads it — is not read. Moves nothing: a
    folder merely named step-N is not progress, and a damaged one is set aside only by `newest_usable`."""
    for ckpt in reversed(list_checkpoints(root)):
        try:
            return ckpt, read(ckpt, hashes=False, weights=False, states=False).state
        except CheckpointError:
            continue
    return None
