"""The node agent as a Ray actor, and the coordinator's handle on it: `agent.Agent` over Ray calls.

On a Ray cluster each node of the fleet runs one `NodeAgentActor` — Ray's facade over `AgentHost`,
a plain class — pinned to its node. It hosts a `NodeAgent` there: the node's member processes
(forked from the node's fork server, so members never restart when groups change) and the node's
live weights in shared memory. Ray carries the control plane both ways, and nothing else does:

- commands (`spawn`, `send`, `kill`, `stop`, `publish`, `close`) are actor calls. A threaded actor
  may run calls from one caller out of order, so the coordinator's handle numbers them and the
  host applies them strictly in that order; `spawn`, `stop` and `close` wait for their replies,
  the others do not (a dead node's loss is reported by the long poll, not by the call);
- reports go back by a long poll (`reports`): the handle keeps one call outstanding; Ray completes
  its future, whose callback queues the reports and wakes the coordinator through a socketpair
  (the handle's one waitable), and the coordinator's `receive` makes the next call. No thread of
  ours waits inside Ray: a thread blocked in `ray.get` when `ray.shutdown()` tears the core worker
  down crashes the process (SIGSEGV in `CoreWorker::GetObjects`, seen with Ray 2.60);
- the actor's death — its node SIGKILLed, as a preempted VM is, or its process alone — fails the
  long poll with `RayActorError`: every member of the node still alive is then reported `Lost`.
  How soon depends on Ray (a dead worker process: tens of ms; a dead node: its health checks).

Notices: given `notices` (a factory of `schedulers.preemption.NoticeSource`s: `runtime.notice_sources`
as `spotlight.runtime.rollout_worker.notice_sources` makes them), the host watches its node for a
preemption notice — the metadata endpoint, SIGTERM — on a `NoticeWatcher` thread, and sends the first
one it sees as a report of the node (`agent.NodeNoticed`); the handle keeps it as its `notice`, which
`fleet_executor.SPExecutor` acts on as on a drain. The sources are made in the constructor, which
Ray runs on the actor process's main thread (SIGTERM's handler can be installed only there; the
methods of a threaded actor run in other threads).

One thread of the host (its loop) owns the `NodeAgent` — the agent is not thread-safe — waiting on
the members' pipes and sentinels and on the commands' wake-up socket at once.

Weights: the actor starts with the run's current weights (an ObjectRef: Ray moves them to the node
once) as the node's live copy, so every member copies them in memory; `publish` replaces the live
copy with a new version, which every live member loads after the commands it got before
(`protocol.Load`). An `Exported` report is relayed without its tensors: they stay on the node.

Invariants (tests/spotlight/runtime/test_sp_train.py): a member's death shows up as `Lost` once, after what it said
before it; a SIGKILLed node shows up as every one of its live members `Lost`; commands reach
members in the order the coordinator issued them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import traceback
from multiprocessing.connection import wait
from collections.abc import Callable
from typing import Any

import ray

from elastic_sp import protocol as P
from elastic_sp.agent import Lost, MemberHandle, NodeAgent, NodeNoticed, Source
from elastic_sp.spec import ServeSpec
from elastic_sp.weights import NodeWeights

POLL_S = 1.0
"""Longest single long poll (an idle node's agent wakes the coordinator this often, to poll again)."""
CALL_TIMEOUT_S = 120.0
"""Longest wait for a reply (a spawn starts the node's fork server the first time: seconds)."""


class _Reply:
    """A command's reply, set by the host's loop, waited on by the actor call that posted it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: str | None = None


class AgentHost:
    """A `NodeAgent` behind numbered commands and a long poll (see the module docstring). Cheap to
    construct; `build()` takes the weights into shared memory and starts the loop."""

    def __init__(self, node: str, spec: ServeSpec, weights: dict[str, Any] | None = None, version: int = 0,
                 checkpoint: str | None = None, start_method: str = "forkserver",
                 notices: Callable[[Any], list[Any]] | None = None, notice_poll_s: float = 5.0) -> None:
        self.node = node
        self.spec = spec
        self._weights = weights
        self._version = version
        self._checkpoint = checkpoint
        self._start_method = start_method
        self.agent: NodeAgent | None = None
        self._commands: dict[int, tuple[str, tuple, _Reply | None]] = {}
        self._next = 0
        """Number of the next command to apply."""
        self._cond = threading.Condition()
        self._reports: list[tuple[str, Any]] = []
        self._failed: str | None = None
        """The loop's traceback, if it died."""
        self._closed = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._loop, name=f"sp-agent-{node}", daemon=True)
        self._notice_poll_s = notice_poll_s
        self._watcher: Any = None
        self._sources: list[Any] = []
        if notices is not None:  # here, on the main thread (see the module docstring)
            from schedulers.clock import WallClock

            self._clock = WallClock()
            self._sources = notices(self._clock)

    def build(self) -> dict[str, Any]:
        """Make the node's live copy and start the loop; returns where it runs: this process's pid
        and (in a Ray actor) its Ray node id and address."""
        if self.agent is None:
            weights = NodeWeights.share(self._weights, self._version) if self._weights is not None else None
            self._weights = None  # the shared-memory copy is the node's from now on
            self.agent = NodeAgent(self.node, self.spec, weights, self._checkpoint, self._start_method)
            self._thread.start()
            if self._sources:
                from schedulers.preemption import NoticeWatcher

                self._watcher = NoticeWatcher(self._sources, self._noticed, self._clock, self._notice_poll_s).start()
        if not ray.is_initialized():
            return {"pid": os.getpid(), "node_id": None, "ip": None}
        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "ip": ray.util.get_node_ip_address()}

    # ---- what the coordinator's handle calls ----------------------------------------------------

    def command(self, seq: int, op: str, *args: Any) -> None:
        """Command number `seq` (`op`: send, kill, publish), applied after every lower number."""
        self._post(seq, op, args, None)

    def call(self, seq: int, op: str, *args: Any) -> Any:
        """Command number `seq` (`op`: spawn, stop, close) whose reply the caller waits for."""
        reply = _Reply()
        self._post(seq, op, args, reply)
        if not reply.done.wait(CALL_TIMEOUT_S):
            raise TimeoutError(f"agent of node {self.node}: no reply to {op} in {CALL_TIMEOUT_S} s")
        if reply.error is not None:
            raise ValueError(reply.error)
        return reply.value

    def reports(self, timeout_s: float = POLL_S) -> list[tuple[str, Any]]:
        """What the members reported since the last call, waiting up to `timeout_s` for anything."""
        with self._cond:
            self._cond.wait_for(lambda: self._reports or self._failed or self._closed, timeout_s)
            if self._failed is not None:
                raise RuntimeError(f"agent of node {self.node} failed:\n{self._failed}")
            out, self._reports = self._reports, []
        return out

    def _noticed(self, notice: Any) -> None:
        """The watcher's callback (its thread; called once): report the notice as the node's."""
        with self._cond:
            self._reports.append((self.node, NodeNoticed(notice)))
            self._cond.notify_all()

    def _stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None
        for source in self._sources:
            if hasattr(source, "uninstall"):  # SIGTERM goes back to its previous handler
                source.uninstall()
        self._sources = []

    # ---- the loop -------------------------------------------------------------------------------

    def _post(self, seq: int, op: str, args: tuple, reply: _Reply | None) -> None:
        with self._cond:
            if self._failed is not None:
                raise RuntimeError(f"agent of node {self.node} failed:\n{self._failed}")
            self._commands[seq] = (op, args, reply)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _loop(self) -> None:
        agent = self.agent
        try:
            while not self._closed:
                for obj in wait([self._wake_r, *agent.waitables()], POLL_S):
                    if obj is self._wake_r:
                        self._wake_r.recv(4096)
                        continue
                    out = [(name, P.Exported(msg.member, {}) if isinstance(msg, P.Exported) else msg)
                           for name, msg in agent.receive(obj)]  # exported tensors stay on the node
                    if out:
                        with self._cond:
                            self._reports += out
                            self._cond.notify_all()
                self._apply()
        except BaseException:
            with self._cond:
                self._failed = traceback.format_exc()
                self._cond.notify_all()
                waiting = [reply for _, _, reply in self._commands.values() if reply is not None]
            for reply in waiting:  # calls waiting for a reply get the failure now, not at their timeout
                reply.error = f"agent of node {self.node} failed"
                reply.done.set()
            agent.close()

    def _apply(self) -> None:
        """Apply the commands that are next in number, in order."""
        while True:
            with self._cond:
                cmd = self._commands.pop(self._next, None)
                if cmd is None:
                    return
                self._next += 1
            op, args, reply = cmd
            try:
                value = self._run(op, args)
            except ValueError as err:  # refused (a name in use, no weights to copy): the caller's error
                if reply is None:
                    raise
                reply.error = str(err)
            except BaseException:  # the loop dies of it (`_loop`); its caller hears of it now
                if reply is not None:
                    reply.error = f"agent of node {self.node} failed on {op}"
                    reply.done.set()
                raise
            else:
                if reply is not None:
                    reply.value = value
            if reply is not None:
                reply.done.set()

    def _run(self, op: str, args: tuple) -> Any:
        agent = self.agent
        if op == "send":
            agent.send(*args)
        elif op == "kill":
            agent.kill(*args)
        elif op == "publish":
            agent.publish(*args)
        elif op == "spawn":
            h = agent.spawn(*args)
            return h.pid, h.device, h.started
        elif op == "stop":
            agent.stop(*args)
            return agent.members[args[0]].exitcode
        elif op == "close":
            self._stop_watching()
            agent.close()
            with self._cond:
                self._closed = True
                self._cond.notify_all()
        else:
            raise TypeError(f"unknown agent command {op!r}")
        return None


