"""A rollout's committed in-flight state, kept in the checkpoint store, so that a controller that
restarts mid-rollout loses nothing a worker committed.

While iteration N's rollout runs, the controller snapshots what the pull queue holds of its
requests (`PullQueue.committed`: the results of finished requests, the last committed (step,
state) of the others) every `cloud.inflight_every_s` seconds into the store:
    inflight/it-NNNNNN.data   the snapshot (`cloud.codec`: tensors and a JSON tree — data, never a pickle)
    inflight/it-NNNNNN.json   its manifest {"step", "size", "sha256"}, written after it
A controller that restarts at iteration N — from the checkpoint after N iterations, pulled from
the same store — finds it: finished requests keep their results, the others are re-queued from
their committed steps. A sample is a function of (weights, prompt, seed) and resumes bit for bit
from a committed step, so the iteration ends exactly as it would have without the restart.

Nothing is taken on trust: a snapshot is used only when its manifest is there (JSON of at most
`MAX_MANIFEST_BYTES`, read by `cloud.store.get_json`), the snapshot is no larger than the
manifest says (a larger one is refused before it is read), its size and SHA-256 match, it
decodes to the allowed types, and each entry is a request of the same id and the same seeds whose
result or state is consistent with them (sizes, steps). Anything else is skipped
with one log line — a snapshot that is not used is only work to redo, never wrong work and never
a failed resume (tests/spotlight/train/test_inflight.py). Snapshots of iterations before the newest stored
checkpoint are deleted.

Size: a snapshot holds every committed trajectory of the iteration so far — a few MB for the tiny
runs, but for Qwen-Image at 1024² about 20 MB per sample (21 latents of ~1 MB), so a full
iteration of 64 groups of 16 is ~20 GB: there, keep the interval long (minutes) or off (0).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import torch

from cloud.codec import DecodeError, decode, encode
from cloud.bounded_json import JsonRefused
from cloud.store import MissingKey, ObjectTooLarge, Store, get_json
from schedulers.sample_state import SampleState
from spotlight.rl.policy import Rollout
from spotlight.rl.prompts import Prompt

logger = logging.getLogger(__name__)

PREFIX = "inflight/"
MAX_MANIFEST_BYTES = 64 * 1024
"""A snapshot's manifest is {"step", "size", "sha256"} in ~120 bytes; 64 KiB is read at most."""
ALLOWED = (Rollout, Prompt, SampleState)
"""What a snapshot may hold besides plain data and tensors."""


def _key(step: int, ext: str) -> str:
    return f"{PREFIX}it-{step:06d}.{ext}"


