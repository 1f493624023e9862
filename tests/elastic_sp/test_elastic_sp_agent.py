"""Member processes under a node agent: in-place regrouping after a SIGKILL, resuming from the
committed step, and where a new member's weights come from.

Real processes (a fork server with torch and diffusers preloaded), real gloo groups on 127.0.0.1
with ports the OS picks, the real PullQueue; nothing is mocked. Every test closes its
coordinator, which stops or kills every member it started.
"""

from __future__ import annotations

import os

import pytest
import torch

from elastic_sp.agent import NodeAgent
from elastic_sp.coordinator import Coordinator
from elastic_sp.regroup_policy import UlyssesStepTime
from elastic_sp.weights import NodeWeights, copy_into, digest
from schedulers.clock import WallClock
from schedulers.queue import PullQueue
from schedulers.request import Kind, Request
from spotlight.config import default_config
from spotlight.rl.sp_member import serve_spec, tiny_arch

SPEC = serve_spec(default_config({"sampler": {"num_steps": 6}}), arch=tiny_arch(2), timeout_s=30.0)


def request(rid: str) -> Request:
    return Request(rid, Kind.ROLLOUT, prompt_id=3, prompt_text="a red image", seeds=(11, 12), weight_version=0)


def assert_no_members_left(coord: Coordinator) -> None:
    for h in coord.members.values():
        assert not h.process.is_alive(), f"member {h.name} (pid {h.pid}) outlived close()"
        with pytest.raises(ProcessLookupError):
            os.kill(h.pid, 0)  # reaped, not a zombie


@pytest.fixture
def source_weights():
    return NodeWeights.share(SPEC.build_model().state_dict())


def three_members(source_weights) -> tuple[PullQueue, Coordinator]:
    """Three members on one node, formed. At most 32 of the 64 image tokens per device: the policy
    forms one group of 2 and keeps the third member spare."""
    queue = PullQueue(WallClock(), lease_s=600.0)
    coord = Coordinator(SPEC, [NodeAgent("n0", SPEC, source_weights)], queue, step_time=UlyssesStepTime(),
                        max_tokens_per_device=32)
    try:
        for name in ("m0", "m1", "m2"):
            coord.add("n0", name)
        coord.wait_ready()
        coord.wait_formed()
    except BaseException:
        coord.close()
        raise
    return queue, coord


def serve_to_step(queue: PullQueue, coord: Coordinator, rid: str, step: int) -> None:
    """Put request `rid` and serve it until it has committed `step`."""
    queue.put(request(rid))
    coord.plan()
    coord.run_until(lambda: any(e.kind == "committed" and e.data["request"] == rid
                                and e.data["step"] == step for e in coord.events), 120, f"step {step} of {rid}")


def serve_undisturbed_then_disturbed_to_step(queue: PullQueue, coord: Coordinator, step: int) -> None:
    """Serve request "undisturbed" to the end, then "disturbed" until it has committed `step`
    (where a test disturbs it; the two must end equal)."""
    queue.put(request("undisturbed"))
    coord.plan()
    coord.run_until(lambda: queue.is_done(["undisturbed"]), 120, "the undisturbed request")
    serve_to_step(queue, coord, "disturbed", step)


def test_member_killed_mid_rollout_resumes_from_its_committed_step_bit_identically(source_weights):
    # The third member is spare — the one that replaces the member killed below.
    queue, coord = three_members(source_weights)
    try:
        assert [g.members for g in coord.groups.values()] == [["m0", "m1"]]

        serve_undisturbed_then_disturbed_to_step(queue, coord, 3)
        coord.kill("m0")  # rank 0, the member that reports the steps; no notice
        coord.run_until(lambda: queue.is_done(["disturbed"]), 120, "the resumed request")

        ref, got = queue.result("undisturbed"), queue.result("disturbed")
        # Same degree (2) before and after, same shards per rank, weights copied bit for bit, and
        # the sampler's noise is a function of (seed, prompt, step): the resumed sample is the
        # undisturbed one exactly, not just closely.
        assert torch.equal(got.trajectory, ref.trajectory)
        assert torch.equal(got.log_probs, ref.log_probs)
        assert got.step == ref.step == 6

        stats = queue.stats()
        assert stats["requests_resumed"] == 1 and stats["requests_duplicated"] == 0
        assert stats["steps_resumed"] >= 3  # resumed from its committed step, not from 0
        leases = [e.data for e in coord.events if e.kind == "leased" and e.data["request"] == "disturbed"]
        assert leases[0]["step"] == 0 and leases[-1]["step"] >= 3
        final_group = coord.groups[next(iter(coord.groups))]
        assert sorted(final_group.members) == ["m1", "m2"]  # re-formed in place with the spare
        ready = {e.data["member"]: e.data["source"] for e in coord.events if e.kind == "ready"}
        assert ready == {"m0": "node", "m1": "node", "m2": "node"}  # no checkpoint read at all
    finally:
        coord.close()
    assert_no_members_left(coord)