# num_cpus=0: the agent only starts and watches processes; its members use the node's devices.
# max_concurrency: the long poll holds one thread, a call waiting for its reply another; commands
# need one more to be taken in meanwhile (the host orders them itself).
NodeAgentActor = ray.remote(num_cpus=0, max_concurrency=8)(AgentHost)


class _NodeLost:
    """The actor is gone, and every member of the node with it."""


class RayAgent:
    """`agent.Agent` over Ray calls to a `NodeAgentActor` (see the module docstring). `start` makes
    the actor; the constructor only wraps one."""

    def __init__(self, node: str, actor: Any, has_weights: bool, where: dict[str, Any] | None = None) -> None:
        self.node = node
        self.actor = actor
        self.where = where or {}
        """Where the actor runs: its pid, Ray node id and address (`AgentHost.build`)."""
        self.members: dict[str, MemberHandle] = {}
        self.notice: Any = None
        """The first preemption notice the node's watcher reported (`agent.Agent.notice`)."""
        self._has_weights = has_weights
        self._seq = 0
        self._lock = threading.Lock()
        self._inbox: list[Any] = []
        self._closed = False
        self._polling = False
        """A long poll is outstanding (its callback re-arms nothing: `receive` does)."""
        self._gone = False
        """The actor is gone (or failed): no more long polls."""
        self._r, self._w = socket.socketpair()
        self._r.setblocking(False)

    @classmethod
    def start(cls, node: str, spec: ServeSpec, weights: Any = None, version: int = 0,
              options: dict[str, Any] | None = None, checkpoint: str | None = None,
              start_method: str = "forkserver", timeout_s: float = CALL_TIMEOUT_S,
              notices: Callable[[Any], list[Any]] | None = None, notice_poll_s: float = 5.0) -> RayAgent:
        """Start node `node`'s agent actor (Ray `options`: where it runs) holding `weights` (a state
        dict or its ObjectRef; None: no live copy) as weight version `version`, watching `notices`
        (see the module docstring; a module-level function, so Ray pickles it by name), and listen to it."""
        actor = NodeAgentActor.options(**(options or {})).remote(node, spec, weights, version, checkpoint,
                                                                 start_method, notices, notice_poll_s)
        try:
            where = ray.get(actor.build.remote(), timeout=timeout_s)
        except BaseException:
            ray.kill(actor, no_restart=True)
            raise
        agent = cls(node, actor, weights is not None, where)
        agent._poll()
        return agent

    # ---- the Agent interface --------------------------------------------------------------------

    @property
    def has_weights(self) -> bool:
        return self._has_weights

    def spawn(self, name: str, source: Source, start_method: str | None = None,
              device: str | None = None) -> MemberHandle:
        try:
            pid, device, started = self._call("spawn", name, source, start_method, device)
        except ray.exceptions.RayActorError:  # the node is gone: the member is lost with it
            pid, device, started = None, device or "?", time.time()
            self._deliver([(name, Lost(name, None))])
        handle = MemberHandle(name, self.node, source, started, device, pid=pid)
        self.members[name] = handle
        return handle

    def send(self, name: str, msg: Any) -> None:
        self._command("send", name, msg)

    def kill(self, name: str) -> None:
        self._command("kill", name)

    def stop(self, name: str, timeout_s: float = 5.0) -> None:
        try:
            exitcode = self._call("stop", name, timeout_s)
        except ray.exceptions.RayActorError:
            exitcode = None
        h = self.members[name]
        h.alive, h.exitcode = False, exitcode

    def publish(self, version: int, state: Any) -> None:
        """`state`: a state dict or its ObjectRef (Ray moves it to the node once)."""
        self._command("publish", version, state)
        self._has_weights = True

    def waitables(self) -> list[Any]:
        return [] if self._closed else [self._r]

    def receive(self, obj: Any) -> list[tuple[str, Any]]:
        with contextlib.suppress(BlockingIOError, OSError):
            while self._r.recv(4096):
                pass
        with self._lock:  # taken after draining: a wake-up after this finds the next items
            items, self._inbox = self._inbox, []
        self._poll()
        out: list[tuple[str, Any]] = []
        for item in items:
            if isinstance(item, _NodeLost):
                for h in self.members.values():
                    if h.alive:
                        h.alive, h.exitcode = False, None
                        out.append((h.name, Lost(h.name, None)))
            elif isinstance(item, BaseException):
                raise RuntimeError(f"agent of node {self.node}: {item}") from item
            else:
                name, msg = item
                if isinstance(msg, NodeNoticed):  # the node's, not a member's: kept for the executor
                    self.notice = self.notice or msg.notice
                    continue
                h = self.members.get(name)
                if isinstance(msg, Lost):
                    if h is None or not h.alive:
                        continue  # reported already (its node's loss came first)
                    h.alive, h.exitcode = False, msg.exitcode
                elif isinstance(msg, P.Exported):
                    self._has_weights = True
                out.append((name, msg))
        return out

    def close(self) -> None:
        """Stop the node's members and end the actor."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):  # a dead node: nothing left to stop
            self._call("close", timeout_s=15.0)
        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)
        for h in self.members.values():
            h.alive = False
        with self._lock:  # a late callback finds the socket closed and writes nothing
            self._r.close()
            self._w.close()

    # ---- internals ------------------------------------------------------------------------------

    def _next_seq(self) -> int:
        seq, self._seq = self._seq, self._seq + 1
        return seq

    def _command(self, op: str, *args: Any) -> None:
        """Fire and forget: a node that is gone is reported by the long poll."""
        if not self._closed:
            self.actor.command.remote(self._next_seq(), op, *args)

    def _call(self, op: str, *args: Any, timeout_s: float = CALL_TIMEOUT_S) -> Any:
        try:
            return ray.get(self.actor.call.remote(self._next_seq(), op, *args), timeout=timeout_s)
        except ray.exceptions.RayTaskError as err:
            cause = err.cause if isinstance(getattr(err, "cause", None), Exception) else err
            if isinstance(cause, ValueError):
                raise ValueError(str(cause)) from None
            raise

    def _deliver(self, items: list[Any]) -> None:
        with self._lock:
            self._inbox += items
            if not self._closed:
                with contextlib.suppress(OSError):
                    self._w.send(b"\0")

    def _poll(self) -> None:
        """Make the next long poll unless one is outstanding (see the module docstring)."""
        with self._lock:
            if self._polling or self._gone or self._closed:
                return
            self._polling = True
        self.actor.reports.remote(POLL_S).future().add_done_callback(self._polled)

    def _polled(self, future: Any) -> None:
        """The long poll's callback (in a thread of Ray's): queue what it brought, wake the coordinator."""
        try:
            out = future.result()
        except ray.exceptions.RayActorError:  # the actor is gone, and its node's members with it
            out = [_NodeLost()]
            self._gone = True
        except Exception as err:  # the host's loop failed
            out = [err]
            self._gone = True
        with self._lock:
            self._polling = False
        self._deliver(out)  # nothing new: the coordinator is woken all the same, to poll again
