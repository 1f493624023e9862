"""The learner's update as the fleet computes it: rounds of gradient requests through the pull queue.

An update is `rounds` optimiser steps (`train.updates_per_step`); each step's gradient is `parts`
micro-batches, in `chunks` of `per_request` consecutive ones (`train.parts_per_request`: k). Round
r puts one `Kind.TRAIN` request per chunk — ceil(parts / k), chunk c covering micro-batches
[c*k, min((c+1)*k, parts)) — and any node holding the weights computes one: a crew of at most k of
its idle workers (`schedulers.fleet`) shares the micro-batches, its lead sums them in index order and
sends that one gradient (round 0 needs the rollout's weights, which every worker holds; a later
round carries the learner's weights after the round before).
When every request of the round is complete, `step(r, ids)` hands their results, in chunk order,
to the learner, which adds them in that order and steps (`spotlight.rl.gradient`: the same tree
as the learner's own update): who computed a chunk never changes the sum. With `add`, each
request's result goes to the learner as soon as the request completes (`add(r, c, id)`), so the
learner folds it (in chunk order: `GradientSum` holds one that came early) while the fleet still
computes the others, and `step` then only takes the last ones and steps: the gather overlaps the
compute instead of following it (docs/simulator.md, "The learner's gather").
A node lost mid-request has the request re-queued whole by the queue like any other; a notice
gives back a request not yet started; nothing here knows about workers.

It is what `FleetEngine.explore` / `wait` take as the update they wait for (a `Pending` with
`kinds`: the request kinds the fleet serves for it), so the train phase is one loop in the engine
whether the update runs on the learner alone (a plain `Pending`) or on the fleet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schedulers.request import GradientWork, Kind, Request


class Done:
    """A step taken at once (in this process), as a `Pending`; `value` is what it returned."""

    deadline = None

    def __init__(self, value: Any) -> None:
        self.value = value

    def done(self) -> bool:
        return True


def chunks(parts: int, per_chunk: int) -> list[range]:
    """`parts` micro-batches in consecutive chunks of `per_chunk` (the last may be shorter):
    [c*k, min((c+1)*k, parts)) for c < ceil(parts / k). The one definition of the update's tree
    (`spotlight.rl.gradient.GradientSum`) and of its requests (`FleetUpdate`)."""
    if parts < 1 or per_chunk < 1:
        raise ValueError(f"chunks need parts >= 1 and per_chunk >= 1, got {parts} and {per_chunk}")
    return [range(start, min(start + per_chunk, parts)) for start in range(0, parts, per_chunk)]


class FleetUpdate:
    kinds = (Kind.TRAIN,)

    def __init__(self, queue: Any, version: int, rounds: int, parts: int, data: Any,
                 step: Callable[[int, list[str]], Any], weights: Callable[[], Any], per_request: int = 1,
                 add: Callable[[int, int, int, str], None] | None = None) -> None:
        """The update of the iteration whose rollout ran at weight `version` (its requests are
        named by it). `data`: the rollout and advantages as the workers resolve them; `step(round, ids)`
        starts the learner's step on the round's results and returns a `Pending`; `weights()`
        the learner's weights after the last step (as the workers resolve them); `per_request`:
        micro-batches summed per request (`train.parts_per_request`); `add(round, chunk, chunks, id)`:
        hands the learner request `id`'s result (chunk `chunk` of the round's `chunks`) as soon as it completes
        (None: `step` gets them all at the end — the simulator, which models the transfers)."""
        if rounds < 1 or parts < 1 or per_request < 1:
            raise ValueError(f"an update needs rounds >= 1, parts >= 1 and per_request >= 1, got {rounds}, "
                             f"{parts} and {per_request}")
        self.queue, self.version = queue, version
        self.rounds, self.parts, self.data = rounds, parts, data
        self.per_request = per_request
        """Micro-batches per request: the most workers of a node that compute one together."""
        self.chunks = chunks(parts, per_request)
        self._step, self._weights, self._add = step, weights, add
        self._added: set[str] = set()
        """This round's requests handed to the learner already (with `add`)."""
        self.round = 0
        self.stepping: Any = None
        self.last_step: Any = None
        """The `Pending` of the last step taken: the runtime reads the update's stats from it."""
        self.finished = False
        self.ids = self._put(None)

    def _put(self, weights: Any) -> list[str]:
        # Named by the chunk's micro-batches: "m3" for one, "m3-5" for three summed.
        requests = [Request(f"it{self.version}/u{self.round}/m{r.start}" + (f"-{r.stop - 1}" if len(r) > 1 else ""),
                            Kind.TRAIN, 0, "", (), self.version, order=c,
                            work=GradientWork(self.round, r.start, self.data, weights, len(r)))
                    for c, r in enumerate(self.chunks)]
        self.queue.put(requests)
        return [r.id for r in requests]

    @property
    def deadline(self) -> float | None:
        """When the learner's step in flight ends, where that is known (a modelled step)."""
        return getattr(self.stepping, "deadline", None)

    @property
    def ref(self) -> Any:
        """What a Ray executor waits on besides its workers: the learner's step in flight."""
        return getattr(self.stepping, "ref", None)

    def done(self) -> bool:
        """Move the update on as far as it can go now; True once the last round has stepped."""
        while not self.finished:
            if self.stepping is None:
                if not self._all_in():
                    return False
                self.stepping = self._step(self.round, self.ids)
            if not self.stepping.done():
                return False
            self.last_step, self.stepping = self.stepping, None
            self.round += 1
            self._added.clear()
            if self.round == self.rounds:
                self.finished = True
            else:
                self.ids = self._put(self._weights())
        return True

    def _all_in(self) -> bool:
        """Whether every request of the round is complete; with `add`, hands the learner each one
        completed since the last look (one queue call either way)."""
        if self._add is None:
            return not self.queue.open(Kind.TRAIN)
        done = self.queue.completed(self.ids)
        if len(done) > len(self._added):
            chunk = {rid: c for c, rid in enumerate(self.ids)}
            for rid in done:
                if rid not in self._added:
                    self._added.add(rid)
                    self._add(self.round, chunk[rid], len(self.ids), rid)
        return len(done) == len(self.ids)
