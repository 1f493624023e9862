"""The fleet `spotlight launch` starts, run as local processes: the job group's head and spot-node
scripts (`cloud/sky.py` -> `spotlight/fleet_node.py`), each in a session of its own as on its own node,
each at its own loopback address, with no name service (no /etc/hosts entry, no job-group host
names: what SkyPilot 0.14.1 gives a job group on AWS and GCP) — the nodes meet through the run's
store (`cloud/rendezvous.py`), an S3-compatible server on the host (moto)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from cloud import sky
from spotlight.fleet_node import HEAD_WAIT_ENV, POLL_ENV
from cloud.open_store import open_store
from cloud.rendezvous import HEAD_KEY, Rendezvous, signed
from cloud.store import LocalStore
from spotlight.bench.loopback_cluster import LoopbackCluster, kill_tree
from spotlight.cli import main
from spotlight.config import to_yaml

import netns
from conftest import small_dit_config
from netns import Hosts
from s3_server import moto_server, s3_server, user_bucket  # noqa: F401  (s3_server: a fixture)

TOKEN = "a1" * 32
NAME = "fleet"


def _ports(base: int) -> str:
    """A node's own Ray ports: nodes that share this machine cannot share them."""
    return (f"--node-manager-port {base} --object-manager-port {base + 1} --runtime-env-agent-port {base + 2} "
            f"--dashboard-agent-grpc-port {base + 3} --dashboard-agent-listen-port {base + 4} "
            f"--metrics-export-port {base + 5} --min-worker-port {base * 2} --max-worker-port {base * 2 + 900}")


def _tasks(cfg, tmp_path) -> tuple[dict, dict]:
    (fleet,) = sky.write_tasks(cfg.cloud, 1, to_yaml(cfg), tmp_path / "tasks", NAME)
    header, head, spot = yaml.safe_load_all(fleet.read_text())
    assert header["primary_tasks"] == [head["name"]] and spot["name"] == "spot-0"
    assert spot["resources"]["job_recovery"]["recover_on_exit_codes"] == [sky.HEAD_LOST]
    return head, spot


