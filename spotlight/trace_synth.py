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
(any subset of the fields; the defaults are close to the shipped bamboo-p3 trace: 32 nodes,
~15 preemptions per hour) and is accepted wherever a trace path is. `write_bamboo` writes a trace in
the Bamboo CSV format, so a generated trace can be replayed, shown and shared as a file.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, fields
from pathlib import Path
from urllib.parse import parse_qsl

import numpy as np

from spotlight.traces import Trace, TraceError, TraceEvent, load_trace

PREFIX = "synth:"


@dataclass(frozen=True)
class SynthSpec:
    nodes: int = 32
    """Live nodes at the start (and the most there can be)."""
    rate_h: float = 15.0
    """Single-node preemptions per hour across the fleet (bamboo-p3: 172 over 11.4 h)."""
    burst_rate_h: float = 0.5
    """Bursts per hour."""
    burst_size: int = 8
    """Nodes one burst takes at once (fewer if fewer are live)."""
    return_s: float = 900.0
    """Mean seconds before a preempted node joins again (0: never)."""
    hours: float = 12.0
    seed: int = 0

    def __post_init__(self) -> None:
        for f, low in (("nodes", 1), ("burst_size", 1)):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < low:
                raise TraceError(f"synth: {f}: expected an integer >= {low}, got {getattr(self, f)!r}")
        for f in ("rate_h", "burst_rate_h", "return_s", "hours"):
            v = getattr(self, f)
            if not (math.isfinite(v) and v >= 0) or (f == "hours" and v == 0):
                raise TraceError(f"synth: {f}: expected a finite number {'> 0' if f == 'hours' else '>= 0'}, got {v!r}")

    @classmethod
    def parse(cls, spec: str) -> SynthSpec:
        """`synth:poisson?key=value&...` -> a spec; an unknown key or bad value names itself."""
        body = spec[len(PREFIX):]
        kind, _, query = body.partition("?")
        if kind not in ("poisson", ""):
            raise TraceError(f"{spec}: unknown synthetic trace kind {kind!r} (expected synth:poisson?...)")
        types = {f.name: f.type for f in fields(cls)}
        values: dict = {}
        for key, value in parse_qsl(query, keep_blank_values=True):
            if key not in types:
                raise TraceError(f"{spec}: unknown field {key!r} (expected one of {', '.join(types)})")
            try:
                values[key] = int(value) if types[key] in ("int", int) else float(value)
            except ValueError:
                raise TraceError(f"{spec}: {key}: {value!r} is not a number") from None
        return cls(**values)


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
