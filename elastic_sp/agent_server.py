"""The node agent as its own long-lived process, and the coordinator's handle on it.

    python -m elastic_sp.agent_server --node NAME [--listen HOST:PORT]

A node runs one agent server for as long as the node lives. It listens on TCP for one coordinator
at a time (multiprocessing's authenticated connections: an HMAC challenge with the key in
$SPOTLIGHT_SP_AUTHKEY) and runs a `NodeAgent` for it: the coordinator's commands go to the
members, and the members' reports come back tagged with the member's name; a member's death comes
back as `agent.Lost`. Everything crosses the connection as a plain pickle (tensors by value), so
the coordinator may run on another machine; the node's shared-memory weights never leave the node
(an `Exported` report is relayed without its tensors).

When the coordinator's connection ends, the server stops that coordinator's members but keeps the
node's weights and waits for the next coordinator: a restarted controller finds the node's copy
still live. `Close(shutdown=True)` ends the server.

Losing the node itself (the agent process killed, as a reclaimed VM takes it) ends its members
too — each exits when its pipe to the agent closes — and `RemoteAgent` reports every member of the
node lost when the connection ends.
"""

from __future__ import annotations

import argparse
import os
import pickle
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener, wait
from pathlib import Path
from typing import Any

from elastic_sp import protocol as P
from elastic_sp.agent import Lost, MemberHandle, NodeAgent, Source
from elastic_sp.spec import ServeSpec
from elastic_sp.weights import NodeWeights

AUTHKEY_ENV = "SPOTLIGHT_SP_AUTHKEY"
READY_LINE = "agent listening on "
"""The server's first line on stdout, followed by HOST:PORT (how a launcher learns a port 0 choice)."""

# ---- coordinator -> agent ------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """Start serving `spec`. `load_weights`: read `checkpoint` into the node's shared memory now
    (a node that starts the deployment); otherwise members may still cold-start from it."""

    spec: ServeSpec
    checkpoint: str | None = None
    load_weights: bool = False
    start_method: str = "forkserver"


@dataclass(frozen=True)
class Spawn:
    name: str
    source: Source
    start_method: str | None = None
    device: str | None = None


@dataclass(frozen=True)
class ToMember:
    name: str
    msg: Any


@dataclass(frozen=True)
class Kill:
    name: str


@dataclass(frozen=True)
class Stop:
    name: str
    timeout_s: float


@dataclass(frozen=True)
class Close:
    shutdown: bool


# ---- agent -> coordinator ------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    node: str
    pid: int
    has_weights: bool


@dataclass(frozen=True)
class Spawned:
    name: str
    pid: int
    device: str
    started: float


@dataclass(frozen=True)
class Refused:
    error: str


@dataclass(frozen=True)
class Stopped:
    name: str
    exitcode: int | None


@dataclass(frozen=True)
class Closed:
    pass


@dataclass(frozen=True)
class Relay:
    member: str
    msg: Any
    """A member's report (`protocol`), or `agent.Lost`."""


def _send(conn: Connection, msg: Any) -> None:
    conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def _no_delay(conn: Connection) -> Connection:
    """Send small messages at once: with Nagle's algorithm a step's report can wait ~40 ms for the
    peer's delayed ACK, which would double the time a regroup takes to serve again."""
    with socket.fromfd(conn.fileno(), socket.AF_INET, socket.SOCK_STREAM) as sock:  # a dup of the same socket
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _authkey() -> bytes:
    key = os.environ.get(AUTHKEY_ENV)
    if not key:
        raise ValueError(f"${AUTHKEY_ENV} is not set: agent server and coordinator authenticate with it")
    return key.encode()


# ---- the server ----------------------------------------------------------------------------------


