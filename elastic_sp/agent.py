"""The per-node agent: one long-lived owner of a node's member processes and its live weights.

It starts a member process per device once and keeps it; regrouping never restarts one. It
holds the node's in-memory copy of the weights (`NodeWeights`: shared memory on CPU), from which a
member that joins the node takes its weights by an intra-node copy — the copy costs a memcpy,
where a restart costs an interpreter, the imports and a read from the checkpoint store.

Members are started from a fork server that has already imported torch, this package, the spec's
builder and what the builder lists (`spec.Builder.PRELOAD`: diffusers' transformer, for the DiT),
so a member joining a node is ready in a fraction of a second; `start_method="spawn"` gives what a
restart-based system pays (a fresh interpreter) and is what the cold-start baseline uses. Every
member is a daemon process, is killed by `close` if it does not stop when told, and exits by itself
when its agent's end of the pipe closes: no member outlives its agent.

The agent only starts, stops and watches processes and holds weights; which groups its members
form is the coordinator's business (`coordinator.py`). The coordinator sees every agent through
the `Agent` interface below: it waits on the agent's `waitables()` and reads what they carry with
`receive()` — the members' reports, and `Lost` for a member that died. `NodeAgent` is the agent
in the coordinator's own process (one node, or tests); `ray_agent.RayAgent` is the same interface
over Ray calls to an agent hosted in a Ray actor on its node (what `spotlight train` and
`spotlight bench sp-regroup` use). Between an agent and its members, messages are pickles on pipes
(`protocol.Channel`): those pipes join processes the agent itself started on the same node and
never cross a network.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import torch.multiprocessing as mp

from elastic_sp import protocol as P
from elastic_sp.spec import ServeSpec
from elastic_sp.weights import NodeWeights

Source = Literal["node", "peer", "checkpoint"]
"""Where a new member takes its weights: the node's live copy, a peer over its first group, or
the checkpoint store (only when no live copy exists anywhere)."""


def preload(spec: ServeSpec) -> list[str]:
    """What the fork server imports once, so that a member starts without importing torch, the
    model's library or the policy: the member module, the spec's builder, and what it lists."""
    return list(dict.fromkeys(["elastic_sp.member", spec.builder, *spec.builder_module().PRELOAD]))


_CHILD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


@contextlib.contextmanager
def _child_env() -> Iterator[None]:
    """Single-threaded math libraries in the processes started inside (a fork server inherits
    the environment it was started with, and its children inherit the fork server's)."""
    saved = {k: os.environ.get(k) for k in _CHILD_ENV}
    os.environ.update(_CHILD_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass(eq=False)
class MemberHandle:
    """What the coordinator knows of one member process."""

    name: str
    node: str
    source: Source
    started: float
    device: str
    pid: int | None = None
    ready: P.Ready | None = None
    alive: bool = True
    exitcode: int | None = None
    process: Any = None
    """The process object, for the agent that started it (None seen through a `ray_agent.RayAgent`)."""
    channel: P.Channel | None = None


class Agent(Protocol):
    """A node agent as the coordinator drives it (`NodeAgent` here, `ray_agent.RayAgent`)."""

    node: str
    members: dict[str, MemberHandle]
    notice: Any
    """The preemption notice the node's own watcher saw (a `schedulers.preemption.PreemptionNotice`;
    `ray_agent.RayAgent` watches `runtime.notice_sources` on its node), or None: none seen, or the
    agent watches nothing. `fleet_executor.SPExecutor` acts on it as on a drain of the node."""

    @property
    def has_weights(self) -> bool:
        """Whether the node holds a live copy of the weights (a new member can copy it)."""
        ...

    def spawn(self, name: str, source: Source, start_method: str | None = None,
              device: str | None = None) -> MemberHandle: ...

    def send(self, name: str, msg: Any) -> None:
        """A command to member `name`; a dead member's loss is reported by `receive`, not here."""
        ...

    def publish(self, version: int, state: Any) -> None:
        """New weights `state` (version `version`) become the node's live copy, and every live
        member loads them after what it was told before."""
        ...

    def kill(self, name: str) -> None: ...

    def stop(self, name: str, timeout_s: float = 5.0) -> None: ...

    def waitables(self) -> list[Any]:
        """Objects for `multiprocessing.connection.wait`; when one is ready, `receive(it)`."""
        ...

    def receive(self, obj: Any) -> list[tuple[str, Any]]:
        """(member, report) pairs that `obj` carries, in order; a member's death comes after what
        it said before it (its last commit counts) as `(member, Lost(...))`. The agent has already
        collected a lost member's process."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Lost:
    """A member process ended without being told to (SIGKILL, a crash, its node gone)."""

    member: str
    exitcode: int | None


@dataclass(frozen=True)
class NodeNoticed:
    """The node's notice watcher saw `notice`: the node is going away (a report of the node, not of
    a member; `receive` keeps it as the agent's `notice` and passes it on to no one)."""

    notice: Any


class NodeAgent:
    """The agent in the caller's process (see the module docstring)."""

    notice = None  # it watches no notice source: the caller's process is not a node of its own

    def __init__(self, node: str, spec: ServeSpec, weights: NodeWeights | None = None,
                 checkpoint: str | Path | None = None, start_method: str = "forkserver") -> None:
        self.node = node
        self.spec = spec
        self.weights = weights
        """The node's live copy; None until a member exports the weights it received from a peer."""
        self.checkpoint = str(checkpoint) if checkpoint is not None else None
        self.start_method = start_method
        self.members: dict[str, MemberHandle] = {}

    @property
    def has_weights(self) -> bool:
        return self.weights is not None

    def spawn(self, name: str, source: Source, start_method: str | None = None, device: str | None = None) -> MemberHandle:
        """Start member `name` (its Ready report arrives through `receive`). `source`: see `Source`."""
        if name in self.members and self.members[name].alive:
            raise ValueError(f"member {name!r} is already running on node {self.node}")
        if source == "node" and self.weights is None:
            raise ValueError(f"node {self.node} holds no live weights to copy to {name!r}")
        if source == "checkpoint" and self.checkpoint is None:
            raise ValueError(f"node {self.node} has no checkpoint path to load {name!r} from")
        method = start_method or self.start_method
        ctx = mp.get_context(method)
        if method == "forkserver":
            ctx.set_forkserver_preload(preload(self.spec))  # no effect once the server runs
        ours, theirs = ctx.Pipe()
        if device is None:  # one GPU per member: the lowest index no live member holds
            used = {h.device for h in self.members.values() if h.alive}
            device = "cpu" if self.spec.device == "cpu" else next(
                f"cuda:{i}" for i in range(len(used) + 1) if f"cuda:{i}" not in used)
        started = time.time()
        from elastic_sp.member import member_main

        weights = self.weights.tensors if source == "node" and self.weights is not None else None
        version = self.weights.version if weights is not None else None
        checkpoint = self.checkpoint if source == "checkpoint" else None
        proc = ctx.Process(target=member_main, name=f"sp-member-{name}", daemon=True,
                           args=(name, self.spec, theirs, device, weights, checkpoint, started, version))
        with _child_env():
            proc.start()
        theirs.close()
        handle = MemberHandle(name, self.node, source, started, device, pid=proc.pid, process=proc,
                              channel=P.Channel(ours))
        self.members[name] = handle
        return handle

    def adopt(self, tensors: dict[str, Any], version: int = 0) -> None:
        """Keep `tensors` (shared memory a member exported) as the node's live copy."""
        if self.weights is None:
            self.weights = NodeWeights(tensors, version)

    def publish(self, version: int, state: dict[str, Any]) -> None:
        """New weights: `state` becomes the node's live copy (version `version`), and every live
        member loads it after whatever it was told before (`protocol.Load`); members started from
        now on copy it. The previous copy is freed once no member maps it. A `state` naming only
        some of the node's tensors (the adapters of a LoRA run, whose base never changes) replaces
        those alone, and the members load those alone."""
        partial = self.weights is not None and len(state) < len(self.weights.tensors)
        self.weights = self.weights.updated(state, version) if partial else NodeWeights.share(state, version)
        load = {name: self.weights.tensors[name] for name in state} if partial else self.weights.tensors
        for h in self.members.values():
            if h.alive:
                with contextlib.suppress(OSError, ValueError):  # its death is reported by receive
                    h.channel.send(P.Load(version, load), shared=True)

    def send(self, name: str, msg: Any) -> None:
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: its death is reported by receive
            self.members[name].channel.send(msg)

    def kill(self, name: str) -> None:
        """SIGKILL member `name`: a death without notice, as a preempted device gives. A member
        already collected is left alone (its pid may belong to another process by now)."""
        handle = self.members[name]
        if handle.alive:  # not yet reaped, so the pid is still this member's (a zombie at worst)
            with contextlib.suppress(ProcessLookupError):
                os.kill(handle.pid, signal.SIGKILL)

    def stop(self, name: str, timeout_s: float = 5.0) -> None:
        """Ask member `name` to exit; kill it if it has not within `timeout_s`."""
        handle = self.members[name]
        self.send(name, P.Stop())
        handle.process.join(timeout_s)
        if handle.process.is_alive():
            handle.process.kill()
            handle.process.join(timeout_s)
        self._collected(handle)

    def waitables(self) -> list[Any]:
        live = [h for h in self.members.values() if h.alive]
        return [h.channel.conn for h in live] + [h.process.sentinel for h in live]

    def receive(self, obj: Any) -> list[tuple[str, Any]]:
        handle = next((h for h in self.members.values() if h.alive and obj in (h.channel.conn, h.process.sentinel)),
                      None)
        if handle is None:
            return []
        out: list[tuple[str, Any]] = []
        pipe_open = True
        while True:  # everything it said, also when it died right after saying it
            try:
                if not handle.channel.conn.poll():
                    break
                msg = handle.channel.recv()
            except (EOFError, OSError):
                pipe_open = False
                break
            if isinstance(msg, P.Exported):  # the node keeps the weights a member received from a peer
                self.adopt(msg.tensors)
            out.append((handle.name, msg))
        if not pipe_open or obj == handle.process.sentinel:
            self._collected(handle)
            out.append((handle.name, Lost(handle.name, handle.exitcode)))
        return out

    def _collected(self, handle: MemberHandle) -> None:
        """Reap an ended member (its exit status; no zombie is left) and close its pipe."""
        handle.process.join(1.0)
        handle.alive, handle.exitcode = False, handle.process.exitcode
        with contextlib.suppress(OSError):
            handle.channel.close()

    def close(self) -> None:
        """Stop every member: ask all first, then wait, then kill what is left."""
        live = [h for h in self.members.values() if h.alive and h.process.is_alive()]
        for h in live:
            self.send(h.name, P.Stop())
        deadline = time.monotonic() + 5.0
        for h in live:
            h.process.join(max(0.0, deadline - time.monotonic()))
            if h.process.is_alive():
                h.process.kill()
                h.process.join(5.0)
        for h in self.members.values():
            if h.alive:
                self._collected(h)

    def __enter__(self) -> NodeAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
