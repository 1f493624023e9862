"""`spotlight train` with the Ray runtime and a preemption trace, through the real CLI."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spotlight.config import to_yaml

from conftest import small_dit_config

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "spotlight.cli", *map(str, args)], capture_output=True, text=True)


@pytest.fixture
def config_file(tmp_path):
    cfg = small_dit_config(runtime={"kind": "ray", "spot_workers": 2, "ondemand_workers": 1},
                           train={"steps": 3, "prompts_per_step": 4}, sampler={"num_steps": 6})
    path = tmp_path / "run.yaml"
    path.write_text(to_yaml(cfg))
    return path


@pytest.mark.parametrize("text, line, message", [
    ("0,add,node1\n0,add,node2\nabc,remove,node1\n", 3, "delta_ms"),
    ("0,add,node1\n10,explode,node1\n", 2, "explode"),
    ("0,add,node1\n0,add,node2\n500,remove,node1\n400,remove,node2\n", 4, "backwards"),
])
def test_a_malformed_trace_is_one_line_with_file_and_line(tmp_path, config_file, text, line, message):
    trace = tmp_path / "bad.csv"
    trace.write_text(text)
    proc = _cli("train", config_file, "--out", tmp_path / "out", "--preemption-trace", trace)
    assert proc.returncode == 2
    (err,) = proc.stderr.strip().splitlines()
    assert err.startswith(f"spotlight: error: {trace}:{line}: ") and message in err
    assert not (tmp_path / "out").exists()


def test_a_missing_trace_is_one_clear_error(tmp_path, config_file):
    proc = _cli("train", config_file, "--out", tmp_path / "out", "--preemption-trace", tmp_path / "nope.csv")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"spotlight: error: {tmp_path / 'nope.csv'}: no such trace file"]


def test_a_trace_needs_the_ray_runtime(tmp_path, config_file):
    proc = _cli("train", config_file, "--out", tmp_path / "out", "--runtime", "local",
                "--preemption-trace", ROOT / "experiments/traces/bamboo-g4dn.csv")
    assert proc.returncode == 2 and "needs --runtime ray" in proc.stderr


@pytest.mark.slow
def test_train_on_ray_replaying_a_shipped_trace_reports_the_scheduler_counters(tmp_path, config_file):
    out = tmp_path / "out"
    proc = _cli("train", config_file, "--out", out, "--json", "--no-progress",
                "--preemption-trace", ROOT / "experiments/traces/bamboo-g4dn.csv", "--trace-speedup", "4000")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    for key in ("preemptions", "workers_lost", "requests_completed", "requests_resumed", "requests_duplicated",
                "requests_lost", "steps_recomputed"):
        assert isinstance(summary[key], int), key
    assert summary["runtime"] == "ray" and summary["steps"] == 3
    assert summary["requests_completed"] == 3 * 4
    assert summary["requests_lost"] == 0 and summary["requests_duplicated"] == 0
    assert summary["preemptions"] + summary["workers_lost"] >= 1


def test_an_unreachable_cluster_address_is_one_clear_error(tmp_path, config_file):
    import socket

    with socket.socket() as s:  # a port on loopback that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _cli("train", config_file, "--out", tmp_path / "out", "--address", f"127.0.0.1:{port}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    (line,) = [l for l in proc.stderr.strip().splitlines() if l.startswith("spotlight: error:")]
    assert f"runtime.address: cannot join the Ray cluster at '127.0.0.1:{port}'" in line
    assert "Traceback" not in proc.stderr