class AgentServer:
    """One node's agent process (see the module docstring)."""

    def __init__(self, node: str, listener: Listener) -> None:
        self.node = node
        self.listener = listener
        self.kept: tuple[ServeSpec, NodeWeights] | None = None
        """The node's weights, kept across coordinators for the spec they belong to."""

    def serve_forever(self) -> None:
        while True:
            try:
                conn = self.listener.accept()
            except (OSError, EOFError, AuthenticationError):  # a wrong key, or a client that hung up at once
                continue
            with _no_delay(conn):
                if self.session(conn):
                    return

    def session(self, conn: Connection) -> bool:
        """Serve one coordinator; True when it asked the server to shut down."""
        try:
            setup = _recv(conn)
        except (EOFError, OSError):
            return False
        if not isinstance(setup, Setup):
            _send(conn, Refused(f"expected Setup first, got {type(setup).__name__}"))
            return False
        weights = self.kept[1] if self.kept is not None and self.kept[0] == setup.spec else None
        if weights is None and setup.load_weights and setup.checkpoint is not None:
            weights = NodeWeights.from_checkpoint(setup.checkpoint)
        agent = NodeAgent(self.node, setup.spec, weights, setup.checkpoint, setup.start_method)
        try:
            _send(conn, Hello(self.node, os.getpid(), agent.has_weights))
            while True:
                for obj in wait([conn, *agent.waitables()]):
                    if obj is conn:
                        cmd = _recv(conn)
                        if isinstance(cmd, Close):
                            agent.close()
                            _send(conn, Closed())
                            return cmd.shutdown
                        self._command(conn, agent, cmd)
                    else:
                        for name, msg in agent.receive(obj):
                            if isinstance(msg, P.Exported):  # the tensors stay on the node
                                msg = P.Exported(msg.member, {})
                            _send(conn, Relay(name, msg))
        except (EOFError, OSError):  # the coordinator is gone: its members go, the weights stay
            return False
        finally:
            agent.close()
            if agent.weights is not None:
                self.kept = (setup.spec, agent.weights)

    @staticmethod
    def _command(conn: Connection, agent: NodeAgent, cmd: Any) -> None:
        if isinstance(cmd, ToMember):
            agent.send(cmd.name, cmd.msg)
        elif isinstance(cmd, Spawn):
            try:
                h = agent.spawn(cmd.name, cmd.source, cmd.start_method, cmd.device)
            except ValueError as err:
                _send(conn, Refused(str(err)))
                return
            _send(conn, Spawned(h.name, h.pid, h.device, h.started))
        elif isinstance(cmd, Kill):
            agent.kill(cmd.name)
        elif isinstance(cmd, Stop):
            agent.stop(cmd.name, cmd.timeout_s)
            _send(conn, Stopped(cmd.name, agent.members[cmd.name].exitcode))
        else:
            _send(conn, Refused(f"unknown command {type(cmd).__name__}"))


# ---- the coordinator's handle --------------------------------------------------------------------


