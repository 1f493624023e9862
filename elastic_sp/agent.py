"""The per-node agent: one long-lived owner of a node's member processes and its live weights.

It starts a member process per device once and keeps it; regrouping never restarts one. It
holds the node's in-memory copy of the weights (`NodeWeights`: shared memory on CPU), from which a
member that joins the node takes its weights by an intra-node copy — the copy costs a memcpy,
where a restart costs an interpreter, the imports and a read from the checkpoint store.

Members are started from a fork server that has already imported torch, diffusers and this
package, so a member joining a node is ready in a fraction of a second; `start_method="spawn"`
gives what a restart-based system pays (a fresh interpreter) and is what the cold-start baseline
uses. Every member is a daemon process, is killed by `close` if it does not stop when told, and
exits by itself when its agent's end of the pipe closes: no member outlives its agent.

The agent only starts, stops and watches processes and holds weights; which groups its members
form is the coordinator's business (`coordinator.py`), whose event loop waits on the pipes and
process sentinels the agent exposes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch.multiprocessing as mp

from elastic_sp import protocol as P
from elastic_sp.spec import ServeSpec
from elastic_sp.weights import NodeWeights

Source = Literal["node", "peer", "checkpoint"]
"""Where a new member takes its weights: the node's live copy, a peer over its first group, or
the checkpoint store (only when no live copy exists anywhere)."""

_PRELOAD = ["elastic_sp.member", "diffusers.models.transformers.transformer_qwenimage", "spotlight.dit_policy"]
"""What the fork server imports once, so that a member starts without importing torch or diffusers."""

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
    """The agent's side of one member process."""

    name: str
    node: str
    process: Any
    channel: P.Channel
    source: Source
    started: float
    device: str
    ready: P.Ready | None = None
    alive: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def sentinel(self) -> int:
        return self.process.sentinel


class NodeAgent:
    def __init__(self, node: str, spec: ServeSpec, weights: NodeWeights | None = None,
                 checkpoint: str | Path | None = None, start_method: str = "forkserver") -> None:
        self.node = node
        self.spec = spec
        self.weights = weights
        """The node's live copy; None until a member receives the weights from a peer."""
        self.checkpoint = str(checkpoint) if checkpoint is not None else None
        self.start_method = start_method
        self.members: dict[str, MemberHandle] = {}

    def spawn(self, name: str, source: Source, start_method: str | None = None, device: str | None = None) -> MemberHandle:
        """Start member `name` (its Ready report arrives on its channel). `source`: see `Source`."""
        if name in self.members and self.members[name].alive:
            raise ValueError(f"member {name!r} is already running on node {self.node}")
        if source == "node" and self.weights is None:
            raise ValueError(f"node {self.node} holds no live weights to copy to {name!r}")
        if source == "checkpoint" and self.checkpoint is None:
            raise ValueError(f"node {self.node} has no checkpoint path to load {name!r} from")
        method = start_method or self.start_method
        ctx = mp.get_context(method)
        if method == "forkserver":
            ctx.set_forkserver_preload(_PRELOAD)  # no effect once the server runs
        ours, theirs = ctx.Pipe()
        if device is None:  # one GPU per member: the lowest index no live member holds
            used = {h.device for h in self.members.values() if h.alive}
            device = "cpu" if self.spec.device == "cpu" else next(
                f"cuda:{i}" for i in range(len(used) + 1) if f"cuda:{i}" not in used)
        started = time.time()
        from elastic_sp.member import member_main

        weights = self.weights.tensors if source == "node" and self.weights is not None else None
        checkpoint = self.checkpoint if source == "checkpoint" else None
        proc = ctx.Process(target=member_main, name=f"sp-member-{name}", daemon=True,
                           args=(name, self.spec, theirs, device, weights, checkpoint, started))
        with _child_env():
            proc.start()
        theirs.close()
        handle = MemberHandle(name, self.node, proc, P.Channel(ours), source, started, device)
        self.members[name] = handle
        return handle

    def adopt(self, tensors: dict[str, Any], version: int = 0) -> None:
        """Keep `tensors` (shared memory a member exported) as the node's live copy."""
        if self.weights is None:
            self.weights = NodeWeights(tensors, version)

    def kill(self, name: str) -> None:
        """SIGKILL member `name`: a death without notice, as a preempted device gives."""
        os.kill(self.members[name].pid, signal.SIGKILL)

    def stop(self, name: str, timeout_s: float = 5.0) -> None:
        """Ask member `name` to exit; kill it if it has not within `timeout_s`."""
        handle = self.members[name]
        with contextlib.suppress(OSError, ValueError):
            handle.channel.send(P.Stop())
        handle.process.join(timeout_s)
        if handle.process.is_alive():
            handle.process.kill()
            handle.process.join(timeout_s)
        handle.alive = False
        with contextlib.suppress(OSError):
            handle.channel.close()

    def reap(self, name: str) -> None:
        """Collect a member that died (its exit status), so no zombie is left."""
        handle = self.members[name]
        handle.process.join(1.0)
        handle.alive = False
        with contextlib.suppress(OSError):
            handle.channel.close()

    def close(self) -> None:
        """Stop every member: ask all first, then wait, then kill what is left."""
        live = [h for h in self.members.values() if h.process.is_alive()]
        for h in live:
            with contextlib.suppress(OSError, ValueError):
                h.channel.send(P.Stop())
        deadline = time.monotonic() + 5.0
        for h in live:
            h.process.join(max(0.0, deadline - time.monotonic()))
            if h.process.is_alive():
                h.process.kill()
                h.process.join(5.0)
        for h in self.members.values():
            h.alive = False
            with contextlib.suppress(OSError):
                h.channel.close()

    def __enter__(self) -> NodeAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
