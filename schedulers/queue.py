"""The pull queue: rollout and exploration requests handed out to workers that ask for work.

Workers *pull* when idle, so faster or more numerous workers simply take more (docs/design.md, idea 3).
A pulled request is *leased* to its worker until a deadline that heartbeats push back; a worker
commits partial progress with `checkpoint`, hands work back on a preemption notice with
`give_back`, and ends it with `complete`. Work whose worker vanishes without notice comes back by
`worker_lost` or when its lease runs out, and resumes from its last committed state.

Invariants:
- a request is leased to at most one worker at a time (leases are keyed by request id);
- a result is committed exactly once per request id (the first completion wins; later ones are
  rejected and counted, and `requests_duplicated`, computed from the commit log, stays 0);
- a request is never lost: it is always exactly one of queued, leased, completed or cancelled,
  and only `complete` and `cancel` take it out of circulation;
- a worker that holds no lease on a request cannot change its committed state (zombie commits are
  rejected), except that a completion from a former holder is accepted while nobody else has
  completed it: results are deterministic, so a late result is as good as the one being recomputed.

Every method takes one lock: the Ray facade (`queue_actor.py`) may call them concurrently.
"""

from __future__ import annotations

import heapq
import threading
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace
from enum import Enum
from typing import Any, NamedTuple

from schedulers.clock import Clock
from schedulers.request import Kind, Request


_ALL_KINDS = tuple(sorted(Kind, key=lambda k: k.rank))
_RELEASED = object()
"""What a released result (`PullQueue.release`, `results(..., release=True)`) is replaced with."""


class Status(Enum):
    """Where a request is in its life. Transitions (anything else is impossible):

    =========  ===========================================================  =========
    from       event                                                        to
    =========  ===========================================================  =========
    (put)      put                                                          QUEUED
    QUEUED     pull                                                         LEASED
    LEASED     give_back, worker_lost, forget_worker, lease expiry          QUEUED
    LEASED     checkpoint, heartbeat                                        LEASED
    QUEUED     complete by a former holder (its lease had expired)          COMPLETED
    LEASED     complete by the holder or a former holder                    COMPLETED
    QUEUED     cancel                                                       CANCELLED
    LEASED     cancel                                                       CANCELLED
    =========  ===========================================================  =========
    """

    QUEUED = "queued"
    LEASED = "leased"
    COMPLETED = "completed"
    CANCELLED = "cancelled"


class Lease(NamedTuple):
    """`request` (with its last committed state and step) is `worker`'s to compute until `deadline`
    (clock seconds), unless a heartbeat renews it first. (A named tuple, not a frozen dataclass:
    one is made per pull, and the simulator pulls millions of times.)"""

    request: Request
    worker: str
    deadline: float


def _by_rank(kinds: Collection[Kind]) -> Collection[Kind]:
    if len(kinds) == 1:
        return kinds
    key = tuple(kinds)
    ranked = _RANKED.get(key)
    if ranked is None:  # a handful of distinct kind sets, each pulled a million times in a simulation
        ranked = _RANKED[key] = tuple(sorted(set(kinds), key=lambda k: k.rank))
    return ranked


_RANKED: dict[tuple[Kind, ...], tuple[Kind, ...]] = {}