def test_weights_copied_within_a_node_and_over_the_network_equal_the_source(source_weights):
    want = digest(source_weights.tensors)
    fresh = serve_spec(default_config({"seed": 99}), arch=tiny_arch(2)).build_model()
    assert digest(fresh) != want
    copy_into(fresh, source_weights.tensors)  # the intra-node copy itself
    assert digest(fresh) == want

    queue = PullQueue(WallClock(), lease_s=600.0)
    with_copy, empty = NodeAgent("n0", SPEC, source_weights), NodeAgent("n1", SPEC)  # n1: a new node
    coord = Coordinator(SPEC, [with_copy, empty], queue, auto_regroup=False)
    try:
        coord.add("n0", "a0")
        coord.add("n1", "b0")  # n1 has no copy but a0 has one: a peer sends it
        coord.wait_ready()
        coord.wait_formed(coord.form([["a0", "b0"]]))
        coord.run_until(lambda: empty.has_weights, 60, "n1 to keep the weights b0 received")
        coord.add("n1", "b1")  # now from n1's own shared memory
        coord.wait_ready()
        sources = {e.data["member"]: e.data["source"] for e in coord.events if e.kind == "ready"}
        assert sources == {"a0": "node", "b0": "none", "b1": "node"}
        for name in ("a0", "b0", "b1"):
            assert coord.digest(name) == want, name
        assert digest(empty.weights.tensors) == want
        assert digest(with_copy.weights.tensors) == want  # the source was only read
    finally:
        coord.close()
    assert_no_members_left(coord)


def test_retire_with_notice_gives_the_request_back_at_a_step_boundary(source_weights):
    queue, coord = three_members(source_weights)
    try:
        queue.put(request("r"))
        coord.plan()
        coord.run_until(lambda: any(e.kind == "committed" and e.data["step"] == 2 for e in coord.events), 120)
        coord.retire("m1")
        # A re-plan before the group's next commit (another node's death does one) leaves the
        # draining group to give its request back; it used to dissolve it, re-queueing the
        # request as if lost (requests_requeued 1, requests_given_back 0).
        coord.plan()
        coord.run_until(lambda: queue.is_done(["r"]), 120, "the request after the notice")
        stats = queue.stats()
        assert stats["requests_given_back"] == 1 and stats["requests_requeued"] == 0
        assert stats["steps_recomputed"] == 0  # with a notice no finished step is computed twice
        assert not coord.members["m1"].process.is_alive()
        assert sorted(coord.groups[next(iter(coord.groups))].members) == ["m0", "m2"]
        assert queue.result("r").step == 6
    finally:
        coord.close()
    assert_no_members_left(coord)


def test_forming_a_group_of_an_impossible_degree_is_a_clear_error():
    coord = Coordinator(SPEC, [NodeAgent("n0", SPEC)], PullQueue(WallClock()), auto_regroup=False)
    with pytest.raises(ValueError, match=r"SP degree 3 exceeds the model's 2 attention heads"):
        coord.form([["a", "b", "c"]])
    with pytest.raises(ValueError, match=r"members \['a', 'b'\] are not alive and ready"):
        coord.form([["a", "b"]])
    coord.close()


def group_of_two(spec, agent: NodeAgent) -> tuple[PullQueue, Coordinator]:
    """Two members on `agent`'s node, formed into one group of degree 2 (at most 32 of the 64 image
    tokens per device)."""
    queue = PullQueue(WallClock(), lease_s=600.0)
    coord = Coordinator(spec, [agent], queue, step_time=UlyssesStepTime(), max_tokens_per_device=32)
    try:
        for name in ("m0", "m1"):
            coord.add("n0", name)
        coord.wait_ready()
        coord.wait_formed()
        assert [g.degree for g in coord.groups.values()] == [2]
    except BaseException:
        coord.close()
        raise
    return queue, coord


