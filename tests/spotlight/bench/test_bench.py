import json
import subprocess
import sys

import pytest

from spotlight.bench.throughput import run_throughput


def test_throughput_benchmark_reports_figures_and_ratios():
    r = run_throughput(repeats=1, prompts=2, group_size=4, micro_batch=8)
    assert r["samples"] == 8
    for key in ("denoise_steps_per_s", "trained_samples_per_s", "baseline_denoise_steps_per_s_batch1",
                "baseline_trained_samples_per_s_batch1"):
        assert r[key] > 0
    assert r["rollout_speedup_vs_batch1"] == r["denoise_steps_per_s"] / r["baseline_denoise_steps_per_s_batch1"]


def test_bench_cli_prints_one_json_object():
    proc = subprocess.run([sys.executable, "-m", "spotlight.cli", "bench", "throughput", "--json", "--repeats", "1"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["denoise_steps_per_s"] > 0 and "machine" in out


@pytest.mark.slow
def test_scheduler_benchmark_reports_queue_rates_and_recomputation_against_restart():
    from spotlight.bench.scheduler import run_scheduler_bench

    # 4 prompts x 4 samples an iteration (the tiny DiT's 8 x 8 took 108 s in CI for the same checks)
    r = run_scheduler_bench(ops=50, iterations=2, speedup=20000.0, spot=2,
                            shape={"train": {"prompts_per_step": 4, "group_size": 4}})
    assert r["queue"]["local_ops_per_s"] > r["queue"]["ray_sequential_ops_per_s"] > 0
    for name in ("with_notice", "without_notice"):
        run = r[name]
        assert run["requests_lost"] == 0 and run["requests_duplicated"] == 0
        assert run["requests_completed"] == 2 * 4  # one request per prompt
        assert run["steps_recomputed"] <= run["steps_recomputed_restart_baseline"]
        assert run["steps_recomputed_per_given_back_request"] <= 1.0  # with a notice: at most one step
    assert r["without_notice"]["preemptions"] == 0 and r["without_notice"]["workers_lost"] > 0


@pytest.mark.slow
def test_update_benchmark_reports_fleet_update_seconds_efficiency_and_kill_cost():
    from spotlight.bench.update import run_update_bench

    # The toy shape: 2 prompts x 4 samples x 4 SDE steps = 32 rows, 8 per part: 4 parts per round.
    r = run_update_bench(executors=(2,), iterations=5, prompts=2, group_size=4, sampler_steps=4, micro_batch=8,
                         resolution=16)
    assert r["weights_equal"] is True
    assert r["gradient_parts"] == 2 * 4  # 2 rounds (train.updates_per_step) of 4 parts
    n2 = r["fleet"]["n2"]
    for key in ("update_s", "speedup", "efficiency"):
        assert n2[key] > 0, key
    assert n2["efficiency"] == pytest.approx(r["learner_update_s"] / n2["update_s"] / 2)
    assert n2["efficiency_bound"] == min(2, r["machine"]["cpus"]) / 2
    assert r["learner_update_s"] > 0 and r["kill_update_s"] > 0 and r["kill_undisturbed_update_s"] > 0
    assert r["kill_cost_s"] == r["kill_update_s"] - r["kill_undisturbed_update_s"]
    assert r["kill_workers_lost"] == 1 and r["kill_requests_lost"] == 0
    assert 1 <= r["kill_iteration"] < r["kill_replacement_iteration"] and r["kill_undisturbed_iterations"] >= 1
    assert r["machine"]["cpus"] >= 1 and r["machine"]["torch"]


def test_lora_benchmark_reports_publication_bytes_shrinking_by_the_adapter_ratio():
    from spotlight.bench.lora import run_lora_bench

    r = run_lora_bench(qwen_image_rank=16)
    for kind in ("dit", "llm"):
        t = r[kind]
        assert 0 < t["adapter_params"] < t["full_params"]
        # float32: 4 bytes a parameter, plus the safetensors header (tensor names: a few KB)
        assert 4 * t["full_params"] <= t["full_bytes"] < 4 * t["full_params"] + 16_384
        assert 4 * t["adapter_params"] <= t["lora_bytes"] < 4 * t["adapter_params"] + 16_384
        assert t["bytes_ratio"] == t["lora_bytes"] / t["full_bytes"] < 0.3
        assert t["base_bytes_once"] == t["full_bytes"]  # the base goes once per worker, at full size
    q = r["qwen_image"]
    assert q["full_params"] > 20e9 and q["rank"] == 16
    assert 0 < q["param_ratio"] == q["adapter_params"] / q["full_params"] < 0.01
    assert q["bytes_ratio"] == pytest.approx(2 * q["param_ratio"])  # float32 adapters over a bfloat16 base
