"""The node agent as its own long-lived process, and the coordinator's handle on it.

    python -m elastic_sp.agent_server --node NAME [--listen HOST:PORT] [--handshake-timeout-s 5] [--builder MODULE]

A node runs one agent server for as long as the node lives. It listens on TCP for one coordinator
at a time and runs a `NodeAgent` for it: the coordinator's commands go to the members, and the
members' reports come back tagged with the member's name; a member's death comes back as
`agent.Lost`. The coordinator may run on another machine; the node's shared-memory weights never
leave the node (an `Exported` report is relayed without its tensors).

The connection is a `signed_connection.SignedConnection` (its docstring has the wire format):
both sides prove they hold the key in $SPOTLIGHT_SP_AUTHKEY (at least 32 characters), then every
message is data of `WIRE_TYPES` (`cloud.codec`: tensors by value, no pickles), numbered and signed
with a per-connection key. Cleartext: integrity, not confidentiality — listen on a private network.
Invariants, tested in tests/test_elastic_sp_agent_server.py:
- A silent or slow connection is dropped `handshake_timeout_s` after it was accepted and never
  delays another: each handshake runs in its own thread
  (test_a_silent_connection_does_not_hold_up_a_coordinator).
- A flood of connections that never authenticate does not keep a coordinator out: a new connection
  is never refused, it evicts a pending one of the address holding the most (`PendingHandshakes`);
  lines about such peers are rate-limited per address (`PeerLog`)
  (test_a_flood_of_silent_connections_does_not_lock_out_a_coordinator,
  test_pending_handshakes_evict_the_oldest_of_the_heaviest_address,
  test_the_peer_log_writes_a_burst_then_one_line_per_interval_with_the_count).
- A message with a bad signature, a stale sequence number, an oversized length, or that is not
  data of `WIRE_TYPES` (a pickle included: never unpickled) ends that connection only, with one
  line on stderr; the server keeps the node's weights and serves the next coordinator
  (test_a_bad_message_ends_only_its_connection, test_an_oversized_message_is_refused_unread).
- A key shorter than 32 characters is refused on both sides, with one line
  (test_a_short_key_is_refused_on_both_sides).
- A spec whose builder (`spec.Builder`: the module members import to build the model) is not one
  the server was started to serve (`--builder`, default `spec.DEFAULT_BUILDER`), or cannot be
  imported, is refused at the setup: a coordinator names a module, never code
  (test_a_spec_naming_another_builder_is_refused).

When the coordinator's connection ends, the server stops that coordinator's members but keeps the
node's weights and waits for the next coordinator: a restarted controller finds the node's copy
still live. `Close(shutdown=True)` ends the server.

Losing the node itself (the agent process killed, as a reclaimed VM takes it) ends its members
too — each exits when its pipe to the agent closes — and `RemoteAgent` reports every member of the
node lost when the connection ends.
"""

from __future__ import annotations

import argparse
import itertools
import os
import queue
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from elastic_sp import protocol as P
from elastic_sp.agent import Lost, MemberHandle, NodeAgent, Source, preload
from elastic_sp.signed_connection import (
    MAX_MESSAGE_BYTES,
    ProtocolError,
    SignedConnection,
    accept,
    check_key,
    connect,
)
from elastic_sp.spec import DEFAULT_BUILDER, ServeSpec
from elastic_sp.weights import NodeWeights
from schedulers.clock import Clock, WallClock
from schedulers.request import Kind, Request
from schedulers.sample_state import SampleState

AUTHKEY_ENV = "SPOTLIGHT_SP_AUTHKEY"
READY_LINE = "agent listening on "
"""The server's first line on stdout, followed by HOST:PORT (how a launcher learns a port 0 choice)."""
HANDSHAKE_TIMEOUT_S = 2.0
"""A connection must complete its handshake within this long of being accepted (and, once
authenticated, never stall longer mid-message). A real one takes 0.35 ms on localhost (median of
200) plus one round trip of the network; over a 300 ms intercontinental round trip that loses one
segment it takes ~1.2 s (Linux resends after ~3 round trips on a new connection). It is also how
long a silent peer holds a pending slot: at 5 s, 64 silent sockets re-opened as they were dropped
kept every coordinator out (issue 27)."""
CONNECT_TIMEOUT_S = 5.0
"""The coordinator's side of the handshake, TCP's own included: a lost SYN is sent again after 1 s,
then 3 s, so it waits longer than the server."""
MAX_PENDING_HANDSHAKES = 256
"""Connections accepted and not yet authenticated, at once. Each is a thread blocked in select
(28 KiB of RSS and 0.13 ms to start: 256 cost 7 MiB). When all are taken, a new connection evicts
one (`PendingHandshakes`); refusing it instead let 64 silent sockets lock coordinators out."""
PEER_LOG_BURST = 5
"""Lines about one unauthenticated peer address written at once before the rate limit applies:
enough for a few failed handshakes of a misconfigured coordinator (a wrong key) to be seen whole."""
PEER_LOG_EVERY_S = 10.0
"""After the burst, one line per address per this long, saying how many were not written: a flood
that once wrote thousands of lines writes 6 a minute, and an operator learns of it within 10 s."""

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


