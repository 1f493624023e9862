import json
import subprocess
import sys

from spotlight.bench_throughput import run_throughput


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
