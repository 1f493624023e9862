"""An SP group: the members that run one sequence-parallel forward, over one torch.distributed
process group of one *generation*.

A group is never repaired. When its membership changes, every member abandons it and forms a new
one with a fresh rendezvous on a new TCPStore (the coordinator hosts one per group and generation):
nothing of the old generation's keys can meet the new one's (re-initialising on a store that
already served a group hangs in torch), and a fresh gloo process group of a few members forms in
milliseconds (5-25 ms for 2-4 members on 127.0.0.1), so nothing is gained by patching the old one.

Collectives here are interruptible. A member that waits on a collective also watches its
`Interrupt` (the commands its agent sent); a command arriving mid-collective means the group is
being re-formed, so the wait ends with `GroupBroken` instead of blocking until a peer that will
never answer times out. Gloo reports a SIGKILLed peer within ~50 ms (its sockets are reset), but a
peer that failed *its* collective stops sending to everyone else, and a node that vanishes sends
no reset at all: the agent's word is what ends those waits. Only direct peer-to-peer patterns are
used (all-to-all, also for gathering), so every rank depends on every other one directly and sees
a reset itself instead of waiting on a middleman.

An abandoned process group is kept referenced (`_graveyard`) until its last pending work has
ended: a gloo process group's destructor joins its worker threads, which would block on a work
still waiting for a dead peer (`ProcessGroupGloo.abort` is a no-op in torch 2.13; NCCL's is real
and is called).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist


class GroupBroken(RuntimeError):
    """The group can no longer run collectives: a member died, or its agent is re-forming it.
    `generation`: the group generation the failure concerns, when the raiser knows it."""

    def __init__(self, message: str, generation: int | None = None) -> None:
        super().__init__(message)
        self.generation = generation


class Interrupt(Protocol):
    """What a blocked collective watches: `wake` is set whenever something happens (a command
    arrives, a work completes); `pending()` says whether a command is waiting."""

    wake: threading.Event

    def pending(self) -> bool:
        ...


@dataclass(frozen=True)
class Rendezvous:
    """Where the members of one group generation meet: a fresh TCPStore at host:port."""

    host: str
    port: int
    generation: int
    timeout_s: float = 30.0


_graveyard: list[tuple[Any, list[Any]]] = []
"""(abandoned process group, its works that may still be pending)."""


def _reap() -> None:
    """Drop abandoned process groups none of whose works is pending any more (their destructors
    then return at once)."""
    _graveyard[:] = [(pg, works) for pg, works in _graveyard if not all(w.is_completed() for w in works)]


def _connect(rendezvous: Rendezvous, rank: int, size: int, device: torch.device, where: str) -> Any:
    """A new process group on a fresh TCPStore client: NCCL for CUDA devices, else gloo."""
    timeout = timedelta(seconds=rendezvous.timeout_s)
    try:
        store = dist.TCPStore(rendezvous.host, rendezvous.port, None, False, timeout)
        if device.type == "cuda":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            return dist.ProcessGroupNCCL(store, rank, size, opts)
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=rendezvous.host)]
        return dist.ProcessGroupGloo(store, rank, size, opts)
    except (RuntimeError, dist.DistStoreError) as err:
        raise GroupBroken(f"{where} failed: {str(err).splitlines()[0] if str(err) else type(err).__name__}") from err


class SPGroup:
    """This process's view of one group generation: `rank` of `size`, collectives on `device`."""

    def __init__(self, pg: Any, rank: int, size: int, generation: int, device: torch.device,
                 interrupt: Interrupt | None = None) -> None:
        self.pg = pg
        self.rank = rank
        self.size = size
        self.generation = generation
        self.device = device
        self.interrupt = interrupt
        self._works: list[Any] = []
        """Works issued and not yet seen complete (what a re-form may leave pending)."""

    @classmethod
    def form(cls, rendezvous: Rendezvous, rank: int, size: int, device: torch.device | str = "cpu",
             interrupt: Interrupt | None = None) -> SPGroup:
        """Join the group at `rendezvous` as `rank` of `size`; returns once all `size` members have
        joined (or raises GroupBroken after `rendezvous.timeout_s`). Size 1 needs no process group."""
        device = torch.device(device)
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} outside a group of size {size}")
        if size == 1:
            return cls(None, 0, 1, rendezvous.generation, device, interrupt)
        where = f"rendezvous of generation {rendezvous.generation} at {rendezvous.host}:{rendezvous.port}"
        if interrupt is None:
            return cls(_connect(rendezvous, rank, size, device, where), rank, size, rendezvous.generation, device)
        # The constructor blocks until every member has joined; run it aside so that a command
        # (a member of this very group died before joining) ends the wait instead of the timeout.
        box: dict[str, Any] = {}

        def connect() -> None:
            try:
                box["pg"] = _connect(rendezvous, rank, size, device, where)
            except GroupBroken as err:
                box["error"] = err
            interrupt.wake.set()

        threading.Thread(target=connect, name=f"rendezvous-{rendezvous.generation}", daemon=True).start()
        while not box:
            if interrupt.pending():
                raise GroupBroken(f"{where}: re-formed by the agent before all members joined")
            interrupt.wake.wait(1.0)
            interrupt.wake.clear()
        if "error" in box:
            raise box["error"]
        return cls(box["pg"], rank, size, rendezvous.generation, device, interrupt)

    @classmethod
    def local(cls, generation: int = 0, device: torch.device | str = "cpu") -> SPGroup:
        """A group of one: every collective is the identity."""
        return cls(None, 0, 1, generation, torch.device(device))

    def abandon(self) -> None:
        """Stop using this group; its process group is released once nothing on it is pending."""
        if self.pg is not None:
            if self.device.type == "cuda":
                self.pg.abort()  # NCCL aborts pending kernels; gloo has no working abort
            _graveyard.append((self.pg, self._works))
            self.pg = None
        _reap()

    # ---- collectives ----------------------------------------------------------------------------

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        """x: (size, ...) — slice i goes to rank i. Returns (size, ...): slice i came from rank i."""
        if x.shape[0] != self.size:
            raise ValueError(f"all_to_all needs a leading dimension of {self.size}, got {tuple(x.shape)}")
        if self.size == 1:
            return x
        x = x.contiguous()
        out = torch.empty_like(x)
        self._wait(self._live().alltoall_base(out, x, [], []))
        return out

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """(...) -> (size, ...): slice i is rank i's x. An all-to-all of x sent to everyone (see
        the module docstring for why not gloo's ring all-gather)."""
        if self.size == 1:
            return x.unsqueeze(0)
        return self.all_to_all(x.unsqueeze(0).expand(self.size, *x.shape))

    def copy_from(self, buf: torch.Tensor, root: int, dsts: Sequence[int]) -> None:
        """Collective: rank `root`'s `buf` is copied into `buf` (contiguous, same numel and dtype)
        on every rank in `dsts`; the other ranks take part and receive nothing.

        An all-to-all with per-pair sizes rather than gloo send/recv: a send/recv work has no
        future and only completes inside a blocking wait(), which no command could interrupt."""
        if self.size == 1 or not dsts:
            return
        n, me = buf.numel(), self.rank
        send = [n if me == root and r in dsts else 0 for r in range(self.size)]
        recv = [n if me in dsts and r == root else 0 for r in range(self.size)]
        inp = buf.reshape(-1).repeat(len(dsts)) if me == root else buf.new_empty(0)
        out = buf.view(-1) if me in dsts else buf.new_empty(0)
        self._wait(self._live().alltoall_base(out, inp, recv, send))

    def barrier(self) -> None:
        self.all_gather(torch.zeros(1, device=self.device))

    # ---- waiting --------------------------------------------------------------------------------

    def _live(self) -> Any:
        if self.pg is None:
            raise GroupBroken(f"group generation {self.generation} was abandoned")
        if self.interrupt is not None and self.interrupt.pending():
            raise GroupBroken(f"group generation {self.generation}: re-formed by the agent")
        return self.pg

    def _wait(self, work: Any) -> None:
        """Wait for `work`, or raise GroupBroken when it fails or a command interrupts it."""
        self._works.append(work)
        try:
            if self.interrupt is None:
                work.wait()
            else:
                wake = self.interrupt.wake
                fut = work.get_future()
                fut.add_done_callback(lambda _: wake.set())
                while True:
                    # The future completes (and runs the callback) before the work's own flag is
                    # set, so ask the future: is_completed() alone can miss the wake-up.
                    if fut.done():
                        work.wait()  # raises what the work failed with
                        break
                    if self.interrupt.pending():
                        raise GroupBroken(f"group generation {self.generation}: re-formed by the agent")
                    # Cleared after the checks: a set() between a check and this wait is not lost,
                    # one between the wait and the clear is re-checked above (the state came first).
                    wake.wait(1.0)
                    wake.clear()
        except RuntimeError as err:
            if isinstance(err, GroupBroken):
                raise
            raise GroupBroken(f"group generation {self.generation}: {str(err).splitlines()[0]}") from err
        self._works.remove(work)


class TorchGroup:
    """A plain torch.distributed process group (from `dist.init_process_group`/`new_group`) seen
    through the two collectives Ulysses needs, for users who manage their groups themselves."""

    def __init__(self, group: Any = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=self.group)
        return out

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return self.all_to_all(x.unsqueeze(0).expand(self.size, *x.shape))


def timed_form(rendezvous: Rendezvous, rank: int, size: int, device: torch.device | str = "cpu",
               interrupt: Interrupt | None = None) -> tuple[SPGroup, float]:
    """`SPGroup.form` and the seconds it took (the bare rendezvous cost)."""
    t = time.perf_counter()
    group = SPGroup.form(rendezvous, rank, size, device, interrupt)
    return group, time.perf_counter() - t
