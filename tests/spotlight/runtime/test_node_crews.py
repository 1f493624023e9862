"""Node-served gradient requests: a `TRAIN` request is pulled by a node's crew (`schedulers.fleet`),
its micro-batches shared by the crew's GPUs and folded by its lead in index order
(`spotlight.runtime.rollout_worker`), one gradient sent; the simulator serves the same requests
(`spotlight.sim.crews`, `Simulation.fleet_update`). The runtimes end bit-identical with crews:
tests/schedulers/test_fleet_contract.py (every executor), tests/spotlight/runtime/test_multinode.py (two-GPU spot nodes,
SIGKILL and a drain mid-update)."""

from dataclasses import replace

import pytest
import torch

from schedulers.clock import ManualClock
from schedulers.fleet import FleetEngine, Node, Worker
from schedulers.queue import PullQueue
from schedulers.request import GradientWork, Kind, Request
from spotlight.rl.gradient import chunk_gradient
from spotlight.runtime.learner import build_policy
from spotlight.runtime.rollout_worker import CrewMemberLost, LocalCrewMember, RolloutWorker, shares
from spotlight.sim import crews
from spotlight.sim.progress_model import ProgressModel
from spotlight.sim.simulator import POLICIES, SimConfig, make_simulation
from spotlight.sim.step_time import StepTimes
from schedulers.traces import Trace, TraceEvent

from conftest import small_dit_config


def test_exploration_yields_to_queued_gradient_work():
    queue = PullQueue(ManualClock(), 30.0)
    queue.put([Request("x0", Kind.EXPLORATION, 0, "", (1,), 0), Request("x1", Kind.EXPLORATION, 1, "", (2,), 0)])
    queue.put([Request("t", Kind.TRAIN, 0, "", (), 0, work=GradientWork(0, 0, None))])
    # A worker serving exploration alone gets none while a request of the update waits: it comes back
    # idle, to its node's crew.
    assert queue.pull("w", 1, [Kind.EXPLORATION]) == []
    assert [lease.request.id for lease in queue.pull("lead", 1, [Kind.TRAIN])] == ["t"]
    # Taken (not waiting any more): exploration fills the rest.
    assert [lease.request.id for lease in queue.pull("w", 1, [Kind.EXPLORATION])] == ["x0"]
    # A pull of every kind takes the update's work first anyway.
    queue.put([Request("t2", Kind.TRAIN, 0, "", (), 0, work=GradientWork(0, 1, None))])
    assert [lease.request.id for lease in queue.pull("v", 1)] == ["t2"]


def test_a_request_is_dealt_round_its_crew_the_lead_first():
    assert shares(range(3, 8), 2) == [[3, 5, 7], [4, 6]]
    assert shares(range(0, 3), 8) == [[0], [1], [2]]  # more members than micro-batches: the rest idle
    assert shares(range(6, 8), 1) == [[6, 7]]
    assert crews.crew_sizes(5, 2) == [2, 2, 1] and crews.crew_sizes(8, 8) == [8] and crews.crew_sizes(3, 8) == [3]


class _Recorder:
    """An executor that records the crews and single workers the engine dispatches; a crew's lead
    leases one request, as a live one would at once (and nothing is computed)."""

    def __init__(self, queue) -> None:
        self.queue = queue
        self.crews: list[tuple[list[str], int | None]] = []
        self.served: list[tuple[str, tuple[Kind, ...]]] = []

    def serve_crew(self, workers, version, at_most=None):
        self.crews.append(([w.name for w in workers], at_most))
        return bool(self.queue.pull(workers[0].name, 1, [Kind.TRAIN]))

    def serve(self, worker, kinds, version):
        self.served.append((worker.name, tuple(kinds)))
        return True