class Node:
    """One task's run script on a 'node' of its own: its own session, home (the file mount of
    run.yaml is there, as SkyPilot makes it) and address — SkyPilot's $SKYPILOT_NODE_IPS, from
    which the node takes it. `prefix` runs it on a host of its own (a network namespace)."""

    def __init__(self, tmp_path: Path, name: str, task: dict, ip: str, ports: str | None,
                 prefix: list[str] = (), **env: str) -> None:
        self.name = name
        self.home = tmp_path / name
        for remote, local in task["file_mounts"].items():  # what SkyPilot's file mount does
            mounted = self.home / remote.removeprefix("~/")
            mounted.parent.mkdir(parents=True, exist_ok=True)
            mounted.write_text(Path(local).read_text())
        self.ip = ip
        self.log_path = tmp_path / f"{name}.log"
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "SPOTLIGHT_RAY", "SKYPILOT_"))}
        env = {**clean, "HOME": str(self.home), "PATH": f"{Path(sys.executable).parent}:{clean['PATH']}",
               "RAY_USAGE_STATS_ENABLED": "0", sky.TOKEN_ENV: TOKEN, "SKYPILOT_NODE_IPS": ip,
               # Ray's default: a node waits 60 s for a lost head before its Ray ends
               "RAY_gcs_rpc_server_reconnect_timeout_s": "10", POLL_ENV: "0.5", **env}
        if ports:
            env[sky.PORT_FLAGS_ENV] = ports
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([*prefix, "bash", "-c", task["run"]], env=env, cwd=sky.REPO_ROOT, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """The node vanishes: every process it started, at once."""
        kill_tree(self.proc)
        for pid in _session(self.proc.pid):
            os.kill(pid, signal.SIGKILL)

    def left(self) -> list[int]:
        return _session(self.proc.pid)


def _session(sid: int) -> list[int]:
    """Processes still in session `sid`."""
    alive = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and os.getsid(int(proc.name)) == sid:
                alive.append(int(proc.name))
        except (ProcessLookupError, PermissionError):
            pass
    return alive


def _until(what, nodes, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError("timed out; logs:\n" + "\n".join(f"--- {n.name}\n{n.log[-4000:]}" for n in nodes))
        time.sleep(0.5)


class Listener:
    """A TCP server at `ip` that counts the connections it is offered (a forged record's address)."""

    def __init__(self, ip: str) -> None:
        self.sock = socket.create_server((ip, 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()


@pytest.mark.slow
def test_a_spot_node_dials_only_a_signed_head_and_fails_when_it_has_lost_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTLIGHT_STORE_ROOTS", str(tmp_path))
    store_uri = f"file://{tmp_path / 'store'}"
    cfg = small_dit_config(runtime={"kind": "ray", "spot_workers": 1}, cloud={"checkpoint_uri": store_uri})
    _, spot = _tasks(cfg, tmp_path)
    store = LocalStore(tmp_path / "store")
    trap = Listener("127.0.0.6")
    forged = {"run": NAME, "generation": 7, "address": "127.0.0.6", "port": trap.port, "published_at": 0.0}
    store.put(HEAD_KEY, signed(forged, "ee" * 32))

    # A record signed without the token: never dialled; with no head, the task fails (not 0)
    alone = Node(tmp_path, "alone", spot, "127.0.0.3", _ports(6395), **{HEAD_WAIT_ENV: "3", POLL_ENV: "0.2"})
    assert alone.proc.wait(timeout=60) == sky.HEAD_LOST, alone.log
    assert "signature does not verify with this fleet's token" in alone.log and "no head for 3 s" in alone.log
    assert trap.accepted == 0

    with LoopbackCluster(auth="token", env={"RAY_AUTH_TOKEN": TOKEN}) as cluster:
        ip, port = cluster.address.rsplit(":", 1)
        Rendezvous(store, TOKEN, NAME).publish_head(ip, int(port))
        node = Node(tmp_path, "joined", spot, "127.0.0.4", _ports(6405), **{HEAD_WAIT_ENV: "3"})
        _until(lambda: "Ray runtime started" in node.log, [node], 120)
        assert "joined head generation 1" in node.log and node.proc.poll() is None
        cluster.kill(cluster.head)  # the head is lost and the run is not done: a failure SkyPilot recovers
        assert node.proc.wait(timeout=90) == sky.HEAD_LOST, node.log
    assert "this node's Ray ended" in node.log and "no head for 3 s and the run is not done" in node.log
    assert node.left() == [] and trap.accepted == 0


def _weights(out: Path) -> dict[str, torch.Tensor]:
    (path,) = (out / "final").glob("*.safetensors")
    return load_file(str(path))


def _stored_steps(client, bucket: str) -> list[int]:
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="run/step-").get("Contents", [])]
    return sorted(int(k.split("/")[1][5:]) for k in keys if k.endswith("/MANIFEST.json"))


class Topology:
    """Where the fleet's 'nodes' are: each on a host of its own (a network namespace: its own
    stack, the default Ray ports, the store on the bridge) where this machine allows it, else at
    its own loopback address (127.0.0.2 up; each its own Ray ports). Either way no host name
    resolves to any node, and the store is an S3 server on the host."""

    def __init__(self, tmp_path: Path, hosts: Hosts | None) -> None:
        self.tmp_path = tmp_path
        self.hosts = hosts
        self.nodes: list[Node] = []

    def start(self, name: str, task: dict) -> Node:
        n = len(self.nodes)
        if self.hosts is not None:
            node = Node(self.tmp_path, name, task, self.hosts.add(name), None, self.hosts.prefix(name))
        else:
            node = Node(self.tmp_path, name, task, f"127.0.0.{n + 2}", _ports(6395 + 10 * n))
        self.nodes.append(node)
        return node


@pytest.fixture
def topology(tmp_path, monkeypatch, s3_server):
    """(Topology, S3Env): the nodes' places, and a bucket every node reaches."""
    why = netns.available()
    if why is not None:  # distinct loopback addresses instead (the fallback)
        print(f"network namespaces unavailable ({why}): nodes at loopback addresses")
        yield Topology(tmp_path, None), user_bucket(s3_server.endpoint, s3_server.client, monkeypatch, tmp_path)
        return
    with Hosts() as hosts, moto_server(hosts.host_ip) as server:
        topology = Topology(tmp_path, hosts)
        try:
            yield topology, user_bucket(server.endpoint, server.client, monkeypatch, tmp_path)
        finally:
            for node in topology.nodes:  # before their namespaces go
                node.kill()


@pytest.mark.slow
def test_a_fleet_forms_through_the_store_outlives_a_spot_node_and_its_head_and_brings_the_results_home(
        tmp_path, topology):
    place, s3 = topology
    steps = 6
    # No on-demand rollout worker: every rollout waits for a spot node (runtime.spot_wait_s), so the
    # node that re-joins the restarted head is the one that computes what is left (with one, the
    # head could finish alone before the node is back).
    cfg = small_dit_config(train={"steps": steps, "prompts_per_step": 2, "group_size": 4, "checkpoint_every": 1},
                           runtime={"kind": "ray", "spot_workers": 1, "ondemand_workers": 0},
                           cloud={"checkpoint_uri": f"s3://{s3.bucket}/run"})
    head, spot = _tasks(cfg, tmp_path)
    nodes = place.nodes
    try:
        head_a = place.start("head-a", head)
        spot_1 = place.start("spot-1", spot)
        _until(lambda: "joined head generation 1" in spot_1.log and _stored_steps(s3.client, s3.bucket), nodes, 300)
        spot_1.kill()  # preempted without notice; SkyPilot brings up a fresh node
        spot_2 = place.start("spot-2", spot)
        _until(lambda: "joined head generation 1" in spot_2.log and max(_stored_steps(s3.client, s3.bucket)) >= 3,
               nodes, 300)
        head_a.kill()  # the head's machine is lost; SkyPilot recovers it elsewhere, with an empty disk
        head_b = place.start("head-b", head)
        codes = {n.name: n.proc.wait(timeout=600) for n in (head_b, spot_2)}
        deadline = time.monotonic() + 60  # what the scripts started winds down too
        while any(n.left() for n in (head_b, spot_2)) and time.monotonic() < deadline:
            time.sleep(1)
        logs = {n.name: n.log for n in nodes}
        assert codes == {"head-b": 0, "spot-2": 0}, logs
        assert [n.left() for n in (head_b, spot_2)] == [[], []], logs
    finally:
        for n in nodes:
            n.kill()
    head_b_ip = head_b.ip
    # the spot node followed the head to its new address, and left only once the run was done
    assert f"joined head generation 2 at {head_b_ip}" in logs["spot-2"], logs["spot-2"]
    assert "the run has ended (finished: steps): this node is done" in logs["spot-2"], logs["spot-2"]
    fleet = Rendezvous(open_store(cfg.cloud.checkpoint_uri), TOKEN, NAME)
    assert fleet.head().generation == 2 and fleet.done().reason == "finished: steps"
    assert "pulled from" in logs["head-b"], logs["head-b"]  # it resumed from the store

    run = head_b.home / "spotlight" / "runs" / NAME
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == steps and summary["requests_lost"] == 0, summary
    assert any(spot_2.ip in node and n > 0 for node, n in summary["requests_by_node"].items()), summary

    local = small_dit_config(train={"steps": steps, "prompts_per_step": 2, "group_size": 4, "checkpoint_every": 1})
    from spotlight.train.trainer import Trainer

    Trainer(local, tmp_path / "local", progress=False).build().train()
    a, b = _weights(tmp_path / "local"), _weights(run)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    # the results are home: `spotlight pull` returns the run folder's results bit-identical
    pulled = tmp_path / "pulled"
    assert main(["pull", cfg.cloud.checkpoint_uri, "--out", str(pulled)]) == 0
    files = sorted(p.relative_to(pulled).as_posix() for p in pulled.rglob("*") if p.is_file())
    for must in ("summary.json", "metrics.jsonl"):
        assert must in files, files
    assert any(f.startswith("final/") for f in files) and any(f.startswith("tb/") for f in files), files
    for rel in files:
        if (run / rel).exists():
            assert (pulled / rel).read_bytes() == (run / rel).read_bytes(), rel
        else:  # the lost head's TensorBoard events: in the store, not on the new head's disk
            assert rel.startswith("tb/events.out.tfevents."), rel
    assert all(rel in files for rel in ("final/" + p.name for p in (run / "final").iterdir())), files
