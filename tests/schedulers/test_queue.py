"""The pull queue's contract, run unchanged against `PullQueue` and against its Ray actor; tests that
move time use a `ManualClock` and so only the plain class."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import ray

from schedulers.bench_queue import run_queue_bench
from schedulers.clock import ManualClock
from schedulers.queue import PullQueue, Status
from schedulers.queue_actor import QueueActor
from schedulers.request import Kind, Request

LEASE_S = 30.0


def req(request_id: str, kind: Kind = Kind.ROLLOUT, order: int = 0) -> Request:
    return Request(request_id, kind, prompt_id=0, prompt_text="a cat", seeds=(1, 2), weight_version=0, order=order)


class _SyncActor:
    """Calls the actor the way the plain class is called: `ray.get(actor.<method>.remote(...))`.
    (A test adapter, so forwarding every name generically is fine here; the product facade is
    explicit.)"""

    def __init__(self, actor: Any) -> None:
        self._actor = actor

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._actor, name)
        return lambda *args, **kwargs: ray.get(method.remote(*args, **kwargs))


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(params=["plain", "ray"])
def queue(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "plain":
        yield PullQueue(ManualClock(), LEASE_S)
        return
    request.getfixturevalue("ray_session")
    actor = QueueActor.remote(lease_s=3600.0)  # on the wall clock: no lease may run out mid-test
    yield _SyncActor(actor)
    ray.kill(actor)


# The contract: both implementations.

def test_serves_rollout_before_exploration_then_by_order_then_put_order(queue: Any) -> None:
    queue.put([req("e0", Kind.EXPLORATION), req("b", order=1), req("a", order=0), req("c", order=1)])
    assert [lease.request.id for lease in queue.pull("w1", max_requests=3)] == ["a", "b", "c"]
    assert [lease.request.id for lease in queue.pull("w1", max_requests=3)] == ["e0"]
    queue.put([req("r"), req("e1", Kind.EXPLORATION)])
    assert [lease.request.id for lease in queue.pull("w2", kinds={Kind.EXPLORATION})] == ["e1"]


def test_held_says_which_worker_holds_which_requests_now(queue: Any) -> None:
    queue.put([req("a"), req("b"), req("e", Kind.EXPLORATION)])
    queue.pull("w1", max_requests=2)
    queue.pull("w2", kinds={Kind.EXPLORATION})
    assert queue.held() == {"w1": ["a", "b"], "w2": ["e"]}
    assert queue.held(Kind.EXPLORATION) == {"w2": ["e"]}
    queue.complete("w1", "a", 1)
    queue.worker_lost("w2")
    assert queue.held() == {"w1": ["b"]} and queue.held(Kind.TRAIN) == {}


def test_a_request_is_leased_to_one_worker_at_a_time(queue: Any) -> None:
    queue.put(req("a"))
    (lease,) = queue.pull("w1", max_requests=4)
    assert (lease.request.id, lease.worker) == ("a", "w1")
    assert queue.pull("w2") == []
    assert not queue.checkpoint("w2", "a", "s", 1)
    assert not queue.give_back("w2", "a", "s", 1)
    assert queue.status("a") is Status.LEASED
    assert (queue.stats()["queued"], queue.stats()["leased"]) == (0, 1)


def test_give_back_then_another_worker_resumes_from_the_committed_state(queue: Any) -> None:
    queue.put(req("a"))
    queue.pull("w1")
    assert queue.checkpoint("w1", "a", "latent@2", 2)
    assert queue.give_back("w1", "a", "latent@5", 5)
    assert not queue.checkpoint("w1", "a", "latent@6", 6)  # no longer its lease
    (lease,) = queue.pull("w2")
    assert (lease.request.state, lease.request.step) == ("latent@5", 5)
    stats = queue.stats()
    assert (stats["requests_given_back"], stats["requests_resumed"]) == (1, 1)


def test_committed_holds_results_and_the_partial_states_a_restarted_controller_seeds_with(queue: Any) -> None:
    queue.put([req("done"), req("half"), req("fresh"), req("dropped", Kind.EXPLORATION)])
    queue.pull("w1", max_requests=3)
    assert queue.complete("w1", "done", "result")
    assert queue.checkpoint("w1", "half", "latent@4", 4)
    queue.cancel(Kind.EXPLORATION)
    results, partial = queue.committed(["done", "half", "fresh", "dropped"])
    assert results == {"done": "result"}
    assert partial == {"half": (4, "latent@4")}  # nothing committed of "fresh", "dropped" is cancelled


def test_worker_lost_requeues_from_the_last_checkpoint_and_counts_recomputed_steps(queue: Any) -> None:
    queue.put([req("a"), req("b")])
    queue.pull("w1", max_requests=2)
    assert queue.checkpoint("w1", "a", "latent@3", 3)
    queue.heartbeat("w1", {"a": 7, "b": 4})
    assert queue.worker_lost("w1") == ["a", "b"]
    resumed = {lease.request.id: lease.request for lease in queue.pull("w2", max_requests=2)}
    assert (resumed["a"].state, resumed["a"].step) == ("latent@3", 3)
    assert (resumed["b"].state, resumed["b"].step) == (None, 0)
    assert not queue.checkpoint("w1", "a", "latent@8", 8)  # the zombie cannot overwrite progress
    stats = queue.stats()
    # reported beyond the checkpoint, plus the step each was computing when the worker died
    assert stats["steps_recomputed"] == (7 - 3 + 1) + (4 - 0 + 1)
    assert (stats["requests_requeued"], stats["requests_resumed"]) == (2, 1)


def test_first_completion_wins_and_duplicate_or_foreign_ones_are_rejected(queue: Any) -> None:
    queue.put([req("a"), req("b")])
    queue.pull("w1")
    queue.worker_lost("w1")
    queue.pull("w2")
    # w1 is a zombie, but its result is deterministic and nobody has completed "a": accepted.
    assert queue.complete("w1", "a", "image-a")
    assert not queue.checkpoint("w2", "a", "latent@1", 1)  # w2's lease was released
    assert not queue.complete("w2", "a", "image-a")
    assert not queue.complete("w3", "b", "image-b")  # w3 never leased "b"
    assert queue.result("a") == "image-a"
    with pytest.raises(KeyError):
        queue.result("b")
    stats = queue.stats()
    assert stats["requests_completed"] == 1
    assert (stats["duplicate_commits_rejected"], stats["stale_commits_rejected"]) == (1, 1)
    assert (stats["requests_duplicated"], stats["leased"], stats["queued"]) == (0, 0, 1)


def test_cancel_ends_exploration_and_rejects_its_late_commits(queue: Any) -> None:
    queue.put([req("r"), req("e1", Kind.EXPLORATION), req("e2", Kind.EXPLORATION)])
    queue.pull("w1", kinds=[Kind.EXPLORATION])
    assert queue.cancel(Kind.EXPLORATION) == 2
    assert not queue.checkpoint("w1", "e1", "latent@1", 1)
    assert not queue.complete("w1", "e1", "image")
    assert [lease.request.id for lease in queue.pull("w2", max_requests=3)] == ["r"]
    assert queue.complete("w2", "r", "image-r")
    assert queue.is_done(["r", "e1", "e2"]) and queue.pending() == 0
    assert queue.status("e2") is Status.CANCELLED
    assert queue.results(["r"]) == ["image-r"]
    stats = queue.stats()
    assert (stats["requests_cancelled"], stats["stale_commits_rejected"]) == (2, 1)


def test_released_results_and_finished_states_are_not_kept(queue: Any) -> None:
    """A run releases each iteration's rollout after its update: a queue that kept every result
    (and every completed request's last partial state) would grow for the whole run."""
    queue.put([req("a"), req("b"), req("c", Kind.EXPLORATION)])
    queue.pull("w1", max_requests=3)
    for request_id in ("a", "b", "c"):
        assert queue.checkpoint("w1", request_id, f"{request_id}@1", 1)
    assert queue.complete("w1", "a", "ra") and queue.complete("w1", "b", "rb")
    queue.cancel(Kind.EXPLORATION)
    assert queue.stats()["results_held"] == 2
    assert queue.committed(["a", "b", "c"]) == ({"a": "ra", "b": "rb"}, {})
    if isinstance(queue, PullQueue):  # the partial states are gone, not just hidden
        assert [queue._requests[i].state for i in "abc"] == [None, None, None]
    # "a" read once and released; "b" released; "never-put" (restored from elsewhere) skipped
    assert queue.results(["a"], release=True) == ["ra"]
    assert queue.release(["a", "b", "never-put"]) == 1
    assert queue.stats()["results_held"] == 0
    with pytest.raises(KeyError, match="released"):
        queue.result("b")
    assert queue.status("b") is Status.COMPLETED and queue.stats()["requests_completed"] == 2


def test_a_notified_worker_pulls_nothing_and_hears_the_notice(queue: Any) -> None:
    queue.put([req("a"), req("b")])
    queue.pull("w1")
    notice = {"cause": "aws-spot-interruption", "seconds_left": 120}
    queue.notify("w1", notice)
    assert queue.heartbeat("w1") == notice
    assert queue.pull("w1") == []
    assert queue.give_back("w1", "a", "latent@4", 4)
    assert queue.heartbeat("w2") is None
    assert [lease.request.id for lease in queue.pull("w2", max_requests=2)] == ["a", "b"]
    queue.put(req("c"))
    queue.forget_worker("w1")  # a new worker takes the slot and the name
    assert queue.heartbeat("w1") is None
    assert [lease.request.id for lease in queue.pull("w1")] == ["c"]


def test_put_rejects_an_id_put_before(queue: Any) -> None:
    queue.put(req("a"))
    with pytest.raises(ValueError, match="'a' was already put"):
        queue.put(req("a"))
    with pytest.raises(ValueError, match="'b' was already put"):
        queue.put([req("b"), req("b")])
    assert queue.pending() == 1  # the rejected batch queued nothing
    with pytest.raises(KeyError):
        queue.pending(["b"])


# Time: the plain class on a ManualClock.

def test_heartbeats_keep_a_lease_and_missing_ones_let_it_expire() -> None:
    clock = ManualClock()
    queue = PullQueue(clock, LEASE_S)
    queue.put(req("a"))
    (lease,) = queue.pull("w1")
    assert lease.deadline == LEASE_S
    for _ in range(5):  # 100 s in all, well past one lease, kept alive by heartbeats every 20 s
        clock.advance(20.0)
        queue.heartbeat("w1")
        assert queue.pull("w2") == []
    clock.advance(LEASE_S)
    assert queue.pull("w2") == []  # at the deadline the lease still holds
    clock.advance(0.1)
    (lease,) = queue.pull("w2")
    assert (lease.worker, lease.deadline) == ("w2", clock.now() + LEASE_S)
    assert not queue.checkpoint("w1", "a", "latent@1", 1)
    assert queue.stats()["leases_expired"] == 1


def test_an_expired_holder_may_still_complete_and_its_lost_steps_are_counted() -> None:
    clock = ManualClock()
    queue = PullQueue(clock, LEASE_S)
    queue.put(req("a"))
    queue.pull("w1")
    queue.checkpoint("w1", "a", "latent@2", 2)
    queue.heartbeat("w1", {"a": 6})
    clock.advance(LEASE_S + 1)
    (lease,) = queue.pull("w2")
    assert lease.request.step == 2
    assert queue.complete("w1", "a", "image-a")  # late, but first
    assert not queue.complete("w2", "a", "image-a")
    stats = queue.stats()
    assert (stats["steps_recomputed"], stats["requests_resumed"], stats["leased"]) == (6 - 2 + 1, 1, 0)


def test_random_interleavings_commit_every_result_exactly_once() -> None:
    rng = random.Random(20240607)
    clock = ManualClock()
    queue = PullQueue(clock, lease_s=10.0)
    rollout = [req(f"r{i}", order=i % 3) for i in range(30)]
    exploration = [req(f"e{i}", Kind.EXPLORATION) for i in range(15)]
    queue.put(rollout + exploration)
    workers = [f"w{i}" for i in range(4)]
    # What each fake worker believes it holds: request id -> the step it has reached.
    held: dict[str, dict[str, int]] = {w: {} for w in workers}
    accepted: Counter[str] = Counter()
    actions = ["pull", "heartbeat", "step", "checkpoint", "give_back", "complete", "lost", "tick", "notify"]
    weights = [6, 5, 6, 3, 1, 4, 1, 3, 1]

    for op in range(400):
        if op == 250:
            queue.cancel(Kind.EXPLORATION)  # the train phase ends
        w = rng.choice(workers)
        mine = held[w]
        mine_id = rng.choice(sorted(mine)) if mine else None
        action = rng.choices(actions, weights)[0]
        if action == "pull":
            for lease in queue.pull(w, max_requests=rng.randint(1, 2)):
                r = lease.request
                assert lease.worker == w
                assert r.state == f"{r.id}@{r.step}" or (r.state, r.step) == (None, 0)  # resumes where committed
                mine[r.id] = r.step
        elif action == "step":
            for request_id in mine:
                mine[request_id] += rng.randint(1, 3)
        elif action == "heartbeat":
            if queue.heartbeat(w, dict(mine)) is not None:  # preempted: give everything back
                for request_id, step in mine.items():
                    queue.give_back(w, request_id, f"{request_id}@{step}", step)
                queue.forget_worker(w)  # a fresh worker replaces it under the same name
                held[w] = {}
        elif action == "checkpoint" and mine_id is not None:
            queue.checkpoint(w, mine_id, f"{mine_id}@{mine[mine_id]}", mine[mine_id])
        elif action == "give_back" and mine_id is not None:
            queue.give_back(w, mine_id, f"{mine_id}@{mine[mine_id]}", mine.pop(mine_id))
        elif action == "complete" and mine_id is not None:
            del mine[mine_id]
            if queue.complete(w, mine_id, f"result:{mine_id}"):
                accepted[mine_id] += 1
        elif action == "lost":
            queue.worker_lost(w)
            if rng.random() < 0.5:
                held[w] = {}  # really gone; otherwise it lives on as a zombie
        elif action == "tick":
            clock.advance(rng.uniform(0.0, 6.0))
        elif action == "notify":
            queue.notify(w, "preempted")
        stats = queue.stats()
        assert stats["requests_duplicated"] == 0
        assert stats["queued"] + stats["leased"] + stats["requests_completed"] + stats["requests_cancelled"] == 45

    clock.advance(10.5)  # every lease runs out; a fresh worker pulls until the queue is empty
    while leases := queue.pull("drain", max_requests=5):
        for lease in leases:
            assert queue.complete("drain", lease.request.id, f"result:{lease.request.id}")
            accepted[lease.request.id] += 1

    assert queue.pending() == 0
    for r in rollout:
        assert accepted[r.id] == 1 and queue.result(r.id) == f"result:{r.id}"
    for r in exploration:
        assert accepted[r.id] == (queue.status(r.id) is Status.COMPLETED)
    stats = queue.stats()
    assert stats["requests_duplicated"] == 0 and stats["requests_completed"] == sum(accepted.values())
    assert (stats["queued"], stats["leased"]) == (0, 0)
    # The seed exercises every path, not just the happy one.
    for name in ("leases_expired", "requests_resumed", "requests_given_back", "requests_requeued",
                 "duplicate_commits_rejected", "stale_commits_rejected", "requests_cancelled", "steps_recomputed"):
        assert stats[name] > 0, name


def test_queue_bench_reports_positive_rates(ray_session: None) -> None:
    r = run_queue_bench(ops=40)
    assert isinstance(r["machine"], str) and r["ops"] == 40
    rates = ("local_ops_per_s", "ray_sequential_ops_per_s", "ray_batched8_ops_per_s")
    assert all(r[key] > 0 for key in rates)
    assert r["local_vs_ray_sequential"] == r["local_ops_per_s"] / r["ray_sequential_ops_per_s"]
    assert r["ray_batched_vs_sequential"] == r["ray_batched8_ops_per_s"] / r["ray_sequential_ops_per_s"]


def test_pull_with_a_weight_version_leaves_other_versions_queued():
    from schedulers.clock import ManualClock
    from schedulers.queue import PullQueue
    from schedulers.request import Kind, Request

    q = PullQueue(ManualClock())
    q.put([Request(f"v{v}/{i}", Kind.ROLLOUT, i, "p", (0,), weight_version=v, order=i) for v in (0, 1) for i in (0, 1)])
    assert [lease.request.id for lease in q.pull("w", 3, weight_version=1)] == ["v1/0", "v1/1"]
    assert q.pull("w", 3, weight_version=2) == []
    assert [lease.request.id for lease in q.pull("w", 3)] == ["v0/0", "v0/1"]


def test_a_notice_give_back_at_a_step_boundary_recomputes_nothing():
    from schedulers.clock import ManualClock
    from schedulers.queue import PullQueue
    from schedulers.request import Kind, Request

    q = PullQueue(ManualClock())
    q.put(Request("a", Kind.ROLLOUT, 0, "p", (0,), 0))
    q.pull("w1")
    q.heartbeat("w1", {"a": 5})  # about to compute step 6; the notice stops it at the boundary
    assert q.give_back("w1", "a", "latent@5", 5)
    assert q.stats()["steps_recomputed"] == 0
    q.pull("w2")
    q.heartbeat("w2", {"a": 5})
    q.worker_lost("w2")  # dies while computing step 6: that step is done again
    assert q.stats()["steps_recomputed"] == 1