WIRE_TYPES: tuple[type, ...] = (
    Setup, Spawn, ToMember, Kill, Stop, Close, Hello, Spawned, Refused, Stopped, Closed, Relay,
    P.Form, P.Run, P.Forward, P.Halt, P.Export, P.Digest, P.Stop,
    P.Ready, P.Formed, P.Committed, P.Output, P.Broken, P.Exported, P.Digested, P.Failed,
    Lost, Request, Kind, SampleState, ServeSpec,
)
"""Every class that may cross the connection; decoding builds no other (`cloud.codec`). The spec is
plain data: the workload's run config crosses as text, and none of its classes is needed here."""


def _authkey() -> bytes:
    key = os.environ.get(AUTHKEY_ENV)
    if not key:
        raise ValueError(f"${AUTHKEY_ENV} is not set: agent server and coordinator authenticate with it "
                         "(make one with: python -c \"import secrets; print(secrets.token_hex(32))\")")
    return check_key(key.encode(), f"${AUTHKEY_ENV}")


_LOG_LOCK = threading.Lock()


def _log(line: str) -> None:
    """One whole line on stderr. Handshakes log from their own threads, and `print` writes the text
    and the newline separately: two threads' lines came out spliced into one."""
    with _LOG_LOCK:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


# ---- before authentication -----------------------------------------------------------------------


class PendingHandshakes:
    """The connections accepted and not yet authenticated, by peer address: at most `capacity`.

    Invariants (test_pending_handshakes_evict_the_oldest_of_the_heaviest_address):
    - `admit` always admits. When `capacity` are pending, the newcomer evicts the oldest handshake
      of the address holding the most, the newcomer counted (a tie: the address whose oldest is
      oldest). An address's budget is thus its fair share of `capacity`: a flood evicts its own
      handshakes first, never one of an address that holds fewer — a coordinator connecting from
      another address than the flood is never evicted.
    - Connections from one address (a NAT, loopback) are evicted oldest first: a coordinator behind
      the flood's address keeps its slot until `capacity` newer connections arrive. At 256 that is
      ~0.2 s against a flood re-opening ~1,000 connections a second on loopback, where a real
      handshake took 15 ms (median; 60 ms the most, of 150 made during that flood).
    Thread-safe: the accept loop admits, the handshake threads release. `admit` calls `evict` on
    the evicted handshake under the lock, so a `release` that says it was evicted comes after that
    call: its thread may close the socket without racing the eviction's shutdown (a socket closed
    meanwhile could have its file descriptor reused).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity: expected at least 1 pending handshake, got {capacity}")
        self.capacity = capacity
        self._by_address: dict[str, dict[Hashable, int]] = {}
        """Each address's pending handshakes, oldest first, with the number they were admitted as."""
        self._count = 0
        self._numbers = itertools.count()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._count

    def count(self, address: str) -> int:
        return len(self._by_address.get(address, ()))

    def admit(self, handshake: Hashable, address: str,
              evict: Callable[[Hashable], None] = lambda handshake: None) -> tuple[Hashable, str] | None:
        """Add `handshake` from `address`; the handshake it evicted (after `evict(it)`) and its
        address, or None."""
        with self._lock:
            evicted = None
            if self._count >= self.capacity:
                victim = max(self._by_address.items(),
                             key=lambda item: (len(item[1]) + (item[0] == address), -next(iter(item[1].values()))))[0]
                evicted = (next(iter(self._by_address[victim])), victim)
                self._remove(*evicted)
                evict(evicted[0])
            self._by_address.setdefault(address, {})[handshake] = next(self._numbers)
            self._count += 1
            return evicted

    def release(self, handshake: Hashable, address: str) -> bool:
        """Remove `handshake`, done: True if it was still pending, False if it had been evicted."""
        with self._lock:
            if handshake not in self._by_address.get(address, ()):
                return False
            self._remove(handshake, address)
            return True

    def _remove(self, handshake: Hashable, address: str) -> None:
        queue = self._by_address[address]
        del queue[handshake]
        if not queue:
            del self._by_address[address]
        self._count -= 1