class InflightStore:
    def __init__(self, store: Store) -> None:
        self.store = store

    def save(self, step: int, seeds: dict[str, tuple[int, ...]], results: dict[str, Any],
             partial: dict[str, tuple[int, Any]]) -> None:
        """Iteration `step`'s committed state: `results` of finished requests, (step, state) of
        the others, and every request's seeds (what an entry is checked against on resume)."""
        data = encode({"step": step, "seeds": seeds, "results": results, "partial": partial}, ALLOWED)
        self.store.put(_key(step, "data"), data)
        manifest = {"step": step, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        self.store.put(_key(step, "json"), json.dumps(manifest).encode())  # last: completes it

    def load(self, step: int, seeds: dict[str, tuple[int, ...]]) -> tuple[dict[str, Any], dict[str, tuple[int, Any]]]:
        """What is stored of iteration `step` for requests with exactly these `seeds`: (results,
        partial states); empty when nothing usable is."""
        try:
            blob = self._read(step)
        except MissingKey:
            return {}, {}
        except _Unusable as err:
            logger.warning(f"in-flight state of iteration {step} in {self.store.uri} not used: {err}")
            return {}, {}
        results, partial, dropped = {}, {}, 0
        for rid, want in seeds.items():
            want = tuple(want)
            if tuple(blob["seeds"].get(rid, ())) != want:
                continue  # not stored, or re-planned with other seeds
            if rid in blob["results"]:
                if _result_fits(blob["results"][rid], want):
                    results[rid] = blob["results"][rid]
                else:
                    dropped += 1
            elif rid in blob["partial"]:
                if _partial_fits(blob["partial"][rid], want):
                    partial[rid] = blob["partial"][rid]
                else:
                    dropped += 1
        if dropped:
            logger.warning(f"in-flight state of iteration {step} in {self.store.uri}: {dropped} entries do not fit "
                           "their requests; those are recomputed")
        return results, partial

    def _read(self, step: int) -> dict[str, Any]:
        """The snapshot of iteration `step`, verified and decoded; MissingKey when there is none."""
        try:
            manifest = get_json(self.store, _key(step, "json"), max_bytes=MAX_MANIFEST_BYTES)
            size, digest = manifest["size"], manifest["sha256"]
            if manifest["step"] != step:
                raise _Unusable("its manifest names another iteration")
            if not (isinstance(size, int) and size >= 0):
                raise TypeError("size is not a count of bytes")
        except ObjectTooLarge:
            raise _Unusable(f"its manifest is over {MAX_MANIFEST_BYTES} bytes (not read)") from None
        except JsonRefused as err:  # nested too deeply (issue 27: a RecursionError before), not JSON
            raise _Unusable(f"unreadable manifest ({err.reason})") from None
        except (ValueError, KeyError, TypeError) as err:
            raise _Unusable(f"unreadable manifest ({type(err).__name__})") from None
        try:
            # The snapshot is read whole to be decoded: it may be ~20 GB (module docstring), so no
            # fixed cap fits; the manifest's size is the bound, and a larger object is not read.
            data = self.store.get(_key(step, "data"), max_bytes=size)
        except MissingKey:
            raise _Unusable("the manifest's snapshot is missing") from None
        except ObjectTooLarge:
            raise _Unusable(f"the snapshot is larger than its manifest's {size} bytes (not read)") from None
        if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
            raise _Unusable(f"{len(data)} bytes that do not match the manifest's size and SHA-256")
        try:
            blob = decode(data, ALLOWED)
        except DecodeError as err:
            raise _Unusable(str(err)) from None
        if not (isinstance(blob, dict) and blob.get("step") == step
                and all(isinstance(blob.get(k), dict) for k in ("seeds", "results", "partial"))):
            raise _Unusable("not a snapshot of this iteration")
        return blob

    def prune(self, before_step: int) -> None:
        """Delete snapshots of iterations before `before_step` (a stored checkpoint is past them)."""
        for key in self.store.list(PREFIX):
            digits = key[len(PREFIX) + 3:].partition(".")[0]
            if key.startswith(PREFIX + "it-") and digits.isdigit() and int(digits) < before_step:
                self.store.delete(key)


class _Unusable(Exception):
    """A stored snapshot that is not used; the message says why."""


def _result_fits(result: Any, seeds: tuple[int, ...]) -> bool:
    """A finished request's result: a Rollout of exactly its seeds, every tensor one row per sample."""
    if not (isinstance(result, Rollout) and tuple(result.seeds) == seeds and len(result.prompts) == len(seeds)):
        return False
    tensors = [result.images] if result.images is not None else []
    tensors += [v for v in result.data.values() if isinstance(v, torch.Tensor)]
    return all(t.ndim > 0 and t.shape[0] == len(seeds) for t in tensors) and (
        result.completions is None or len(result.completions) == len(seeds))


def _partial_fits(entry: Any, seeds: tuple[int, ...]) -> bool:
    """A committed partial state: (step, SampleState of exactly its seeds at that step)."""
    if not (isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], int)):
        return False
    step, state = entry
    return (isinstance(state, SampleState) and state.step == step >= 0 and tuple(state.seeds) == seeds
            and len(state.prompt_ids) == len(seeds)
            and isinstance(state.trajectory, torch.Tensor) and state.trajectory.ndim == 4
            and tuple(state.trajectory.shape[:2]) == (len(seeds), step + 1)
            and isinstance(state.log_probs, torch.Tensor) and state.log_probs.ndim == 2
            and state.log_probs.shape[0] == len(seeds) and state.log_probs.shape[1] <= step)
