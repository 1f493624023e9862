"""Plain data with tensors as bytes that decoding can never turn into code.

Everything Spotlight reads back from a store (optimiser and RNG states, a rollout's committed
in-flight state) goes through this codec instead of pickle: a pickle is a program, and whoever can
write to the bucket would run it on the trainer. Here the bytes are a safetensors file — the
tensors, and in its metadata one JSON tree of the rest — and `decode` builds only:
- JSON values (None, bools, ints, floats — nan and inf included — strings, lists, string-keyed dicts),
- tuples, dicts with other keys, `pathlib.Path`s, `bytes`,
- CPU tensors of safetensors' dtypes,
- instances of the dataclasses and enums the caller names in `allowed`, built through their
  constructors (so their own `__post_init__` checks run) from their init fields exactly.

Anything else — an unknown class name, a missing or extra field, a dangling tensor reference, a
malformed header, bytes that are not safetensors — is a `DecodeError` with one line saying what,
and nothing of the input has run. Integrity (is this what the writer wrote?) is not the codec's
business: stored objects carry a manifest with their size and SHA-256.
Invariants tested in tests/cloud/test_codec.py: `decode(encode(x)) == x` for every supported shape,
tensors bit-identical; a pickle, truncated bytes and disallowed classes never decode.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
import math
import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path, PurePath
from typing import Any

import torch
from safetensors.torch import load as _load_tensors
from safetensors.torch import load_file as _load_tensor_file
from safetensors.torch import save as _save_tensors
from safetensors.torch import save_file as _save_tensor_file

FORMAT = "spotlight-data/1"
MAX_HEADER_BYTES = 64 << 20
"""A safetensors header (tensor table + our JSON tree) larger than this is refused unread."""
_MAX_DEPTH = 200
"""Deepest nesting decoded: real trees are < 10 deep; a hostile one must not exhaust the stack."""


class DecodeError(ValueError):
    """Bytes that are not an encoded value of the allowed types; `str(err)` is one line."""


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _types(allowed: tuple[type, ...]) -> dict[str, type]:
    """Allowed types by name."""
    return {_name(c): c for c in allowed}


def encode(obj: Any, allowed: Iterable[type] = ()) -> bytes:
    """`obj` as bytes. Dataclass and enum instances must be of a type in `allowed` (what the
    reader will accept: a writer cannot produce what its reader refuses)."""
    return _save_tensors(*_flatten(obj, allowed))


def write_file(obj: Any, path: Path, allowed: Iterable[type] = ()) -> None:
    """`encode(obj)` written to `path` without building the bytes in memory first."""
    tensors, metadata = _flatten(obj, allowed)
    _save_tensor_file(tensors, str(path), metadata=metadata)


def _flatten(obj: Any, allowed: Iterable[type]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    names = _types(tuple(allowed))
    tensors: dict[str, torch.Tensor] = {}

    def tree(x: Any) -> Any:
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, enum.Enum):  # before int: IntEnum members are ints too
            _allow(type(x), names)
            return {"$enum": _name(type(x)), "v": x.name}
        if isinstance(x, int):
            return int(x)
        if isinstance(x, float):
            return x if math.isfinite(x) else {"$float": repr(x)}
        if isinstance(x, torch.Tensor):
            key = str(len(tensors))
            tensors[key] = _standalone(x)
            return {"$t": key}
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            _allow(type(x), names)
            return {"$dc": _name(type(x)),
                    "f": {f.name: tree(getattr(x, f.name)) for f in dataclasses.fields(x) if f.init}}
        if isinstance(x, tuple):
            return {"$tuple": [tree(v) for v in x]}
        if isinstance(x, list):
            return [tree(v) for v in x]
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in x):
                return {k: tree(v) for k, v in x.items()}
            return {"$map": [[tree(k), tree(v)] for k, v in x.items()]}
        if isinstance(x, PurePath):
            return {"$path": str(x)}
        if isinstance(x, bytes):
            return {"$bytes": base64.b64encode(x).decode()}
        raise TypeError(f"codec: cannot encode a {type(x).__name__} (plain data, tensors and allowed dataclasses only)")

    text = json.dumps(tree(obj), separators=(",", ":"), allow_nan=False)
    return tensors, {"format": FORMAT, "tree": text}


def _allow(cls: type, names: dict[str, type]) -> None:
    if _name(cls) not in names:
        raise TypeError(f"codec: {_name(cls)} is not among the allowed types")


def _standalone(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor that owns exactly its storage (safetensors refuses views of shared storage)."""
    t = t.detach().cpu()
    whole = t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    return t if whole else t.contiguous().clone()


def decode(data: bytes, allowed: Iterable[type] = ()) -> Any:
    """The value `encode` wrote, built only from data and the `allowed` types (module docstring)."""
    if len(data) < 8:
        raise DecodeError(f"{len(data)} bytes: too short to be a safetensors object")
    (n,) = struct.unpack("<Q", data[:8])
    meta = _metadata(n, len(data), lambda: bytes(data[8:8 + n]))
    return _decode(meta, lambda: _load_tensors(bytes(data)), allowed)


