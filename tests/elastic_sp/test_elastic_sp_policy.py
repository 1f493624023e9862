"""The regroup policy: a pure function of devices, tokens, heads and a step-time model."""

from __future__ import annotations

import pytest

from elastic_sp.regroup_policy import (
    MeasuredStepTime,
    UlyssesStepTime,
    check_degree,
    plan_degrees,
    regroup,
    valid_degrees,
)

# Compute-bound steps (wider is faster) and communication-bound ones (width only costs).
COMPUTE = MeasuredStepTime(seq_len=64, seconds={1: 4.0, 2: 2.1, 3: 1.5, 4: 1.2, 6: 0.9, 8: 0.8})
COMM = MeasuredStepTime(seq_len=64, seconds={1: 1.0, 2: 1.5, 4: 2.0})


def test_impossible_degrees_are_clear_errors():
    with pytest.raises(ValueError, match=r"SP degree 3 does not divide the model's 4 attention heads \(4 % 3 = 1\)"):
        check_degree(4, 3)
    with pytest.raises(ValueError, match=r"SP degree 8 exceeds the model's 4 attention heads"):
        check_degree(4, 8)
    with pytest.raises(ValueError, match=r"SP degree 4 needs 4 devices, only 3 alive"):
        check_degree(8, 4, devices=3)
    with pytest.raises(ValueError, match="must be >= 1"):
        check_degree(4, 0)
    check_degree(24, 6, devices=8)  # Qwen-Image's 24 heads split 6 ways


def test_valid_degrees_respect_heads_devices_and_the_memory_floor():
    assert valid_degrees(24) == [1, 2, 3, 4, 6, 8, 12, 24]
    assert valid_degrees(24, devices=5) == [1, 2, 3, 4]
    assert valid_degrees(4, devices=4, seq_len=64, max_tokens_per_device=16) == [4]
    assert valid_degrees(4, devices=3, seq_len=64, max_tokens_per_device=16) == []


def test_one_request_goes_to_the_fastest_group_and_many_to_many_groups():
    assert plan_degrees(4, 64, 4, COMPUTE, pending=1) == [4]
    assert plan_degrees(3, 64, 4, COMPUTE, pending=1) == [2, 1]  # 3 does not divide 4 heads
    # Many requests, communication-bound: every device serves alone.
    assert plan_degrees(4, 64, 4, COMM, pending=8) == [1, 1, 1, 1]
    # 8 requests on 8 devices: one group of 8 runs them one after another (8 * 0.8 = 6.4 s), four
    # groups of 2 two each (2 * 2.1 = 4.2 s), eight groups of 1 all at once (4.0 s).
    assert plan_degrees(8, 64, 8, COMPUTE, pending=8) == [1] * 8
    assert plan_degrees(8, 64, 8, COMPUTE, pending=1) == [8]


def test_memory_floor_and_no_valid_group():
    # At most 32 of the 64 tokens per device: degree >= 2. 4 requests: 2x2 takes 2 * 2.1 = 4.2 s,
    # 1x4 takes 4 * 1.2 = 4.8 s; the fifth device stays free (a group of 1 would not fit).
    assert plan_degrees(5, 64, 4, COMPUTE, pending=4, max_tokens_per_device=32) == [2, 2]
    assert plan_degrees(1, 64, 4, COMPUTE, max_tokens_per_device=32) == []
    with pytest.raises(ValueError):
        plan_degrees(-1, 64, 4, COMPUTE)


def test_default_step_time_model_prefers_sp_at_qwen_image_resolution():
    model = UlyssesStepTime()
    tokens = (1024 // 16) ** 2  # a 1024x1024 image: 4096 packed latent tokens
    assert model(tokens, 8) < model(tokens, 4) < model(tokens, 2) < model(tokens, 1)
    assert plan_degrees(8, tokens, 24, model, pending=1) == [8]


def test_regroup_keeps_busy_intact_groups_and_replans_the_rest():
    alive = {"a0": "n0", "a1": "n0", "a2": "n0", "a3": "n0", "b0": "n1", "b1": "n1"}
    groups = [["a0", "a1"], ["a2", "a3", "x"], ["b0", "b1"]]  # x (a member of group 1) was lost
    plan = regroup(groups, busy={0, 1}, alive=alive, seq_len=64, heads=4, step_time=COMPUTE, pending=1)
    assert plan.keep == [["a0", "a1"]]  # busy and intact: untouched
    # a2, a3 (survivors) and the idle b0, b1 are pooled: one request waiting -> the widest group,
    # which must span the nodes (no node has 4 free).
    assert plan.form == [["a2", "a3", "b0", "b1"]]
    assert plan.free == []


def test_regroup_places_groups_on_one_node_and_leaves_identical_idle_groups_alone():
    alive = {"a0": "n0", "a1": "n0", "b0": "n1", "b1": "n1", "b2": "n1"}
    plan = regroup([], busy=set(), alive=alive, seq_len=64, heads=4, step_time=COMPUTE, pending=2)
    # Two requests: 2+2+1 (both done in 2.1 s) beats 4+1 (1.2 + 1.2 s); each pair on one node.
    assert plan.form == [["a0", "a1"], ["b0", "b1"], ["b2"]]
    again = regroup(plan.form, busy=set(), alive=alive, seq_len=64, heads=4, step_time=COMPUTE, pending=2)
    assert again.keep == plan.form and again.form == []  # idle groups planned again stay formed


def test_regroup_after_a_loss_shrinks_the_group_to_a_degree_the_heads_allow():
    alive = {"m0": "n0", "m1": "n0", "m3": "n0"}  # m2 died
    plan = regroup([["m0", "m1", "m2", "m3"]], busy={0}, alive=alive, seq_len=64, heads=4,
                   step_time=COMPUTE, pending=1)
    assert plan.keep == [] and plan.form == [["m0", "m1"], ["m3"]]
    assert plan.degrees == [2, 1]
