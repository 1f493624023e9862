"""The byte model of an iteration's transfers (`spotlight.sim.transfers`) and the step-time fields
derived from it: its counts against the real Qwen-Image module and against the bytes the live
runtime moves — measured on the Ray runtime, with and without LoRA, one micro-batch per request
and two summed on the worker, every request's gradient crossing from a worker actor through the
queue actor to the learner actor — and the derived, given and refused figures of the profiles."""

import json
import math
from dataclasses import replace

import pytest

from spotlight.config import ConfigError
from spotlight.rl.dit_model import QWEN_IMAGE_TRANSFORMER, transformer_arch
from spotlight.sim import transfers
from spotlight.sim.step_time import (GPU_MEMORY_GIB, PROFILES, Derived, StepTimes, notice_s_for, trace_provider,
                                     update_memory_refusal)
from spotlight.sim.transfers import DiTShape
from spotlight.iteration.iteration_time import PEAK_BF16_FLOPS

from conftest import small_dit_config

TINY_DTYPE_BYTES = 4
"""The tiny preset runs in float32, base and adapters alike."""


def test_the_parameter_counts_are_the_real_modules():
    import torch
    from diffusers import QwenImageTransformer2DModel

    from spotlight.config import default_config
    from spotlight.rl.lora import add_lora, trainable

    shape = DiTShape.from_arch(QWEN_IMAGE_TRANSFORMER)
    with torch.device("meta"):  # 20.4B parameters, no memory
        model = QwenImageTransformer2DModel(**QWEN_IMAGE_TRANSFORMER)
        assert sum(p.numel() for p in model.parameters()) == shape.params() == 20_430_401_088
        add_lora(model, default_config({"policy": {"dit": {"preset": "qwen-image"},
                                                   "lora": {"rank": 64, "alpha": 128}}}))
    assert sum(p.numel() for p in trainable(model)) == shape.adapter_params(64) == 424_673_280
    # The docs' figures: 1.7 GB of float32 adapters at rank 64, 41 GB of bf16 weights.
    assert transfers.publication_bytes(shape, 64) == 1_698_693_120
    assert transfers.publication_bytes(shape, 0) == 40_860_802_176
    with pytest.raises(ValueError, match="no linear"):
        shape.adapter_params(4, ["norm_q"])


def test_seconds_are_bytes_over_links():
    # 1 GB over 80 Gbit/s at half its bandwidth: 0.2 s
    assert transfers.transfer_s(1e9, 80.0, 0.5) == pytest.approx(0.2)
    # The default grain: 512 micro-batches (1,024 samples x 2 SDE steps / 4 rows) in requests of 8: 64 gradients.
    assert StepTimes().gradient_requests == 64 and StepTimes().ingress_bytes == 64 * StepTimes().part_bytes
    st = StepTimes(gradient_parts=32, parts_per_request=1)
    assert st.publication_bytes == 1_698_693_120 and st.ingress_bytes == 32 * st.part_bytes
    assert st.weight_sync_s == pytest.approx(1_698_693_120 * 8 / (100e9 * 0.5) + 1_698_693_120 * 8 / 200e9)
    assert st.part_bytes == (424_673_280 - 2_359_296) * 4  # the last block's text tail gets no gradient
    assert st.update_round_s == pytest.approx(32 * st.part_bytes * 8 / (100e9 * 0.5) + 1.0)
    # Micro-batches summed per request: one gradient per request reaches the learner, the last
    # request short when k does not divide the parts (32 / 3: 11 requests).
    assert [replace(st, parts_per_request=k).gradient_requests for k in (1, 2, 3, 32, 64)] == [32, 16, 11, 1, 1]
    assert replace(st, parts_per_request=3).ingress_bytes == 11 * st.part_bytes
    assert replace(st, parts_per_request=2).update_round_s == pytest.approx(16 * st.part_bytes * 8 / 50e9 + 1.0)
    full = replace(StepTimes.profile("qwen-image-full"), gradient_parts=32, parts_per_request=1)
    assert full.weight_sync_s == pytest.approx(8.17, abs=0.01) and full.update_round_s == pytest.approx(209.3, abs=0.1)
    assert StepTimes.profile("qwen-image") == StepTimes.profile("qwen-image-full")