class PullQueue:
    """Requests served by priority (`Request.priority`, then put order), leased for `lease_s`."""

    def __init__(self, clock: Clock, lease_s: float = 30.0) -> None:
        if lease_s <= 0:
            raise ValueError(f"lease_s must be > 0 seconds, got {lease_s}")
        self._clock = clock
        self._lease_s = lease_s
        self._lock = threading.Lock()
        self._by_worker: Counter[tuple[str, Kind]] = Counter()
        self._requests: dict[str, Request] = {}
        """Every request put, carrying its last committed state and step."""
        self._status: dict[str, Status] = {}
        self._seq: dict[str, int] = {}
        """Put order: the tie-break after priority, kept when a request is re-queued."""
        self._open: dict[Kind, dict[str, None]] = {kind: {} for kind in Kind}
        """Per kind, the ids QUEUED or LEASED (an insertion-ordered set): what `cancel` visits, so
        it costs the open requests, not every request a long run has put."""
        self._queued: Counter[Kind] = Counter()
        """Per kind, how many requests are QUEUED (what `queued` answers without a scan)."""
        self._heaps: dict[Kind, list[tuple[int, int, str]]] = {kind: [] for kind in Kind}
        """Per kind, (order, put seq, id). Entries of requests no longer QUEUED are dropped when
        they surface (a former holder may complete a queued request)."""
        self._leases: OrderedDict[str, Lease] = OrderedDict()
        """By request id, in deadline order: lease_s is fixed and the clock never goes back, so
        the order leases were granted or renewed in is the order they expire in."""
        self._held: dict[str, dict[str, None]] = {}
        """Worker -> ids it leases (an insertion-ordered set, so re-queues are deterministic)."""
        self._holders: dict[str, set[str]] = {}
        """Request id -> every worker that has leased it: who may still complete it."""
        self._progress: dict[str, int] = {}
        """Request id -> the step its current holder last reported by heartbeat."""
        self._notices: dict[str, Any] = {}
        self._log: list[tuple[str, Any]] = []
        """Append-only commit log of (request id, result): where results are stored."""
        self._done: dict[str, int] = {}
        """Request id -> its position in the commit log."""
        self._results_held = 0
        """Results in the commit log not released yet: what the queue's memory grows with."""
        self._counts: Counter[str] = Counter()
        self._expired_at: float | None = None
        """The clock time of the last full expiry check: until the clock moves nothing more can
        expire (every lease granted or renewed since ends after it). The simulator makes millions
        of queue calls at a few hundred thousand distinct times."""

    def put(self, requests: Request | Iterable[Request]) -> None:
        """Queue new requests; nothing is queued if any id was put before (or twice here)."""
        batch = [requests] if isinstance(requests, Request) else list(requests)
        with self._lock:
            seen: set[str] = set()
            for r in batch:
                if r.id in self._requests or r.id in seen:
                    raise ValueError(f"request id {r.id!r} was already put; ids must be unique")
                seen.add(r.id)
            for r in batch:
                self._requests[r.id] = r
                self._seq[r.id] = len(self._seq)
                self._holders[r.id] = set()
                self._enqueue(r.id)
            self._counts["requests_put"] += len(batch)

    def pull(self, worker: str, max_requests: int = 1, kinds: Collection[Kind] | None = None,
             weight_version: int | None = None) -> list[Lease]:
        """Lease up to `max_requests` of the best queued requests (of `kinds`, default all; of
        `weight_version` only, when given: a worker computes nothing with weights other than the
        ones a request names) to `worker`; nothing for a worker with a pending preemption notice.
        Exploration fills what is left: a pull that does not take gradient work (`Kind.TRAIN`, which
        a node's crew serves: `schedulers.fleet`) gets no exploration while gradient work is queued,
        so its worker comes back idle and joins its node's crew (tests/spotlight/runtime/test_node_crews.py)."""
        if max_requests < 1:
            raise ValueError(f"max_requests must be >= 1, got {max_requests}")
        with self._lock:
            self._expire()
            if worker in self._notices:
                return []
            deadline = self._clock.now() + self._lease_s
            leases: list[Lease] = []
            yields = kinds is not None and Kind.TRAIN not in kinds and self._queued[Kind.TRAIN] > 0
            for kind in _ALL_KINDS if kinds is None else _by_rank(kinds):
                if yields and kind is Kind.EXPLORATION:
                    continue
                heap = self._heaps[kind]
                skipped: list[tuple[int, int, str]] = []
                while heap and len(leases) < max_requests:
                    entry = heapq.heappop(heap)
                    request_id = entry[2]
                    if self._status[request_id] is not Status.QUEUED:
                        continue
                    if weight_version is not None and self._requests[request_id].weight_version != weight_version:
                        skipped.append(entry)
                        continue
                    lease = Lease(self._requests[request_id], worker, deadline)
                    self._leases[request_id] = lease
                    self._held.setdefault(worker, {})[request_id] = None
                    self._holders[request_id].add(worker)
                    self._status[request_id] = Status.LEASED
                    self._queued[kind] -= 1
                    self._counts["requests_resumed"] += int(lease.request.step > 0)
                    self._counts["steps_resumed"] += lease.request.step
                    leases.append(lease)
                for entry in skipped:
                    heapq.heappush(heap, entry)
            return leases

    def heartbeat(self, worker: str, progress: Mapping[str, int] | None = None,
                  report_cancelled: bool = False) -> Any:
        """Renew every lease `worker` holds and remember the step it reached on each
        (`progress`: request id -> step); returns its pending preemption notice, if any. With
        `report_cancelled`, returns (notice, ids in `progress` that were cancelled), so a worker
        stops computing work nobody wants any more."""
        with self._lock:
            self._expire()
            deadline = self._clock.now() + self._lease_s
            for request_id in self._held.get(worker, {}):
                self._leases[request_id] = self._leases[request_id]._replace(deadline=deadline)
                self._leases.move_to_end(request_id)
                if progress is not None and request_id in progress:
                    self._progress[request_id] = progress[request_id]
            notice = self._notices.get(worker)
            if not report_cancelled:
                return notice
            cancelled = [r for r in progress or () if self._status.get(r) is Status.CANCELLED]
            return notice, cancelled

    def checkpoint(self, worker: str, request_id: str, state: Any, step: int) -> bool:
        """Commit `worker`'s partial progress on a request it keeps computing; False (nothing
        changes) unless `worker` holds the lease."""
        with self._lock:
            self._expire()
            if not self._holds(worker, request_id):
                return False
            self._requests[request_id] = replace(self._requests[request_id], state=state, step=step)
            self._counts["checkpoints"] += 1
            return True

    def give_back(self, worker: str, request_id: str, state: Any, step: int) -> bool:
        """Commit partial progress and return the request to the queue (on a preemption notice);
        False (nothing changes) unless `worker` holds the lease."""
        with self._lock:
            self._expire()
            if not self._holds(worker, request_id):
                return False
            self._requests[request_id] = replace(self._requests[request_id], state=state, step=step)
            self._requeue(request_id, in_flight=False)
            self._counts["requests_given_back"] += 1
            return True

    def complete(self, worker: str, request_id: str, result: Any) -> bool:
        """Commit the result of a request; True if this commit is the one that counts.

        Rejected: a request already completed (`duplicate_commits_rejected`), or cancelled, or
        completed by a worker that never leased it (`stale_commits_rejected`)."""
        with self._lock:
            self._expire()
            status = self._status_of(request_id)
            if status is Status.COMPLETED:
                self._counts["duplicate_commits_rejected"] += 1
                return False
            if status is Status.CANCELLED or worker not in self._holders[request_id]:
                self._counts["stale_commits_rejected"] += 1
                return False
            if status is Status.LEASED:
                self._release(request_id)  # the holder's lease, possibly another worker's
            else:
                self._queued[self._requests[request_id].kind] -= 1
            self._done[request_id] = len(self._log)
            self._log.append((request_id, result))
            self._results_held += 1
            self._drop_state(request_id)  # the result supersedes the partial state
            self._by_worker[worker, self._requests[request_id].kind] += 1
            self._status[request_id] = Status.COMPLETED
            del self._open[self._requests[request_id].kind][request_id]
            self._counts["requests_completed"] += 1
            return True

    def worker_lost(self, worker: str) -> list[str]:
        """`worker` died without notice: re-queue what it leased from the last committed state
        and step; returns the re-queued ids."""
        with self._lock:
            self._expire()
            return self._requeue_worker(worker)

    def notify(self, worker: str, notice: Any) -> None:
        """Post a preemption notice for `worker`: it gets no more work, and its next heartbeat
        returns `notice` so it can give back what it holds."""
        with self._lock:
            self._notices[worker] = notice

    def forget_worker(self, worker: str) -> list[str]:
        """Clear `worker`'s notice before its name is reused by a new worker; whatever the old one
        still leased is re-queued as if it were lost (the new one never heard of it). Returns the
        re-queued ids."""
        with self._lock:
            self._notices.pop(worker, None)
            return self._requeue_worker(worker)

    def cancel(self, kind: Kind) -> int:
        """Cancel every queued or leased request of `kind` (exploration, when the train phase it
        filled ends); later commits on them are rejected. Returns how many were cancelled."""
        with self._lock:
            cancelled = len(self._open[kind])
            for request_id in self._open[kind]:
                if self._status[request_id] is Status.LEASED:
                    self._release(request_id)
                self._status[request_id] = Status.CANCELLED
                self._drop_state(request_id)
            self._open[kind].clear()
            self._heaps[kind].clear()  # every request of this kind that was queued is now cancelled
            self._queued[kind] = 0
            self._counts["requests_cancelled"] += cancelled
            return cancelled

    def status(self, request_id: str) -> Status:
        with self._lock:
            return self._status_of(request_id)

    def result(self, request_id: str) -> Any:
        """The committed result; KeyError if the request is not completed."""
        with self._lock:
            return self._result(request_id)

    def results(self, ids: Iterable[str], release: bool = False) -> list[Any]:
        """Committed results in the order of `ids`; KeyError if any is not completed. With
        `release`, they are read once and released (`release`): an update's gradients, an
        exploration round's samples."""
        with self._lock:
            ids = list(ids)
            out = [self._result(request_id) for request_id in ids]
            if release:
                for request_id in ids:
                    self._forget(request_id)
            return out

    def release(self, ids: Iterable[str]) -> int:
        """Keep the committed results of `ids` no longer: they stay completed, and reading one
        again is a KeyError. A run releases each iteration's rollout once its update has used
        it; results are whole trajectories (a Qwen-Image sample's is ~20 MB), and a queue that
        kept every iteration's would grow until its process ran out of memory. Ids that are not
        completed, or that this queue never had (results restored from an in-flight store), are
        skipped. Returns how many were released."""
        with self._lock:
            return sum(self._forget(request_id) for request_id in ids)

    def committed(self, ids: Iterable[str]) -> tuple[dict[str, Any], dict[str, tuple[int, Any]]]:
        """What is committed of requests `ids`: (results of the completed ones, {id: (step, state)}
        of the others that have committed a step). A controller that restarts seeds the same
        requests with these and loses nothing committed (`spotlight.train.inflight`)."""
        with self._lock:
            results, partial = {}, {}
            for request_id in ids:
                status = self._status_of(request_id)
                if status is Status.COMPLETED:
                    results[request_id] = self._result(request_id)
                elif status is not Status.CANCELLED and self._requests[request_id].step > 0:
                    r = self._requests[request_id]
                    partial[request_id] = (r.step, r.state)
            return results, partial

    def open(self, kind: Kind) -> int:
        """How many requests of `kind` are queued or leased (neither completed nor cancelled)."""
        with self._lock:
            self._expire()
            return len(self._open[kind])

    def held(self, kind: Kind | None = None) -> dict[str, list[str]]:
        """Worker -> the ids of the requests (of `kind`, default all) it holds a lease on now."""
        with self._lock:
            self._expire()
            out = {w: [r for r in ids if kind is None or self._requests[r].kind is kind] for w, ids in self._held.items()}
            return {w: ids for w, ids in out.items() if ids}

    def queued(self, kinds: Collection[Kind] | None = None) -> int:
        """How many requests of `kinds` (default all) wait to be pulled (leases that ran out
        included); counted, not scanned."""
        with self._lock:
            self._expire()
            q = self._queued
            if kinds is None:  # (no generator over `Kind`: the simulator asks this about once a request)
                return sum(q.values())
            if len(kinds) == 1:
                for k in kinds:
                    return q[k]
            return sum(q[k] for k in kinds)

    def completed(self, ids: Iterable[str]) -> list[str]:
        """Those of `ids` that are completed, in the order given."""
        with self._lock:
            return [i for i in ids if self._status_of(i) is Status.COMPLETED]

    def pending(self, ids: Iterable[str] | None = None) -> int:
        """How many of `ids` (default: all requests put) are neither completed nor cancelled."""
        with self._lock:
            self._expire()
            statuses = self._status.values() if ids is None else [self._status_of(i) for i in ids]
            return sum(s in (Status.QUEUED, Status.LEASED) for s in statuses)

    def is_done(self, ids: Iterable[str]) -> bool:
        """True when every one of `ids` is completed or cancelled."""
        return self.pending(ids) == 0

    def completions_by_worker(self, kind: Kind | None = None) -> dict[str, int]:
        """How many requests (of `kind`; default all) each worker committed (the commit that
        counted), since construction."""
        with self._lock:
            out: Counter[str] = Counter()
            for (worker, k), n in self._by_worker.items():
                if kind is None or k is kind:
                    out[worker] += n
            return dict(out)

    def stats(self) -> dict[str, int]:
        """Counters since construction and the current queue sizes.

        requests_requeued counts requests re-queued by `worker_lost`/`forget_worker`, leases_expired
        those re-queued by a lease running out; steps_recomputed sums, over both, the steps a
        holder had reported beyond the committed step plus the one it was computing (work that
        must be done again; steps_recomputed_given_back is the part of it from requests given back on
        a notice); steps_resumed
        sums the committed steps requests were resumed from (work a restart from step 0 would redo)."""
        with self._lock:
            self._expire()
            statuses = Counter(self._status.values())
            per_id = Counter(request_id for request_id, _ in self._log)
            names = ("requests_put", "requests_completed", "requests_resumed", "requests_given_back",
                     "requests_requeued", "leases_expired", "duplicate_commits_rejected",
                     "stale_commits_rejected", "requests_cancelled", "steps_recomputed",
                     "steps_recomputed_given_back", "steps_resumed", "checkpoints")
            return {
                **{name: self._counts[name] for name in names},
                "requests_duplicated": sum(n > 1 for n in per_id.values()),
                "queued": statuses[Status.QUEUED],
                "leased": statuses[Status.LEASED],
                "results_held": self._results_held,
            }

    # Internals: called with the lock held.

    def _status_of(self, request_id: str) -> Status:
        try:
            return self._status[request_id]
        except KeyError:
            raise KeyError(f"no request with id {request_id!r} was put") from None

    def _result(self, request_id: str) -> Any:
        if request_id not in self._done:
            raise KeyError(f"request {request_id!r} is {self._status_of(request_id).value}, not completed")
        result = self._log[self._done[request_id]][1]
        if result is _RELEASED:
            raise KeyError(f"request {request_id!r}'s result was released after it was read")
        return result

    def _forget(self, request_id: str) -> bool:
        at = self._done.get(request_id)
        if at is None or self._log[at][1] is _RELEASED:
            return False
        self._log[at] = (request_id, _RELEASED)
        self._results_held -= 1
        return True

    def _drop_state(self, request_id: str) -> None:
        """The request's committed partial state is of no more use (completed or cancelled)."""
        r = self._requests[request_id]
        if r.state is not None:
            self._requests[request_id] = replace(r, state=None)

    def _holds(self, worker: str, request_id: str) -> bool:
        self._status_of(request_id)  # an unknown id is a caller bug, not a stale worker
        lease = self._leases.get(request_id)
        return lease is not None and lease.worker == worker

    def _enqueue(self, request_id: str) -> None:
        r = self._requests[request_id]
        heapq.heappush(self._heaps[r.kind], (r.order, self._seq[request_id], request_id))
        self._status[request_id] = Status.QUEUED
        self._queued[r.kind] += 1
        self._open[r.kind][request_id] = None

    def _release(self, request_id: str) -> None:
        lease = self._leases.pop(request_id)
        del self._held[lease.worker][request_id]
        self._progress.pop(request_id, None)

    def _requeue(self, request_id: str, in_flight: bool = True) -> None:
        """Return a leased request to the queue at its committed step. The steps its holder had
        reported beyond that step will be computed again — and, for a holder that died or went
        silent (`in_flight`), the step it was computing after its last report too. A holder that
        gives a request back (on a notice) stops at a step boundary: nothing is in flight."""
        reached = self._progress.get(request_id)
        if reached is not None:
            lost = max(0, reached - self._requests[request_id].step) + in_flight
            self._counts["steps_recomputed"] += lost
            if not in_flight:
                self._counts["steps_recomputed_given_back"] += lost
        self._release(request_id)
        self._enqueue(request_id)

    def _requeue_worker(self, worker: str) -> list[str]:
        ids = list(self._held.get(worker, {}))
        for request_id in ids:
            self._requeue(request_id)
        self._held.pop(worker, None)
        self._counts["requests_requeued"] += len(ids)
        return ids

    def _expire(self) -> None:
        now = self._clock.now()
        if now == self._expired_at:
            return
        self._expired_at = now
        while self._leases:
            request_id, lease = next(iter(self._leases.items()))
            if lease.deadline >= now:
                break
            self._requeue(request_id)
            self._counts["leases_expired"] += 1
