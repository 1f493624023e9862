"""Node agents as Ray actors (`elastic_sp.ray_agent.RayAgent`) driven by a coordinator in this
process, as agents on other nodes are: weights reach a node that has none from a peer and stay
with it; a whole node SIGKILLed mid-rollout (its agent actor's process, and its members with it)
is every member's loss, and the request resumes on the other node bit-identically.

One local Ray cluster, its actors as the nodes; real member processes under them, real gloo
groups; nothing is mocked. (The agent host's command order without Ray, and whole loopback nodes
killed inside a training run: tests/spotlight/runtime/test_sp_train.py.)
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from elastic_sp.coordinator import Coordinator
from elastic_sp.ray_agent import RayAgent
from elastic_sp.regroup_policy import UlyssesStepTime
from elastic_sp.weights import digest
from schedulers.clock import WallClock
from schedulers.queue import PullQueue
from spotlight.config import RuntimeConfig
from tests.elastic_sp.test_elastic_sp_agent import SPEC, serve_to_step, serve_undisturbed_then_disturbed_to_step


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie still answers kill(pid, 0)
        return f.read().split(")")[-1].split()[0] == "Z"


def wait_gone(pids, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(gone(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray cluster for the module (a start is ~10 s on 2 cores), unless one is up already."""
    from spotlight.runtime import ray_cluster

    started = ray_cluster.connect(RuntimeConfig())
    yield
    if started:
        ray_cluster.shutdown()


@pytest.fixture(scope="module")
def state():
    model = SPEC.build_model()
    return model.state_dict(), digest(model)


def test_weights_go_between_agent_actors_through_a_peer_and_stay_with_the_node(local_ray, state):
    weights, want = state
    n0 = RayAgent.start("n0", SPEC, weights)  # the node that starts the deployment
    n1 = RayAgent.start("n1", SPEC)  # a node added later: no weights
    coord = Coordinator(SPEC, [n0, n1], PullQueue(WallClock(), lease_s=600.0), auto_regroup=False)
    try:
        assert len({os.getpid(), n0.where["pid"], n1.where["pid"]}) == 3
        assert n0.has_weights and not n1.has_weights
        with pytest.raises(ValueError, match="no live weights"):  # refused on the node, said here
            n1.spawn("x", "node")
        coord.add("n0", "a0")
        coord.add("n1", "b0")  # from a0, over the group they form
        coord.wait_ready()
        coord.wait_formed(coord.form([["a0", "b0"]]))
        coord.run_until(lambda: n1.has_weights, 60, "n1 to keep the weights b0 received")
        coord.add("n1", "b1")  # from n1's own shared memory, in n1's agent actor
        coord.wait_ready()
        sources = {e.data["member"]: e.data["source"] for e in coord.events if e.kind == "ready"}
        assert sources == {"a0": "node", "b0": "none", "b1": "node"}
        for name in ("a0", "b0", "b1"):
            assert coord.digest(name) == want, name
        members = [h.pid for h in coord.members.values()]
    finally:
        coord.close()
    assert wait_gone(members)  # closing an agent stops its members


def test_losing_a_whole_node_mid_rollout_resumes_the_request_on_the_other_node(local_ray, state):
    weights, _ = state
    nodes = [RayAgent.start("n0", SPEC, weights), RayAgent.start("n1", SPEC, weights)]
    queue = PullQueue(WallClock(), lease_s=600.0)
    # At most 32 of the 64 image tokens per device: groups of 2, so 2 members per node make 2 groups.
    coord = Coordinator(SPEC, nodes, queue, step_time=UlyssesStepTime(), max_tokens_per_device=32)
    try:
        for node in ("n0", "n1"):
            for i in range(2):
                coord.add(node, f"{node}m{i}")
        coord.wait_ready()
        coord.wait_formed()
        serve_undisturbed_then_disturbed_to_step(queue, coord, 3)
        rid = "disturbed"
        for attempt in range(2, 5):
            # A starved coordinator reads a node's reports in batches: step 3 and the request's
            # end can arrive in one poll, and there is nothing left to disturb. The same prompt
            # and seeds under a new id are the same sample: serve it again to step 3.
            serving = next((g for g in coord.groups.values() if g.lease is not None), None)
            if serving is not None:
                break
            rid = f"disturbed-{attempt}"
            serve_to_step(queue, coord, rid, 3)
        assert serving is not None, "the request ended in the poll that committed its step 3, three times"
        lost_node = next(n for n in nodes if n.node == coord.members[serving.members[0]].node)
        doomed = [h.pid for h in coord.members.values() if h.node == lost_node.node]
        os.kill(lost_node.where["pid"], signal.SIGKILL)  # the node is reclaimed: agent and members, no notice
        coord.run_until(lambda: queue.is_done([rid]), 120, "the resumed request")

        ref, got = queue.result("undisturbed"), queue.result(rid)
        assert torch.equal(got.trajectory, ref.trajectory)
        assert torch.equal(got.log_probs, ref.log_probs)
        stats = queue.stats()
        assert stats["requests_resumed"] == 1 and stats["steps_resumed"] >= 3
        lost = {e.data["member"] for e in coord.events if e.kind == "lost"}
        assert lost == {h.name for h in coord.members.values() if h.node == lost_node.node}
        assert wait_gone(doomed)  # members exit when their agent's pipe closes
    finally:
        coord.close()
