import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from spotlight.checkpoints import checkpoint
from spotlight.config import ConfigError, to_yaml
from spotlight.train.trainer import Trainer, summarize

from conftest import small_dit_config, small_llm_config

_LORA = {"lora": {"rank": 4, "alpha": 8}}
CONFIGS = {"dit": small_dit_config, "llm": small_llm_config,
           # LoRA: checkpoints and final/ hold the adapters alone; the base is rebuilt on resume.
           "dit-lora": lambda **over: small_dit_config(policy=_LORA, **over),
           "llm-lora": lambda **over: small_llm_config(policy=_LORA, **over)}


def _final_weights(out):
    (weights,) = (out / "final").glob("*.safetensors")
    return load_file(str(weights))


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_resume_from_checkpoint_gives_the_same_weights_as_an_uninterrupted_run(tmp_path, kind):
    cfg = CONFIGS[kind]()
    Trainer(cfg, tmp_path / "straight", progress=False).build().train()

    # the same run stopped after 2 of 4 iterations, then started again on the same folder
    stopped = CONFIGS[kind](train={"steps": 2})
    Trainer(stopped, tmp_path / "resumed", progress=False).build().train()
    resumed = Trainer(cfg, tmp_path / "resumed", progress=False).build()
    assert resumed.start_step == 2
    summary = resumed.train()

    a, b = _final_weights(tmp_path / "straight"), _final_weights(tmp_path / "resumed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if kind.endswith("lora"):  # the adapters, trained away from their zero start
        assert all("lora_" in k for k in a) and any(float(a[k].abs().sum()) > 0 for k in a if "lora_B" in k)
    rows = [json.loads(l) for l in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    straight = [json.loads(l) for l in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert [r["reward_mean"] for r in rows] == [r["reward_mean"] for r in straight]
    assert summary["resumed_from"] == 2 and summary["steps"] == 4


def test_the_queue_keeps_no_result_after_the_run_has_used_it(tmp_path):
    """Rollouts (whole trajectories), evaluations and exploration samples are released from the
    queue once used: a queue that kept every iteration's would grow until it ran out of memory."""
    explore = {"enabled": True, "planner": "bandit", "samples_per_step": 16, "candidates_per_prompt": 12,
               "request_size": 4, "round_samples": 8}
    cfg = small_dit_config(train={"steps": 3, "eval_prompts": 2}, exploration=explore)
    trainer = Trainer(cfg, tmp_path, progress=False).build()
    queue = trainer.runtime.queue
    seen = []
    iteration = trainer.iteration

    def watched(step):
        row = iteration(step)
        seen.append(queue.stats()["results_held"])
        return row

    trainer.iteration = watched
    summary = trainer.train()
    assert summary["requests_completed"] > 3 * 2 and summary["queue_results_held"] == 0
    assert seen == [0, 0, 0]  # after every iteration, not just at the end


def test_a_crash_mid_run_resumes_from_the_newest_complete_checkpoint(tmp_path):
    cfg = small_dit_config(train={"steps": 3, "checkpoint_every": 1})
    t = Trainer(cfg, tmp_path, progress=False).build()
    original = t.iteration
    calls = []

    def crash_on_third(step):
        calls.append(step)
        if step == 2:
            raise RuntimeError("preempted")
        return original(step)

    t.iteration = crash_on_third
    with pytest.raises(RuntimeError):
        t.train()
    # a half-written checkpoint folder is never taken for a complete one
    (tmp_path / "checkpoints" / ".tmp-step-000003").mkdir()
    assert checkpoint.latest(tmp_path / "checkpoints").step == 2
    again = Trainer(cfg, tmp_path, progress=False).build()
    assert again.start_step == 2
    assert again.train()["steps"] == 3


def test_resuming_with_another_config_is_refused(tmp_path):
    Trainer(small_dit_config(train={"steps": 2}), tmp_path, progress=False).build().train()
    with pytest.raises(ConfigError, match=r"holds checkpoints of another run \(step-000002: .*train\.lr"):
        Trainer(small_dit_config(train={"lr": 3e-4}), tmp_path, progress=False).build()
    # more iterations, or another place to run them, is the same run
    again = Trainer(small_dit_config(train={"steps": 3}, runtime={"lease_s": 5.0}), tmp_path, progress=False).build()
    assert again.start_step == 2


def test_cli_train_writes_metrics_summary_and_loadable_final_weights(tmp_path):
    cfg = small_dit_config(train={"steps": 3})
    path = tmp_path / "run.yaml"
    path.write_text(to_yaml(cfg))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "spotlight.cli", "train", str(path), "--out", str(out),
                           "--steps", "2", "--seed", "3", "--no-progress"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        assert {"step", "reward_mean", "reward_std", "wall_s"} <= r.keys()
        assert 0 <= r["reward_mean"] <= 1 and r["wall_s"] > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2
    assert summary["reward_first"] == rows[0]["reward_mean"] and summary["reward_last"] == rows[1]["reward_mean"]
    assert "seed: 3" in (out / "config.yaml").read_text()
    assert list((out / "tb").glob("events.out.tfevents.*"))

    from diffusers import QwenImageTransformer2DModel

    model = QwenImageTransformer2DModel.from_pretrained(str(out / "final"))
    assert model.config.num_layers == 2


def test_summary_standard_error_by_hand(tmp_path):
    path = tmp_path / "m.jsonl"
    rewards = [0.1, 0.2, 0.3, 0.5, 0.6, 0.7]
    path.write_text("".join(json.dumps({"step": i, "reward_mean": r, "wall_s": 1.0}) + "\n" for i, r in enumerate(rewards)))
    s = summarize(path, 6, window=3)
    assert s["reward_first3"] == pytest.approx(0.2) and s["reward_last3"] == pytest.approx(0.6)
    assert s["improvement_stderr"] == pytest.approx((0.01 / 3 + 0.01 / 3) ** 0.5)
    assert s["improvement_se"] == pytest.approx(0.4 / (0.02 / 3) ** 0.5)


def test_a_budget_too_small_for_one_iteration_stops_before_it_with_a_summary(tmp_path):
    """`--budget-usd` below the first iteration's forecast: the run stops before iteration 0, as
    the budget says, and still ends with its summary and final/ (it raised FileNotFoundError for
    the metrics.jsonl no iteration had written)."""
    # above the a-priori floor (one iteration's lower bound, ~$0.00014 here), below the first
    # iteration's forecast with a clean stop (~$0.0036)
    cfg = small_dit_config(train={"steps": 2}, warm_start={"steps": 0}, cloud={"budget_usd": 0.0003})
    summary = Trainer(cfg, tmp_path, progress=False).build().train()
    assert summary["stop_reason"] == "budget" and summary["steps"] == 0 and summary["steps_requested"] == 2
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 0
    assert (tmp_path / "final").is_dir() and not (tmp_path / "metrics.jsonl").exists()


def test_dropping_zero_advantage_groups_changes_the_update_and_resumes_bit_identically(tmp_path):
    """Exact-match rewards leave many LLM groups all wrong (all advantages zero): with
    `grpo.drop_zero_advantage_groups` they are left out of the update, which then takes a larger step."""
    on = {"drop_zero_advantage_groups": True}
    dropping = Trainer(small_llm_config(grpo=on), tmp_path / "on", progress=False).build().train()
    Trainer(small_llm_config(), tmp_path / "off", progress=False).build().train()
    rows = [json.loads(line) for line in (tmp_path / "on" / "metrics.jsonl").read_text().splitlines()]
    dropped = [r["groups_dropped"] for r in rows]
    assert sum(dropped) > 0 and all(0 <= d < 4 for d in dropped), dropped  # of 4 groups; one is always kept
    assert "groups_dropped" not in json.loads((tmp_path / "off" / "metrics.jsonl").read_text().splitlines()[0])
    a, b = _final_weights(tmp_path / "on"), _final_weights(tmp_path / "off")
    assert any(not torch.equal(a[k], b[k]) for k in a)
    Trainer(small_llm_config(grpo=on, train={"steps": 2}), tmp_path / "resumed", progress=False).build().train()
    Trainer(small_llm_config(grpo=on), tmp_path / "resumed", progress=False).build().train()
    c = _final_weights(tmp_path / "resumed")
    assert all(torch.equal(a[k], c[k]) for k in a) and dropping["steps"] == 4