def _engine_with_idle(requests: int) -> tuple[FleetEngine, _Recorder]:
    clock = ManualClock()
    queue = PullQueue(clock, 30.0)
    recorder = _Recorder(queue)
    engine = FleetEngine(clock, queue, recorder, [Node(n, spot=n != "od") for n in ("od", "spot0", "spot1", "spot2", "spot3")])
    idle = [Worker("spot0#0", ("spot0",), True), Worker("od#0", ("od",), False), Worker("spot0#1", ("spot0",), True),
            Worker("od#1", ("od",), False), Worker("od#2", ("od",), False), Worker("sp", ("spot1", "spot2"), True),
            Worker("spot3#0", ("spot3",), True)]
    for w in idle:
        engine.workers[w.name] = w
        engine._idle[w.spot][w.name] = None
    queue.put([Request(f"t{i}", Kind.TRAIN, 0, "", (), 0, order=i, work=GradientWork(0, i, None)) for i in range(requests)])
    queue.put([Request("x", Kind.EXPLORATION, 0, "", (1,), 0)])
    engine._dispatch((Kind.TRAIN, Kind.EXPLORATION), (Kind.TRAIN,), 0, crew_size=2)
    return engine, recorder


def test_the_engine_forms_crews_of_a_nodes_idle_workers_on_demand_first():
    # On-demand first, a node's idle workers in crews of at most 2; an SP group spanning nodes is
    # no crew's. Many requests waiting: the crews of one GPU take one each too (the two full crews
    # would need 4 request times for the 8, a crew of one 2 for its one).
    engine, recorder = _engine_with_idle(8)
    assert recorder.crews == [(["od#0", "od#1"], None), (["od#2"], 1), (["spot0#0", "spot0#1"], None), (["spot3#0"], 1)]
    assert recorder.served == [] and set(engine._idle[True]) == {"sp"}  # no exploration while gradients wait
    # Three waiting: the full crews clear them in 2 request times, no later than a crew of one would
    # compute one, so the crews of one stay idle; nothing explores while one still waits.
    engine, recorder = _engine_with_idle(3)
    assert recorder.crews == [(["od#0", "od#1"], None), (["spot0#0", "spot0#1"], None)]
    assert recorder.served == [] and set(engine._idle[False]) == {"od#2"}
    # Two: the full crews take both, and the rest explore (the SP group among them).
    engine, recorder = _engine_with_idle(2)
    assert recorder.crews == [(["od#0", "od#1"], None), (["spot0#0", "spot0#1"], None)]
    assert recorder.served == [("sp", (Kind.EXPLORATION,)), ("spot3#0", (Kind.EXPLORATION,))]


def _policy(cfg, weights):
    policy = build_policy(cfg)
    policy.model.load_state_dict(weights)
    return policy


class _Gone(LocalCrewMember):
    def collect(self, handle):
        raise CrewMemberLost("gone")


def test_a_crews_fold_is_the_one_device_sum_bit_for_bit_whoever_computes():
    """A lead and two members, each with its own copy of the model (as on separate GPUs), fold a
    request of 5 micro-batches to exactly the learner's `chunk_gradient`; a member lost mid-request
    leaves its micro-batches to the lead, with the same bits."""
    torch.set_num_threads(1)
    cfg = small_dit_config(train={"micro_batch": 2})
    weights = {k: v.clone() for k, v in build_policy(cfg).model.state_dict().items()}
    queue = PullQueue(ManualClock(), 30.0)
    rollout_requests = [Request(f"p{p}", Kind.ROLLOUT, p, f"prompt {p}", (p, 10 + p), 0) for p in range(2)]
    queue.put(rollout_requests)
    workers = [RolloutWorker(f"w{j}", cfg, queue, policy=_policy(cfg, weights)) for j in range(3)]
    for w in workers:
        w.set_weights(0)
    workers[0].serve([Kind.ROLLOUT])
    parts = queue.results([r.id for r in rollout_requests], release=True)
    advantages = torch.tensor([0.5, -1.0, 2.0, -0.25])
    lead_policy = workers[0].policy
    want = chunk_gradient(lead_policy, lead_policy.merge(parts), advantages, range(1, 6), device="cpu")

    for i, members in enumerate(([LocalCrewMember(workers[1]), LocalCrewMember(workers[2])],
                                 [LocalCrewMember(workers[1]), _Gone(workers[2])])):
        queue.put([Request(f"t{i}", Kind.TRAIN, 0, "", (), 0, work=GradientWork(0, 1, (parts, advantages), None, 5))])
        workers[0].serve([Kind.TRAIN], members)
        grads, stats = queue.result(f"t{i}")
        assert grads.keys() == want[0].keys() and stats == want[1]
        assert all(torch.equal(grads[k], want[0][k]) for k in grads)
        assert all(g.device.type == "cpu" for g in grads.values())


