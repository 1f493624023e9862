"""Bounded JSON: the one reader for JSON that Spotlight reads back from a disk or a store.

Whoever can write to a run folder or a bucket can plant a file there, and a manifest, a state file
or a fleet record is read on every restart: a planted file must cost one refused read, never a
traceback nor gigabytes. So every read here is bounded, in this order, before `json.loads` runs, by the one bounded reader
`schedulers.input.bounded_read` (which user input files go through too):
- size: at most `max_bytes`. A file must be a regular one (a FIFO, a device or a folder is refused
  before a byte is read), its size is checked first and it is read with at most `max_bytes + 1`
  bytes, so a 400 MB file costs nothing (`read_bounded`); stores bound their reads with
  `Store.get(key, max_bytes)`;
- depth: at most `max_depth` levels of `[` and `{`, counted by a linear scan outside strings that
  never recurses (`depth_over`: json's C scanner recurses once per level and raises RecursionError
  — not a ValueError — past ~1,000 levels, so a 100k-deep file escaped every `except ValueError`:
  issue 27);
- syntax: what `json.loads` accepts (NaN and Infinity included, as Python writes them: metrics
  rows may hold a NaN loss).
Each refusal is a `JsonRefused`, a ValueError, so the `except ValueError` every reader already has
turns it into that reader's documented outcome (a skipped checkpoint, a fresh explorer, ...); its
message is one line: "WHAT: larger than 1 MiB", "WHAT: not a regular file", "WHAT: nested deeper
than 64 levels", "WHAT: not JSON (...)". tests/cloud/test_bounded_json.py checks each, and each reader with a 100k-deep file planted.

User input files (configs, traces) are read by `schedulers.input.files`, with its own messages.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schedulers.input.bounded_read import MAX_DEPTH, NotRegular, TooLarge, depth_over, read_bounded, size_text

__all__ = ["MAX_DEPTH", "JsonRefused", "depth_over", "load_file", "loads", "size_text"]


class JsonRefused(ValueError):
    """JSON read back that is not used: too large, nested too deeply, or not JSON. `str(err)` is one
    line, "WHAT: why"; `reason` is the why alone."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"{what}: {reason}")
        self.what = what
        self.reason = reason


def loads(data: bytes | bytearray | str, *, max_bytes: int, max_depth: int = MAX_DEPTH, what: str = "JSON") -> Any:
    """The JSON value in `data` (UTF-8 bytes or text); `JsonRefused` when it is over `max_bytes`
    bytes, nested deeper than `max_depth` levels, or not JSON. `what` names it in the message."""
    if _over(data, max_bytes):
        raise JsonRefused(what, f"larger than {size_text(max_bytes)}")
    if depth_over(data, max_depth):
        raise JsonRefused(what, f"nested deeper than {max_depth} levels")
    try:
        return json.loads(data)
    except json.JSONDecodeError as err:
        raise JsonRefused(what, f"not JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    except UnicodeDecodeError as err:
        raise JsonRefused(what, f"not JSON (not UTF-8 text: byte {err.start})") from None
    except (ValueError, TypeError) as err:  # an integer over Python's 4,300 digits; bytes of no text at all
        raise JsonRefused(what, f"not JSON ({' '.join(str(err).split())[:100]})") from None
    except RecursionError:  # not expected within `max_depth`; kept so that no input can give a traceback
        raise JsonRefused(what, f"nested deeper than {max_depth} levels") from None


def load_file(path: str | Path, *, max_bytes: int, max_depth: int = MAX_DEPTH, what: str | None = None) -> Any:
    """The JSON value in the regular file `path`, read with at most `max_bytes + 1` bytes (module
    docstring); `what` defaults to the file's name. Anything but a regular file (a folder, a FIFO,
    a device) is a `JsonRefused` too; a missing or unreadable file raises the OSError `open` raises
    (FileNotFoundError for a missing one), for the reader to tell apart from a bad one."""
    path = Path(path)
    what = what or path.name
    try:
        data = read_bounded(path, max_bytes)
    except NotRegular:
        raise JsonRefused(what, "not a regular file") from None
    except TooLarge:
        raise JsonRefused(what, f"larger than {size_text(max_bytes)}") from None
    return loads(data, max_bytes=max_bytes, max_depth=max_depth, what=what)


def _over(data: bytes | bytearray | str, max_bytes: int) -> bool:
    if not isinstance(data, str):
        return len(data) > max_bytes
    if len(data) > max_bytes or len(data) * 4 <= max_bytes:  # UTF-8 takes 1 to 4 bytes a character
        return len(data) > max_bytes
    return len(data.encode("utf-8", "surrogatepass")) > max_bytes