def read_file(path: Path, allowed: Iterable[type] = ()) -> Any:
    """What `write_file` wrote to `path`, decoded as `decode` does."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise DecodeError(f"{size} bytes: too short to be a safetensors object")
        (n,) = struct.unpack("<Q", head)
        meta = _metadata(n, size, lambda: f.read(n))
    return _decode(meta, lambda: _load_tensor_file(str(path)), allowed)


def _decode(meta: dict[str, str], load_tensors: Callable[[], dict[str, torch.Tensor]], allowed: Iterable[type]) -> Any:
    types = _types(tuple(allowed))
    if meta.get("format") != FORMAT or "tree" not in meta:
        raise DecodeError(f"not a {FORMAT} object (format {str(meta.get('format'))[:40]!r})")
    try:
        tensors = load_tensors()
    except Exception as err:  # safetensors' own parser: any failure means bad bytes, nothing ran
        raise DecodeError(f"unreadable tensors ({type(err).__name__}: {str(err)[:120]})") from None
    try:
        root = json.loads(meta["tree"])
    except (ValueError, RecursionError) as err:
        raise DecodeError(f"unreadable data tree ({type(err).__name__})") from None
    return _build(root, tensors, types, 0)


def _metadata(n: int, size: int, read_header: Callable[[], bytes]) -> dict[str, str]:
    """safetensors' `__metadata__` from a header of `n` bytes in an object of `size` bytes; the
    length is checked before anything is read."""
    if n > min(size - 8, MAX_HEADER_BYTES):
        raise DecodeError(f"header of {n} bytes does not fit in {size} bytes (truncated or not safetensors)")
    try:
        header = json.loads(read_header())
        meta = header.get("__metadata__") if isinstance(header, dict) else None
    except (ValueError, RecursionError):
        raise DecodeError("header is not JSON (not a safetensors object)") from None
    if not isinstance(meta, dict):
        raise DecodeError("no metadata in the safetensors header")
    return meta


def _build(node: Any, tensors: dict[str, torch.Tensor], types: dict[str, type], depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise DecodeError(f"nested deeper than {_MAX_DEPTH}")
    if node is None or isinstance(node, (bool, int, float, str)):
        return node

    def sub(x: Any) -> Any:
        return _build(x, tensors, types, depth + 1)

    if isinstance(node, list):
        return [sub(v) for v in node]
    if not isinstance(node, dict):
        raise DecodeError(f"unexpected JSON value {type(node).__name__}")
    tag = next((k for k in node if k.startswith("$")), None)
    if tag is None:
        return {k: sub(v) for k, v in node.items()}
    body = node[tag]
    try:
        if tag == "$t":
            return tensors[body]
        if tag == "$tuple":
            return tuple(sub(v) for v in _list(body))
        if tag == "$map":
            return {_hashable(sub(k)): sub(v) for k, v in _list(body)}
        if tag == "$float":
            if body not in ("nan", "inf", "-inf"):
                raise DecodeError(f"bad float {str(body)[:20]!r}")
            return float(body)
        if tag == "$path":
            return Path(_str(body))
        if tag == "$bytes":
            return base64.b64decode(_str(body), validate=True)
        if tag == "$enum":
            return _type(types, body, enum.Enum)[_str(node["v"])]
        if tag == "$dc":
            cls = _type(types, body, None)
            if not dataclasses.is_dataclass(cls) or not isinstance(node.get("f"), dict):
                raise DecodeError(f"{str(body)[:80]}: not a dataclass with fields")
            want = {f.name for f in dataclasses.fields(cls) if f.init}
            got = set(node["f"])
            if got != want:
                raise DecodeError(f"{str(body)[:80]}: fields {sorted(got ^ want)[:5]} do not match the class")
            return cls(**{k: sub(v) for k, v in node["f"].items()})
    except DecodeError:
        raise
    except RecursionError:
        raise DecodeError(f"nested deeper than {_MAX_DEPTH}") from None
    except Exception as err:  # a bad key, a constructor's own check: the value is refused, one line
        raise DecodeError(f"bad {tag} value ({type(err).__name__}: {str(err)[:120]})") from None
    raise DecodeError(f"unknown tag {tag[:20]!r}")


def _type(types: dict[str, type], name: Any, base: type | None) -> type:
    cls = types.get(name) if isinstance(name, str) else None
    if cls is None or (base is not None and not issubclass(cls, base)):
        raise DecodeError(f"type {str(name)[:80]!r} is not among the allowed types")
    return cls


def _list(x: Any) -> list:
    if not isinstance(x, list):
        raise DecodeError("expected a list")
    return x


def _str(x: Any) -> str:
    if not isinstance(x, str):
        raise DecodeError("expected a string")
    return x


def _hashable(key: Any) -> Any:
    hash(key)  # a list or dict as a key: TypeError, refused by the caller's handler
    return key
