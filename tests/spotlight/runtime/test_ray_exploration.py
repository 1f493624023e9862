"""Exploration on the Ray runtime: the idle spot workers explore while the learner trains.

With a sample budget the run is deterministic, so it ends with the weights of the in-process run;
with a train-time budget exploration never delays an iteration: when the learner publishes new
weights, what is still in flight is cancelled and the next rollout starts at once."""

import json

import pytest
import torch
from safetensors.torch import load_file

from spotlight.train.trainer import Trainer

from conftest import small_dit_config

EXPLORE = {"enabled": True, "planner": "bandit", "samples_per_step": 16, "candidates_per_prompt": 12,
           "request_size": 4, "round_samples": 8}


def _run(tmp_path, name, cfg):
    Trainer(cfg, tmp_path / name, progress=False).build().train()
    (weights,) = (tmp_path / name / "final").glob("*.safetensors")
    rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return load_file(str(weights)), rows


@pytest.mark.slow
def test_sample_budgeted_exploration_on_ray_ends_with_the_in_process_weights(tmp_path):
    runtime = {"kind": "ray", "spot_workers": 2, "ondemand_workers": 1}
    ray_weights, ray_rows = _run(tmp_path, "ray", small_dit_config(exploration=EXPLORE, runtime=runtime))
    local_weights, local_rows = _run(tmp_path, "local", small_dit_config(exploration=EXPLORE))
    assert [r["explored_samples"] for r in ray_rows] == [16, 16, 16, 16]
    assert [r["reward_mean"] for r in ray_rows] == [r["reward_mean"] for r in local_rows]
    assert all(torch.equal(ray_weights[k], local_weights[k]) for k in local_weights)
    for name in ("ray", "local"):  # every rollout and exploration result was released once used
        assert json.loads((tmp_path / name / "summary.json").read_text())["queue_results_held"] == 0


@pytest.mark.slow
def test_time_budgeted_exploration_is_cancelled_when_weights_are_published(tmp_path):
    # Exploration requests far slower than an update (16 samples x 48 steps each, with a heartbeat
    # per step), and more of them than any train phase can take: every train phase ends with
    # exploration in flight. Waiting for it would cost a whole request; cancelling costs a poll.
    cfg = small_dit_config(
        exploration={**EXPLORE, "budget_source": "train_time", "num_steps": 48, "request_size": 16,
                     "candidates_per_prompt": 64, "round_samples": 128},
        runtime={"kind": "ray", "spot_workers": 2, "ondemand_workers": 1})
    _, rows = _run(tmp_path, "ray", cfg)
    phases = rows
    assert all(r["explore_cancelled"] >= 1 for r in phases), phases
    assert all(r["time_publish_wait_s"] < 0.25 for r in phases), [r["time_publish_wait_s"] for r in phases]
    # Cancelled exploration leaves no result behind either (completed-but-unscored ones included).
    assert json.loads((tmp_path / "ray" / "summary.json").read_text())["queue_results_held"] == 0
