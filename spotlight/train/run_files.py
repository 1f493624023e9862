"""The files a run folder holds that the run itself wrote: the only ones that ever leave it.

A run folder (`spotlight train --out DIR`) is a place other people and programs can write to as
well: a symlink planted there (`ln -s /etc/shadow DIR/shadow`) or a FIFO must never be read and
sent to a store by a checkpoint or results push, and a pull must never write a file the run
would not have written. So what is pushed and pulled is named here, by the code:
- directly in the run folder: `RUN_FILES`, the run's own records, and nothing else;
- below it: the checkpoint's own files, the explorer state, and the trees tb/, eval/, final/
  (their names are made by the run; walked without following links).

A file qualifies only when it is a regular file — not a symlink, FIFO, socket or device — owned by
the user running Spotlight (`regular`): a file another user planted, even a regular one, stays put.
The store checks again the file it opens (`cloud.store.opened_to_store`: O_NOFOLLOW, then fstat),
so one swapped for a link or FIFO between this listing and the upload is refused, not followed.
Pulled files get the modes the run gives its own files (`spotlight.checkpoints.checkpoint.own_mode`:
0o666 less the umask), never the stored object's or a planted file's. tests/spotlight/train/test_run_files.py checks each of these.
"""

from __future__ import annotations

import os
from pathlib import Path

from cloud.store import own_regular

RUN_FILES = ("config.yaml", "metrics.jsonl", "cost.json", "summary.json")
"""The files the run writes directly in its folder (the resume key, one row per iteration, the
dollars spent across resumes, the summary at the end)."""


def regular(path: Path) -> bool:
    """Whether `path` is a regular file (not followed through a symlink) owned by this user."""
    try:
        return own_regular(os.lstat(path))
    except OSError:
        return False


def top_level(out: Path) -> list[str]:
    """The `RUN_FILES` that are in run folder `out` as regular files of this user."""
    return [name for name in RUN_FILES if regular(out / name)]


def tree(out: Path, folder: str) -> list[str]:
    """Regular files of this user under `out/folder` (relative to `out`, '/'-separated, sorted),
    hidden ones aside; symlinks — to files or folders — are not followed, and `folder` itself must
    be a real folder, not a link to one."""
    root = out / folder
    if not root.is_dir() or root.is_symlink():
        return []
    found = []
    for parent, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            path = Path(parent) / name
            if not name.startswith(".") and regular(path):
                found.append(path.relative_to(out).as_posix())
    return sorted(found)
