"""Preemption traces: recorded spot-fleet histories, loaded, validated and mapped onto local slots.

A `Trace` is a time-ordered list of `TraceEvent`s (`add` or `remove` of a named node), with `t_s`
in seconds since the trace began. Invariants, checked whenever a `Trace` is built: times never
decrease; a node is added only while it is not live and removed only while it is. A removed node
may join again later.

`load_trace(path)` reads two formats, told apart by the first non-blank line:
- Bamboo CSV, `delta_ms,add|remove,nodeN` (`experiments/traces/bamboo-*.csv`): cumulative
  milliseconds since the start.
- GCP counts, `date, time, count` (`experiments/traces/bamboo-gcloud-*.txt`): the live instance
  count read at a time. A count increase by n adds n nodes named `gcp-<k>` (k = 1, 2, ... in order of
  creation); a decrease by n removes the n most recently added live ones; `t_s` is relative to the
  first line. The shipped files repeat each reading over three lines a minute apart, so a reading
  may start before the previous one's repeats end: only the readings that change the count must be
  in time order (and not before the previous change); repeats of the current count are ignored.
- SkyPilot spot-traces JSON, `{"metadata": {"gap_seconds": N}, "data": [...]}` (skypilot-org/
  spot-traces, the data of "Can't Be Late", Wu et al., NSDI'24), loaded as published: `data` holds,
  per tick of N seconds, **the number of instances available** — 0..16 in the 16-node files, 0..4
  in the 4-node ones, and 0 or 1 in the single-node ones, so **1 = available, 0 = preempted / none
  to be had**. Counts become events as for GCP (nodes `sky-<k>`). What we checked it against:
  the repository's README ("each data point is the number of available instances at a specific
  tick"); andylizf/skynomad-artifact `sky_spot/trace.py` (commit 4dc5ecb), which reads the 16-node
  files as "count >= gang size: available"; and the simulator behind the paper,
  Michaelvll/skypilot-spot-strategy, whose own copy of a single-node trace
  (`data/real/ping_based/us-west-2a_v100_1.txt`, commit 7bb5cf7) is tick for tick the complement of
  the published `availability/1-node/aws-10-26-2022/us-west-2a_v100_1.json` (commit b266313): that
  simulator keeps 1 = preempted (`sky_spot/env.py`: `spot_available` is `not trace[tick]`), and the
  published files were inverted to counts. A file in the simulator's convention says so with
  `"one_means": "preempted"` in `metadata` (then every value must be 0 or 1). `data` may also be a
  list of 0/1 lists of equal length, one per instance (nodes `sky-0`, `sky-1`, ...). Every value
  must be a JSON integer — not a boolean, not 2.5, not negative; errors name the file and the item
  (`FILE: data[3][17]: ...`; JSON has no useful line numbers once parsed, except for syntax errors,
  which give theirs).
- Spotlight counts CSV (what `spotlight traces synth` writes): a header `t_s,nodes`, then
  `seconds,live node count` per line, counts turned into events as for GCP (nodes `n-<k>`).
Anything else is a `TraceError` whose message is one line, `FILE:LINE: what is wrong (expected ...)`,
quoting at most 60 characters of the offending text.

Bounds, checked before the events they would create are allocated (a 27-byte counts file asking
for 300,000,000 nodes must fail at once, not fill memory): a file of at most `MAX_TRACE_BYTES`,
UTF-8 text (JSON: no duplicate keys, NaN or deep nesting); at most `MAX_NODES` distinct nodes (and
live count), `MAX_EVENTS` events, node names of `MAX_NODE_NAME` characters, and times up to
`MAX_DURATION_S`. A `Trace` built by hand is held to the same bounds.

`replay_schedule(trace, slots, speedup, notice_s)` maps the trace onto `slots` local workers:
- Trace nodes are numbered 0, 1, ... in order of first appearance; node k runs on slot k mod slots.
  A slot is alive while at least one of its nodes is live.
- Every `remove` preempts its node's slot, so a replay on 2 slots still feels every burst of a
  32-node trace: a "notice" at max(0, t - notice_s, t_join) / speedup, where t_join is when the
  removed node joined (no instance is warned before it exists; no notice when notice_s == 0), and
  a "kill" at t / speedup. If the slot still has other live nodes, an "add" follows at the kill
  time (replacement capacity joins at once).
- An `add` of a node whose slot was dead emits "add" (so the initial fleet at t = 0 brings up each
  slot once); an `add` to a live slot emits nothing.
- Actions are sorted by time; ties keep trace order (notice, kill, add within one event).
Hence the number of kills equals `trace.preemptions` for any slot count.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

from schedulers.input.files import InputError, InputFileError, parse_json, read_text, short

MAX_TRACE_BYTES = 8 << 20
"""Largest trace file read: 8 MiB (the shipped traces are under 20 KB; a SkyPilot spot trace of 16
nodes at 10-minute ticks over two months is ~300 KB)."""
MAX_NODES = 65_536
"""Most distinct nodes in a trace, and the largest live count of a counts trace (the shipped traces
peak at 32 nodes)."""
MAX_EVENTS = 1_000_000
"""Most events in a trace (~300 MB as Python objects; the shipped traces have under 400)."""
MAX_NODE_NAME = 128
"""Longest node name, in characters."""
MAX_DURATION_S = 10 * 365 * 86400.0
"""Latest time in a trace: ten years (a summary allocates one bucket per hour of it)."""


def _q(value: object) -> str:
    """A value quoted for an error line: at most 60 characters, as the expected-format texts are long."""
    return short(value, 60)


BAMBOO_EXPECTED = 'lines like "480000,add,node1" (delta_ms,add|remove,node)'
GCP_EXPECTED = 'lines like "2021-12-11, 11:11:30, 55" (date, time, count)'
_GCP_FIRST_FIELD = re.compile(r"\s*\d{4}-\d{2}-\d{2}\s*,")
_INTEGER = re.compile(r"[-+]?[0-9]+")
COUNTS_HEADER = "t_s,nodes"
COUNTS_EXPECTED = 'a header "t_s,nodes" then lines like "3600,12" (seconds, live node count)'
SKY_EXPECTED = '{"metadata": {"gap_seconds": N}, "data": [instances available per tick, an integer >= 0]}'
SKY_FLAGS_EXPECTED = '0 or 1 per instance and tick'


class TraceError(InputError):
    """A trace that cannot be used. The message is one line: `FILE:LINE: what is wrong (expected ...)`
    (just `FILE: ...` when no single line is at fault)."""


@dataclass(frozen=True)
class TraceEvent:
    t_s: float
    """Seconds since the trace began."""
    action: Literal["add", "remove"]
    node: str


@dataclass
class Trace:
    events: list[TraceEvent]
    source: str
    """Where the trace came from (its path), for messages."""
    end_s: float | None = None
    """When observation ended, if later than the last event (GCP readings that did not change the
    count); None means at the last event."""

    def __post_init__(self) -> None:
        _check(self.events, lambda i: f"{self.source}: event {i + 1}")
        if self.end_s is not None and not (0 <= self.end_s <= MAX_DURATION_S):
            raise TraceError(f"{self.source}: end {_q(self.end_s)} s is not a time in [0, {MAX_DURATION_S:g}] s")

    @property
    def duration_s(self) -> float:
        last = self.events[-1].t_s if self.events else 0.0
        return last if self.end_s is None else max(last, self.end_s)

    @property
    def nodes(self) -> list[str]:
        """Distinct node names in order of first appearance (the numbering `replay_schedule` uses)."""
        return list(dict.fromkeys(e.node for e in self.events))

    @property
    def preemptions(self) -> int:
        return sum(e.action == "remove" for e in self.events)

    @property
    def max_live(self) -> int:
        return max((live for _, live in self.live_over_time()), default=0)

    def live_over_time(self) -> list[tuple[float, int]]:
        """(t_s, live node count after every event at t_s), one point per distinct time."""
        points: list[tuple[float, int]] = []
        live = 0
        for e in self.events:
            live += 1 if e.action == "add" else -1
            if points and points[-1][0] == e.t_s:
                points[-1] = (e.t_s, live)
            else:
                points.append((e.t_s, live))
        return points


def _check(events: list[TraceEvent], where: Callable[[int], str]) -> None:
    """Raise TraceError at the first event that breaks the Trace invariants; `where(i)` locates it."""
    if len(events) > MAX_EVENTS:
        raise TraceError(f"{where(MAX_EVENTS)}: more than {MAX_EVENTS:,} events (expected at most that many)")
    live: set[str] = set()
    seen: set[str] = set()
    previous = 0.0
    for i, e in enumerate(events):
        if e.action not in ("add", "remove"):
            raise TraceError(f"{where(i)}: unknown event {_q(e.action)} (expected add or remove)")
        if not isinstance(e.t_s, (int, float)) or not math.isfinite(e.t_s) or e.t_s < 0:
            raise TraceError(f"{where(i)}: time {_q(e.t_s)} s is not a finite time >= 0 "
                             "(expected seconds since the start)")
        if e.t_s > MAX_DURATION_S:
            raise TraceError(f"{where(i)}: time {e.t_s:g} s is later than {MAX_DURATION_S:g} s (ten years)")
        if not isinstance(e.node, str) or not 0 < len(e.node) <= MAX_NODE_NAME:
            raise TraceError(f"{where(i)}: node name {_q(e.node)} (expected 1 to {MAX_NODE_NAME} characters)")
        if e.node not in seen:
            if len(seen) == MAX_NODES:
                raise TraceError(f"{where(i)}: more than {MAX_NODES:,} distinct nodes (expected at most that many)")
            seen.add(e.node)
        if e.t_s < previous:
            raise TraceError(
                f"{where(i)}: time goes backwards, {e.t_s:g} s after {previous:g} s (expected non-decreasing times)"
            )
        if e.action == "add" and e.node in live:
            raise TraceError(f"{where(i)}: {e.node} is added but is already live (expected a remove first)")
        if e.action == "remove" and e.node not in live:
            raise TraceError(f"{where(i)}: {e.node} is removed but is not live (expected an add first)")
        if e.action == "add":
            live.add(e.node)
        else:
            live.remove(e.node)
        previous = e.t_s


def load_trace(path: str | Path) -> Trace:
    """Read a Bamboo CSV or GCP counts trace (format detected from the first non-blank line)."""
    path = Path(path)
    try:
        text = read_text(path, "trace", MAX_TRACE_BYTES)
    except InputFileError as err:
        raise TraceError(str(err)) from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise TraceError(f"{path}: empty trace file (expected {BAMBOO_EXPECTED} or {GCP_EXPECTED})")
    if lines[0][1].lstrip().startswith("{"):
        return _load_sky(path, text)
    if lines[0][1].replace(" ", "") == COUNTS_HEADER:
        return _load_counts(path, lines[1:])
    if _GCP_FIRST_FIELD.match(lines[0][1]):
        return _load_gcp(path, lines)
    return _load_bamboo(path, lines)


def _fields(path: Path, n: int, line: str, count: int, expected: str) -> list[str]:
    """The `count` comma-separated fields of line `n`, stripped; another number of them is a TraceError.
    (Split at most `count` times: a long line of commas costs no more than a short one.)"""
    fields = line.split(",", count)
    if len(fields) != count:
        raise TraceError(f"{path}:{n}: {line.count(',') + 1} fields in {_q(line.strip())} (expected {expected})")
    return [f.strip() for f in fields]


def _load_bamboo(path: Path, lines: list[tuple[int, str]]) -> Trace:
    if len(lines) > MAX_EVENTS:
        raise TraceError(f"{path}:{lines[MAX_EVENTS][0]}: more than {MAX_EVENTS:,} events (expected at most that many)")
    events: list[TraceEvent] = []
    for n, line in lines:
        ms, action, node = _fields(path, n, line, 3, BAMBOO_EXPECTED)
        try:
            t_ms = float(ms)
        except ValueError:
            raise TraceError(f"{path}:{n}: time {_q(ms)} is not a number (expected {BAMBOO_EXPECTED})") from None
        if action not in ("add", "remove"):
            raise TraceError(f"{path}:{n}: unknown event {_q(action)} (expected add or remove)")
        if not node:
            raise TraceError(f"{path}:{n}: empty node name (expected {BAMBOO_EXPECTED})")
        if not (math.isfinite(t_ms) and t_ms >= 0):
            raise TraceError(f"{path}:{n}: time {t_ms:g} ms is not a finite time >= 0 "
                             "(expected ms since the start)")
        if events and t_ms / 1000.0 < events[-1].t_s:
            raise TraceError(
                f"{path}:{n}: time goes backwards, {t_ms:g} ms after {events[-1].t_s * 1000:g} ms "
                "(expected non-decreasing times)"
            )
        events.append(TraceEvent(t_ms / 1000.0, action, node))  # type: ignore[arg-type]
    _check(events, lambda i: f"{path}:{lines[i][0]}")
    return Trace(events, str(path))


def _load_gcp(path: Path, lines: list[tuple[int, str]]) -> Trace:
    counts = _Counts("gcp-")
    start: datetime | None = None
    changed_at = 0.0  # time of the last reading that changed the count
    last_s = 0.0
    for n, line in lines:
        day, clock, number = _fields(path, n, line, 3, GCP_EXPECTED)
        try:
            at = datetime.strptime(f"{day} {clock}", "%Y-%m-%d %H:%M:%S")
        except ValueError:
            raise TraceError(
                f"{path}:{n}: bad date/time {_q(day)}, {_q(clock)} (expected YYYY-MM-DD, HH:MM:SS)"
            ) from None
        count = _count(path, n, number, GCP_EXPECTED)
        if start is None:
            start = at
        t_s = (at - start).total_seconds()
        if t_s > MAX_DURATION_S:
            raise TraceError(f"{path}:{n}: {day} {clock} is more than ten years after the first line "
                             f"(expected at most {MAX_DURATION_S:g} s)")
        last_s = max(last_s, t_s)
        if count == len(counts.live):
            continue
        if t_s < changed_at:
            raise TraceError(
                f"{path}:{n}: time goes backwards, {day} {clock} is before the previous count "
                f"change at +{changed_at:g} s (expected count changes in time order)"
            )
        changed_at = t_s
        counts.set(t_s, count, f"{path}:{n}")
    return Trace(counts.events, str(path), end_s=last_s)


def _count(path: Path, n: int, text: str, expected: str) -> int:
    """A live count field: an integer in [0, MAX_NODES]."""
    if not _INTEGER.fullmatch(text):
        raise TraceError(f"{path}:{n}: count {_q(text)} is not an integer (expected {expected})")
    if len(text) > 12 or int(text) > MAX_NODES:  # (no int() of a million digits)
        raise TraceError(f"{path}:{n}: count {text if len(text) <= 20 else text[:17] + '...'} is more than {MAX_NODES:,} nodes "
                         f"(expected a live count in [0, {MAX_NODES:,}])")
    count = int(text)
    if count < 0:
        raise TraceError(f"{path}:{n}: count {count} is negative (expected a live count >= 0)")
    return count


class _Counts:
    """Live counts -> add/remove events: an increase by n adds n new nodes `<prefix><k>`, a decrease
    removes the most recently added live ones (a stack). Refuses, before allocating them, events
    beyond `MAX_EVENTS` and nodes beyond `MAX_NODES`."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.events: list[TraceEvent] = []
        self.live: list[str] = []
        self.created = 0

    def set(self, t_s: float, count: int, where: str) -> None:
        grow = count - len(self.live)
        if len(self.events) + abs(grow) > MAX_EVENTS:
            raise TraceError(f"{where}: more than {MAX_EVENTS:,} events in all (expected at most that many)")
        if self.created + max(grow, 0) > MAX_NODES:
            raise TraceError(f"{where}: more than {MAX_NODES:,} distinct nodes in all (a count increase adds "
                             "new nodes; expected at most that many)")
        while count > len(self.live):
            self.created += 1
            self.live.append(f"{self.prefix}{self.created}")
            self.events.append(TraceEvent(t_s, "add", self.live[-1]))
        while count < len(self.live):
            self.events.append(TraceEvent(t_s, "remove", self.live.pop()))


