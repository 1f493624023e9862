"""`spotlight bench sp-regroup` at toy size: one JSON object with the figures it promises."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _bench(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "spotlight.cli", "bench", "sp-regroup", *args],
                          check=False, capture_output=True, text=True, env=env, timeout=600)


def test_sp_regroup_bench_prints_one_json_object_with_regroup_and_cold_start_times():
    proc = _bench("--json", "--world", "2", "--heads", "2", "--repeats", "1")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)  # the whole of stdout is the one object
    assert out["world"] == 2 and out["degrees"] == [1, 2] and out["agent"] == "ray"
    assert out["max_abs_err"] < 1e-5 and set(out["max_abs_err_by_degree"]) == {"1", "2"}
    assert out["regroup_degrees"] == [1]  # one survivor of a group of 2 serves alone
    assert 0 < out["rendezvous_s"] and 0 < out["regroup_s"] < out["cold_start_s"]
    assert out["resume_max_abs_err"] < 1e-5
    assert out["cold_start_over_regroup"] == out["cold_start_s"] / out["regroup_s"]


def test_sp_regroup_bench_rejects_a_world_the_heads_cannot_split():
    proc = _bench("--world", "3", "--heads", "4")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "spotlight: error: --world 3 must divide --heads 4: the first group has degree 3"]