@dataclass
class _Bucket:
    tokens: float
    at: float
    hidden: int = 0
    hidden_since: float = 0.0


class PeerLog:
    """Lines about peers that have not authenticated, rate-limited per address: a token bucket of
    `burst` lines, refilled at one per `every_s`. A line over the budget is counted, not written;
    the next line written about that address says how many were not. At most `max_addresses` are
    remembered (the one least recently heard of is forgotten, its count with it), so a flood from
    many addresses costs bounded memory, though each new address gets its burst.
    (test_the_peer_log_writes_a_burst_then_one_line_per_interval_with_the_count)
    """

    def __init__(self, clock: Clock, write: Callable[[str], None], burst: int = PEER_LOG_BURST,
                 every_s: float = PEER_LOG_EVERY_S, max_addresses: int = 4096) -> None:
        self.clock = clock
        self.write = write
        self.burst = burst
        self.every_s = every_s
        self.max_addresses = max_addresses
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, address: str, line: str) -> bool:
        """Write `line` about `address` if its budget allows; whether it was written."""
        with self._lock:
            now = self.clock.now()
            b = self._buckets.pop(address, None) or _Bucket(float(self.burst), now)
            self._buckets[address] = b  # the most recently heard of goes last
            if len(self._buckets) > self.max_addresses:
                self._buckets.popitem(last=False)
            b.tokens, b.at = min(float(self.burst), b.tokens + (now - b.at) / self.every_s), now
            if b.tokens < 1:
                if not b.hidden:
                    b.hidden_since = now
                b.hidden += 1
                return False
            b.tokens -= 1
            if b.hidden:
                line += f" ({b.hidden} more about {address} in the last {now - b.hidden_since:.0f} s not written)"
                b.hidden = 0
            self.write(line)
            return True


# ---- the server ----------------------------------------------------------------------------------


