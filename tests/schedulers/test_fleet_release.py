"""`FleetEngine.release`, `rent` and `admit`: a planned release is no preemption, a released node is
neither used nor paid, and a node rented again pays a join before it serves (on the simulator's
modelled executor, a `ManualClock`, no model)."""

import pytest

from schedulers.clock import ManualClock
from schedulers.fleet import FleetAction, FleetEngine, Node
from schedulers.queue import PullQueue
from schedulers.request import Kind, Request
from spotlight.sim.modelled_executor import ModelledExecutor
from spotlight.sim.step_time import StepTimes, image_tokens

JOIN_S = 50.0
NO_COUNTS = {"notices": 0, "kills": 0, "workers_lost": 0}


class Until:
    def __init__(self, clock, at):
        self.clock, self.deadline = clock, at

    def done(self):
        return self.clock.now() >= self.deadline


def engine(actions=()):
    clock = ManualClock()
    queue = PullQueue(clock, lease_s=1e15)
    executor = ModelledExecutor(clock, queue, StepTimes.profile("tiny-cpu"), 128, image_tokens(128), commit_every=1,
                                join_s=JOIN_S, pending_per_iteration=4, ondemand_devices=1)
    nodes = [Node("ondemand0", spot=False), Node("spot0", spot=True), Node("spot1", spot=True)]
    paid = []
    e = FleetEngine(clock, queue, executor, nodes, actions, replay_phases=("rollout", "train", "idle"),
                    on_fleet=lambda: paid.append((clock.now(), e.spot_devices())))
    e.paid = paid
    e.start()
    return e


def rollout(e, version):
    e.rollout([Request(f"it{version}/r{k}", Kind.ROLLOUT, k, "", (0,), weight_version=version) for k in range(8)],
              version)


def serving_nodes(e):
    return {m.split("#")[0] for m in e.executor.alive}


def test_a_released_node_is_not_preempted_used_or_paid():
    e = engine()
    rollout(e, 0)
    assert serving_nodes(e) == {"spot0", "spot1"}
    e.release("spot1")
    assert e.releases == 1 and e.counters == NO_COUNTS  # planned: no notice, no kill, no worker lost
    assert e.spot_devices() == 1 and e.paid[-1] == (e.clock.now(), 1)  # paid no more from now
    assert e.nodes["spot1"].released and not e.nodes["spot1"].alive
    assert not any("spot1" in w.nodes for w in e.workers.values())
    rollout(e, 1)
    assert serving_nodes(e) == {"spot0"}
    assert e.queue.stats()["requests_completed"] == 16 and e.queue.stats()["requests_requeued"] == 0
    with pytest.raises(ValueError, match="not a live spot node"):
        e.release("spot1")
    with pytest.raises(ValueError, match="not a live spot node"):
        e.release("ondemand0")


def test_a_node_rented_again_pays_a_join_before_it_serves():
    e = engine()
    e.wait(Until(e.clock, 10.0))
    e.release("spot1")
    e.rent("spot1")  # at 10 s: paid from now, serving at 60 s
    assert e.spot_devices() == 2 and e.paid[-1] == (10.0, 2)
    assert e.nodes["spot1"].generation == 2 and serving_nodes(e) == {"spot0"}
    e.release("spot1")
    e.wait(Until(e.clock, 30.0))
    e.rent("spot1")  # again, at 30 s: the join of 10 s is void, this one serves at 80 s
    e.wait(Until(e.clock, 79.0))
    assert serving_nodes(e) == {"spot0"}
    e.wait(Until(e.clock, 81.0))
    assert serving_nodes(e) == {"spot0", "spot1"}
    with pytest.raises(ValueError, match="not on offer"):
        e.rent("spot1")
    assert e.releases == 2 and e.counters == NO_COUNTS


def test_admit_leaves_an_added_node_on_offer_and_the_provider_withdraws_it():
    actions = [FleetAction(20.0, "spot2", "add"), FleetAction(40.0, "spot1", "notice"),
               FleetAction(60.0, "spot1", "kill"), FleetAction(70.0, "spot2", "kill")]
    e = engine(actions)
    e.release("spot1")
    e.admit = lambda node: False  # hold what is held
    e.wait(Until(e.clock, 30.0))
    assert e.nodes["spot2"].released and not e.nodes["spot2"].alive and e.spot_devices() == 1
    e.wait(Until(e.clock, 65.0))
    # the provider takes back the released node: the offer is withdrawn, and it is no preemption
    assert not e.nodes["spot1"].released and e.counters == NO_COUNTS
    with pytest.raises(ValueError, match="not on offer"):
        e.rent("spot1")
    e.rent("spot2")
    e.wait(Until(e.clock, 75.0))
    assert e.counters == {"notices": 0, "kills": 1, "workers_lost": 1}  # a held node killed: a preemption
