"""Where a member's weights come from, cheapest first: a live copy on the same node, a live copy on
another node over the group, and only when no copy is alive anywhere, the checkpoint store.

- `NodeWeights` is a node's in-memory copy: on CPU the tensors live in shared memory (torch's
  `share_memory_()`), so any process on the node maps them without a copy through the disk or a
  socket; on GPUs the same handles are CUDA IPC handles of a peer's device copy.
- `copy_into` is the intra-node copy: a new member copies the node's tensors into its own model.
- `copy_over_group` moves the weights from a member that has them to members that have none,
  over the new group's process group (one flat buffer per dtype: few large messages).
- `load_checkpoint` reads the safetensors file a restart would read: the cold path the elastic
  one is measured against.

Invariant: whichever path a member took, its weights equal the source bit for bit (`digest`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from elastic_sp.group import SPGroup

StateDict = Mapping[str, torch.Tensor]


class NodeWeights:
    """A node's live copy of the weights (`version` says which): shared-memory tensors by name."""

    def __init__(self, tensors: dict[str, torch.Tensor], version: int = 0) -> None:
        self.tensors = tensors
        self.version = version

    @classmethod
    def share(cls, state: StateDict, version: int = 0) -> NodeWeights:
        """Copy `state` into shared memory (CPU tensors; a CUDA tensor is shared as it is: sending
        it to another process passes an IPC handle to the same device memory)."""
        out = {}
        for name, t in state.items():
            t = t.detach()
            if t.device.type == "cpu":
                t = t.clone().contiguous().share_memory_()
            out[name] = t
        return cls(out, version)

    def updated(self, state: StateDict, version: int) -> NodeWeights:
        """This copy with `state`'s tensors replaced (a partial publish: `state` names some of
        them), as version `version`. New shared tensors for those: members still mapping the old
        ones are not written under; the unchanged ones are shared, not copied."""
        extra = sorted(set(state) - set(self.tensors))
        if extra:
            raise ValueError(f"a partial publish names tensors the node's weights lack: {extra[:3]}")
        return NodeWeights({**self.tensors, **NodeWeights.share(state).tensors}, version)

    @classmethod
    def from_checkpoint(cls, path: str | Path, version: int = 0) -> NodeWeights:
        """Load once from the checkpoint store into the node's shared memory."""
        return cls({k: v.share_memory_() for k, v in load_checkpoint(path).items()}, version)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def copy_into(model: torch.nn.Module, source: StateDict, subset: bool = False) -> int:
    """The intra-node copy: overwrite `model`'s parameters and buffers with `source`'s tensors
    (same names and shapes; ValueError names the first mismatch). With `subset`, `source` may name
    only some of them (a partial publish: the trained part of a model whose rest is frozen); the
    others are left as they are. Returns bytes copied."""
    target = model.state_dict()
    missing = [] if subset else sorted(set(target) - set(source))
    extra = sorted(set(source) - set(target))
    if missing or extra:
        raise ValueError(f"weights do not match the model: missing {missing[:3]}, unexpected {extra[:3]}")
    copied = 0
    with torch.no_grad():
        for name, t in target.items():
            if name not in source:
                continue
            src = source[name]
            if src.shape != t.shape:
                raise ValueError(f"weight {name}: model has shape {tuple(t.shape)}, source {tuple(src.shape)}")
            t.copy_(src)
            copied += t.numel() * t.element_size()
    return copied


def _buckets(model: torch.nn.Module) -> dict[torch.dtype, list[torch.Tensor]]:
    """The model's tensors by dtype, in state_dict order (the same on every member)."""
    out: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in model.state_dict().values():
        out.setdefault(t.dtype, []).append(t)
    return out


def copy_over_group(group: SPGroup, model: torch.nn.Module, root: int, dsts: Sequence[int],
                    chunk_bytes: int = 64 << 20) -> int:
    """Collective over `group`: rank `root`'s weights overwrite `model`'s on the ranks in `dsts`.
    One flat buffer per dtype, moved in chunks of at most `chunk_bytes` (the root holds one copy
    of a chunk per destination). Returns bytes moved into this rank (or out of it, at the root)."""
    moved = 0
    with torch.no_grad():
        for dtype, tensors in _buckets(model).items():
            flat = torch.cat([t.detach().reshape(-1) for t in tensors]) if group.rank == root else \
                torch.empty(sum(t.numel() for t in tensors), dtype=dtype, device=tensors[0].device)
            step = max(1, chunk_bytes // flat.element_size())
            for lo in range(0, flat.numel(), step):
                group.copy_from(flat[lo:lo + step], root, dsts)
            if group.rank in dsts:
                for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
                    t.copy_(part.view_as(t))
            if group.rank in dsts or group.rank == root:
                moved += flat.numel() * flat.element_size() * (len(dsts) if group.rank == root else 1)
    return moved


def save_checkpoint(state: StateDict, path: str | Path) -> Path:
    """Write `state` as a safetensors file (what the checkpoint store holds)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(path))
    return path


def load_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a safetensors checkpoint (FileNotFoundError naming the path when absent)."""
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no weights checkpoint at {path}")
    return load_file(str(path))


def digest(state: StateDict | torch.nn.Module) -> str:
    """A hash of every tensor's name, dtype, shape and bytes: equal digests, equal weights."""
    if isinstance(state, torch.nn.Module):
        state = state.state_dict()
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().contiguous().cpu()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()
