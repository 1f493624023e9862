"""The fleet `spotlight launch` starts, run as local processes: the job group's head and spot-node
scripts (`cloud/sky.py`), each in a session of its own as on its own node, with a fake SkyPilot
environment, on loopback (the head at 127.0.0.2, the spot node at 127.0.0.3; each node's Ray ports
its own, since they share a machine). The spot node joins the head's Ray cluster with the fleet's
token, training ends, and then every process of the fleet exits by itself: the head's Ray stops
with the run, the spot node's with the head's — on a cloud, nothing is left to bill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cloud import sky
from spotlight.config import to_yaml

from conftest import small_dit_config

HEAD, SPOT = "127.0.0.2", "127.0.0.3"
SPOT_PORTS = ("--node-manager-port 6395 --object-manager-port 6396 --runtime-env-agent-port 6397 "
              "--dashboard-agent-grpc-port 6398 --dashboard-agent-listen-port 6399 --metrics-export-port 6400 "
              "--min-worker-port 11002 --max-worker-port 11999")


def _sessions_alive(sids: set[int]) -> list[str]:
    """Processes still in any of the sessions `sids`, as 'pid command'."""
    alive = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getsid(int(proc.name)) in sids:
                command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                alive.append(f"{proc.name} {command[:120]}")
        except (ProcessLookupError, PermissionError, FileNotFoundError):
            pass
    return alive


@pytest.mark.slow
def test_a_launched_fleet_trains_and_then_every_process_exits_by_itself(tmp_path):
    cfg = small_dit_config(train={"steps": 2, "prompts_per_step": 2, "group_size": 4, "checkpoint_every": 2},
                           runtime={"kind": "ray", "spot_workers": 1, "ondemand_workers": 1})
    (fleet,) = sky.write_tasks(cfg.cloud, 1, to_yaml(cfg), tmp_path / "tasks", "local")
    header, head, pool = yaml.safe_load_all(fleet.read_text())
    assert header["primary_tasks"] == [head["name"]] and pool["name"] == "spot-0"
    home = tmp_path / "home"
    (remote, local), = head["file_mounts"].items()
    mounted = home / remote.removeprefix("~/")
    mounted.parent.mkdir(parents=True)
    mounted.write_text(Path(local).read_text())  # what SkyPilot's file mount does

    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SPOTLIGHT_RAY"))}
    env.update(HOME=str(home), PATH=f"{Path(sys.executable).parent}:{env['PATH']}", RAY_USAGE_STATS_ENABLED="0",
               SKYPILOT_NUM_NODES="1", SKYPILOT_NODE_RANK="0", **{sky.JOBGROUP_ENV: "local", sky.TOKEN_ENV: "a1" * 32})
    logs = {name: open(tmp_path / f"{name}.log", "w") for name in ("head", "spot")}
    procs = {
        "head": subprocess.Popen(["bash", "-c", head["run"]], env={**env, sky.NODE_IP_ENV: HEAD,
                                 "SKYPILOT_NODE_IPS": HEAD}, stdout=logs["head"], stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True),
        "spot": subprocess.Popen(["bash", "-c", pool["run"]], env={**env, sky.NODE_IP_ENV: SPOT,
                                 # no /etc/hosts entry for head-0.local here: the head's address
                                 sky.HEAD_IP_ENV: HEAD, sky.PORT_FLAGS_ENV: SPOT_PORTS, "SKYPILOT_NODE_IPS": SPOT,
                                 # Ray's default: a node waits 60 s for a lost head before its Ray ends
                                 "RAY_gcs_rpc_server_reconnect_timeout_s": "10"},
                                 stdout=logs["spot"], stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True),
    }
    sids = {p.pid for p in procs.values()}
    try:
        codes = {name: p.wait(timeout=420) for name, p in procs.items()}
        deadline = time.monotonic() + 60  # what the scripts' processes started winds down too
        while (left := _sessions_alive(sids)) and time.monotonic() < deadline:
            time.sleep(1)
        text = {name: (tmp_path / f"{name}.log").read_text(errors="replace") for name in procs}
        assert codes == {"head": 0, "spot": 0}, text
        assert left == [], (left, text)
        assert "the head's Ray cluster is gone: the run has ended" in text["spot"], text["spot"]
        summary = json.loads((home / "spotlight" / "runs" / "local" / "summary.json").read_text())
        assert summary["steps"] == 2 and summary["requests_lost"] == 0, summary
        # the spot node joined and computed rollouts
        assert any(SPOT in node and n > 0 for node, n in summary["requests_by_node"].items()), summary
    finally:
        for sid in sids:
            try:
                os.killpg(sid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for f in logs.values():
            f.close()
        current = Path("/tmp/ray/ray_current_cluster")
        if current.exists() and current.read_text().strip().startswith(HEAD):
            current.unlink(missing_ok=True)
