"""`ray_cluster.connect` against real Ray clusters (tests/ray_cluster.py, on loopback): it joins a
cluster with token auth off, and one with token auth on given the token (from RAY_AUTH_TOKEN, a
RAY_AUTH_TOKEN_PATH file or ~/.ray/auth_token); a wrong or missing token, or a RAY_AUTH_MODE that
contradicts the cluster, is one ConfigError line within seconds; a local cluster uses token auth with
a token of its own, writes none to ~/.ray, and listens on loopback only.

Each join runs in a fresh Python (ray.init is once per process), with HOME in a temporary folder so
the machine's ~/.ray/auth_token never takes part; one cluster per auth mode serves the module."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ray_cluster import LoopbackCluster

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "0123456789abcdef" * 4

# Joins (or starts a local cluster), runs an actor, leaves; its last line is JSON: {"ok": ...} or,
# exit 2, {"error": "<the ConfigError>"}. A local start first prints its processes and waits for a line.
_JOIN = r"""
import json, os, sys
from spotlight.config import ConfigError, RuntimeConfig
from spotlight.runtime import ray_cluster
import ray
address = sys.argv[1] or None
try:
    ray_cluster.connect(RuntimeConfig(address=address))
except ConfigError as err:
    print(json.dumps({"error": str(err)})); sys.exit(2)

@ray.remote(num_cpus=0)
class Probe:
    def mode(self):
        return os.environ.get("RAY_AUTH_MODE")

mode = ray.get(Probe.remote().mode.remote(), timeout=120)  # an actor works: auth matches end to end
out = {"ok": True, "actor_mode": mode, "driver_mode": os.environ.get("RAY_AUTH_MODE")}
if address is None:  # a local cluster: its processes are this driver's descendants
    import psutil  # Ray's vendored copy, on sys.path once ray is imported
    me = psutil.Process()
    pids = [me.pid] + [p.pid for p in me.children(recursive=True)]
    gcs = ray._private.worker._global_node.gcs_address
    print(json.dumps({"pids": pids, "gcs": gcs}), flush=True)
    sys.stdin.readline()  # the test looks at the live cluster meanwhile
ray_cluster.shutdown()
out["after"] = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
print(json.dumps(out))
"""


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")}
    return {**env, "HOME": str(home), "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0", **extra}


def _join(address: str, home: Path, **extra: str) -> tuple[int, dict, float, str]:
    """Run `_JOIN` on `address` in a fresh Python: (exit code, its JSON, seconds, its stderr)."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _JOIN, address], cwd=ROOT, env=_env(home, **extra),
                          capture_output=True, text=True, timeout=180)
    elapsed = time.monotonic() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc.returncode, json.loads(lines[-1]), elapsed, proc.stderr


@pytest.fixture(scope="module")
def open_cluster():
    with LoopbackCluster(auth="disabled") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def token_cluster():
    with LoopbackCluster(auth="token", env={"RAY_AUTH_TOKEN": TOKEN}) as cluster:
        yield cluster


def test_joins_a_cluster_with_auth_off_even_when_a_token_is_around(open_cluster, tmp_path):
    # A token in the environment must not switch this driver to token mode: Ray's actors would die.
    rc, out, _, _ = _join(open_cluster.address, tmp_path, RAY_AUTH_TOKEN=TOKEN)
    assert rc == 0 and out["ok"]
    assert out["driver_mode"] == "disabled"
    assert out["after"] == {"RAY_AUTH_MODE": None, "RAY_AUTH_TOKEN": TOKEN}