def test_a_given_figure_wins_and_a_derived_one_follows_its_fields(tmp_path):
    st = StepTimes()
    assert st.is_derived("weight_sync_s") and isinstance(st.weight_sync_s, Derived)
    # replace: a derived figure is derived again from the new fields; a given one is kept
    assert replace(st, lora_rank=0).weight_sync_s == StepTimes.profile("qwen-image-full").weight_sync_s
    assert replace(st, node_gbps=50.0, learner_gbps=50.0).update_round_s > st.update_round_s
    given = replace(st, weight_sync_s=3.0)
    assert not given.is_derived("weight_sync_s") and replace(given, lora_rank=0).weight_sync_s == 3.0
    assert StepTimes.profile("tiny-cpu").weight_sync_s == 0.01 and StepTimes.profile("tiny-cpu").update_round_s == 0.0
    # a step-time file: what it sets wins, what it leaves out is derived from its fields
    (tmp_path / "a.yaml").write_text("weight_sync_s: 8\n")
    (tmp_path / "b.yaml").write_text("profile: qwen-image-full\nlora_rank: 16\n")
    assert StepTimes.load(tmp_path / "a.yaml").weight_sync_s == 8.0
    b = StepTimes.load(tmp_path / "b.yaml")
    assert b.weight_sync_s == pytest.approx(replace(st, lora_rank=16, denoise_steps=20).weight_sync_s)
    assert b.publication_bytes == DiTShape.from_arch(QWEN_IMAGE_TRANSFORMER).adapter_params(16) * 4
    json.dumps({"weight_sync_s": st.weight_sync_s})  # a result carries it as a number
    with pytest.raises(ConfigError, match="step_times.model"):
        StepTimes(model="sd3")
    with pytest.raises(ConfigError, match="cross_zone_factor"):
        StepTimes(cross_zone_factor=1.5)
    with pytest.raises(ConfigError, match="derived .* beyond"):
        StepTimes(lora_rank=0, learner_gbps=1e-3)


def test_a_full_fine_tune_does_not_fit_a_spot_h100_and_lora_does():
    line = update_memory_refusal(replace(StepTimes.profile("qwen-image-full"), parts_per_request=1))
    assert line == ("qwen-image full fine-tune: a spot H100 (80 GiB) cannot hold 38 GiB of weights, 38 GiB of "
                    "gradients and 7.2 GiB of activations and runtime (83 GiB); the update runs on the learner's GPUs")
    # Requests of several micro-batches (the default 8): a crew's lead holds the running sum beside a part.
    assert "76 GiB of gradients" in update_memory_refusal(StepTimes.profile("qwen-image-full"))
    assert update_memory_refusal(StepTimes()) is None
    assert update_memory_refusal(StepTimes(lora_rank=0, gpu="H200")) is None  # 141 GiB holds both
    assert update_memory_refusal(StepTimes(gpu="A100")) is not None  # 40 GiB: not even the bf16 base
    assert update_memory_refusal(StepTimes.profile("tiny-cpu")) is None  # no GPU
    assert set(GPU_MEMORY_GIB) == set(PEAK_BF16_FLOPS)  # every GPU the FLOP model knows has a memory
    assert PROFILES[0] == "qwen-image-lora" and StepTimes.profile(PROFILES[0]) == StepTimes()


def test_a_trace_names_its_provider_and_its_notice():
    from schedulers.trace_synth import open_trace
    from schedulers.traces import Trace, TraceEvent

    def named(source, node="node1"):
        return Trace([TraceEvent(0.0, "add", node)], source)

    assert trace_provider(open_trace("experiments/traces/bamboo-p3.csv")) == "aws"
    assert trace_provider(open_trace("experiments/traces/bamboo-g4dn.csv")) == "aws"
    assert trace_provider(open_trace("experiments/traces/bamboo-gcloud-a100x1-east1b.txt")) == "gcp"
    assert trace_provider(named("/x/16-node/aws-08-27-2023/us-east-2b_v100_1.json", "sky-1")) == "aws"
    assert trace_provider(named("us-west-2a_v100_1.json", "sky-1")) == "aws"
    assert trace_provider(named("counts-us-central1-a.csv", "n-1")) == "gcp"
    assert trace_provider(named("my-trace.csv", "n-1")) is None
    assert trace_provider(open_trace("synth:poisson?hours=1&seed=3")) is None
    assert (notice_s_for("aws"), notice_s_for("gcp")) == (120.0, 30.0)
    with pytest.raises(ConfigError, match="provider"):
        notice_s_for("ibm")


@pytest.fixture(scope="module")
def ray_cluster_here():
    """One local Ray cluster for both runs (each run would otherwise start its own)."""
    from spotlight.runtime import ray_cluster

    started = ray_cluster.connect(small_dit_config(runtime={"kind": "ray"}).runtime)
    yield
    if started:
        ray_cluster.shutdown()


