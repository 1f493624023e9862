"""The local provider: a folder for a store, and preemption notices replayed from a trace.

It is what simulation and tests run in place of a cloud, and it passes the same contract suite
as `cloud.aws.AwsProvider` and `cloud.gcp.GcpProvider` (tests/cloud/test_cloud_contract.py).

`TraceNoticeSource` is a `schedulers.preemption.NoticeSource` for one slot of
`schedulers.traces.replay_schedule(trace, slots, speedup, notice_s)`: replay time 0 is `start` on
the injected clock. It reports the first kill of its slot that is not already past when the
source is made (a node that joins mid-replay is not warned about kills before it existed): from
that kill's "notice" action on (from the kill itself when the schedule gives no notice), `poll()`
returns `PreemptionNotice(Cause.TRACE, deadline=start + kill time, node="slot-K")`, the same
notice at every later poll.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cloud.store import LocalStore, Store, StoreURIError, parse_store_uri
from schedulers.clock import Clock
from schedulers.preemption import Cause, NoticeSource, PreemptionNotice
from schedulers.traces import ReplayAction, Trace, load_trace, replay_schedule


class TraceNoticeSource:
    def __init__(self, actions: Sequence[ReplayAction], slot: int, clock: Clock, start: float | None = None) -> None:
        self._clock = clock
        self._slot = slot
        self._start = clock.now() if start is None else start
        made_at = clock.now() - self._start
        self._kill: tuple[float, float] | None = None  # (warned at, killed at), replay seconds
        warned_at: float | None = None
        for a in actions:
            if a.slot != slot:
                continue
            if a.action == "notice":
                warned_at = a.at_s
            elif a.action == "kill":
                if a.at_s >= made_at:
                    self._kill = (a.at_s if warned_at is None else warned_at, a.at_s)
                    break
                warned_at = None
        self._notice: PreemptionNotice | None = None

    def poll(self) -> PreemptionNotice | None:
        if self._notice is None and self._kill is not None:
            warned_at, killed_at = self._kill
            if self._clock.now() - self._start >= warned_at:
                self._notice = PreemptionNotice(Cause.TRACE, self._start + killed_at, node=f"slot-{self._slot}",
                                                detail=f"trace: slot {self._slot} preempted at +{killed_at:g} s")
        return self._notice


class LocalProvider:
    """The `cloud.provider.Provider` of simulation and tests. `trace` (a `Trace` or a trace file)
    is replayed on `slots` slots with `speedup` and `notice_s` as `replay_schedule` takes them;
    `notice_source` watches slot `slot`. Without a trace no notice ever comes. Stores are folders."""

    name = "local"

    def __init__(self, trace: Trace | str | Path | None = None, slot: int = 0, slots: int = 1,
                 speedup: float = 1.0, notice_s: float = 120.0) -> None:
        if trace is not None and not isinstance(trace, Trace):
            trace = load_trace(trace)
        self.actions = replay_schedule(trace, slots, speedup, notice_s) if trace is not None else []
        self.slot = slot

    def open_store(self, uri: str) -> Store:
        where = parse_store_uri(uri)
        if where.path is None:
            raise StoreURIError(f"{uri}: the local provider stores in a folder "
                                "(expected file:///ABSOLUTE/PATH or a local path)")
        return LocalStore(where.path)

    def notice_source(self, clock: Clock) -> NoticeSource:
        return TraceNoticeSource(self.actions, self.slot, clock)
