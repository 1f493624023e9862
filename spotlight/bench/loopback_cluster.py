"""A real multi-node Ray cluster on this machine, for tests and benchmarks; its traffic stays on loopback.

Every node is a `ray start --block` process in its own process group, with its own loopback
address (127.0.0.2 for the head, 127.0.0.3.. for the others): Ray rewrites 127.0.0.1 to the
machine's interface address (`resolve_ip_for_localhost`), any other 127/8 address it keeps, and
Linux routes all of 127/8 over `lo` (nodes advertise and dial only these addresses; Ray 2.60 still
binds its GCS, raylets and workers on every interface, whatever the node IP: docs/multi-node.md).
`kill(node)` SIGKILLs everything of a node — its process
group (its raylet, its object store) and every process group below it: Ray starts each worker
process in a group of its own, and what a worker starts (an SP agent's fork server and members)
stays in the worker's group, so killing the node's group alone left its actors running — a spot
node preempted without notice. Nothing here calls `ray stop`, which would stop every Ray on the
machine; `close()` stops what this started.

    with LoopbackCluster(auth="disabled") as cluster:
        cluster.add_node({"spot": 2})
        ... spotlight train with runtime.address = cluster.address ...
        cluster.drain(node_id, deadline_ms)   # a notice, as a cloud integration gives it to Ray
        cluster.kill(node)
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RAY = str(Path(sys.executable).with_name("ray"))
HEAD_IP = "127.0.0.2"

# A dead node is declared after period x threshold (Ray's defaults: 15 s and more); a test waits less.
_SYSTEM_CONFIG = '{"health_check_period_ms": 500, "health_check_failure_threshold": 4}'


def free_port(host: str = HEAD_IP) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, theirs, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the name in (...) may hold spaces
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            out.append(child)
            todo.append(child)
    return out


def kill_tree(process: subprocess.Popen) -> None:
    """SIGKILL `process` and everything it started, as a machine that vanishes: every process group
    of its process tree (see the module docstring), then what is left of the tree."""
    below = descendants(process.pid)
    groups = {process.pid}
    for pid in below:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            pass
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()


@dataclass
class ClusterNode:
    name: str
    ip: str
    resources: dict[str, float]
    process: subprocess.Popen
    log: Path

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


class LoopbackCluster:
    """See the module docstring. `auth`: Ray's RAY_AUTH_MODE for every node ("disabled" or
    "token"); with "token", `env` should carry the token (RAY_AUTH_TOKEN)."""

    def __init__(self, auth: str = "disabled", head_resources: dict[str, float] | None = None,
                 env: dict[str, str] | None = None, num_cpus: int = 1) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="spotlight-cluster-"))
        self.env = {**os.environ, "RAY_AUTH_MODE": auth, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
        self.env.pop("RAY_ADDRESS", None)
        self.num_cpus = num_cpus
        self.port = free_port()
        self.address = f"{HEAD_IP}:{self.port}"
        self.nodes: list[ClusterNode] = []
        self._next_ip = 3
        self.head = self._start("head", HEAD_IP, head_resources or {},
                                ["--head", f"--port={self.port}", "--include-dashboard=false",
                                 f"--system-config={_SYSTEM_CONFIG}"])

    def add_node(self, resources: dict[str, float], name: str | None = None) -> ClusterNode:
        """A node that joins the head, advertising `resources` (e.g. {"spot": 2})."""
        ip = f"127.0.0.{self._next_ip}"
        self._next_ip += 1
        return self._start(name or f"node{len(self.nodes)}", ip, resources, [f"--address={self.address}"])

    def _start(self, name: str, ip: str, resources: dict[str, float], args: list[str]) -> ClusterNode:
        import json

        log = self.dir / f"{name}.log"
        cmd = [RAY, "start", *args, f"--node-ip-address={ip}", f"--resources={json.dumps(resources)}",
               f"--num-cpus={self.num_cpus}", "--disable-usage-stats", "--block"]
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        node = ClusterNode(name, ip, resources, proc, log)
        self.nodes.append(node)
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"ray start ({name}) failed:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.1)
        return node

    def kill(self, node: ClusterNode) -> None:
        """SIGKILL everything of `node` (a preemption without notice): `kill_tree`."""
        kill_tree(node.process)

    def drain(self, node_id: str, deadline_ms: int, message: str = "spot interruption") -> None:
        """A preemption notice as a cloud integration gives it to Ray: node `node_id` (Ray's id) is
        drained for preemption until `deadline_ms` (epoch milliseconds); a refusal raises."""
        import ray
        from ray.core.generated import autoscaler_pb2

        gcs = ray._raylet.GcsClient(address=self.address)
        accepted, why = gcs.drain_node(node_id, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
                                       message, deadline_ms)
        if not accepted:
            raise RuntimeError(f"Ray refused to drain node {node_id}: {why}")

    def close(self) -> None:
        """SIGKILL every node this started (a graceful `ray start` shutdown takes ~15 s a node)."""
        for node in reversed(self.nodes):
            self.kill(node)
        shutil.rmtree(self.dir, ignore_errors=True)
        # `ray start --head` names itself the machine's current cluster, which a later plain
        # `ray.init()` would try to join: forget it when it is this one.
        current = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
        if current.exists() and current.read_text().strip() == self.address:
            current.unlink(missing_ok=True)

    def __enter__(self) -> LoopbackCluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
