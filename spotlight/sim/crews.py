"""How long a round of the fleet update takes at the runtime's grain: its `TRAIN` requests served by
the nodes' crews (`schedulers.fleet`), as the pull queue hands them out, and their gradients
crossing the learner's one ingress link as each request completes.

A round is ceil(parts / k) requests of k micro-batches (the last may be shorter:
`schedulers.update.chunks`). A node's idle workers form crews of at most k; a crew of c GPUs
computes a request of n micro-batches in ceil(n / c) micro-batch times (every member computes whole
micro-batches: `spotlight.runtime.rollout_worker.shares`), every GPU at `fleet_update_efficiency`.
The requests go, in order, to whichever crew is free first, the on-demand crews first at the start
(the engine dispatches them first): list scheduling, which is what pulling is — a crew smaller
than k only where the full crews would not clear the waiting requests sooner
(`schedulers.fleet.partial_crew_pays`). Each request's one
gradient then takes the learner's link in the order they complete — alone at one transfer's rate,
behind others at the link's aggregate (`StepTimes.gradient_transfer_s`) — and the learner steps
after the last (`learner_step_s`).

Nothing here is sampled: it prices a round for the simulator's choices (where the update runs) and
for the oracle at the same grain; the simulation itself runs every request through the engine and
the modelled executor (tests/spotlight/runtime/test_node_crews.py checks the two agree on a fleet without preemptions).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from schedulers.fleet import partial_crew_pays
from schedulers.update import chunks


@dataclass(frozen=True)
class CrewNode:
    """A node as a round of the update sees it."""

    gpus: int
    part_s: float
    """Seconds of one micro-batch on one of its GPUs."""
    transfer_s: float = 0.0
    """Seconds of one gradient from it into the learner's node, alone on the link."""
    queued_transfer_s: float = 0.0
    """The same behind others (several transfers at once share the link's aggregate rate)."""


def crew_sizes(devices: int, per_request: int) -> list[int]:
    """The crews a node of `devices` idle GPUs forms: groups of at most `per_request` (`FleetEngine._crews`)."""
    return [min(per_request, devices - i) for i in range(0, devices, max(1, per_request))]


def round_s(parts: int, per_request: int, nodes: Iterable[CrewNode], step_s: float = 0.0) -> float:
    """Seconds from a round's requests being put to the learner having stepped: `parts` micro-batches
    in requests of `per_request`, served by `nodes` (on-demand ones first), each request's gradient
    then through the learner's link, and the step. inf with no GPU at all."""
    free: list[tuple[float, int, int, CrewNode]] = []
    for node in nodes:
        for size in crew_sizes(node.gpus, per_request):
            free.append((0.0, len(free), size, node))
    if not free:
        return float("inf")
    heapq.heapify(free)
    full = sum(1 for _, _, size, _ in free if size == per_request)
    requests = chunks(parts, per_request)
    done: list[tuple[float, CrewNode]] = []
    for i, r in enumerate(requests):
        while True:  # a smaller crew takes one only where no full crew would sooner (the engine's rule)
            t, order, size, node = heapq.heappop(free)
            if size == per_request or partial_crew_pays(size, per_request, len(requests) - i, full):
                break
        t += -(-len(r) // size) * node.part_s
        done.append((t, node))
        heapq.heappush(free, (t, order, size, node))
    link = 0.0
    for t, node in sorted(done, key=lambda d: d[0]):
        link = arrival(link, t, node.transfer_s, node.queued_transfer_s)
    return link + step_s


def arrival(link_free: float, done_at: float, alone_s: float, queued_s: float) -> float:
    """When the gradient of a request done at `done_at` is in at the learner, its ingress busy until
    `link_free`: behind others, `queued_s` after them (the link's aggregate rate); else alone,
    `alone_s` after the request is done (one transfer's rate). The simulation's link
    (`Simulation._done`) and a round's price (`round_s`) alike."""
    return link_free + queued_s if link_free > done_at else done_at + alone_s
