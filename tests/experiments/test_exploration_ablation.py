"""`python -m experiments.exploration_ablation --quick`: the CLI's smoke test, through a subprocess so
that stdout is checked to hold exactly the one JSON object."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spotlight.config import load_config

ROOT = Path(__file__).resolve().parents[2]
ARM_FIELDS = {"iterations_to_target", "iterations_to_target_per_seed", "reached", "final_reward",
              "mean_group_reward_std", "stale_rank_spearman_mean", "explored_samples_per_step", "wall_s"}
# --quick sizes (experiments/exploration_ablation.py QUICK): 4 iterations, 16 exploration samples per
# train phase for uniform and bandit; random explores only the monitor's 4 probe seeds per rollout
# prompt (dit: 2 prompts, llm: 4). Every train phase but perhaps the last explores (the last one's
# seeds are only used if the run is extended later).
STEPS, SAMPLES, PROBES = 4, 16, {"dit": 4 * 2, "llm": 4 * 4}


def _cli(*args):
    # SPOTLIGHT_CACHE (conftest) is inherited: warm starts are cached per test session.
    return subprocess.run([sys.executable, "-m", "experiments.exploration_ablation", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("ablation")
    proc = _cli("--quick", "--json", "--out", out)  # --quick: one seed, 0
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_quick_mode_reports_every_model_and_arm(quick):
    out, proc = quick
    results = json.loads(proc.stdout)  # fails unless stdout is exactly one JSON document
    assert set(results) == {"dit", "llm"}
    for model, res in results.items():
        assert res["steps"] == STEPS and res["seeds"] == [0]
        assert set(res["arms"]) == {"random", "uniform", "bandit"}
        for arm, a in res["arms"].items():
            assert ARM_FIELDS <= set(a), (model, arm)
            (its,) = a["iterations_to_target_per_seed"]
            assert 1 <= its <= STEPS and a["iterations_to_target"] == its
            assert isinstance(a["reached"], bool) and (a["reached"] or its == STEPS)
            assert 0 <= a["final_reward"] <= 1 and a["mean_group_reward_std"] >= 0 and a["wall_s"] > 0
        for arm in ("uniform", "bandit"):
            r = res["ratio_vs_random"][arm]
            assert r["min"] <= r["mean"] <= r["max"] or r["min"] == r["max"] == pytest.approx(r["mean"])


def test_every_arm_explored_its_budget(quick):
    _, proc = quick
    results = json.loads(proc.stdout)
    for model, res in results.items():
        arms = res["arms"]
        assert res["samples_per_step"] == SAMPLES
        budget = {"random": PROBES[model], "uniform": SAMPLES, "bandit": SAMPLES}
        for arm, a in arms.items():
            assert budget[arm] * (STEPS - 1) / STEPS <= a["explored_samples_per_step"] <= budget[arm], (model, arm)
    # Colour rewards are continuous: the monitor ranks the explored seeds of every arm, random's probes too.
    for arm, a in results["dit"]["arms"].items():
        assert a["stale_rank_spearman_mean"] is not None and -1 <= a["stale_rank_spearman_mean"] <= 1, arm


def test_runs_tables_and_figure_are_written(quick):
    out, proc = quick
    assert json.loads((out / "results.json").read_text()) == json.loads(proc.stdout)
    rows = [line for line in (out / "table.md").read_text().splitlines() if line.startswith("| ")][1:]  # no header
    assert len(rows) == 6 and all(f"| {arm} |" in "".join(rows) for arm in ("random", "uniform", "bandit"))
    assert (out / "ablation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for model in ("dit", "llm"):
        for arm in ("random", "uniform", "bandit"):
            run = out / model / arm / "seed0"
            cfg = load_config(run / "config.yaml")
            assert cfg.exploration.enabled and cfg.exploration.planner == arm and cfg.runtime.kind == "local"
            assert len((run / "metrics.jsonl").read_text().splitlines()) == STEPS
    assert load_config(out / "llm" / "bandit" / "seed0" / "config.yaml").exploration.prompt_candidates == 2


def test_a_second_call_reuses_the_finished_runs(quick):
    out, proc = quick
    metrics = out / "dit" / "bandit" / "seed0" / "metrics.jsonl"
    before = metrics.stat().st_mtime_ns
    again = _cli("--quick", "--json", "--out", out)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout) == json.loads(proc.stdout)
    assert metrics.stat().st_mtime_ns == before and "reusing the finished run" in again.stderr


@pytest.mark.parametrize("args, message", [
    (["--models", "dit,vit"], "--models: expected distinct names from dit, llm, got 'dit,vit'"),
    (["--arms", "greedy"], "--arms: expected distinct names from random, uniform, bandit"),
    (["--seeds", "0,x"], "--seeds: expected comma-separated integers"),
    (["--config-llm", "nope.yaml"], "--config-llm: no such file: nope.yaml"),
    (["--arms", "bandit", "--models", "dit"], "--target-dit is needed"),
])
def test_bad_arguments_are_one_error_line(tmp_path, args, message):
    proc = _cli(*args, "--out", tmp_path / "out")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1].startswith("exploration_ablation: error: ")
    assert message in proc.stderr and not (tmp_path / "out").exists()


def test_a_bad_config_value_is_one_error_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "experiments/tiny_dit.yaml").read_text().replace("lr: 1.0e-4", "lr: -1"))
    proc = _cli("--models", "dit", "--config-dit", bad, "--out", tmp_path / "out")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"exploration_ablation: error: {bad}: train.lr: expected a number > 0, got -1"]
