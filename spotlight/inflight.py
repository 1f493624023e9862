"""A rollout's committed in-flight state, kept in the checkpoint store, so that a controller that
restarts mid-rollout loses nothing a worker committed.

While iteration N's rollout runs, the controller snapshots what the pull queue holds of its
requests (`PullQueue.committed`: the results of finished requests, the last committed (step,
state) of the others) every `cloud.inflight_every_s` seconds into STORE/inflight/it-NNNNNN.pt.
A controller that restarts at iteration N — from the checkpoint after N iterations, pulled from
the same store — finds it: finished requests keep their results, the others are re-queued from
their committed steps. A sample is a function of (weights, prompt, seed) and resumes bit for bit
from a committed step, so the iteration ends exactly as it would have without the restart.

An entry is used only for a request of the same id and the same seeds (the planner re-plans the
same seeds from its saved state, but nothing is taken on trust). A snapshot is one object written
at once (the store's put is atomic), so a reader sees a whole one or none; snapshots of
iterations before the newest stored checkpoint are deleted.

Size: a snapshot holds every committed trajectory of the iteration so far — a few MB for the tiny
runs, but for Qwen-Image at 1024² about 20 MB per sample (21 latents of ~1 MB), so a full
iteration of 64 groups of 16 is ~20 GB: there, keep the interval long (minutes) or off (0).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import torch

from cloud.store import MissingKey, Store

PREFIX = "inflight/"


def _key(step: int) -> str:
    return f"{PREFIX}it-{step:06d}.pt"


class InflightStore:
    def __init__(self, store: Store, log: Callable[[str], None] = print) -> None:
        self.store = store
        self.log = log

    def save(self, step: int, seeds: dict[str, tuple[int, ...]], results: dict[str, Any],
             partial: dict[str, tuple[int, Any]]) -> None:
        """Iteration `step`'s committed state: `results` of finished requests, (step, state) of
        the others, and every request's seeds (what an entry is checked against on resume)."""
        buffer = io.BytesIO()
        torch.save({"step": step, "seeds": seeds, "results": results, "partial": partial}, buffer)
        self.store.put(_key(step), buffer.getvalue())

    def load(self, step: int, seeds: dict[str, tuple[int, ...]]) -> tuple[dict[str, Any], dict[str, tuple[int, Any]]]:
        """What is stored of iteration `step` for requests with exactly these `seeds`: (results,
        partial states); empty when nothing is."""
        try:
            blob = torch.load(io.BytesIO(self.store.get(_key(step))), weights_only=False)
        except MissingKey:
            return {}, {}
        except Exception as err:  # a snapshot that does not load is only lost work, never wrong work
            self.log(f"in-flight state of iteration {step} in {self.store.uri} is unreadable ({err}); not used")
            return {}, {}
        same = {rid for rid, s in blob["seeds"].items() if tuple(seeds.get(rid, ())) == tuple(s)}
        return ({k: v for k, v in blob["results"].items() if k in same},
                {k: v for k, v in blob["partial"].items() if k in same})

    def prune(self, before_step: int) -> None:
        """Delete snapshots of iterations before `before_step` (a stored checkpoint is past them)."""
        for key in self.store.list(PREFIX):
            digits = key[len(PREFIX) + 3:-3]
            if digits.isdigit() and int(digits) < before_step:
                self.store.delete(key)