class AgentServer:
    """One node's agent process (see the module docstring)."""

    def __init__(self, node: str, sock: socket.socket, key: bytes, handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
                 max_message_bytes: int = MAX_MESSAGE_BYTES, builders: Collection[str] = (DEFAULT_BUILDER,)) -> None:
        self.node = node
        self.sock = sock
        """The listening socket."""
        self.key = check_key(key, "the agent server's key")
        self.handshake_timeout_s = handshake_timeout_s
        self.max_message_bytes = max_message_bytes
        self.builders = frozenset(builders)
        """The builder modules a coordinator's spec may name (see the module docstring)."""
        self.kept: tuple[ServeSpec, NodeWeights] | None = None
        """The node's weights, kept across coordinators for the spec they belong to."""
        self.pending = PendingHandshakes(MAX_PENDING_HANDSHAKES)
        """Each entry is (socket, peer) of a connection in its handshake."""
        self.peer_log = PeerLog(WallClock(), _log)

    def serve_forever(self) -> None:
        """Accept in a thread, handshake each connection in a thread of its own (a silent one holds
        only its own thread, for at most the timeout), serve authenticated coordinators here, in
        the order they got through."""
        ready: queue.Queue[SignedConnection] = queue.Queue()
        threading.Thread(target=self._accept_loop, args=(ready,), name="sp-accept", daemon=True).start()
        while True:
            conn = ready.get()
            with conn:
                if self.session(conn):
                    return

    def _accept_loop(self, ready: queue.Queue[SignedConnection]) -> None:
        while True:
            try:
                sock, peer = self.sock.accept()
            except OSError:
                if self.sock.fileno() == -1:  # closed: the server is ending
                    return
                time.sleep(0.1)  # e.g. out of file descriptors: back off, do not spin
                continue
            evicted = self.pending.admit((sock, peer), peer[0], _shut)
            if evicted is not None:
                (_, victim_peer), address = evicted
                self.peer_log(address, f"agent {self.node}: dropped {victim_peer[0]}:{victim_peer[1]} in the "
                                       f"handshake: evicted by a newer connection ({len(self.pending)} pending, "
                                       f"{self.pending.count(address)} from {address})")
            try:
                threading.Thread(target=self._handshake, args=(sock, peer, ready), daemon=True,
                                 name=f"sp-handshake-{peer[0]}:{peer[1]}").start()
            except RuntimeError as err:  # can't start new thread: drop this one, keep accepting
                self.pending.release((sock, peer), peer[0])
                sock.close()
                self.peer_log(peer[0], f"agent {self.node}: dropped {peer[0]}:{peer[1]}: {_one_line(err)}")

    def _handshake(self, sock: socket.socket, peer: tuple, ready: queue.Queue[SignedConnection]) -> None:
        try:
            conn = accept(sock, self.key, self.handshake_timeout_s, WIRE_TYPES, self.max_message_bytes)
        except Exception as err:  # a wrong key, a silent or slow peer, a port scan: that connection only
            if self.pending.release((sock, peer), peer[0]):  # an evicted one was written about then
                self.peer_log(peer[0], f"agent {self.node}: dropped {peer[0]}:{peer[1]} in the handshake: "
                                       f"{_one_line(err)}")
            sock.close()
            return
        if self.pending.release((sock, peer), peer[0]):
            ready.put(conn)
        else:  # evicted as it got through: its socket is shut already
            conn.close()

    def session(self, conn: SignedConnection) -> bool:
        """Serve one coordinator; True when it asked the server to shut down. A message that breaks
        the protocol (bad signature or number, not data of `WIRE_TYPES`, a command that does not
        apply) ends this session like a coordinator that went away: one line on stderr."""
        try:
            setup = conn.recv()
        except ProtocolError as err:
            _log(f"agent {self.node}: dropped coordinator {conn.peer}: {_one_line(err)}")
            return False
        except (EOFError, OSError):
            return False
        if not isinstance(setup, Setup):
            self._refuse(conn, f"expected Setup first, got {type(setup).__name__}")
            return False
        problem = self._builder_problem(setup.spec)
        if problem is not None:
            _log(f"agent {self.node}: refused coordinator {conn.peer}: {problem}")
            self._refuse(conn, problem)
            return False
        weights = self.kept[1] if self.kept is not None and self.kept[0] == setup.spec else None
        if weights is None and setup.load_weights and setup.checkpoint is not None:
            try:
                weights = NodeWeights.from_checkpoint(setup.checkpoint)
            except Exception as err:  # a missing or unreadable checkpoint: refuse this setup, keep serving
                self._refuse(conn, f"cannot load {setup.checkpoint}: {_one_line(err)}")
                return False
        agent = NodeAgent(self.node, setup.spec, weights, setup.checkpoint, setup.start_method)
        try:
            conn.send(Hello(self.node, os.getpid(), agent.has_weights))
            while True:
                for obj in wait([conn, *agent.waitables()]):
                    if obj is conn:
                        cmd = conn.recv()
                        if isinstance(cmd, Close):
                            agent.close()
                            conn.send(Closed())
                            return cmd.shutdown
                        try:
                            self._command(conn, agent, cmd)
                        except (KeyError, ValueError, TypeError, AttributeError) as err:  # signed, but does not apply
                            raise ProtocolError(f"bad command {type(cmd).__name__} "
                                                f"({type(err).__name__}: {_one_line(err)})") from None
                    else:
                        for name, msg in agent.receive(obj):
                            if isinstance(msg, P.Exported):  # the tensors stay on the node
                                msg = P.Exported(msg.member, {})
                            conn.send(Relay(name, msg))
        except ProtocolError as err:
            _log(f"agent {self.node}: dropped coordinator {conn.peer}: {_one_line(err)}")
            return False
        except (EOFError, OSError):  # the coordinator is gone: its members go, the weights stay
            return False
        finally:
            agent.close()
            if agent.weights is not None:
                self.kept = (setup.spec, agent.weights)

    def _builder_problem(self, spec: ServeSpec) -> str | None:
        """Why this server does not serve `spec`'s builder, or None. Importing it here (members
        import it again, from the fork server's preload) turns a missing module into one refusal
        instead of a member that fails to start."""
        if spec.builder not in self.builders:
            return (f"builder {spec.builder!r} is not one this agent serves "
                    f"(--builder: {', '.join(sorted(self.builders))})")
        try:
            preload(spec)
        except Exception as err:
            return f"cannot import builder {spec.builder!r}: {_one_line(err)}"
        return None

    @staticmethod
    def _refuse(conn: SignedConnection, error: str) -> None:
        try:
            conn.send(Refused(error))
        except OSError:
            pass

    @staticmethod
    def _command(conn: SignedConnection, agent: NodeAgent, cmd: Any) -> None:
        if isinstance(cmd, ToMember):
            agent.send(cmd.name, cmd.msg)
        elif isinstance(cmd, Spawn):
            try:
                h = agent.spawn(cmd.name, cmd.source, cmd.start_method, cmd.device)
            except ValueError as err:
                conn.send(Refused(str(err)))
                return
            conn.send(Spawned(h.name, h.pid, h.device, h.started))
        elif isinstance(cmd, Kill):
            agent.kill(cmd.name)
        elif isinstance(cmd, Stop):
            agent.stop(cmd.name, cmd.timeout_s)
            conn.send(Stopped(cmd.name, agent.members[cmd.name].exitcode))
        else:
            conn.send(Refused(f"unknown command {type(cmd).__name__}"))


