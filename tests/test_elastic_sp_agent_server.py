"""Node agents as their own processes (`elastic_sp.agent_server`): the coordinator drives them over
authenticated TCP connections, as it would agents on other machines; the server's control plane
holds against silent, hostile and malformed peers.

Real agent processes (`python -m elastic_sp.agent_server`), real member processes under them, real
gloo groups; nothing is mocked.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import time
from contextlib import closing

import pytest
import torch

from cloud.codec import encode
from planted_pickle import Payload, pickled
from elastic_sp.agent_server import READY_LINE, WIRE_TYPES, AgentServer, Hello, Kill, RemoteAgent, Setup, Spawn
from elastic_sp.signed_connection import ProtocolError, connect
from elastic_sp.coordinator import Coordinator
from elastic_sp.regroup_policy import UlyssesStepTime
from elastic_sp.weights import digest, save_checkpoint
from schedulers.clock import WallClock
from schedulers.queue import PullQueue
from tests.test_elastic_sp_agent import SPEC, serve_undisturbed_then_disturbed_to_step


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as f:  # a zombie still answers kill(pid, 0)
        return f.read().split(")")[-1].split()[0] == "Z"


def wait_gone(pids, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(gone(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def checkpoint(tmp_path):
    model = SPEC.build_model()
    return save_checkpoint(model.state_dict(), tmp_path / "model.safetensors"), digest(model)


def test_weights_go_between_agent_processes_over_the_network_and_stay_with_the_node(checkpoint):
    path, want = checkpoint
    n0 = RemoteAgent.start("n0", SPEC, checkpoint=path, load_weights=True)  # the node that starts the deployment
    n1 = RemoteAgent.start("n1", SPEC)  # a node added later: no weights, no checkpoint path
    coord = Coordinator(SPEC, [n0, n1], PullQueue(WallClock(), lease_s=600.0), auto_regroup=False)
    try:
        assert len({os.getpid(), n0.pid, n1.pid}) == 3
        assert n0.has_weights and not n1.has_weights
        coord.add("n0", "a0")
        coord.add("n1", "b0")  # from a0, over the group they form
        coord.wait_ready()
        coord.wait_formed(coord.form([["a0", "b0"]]))
        coord.run_until(lambda: n1.has_weights, 60, "n1 to keep the weights b0 received")
        coord.add("n1", "b1")  # from n1's own shared memory, in n1's agent process
        coord.wait_ready()
        sources = {e.data["member"]: e.data["source"] for e in coord.events if e.kind == "ready"}
        assert sources == {"a0": "node", "b0": "none", "b1": "node"}
        for name in ("a0", "b0", "b1"):
            assert coord.digest(name) == want, name
        members = [h.pid for h in coord.members.values()]

        # The coordinator goes away; n1's agent process stays, stops its members and keeps the weights.
        n1.close(shutdown=False)
        assert wait_gone([coord.members["b0"].pid, coord.members["b1"].pid])
        assert not gone(n1.pid)
        again = RemoteAgent.connect(n1.address, SPEC, authkey=n1.authkey)  # a restarted coordinator
        assert again.has_weights and again.pid == n1.pid
        again.close(shutdown=False)
    finally:
        coord.close()
        n1.close(shutdown=True)
    assert wait_gone(members + [n0.pid, n1.pid])


def test_losing_a_whole_node_mid_rollout_resumes_the_request_on_the_other_node(checkpoint):
    path, _ = checkpoint
    nodes = [RemoteAgent.start("n0", SPEC, checkpoint=path, load_weights=True),
             RemoteAgent.start("n1", SPEC, checkpoint=path, load_weights=True)]
    queue = PullQueue(WallClock(), lease_s=600.0)
    # At most 32 of the 64 image tokens per device: groups of 2, so 2 members per node make 2 groups.
    coord = Coordinator(SPEC, nodes, queue, step_time=UlyssesStepTime(), max_tokens_per_device=32)
    try:
        for node in ("n0", "n1"):
            for i in range(2):
                coord.add(node, f"{node}m{i}")
        coord.wait_ready()
        coord.wait_formed()
        serve_undisturbed_then_disturbed_to_step(queue, coord, 3)
        serving = next(g for g in coord.groups.values() if g.lease is not None)
        lost_node = next(n for n in nodes if n.node == coord.members[serving.members[0]].node)
        doomed = [h.pid for h in coord.members.values() if h.node == lost_node.node]
        os.kill(lost_node.pid, signal.SIGKILL)  # the node is reclaimed: agent and members, no notice
        coord.run_until(lambda: queue.is_done(["disturbed"]), 120, "the resumed request")

        ref, got = queue.result("undisturbed"), queue.result("disturbed")
        assert torch.equal(got.trajectory, ref.trajectory)
        assert torch.equal(got.log_probs, ref.log_probs)
        stats = queue.stats()
        assert stats["requests_resumed"] == 1 and stats["steps_resumed"] >= 3
        lost = {e.data["member"] for e in coord.events if e.kind == "lost"}
        assert lost == {h.name for h in coord.members.values() if h.node == lost_node.node}
        assert wait_gone(doomed)  # members exit when their agent's pipe closes
    finally:
        coord.close()


# ---- the control plane against silent, hostile and malformed peers --------------------------------

HANDSHAKE_S = 2.0
"""The shared server's handshake timeout: short, so the cases that wait it out stay fast."""