@pytest.mark.parametrize("where", ["RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "~/.ray/auth_token"])
def test_joins_a_token_cluster_given_its_token(token_cluster, tmp_path, where):
    # "~/.ray/auth_token" with RAY_AUTH_MODE unset: a token a local ray.init once wrote, which
    # `ray start --head` picks up; ray.init with an explicit address would not (measured: 20 s, then
    # "Failed to connect").
    extra = {}
    if where == "RAY_AUTH_TOKEN":
        extra["RAY_AUTH_TOKEN"] = TOKEN
    elif where == "RAY_AUTH_TOKEN_PATH":
        (tmp_path / "token").write_text(TOKEN + "\n")
        extra["RAY_AUTH_TOKEN_PATH"] = str(tmp_path / "token")
    else:
        (tmp_path / ".ray").mkdir()
        (tmp_path / ".ray" / "auth_token").write_text(TOKEN)
    rc, out, _, _ = _join(token_cluster.address, tmp_path, **extra)
    assert rc == 0 and out["ok"]
    assert out["driver_mode"] == "token"
    assert out["after"]["RAY_AUTH_MODE"] is None


@pytest.mark.parametrize("case, extra, says", [
    ("wrong token", {"RAY_AUTH_TOKEN": "f" * 64}, "rejects the token from RAY_AUTH_TOKEN: set RAY_AUTH_TOKEN"),
    ("missing token", {}, "requires token auth and no token was given: set RAY_AUTH_TOKEN"),
    ("mode disabled here", {"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": TOKEN},
     "requires token auth but RAY_AUTH_MODE=disabled here"),
    ("unreadable token file", {"RAY_AUTH_TOKEN_PATH": "/nonexistent/token"}, "RAY_AUTH_TOKEN_PATH: '/nonexistent/token'"),
])
def test_an_auth_failure_on_a_token_cluster_is_one_line_in_seconds(token_cluster, tmp_path, case, extra, says):
    rc, out, elapsed, stderr = _join(token_cluster.address, tmp_path, **extra)
    assert rc == 2, case
    assert says in out["error"] and "\n" not in out["error"], out["error"]
    assert elapsed < 20, f"{case}: {elapsed:.1f} s (ray.init alone retries for 20 s)"
    assert stderr.strip() == "", f"Ray's own warnings leaked: {stderr[-2000:]}"


def test_a_token_driver_on_a_cluster_with_auth_off_is_one_line(open_cluster, tmp_path):
    rc, out, elapsed, stderr = _join(open_cluster.address, tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN)
    assert rc == 2 and stderr.strip() == "", stderr[-2000:]
    assert "has token auth off but RAY_AUTH_MODE=token here" in out["error"] and "\n" not in out["error"]
    assert elapsed < 20


def test_check_says_it_without_joining(token_cluster, tmp_path, monkeypatch):
    import ray

    from spotlight.config import ConfigError, RuntimeConfig
    from spotlight.runtime.ray_cluster import check

    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    rt = RuntimeConfig(address=token_cluster.address)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "f" * 64)
    with pytest.raises(ConfigError, match="rejects the token from RAY_AUTH_TOKEN"):
        check(rt)
    monkeypatch.setenv("RAY_AUTH_TOKEN", TOKEN)
    check(rt)
    assert not ray.is_initialized() and "RAY_AUTH_MODE" not in os.environ


def _listening(pids: set[int]) -> list[str]:
    """`ss`'s local addresses of the TCP and UDP sockets that `pids` listen on."""
    found = []
    for flags in ("-ltnpH", "-lunpH"):
        for line in subprocess.run(["ss", flags], capture_output=True, text=True, check=True).stdout.splitlines():
            if any(int(p) in pids for p in re.findall(r"pid=(\d+)", line)):
                found.append(line.split()[3])
    return found


def _loopback(local_address: str) -> bool:
    host = local_address.rpartition(":")[0].strip("[]")
    return host.startswith("127.") or host.startswith("::ffff:127.") or host == "::1"


def test_a_local_cluster_uses_its_own_token_and_listens_on_loopback_only(tmp_path):
    from spotlight.runtime.ray_cluster import _asks_gcs

    proc = subprocess.Popen([sys.executable, "-c", _JOIN, ""], cwd=ROOT, env=_env(tmp_path),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        live = json.loads(proc.stdout.readline() or "{}")
        listening = _listening(set(live.get("pids", [])))
        gcs_without_token = _asks_gcs(live["gcs"], {}, timeout_s=5) if live else None
        stdout, stderr = proc.communicate("\n", timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert live, stderr[-3000:]
    out = json.loads(stdout.splitlines()[-1])
    # GCS, raylet (node manager, object manager), its agents, the driver's and the actor's workers.
    assert len(listening) >= 5, listening
    assert all(_loopback(a) for a in listening), listening
    assert gcs_without_token is False, "the local cluster's GCS must refuse a caller without its token"
    assert out["driver_mode"] == out["actor_mode"] == "token"
    assert out["after"] == {"RAY_AUTH_MODE": None, "RAY_AUTH_TOKEN": None}
    assert not (tmp_path / ".ray" / "auth_token").exists(), "a local run must not write the user's Ray token"
