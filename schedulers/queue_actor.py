"""The pull queue as a Ray actor: a thin facade over `PullQueue` on the wall clock, in the manner of
`ray.util.queue.Queue` over its `_QueueActor`. All logic, and its tests, live in `queue.py`; this
only forwards calls, so the actor keeps every invariant the plain class keeps.

    queue = QueueActor.remote(lease_s=30.0)
    leases = ray.get(queue.pull.remote("worker-0", max_requests=8))
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

import ray

from schedulers.clock import WallClock
from schedulers.queue import Lease, PullQueue, Status
from schedulers.request import Kind, Request


class _QueueActor:
    def __init__(self, lease_s: float = 30.0) -> None:
        self._queue = PullQueue(WallClock(), lease_s)

    def put(self, requests: Request | Iterable[Request]) -> None:
        self._queue.put(requests)

    def pull(self, worker: str, max_requests: int = 1, kinds: Collection[Kind] | None = None,
             weight_version: int | None = None) -> list[Lease]:
        return self._queue.pull(worker, max_requests, kinds, weight_version)

    def heartbeat(self, worker: str, progress: Mapping[str, int] | None = None,
                  report_cancelled: bool = False) -> Any:
        return self._queue.heartbeat(worker, progress, report_cancelled)

    def checkpoint(self, worker: str, request_id: str, state: Any, step: int) -> bool:
        return self._queue.checkpoint(worker, request_id, state, step)

    def give_back(self, worker: str, request_id: str, state: Any, step: int) -> bool:
        return self._queue.give_back(worker, request_id, state, step)

    def complete(self, worker: str, request_id: str, result: Any) -> bool:
        return self._queue.complete(worker, request_id, result)

    def worker_lost(self, worker: str) -> list[str]:
        return self._queue.worker_lost(worker)

    def notify(self, worker: str, notice: Any) -> None:
        self._queue.notify(worker, notice)

    def forget_worker(self, worker: str) -> list[str]:
        return self._queue.forget_worker(worker)

    def cancel(self, kind: Kind) -> int:
        return self._queue.cancel(kind)

    def status(self, request_id: str) -> Status:
        return self._queue.status(request_id)

    def result(self, request_id: str) -> Any:
        return self._queue.result(request_id)

    def results(self, ids: Iterable[str], release: bool = False) -> list[Any]:
        return self._queue.results(ids, release)

    def release(self, ids: Iterable[str]) -> int:
        return self._queue.release(ids)

    def committed(self, ids: Iterable[str]) -> tuple[dict[str, Any], dict[str, tuple[int, Any]]]:
        return self._queue.committed(ids)

    def completed(self, ids: Iterable[str]) -> list[str]:
        return self._queue.completed(ids)

    def open(self, kind: Kind) -> int:
        return self._queue.open(kind)

    def queued(self, kinds: Collection[Kind] | None = None) -> int:
        return self._queue.queued(kinds)

    def pending(self, ids: Iterable[str] | None = None) -> int:
        return self._queue.pending(ids)

    def is_done(self, ids: Iterable[str]) -> bool:
        return self._queue.is_done(ids)

    def stats(self) -> dict[str, int]:
        return self._queue.stats()

    def completions_by_worker(self, kind: Kind | None = None) -> dict[str, int]:
        return self._queue.completions_by_worker(kind)

    def held(self, kind: Kind | None = None) -> dict[str, list[str]]:
        return self._queue.held(kind)


# num_cpus=0: the queue is bookkeeping (well under a millisecond a call), so it should not take a
# CPU slot that a rollout worker could use. Ray's default of one call at a time suffices, as each
# call returns at once; PullQueue's lock would make a threaded actor (max_concurrency > 1) safe too.
QueueActor = ray.remote(num_cpus=0)(_QueueActor)


class QueueClient:
    """Synchronous calls to a `QueueActor`, with `PullQueue`'s method names: what a `RolloutWorker`
    inside an actor is handed as its queue, and what the fleet engine drives it with."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def pull(self, worker: str, max_requests: int = 1, kinds: Collection[Kind] | None = None,
             weight_version: int | None = None) -> list[Lease]:
        return ray.get(self.handle.pull.remote(worker, max_requests, kinds, weight_version))

    def heartbeat(self, worker: str, progress: dict[str, int] | None = None, report_cancelled: bool = False) -> Any:
        return ray.get(self.handle.heartbeat.remote(worker, progress, report_cancelled))

    def checkpoint(self, worker: str, request_id: str, state: Any, step: int) -> bool:
        return ray.get(self.handle.checkpoint.remote(worker, request_id, state, step))

    def give_back(self, worker: str, request_id: str, state: Any, step: int) -> bool:
        return ray.get(self.handle.give_back.remote(worker, request_id, state, step))

    def complete(self, worker: str, request_id: str, result: Any) -> bool:
        return ray.get(self.handle.complete.remote(worker, request_id, result))

    # ---- what the fleet engine asks (`schedulers.fleet.Queue`) ----------------------------------

    def put(self, requests: Request | Iterable[Request]) -> None:
        ray.get(self.handle.put.remote(requests))

    def is_done(self, ids: Iterable[str]) -> bool:
        return ray.get(self.handle.is_done.remote(ids))

    def worker_lost(self, worker: str) -> list[str]:
        return ray.get(self.handle.worker_lost.remote(worker))

    def notify(self, worker: str, notice: Any) -> None:
        ray.get(self.handle.notify.remote(worker, notice))

    def cancel(self, kind: Kind) -> int:
        return ray.get(self.handle.cancel.remote(kind))

    def committed(self, ids: Iterable[str]) -> tuple[dict[str, Any], dict[str, tuple[int, Any]]]:
        return ray.get(self.handle.committed.remote(ids))

    def completed(self, ids: Iterable[str]) -> list[str]:
        return ray.get(self.handle.completed.remote(ids))

    def open(self, kind: Kind) -> int:
        return ray.get(self.handle.open.remote(kind))

    def queued(self, kinds: Collection[Kind] | None = None) -> int:
        return ray.get(self.handle.queued.remote(kinds))

    def results(self, ids: Iterable[str], release: bool = False) -> list[Any]:
        return ray.get(self.handle.results.remote(ids, release))

    def release(self, ids: Iterable[str]) -> int:
        return ray.get(self.handle.release.remote(list(ids)))

    def stats(self) -> dict[str, int]:
        return ray.get(self.handle.stats.remote())

    def completions_by_worker(self, kind: Kind | None = None) -> dict[str, int]:
        return ray.get(self.handle.completions_by_worker.remote(kind))

    def held(self, kind: Kind | None = None) -> dict[str, list[str]]:
        return ray.get(self.handle.held.remote(kind))