class Server:
    """`python -m elastic_sp.agent_server` started by hand, its stderr kept in a file."""

    def __init__(self, tmp, key: str, *flags: str) -> None:
        self.key = key.encode()
        self.stderr_path = tmp / "agent.stderr"
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "elastic_sp.agent_server", "--node", "n0", "--listen", "127.0.0.1:0", *flags],
                stdout=subprocess.PIPE, stderr=err, text=True,
                env={**os.environ, "SPOTLIGHT_SP_AUTHKEY": key, "OMP_NUM_THREADS": "1"})
        line = self.proc.stdout.readline()
        assert line.startswith(READY_LINE), (line, self.stderr())
        host, port = line[len(READY_LINE):].strip().rsplit(":", 1)
        self.address = (host, int(port))

    def stderr(self) -> list[str]:
        return self.stderr_path.read_text().splitlines()

    def coordinator(self):
        """A signed connection that has done the Setup, as `RemoteAgent.connect` does."""
        conn = connect(self.address, self.key, 5.0, WIRE_TYPES)
        conn.send(Setup(SPEC))
        assert isinstance(conn.recv(), Hello)
        return conn

    def vm_peak_kb(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmPeak:"))


def dropped(sock: socket.socket, within_s: float = 10.0) -> bool:
    """Whether the server closed this connection (reading the rest of what it sent, if anything)."""
    sock.settimeout(within_s)
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:  # closed with our bytes unread: also closed
        pass
    except TimeoutError:
        return False
    return True


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One agent server for the control-plane cases (a start is a process importing torch, ~3 s)."""
    s = Server(tmp_path_factory.mktemp("agent"), secrets.token_hex(32), "--handshake-timeout-s", str(HANDSHAKE_S))
    yield s
    try:  # still up and serving after everything the cases sent: a coordinator ends it cleanly
        if s.proc.poll() is None:
            RemoteAgent.connect(s.address, SPEC, authkey=s.key).close(shutdown=True)
        assert s.proc.wait(15) == 0, s.stderr()
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
        s.proc.stdout.close()


def test_a_silent_connection_does_not_hold_up_a_coordinator(server):
    before = len(server.stderr())
    silent = [socket.create_connection(server.address) for _ in range(3)]  # connect, then say nothing
    try:
        t0 = time.monotonic()
        agent = RemoteAgent.connect(server.address, SPEC, authkey=server.key)
        connected_s = time.monotonic() - t0
        assert not agent.has_weights and agent.pid == server.proc.pid
        with pytest.raises(ValueError, match="no live weights"):  # a command and its reply, over the connection
            agent.spawn("m0", "node")
        agent.close(shutdown=False)
        # Each handshake has its own thread: the silent ones delay nobody (a server that handshook
        # them in turn would have kept this coordinator waiting 3 x HANDSHAKE_S).
        assert connected_s < HANDSHAKE_S, connected_s
        assert all(dropped(s, HANDSHAKE_S + 5) for s in silent)  # ... and are dropped at their deadline
    finally:
        for s in silent:
            s.close()
    time.sleep(0.2)
    lines = server.stderr()[before:]
    assert sum("in the handshake" in line and "handshake deadline passed" in line for line in lines) == 3, lines
    assert server.proc.poll() is None


def test_a_bad_message_ends_only_its_connection(server, tmp_path):
    marker = tmp_path / "PWNED"
    before = len(server.stderr())

    def garbage(conn):
        conn.sock.sendall(os.urandom(200))

    def wrong_signature(conn):
        frame = bytearray(conn.frame(encode(Kill("m0"), WIRE_TYPES)))
        frame[20] ^= 1  # a bit of the signature
        conn.sock.sendall(frame)

    def replayed(conn):
        frame = conn.frame(encode(Spawn("m0", "node"), WIRE_TYPES))  # harmless: refused, no live weights
        conn.sock.sendall(frame + frame)

    def signed_pickle(conn):  # the peer holds the key, and sends a pickle anyway
        conn.send_bytes(pickled(Payload(marker)))

    def command_that_does_not_apply(conn):
        conn.send(Kill("nobody"))

    cases = [garbage, wrong_signature, replayed, signed_pickle, command_that_does_not_apply]
    for case in cases:
        with closing(server.coordinator()) as conn:
            case(conn)
            assert dropped(conn.sock), case.__name__
    with closing(connect(server.address, server.key, 5.0, WIRE_TYPES)) as conn:  # a pickle instead of Setup
        conn.send_bytes(pickled(Payload(marker)))
        assert dropped(conn.sock)
    with pytest.raises(ProtocolError, match="refused our key"):
        connect(server.address, secrets.token_hex(32).encode(), 5.0, WIRE_TYPES)

    time.sleep(0.2)
    assert server.proc.poll() is None
    assert not marker.exists()
    lines = server.stderr()[before:]
    assert len([line for line in lines if "dropped coordinator" in line]) == len(cases) + 1, lines
    assert any("bad signature" in line for line in lines) and any("not an allowed value" in line for line in lines)
    assert any("numbered 1, expected 2 (replayed" in line for line in lines) and any("bad command" in line for line in lines)
    assert any("does not hold the key" in line for line in lines)
    assert not any("Traceback" in line for line in lines)
    agent = RemoteAgent.connect(server.address, SPEC, authkey=server.key)  # the next coordinator gets through
    assert agent.pid == server.proc.pid
    agent.close(shutdown=False)


def test_an_oversized_message_is_refused_unread(server):
    before = len(server.stderr())
    peak = server.vm_peak_kb()
    with closing(server.coordinator()) as conn:  # 1 GiB + 1 announced, over the default maximum: refused at once
        t0 = time.monotonic()
        conn.sock.sendall(struct.pack(">QQ32s", (1 << 30) + 1, 1, b"\x00" * 32))
        assert dropped(conn.sock, HANDSHAKE_S / 2) and time.monotonic() - t0 < HANDSHAKE_S / 2
    with closing(server.coordinator()) as conn:  # 1 GiB - 1: allowed, but never sent; only what arrives is held
        conn.sock.sendall(struct.pack(">QQ32s", (1 << 30) - 1, 1, b"\x00" * 32) + b"\x00" * 1000)
        assert dropped(conn.sock, HANDSHAKE_S + 5)
    time.sleep(0.2)
    lines = server.stderr()[before:]
    assert any("the maximum is 1073741824" in line for line in lines), lines
    assert any("stalled after 1000 of 1073741823 bytes" in line for line in lines), lines
    assert server.vm_peak_kb() - peak < 256 << 10  # not a GiB reserved, let alone touched
    assert server.proc.poll() is None


def test_a_spec_naming_another_builder_is_refused(server):
    """A coordinator names the module members build from; the server imports only the ones it was
    started to serve (`--builder`, default `spotlight.rl.sp_member`), and refuses the setup otherwise."""
    before = len(server.stderr())
    with pytest.raises(RuntimeError, match="refused the setup: builder 'json' is not one this agent serves"):
        RemoteAgent.connect(server.address, dataclasses.replace(SPEC, builder="json"), authkey=server.key)
    time.sleep(0.2)
    lines = server.stderr()[before:]
    assert len(lines) == 1 and "refused coordinator" in lines[0] and "'json'" in lines[0], lines
    assert server.proc.poll() is None
    with closing(socket.socket()) as sock:  # allowed, but not importable: refused too, not a failed member
        key = secrets.token_hex(32).encode()
        problem = AgentServer("n9", sock, key, builders=["no_such.builder"])._builder_problem(
            dataclasses.replace(SPEC, builder="no_such.builder"))
        assert AgentServer("n9", sock, key)._builder_problem(SPEC) is None
    assert problem is not None and problem.startswith("cannot import builder 'no_such.builder'"), problem


def test_a_short_key_is_refused_on_both_sides(server, monkeypatch):
    for key in ("too-short", ""):
        done = subprocess.run([sys.executable, "-m", "elastic_sp.agent_server", "--node", "n9"], capture_output=True,
                              text=True, timeout=120, env={**os.environ, "SPOTLIGHT_SP_AUTHKEY": key})
        assert done.returncode == 2 and done.stdout == "", done
        (line,) = done.stderr.splitlines()
        assert "SPOTLIGHT_SP_AUTHKEY" in line and "secrets.token_hex(32)" in line, line
        if key:
            assert "has 9 characters; it needs at least 32" in line
    with pytest.raises(ValueError, match="at least 32"):
        RemoteAgent.connect(server.address, SPEC, authkey=b"k" * 31)
    monkeypatch.setenv("SPOTLIGHT_SP_AUTHKEY", "k" * 31)
    with pytest.raises(ValueError, match="SPOTLIGHT_SP_AUTHKEY has 31 characters"):
        RemoteAgent.connect(server.address, SPEC)
    with pytest.raises(ValueError, match="SPOTLIGHT_SP_AUTHKEY has 31 characters"):
        RemoteAgent.start("n9", SPEC)  # refused before a process is started
