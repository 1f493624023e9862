"""The fleet contract: one scenario through `schedulers.fleet.FleetEngine` with every executor that runs
on CPU — in-process rollout workers, Ray actors, elastic SP groups, and the simulator's modelled
groups — asserting the same engine and queue counters everywhere and, for the executors that really
compute, the same committed results bit for bit.

The scenario (deterministic in everything but wall-clock timing: the fleet changes between phases,
through the engine's public methods, so no request is ever in flight at a notice or a death):

1. the fleet: ondemand0 (2 devices), spot0 and spot1 (1 device each); the engine starts it;
2. rollout iteration 0 (4 tiny-DiT requests, 4 sampler steps);
3. spot0 gets a notice, then dies: its idle worker is retired, not lost;
4. spot1 dies without a notice: a worker lost;
5. rollout iteration 1 on what is left;
6. spot0 joins again (its second generation);
7. rollout iteration 2;
8. a sample-bounded exploration round through `engine.explore` (two rounds of two requests).

Every executor computes with the same weights: one model's state, given to the in-process workers,
sent to the Ray actors, and saved to the checkpoint every SP node loads its live copy from. SP
groups are degree 1 here (the test's step-time model makes width only cost): a degree-1 group runs
no collective, so its results are the single-process ones bit for bit (a degree-2 group's differ
by float reassociation in the linear layers, ~1e-7: tests/elastic_sp/test_elastic_sp_ulysses.py). Every
executor runs every step, exploration included (SP groups sample an exploration request like a
rollout, which is what the default `exploration` settings ask for).

Two more tests cover what the contract's scenario keeps out: a notice and a death while requests
are mid-way (for the executors whose workers compute beside the engine: Ray and SP; the given-back
and re-queued requests resume bit-identically), and SP regrouping in place under the engine (a join
widens a group, a death narrows it again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import small_dit_config
from elastic_sp.agent import NodeAgent
from elastic_sp.coordinator import Coordinator
from elastic_sp.fleet_executor import SPExecutor
from elastic_sp.regroup_policy import MeasuredStepTime
from elastic_sp.weights import NodeWeights, save_checkpoint
from schedulers.clock import ManualClock, WallClock
from schedulers.fleet import FleetEngine, Node, WorkerPhase
from schedulers.preemption import Cause, PreemptionNotice
from schedulers.queue import PullQueue
from schedulers.request import Kind, Request
from spotlight.config import RunConfig
from spotlight.runtime.learner import build_policy
from spotlight.rl.policy import Rollout
from spotlight.rl.sp_member import serve_spec
from spotlight.runtime.rollout_worker import RolloutWorker

CFG = small_dit_config()
LEASE_S = 600.0  # on the wall clock: no lease may run out mid-test
POLL_S = 0.01
EXECUTORS = ["in_process", "ray", "sp", "modelled"]
COMPUTING = {"in_process", "ray", "sp"}
"""Executors whose results are samples (the modelled one commits None)."""

ROLLOUT_REQUESTS = 4
EXPLORATION_ROUNDS = [2, 2]
"""Requests per exploration round."""
EXPECTED_ENGINE = {"notices": 1, "kills": 2, "workers_lost": 1}
EXPECTED_QUEUE = {
    "requests_put": 3 * ROLLOUT_REQUESTS + sum(EXPLORATION_ROUNDS),
    "requests_completed": 3 * ROLLOUT_REQUESTS + sum(EXPLORATION_ROUNDS),
    "requests_duplicated": 0,
    "requests_given_back": 0,  # nothing is in flight at the notice (between phases)
    "requests_requeued": 0,  # nor at the deaths
    "requests_cancelled": 0,  # the exploration is sample-bounded
    "requests_resumed": 0,
    "leases_expired": 0,
    "steps_recomputed": 0,
}


def nodes() -> list[Node]:
    return [Node("ondemand0", spot=False, devices=2), Node("spot0", spot=True), Node("spot1", spot=True)]


def rollout_requests(iteration: int) -> list[Request]:
    return [Request(f"it{iteration}/p{p}", Kind.ROLLOUT, p, f"prompt {p} of iteration {iteration}",
                    (10 * iteration + p, 100 + p), weight_version=0)
            for p in range(ROLLOUT_REQUESTS)]


class Rounds:
    """A sample-bounded exploration session (`schedulers.fleet.Session`): fixed rounds of one-seed
    requests; it records how many of each round completed."""

    critical_path = True
    time_bounded = False

    def __init__(self) -> None:
        self.samples = self.cancelled = 0
        self.budget = sum(EXPLORATION_ROUNDS)
        self._rounds = list(EXPLORATION_ROUNDS)
        self._next = 0
        self.recorded: list[tuple[int, Any]] = []

    def begin(self, estimated_samples: int | None = None) -> None:
        pass

    def next_requests(self) -> list[Request]:
        if not self._rounds:
            return []
        n = self._rounds.pop(0)
        out = [Request(f"ex{self._next + i}", Kind.EXPLORATION, i, f"prompt {i}", (1000 + self._next + i,),
                       weight_version=0) for i in range(n)]
        self._next += n
        return out

    def record(self, requests: list[Request], rewards: Any) -> None:
        self.samples += sum(len(r.seeds) for r in requests)
        self.recorded.append((len(requests), rewards))


@dataclass
class Fleet:
    """One executor's engine, its queue, and how to take it down."""

    engine: FleetEngine
    queue: Any
    close: Callable[[], None] = lambda: None
    extra: dict[str, Any] = field(default_factory=dict)


