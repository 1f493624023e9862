"""Random weights of a model too large to build, written as safetensors shards as they are made.

`write_random_weights(model, folder, stem)` takes a model instantiated on the meta device (shapes
and names, no memory) and writes its state dict as `stem.safetensors`, or as shards
`stem-00001-of-0000N.safetensors` with the index `stem.safetensors.index.json` that diffusers'
and transformers' `from_pretrained` read — the layout `save_pretrained` writes. Each tensor is
drawn when its shard is written and dropped after: host memory stays near one shard
(`MAX_SHARD_BYTES`), whatever the model's size (the released Qwen-Image transformer is 41 GB in
bfloat16).

The values are random, deterministic from (seed, parameter name, the kind of device that draws
them), at a scale that keeps activations finite through many layers: a weight of fan-in n is normal with std n^-0.5 (the scale
of PyTorch's default init), a 1-D norm or scale weight is 1, a bias is 0. They time and size a
check run; they mean nothing.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

MAX_SHARD_BYTES = 5 << 30
"""Largest shard (5 GiB: what diffusers and transformers write by default)."""


def _tensor(name: str, shape: torch.Size, dtype: torch.dtype, seed: int, device: str = "cpu") -> torch.Tensor:
    """Parameter `name`'s random value (module docstring), drawn on `device`, returned on the CPU."""
    if len(shape) == 1:
        return (torch.zeros if name.endswith("bias") else torch.ones)(shape, dtype=dtype)
    key = int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") >> 1
    generator = torch.Generator(device=device).manual_seed(key)
    fan_in = shape[1:].numel()
    return (torch.randn(shape, generator=generator, device=device) * fan_in ** -0.5).to(dtype).cpu()


def write_random_weights(model: torch.nn.Module, folder: str | Path, stem: str, seed: int = 0,
                         dtype: torch.dtype = torch.bfloat16, max_shard_bytes: int = MAX_SHARD_BYTES,
                         progress=None, device: str | None = None) -> list[Path]:
    """Write `model`'s state dict (meta tensors: only names and shapes are read) as random `dtype`
    weights under `folder` in shards of at most `max_shard_bytes`; returns the files written.
    `progress(done_bytes, total_bytes)` is called after each shard. `device`: where the values are
    drawn (None: a CUDA GPU when there is one — the CPU's generator draws ~100 MB/s, 7 minutes for
    the released transformer — else the CPU; the values are the same from the same seed on the same
    kind of device)."""
    from safetensors.torch import save_file

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shapes = {name: t.shape for name, t in model.state_dict().items()}
    size = dtype.itemsize
    groups: list[list[str]] = [[]]
    held = 0
    for name, shape in shapes.items():
        n = shape.numel() * size
        if groups[-1] and held + n > max_shard_bytes:
            groups.append([])
            held = 0
        groups[-1].append(name)
        held += n
    total = sum(s.numel() for s in shapes.values()) * size
    single = len(groups) == 1
    files, weight_map, done = [], {}, 0
    for i, names in enumerate(groups, start=1):
        file = folder / (f"{stem}.safetensors" if single else f"{stem}-{i:05d}-of-{len(groups):05d}.safetensors")
        shard = {name: _tensor(name, shapes[name], dtype, seed, device) for name in names}
        save_file(shard, str(file), metadata={"format": "pt"})
        done += sum(t.numel() for t in shard.values()) * size
        del shard
        files.append(file)
        weight_map.update(dict.fromkeys(names, file.name))
        if progress is not None:
            progress(done, total)
    if not single:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (folder / f"{stem}.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return files
