"""Checkpoints mirrored to a store (`--checkpoint-uri`), so a run outlives the machine it ran on.

A stored checkpoint of step N is every file the run folder needs to resume at iteration N, each
under `step-N/` at its path in the run folder:
    step-000004/checkpoints/step-000004/{model.safetensors, optimizer.pt, state.json}
    step-000004/explorer/step-000004.json      (when exploration is on)
    step-000004/config.yaml, metrics.jsonl, cost.json, ... (the run's records: `spotlight.train.run_files`)
    step-000004/MANIFEST.json                  {"step": 4, "files": {PATH: {"size", "checksum"}}}

A file's "checksum" is the one the store returned when it stored the file ("crc64nvme:..." on
S3, "crc32c:..." on GCS, "sha256:..." in a folder: `cloud.store`): the store computed it from the
bytes it received, and it verifies a download against it, natively where it can — so no byte is
hashed here, and push and pull read each file once. (A manifest written before checksums, with a
"sha256" per file, is still read: those files are hashed after download.)

Invariants:
- The manifest is written last, after every file it names. A stored checkpoint is complete when
  its manifest parses, names only files a run folder holds (the checkpoint's own, the explorer
  state of that step, files directly in the run folder), every file has the listed size and
  checksum, and the checkpoint verifies as `spotlight.checkpoints.checkpoint` reads it (its own manifest, every
  file decodes — data only, nothing is unpickled); anything else (a push cut short, a truncated,
  altered or planted object) is never resumed from — `pull` logs why and tries the next older one.
- A pull installs into the run folder only verified files, and the checkpoint folder last (by
  rename, as `spotlight.checkpoints.checkpoint` writes its own): an interrupted pull leaves no folder that
  `checkpoint.latest` would take.
- After a push the store keeps the newest `keep` complete checkpoints; an older one loses its
  manifest before its files, so it is never seen half-deleted.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cloud.store import ChecksumMismatch, MissingKey, Store, StoreError, check_key, get_json
from spotlight.checkpoints import checkpoint
from spotlight.train import run_files
from spotlight.checkpoints.checkpoint import sha256_of

logger = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
STEP_DIR = "step-{:06d}"


def step_dir(step: int) -> str:
    return STEP_DIR.format(step)


def checkpoint_files(out: Path, step: int) -> list[str]:
    """The run-folder paths (relative, '/'-separated) that resuming at iteration `step` needs: the
    checkpoint's own files, the explorer state of that step, and the run's records
    (`spotlight.train.run_files`) — each a regular file of this user; nothing else in the folder,
    and no symlink, ever leaves it."""
    folder = out / "checkpoints" / f"{checkpoint.PREFIX}{step:06d}"
    if not folder.is_dir() or folder.is_symlink():
        raise FileNotFoundError(f"{folder}: no checkpoint of iteration {step} to store")
    shards = sorted(p.name for p in folder.iterdir() if checkpoint.SHARD.fullmatch(p.name))  # a learner group's
    own = (*checkpoint.FILES, checkpoint.EMA, *shards, checkpoint.MANIFEST)
    files = [f"{folder.relative_to(out).as_posix()}/{name}" for name in own if run_files.regular(folder / name)]
    if run_files.regular(out / f"explorer/step-{step:06d}.json"):
        files.append(f"explorer/step-{step:06d}.json")
    # The run folder's records go too: config.yaml (the resume key), metrics.jsonl (a summary
    # after a resume elsewhere covers the whole run), cost.json (a budget holds across machines).
    return files + run_files.top_level(out)


def _belongs(rel: str, step: int) -> bool:
    """Whether run-folder path `rel` is one a stored checkpoint of `step` may install."""
    folder = f"checkpoints/{checkpoint.PREFIX}{step:06d}/"
    if rel.startswith(folder):
        return checkpoint.is_checkpoint_file(rel[len(folder):])
    return rel == f"explorer/step-{step:06d}.json" or rel in run_files.RUN_FILES


def _step_of(key: str) -> int | None:
    """N of a stored key `step-NNNNNN/...`, else None."""
    head = key.partition("/")[0]
    digits = head[len("step-"):]
    return int(digits) if head.startswith("step-") and digits.isdigit() else None


def _complete_steps(keys: list[str]) -> list[int]:
    """Steps whose manifest is among `keys`, newest first."""
    return sorted((s for k in keys if k.partition("/")[2] == MANIFEST and (s := _step_of(k)) is not None),
                  reverse=True)


class CheckpointSync:
    """Pushes run-folder checkpoints to `store` and pulls the newest complete one back (see the
    module docstring). It logs one line per push, pull, skip and failure (a skip or failure as a warning)."""

    def __init__(self, store: Store, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"CheckpointSync: keep must be >= 1, got {keep}")
        self.store = store
        self.keep = keep

    # ---- push -----------------------------------------------------------------------------------

    def push(self, out: Path, step: int, must: bool = False) -> dict[str, Any] | None:
        """Store the checkpoint of iteration `step` from run folder `out`, then drop older ones.
        Returns {"files", "bytes", "seconds"}. A store failure (after the store's retries) raises
        StoreError when `must`, else is logged and returns None: the checkpoint stays in the run
        folder, and the next push stores a newer one."""
        start = time.perf_counter()
        try:
            manifest = self._upload(Path(out), step)
            self._prune(step)
        except StoreError as err:
            if must:
                raise
            logger.warning(f"checkpoint {step} not stored ({err}); it is kept in {out}/checkpoints, the next one "
                           "is retried")
            return None
        seconds = time.perf_counter() - start
        size = sum(f["size"] for f in manifest["files"].values())
        logger.info(f"checkpoint {step} stored in {self.store.uri}/{step_dir(step)} "
                    f"({len(manifest['files'])} files, {size / 1e6:.1f} MB, {seconds:.2f} s)")
        return {"files": len(manifest["files"]), "bytes": size, "seconds": seconds}

    def _upload(self, out: Path, step: int) -> dict[str, Any]:
        base = step_dir(step)
        files: dict[str, dict[str, Any]] = {}
        for rel in checkpoint_files(out, step):
            path = out / rel
            size = path.stat().st_size
            files[rel] = {"size": size, "checksum": self.store.put_file(f"{base}/{rel}", path)}
        manifest = {"step": step, "files": files}
        self.store.put(f"{base}/{MANIFEST}", json.dumps(manifest, indent=1).encode())  # last: completes it
        return manifest

    def _prune(self, pushed: int) -> None:
        keys = self.store.list("step-")  # one listing serves every decision below
        complete = _complete_steps(keys)
        drop = set(complete[self.keep:])
        # Leftovers of pushes cut short before their manifest, older than the one just pushed.
        drop |= {s for s in map(_step_of, keys) if s is not None and s < pushed and s not in complete}
        for step in sorted(drop):
            manifest = f"{step_dir(step)}/{MANIFEST}"
            mine = [k for k in keys if _step_of(k) == step]
            if manifest in mine:
                self.store.delete(manifest)
            for key in mine:
                if key != manifest:
                    self.store.delete(key)

    # ---- pull -----------------------------------------------------------------------------------

    def stored(self) -> list[int]:
        """Steps that have a manifest in the store, newest first (not yet verified)."""
        return _complete_steps(self.store.list("step-"))

    def pull(self, out: Path, newer_than: int = 0, accept: Callable[[Path], None] | None = None) -> int | None:
        """Install into run folder `out` the newest complete stored checkpoint of a step above
        `newer_than`; returns its step, or None when there is none. `accept(folder)` sees the
        verified files (run-folder layout) before anything is installed; it raises to refuse them
        (e.g. a config that differs), which ends the pull."""
        out = Path(out)
        for step in self.stored():
            if step <= newer_than:
                break
            staging = out / f".pull-{step_dir(step)}"
            shutil.rmtree(staging, ignore_errors=True)
            try:
                why = self._download(step, staging)
                if why is not None:
                    logger.warning(f"stored checkpoint {self.store.uri}/{step_dir(step)} skipped: {why}")
                    continue
                if accept is not None:
                    accept(staging)
                self._install(staging, out, step)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            return step
        return None

    def _download(self, step: int, staging: Path) -> str | None:
        """Download and verify stored checkpoint `step` into `staging`; None if complete, else why not."""
        base = step_dir(step)
        try:
            manifest = get_json(self.store, f"{base}/{MANIFEST}", max_bytes=checkpoint.MAX_MANIFEST_BYTES)
            files = manifest["files"]
            if manifest["step"] != step or not isinstance(files, dict) or not files:
                return f"{MANIFEST} does not describe iteration {step}"
            for rel, want in files.items():
                check_key(rel)  # a manifest never writes outside the run folder
                if not _belongs(rel, step):
                    return f"{MANIFEST} names {rel[:100]!r}, which no checkpoint of iteration {step} holds"
                if not (isinstance(want, dict) and isinstance(want.get("size"), int)
                        and isinstance(want.get("checksum", want.get("sha256")), str)):
                    return f"{MANIFEST}: entry {rel!r} lacks an integer size and a checksum"
        except MissingKey:
            return f"no {MANIFEST}"
        except (ValueError, KeyError, TypeError) as err:
            return f"unreadable {MANIFEST} ({type(err).__name__}: {err})"
        checkpoint_folder = f"checkpoints/{checkpoint.PREFIX}{step:06d}/"
        if not any(rel.startswith(checkpoint_folder) for rel in files):
            return f"{MANIFEST} names no {checkpoint_folder} files"
        for rel, want in files.items():
            path = staging / rel
            try:
                self.store.get_file(f"{base}/{rel}", path, checksum=want.get("checksum"))
            except MissingKey:
                return f"{rel} is missing"
            except ChecksumMismatch:
                return f"{rel} does not match its checksum in {MANIFEST} (replaced or truncated)"
            size = path.stat().st_size
            if size != want["size"]:
                return f"{rel} has {size} bytes, {MANIFEST} says {want['size']} (truncated?)"
            if "checksum" not in want and sha256_of(path) != want["sha256"]:  # a manifest from before checksums
                return f"{rel} does not match its SHA-256 in {MANIFEST}"
        # The files are what was stored; are they a checkpoint? (hashes were just checked)
        why = checkpoint.verify(checkpoint.Checkpoint(staging / checkpoint_folder, step), hashes=False)
        return None if why is None else f"{checkpoint_folder}: {why}"

    @staticmethod
    def _install(staging: Path, out: Path, step: int) -> None:
        """Move verified files into `out`: everything else first, the checkpoint folder last."""
        folder = Path("checkpoints") / f"{checkpoint.PREFIX}{step:06d}"
        mode = checkpoint.own_mode()
        for path in sorted(p for p in staging.rglob("*") if p.is_file()):
            path.chmod(mode)  # the run's own modes, whatever the object or the download gave it
            rel = path.relative_to(staging)
            if folder not in rel.parents:
                (out / rel).parent.mkdir(parents=True, exist_ok=True)
                path.replace(out / rel)
        target = out / folder
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(target, ignore_errors=True)
        (staging / folder).rename(target)