def run_scenario(fleet: Fleet) -> Rounds:
    engine, queue = fleet.engine, fleet.queue
    engine.start()
    engine.rollout(rollout_requests(0), 0)
    engine.notice("spot0", PreemptionNotice(Cause.TRACE, None, "spot0"))
    engine.kill("spot0")
    engine.kill("spot1")
    engine.rollout(rollout_requests(1), 0)
    engine.add("spot0")
    engine.rollout(rollout_requests(2), 0)
    session = Rounds()
    # Scored by how many of the round completed: results differ in type between executors (an SP
    # group commits its SampleState, a rollout worker an exploration Rollout without trajectories).
    engine.explore(session, lambda requests: len(queue.completed([r.id for r in requests])), 0)
    return session


def tensors(result: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A committed result's trajectory and log-probs: a rollout worker's `Rollout`, or an SP group's
    `SampleState`."""
    if isinstance(result, Rollout):
        return result.data["trajectory"], result.data["log_probs"]
    return result.trajectory, result.log_probs


# ---- the executors ------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """This process computes with one thread, like the Ray actors and the SP members: with two, and
    the members or another process busy on the 2 cores, OpenMP spins (measured here: the long
    requests below took 8.6 s with 2 threads, 0.3 s with 1; results are the same either way)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    """The one model state every executor computes with."""
    return {k: v.clone() for k, v in build_policy(CFG).model.state_dict().items()}


def computed(cfg: RunConfig, weights: dict[str, torch.Tensor],
             requests: list[Request]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """`requests` computed by one worker, straight through, without the engine."""
    policy = build_policy(cfg)
    policy.model.load_state_dict(weights)
    queue = PullQueue(WallClock(), LEASE_S)
    worker = RolloutWorker("reference", cfg, queue, policy=policy)
    worker.set_weights(0)
    queue.put(requests)
    worker.serve([Kind.ROLLOUT])
    return {r.id: tensors(queue.result(r.id)) for r in requests}


@pytest.fixture(scope="module")
def reference(weights) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return computed(CFG, weights, [r for it in range(3) for r in rollout_requests(it)])


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    import ray

    from spotlight.runtime.ray_cluster import SPOT_RESOURCE

    # One torch thread per actor process (ray_runtime.py: oversubscribed OpenMP on 2 cores, 0.9 s -> 21 s).
    ray.init(address="local", num_cpus=2, resources={SPOT_RESOURCE: 1000.0}, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    yield
    ray.shutdown()


def in_process_fleet(cfg: RunConfig, fleet_nodes: list[Node], weights: dict[str, torch.Tensor]) -> Fleet:
    from spotlight.runtime.local import InProcessExecutor

    clock = WallClock()
    queue = PullQueue(clock, LEASE_S)
    policy = build_policy(cfg)
    policy.model.load_state_dict(weights)
    return Fleet(FleetEngine(clock, queue, InProcessExecutor(cfg, queue, policy, 0), fleet_nodes), queue)


def ray_fleet(cfg: RunConfig, fleet_nodes: list[Node], weights: dict[str, torch.Tensor]) -> Fleet:
    import ray

    from schedulers.queue_actor import QueueActor, QueueClient
    from spotlight.runtime.ray_runtime import RayExecutor

    clock = WallClock()
    actor = QueueActor.remote(lease_s=LEASE_S)
    queue = QueueClient(actor)
    executor = RayExecutor(cfg, actor, 0, ray.put(weights), clock)
    engine = FleetEngine(clock, queue, executor, fleet_nodes, poll_s=POLL_S)

    def close() -> None:
        for w in list(engine.workers.values()):
            executor.stop(w, lost=False)
        ray.kill(actor)

    return Fleet(engine, queue, close)


def sp_fleet(cfg: RunConfig, fleet_nodes: list[Node], weights: dict[str, torch.Tensor], tmp_path: Path,
             widest: bool = False) -> Fleet:
    clock = WallClock()
    queue = PullQueue(clock, LEASE_S)
    spec = serve_spec(cfg)
    checkpoint = save_checkpoint(weights, tmp_path / "weights.safetensors")
    # Width only costs in this model, so the regroup policy forms degree-1 groups (see the module
    # docstring); `widest`: width pays, so it forms one group of every member it can.
    step_time = MeasuredStepTime(spec.seq_len, {1: 10.0, 2: 1.0} if widest else {1: 1.0, 2: 10.0})
    coord = Coordinator(spec, [], queue, step_time=step_time, clock=clock, engine_driven=True)
    # Each node (each join) loads its live copy once from the checkpoint; its members copy that.
    executor = SPExecutor(coord, lambda node: NodeAgent(node.name, spec, NodeWeights.from_checkpoint(checkpoint),
                                                        checkpoint=checkpoint))
    # poll_s: the engine turns (and a rollout's progress callback runs) while groups compute.
    return Fleet(FleetEngine(clock, queue, executor, fleet_nodes, poll_s=POLL_S), queue, executor.close)


def modelled_fleet(fleet_nodes: list[Node]) -> Fleet:
    from spotlight.sim.modelled_executor import ModelledExecutor
    from spotlight.sim.step_time import StepTimes, image_tokens

    clock = ManualClock()
    queue = PullQueue(clock, lease_s=1e15)  # deaths are reported at once, never by expiry
    resolution = 128
    executor = ModelledExecutor(clock, queue, StepTimes.profile("tiny-cpu"), resolution, image_tokens(resolution),
                                commit_every=1, join_s=0.001, pending_per_iteration=ROLLOUT_REQUESTS,
                                ondemand_devices=2)
    return Fleet(FleetEngine(clock, queue, executor, fleet_nodes), queue)


def make_fleet(request: pytest.FixtureRequest, name: str, cfg: RunConfig, fleet_nodes: list[Node],
               weights: dict[str, torch.Tensor], tmp_path: Path) -> Fleet:
    if name == "in_process":
        made = in_process_fleet(cfg, fleet_nodes, weights)
    elif name == "ray":
        request.getfixturevalue("ray_cluster")
        made = ray_fleet(cfg, fleet_nodes, weights)
    elif name == "sp":
        made = sp_fleet(cfg, fleet_nodes, weights, tmp_path)
    else:
        made = modelled_fleet(fleet_nodes)
    made.extra["name"] = name
    return made


@pytest.fixture(params=EXECUTORS)
def fleet(request: pytest.FixtureRequest, weights, tmp_path) -> Iterator[Fleet]:
    made = make_fleet(request, request.param, CFG, nodes(), weights, tmp_path)
    try:
        yield made
    finally:
        made.close()


# ---- the contract ------------------------------------------------------------------------------------


def test_one_scenario_gives_the_same_counters_and_results_on_every_executor(fleet: Fleet, reference) -> None:
    session = run_scenario(fleet)
    engine, queue = fleet.engine, fleet.queue

    assert engine.counters == EXPECTED_ENGINE
    stats = queue.stats()
    assert {k: stats[k] for k in EXPECTED_QUEUE} == EXPECTED_QUEUE
    assert stats["requests_put"] == stats["requests_completed"] + stats["requests_cancelled"]  # nothing lost
    assert (stats["queued"], stats["leased"]) == (0, 0)
    assert session.recorded == [(n, n) for n in EXPLORATION_ROUNDS]
    assert session.samples == sum(EXPLORATION_ROUNDS)

    alive = {n.name: (n.alive, n.generation) for n in engine.nodes.values()}
    assert alive == {"ondemand0": (True, 1), "spot0": (True, 2), "spot1": (False, 1)}
    assert not any("spot1" in w.nodes for w in engine.workers.values())

    ids = [r.id for it in range(3) for r in rollout_requests(it)]
    results = queue.results(ids)
    if fleet.extra["name"] not in COMPUTING:
        assert results == [None] * len(ids)
        return
    for rid, result in zip(ids, results):
        trajectory, log_probs = tensors(result)
        want_trajectory, want_log_probs = reference[rid]
        assert torch.equal(trajectory, want_trajectory), rid
        assert torch.equal(log_probs, want_log_probs), rid


# ---- mid-request: for the executors whose workers compute beside the engine ------------------------------

# The in-process executor serves a whole phase inside one call (nothing is in flight between two of
# the engine's turns) and the modelled one commits no partial state, so only these two take part.
LONG = small_dit_config(sampler={"num_steps": 20})
"""Long enough requests (20 steps x 8 samples, ~0.2 s) that all three are mid-way at once."""


@pytest.mark.parametrize("name", ["ray", "sp"])
def test_a_notice_and_a_death_mid_request_resume_from_the_committed_step(request, name, weights, tmp_path) -> None:
    requests = [Request(f"long/p{p}", Kind.ROLLOUT, p, f"prompt {p}", tuple(range(8 * p, 8 * p + 8)),
                        weight_version=0) for p in range(3)]
    ids = [r.id for r in requests]
    fleet = make_fleet(request, name, LONG, [Node("ondemand0", spot=False), Node("spot0", spot=True),
                                             Node("spot1", spot=True)], weights, tmp_path)
    acted: list[dict[str, int]] = []

    def progress(results: dict[str, Any], partial: dict[str, tuple[int, Any]]) -> None:
        # Once every request has committed step 2 and none is done, each of the three workers holds
        # one: spot0 is told to go, spot1 dies.
        if not acted and not results and all(partial.get(i, (0,))[0] >= 2 for i in ids):
            acted.append({i: partial[i][0] for i in ids})
            fleet.engine.notice("spot0", PreemptionNotice(Cause.TRACE, None, "spot0"))
            fleet.engine.kill("spot1")

    try:
        fleet.engine.start()
        fleet.engine.rollout(requests, 0, progress, every_s=0.0)
        assert acted, "the requests never were all in flight at once"
        assert fleet.engine.counters == {"notices": 1, "kills": 1, "workers_lost": 1}
        # The noticed worker reported Served(noticed) after giving back, and was retired. (The
        # on-demand one may still be SERVING: a Ray actor's serve() returns a moment after the
        # phase's last commit.)
        assert [w.nodes for w in fleet.engine.workers.values()] == [("ondemand0",)]
        stats = fleet.queue.stats()
        got = {k: stats[k] for k in ("requests_put", "requests_completed", "requests_given_back",
                                     "requests_requeued", "requests_resumed", "requests_duplicated",
                                     "steps_recomputed_given_back")}
        assert got == {"requests_put": 3, "requests_completed": 3, "requests_given_back": 1,
                       "requests_requeued": 1, "requests_resumed": 2, "requests_duplicated": 0,
                       "steps_recomputed_given_back": 0}  # with a notice no finished step is redone
        assert stats["steps_recomputed"] >= 1  # the death: at least the step in flight
        assert stats["steps_resumed"] >= 4  # both resumed from a committed step >= 2
        want = computed(LONG, weights, requests)
        for rid, result in zip(ids, fleet.queue.results(ids)):
            trajectory, log_probs = tensors(result)
            assert torch.equal(trajectory, want[rid][0]), rid
            assert torch.equal(log_probs, want[rid][1]), rid
    finally:
        fleet.close()


# ---- elastic SP only: regrouping in place under the engine -------------------------------------------------


def test_sp_groups_regroup_in_place_as_nodes_join_and_die(weights, tmp_path) -> None:
    """A join widens the on-demand member's group across both nodes (its old group is reported
    Dissolved with the new one Ready); the death of the spot node breaks it, and the survivor
    serves alone at once — the engine takes in the re-formed group instead of finding no capacity."""
    fleet = sp_fleet(CFG, [Node("ondemand0", spot=False), Node("spot0", spot=True)], weights, tmp_path, widest=True)
    engine = fleet.engine
    try:
        engine.start()
        assert [(w.nodes, w.spot) for w in engine.workers.values()] == [(("ondemand0", "spot0"), True)]
        engine.rollout(rollout_requests(0), 0)
        engine.kill("spot0")  # without notice
        assert not engine.workers  # the group died with spot0; the survivor's group is not taken in yet
        engine.rollout(rollout_requests(1), 0)
        assert [w.nodes for w in engine.workers.values()] == [("ondemand0",)]
        assert engine.counters == {"notices": 0, "kills": 1, "workers_lost": 1}
        stats = fleet.queue.stats()
        assert (stats["requests_completed"], stats["requests_requeued"]) == (2 * ROLLOUT_REQUESTS, 0)
        want = computed(CFG, weights, rollout_requests(0) + rollout_requests(1))
        for r in rollout_requests(0):  # degree 2: float reassociation in the linear layers
            for got, expected in zip(tensors(fleet.queue.result(r.id)), want[r.id]):
                torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
        for r in rollout_requests(1):  # degree 1 again: bit for bit
            for got, expected in zip(tensors(fleet.queue.result(r.id)), want[r.id]):
                assert torch.equal(got, expected), r.id
    finally:
        fleet.close()


class MidWay:
    """A `Pending` (the learner's update, as the engine waits on it) that is done once every one of
    `ids` has committed `step`."""

    deadline = None

    def __init__(self, queue: Any, ids: list[str], step: int) -> None:
        self.queue, self.ids, self.step = queue, ids, step

    def done(self) -> bool:
        partial = self.queue.committed(self.ids)[1]
        return all(partial.get(i, (0,))[0] >= self.step for i in self.ids)


def test_sp_groups_drop_cancelled_exploration_and_serve_on(weights, tmp_path) -> None:
    """A time-bounded exploration ends when the update is done: the engine cancels what is in flight,
    the SP groups computing it are dissolved at their next step and re-formed, and the next rollout
    runs on the new groups."""
    fleet = sp_fleet(LONG, [Node("spot0", spot=True), Node("spot1", spot=True)], weights, tmp_path)
    engine, queue = fleet.engine, fleet.queue
    explored = [Request(f"ex/p{p}", Kind.EXPLORATION, p, f"prompt {p}", tuple(range(8)), weight_version=0)
                for p in range(2)]

    class OneRound(Rounds):
        critical_path = False
        time_bounded = True

        def next_requests(self) -> list[Request]:
            out, explored[:] = list(explored), []
            return out

    try:
        engine.start()
        session = OneRound()
        ids = [r.id for r in explored]
        stats = engine.explore(session, lambda requests: None, 0, update=MidWay(queue, ids, 2))
        assert (session.cancelled, stats["explored_samples"]) == (2, 0)
        before = set(engine.workers)
        engine.rollout(rollout_requests(0), 0)
        assert set(engine.workers).isdisjoint(before) and len(engine.workers) == 2  # re-formed groups
        assert engine.counters == {"notices": 0, "kills": 0, "workers_lost": 0}
        got = queue.stats()
        assert (got["requests_cancelled"], got["requests_completed"], got["requests_requeued"]) == (2, 4, 0)
        want = computed(LONG, weights, rollout_requests(0))
        for r in rollout_requests(0):
            for tensor, expected in zip(tensors(queue.result(r.id)), want[r.id]):
                assert torch.equal(tensor, expected), r.id
    finally:
        fleet.close()


# ---- the update's gradient work: node-served requests on every executor that computes it ----------------

GRADIENT = small_dit_config(train={"micro_batch": 4})
"""8 samples x 4 SDE steps in micro-batches of 4 rows: 8 micro-batches, in requests of 3 (the last of 2)."""
PER_REQUEST = 3


@pytest.mark.parametrize("name", ["in_process", "ray", "modelled"])
def test_node_crews_send_one_gradient_per_request_the_learners_own_sum(request, name, weights, tmp_path) -> None:
    """The scenario's fleet computes an update round: every request is served by one node's crew —
    ondemand0's two devices together where the executor has a worker per device (Ray; the modelled
    groups), the crew's lead sending one gradient — and (where computed) each is the chunk's sum as
    the learner folds it on one device, bit for bit (`chunk_gradient`); none is computed by a crew
    spanning nodes."""
    from schedulers.update import Done, FleetUpdate
    from spotlight.rl.gradient import chunk_gradient

    fleet = make_fleet(request, name, GRADIENT, nodes(), weights, tmp_path)
    engine, queue = fleet.engine, fleet.queue
    try:
        engine.start()
        engine.rollout(rollout_requests(0), 0)
        # A Ray actor's serve() returns a moment after the phase's last commit: every worker idle
        # first, so that each node's crew is all of it.
        while any(w.phase is not WorkerPhase.IDLE for w in engine.workers.values()):
            engine.settle()
        ids = [r.id for r in rollout_requests(0)]
        parts = queue.results(ids)
        advantages = torch.linspace(-1.0, 1.0, 2 * ROLLOUT_REQUESTS)
        computing = name in COMPUTING
        data = (parts, advantages) if computing else 0.5  # the modelled executor: seconds per micro-batch
        update = FleetUpdate(queue, 0, 1, 8, data, lambda r, done: Done(queue.results(done)), weights=lambda: None,
                             per_request=PER_REQUEST)
        crews, serve_crew = [], engine.executor.serve_crew

        def spy(workers, version, at_most=None):
            crews.append(sorted(n for w in workers for n in w.nodes))
            return serve_crew(workers, version, at_most)

        engine.executor.serve_crew = spy
        engine.wait(update, 0)
        # ondemand0's two devices form one crew where the executor runs a worker on each; the
        # in-process executor runs one worker per node.
        assert (["ondemand0", "ondemand0"] in crews) == (name != "in_process"), crews
        assert update.ids == ["it0/u0/m0-2", "it0/u0/m3-5", "it0/u0/m6-7"]
        by_worker = queue.completions_by_worker(Kind.TRAIN)
        assert sum(by_worker.values()) == 3 and queue.stats()["requests_duplicated"] == 0
        results = update.last_step.value
        if not computing:
            assert results == [None] * 3
            return
        policy = build_policy(GRADIENT)
        policy.model.load_state_dict(weights)
        rollout = policy.merge(parts)
        for (grads, stats), indices in zip(results, (range(0, 3), range(3, 6), range(6, 8))):
            want_grads, want_stats = chunk_gradient(policy, rollout, advantages, indices, device="cpu")
            assert grads.keys() == want_grads.keys() and stats == want_stats
            assert all(torch.equal(grads[k], want_grads[k]) for k in grads), indices
    finally:
        fleet.close()


def test_a_nodes_death_learned_from_its_workers_counts_as_a_kill_once() -> None:
    """A live executor may learn of a node's death from a worker's failed call (`Died` with the node)
    before the cluster's own view does; the engine counts it in `kills` then, and the cluster's later
    `kill` of a node already gone changes nothing (the counters are the same however it was learned)."""
    from schedulers.fleet import Died, Ready, Worker

    class Stub:
        def __init__(self) -> None:
            self.events: list[Any] = []

        def start(self, node: Node, spot: bool) -> list[Worker]:
            w = Worker(f"{node.name}.{node.generation}", (node.name,), spot)
            self.events.append(Ready(w))
            return [w]

        def changed(self, nodes: Any) -> None:
            pass

        def stop(self, worker: Worker, lost: bool) -> None:
            pass

        def wait(self, until: Any, pending: Any = ()) -> list[Any]:
            events, self.events = self.events, []
            return events

    clock = ManualClock()
    stub = Stub()
    engine = FleetEngine(clock, PullQueue(clock, LEASE_S), stub, [Node("ondemand0", spot=False), Node("spot0", spot=True)])
    engine.start()
    stub.events.append(Died("spot0.1", ("spot0",)))
    engine.settle()
    assert engine.counters == {"notices": 0, "kills": 1, "workers_lost": 1}
    assert not engine.nodes["spot0"].alive and list(engine.workers) == ["ondemand0.1"]