@pytest.mark.parametrize("rank, per_request", [(0, 1), (4, 2)])
def test_the_live_fleet_update_moves_the_bytes_the_model_counts(tmp_path, ray_cluster_here, rank, per_request):
    """One grain: the live Ray runtime's update moves the requests, gradients and bytes the byte model
    counts, and `spotlight simulate --config` of the same config simulates the same ones."""
    from schedulers.traces import Trace, TraceEvent
    from spotlight.runtime.ray_runtime import RayRuntime
    from spotlight.sim.run_config import POLICY, simulate_run
    from spotlight.train.trainer import Trainer

    rounds, micro_batch = 2, 4
    cfg = small_dit_config(train={"steps": 1, "prompts_per_step": 2, "group_size": 4, "checkpoint_every": 1,
                                  "micro_batch": micro_batch, "updates_per_step": rounds, "update_on": "fleet",
                                  "parts_per_request": per_request},
                           policy={"lora": {"rank": rank, "alpha": 2 * max(rank, 1)}},
                           runtime={"kind": "ray", "spot_workers": 1, "ondemand_workers": 0})
    Trainer(cfg, tmp_path, progress=False).build(RayRuntime(cfg)).train()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]

    shape = DiTShape.from_arch(transformer_arch(cfg.policy.dit))
    part = transfers.part_bytes(shape, rank, TINY_DTYPE_BYTES, TINY_DTYPE_BYTES)
    # (sample, SDE step) rows of an update, `micro_batch` a part, `per_request` parts summed in a
    # request (one gradient sent each), every round its own requests
    parts = math.ceil(2 * 4 * cfg.sampler.num_steps / micro_batch)
    for row in rows:
        assert row["update_on_fleet"] and row["gradient_parts"] == rounds * transfers.requests(parts, per_request), row
        assert row["update_gradient_bytes"] == rounds * transfers.ingress_bytes(parts, part, per_request)
        assert row["publish_bytes"] == transfers.publication_bytes(shape, rank, TINY_DTYPE_BYTES, TINY_DTYPE_BYTES)
    # The tiny DiT: 89,328 parameters, 9,216 adapter ones at rank 4; the last block's text tail
    # (9,408 and 1,536 of them) gets no gradient, so a part is smaller than a publication.
    assert rows[0]["publish_bytes"] == (9_216 if rank == 4 else 89_328) * TINY_DTYPE_BYTES
    assert part == ((9_216 - 1_536) if rank == 4 else (89_328 - 9_408)) * TINY_DTYPE_BYTES
    # The simulator at the same grain: its TRAIN requests, one gradient each, are the runtime's.
    simulated = simulate_run(cfg, Trace([TraceEvent(0.0, "add", "n0")], "one spot node"))["policies"][POLICY]
    keys = ("update_on_fleet", "gradient_parts", "update_gradient_bytes")
    assert [{k: r[k] for k in keys} for r in simulated["iterations_log"]] == [{k: r[k] for k in keys} for r in rows]


def test_a_full_fine_tunes_learner_group_pays_its_collectives_and_its_gpus():
    """A full fine-tune on a learner group of N (`train.learner_gpus`, the runtime's FSDP2 group):
    each rank's micro-batch pass moves (N - 1) / N of every parameter twice in bf16 (the forward's
    and the backward's all-gather) and once in float32 (the reduce-scatter), overlapped with the
    compute; the round is ceil(parts / N) such passes. A simulated run config pays for the group's
    GPUs beside the rollout's."""
    from schedulers.traces import Trace, TraceEvent
    from spotlight.config import default_config
    from spotlight.sim.run_config import POLICY, simulate_run
    from spotlight.train.cost_control import fleet_of

    shape = DiTShape.from_arch(QWEN_IMAGE_TRANSFORMER)
    assert transfers.group_pass_bytes(shape, 1) == 0
    assert transfers.group_pass_bytes(shape, 8) == 7 * 20_430_401_088 * (2 + 2 + 4) // 8
    full = replace(StepTimes.profile("qwen-image-full"), gradient_parts=32)
    one = full.group_round_s(512, 64, 1)
    assert one == full.train_gpu_s(512, 64)  # one learner: no collective, no data-parallel loss
    for n, passes in ((2, 16), (8, 4), (5, 7)):  # compute-bound over NVLink
        assert full.group_round_s(512, 64, n) == pytest.approx(passes * one / 32)
    slow = replace(full, group_gbps=10.0)  # traffic-bound over a slow link
    assert slow.group_round_s(512, 64, 8) == pytest.approx(4 * transfers.group_pass_bytes(shape, 8) * 8 / 10e9)

    runs, paid = {}, {}
    for n in (1, 4):
        cfg = default_config({"device": "cuda", "policy": {"dit": {"preset": "qwen-image", "resolution": 512}},
                              "warm_start": {"steps": 0}, "runtime": {"kind": "local"}, "cloud": {"gpus_per_node": 4},
                              "train": {"learner_gpus": n, "steps": 2, "prompts_per_step": 4, "group_size": 4,
                                        "micro_batch": 4}})
        runs[n] = simulate_run(cfg, Trace([TraceEvent(0.0, "add", "n0")], "one node"))["policies"][POLICY]
        paid[n] = fleet_of(cfg)
    assert runs[1]["ondemand_gpus_held"] == 1 and runs[4]["ondemand_gpus_held"] == 4
    # The run's meter prices whole nodes: the head's 4 GPUs hold the group, paid with or without it.
    assert paid[4] == paid[1]
    (u1, u4) = [[r["time_update_s"] for r in runs[n]["iterations_log"]] for n in (1, 4)]
    assert u4 == pytest.approx([u / 4 for u in u1])  # 32 rows in micro-batches of 4: 8 parts, 2 a rank
    assert runs[4]["ondemand_gpu_h"] == pytest.approx(4 * runs[4]["wall_h"]) and runs[4]["spot_gpu_h"] == 0
