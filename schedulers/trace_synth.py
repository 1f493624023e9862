"""Synthetic preemption traces: a fleet whose nodes are preempted at random and come back.

`synthesize(SynthSpec)` draws a `Trace` from a seeded numpy Generator (same spec, same trace):
- the fleet starts with `nodes` live nodes;
- single preemptions arrive as a Poisson process of `rate_h` per hour (over the fleet), each
  taking one live node chosen uniformly;
- bursts arrive as a Poisson process of `burst_rate_h` per hour, each taking `burst_size` live
  nodes at the same instant (a zone running out of capacity);
- every preempted node returns after an exponential delay of mean `return_s` (capacity coming
  back); with `return_s` = 0 nodes never return.

A spec is written `synth:poisson?nodes=32&rate_h=15&burst_rate_h=0.5&burst_size=8&return_s=900&hours=12&seed=0`
(any subset of the fields, each at most once; the defaults are close to the shipped bamboo-p3
trace: 32 nodes, ~15 preemptions per hour) and is accepted wherever a trace path is. Each field
has a documented range; a spec whose expected event count exceeds `traces.MAX_EVENTS` is refused
before anything is drawn (and the draw stops there if chance takes it past the bound).
`write_bamboo` writes a trace in the Bamboo CSV format, so a generated trace can be replayed,
shown and shared as a file.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, fields
from pathlib import Path
from urllib.parse import parse_qsl

import numpy as np

from schedulers.input.files import SEED_MAX, short
from schedulers.traces import MAX_DURATION_S, MAX_EVENTS, MAX_NODES, Trace, TraceError, TraceEvent, load_trace

PREFIX = "synth:"
_LIMITS = {"nodes": (1, MAX_NODES), "burst_size": (1, MAX_NODES), "rate_h": (0, 1e5), "burst_rate_h": (0, 1e4),
           "return_s": (0, MAX_DURATION_S), "hours": (0, MAX_DURATION_S / 3600), "seed": (0, SEED_MAX)}
"""Each field's [low, high]; `hours` must also be > 0 (the field docstrings say why)."""


@dataclass(frozen=True)
class SynthSpec:
    nodes: int = 32
    """Live nodes at the start (and the most there can be), 1..65,536 (`traces.MAX_NODES`)."""
    rate_h: float = 15.0
    """Single-node preemptions per hour across the fleet (bamboo-p3: 172 over 11.4 h), 0..100,000."""
    burst_rate_h: float = 0.5
    """Bursts per hour, 0..10,000."""
    burst_size: int = 8
    """Nodes one burst takes at once (fewer if fewer are live), 1..65,536."""
    return_s: float = 900.0
    """Mean seconds before a preempted node joins again (0: never), at most ten years."""
    hours: float = 12.0
    """Length of the trace, in (0, 87,600] hours (ten years, `traces.MAX_DURATION_S`)."""
    seed: int = 0
    """Seed of the draw, 0..2**32 - 1."""

    def __post_init__(self) -> None:
        for f, (low, high) in _LIMITS.items():
            v, integer = getattr(self, f), f in ("nodes", "burst_size", "seed")
            number = not isinstance(v, bool) and isinstance(v, int if integer else (int, float))
            if not (number and low <= v <= high) or (f == "hours" and v == 0):  # (nan fails low <= v)
                span = (f"an integer in [{low}, {high:,}]" if integer else
                        f"a number in ({low}, {high:,g}]" if f == "hours" else f"a number in [{low}, {high:,g}]")
                raise TraceError(f"synth: {f}: expected {span}, got {short(v)}")
        if self.expected_events > MAX_EVENTS:
            raise TraceError(f"synth: about {self.expected_events:,.0f} events expected (nodes + 2 x hours x "
                             f"(rate_h + burst_rate_h x burst_size)); expected at most {MAX_EVENTS:,}")

    @property
    def expected_events(self) -> float:
        """An upper estimate of the events a draw makes: the initial adds, and per preemption a
        remove and (when nodes return) an add; without returns at most every node is removed once."""
        removals = self.hours * (self.rate_h + self.burst_rate_h * min(self.burst_size, self.nodes))
        if self.return_s == 0:
            removals = min(removals, self.nodes)
        return self.nodes + 2 * removals

    @classmethod
    def parse(cls, spec: str) -> SynthSpec:
        """`synth:poisson?key=value&...` -> a spec; an unknown key or bad value names itself."""
        shown = spec if len(spec) <= 100 else spec[:97] + "..."
        body = spec[len(PREFIX):]
        kind, _, query = body.partition("?")
        if kind not in ("poisson", ""):
            raise TraceError(f"{shown}: unknown synthetic trace kind {short(kind)} (expected synth:poisson?...)")
        types = {f.name: f.type for f in fields(cls)}
        values: dict = {}
        for key, value in parse_qsl(query, keep_blank_values=True):
            integer = types.get(key) in ("int", int)
            if key not in types:
                raise TraceError(f"{shown}: unknown field {short(key)} (expected one of {', '.join(types)})")
            if key in values:
                raise TraceError(f"{shown}: {key} is given twice (expected each field at most once)")
            try:
                if len(value) > 40:  # no number here needs more; int() of a million digits takes seconds
                    raise ValueError(value)
                values[key] = int(value) if integer else float(value)
            except ValueError:
                raise TraceError(f"{shown}: {key}: {short(value)} is not {'an integer' if integer else 'a number'}") from None
        try:
            return cls(**values)
        except TraceError as err:
            raise TraceError(f"{shown}: {str(err).removeprefix('synth: ')}") from None