def _load_counts(path: Path, lines: list[tuple[int, str]]) -> Trace:
    counts = _Counts("n-")
    last = -math.inf
    for n, line in lines:
        seconds, number = _fields(path, n, line, 2, COUNTS_EXPECTED)
        try:
            t_s = float(seconds)
        except ValueError:
            raise TraceError(f"{path}:{n}: {_q(line.strip())} is not seconds,count (expected {COUNTS_EXPECTED})") from None
        if not (math.isfinite(t_s) and 0 <= t_s <= MAX_DURATION_S):
            raise TraceError(f"{path}:{n}: time {t_s:g} is not a finite time in [0, {MAX_DURATION_S:g}] "
                             "(expected seconds since the start)")
        if t_s < last:
            raise TraceError(f"{path}:{n}: time goes backwards, {t_s:g} s after {last:g} s (expected non-decreasing times)")
        if not _INTEGER.fullmatch(number):
            raise TraceError(f"{path}:{n}: {_q(line.strip())} is not seconds,count (expected {COUNTS_EXPECTED})")
        count = _count(path, n, number, COUNTS_EXPECTED)
        last = t_s
        counts.set(t_s, count, f"{path}:{n}")
    return Trace(counts.events, str(path), end_s=max(last, 0.0))


def _load_sky(path: Path, text: str) -> Trace:
    try:
        doc = parse_json(text, path)
    except InputFileError as err:
        raise TraceError(f"{err} (expected {SKY_EXPECTED})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("metadata"), dict) or "data" not in doc:
        raise TraceError(f"{path}: expected an object with metadata and data ({SKY_EXPECTED})")
    gap = doc["metadata"].get("gap_seconds")
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not (0 < gap <= MAX_DURATION_S):
        raise TraceError(f"{path}: metadata.gap_seconds: expected a number of seconds in (0, {MAX_DURATION_S:g}], "
                         f"got {_q(gap)}")
    one_means = doc["metadata"].get("one_means", "available")
    if one_means not in ("preempted", "available"):
        raise TraceError(f"{path}: metadata.one_means: expected preempted or available, got {_q(one_means)}")
    data = doc["data"]
    if not isinstance(data, list) or not data:
        raise TraceError(f"{path}: data: expected a non-empty list of ticks, got {short(data, 40)}")
    per_instance = all(isinstance(d, list) for d in data)
    series = data if per_instance else [data]
    if len({len(s) for s in series}) != 1:
        raise TraceError(f"{path}: data: the instances' tick lists differ in length (expected equal lengths)")
    if len(series) > MAX_NODES:
        raise TraceError(f"{path}: data: {len(series):,} instances (expected at most {MAX_NODES:,})")
    if len(series[0]) * float(gap) > MAX_DURATION_S:
        raise TraceError(f"{path}: data: {len(series[0]):,} ticks of {gap:g} s is more than ten years "
                         f"(expected at most {MAX_DURATION_S:g} s)")
    if not per_instance:
        ticks = [_tick(path, f"data[{i}]", v, one_means) for i, v in enumerate(data)]
        return _sky_counts(path, ticks if one_means == "available" else [1 - v for v in ticks], float(gap))
    events: list[TraceEvent] = []
    up = [False] * len(series)
    for tick in range(len(series[0])):
        for k, s in enumerate(series):
            v = s[tick]
            where = f"data[{k}][{tick}]"
            if isinstance(v, bool) or not isinstance(v, int) or v not in (0, 1):
                raise TraceError(f"{path}: {where}: {_q(v)} is not 0 or 1 (expected {SKY_FLAGS_EXPECTED})")
            available = (v == 1) == (one_means == "available")
            if available != up[k]:
                if len(events) == MAX_EVENTS:
                    raise TraceError(f"{path}: {where}: more than {MAX_EVENTS:,} events (expected at most that many)")
                events.append(TraceEvent(tick * float(gap), "add" if available else "remove", f"sky-{k}"))
                up[k] = available
    return Trace(events, str(path), end_s=len(series[0]) * float(gap))


def _tick(path: Path, where: str, v: object, one_means: str) -> int:
    """One value of a flat SkyPilot list: a JSON integer in [0, MAX_NODES], or 0/1 in the 1 = preempted
    convention (a bool is not one, and 2.0 is refused with 2.5: the published files hold integers)."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TraceError(f"{path}: {where}: {_q(v)} is not an integer (expected {SKY_EXPECTED})")
    if v < 0:
        raise TraceError(f"{path}: {where}: {v} is negative (expected {SKY_EXPECTED})")
    if one_means == "preempted" and v > 1:
        raise TraceError(f"{path}: {where}: {v} is not 0 or 1 (metadata.one_means is preempted: "
                         "expected 1 = preempted, 0 = available)")
    if v > MAX_NODES:  # comparing a big int is cheap; only its quoting is bounded
        raise TraceError(f"{path}: {where}: {_q(v)} is more than {MAX_NODES:,} instances (expected at most that many)")
    return v


def _sky_counts(path: Path, ticks: list[int], gap_s: float) -> Trace:
    """A multi-node SkyPilot file: the instances available at each tick, as add/remove events."""
    counts = _Counts("sky-")
    for i, count in enumerate(ticks):
        if count != len(counts.live):
            counts.set(i * gap_s, count, f"{path}: data[{i}]")
    return Trace(counts.events, str(path), end_s=len(ticks) * gap_s)


@dataclass(frozen=True)
class ReplayAction:
    at_s: float
    """Replay time in seconds (trace time / speedup)."""
    slot: int
    action: Literal["notice", "kill", "add"]


def replay_schedule(trace: Trace, slots: int, speedup: float = 1.0, notice_s: float = 120.0) -> list[ReplayAction]:
    """The actions that replay `trace` on `slots` local slots (mapping in the module docstring).
    `notice_s` is the warning before each kill in trace seconds (120 = AWS's two minutes)."""
    if slots < 1:
        raise ValueError(f"replay_schedule: slots must be >= 1, got {slots}")
    if not speedup > 0:
        raise ValueError(f"replay_schedule: speedup must be > 0, got {speedup}")
    if notice_s < 0:
        raise ValueError(f"replay_schedule: notice_s must be >= 0, got {notice_s}")
    number = {node: k for k, node in enumerate(trace.nodes)}
    live = [0] * slots
    joined: dict[str, float] = {}
    actions: list[ReplayAction] = []
    for e in trace.events:
        slot = number[e.node] % slots
        if e.action == "add":
            joined[e.node] = e.t_s
            if live[slot] == 0:
                actions.append(ReplayAction(e.t_s / speedup, slot, "add"))
            live[slot] += 1
            continue
        if notice_s > 0:
            actions.append(ReplayAction(max(0.0, e.t_s - notice_s, joined[e.node]) / speedup, slot, "notice"))
        actions.append(ReplayAction(e.t_s / speedup, slot, "kill"))
        live[slot] -= 1
        if live[slot] > 0:
            actions.append(ReplayAction(e.t_s / speedup, slot, "add"))
    return sorted(actions, key=lambda a: a.at_s)  # stable: ties keep trace order


def summarize(trace: Trace, bucket_s: float = 3600.0) -> dict:
    """What `spotlight traces show` prints: size, preemptions per hour, the largest burst (nodes
    removed at one instant), and per `bucket_s` the mean live nodes and the removals."""
    points = trace.live_over_time()
    duration = trace.duration_s
    buckets = max(1, math.ceil(duration / bucket_s)) if duration > 0 else 1
    removed = [0] * buckets
    burst: dict[float, int] = {}
    for e in trace.events:
        if e.action == "remove":
            removed[min(buckets - 1, int(e.t_s // bucket_s))] += 1
            burst[e.t_s] = burst.get(e.t_s, 0) + 1
    live_s = [0.0] * buckets  # node-seconds per bucket, integrated piecewise
    for (t0, live), (t1, _) in zip(points, points[1:] + [(duration, 0)]):
        t = t0
        while t < t1:
            b = min(buckets - 1, int(t // bucket_s))
            end = min(t1, (b + 1) * bucket_s)
            if end <= t:
                break
            live_s[b] += live * (end - t)
            t = end
    node_s = sum(live_s)
    return {
        "source": trace.source,
        "events": len(trace.events),
        "nodes": len(trace.nodes),
        "duration_h": duration / 3600.0,
        "max_live": trace.max_live,
        "mean_live": node_s / duration if duration > 0 else float(trace.max_live),
        "preemptions": trace.preemptions,
        "preemptions_per_h": trace.preemptions / (duration / 3600.0) if duration > 0 else 0.0,
        "largest_burst": max(burst.values(), default=0),
        "per_bucket": [{"start_h": b * bucket_s / 3600.0, "mean_live": live_s[b] / min(bucket_s, max(duration - b * bucket_s, 1e-9)),
                        "preemptions": removed[b]} for b in range(buckets)],
    }