def _shut(handshake: tuple[socket.socket, tuple]) -> None:
    """End an evicted handshake's connection: wakes its thread from select (a close would not), and
    that thread closes the socket."""
    try:
        handshake[0].shutdown(socket.SHUT_RDWR)
    except OSError:  # the peer has gone already
        pass


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 200 else text[:197] + "..."


# ---- the coordinator's handle --------------------------------------------------------------------


class RemoteAgent:
    """`agent.Agent` over a connection to an agent server."""

    notice = None  # the agent server watches no notice source (a notice reaches its node by a drain)

    def __init__(self, conn: SignedConnection, hello: Hello, address: tuple[str, int], authkey: bytes,
                 process: subprocess.Popen | None = None) -> None:
        self.conn: SignedConnection | None = conn
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
                process: subprocess.Popen | None = None, handshake_timeout_s: float = CONNECT_TIMEOUT_S,
                max_message_bytes: int = MAX_MESSAGE_BYTES) -> RemoteAgent:
        """Connect to the agent server at `address` and set it up for `spec`. The key: `authkey`,
        else $SPOTLIGHT_SP_AUTHKEY; one shorter than 32 characters is a ValueError. Waits for the
        server's Hello as long as it takes (it may be loading the checkpoint, or serving the
        coordinator before this one)."""
        authkey = check_key(authkey, "the agent key") if authkey is not None else _authkey()
        conn = connect(address, authkey, handshake_timeout_s, WIRE_TYPES, max_message_bytes)
        try:
            conn.send(Setup(spec, None if checkpoint is None else str(checkpoint), load_weights, start_method))
            hello = conn.recv()
        except BaseException:
            conn.close()
            raise
        if not isinstance(hello, Hello):
            conn.close()
            raise RuntimeError(f"agent at {address[0]}:{address[1]} refused the setup: {getattr(hello, 'error', hello)}")
        return cls(conn, hello, address, authkey, process)

    @classmethod
    def start(cls, node: str, spec: ServeSpec, checkpoint: str | Path | None = None, load_weights: bool = False,
              host: str = "127.0.0.1", timeout_s: float = 120.0,
              max_message_bytes: int = MAX_MESSAGE_BYTES) -> RemoteAgent:
        """Start an agent server for `node` as a new process on this machine, serving `spec`'s
        builder, and connect to it (with $SPOTLIGHT_SP_AUTHKEY if set, else a fresh random key)."""
        key = _authkey().decode() if os.environ.get(AUTHKEY_ENV) else secrets.token_hex(32)
        env = {**os.environ, AUTHKEY_ENV: key, "OMP_NUM_THREADS": "1"}
        proc = subprocess.Popen([sys.executable, "-m", "elastic_sp.agent_server", "--node", node, "--listen", f"{host}:0",
                                 "--max-message-bytes", str(max_message_bytes), "--builder", spec.builder],
                                stdout=subprocess.PIPE, env=env, text=True)
        try:
            ready = _first_line(proc, timeout_s)
            if not ready.startswith(READY_LINE):
                raise RuntimeError(f"agent server for {node} did not start (exit code {proc.poll()}): {ready!r}")
            h, p = ready[len(READY_LINE):].strip().rsplit(":", 1)
            return cls.connect((h, int(p)), spec, checkpoint, load_weights, authkey=key.encode(), process=proc,
                               max_message_bytes=max_message_bytes)
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

    def publish(self, version: int, state: Any) -> None:
        raise NotImplementedError(f"agent server of node {self.node}: publishing new weights goes through Ray "
                                  "(elastic_sp.ray_agent); an agent server serves the weights it started with")

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
                relays.append(self.conn.recv())
        except (EOFError, OSError) as err:  # the node is gone, and every member with it
            self._dropped(err)
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
            self.conn.send(msg)
        except OSError:
            pass

    def _call(self, msg: Any, reply_type: type, timeout_s: float = 60.0) -> Any:
        """Send `msg` and wait for its reply; reports arriving meanwhile are kept for `receive`."""
        if self.conn is None:
            raise RuntimeError(f"agent of node {self.node} is gone")
        try:
            self.conn.send(msg)
            deadline = time.monotonic() + timeout_s
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not self.conn.poll(left):
                    raise TimeoutError(f"agent of node {self.node}: no reply to {type(msg).__name__} in {timeout_s} s")
                reply = self.conn.recv()
                if isinstance(reply, Relay):
                    self._inbox.append(reply)
                elif isinstance(reply, Refused):
                    raise ValueError(reply.error)
                elif isinstance(reply, reply_type):
                    return reply
        except (EOFError, OSError) as err:
            self._inbox += [Relay(h.name, Lost(h.name, None)) for h in self.members.values() if h.alive]
            self._dropped(err)
            raise RuntimeError(f"agent of node {self.node} is gone") from None

    def _ended(self, handle: MemberHandle, exitcode: int | None) -> None:
        handle.alive, handle.exitcode = False, exitcode

    def _dropped(self, err: BaseException) -> None:
        """The connection ended; one line on stderr when the server broke the protocol."""
        if isinstance(err, ProtocolError):
            _log(f"coordinator: dropped the agent of node {self.node}: {_one_line(err)}")
        self._disconnect()

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
                                                 f"weights, serving one coordinator at a time (key: ${AUTHKEY_ENV}, "
                                                 "at least 32 characters; messages are signed, not encrypted: "
                                                 "listen on a private network).")
    parser.add_argument("--node", required=True, help="this node's name, as the coordinator calls it")
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to listen on (port 0: any free one)")
    parser.add_argument("--handshake-timeout-s", type=float, default=HANDSHAKE_TIMEOUT_S,
                        help="drop a connection that has not authenticated within this many seconds "
                             f"(default {HANDSHAKE_TIMEOUT_S})")
    parser.add_argument("--max-message-bytes", type=int, default=MAX_MESSAGE_BYTES,
                        help=f"refuse a message announced larger than this (default {MAX_MESSAGE_BYTES})")
    parser.add_argument("--builder", action="append", dest="builders", metavar="MODULE",
                        help="a module a coordinator's spec may name to build the served model; repeat for more "
                             f"(default {DEFAULT_BUILDER})")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        parser.error(f"--listen: expected HOST:PORT, got {args.listen!r}")
    if not 0 < args.handshake_timeout_s < float("inf"):
        parser.error(f"--handshake-timeout-s: expected a number of seconds > 0, got {args.handshake_timeout_s}")
    if args.max_message_bytes <= 0:
        parser.error(f"--max-message-bytes: expected a positive integer, got {args.max_message_bytes}")
    try:
        key = _authkey()
    except ValueError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2
    try:
        sock = socket.create_server((host, int(port)))
    except OSError as err:  # the port is taken, the address is not this machine's
        print(f"{parser.prog}: error: --listen {args.listen}: cannot listen ({err.strerror or err})", file=sys.stderr)
        return 2
    with sock:
        bound_host, bound_port = sock.getsockname()[:2]
        print(f"{READY_LINE}{bound_host}:{bound_port}", flush=True)
        AgentServer(args.node, sock, key, args.handshake_timeout_s, args.max_message_bytes,
                    args.builders or (DEFAULT_BUILDER,)).serve_forever()
    return 0


if __name__ == "__main__":
    # Run the module under its own name: messages name their classes elastic_sp.agent_server.*,
    # which is what WIRE_TYPES allows on the coordinator's side (and sends), never __main__.*.
    from elastic_sp import agent_server

    sys.exit(agent_server.main())
