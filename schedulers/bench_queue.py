"""Pull-queue overhead on this machine: how many pull + complete round trips per second the queue
serves, so it can be set against the seconds a request takes to compute.

One op = one request pulled and its result completed. Measured in-process (`PullQueue`), and
through the Ray actor from the driver: one `ray.get` per call (2 per op), and batched (one pull of 8
requests, then their 8 completions awaited together: 2 waits per 8 ops). Ratios are to the
in-process figure and of batched to sequential.

    python -m schedulers.bench_queue
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable

# The benchmark's own one-node cluster runs without Ray's token auth, said explicitly: left unset,
# `ray.init` turns it on and writes ~/.ray/auth_token, which later `ray start`s then pick up. Before
# `import ray`, which reads it once.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402

from schedulers.clock import WallClock
from schedulers.queue import PullQueue
from schedulers.queue_actor import QueueActor
from schedulers.request import Kind, Request

_BATCH = 8


def _requests(n: int) -> list[Request]:
    return [Request(f"bench/{i}", Kind.ROLLOUT, i, "", (i,), 0, order=i) for i in range(n)]


def _ops_per_s(ops: int, drain: Callable[[], None]) -> float:
    start = time.perf_counter()
    drain()
    return ops / (time.perf_counter() - start)


def run_queue_bench(ops: int = 2000) -> dict[str, float | str]:
    """Pull + complete round trips per second, in-process and through the Ray actor. Starts Ray
    (and shuts it down after) unless it is already running."""
    if ops < 1:
        raise ValueError(f"ops must be >= 1, got {ops}")

    queue = PullQueue(WallClock())
    queue.put(_requests(ops))

    def drain_local() -> None:
        while leases := queue.pull("w"):
            queue.complete("w", leases[0].request.id, leases[0].request.seeds)

    local = _ops_per_s(ops, drain_local)

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        seq_actor = QueueActor.remote()
        batch_actor = QueueActor.remote()
        # Putting (and a first call) outside the timed part: actor start-up is not queue overhead.
        ray.get([seq_actor.put.remote(_requests(ops)), batch_actor.put.remote(_requests(ops))])

        def drain_sequential() -> None:
            while leases := ray.get(seq_actor.pull.remote("w")):
                ray.get(seq_actor.complete.remote("w", leases[0].request.id, leases[0].request.seeds))

        def drain_batched() -> None:
            while leases := ray.get(batch_actor.pull.remote("w", max_requests=_BATCH)):
                ray.get([batch_actor.complete.remote("w", lease.request.id, lease.request.seeds) for lease in leases])

        sequential = _ops_per_s(ops, drain_sequential)
        batched = _ops_per_s(ops, drain_batched)
        for actor in (seq_actor, batch_actor):
            if ray.get(actor.pending.remote()) != 0:
                raise RuntimeError("the queue benchmark left requests undone")
            ray.kill(actor)
    finally:
        if started:
            ray.shutdown()
    return {
        "machine": f"{platform.platform()}, {os.cpu_count()} cores, "
                   f"python {platform.python_version()}, ray {ray.__version__}",
        "ops": float(ops),
        "local_ops_per_s": local,
        "ray_sequential_ops_per_s": sequential,
        f"ray_batched{_BATCH}_ops_per_s": batched,
        "local_vs_ray_sequential": local / sequential,
        "local_vs_ray_batched": local / batched,
        "ray_batched_vs_sequential": batched / sequential,
    }


if __name__ == "__main__":
    print(json.dumps(run_queue_bench(), indent=2))