class RemoteAgent:
    """`agent.Agent` over a connection to an agent server."""

    def __init__(self, conn: Connection, hello: Hello, address: tuple[str, int], authkey: bytes,
                 process: subprocess.Popen | None = None) -> None:
        self.conn: Connection | None = conn
        self.node = hello.node
        self.pid = hello.pid
        self.address = address
        self.authkey = authkey
        """What a later coordinator connects with (`connect(address, ..., authkey=...)`)."""
        self.process = process
        """The server process, when this handle started it (`start`); closing the handle ends it."""
        self.members: dict[str, MemberHandle] = {}
        self._has_weights = hello.has_weights
        self._inbox: list[Relay] = []

    @classmethod
    def connect(cls, address: tuple[str, int], spec: ServeSpec, checkpoint: str | Path | None = None,
                load_weights: bool = False, start_method: str = "forkserver", authkey: bytes | None = None,
                process: subprocess.Popen | None = None) -> RemoteAgent:
        authkey = authkey or _authkey()
        conn = _no_delay(Client(address, authkey=authkey))
        _send(conn, Setup(spec, None if checkpoint is None else str(checkpoint), load_weights, start_method))
        hello = _recv(conn)
        if not isinstance(hello, Hello):
            conn.close()
            raise RuntimeError(f"agent at {address[0]}:{address[1]} refused the setup: {getattr(hello, 'error', hello)}")
        return cls(conn, hello, address, authkey, process)

    @classmethod
    def start(cls, node: str, spec: ServeSpec, checkpoint: str | Path | None = None, load_weights: bool = False,
              host: str = "127.0.0.1", timeout_s: float = 120.0) -> RemoteAgent:
        """Start an agent server for `node` as a new process on this machine and connect to it."""
        key = os.environ.get(AUTHKEY_ENV) or secrets.token_hex(16)
        env = {**os.environ, AUTHKEY_ENV: key, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "elastic_sp.agent_server", "--node", node, "--listen", f"{host}:0"],
                                stdout=subprocess.PIPE, env=env, text=True)
        try:
            ready = _first_line(proc, timeout_s)
            if not ready.startswith(READY_LINE):
                raise RuntimeError(f"agent server for {node} did not start (exit code {proc.poll()}): {ready!r}")
            h, p = ready[len(READY_LINE):].strip().rsplit(":", 1)
            return cls.connect((h, int(p)), spec, checkpoint, load_weights, authkey=key.encode(), process=proc)
        except BaseException:
            proc.kill()
            proc.wait()
            raise

    # -- the Agent interface --

    @property
    def has_weights(self) -> bool:
        return self._has_weights

    @property
    def buffered(self) -> bool:
        """Reports read while waiting for a reply, not yet handed out by `receive`."""
        return bool(self._inbox)

    def spawn(self, name: str, source: Source, start_method: str | None = None,
              device: str | None = None) -> MemberHandle:
        reply = self._call(Spawn(name, source, start_method, device), Spawned)
        handle = MemberHandle(name, self.node, source, reply.started, reply.device, pid=reply.pid)
        self.members[name] = handle
        return handle

    def send(self, name: str, msg: Any) -> None:
        self._post(ToMember(name, msg))

    def kill(self, name: str) -> None:
        self._post(Kill(name))

    def stop(self, name: str, timeout_s: float = 5.0) -> None:
        reply = self._call(Stop(name, timeout_s), Stopped)
        self._ended(self.members[name], reply.exitcode)

    def waitables(self) -> list[Any]:
        return [self.conn] if self.conn is not None else []

    def receive(self, obj: Any) -> list[tuple[str, Any]]:
        relays, self._inbox = self._inbox, []
        try:
            while self.conn is not None and self.conn.poll():
                relays.append(_recv(self.conn))
        except (EOFError, OSError):  # the node is gone, and every member with it
            self._disconnect()
            relays += [Relay(h.name, Lost(h.name, None)) for h in self.members.values() if h.alive]
        out = []
        for r in relays:
            if not isinstance(r, Relay):
                continue  # a late reply to a call that gave up
            if isinstance(r.msg, P.Exported):
                self._has_weights = True
            if isinstance(r.msg, Lost):
                self._ended(self.members[r.member], r.msg.exitcode)
            out.append((r.member, r.msg))
        return out

    def close(self, shutdown: bool | None = None, timeout_s: float = 15.0) -> None:
        """Stop this coordinator's members; end the server too when this handle started it (or
        `shutdown` says so). The node's weights stay with a server that keeps running."""
        shutdown = self.process is not None if shutdown is None else shutdown
        if self.conn is not None:
            try:
                self._call(Close(shutdown), Closed, timeout_s)
            except (RuntimeError, TimeoutError):
                pass
            self._disconnect()
        for h in self.members.values():
            h.alive = False
        if self.process is not None and shutdown:
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            if self.process.stdout is not None:
                self.process.stdout.close()

    # -- internals --

    def _post(self, msg: Any) -> None:
        """Send without waiting; a dead connection is reported by `receive` as the node's loss."""
        if self.conn is None:
            return
        try:
            _send(self.conn, msg)
        except OSError:
            pass

    def _call(self, msg: Any, reply_type: type, timeout_s: float = 60.0) -> Any:
        """Send `msg` and wait for its reply; reports arriving meanwhile are kept for `receive`."""
        if self.conn is None:
            raise RuntimeError(f"agent of node {self.node} is gone")
        try:
            _send(self.conn, msg)
            deadline = time.monotonic() + timeout_s
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not self.conn.poll(left):
                    raise TimeoutError(f"agent of node {self.node}: no reply to {type(msg).__name__} in {timeout_s} s")
                reply = _recv(self.conn)
                if isinstance(reply, Relay):
                    self._inbox.append(reply)
                elif isinstance(reply, Refused):
                    raise ValueError(reply.error)
                elif isinstance(reply, reply_type):
                    return reply
        except (EOFError, OSError):
            self._inbox += [Relay(h.name, Lost(h.name, None)) for h in self.members.values() if h.alive]
            self._disconnect()
            raise RuntimeError(f"agent of node {self.node} is gone") from None

    def _ended(self, handle: MemberHandle, exitcode: int | None) -> None:
        handle.alive, handle.exitcode = False, exitcode

    def _disconnect(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def __enter__(self) -> RemoteAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _first_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The first line the process prints; "" if it exits first."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if wait([proc.stdout], 0.5):
            return proc.stdout.readline()
        if proc.poll() is not None:
            return ""
    raise TimeoutError(f"agent server did not start within {timeout_s} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m elastic_sp.agent_server",
                                     description="A node's SP agent: owns the node's member processes and its live "
                                                 f"weights, serving one coordinator at a time (key: ${AUTHKEY_ENV}).")
    parser.add_argument("--node", required=True, help="this node's name, as the coordinator calls it")
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to listen on (port 0: any free one)")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        parser.error(f"--listen: expected HOST:PORT, got {args.listen!r}")
    try:
        key = _authkey()
    except ValueError as err:
        parser.error(str(err))
    with Listener((host, int(port)), authkey=key) as listener:
        bound_host, bound_port = listener.address
        print(f"{READY_LINE}{bound_host}:{bound_port}", flush=True)
        AgentServer(args.node, listener).serve_forever()
    return 0


if __name__ == "__main__":
    # Run the module under its own name: messages pickle their classes as elastic_sp.agent_server.*,
    # which is what the coordinator's side unpickles (and sends), never as __main__.*.
    from elastic_sp import agent_server

    sys.exit(agent_server.main())