def serve(queue: PullQueue, coord: Coordinator, req: Request):
    """`req` computed to the end by the group; its result."""
    queue.put(req)
    coord.plan()
    coord.run_until(lambda: queue.is_done([req.id]), 120, f"request {req.id}")
    return queue.result(req.id)


def test_a_group_of_two_samples_with_true_cfg_exactly_as_one_process_does():
    """`sampler.guidance` > 1 in SP groups: a member samples with the run's `DiTPolicy`, whose every
    velocity is the guided pair (`DiTPolicy._velocity`), each pass through Ulysses attention — so
    a degree-2 group's guided sample is the single-process guided sample, bit for bit."""
    from spotlight.rl.prompts import Prompt
    from spotlight.rl.sp_member import build_policy

    spec = serve_spec(default_config({"sampler": {"num_steps": 4, "guidance": 4.0}}), arch=tiny_arch(2),
                      timeout_s=30.0)
    model = spec.build_model()
    queue, coord = group_of_two(spec, NodeAgent("n0", spec, NodeWeights.share(model.state_dict())))
    try:
        got = serve(queue, coord, request("guided"))
    finally:
        coord.close()
    prompts = [Prompt(3, "a red image")] * 2
    guided = build_policy(spec, model, "cpu")
    want = guided.advance(prompts, guided.init_state(prompts, [11, 12]))
    assert torch.equal(got.trajectory, want.trajectory) and torch.equal(got.log_probs, want.log_probs)
    plain_spec = serve_spec(default_config({"sampler": {"num_steps": 4}}), arch=tiny_arch(2))
    plain = build_policy(plain_spec, model, "cpu")
    unguided = plain.advance(prompts, plain.init_state(prompts, [11, 12]))
    assert not torch.equal(unguided.trajectory, want.trajectory)  # the guidance is really applied


def test_a_partial_publish_loads_the_lora_adapters_alone_and_the_group_samples_the_trained_model():
    """LoRA in SP groups: members hold the learner's structure (`sp_member.build_model` injects the
    adapters), the node starts from the whole model, and a publish naming only the adapters
    replaces those alone — the group then samples exactly what one process with them samples."""
    from spotlight.rl.lora import trainable, trained_state
    from spotlight.rl.prompts import Prompt
    from spotlight.rl.sp_member import build_policy

    cfg = default_config({"sampler": {"num_steps": 4}, "policy": {"lora": {"rank": 4, "alpha": 8}}})
    spec = serve_spec(cfg, arch=tiny_arch(2), timeout_s=30.0)
    model = spec.build_model()
    prompts = [Prompt(3, "a red image")] * 2
    untrained = build_policy(spec, model, "cpu")
    before = untrained.advance(prompts, untrained.init_state(prompts, [11, 12]))
    agent = NodeAgent("n0", spec, NodeWeights.share(model.state_dict()))
    queue, coord = group_of_two(spec, agent)
    try:
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():  # the learner's update, as far as the node can tell
            for p in trainable(model):
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
        adapters = {k: v.clone() for k, v in trained_state(model).items()}
        frozen = {k: v for k, v in agent.weights.tensors.items() if k not in adapters}
        agent.publish(1, adapters)
        assert agent.weights.version == 1 and len(agent.weights.tensors) == len(model.state_dict())
        assert all(agent.weights.tensors[k] is t for k, t in frozen.items())  # the base is not copied again
        got = serve(queue, coord, Request("trained", Kind.ROLLOUT, prompt_id=3, prompt_text="a red image",
                                          seeds=(11, 12), weight_version=1))
    finally:
        coord.close()
    policy = build_policy(spec, model, "cpu")
    want = policy.advance(prompts, policy.init_state(prompts, [11, 12]))
    assert torch.equal(got.trajectory, want.trajectory) and torch.equal(got.log_probs, want.log_probs)
    assert not torch.equal(got.trajectory, before.trajectory)  # the published adapters were used