def synthesize(spec: SynthSpec) -> Trace:
    rng = np.random.default_rng(spec.seed)
    end = spec.hours * 3600.0
    live = [f"s{k}" for k in range(spec.nodes)]
    events = [TraceEvent(0.0, "add", n) for n in live]
    returns: list[tuple[float, int, str]] = []  # (time, tie-break, node)
    t_single = rng.exponential(3600.0 / spec.rate_h) if spec.rate_h > 0 else math.inf
    t_burst = rng.exponential(3600.0 / spec.burst_rate_h) if spec.burst_rate_h > 0 else math.inf
    counter = 0
    while True:
        t = min(t_single, t_burst, returns[0][0] if returns else math.inf)
        if t >= end:
            break
        if returns and returns[0][0] == t:
            _, _, node = heapq.heappop(returns)
            live.append(node)
            events.append(TraceEvent(t, "add", node))
            continue
        take = 1 if t == t_single else spec.burst_size
        if t == t_single:
            t_single = t + rng.exponential(3600.0 / spec.rate_h)
        else:
            t_burst = t + rng.exponential(3600.0 / spec.burst_rate_h)
        if len(events) + 2 * min(take, len(live)) > MAX_EVENTS:  # chance beyond the expected count
            raise TraceError(f"synth: the draw made more than {MAX_EVENTS:,} events (expected at most that many; "
                             "lower rate_h, burst_rate_h or hours)")
        for _ in range(min(take, len(live))):
            node = live.pop(int(rng.integers(len(live))))
            events.append(TraceEvent(t, "remove", node))
            if spec.return_s > 0:
                counter += 1
                heapq.heappush(returns, (t + rng.exponential(spec.return_s), counter, node))
    return Trace(events, f"{PREFIX}poisson?" + "&".join(f"{f.name}={getattr(spec, f.name)}" for f in fields(spec)),
                 end_s=end)


def open_trace(source: str | Path) -> Trace:
    """A trace file (any format `load_trace` reads) or a `synth:` spec."""
    if isinstance(source, str) and source.startswith(PREFIX):
        return synthesize(SynthSpec.parse(source))
    return load_trace(source)


def write_bamboo(trace: Trace, path: str | Path) -> None:
    """Write `trace` as Bamboo CSV (`delta_ms,add|remove,node`), which `load_trace` reads back."""
    Path(path).write_text("".join(f"{round(e.t_s * 1000)},{e.action},{e.node}\n" for e in trace.events))