def _sim(policy: str, nodes: int = 3, **over) -> "object":
    st = over.pop("step_times", StepTimes())
    cfg = SimConfig(**{"gpus": 4, "spot_gpus": 6, "prompts": 8, "group_size": 4, "samples_per_request": 4,
                       "iterations": 2, "candidates_per_prompt": 8, "plan_prompts": 4, "stop_at_target": False,
                       "micro_batch": 4, "parts_per_request": 4, "step_times": st, **over})
    trace = Trace([TraceEvent(0.0, "add", f"n{k}") for k in range(nodes)], "handmade")  # spot nodes of 2 GPUs
    return make_simulation(cfg, POLICIES[policy], trace, ProgressModel.calibrated(), (1.0, 0.5))


@pytest.mark.parametrize("given", [0.0, None])
def test_the_simulated_round_is_the_crews_list_schedule(given):
    """The simulator's requests are the runtime's (16 micro-batches of 4 rows, 4 a request) served by
    crews; on a fleet without preemptions a round lasts what `crews.round_s` prices it at, with a
    given gather (`update_round_s`) or the modelled one (each gradient through the learner's link)."""
    sim = _sim("spotlight_noexplore", step_times=replace(StepTimes(), update_round_s=given))
    sim.engine.start()
    assert sim.st.gradient_parts == 16 and sim.st.gradient_requests == 4
    start = sim.clock.now()
    sim.engine.wait(sim.fleet_update(0), 0)
    assert sim.clock.now() - start == pytest.approx(sim._round_s(), rel=1e-12)
    # 4 requests: the on-demand crew of 4 takes one micro-batch time p a request, a spot crew of 2
    # two. By hand: the od crew takes the first; two spot crews take one each (the full crew would
    # clear the 3 waiting in 3p, later than their 2p), the third does not (1 waiting: the full crew
    # takes it at p, done at 2p, no later than a crew of 2 would) — so the round is 2p.
    p = sim.st.train_gpu_s(512, 32) / 16 / sim.st.fleet_update_efficiency
    assert sim._round_s(gather=False) == pytest.approx(2 * p)


@pytest.mark.parametrize("learner_gbps", [100.0, 0.5])
def test_each_gradient_crosses_the_learners_link_as_its_request_completes(learner_gbps):
    """The learner receives each request's one gradient as the request completes, so only the last
    transfer (or the ingress the compute could not hide) and the step follow the round's compute."""
    st = replace(StepTimes(), learner_gbps=learner_gbps)
    sim = _sim("spotlight_noexplore", nodes=0, step_times=st)  # the on-demand crew of 4 alone
    sim.engine.start()
    start = sim.clock.now()
    sim.engine.wait(sim.fleet_update(0), 0)
    p = sim.st.train_gpu_s(512, 32) / 16 / sim.st.fleet_update_efficiency  # one request: one micro-batch time
    b = sim.st.gradient_transfer_s(spot=False)
    assert sim.st.gradient_transfer_s(spot=True) == 2 * b == 2 * sim.st.gradient_transfer_s(spot=True, queued=True)
    end = 0.0
    for k in range(1, 5):  # requests complete at p, 2p, 3p, 4p; the link takes them one at a time
        end = end + b if end > k * p else k * p + b
    assert sim.clock.now() - start == pytest.approx(end + sim.st.learner_step_s, rel=1e-12)
    assert (end == pytest.approx(4 * p + b)) == (b < p)  # link-bound when a transfer outlasts a request
