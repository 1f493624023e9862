"""The messages between a node agent (and the coordinator behind it) and its member processes.

Commands go to a member, reports come back, one pipe per member. On these pipes messages are
plain pickles of frozen dataclasses — tensors in them are copied inline, which for a latent is
cheaper than torch's shared-memory handles (a file descriptor passed per tensor) — except
`Exported` and `Load`, whose weights travel as shared-memory handles on purpose
(`Channel.send(..., shared=True)`). Pickles are safe here because a pipe joins the agent and a
member process it started itself on the same node: it never crosses a network, and whoever could
write into it already runs code as the agent. Where these messages do cross a network — between a
coordinator and an agent on another node — Ray carries them (`ray_agent`), between processes of
one Ray cluster.

Every command and report that concerns a group carries its `generation`: a report from a
generation that has been re-formed since is stale and ignored.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

from schedulers.request import Request

# ---- commands (agent -> member) -------------------------------------------------------------------


@dataclass(frozen=True)
class Form:
    """Abandon the current group and join generation `generation` of group `group` as `rank` of
    `size` at host:port. Then rank `weights_from` sends its weights to the ranks in `weights_to`
    (members that joined without a live copy on their node)."""

    group: str
    generation: int
    rank: int
    size: int
    host: str
    port: int
    timeout_s: float
    weights_from: int | None = None
    weights_to: tuple[int, ...] = ()


@dataclass(frozen=True)
class Run:
    """Compute `request` from its committed state to the last step; rank 0 reports each step."""

    generation: int
    request: Request


@dataclass(frozen=True)
class Forward:
    """One velocity evaluation (`dit_model.velocity`) on the group; every rank reports its output."""

    generation: int
    x: torch.Tensor
    sigma: torch.Tensor
    emb: torch.Tensor
    mask: torch.Tensor | None
    side: int


@dataclass(frozen=True)
class Halt:
    """Stop whatever runs on group generation `generation` and leave that group (it was dissolved;
    a Form may follow). Arriving mid-collective, it is what interrupts the collective."""

    generation: int


@dataclass(frozen=True)
class Export:
    """Hand the member's weights to its agent as shared memory (the node had no live copy)."""


@dataclass(frozen=True)
class Load:
    """Take weight version `version` from the node's live copy (`tensors`: shared-memory handles,
    sent with `Channel.send(..., shared=True)`), after whatever command came before it."""

    version: int
    tensors: dict[str, torch.Tensor]


@dataclass(frozen=True)
class Digest:
    """Report a hash of the member's weights."""


@dataclass(frozen=True)
class Stop:
    """Exit."""


# ---- reports (member -> agent) --------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    member: str
    pid: int
    source: str
    """Where its weights came from: "node" (intra-node copy), "checkpoint", or "none" (it waits
    to receive them from a peer over its first group)."""
    seconds: float
    """From process start to ready, weights included."""


@dataclass(frozen=True)
class Formed:
    member: str
    group: str
    generation: int
    rendezvous_s: float
    weights_s: float
    """Time spent sending or receiving weights over the group (0 for most members)."""


@dataclass(frozen=True)
class Committed:
    """Rank 0's progress on a request after a step: the trajectory entries and log-prob columns
    added since its last report (for a request started from scratch, x_0 comes first)."""

    member: str
    generation: int
    request_id: str
    step: int
    latents: torch.Tensor
    """(B, new entries, S, C)."""
    log_probs: torch.Tensor
    """(B, new SDE steps)."""
    result: Any = None
    """At the last step, with `ServeSpec.finish`: what the request completes with (the builder's
    `finish`: what a single-process worker commits); None otherwise."""


@dataclass(frozen=True)
class Output:
    member: str
    generation: int
    rank: int
    output: torch.Tensor


@dataclass(frozen=True)
class Broken:
    member: str
    generation: int
    reason: str


@dataclass(frozen=True)
class Exported:
    member: str
    tensors: dict[str, torch.Tensor]


@dataclass(frozen=True)
class Digested:
    member: str
    digest: str


@dataclass(frozen=True)
class Failed:
    member: str
    error: str
    """The traceback of an unexpected error while handling a command."""


class Channel:
    """One end of a member's pipe (same node, never a network), sending and receiving the
    messages above as pickles."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def send(self, msg: Any, shared: bool = False) -> None:
        data = ForkingPickler.dumps(msg) if shared else pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        self.conn.send_bytes(data)

    def recv(self) -> Any:
        return pickle.loads(self.conn.recv_bytes())

    def fileno(self) -> int:
        return self.conn.fileno()

    def close(self) -> None:
        self.conn.close()
