"""The simulator checked against a live run of the same config, trace and step times.

    python -m experiments.validate_simulator [--out DIR] [--iterations N] [--speedup F]
        [--trace CSV] [--window-start S] [--config YAML] [--step-times YAML] [--wait-quiet-s S]

On a real multi-node Ray cluster on this machine (`spotlight.bench.loopback_cluster`: an on-demand
head running the controller, the learner, the request queue, the reward worker and one on-demand
rollout worker; `SPOT_NODES` spot nodes of one executor each), four steps:

1. **measure** (`measure`): this machine's figures for the config, each by a probe of the product's
   own classes on the cluster — a worker actor's start on a fresh node and its first request; the
   requests of an iteration as a worker actor computes them alone, and their denoising steps,
   micro-batches and actor round trips timed apart; an iteration's rollout and a round of the
   update on every node's worker at once through the fleet engine (how the devices share the
   host's cores); a node joining while they compute; the learner's per-round fold and step, the
   reward actor's call, a publication. Written as DIR/step_times.yaml (a `StepTimes.load` file,
   each figure's measurement in a comment) and DIR/measured.json. `--step-times YAML` skips this.
2. **live** (`run_live`): `spotlight train`'s `Trainer` with the `RayRuntime` joined to the cluster,
   while a thread plays a window of a shipped trace on it (`pick_window`; trace node k is cluster
   spot node k): a notice is Ray draining the node (as a cloud integration turns a provider's
   notice into a drain), a removal is SIGKILLing its processes, an add is a fresh `ray start`
   node. The trace plays `--speedup` times faster than recorded, from the first iteration on,
   through every phase (as the simulator replays it).
3. **simulate** (`simulate`): `simulate_run` on the same config and window with the measured step
   times (`runtime.trace_speedup` and `runtime.notice_s` replay it alike).
4. **compare** (`compare`): predicted against measured — seconds per iteration (mean, and per phase),
   time to N iterations, requests given back and re-queued, notices and removals, gradients and
   bytes — with the ratio and whether it is within `TOLERANCE` (times) or exact (counts); written
   as DIR/comparison.json and DIR/comparison.md, and printed.

Timing on a shared machine is ruined by anything else running: `--wait-quiet-s` waits (up to that
long, before the cluster starts) for the 1-minute load to fall below `QUIET_LOAD` with no one
else's pytest running; the load then, and with the cluster up before and after the live run, goes
into the table. docs/simulator-validation.md has the method, what was modelled and the table of
the last run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from schedulers.request import Kind
from schedulers.traces import ReplayAction, Trace, TraceEvent, load_trace, replay_schedule

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "tiny_dit.yaml"
TRACE = HERE / "traces" / "bamboo-p3.csv"
SPOT_NODES = 3
"""Spot nodes the cluster starts with (one executor each), besides the on-demand head."""
ONDEMAND_WORKERS = 1
"""Rollout workers on the head: with 3 spot ones, 4 devices on 2 cores (the contention is measured)."""
NOTICE_S = 120.0
"""The notice before each removal, in trace seconds: the Bamboo traces are AWS's (2 minutes)."""
TOLERANCE = 0.25
"""A predicted time within +-25% of the measured one passes; a count must be exact."""
MIN_PHASE_SHARE = 0.05
"""A phase shorter than 5% of the measured iteration is shown but not judged (the reward's 30 ms
and the advantage's 0.5 ms of a ~3 s iteration are timer noise at +-25%)."""
KILL_AT, JOIN_BY = 0.35, 0.55
"""Where `pick_window` puts the window's removal and, at the latest, its join: at 35% and 55% of the
run, so the notice, the kill, the join and the joined node's work all happen inside it."""
REPEATS = 3
"""Times the contention probes run (their median is taken)."""
QUIET_LOAD = 0.5
"""The 1-minute load average below which the machine counts as quiet (`wait_for_quiet`)."""


# ---- the config ---------------------------------------------------------------------------------


def validation_config(base: Path, iterations: int, speedup: float, address: str | None = None) -> Any:
    """The run validated: `base` (the tiny DiT) on the Ray runtime, its update on the fleet, so that
    gradients cross between nodes and their bytes are counted."""
    from spotlight.config import load_config

    return load_config(base, {
        # A step takes as long whatever the weights: the 2,400-step warm start (3.5 min) is skipped.
        "warm_start": {"steps": 0},
        # 64 samples x 8 SDE steps = 512 rows a round, in micro-batches of 16: 32 a round, in 4
        # requests of 8 (one per node's crew); the checkpoint comes after the last row only.
        "train": {"steps": iterations, "update_on": "fleet", "micro_batch": 16, "checkpoint_every": iterations},
        "runtime": {"kind": "ray", "address": address, "ondemand_workers": ONDEMAND_WORKERS,
                    "spot_workers": SPOT_NODES, "trace_speedup": speedup, "notice_s": NOTICE_S},
    })


# ---- the trace window ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """A window of a recorded trace mapped onto the cluster's spot nodes."""

    trace: Trace
    """The window's events on the mapped nodes, in seconds from its start (trace seconds)."""
    start_s: float
    """Where it starts in the recorded trace."""
    duration_s: float
    nodes: tuple[str, ...]
    """The recorded nodes in slot order: slot k is the cluster's spot node k (the first ones live
    at the start, then those that join)."""

    def describe(self) -> str:
        return (f"{self.trace.source} from {self.start_s:,.0f} s for {self.duration_s:,.0f} s, nodes "
                + ", ".join(f"{n} -> spot{k}" for k, n in enumerate(self.nodes)))


def _live_at(trace: Trace, t_s: float) -> list[str]:
    """The nodes live just after every event at or before `t_s`, in order of first appearance."""
    live: dict[str, None] = {}
    for e in trace.events:
        if e.t_s > t_s:
            break
        if e.action == "add":
            live[e.node] = None
        else:
            live.pop(e.node, None)
    order = {n: i for i, n in enumerate(trace.nodes)}
    return sorted(live, key=order.__getitem__)


def trace_window(trace: Trace, start_s: float, duration_s: float, nodes: Sequence[str]) -> Trace:
    """The events of `nodes` in (start_s, start_s + duration_s], shifted to the window's start, the
    nodes live at `start_s` added at 0 in the order given. `nodes` must list those live at the start
    first, then the others in the order of their first event in the window, so that the window's
    order of first appearance (`Trace.nodes`, `replay_schedule`'s slots) is `nodes`' order."""
    live = set(_live_at(trace, start_s))
    first = [n for n in nodes if n in live]
    events = [TraceEvent(0.0, "add", n) for n in first]
    chosen = set(nodes)
    events += [TraceEvent(e.t_s - start_s, e.action, e.node) for e in trace.events
               if e.node in chosen and start_s < e.t_s <= start_s + duration_s]
    window = Trace(events, f"{trace.source}[{start_s:g}s+{duration_s:g}s]", end_s=duration_s)
    if window.nodes != list(nodes):
        raise ValueError(f"trace_window: nodes {list(nodes)} are not in slot order (live at the start first, then "
                         f"by first event): the window's order is {window.nodes}")
    return window


def pick_window(trace: Trace, duration_s: float, spot_nodes: int = SPOT_NODES, start_s: float | None = None) -> Window:
    """The first window of `duration_s` trace seconds (from `start_s` when given) in which a node
    live at its start is removed at `KILL_AT` of it (by then, with `start_s`) with no other event
    of its own, a node not live at its start joins after that removal and by `JOIN_BY`, and
    `spot_nodes - 1` other nodes stay live throughout (no event of theirs in it): `spot_nodes`
    cluster nodes at the start, one notice and removal, one join. ValueError when there is none."""
    events = trace.events
    for e in events:
        if e.action != "remove":
            continue
        t0 = e.t_s - KILL_AT * duration_s if start_s is None else start_s
        if t0 < 0 or not t0 < e.t_s <= t0 + KILL_AT * duration_s + 1e-9:
            continue
        end = t0 + duration_s
        inside = [x for x in events if t0 < x.t_s <= end]
        live = _live_at(trace, t0)
        if e.node not in live or any(x.node == e.node and x is not e for x in inside):
            continue
        busy = {x.node for x in inside}
        steady = [n for n in live if n not in busy][:spot_nodes - 1]
        joins = [x for x in inside if x.action == "add" and e.t_s <= x.t_s <= t0 + JOIN_BY * duration_s
                 and x.node not in live and x.node != e.node
                 and not any(y.node == x.node and y.t_s > x.t_s for y in inside)]
        if len(steady) == spot_nodes - 1 and joins:
            nodes = (e.node, *steady, joins[0].node)
            return Window(trace_window(trace, t0, duration_s, nodes), t0, duration_s, nodes)
    where = "" if start_s is None else f" starting at {start_s:g} s"
    raise ValueError(f"{trace.source}: no window of {duration_s:,.0f} s{where} with a removal of a node live at its "
                     f"start and a join after it, besides {spot_nodes - 1} nodes live throughout")


def cluster_actions(window: Trace, speedup: float, notice_s: float, initial: int) -> list[ReplayAction]:
    """What the live run's player does on the cluster, in wall seconds from the first iteration:
    the window replayed on one slot per node (`replay_schedule`, as the simulator replays it), less
    the adds of the `initial` slots at 0 (the cluster starts with those nodes)."""
    return [a for a in replay_schedule(window, max(len(window.nodes), 1), speedup, notice_s)
            if not (a.action == "add" and a.at_s == 0.0 and a.slot < initial)]


# ---- the machine ----------------------------------------------------------------------------------


def _tree(pid: int) -> set[int]:
    from spotlight.bench.loopback_cluster import descendants

    return {pid, *descendants(pid)}


def others_running(words: Sequence[str] = ("pytest",)) -> list[str]:
    """Command lines of processes outside this one's tree that contain one of `words`."""
    mine = _tree(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if any(w in cmd for w in words):
            found.append(f"{entry}: {cmd[:120]}")
    return found


def host_load() -> dict[str, Any]:
    """The load averages and who else is testing, now."""
    one, five, fifteen = os.getloadavg()
    return {"load_1m": one, "load_5m": five, "load_15m": fifteen, "others": others_running(),
            "cores": os.cpu_count(), "at": time.strftime("%Y-%m-%d %H:%M:%S")}


def wait_for_quiet(max_wait_s: float, log: Callable[[str], None] = print, poll_s: float = 15.0) -> dict[str, Any]:
    """Wait up to `max_wait_s` for a 1-minute load below `QUIET_LOAD` with no one else's pytest
    running; returns the load then, how long it waited and whether it got quiet."""
    start = time.monotonic()
    while True:
        load = host_load()
        quiet = load["load_1m"] < QUIET_LOAD and not load["others"]
        waited = time.monotonic() - start
        if quiet or waited >= max_wait_s:
            return {**load, "waited_s": waited, "quiet": quiet}
        log(f"waiting for a quiet machine: load {load['load_1m']:.2f}, {len(load['others'])} other test process(es)")
        time.sleep(poll_s)


# ---- 1. measuring ---------------------------------------------------------------------------------


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _requests(cfg: Any, tag: str, version: int = 0) -> list[Any]:
    """One iteration's rollout requests as `Trainer.requests` makes them: one per prompt, G seeds."""
    from schedulers.request import Request
    from spotlight.rl.prompt_file import run_prompts

    g, n = cfg.train.group_size, cfg.train.prompts_per_step
    prompts = run_prompts(cfg.prompts, cfg.seed)[:n]
    return [Request(f"{tag}/p{p.id}", Kind.ROLLOUT, p.id, p.text, tuple(range(i * g, (i + 1) * g)),
                    weight_version=version, order=i) for i, p in enumerate(prompts)]


def compute_probe(cfg: Any) -> dict[str, Any]:
    """In one process (a Ray task on a node), without any actor call: an iteration's requests
    computed as a worker computes them — each denoising step of G samples, starting and finishing
    them — then every micro-batch of the update over that rollout, and a fold of one request's
    parts. Returns the mean seconds, a request's states after each step but the last and a finished
    rollout (the payloads `call_probe` sends: a commit's grows with the trajectory)."""
    import torch

    from spotlight.rl.gradient import fold_parts, part_gradient
    from spotlight.rl.prompts import Prompt
    from spotlight.runtime.learner import build_policy

    torch.set_num_threads(cfg.runtime.torch_threads)
    torch.manual_seed(cfg.seed)
    policy = build_policy(cfg)
    steps, ends, results, states = [], [], [], []
    requests = _requests(cfg, "compute")
    for i, r in enumerate([requests[0], *requests]):  # the first one warms up, uncounted
        prompts = [Prompt(r.prompt_id, r.prompt_text)] * len(r.seeds)
        t = time.perf_counter()
        state = policy.init_state(prompts, r.seeds)
        ends_s = time.perf_counter() - t
        while state.step < policy.num_steps:
            t = time.perf_counter()
            state = policy.advance(prompts, state, state.step + 1)
            if i:
                steps.append(time.perf_counter() - t)
            if i == 1 and state.step < policy.num_steps:
                states.append(state)
        t = time.perf_counter()
        result = policy.finish(prompts, state)
        if i:
            ends.append(ends_s + time.perf_counter() - t)
            results.append(result)
    rollout = policy.merge(results)
    advantages = torch.randn(len(rollout), generator=torch.Generator().manual_seed(cfg.seed))
    n = policy.update_parts(rollout)
    part_gradient(policy, rollout, advantages, 0)  # warm-up
    parts, part_s = [], []
    for i in range(n):
        t = time.perf_counter()
        parts.append(part_gradient(policy, rollout, advantages, i, device="cpu"))
        part_s.append(time.perf_counter() - t)
    k = min(cfg.train.parts_per_request, n)
    t = time.perf_counter()
    fold_parts(parts[:k], device="cpu")
    return {"step_s": _mean(steps), "start_finish_s": _mean(ends), "part_s": _mean(part_s), "parts": n,
            "fold_s": time.perf_counter() - t, "states": states, "result": results[0]}


def call_probe(queue: Any, states: Sequence[Any], result: Any, repeats: int) -> dict[str, float]:
    """The actor round trips a worker makes, from a process on a spot node to the queue actor on the
    head, `repeats` of each: a heartbeat (before every step), a commit carrying a request's state
    (each of `states` in turn: the mean over a request's commits), a pull followed by the
    completion carrying a finished rollout."""
    from schedulers.queue_actor import QueueClient
    from schedulers.request import Request

    q, name = QueueClient(queue), "probe-calls"
    q.put([Request(f"calls/{i}", Kind.ROLLOUT, 0, "", (0,), weight_version=0) for i in range(repeats + 1)])
    held = q.pull(name, 1, None, 0)[0].request.id

    def each(fn: Callable[[int], Any]) -> float:
        fn(0)  # the first call opens the connection: uncounted
        t = time.perf_counter()
        for i in range(1, repeats):
            fn(i)
        return (time.perf_counter() - t) / (repeats - 1)

    heartbeat = each(lambda i: q.heartbeat(name, {held: 1}, report_cancelled=True))
    commit = each(lambda i: q.checkpoint(name, held, states[i % len(states)], states[i % len(states)].step))
    q.complete(name, held, None)

    def pull_complete(i: int) -> None:
        lease = q.pull(name, 1, None, 0)[0]
        q.complete(name, lease.request.id, result)

    return {"heartbeat_s": heartbeat, "commit_s": commit, "pull_complete_s": each(pull_complete)}


@dataclass
class Figure:
    value: float
    how: str
    """How it was measured (and from which probes), for the step-time file's comment."""


@dataclass
class Measured:
    figures: dict[str, Figure] = field(default_factory=dict)
    """Step-time fields (`StepTimes`) as measured here."""
    probes: dict[str, Any] = field(default_factory=dict)
    """Every raw figure the probes gave."""

    def set(self, name: str, value: float, how: str) -> None:
        self.figures[name] = Figure(value, how)


class Probes:
    """What the probes share: the cluster's nodes, and on its head a queue actor and a learner
    actor built from the config (`LearnerActor`), whose weights the probe workers hold."""

    def __init__(self, cluster: Any, cfg: Any) -> None:
        import ray

        from schedulers.queue_actor import QueueActor
        from spotlight.runtime.ray_fleet import placement
        from spotlight.runtime.ray_runtime import LearnerActor

        self.cluster, self.cfg = cluster, cfg
        ids = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
        self.head = ids[cluster.head.ip]
        self.spot = [ids[n.ip] for n in cluster.nodes if n is not cluster.head]
        self.home = placement(self.head, False, 0, False)
        self.queue = QueueActor.options(**self.home).remote(lease_s=3600.0)
        self.learner = LearnerActor.options(**self.home).remote(cfg)
        ray.get(self.learner.build.remote(None))
        self.weights = self.learner.weights.remote()
        self.actors: list[Any] = [self.queue, self.learner]
        self.rollout_ids: list[str] = []
        """An iteration's rollout requests, completed: their results stay in the queue."""
        self.parts: Any = None
        """Their results read from the queue (an ObjectRef), as the update reads them."""
        self.spans: list[range] = []
        """The update's requests' micro-batches."""

    def worker(self, node: str, spot: bool, name: str, version: int = 0) -> tuple[Any, float]:
        """A rollout worker actor on `node`, as `RayExecutor.start` makes one (the actor, its build,
        the weights), and the seconds until it holds them."""
        import ray

        from schedulers.queue_actor import QueueClient
        from spotlight.runtime.ray_fleet import placement
        from spotlight.runtime.ray_runtime import RolloutWorkerActor

        t = time.perf_counter()
        actor = RolloutWorkerActor.options(**placement(node, spot, 0, False)).remote(
            name, self.cfg, QueueClient(self.queue), commit_every=self.cfg.runtime.commit_every)
        actor.build.remote(None)
        ray.get(actor.set_weights.remote(version, self.weights))
        self.actors.append(actor)
        return actor, time.perf_counter() - t

    def serve(self, workers: Sequence[Any], requests: Sequence[Any]) -> float:
        """Seconds until every one of `workers` has served `requests` (put first) and found no more."""
        import ray

        ray.get(self.queue.put.remote(list(requests)))
        t = time.perf_counter()
        ray.get([w.serve.remote(sorted({r.kind for r in requests}, key=lambda k: k.value)) for w in workers])
        return time.perf_counter() - t

    def rollout(self, tag: str, version: int = 0) -> list[Any]:
        return _requests(self.cfg, tag, version)

    def update(self, number: int, weights: Any = None) -> list[Any]:
        """Round `number`'s gradient requests over `parts`, as `FleetUpdate` puts them."""
        import torch

        from schedulers.request import GradientWork, Request

        cfg = self.cfg
        advantages = torch.randn(cfg.train.prompts_per_step * cfg.train.group_size,
                                 generator=torch.Generator().manual_seed(cfg.seed))
        return [Request(f"probe/u{number}/m{r.start}", Kind.TRAIN, 0, "", (), 0, order=c,
                        work=GradientWork(number, r.start, (self.parts, advantages), weights, len(r)))
                for c, r in enumerate(self.spans)]

    def fleet(self) -> Any:
        """The fleet engine with the live runtime's executor and loop (`RayExecutor`, the engine
        polling the queue every `_POLL_S`) over the head's on-demand workers and one worker per spot
        node, its workers started."""
        from schedulers.clock import WallClock
        from schedulers.fleet import FleetEngine, Node
        from schedulers.queue_actor import QueueClient
        from spotlight.runtime.ray_runtime import _POLL_S, RayExecutor

        clock = WallClock()
        nodes = [Node("probe-head", spot=False, devices=self.cfg.runtime.ondemand_workers, cluster_id=self.head)]
        nodes += [Node(f"probe-spot{k}", spot=True, devices=1, cluster_id=n) for k, n in enumerate(self.spot)]
        executor = RayExecutor(self.cfg, self.queue, 0, self.weights, clock, home=self.head)
        engine = FleetEngine(clock, QueueClient(self.queue), executor, nodes, poll_s=_POLL_S)
        engine.start()
        self.actors += [w.handle for w in engine.workers.values()]
        return engine

    def kill(self, actor: Any) -> None:
        import ray

        ray.kill(actor, no_restart=True)
        self.actors.remove(actor)

    def close(self) -> None:
        import ray

        for a in self.actors:
            ray.kill(a, no_restart=True)


class _Round:
    """Gradient requests put in the queue, as the fleet engine waits on an update (a `Pending`): the
    nodes' crews serve them as they serve a live update's round; done once none is open."""

    kinds = (Kind.TRAIN,)
    deadline = None
    ref = None

    def __init__(self, queue: Any, per_request: int) -> None:
        self.queue, self.per_request = queue, per_request

    def done(self) -> bool:
        return not self.queue.open(Kind.TRAIN)


def measure(cluster: Any, cfg: Any, add_node_s: Sequence[float] = (), log: Callable[[str], None] = print) -> Measured:
    """This machine's figures for `cfg` on `cluster` (the head and the spot nodes up, the driver
    connected; `add_node_s`: how long their `ray start`s took); one more node joins while they
    compute, as a node joins a run, and is killed after. Every probe runs the product's own classes
    where the live run would: the queue, the learner and the reward worker on the head, rollout
    worker actors on the nodes (module docstring)."""
    m = Measured(probes={"add_node_s": list(add_node_s)})
    p = Probes(cluster, cfg)
    try:
        first = _requests_alone(p, m, log)
        _update_alone(p, m, first, log)
        p.kill(first)  # its node's `spot` unit goes to the fleet's worker there
        engine = p.fleet()
        crew = [w.handle for w in engine.workers.values()]
        _sharing(p, m, engine, log)
        _join_under_load(p, m, crew, log)
        _learner_and_reward(p, m, crew)
    finally:
        p.close()
    m.set("fleet_update_efficiency", 1.0, "spot and on-demand workers are the same CPU here")
    m.set("train_efficiency", 1.0, "the update's micro-batches: no data-parallel loss on one device")
    return m


def _requests_alone(p: Probes, m: Measured, log: Callable[[str], None]) -> Any:
    """A worker actor starting on a node nothing ran on yet (what a joining node's executor does),
    its first request and the steady ones, served alone; the same requests' compute in one process
    and the worker's actor round trips, timed apart. Returns the worker."""
    import ray

    from schedulers.update import chunks
    from spotlight.runtime.ray_fleet import placement

    cfg = p.cfg
    first, start_s = p.worker(p.spot[0], True, "probe-spot0.0")
    first_s = p.serve([first], p.rollout("first")[:1])
    solo = p.rollout("solo")
    solo_s = p.serve([first], solo) / len(solo)
    p.rollout_ids = [r.id for r in solo]
    p.parts = p.queue.results.remote(p.rollout_ids)
    log(f"measured: a worker starts in {start_s:.2f} s; its first request {first_s:.3f} s, then {solo_s:.3f} s each")

    g, steps = cfg.train.group_size, cfg.sampler.num_steps
    task = ray.remote(num_cpus=0)
    on = placement(p.spot[0], False, 0, False)
    compute = ray.get(task(compute_probe).options(**on).remote(cfg))
    calls = ray.get(task(call_probe).options(**on).remote(p.queue, compute.pop("states"), compute.pop("result"),
                                                           1 + 5 * (steps - 1)))
    m.probes.update(worker_start_s=start_s, first_request_s=first_s, request_solo_s=solo_s, compute=compute,
                    calls=calls)
    log(f"measured: compute {compute}; calls {calls}")
    commits = (steps - 1) // cfg.runtime.commit_every
    m.set("denoise_step_s", compute["step_s"] / g,
          f"one denoising step of a request of {g} samples in one process, per sample ({compute['step_s'] * 1e3:.2f} ms "
          f"a step; {steps} steps of each of {len(solo)} requests, a task on a spot node)")
    m.set("step_overhead_s", calls["heartbeat_s"],
          "a worker's heartbeat to the queue actor: the round trip from a spot node to the head")
    m.set("commit_overhead_s", calls["commit_s"],
          "a commit of a request's state: the round trip from a spot node carrying it (the mean over its steps: "
          "the trajectory grows)")
    rest = solo_s - steps * (compute["step_s"] + calls["heartbeat_s"]) - commits * calls["commit_s"]
    m.set("request_overhead_s", max(0.0, rest),
          f"a request as a worker actor serves it alone ({solo_s * 1e3:.1f} ms, {len(solo)} in a row) less its {steps} "
          f"steps with their heartbeats and its {commits} commits: the pull and the completion carrying the result "
          f"({calls['pull_complete_s'] * 1e3:.1f} ms measured apart), starting and finishing the samples "
          f"({compute['start_finish_s'] * 1e3:.1f} ms), the rest unexplained")
    m.set("worker_warmup_s", max(0.0, first_s - solo_s),
          "a fresh worker actor's first request over its steady ones (first forward, first queue calls)")
    m.set("train_flops_factor", compute["part_s"] * compute["parts"] / (len(solo) * g * len(cfg.sampler.sde_steps)
                                                                         * compute["step_s"] / g),
          f"a micro-batch of the update ({cfg.train.micro_batch} rows, forward and backward) in one process "
          f"({compute['part_s'] * 1e3:.1f} ms) over the denoising step of its rows")
    p.spans = chunks(compute["parts"], cfg.train.parts_per_request)
    return first


def _update_alone(p: Probes, m: Measured, first: Any, log: Callable[[str], None]) -> None:
    """The update's requests on the same worker alone: the first of a round fetches its inputs (the
    rollout, or the round's weights), the others find them there."""
    part_s = m.probes["compute"]["part_s"]
    fetched, steady = [], []
    for number, weights in ((0, None), (1, p.learner.weights.remote())):
        requests = p.update(number, weights)
        fetched.append(p.serve([first], requests[:1]))
        steady.append(p.serve([first], requests[1:]) / (len(requests) - 1))
    m.probes.update(train_first_s=fetched, train_steady_s=steady)
    log(f"measured: gradient requests first {fetched}, steady {steady} (compute {len(p.spans[0])} x {part_s:.3f} s)")
    # Live each worker computes one request a round (4 on 4 nodes), its first: it fetches the inputs.
    m.set("train_request_overhead_s", max(0.0, _mean(fetched) - len(p.spans[0]) * part_s),
          f"a worker's first gradient request of a round, served alone, less its {len(p.spans[0])} micro-batches "
          f"({_mean(fetched) * 1e3:.0f} ms: round 0 fetches and merges the rollout, {fetched[0] * 1e3:.0f} ms; round 1 "
          f"loads the learner's weights, {fetched[1] * 1e3:.0f} ms; the next ones of a round "
          f"{_mean(steady) * 1e3:.0f} ms): the pull, the fetch, the fold and the completion carrying the gradient")


def _join_under_load(p: Probes, m: Measured, crew: list[Any], log: Callable[[str], None]) -> None:
    """A node joining while the fleet computes (`ray start`, then its executor's start and first
    request), the run's every worker serving iterations' requests meanwhile; the node is killed
    afterwards, leaving the cluster as it was. The joining worker holds weights version 1 for its
    requests, which the others cannot pull."""
    import ray

    from spotlight.runtime.ray_fleet import POLL_S

    busy = threading.Event()

    def load() -> None:
        i = 0
        while not busy.is_set():
            p.serve(crew, p.rollout(f"load{i}"))
            i += 1

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    try:
        t = time.perf_counter()
        joined = p.cluster.add_node({"spot": 1}, name="probe-join")
        add_s = time.perf_counter() - t
        node = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == joined.ip)
        newcomer, start_s = p.worker(node, True, "probe-join.0", version=1)
        first_s = p.serve([newcomer], p.rollout("join-first", version=1)[:1])
        next_s = statistics.median(p.serve([newcomer], p.rollout(f"join-next{i}", version=1)[:1]) for i in range(3))
    finally:
        busy.set()
        loader.join()
    p.cluster.kill(joined)
    m.probes.update(join_add_node_s=add_s, join_worker_start_s=start_s, join_first_request_s=first_s,
                    join_next_request_s=next_s)
    log(f"measured: a node joining under load: ray start {add_s:.2f} s, its worker {start_s:.2f} s, "
        f"its first request {first_s:.3f} s, the next ones {next_s:.3f} s")
    # The run's next look at the cluster comes once a second: half a second on average.
    warmup = max(0.0, first_s - next_s)
    quiet = m.probes["add_node_s"]
    m.set("cold_start_s", add_s + POLL_S / 2 + start_s + warmup,
          f"a spot node joining while {len(crew)} workers compute, until it serves: ray start {add_s:.2f} s, the "
          f"run's next look at the cluster {POLL_S / 2:.1f} s on average, its worker actor's start {start_s:.2f} s, "
          f"its first request's extra {warmup:.2f} s (on a quiet machine: a worker {m.probes['worker_start_s']:.2f} s"
          + (f", ray start {_mean(quiet):.2f} s)" if quiet else ")"))


def _sharing(p: Probes, m: Measured, engine: Any, log: Callable[[str], None]) -> None:
    """The devices sharing the host's cores: an iteration's rollout, and a round of the update (one
    request a worker), on every node's worker at once through the fleet engine as the live runtime
    runs them (its loop polling the queue), against the same requests served by one worker alone;
    the median of `REPEATS` each. `host_cores` is from the mean of the two slow-downs."""
    import ray

    from schedulers.queue_actor import QueueClient

    devices = len(engine.workers)
    n = len(p.rollout("n"))

    def rollout(tag: str) -> float:
        t = time.perf_counter()
        engine.rollout(p.rollout(tag), 0)
        return time.perf_counter() - t

    def update_round(number: int) -> float:
        ray.get(p.queue.put.remote(p.update(number)[:devices]))
        t = time.perf_counter()
        engine.wait(_Round(QueueClient(p.queue), p.cfg.train.parts_per_request), 0)
        return time.perf_counter() - t

    rollout("warm-all")
    update_round(3)  # each worker fetches the rollout once
    solo_s, train_s = m.probes["request_solo_s"], _mean(m.probes["train_steady_s"])
    rollout_slowdown = statistics.median(rollout(f"together{i}") for i in range(REPEATS)) / (n / devices) / solo_s
    train_slowdown = statistics.median(update_round(4 + i) for i in range(REPEATS)) / train_s
    slowdown = (rollout_slowdown + train_slowdown) / 2
    m.probes.update(devices=devices, rollout_slowdown=rollout_slowdown, train_slowdown=train_slowdown)
    m.set("host_cores", devices / slowdown if slowdown > 1 else 0.0,
          f"{devices} workers computing at once through the fleet engine, each request took {slowdown:.2f}x one "
          f"worker's alone (an iteration's {n} rollout requests {rollout_slowdown:.2f}x, a round of gradient "
          f"requests, one a worker, {train_slowdown:.2f}x): {devices} / {slowdown:.2f} effective cores")
    log(f"measured: {devices} workers at once: rollout requests {rollout_slowdown:.2f}x, gradient requests "
        f"{train_slowdown:.2f}x")


def _learner_and_reward(p: Probes, m: Measured, crew: list[Any]) -> None:
    """The learner folding a round's gradients as they arrive, then stepping (the live `add` and
    `step`); a publication as the live `publish` makes it (the learner's weights handed to every
    worker, not waited on); the reward actor's call on an iteration's rollout."""
    import ray

    from spotlight.runtime.ray_runtime import RewardPool

    p.serve(crew[:1], p.update(2))
    ids = [r.id for r in p.update(2)]
    rounds = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        for c, rid in enumerate(ids):
            p.learner.add_part.remote(0, c, len(ids), p.queue.results.remote([rid]))
        ray.get(p.learner.step_added.remote(0))
        rounds.append(time.perf_counter() - t)
    m.set("update_round_s", _mean(rounds),
          f"the learner folding a round's {len(ids)} gradients as they arrive and stepping (mean of {len(rounds)})")
    publish = []
    for version in range(1 + REPEATS):
        t = time.perf_counter()
        ref = p.learner.weights.remote()
        for w in crew:
            w.set_weights.remote(version, ref)
        publish.append(time.perf_counter() - t)
    m.set("weight_sync_s", _mean(publish[1:]),
          f"the publication as the live runtime makes it: the learner's weights handed to every worker, not waited "
          f"on (mean of {len(publish) - 1} after the first)")
    pool = RewardPool(p.cfg, p.home, 0, None)
    p.actors += pool.actors
    pool.build()
    pool.score(p.parts)  # its first call builds the reward
    scores = []
    for _ in range(REPEATS):
        t = time.perf_counter()  # as the live reward phase: the rollout read from the queue, then scored
        pool.score(p.queue.results.remote(p.rollout_ids))
        scores.append(time.perf_counter() - t)
    m.set("reward_call_s", _mean(scores),
          f"the reward actor scoring an iteration's rollout, read from the queue actor as the live reward phase "
          f"reads it (mean of {len(scores)})")
    m.set("reward_s_per_sample", 0.0, "in reward_call_s: the live runtime scores after the rollout, not in the workers")


def step_times_yaml(m: Measured, when: str, machine: str) -> str:
    """The measured figures as a step-time file (`StepTimes.load`): the tiny-cpu profile with every
    figure measured here, each with its measurement in a comment."""
    lines = [f"# Measured by `python -m experiments.validate_simulator` on {when}, {machine}.",
             "# Every figure below is this machine's, for the validated config (tiny DiT, G samples a request);",
             "# docs/simulator-validation.md has the method.", "profile: tiny-cpu"]
    for name, f in m.figures.items():
        value = f"{f.value:.6g}" if isinstance(f.value, float) else str(f.value)
        lines.append(f"{name}: {value}  # {f.how}")
    return "\n".join(lines) + "\n"


# ---- 2. the live run ------------------------------------------------------------------------------


class Player:
    """Plays `actions` (`cluster_actions`) on the cluster from `start()` on, in a thread: slot k is
    `nodes[k]`; an add starts a fresh spot node for its slot. `done` lists what was played when."""

    def __init__(self, cluster: Any, nodes: list[Any], actions: list[ReplayAction],
                 log: Callable[[str], None] = print) -> None:
        self.cluster, self.nodes, self.actions, self.log = cluster, list(nodes), actions, log
        self.done: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.t0 = 0.0

    def start(self) -> None:
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _node_id(self, ip: str) -> str | None:
        import ray

        return next((n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == ip), None)

    def _run(self) -> None:
        for a in self.actions:
            if self.stop.wait(max(0.0, self.t0 + a.at_s - time.monotonic())):
                return
            at = time.monotonic() - self.t0
            while len(self.nodes) <= a.slot:
                self.nodes.append(None)
            node = self.nodes[a.slot]
            if a.action == "notice" and node is not None:
                node_id = self._node_id(node.ip)
                kill_at = next((b.at_s for b in self.actions if b.slot == a.slot and b.action == "kill"
                                and b.at_s >= a.at_s), a.at_s)
                if node_id is not None:
                    self.cluster.drain(node_id, int((time.time() + kill_at - a.at_s) * 1000), "spot interruption (trace replay)")
            elif a.action == "kill" and node is not None:
                self.cluster.kill(node)
                self.nodes[a.slot] = None
            elif a.action == "add":
                self.nodes[a.slot] = self.cluster.add_node({"spot": 1}, name=f"spot-{a.slot}-{len(self.done)}")
            self.done.append({"action": a.action, "slot": a.slot, "planned_s": a.at_s, "at_s": at,
                              "took_s": time.monotonic() - self.t0 - at})
            self.log(f"trace: {a.action} spot{a.slot} (planned at {a.at_s:.1f} s), done in {self.done[-1]['took_s']:.1f} s")

    def finish(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()


def run_live(cluster: Any, cfg: Any, actions: list[ReplayAction], out: Path,
             log: Callable[[str], None] = print) -> dict[str, Any]:
    """`spotlight train`'s Trainer on the cluster with the actions played from the first
    iteration's rollout on; returns its metrics rows, summary, queue and engine counters, and what
    the player did."""
    from spotlight.logs import passed_to
    from spotlight.runtime.ray_runtime import RayRuntime
    from spotlight.train.trainer import Trainer

    logs: list[str] = []

    def say(line: str) -> None:
        if player.thread is not None:  # the run's seconds since its first iteration
            line = f"[{time.monotonic() - player.t0:6.1f} s] {line}"
        logs.append(line)
        log(line)

    player = Player(cluster, [n for n in cluster.nodes if n is not cluster.head and n.alive], actions, say)
    runtime = RayRuntime(cfg)
    rollout = runtime.rollout

    def first_rollout(*args: Any, **kwargs: Any) -> Any:
        if player.thread is None:
            player.start()
        return rollout(*args, **kwargs)

    runtime.rollout = first_rollout
    with passed_to(say):  # the run's lines, timed, printed and kept
        trainer = Trainer(cfg, out, progress=False).build(runtime)
        try:
            summary = trainer.train()
        finally:
            player.finish()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    # A removal, as the run saw it: a spot node it ends with gone. The engine's `kills` misses one
    # whose worker's failed call told it first (`Died` marks the node gone; the cluster's next look
    # then finds nothing to kill).
    gone = sum(n.spot and not n.alive for n in runtime.engine.nodes.values())
    return {"rows": rows, "summary": summary, "queue": dict(runtime.queue_stats),
            "fleet_events": {**runtime.engine.counters, "spot_nodes_gone": gone}, "played": player.done, "logs": logs}


# ---- 3. the simulation ------------------------------------------------------------------------------


def simulate(cfg: Any, window: Trace, step_times: Any) -> dict[str, Any]:
    """`simulate_run` on the run config and the window (replayed at `runtime.trace_speedup`)."""
    from spotlight.sim.run_config import POLICY, simulate_run

    result = simulate_run(cfg, window, step_times=step_times)
    return {**result["policies"][POLICY], "fleet_events": result["fleet_events"]}


# ---- 4. the comparison ------------------------------------------------------------------------------

PHASES = ("rollout", "reward", "advantage", "update", "publish")
"""The phases both a training run and the simulator time (`time_<phase>_s`)."""
COUNTS = ("notices", "removals", "requests_given_back", "requests_requeued", "steps_recomputed", "gradients",
          "gradient_bytes", "publish_bytes")
"""The counted figures, which must match exactly."""


def figures(rows: Sequence[dict[str, Any]], counts: dict[str, int], time_to_n_s: float) -> dict[str, float]:
    """The compared figures of a run (live or simulated) from its metrics rows (the keys of
    metrics.jsonl, which the simulator's `iterations_log` shares), its counters and the time from
    its first iteration's start to its last one's row."""
    n = len(rows)
    out: dict[str, float] = {"s_per_iteration": sum(r["wall_s"] for r in rows) / n}
    for p in PHASES:
        out[f"{p}_s"] = sum(r.get(f"time_{p}_s", 0.0) for r in rows) / n
    out["time_to_n_s"] = time_to_n_s
    out.update(counts)
    return out


def live_figures(live: dict[str, Any]) -> dict[str, float]:
    rows, q, ev = live["rows"], live["queue"], live["fleet_events"]
    counts = {"notices": ev["notices"], "removals": ev["spot_nodes_gone"],
              "requests_given_back": q["requests_given_back"],
              "requests_requeued": q["requests_requeued"] + q["leases_expired"],
              "steps_recomputed": q["steps_recomputed"],
              "gradients": sum(r.get("gradient_parts", 0) for r in rows),
              "gradient_bytes": sum(r.get("update_gradient_bytes", 0) for r in rows),
              "publish_bytes": sum(r.get("publish_bytes", 0) for r in rows)}
    return figures(rows, counts, rows[-1]["elapsed_s"])


def sim_figures(sim: dict[str, Any], publication_bytes: int) -> dict[str, float]:
    """`publication_bytes`: one publication's bytes in the simulator's byte model
    (`StepTimes.publication_bytes`), what every simulated iteration publishes."""
    rows, ev = sim["iterations_log"], sim["fleet_events"]
    counts = {"notices": ev["notices"], "removals": ev["kills"], "requests_given_back": sim["requests_given_back"],
              "requests_requeued": sim["requests_requeued"], "steps_recomputed": sim["steps_recomputed"],
              "gradients": sum(r.get("gradient_parts", 0) for r in rows),
              "gradient_bytes": sum(r.get("update_gradient_bytes", 0) for r in rows),
              "publish_bytes": publication_bytes * len(rows)}
    # The last row is written before its checkpoint, as a training run's is.
    end = sum(r["wall_s"] for r in rows) + sum(r.get("time_checkpoint_s", 0.0) for r in rows[:-1])
    return figures(rows, counts, end)


@dataclass(frozen=True)
class Row:
    figure: str
    predicted: float
    measured: float
    kind: str
    """"time" (judged within `TOLERANCE`), "count" (judged exact) or "shown" (not judged)."""

    @property
    def ratio(self) -> float | None:
        if self.measured == 0:
            return None if self.predicted != 0 else 1.0
        return self.predicted / self.measured

    @property
    def ok(self) -> bool | None:
        if self.kind == "count":
            return self.predicted == self.measured
        if self.kind == "time":
            return self.ratio is not None and abs(self.ratio - 1.0) <= TOLERANCE
        return None


LABELS = {"s_per_iteration": "seconds per iteration (mean)", "time_to_n_s": "time to N iterations (s)",
          **{f"{p}_s": f"  {p} phase (s per iteration)" for p in PHASES},
          "notices": "notices (drains)", "removals": "removals (kills)",
          "requests_given_back": "requests given back (notice)", "requests_requeued": "requests re-queued (death)",
          "steps_recomputed": "denoising steps recomputed", "gradients": "gradients sent (TRAIN requests)",
          "gradient_bytes": "gradient bytes to the learner", "publish_bytes": "publication bytes"}


def compare(predicted: dict[str, float], measured: dict[str, float]) -> list[Row]:
    """Predicted against measured, figure by figure (`LABELS` order): times within `TOLERANCE`,
    phases under `MIN_PHASE_SHARE` of the measured iteration shown only, counts exact."""
    rows = []
    for name in LABELS:
        if name not in predicted or name not in measured:
            continue
        if name in COUNTS:
            kind = "count"
        elif name.removesuffix("_s") in PHASES and measured[name] < MIN_PHASE_SHARE * measured["s_per_iteration"]:
            kind = "shown"
        else:
            kind = "time"
        rows.append(Row(name, predicted[name], measured[name], kind))
    return rows


def _number(x: float) -> str:
    if isinstance(x, int) or float(x).is_integer() and abs(x) >= 100:
        return f"{int(x):,}"
    return f"{x:.3f}" if abs(x) < 100 else f"{x:,.1f}"


def markdown(rows: Sequence[Row], meta: dict[str, Any]) -> str:
    """The comparison as a markdown table, with the run's settings and the load above it."""
    lines = [f"Validated {meta.get('date', '?')} on {meta.get('machine', '?')}: {meta.get('what', '')}", ""]
    for key in ("config", "window", "load"):
        if key in meta:
            lines.append(f"- {key}: {meta[key]}")
    lines += ["", "| figure | predicted | measured | ratio | within |", "|---|---|---|---|---|"]
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        verdict = {True: "yes" if r.kind == "time" else "exact", False: "**no**", None: "(not judged)"}[r.ok]
        lines.append(f"| {LABELS[r.figure]} | {_number(r.predicted)} | {_number(r.measured)} | {ratio} | {verdict} |")
    return "\n".join(lines) + "\n"


def as_json(rows: Sequence[Row]) -> list[dict[str, Any]]:
    return [{"figure": r.figure, "label": LABELS[r.figure].strip(), "predicted": r.predicted, "measured": r.measured,
             "ratio": r.ratio, "kind": r.kind, "ok": r.ok} for r in rows]


# ---- the command -----------------------------------------------------------------------------------


def _machine() -> str:
    import platform

    return f"{os.cpu_count()} cores {platform.machine()}, CPU"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m experiments.validate_simulator", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/validate_simulator"))
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--speedup", type=float, default=30.0,
                        help="how many times faster than recorded the trace window plays (default 30: AWS's "
                             "2-minute notice comes 4 s before its removal)")
    parser.add_argument("--config", type=Path, default=CONFIG, help="the run config to start from (default: the tiny DiT)")
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--window-start", type=float, default=None, help="trace seconds (default: the first window that fits)")
    parser.add_argument("--step-times", type=Path, default=None, help="use these figures instead of measuring them")
    parser.add_argument("--wait-quiet-s", type=float, default=0.0,
                        help="wait up to this long, before anything starts, for a quiet machine (default: do not wait)")
    args = parser.parse_args(argv)

    import ray

    from schedulers.input.files import InputError
    from spotlight.bench.loopback_cluster import LoopbackCluster
    from spotlight.config import ConfigError
    from spotlight.sim.run_config import simulated_config
    from spotlight.sim.step_time import StepTimes

    try:  # bad input is one line, before anything starts
        base_cfg = validation_config(args.config, args.iterations, args.speedup)
        trace = load_trace(args.trace)
        given = StepTimes.load(args.step_times) if args.step_times is not None else None
    except (ConfigError, InputError) as err:
        parser.error(str(err))
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    when, machine = time.strftime("%Y-%m-%d"), _machine()
    meta: dict[str, Any] = {"date": when, "machine": machine}
    # Before anything of ours runs: the cluster's own processes count in the load once it is up.
    load_before = wait_for_quiet(args.wait_quiet_s) if args.wait_quiet_s else {**host_load(), "waited_s": 0.0}
    with LoopbackCluster() as cluster:
        add_node_s = []
        for k in range(SPOT_NODES):
            t = time.perf_counter()
            cluster.add_node({"spot": 1}, name=f"spot-{k}")
            add_node_s.append(time.perf_counter() - t)
        cfg = validation_config(args.config, args.iterations, args.speedup, cluster.address)
        if args.step_times is None:
            ray.init(address=cluster.address, log_to_driver=False)
            try:
                measured = measure(cluster, cfg, add_node_s)
            finally:
                ray.shutdown()
            (out / "measured.json").write_text(json.dumps(
                {"figures": {k: vars(f) for k, f in measured.figures.items()}, "probes": measured.probes},
                indent=2, default=str))
            (out / "step_times.yaml").write_text(step_times_yaml(measured, when, machine))
            args.step_times = out / "step_times.yaml"
        st = given or StepTimes.load(args.step_times)
        # The window spans the predicted run: a first simulation without preemptions sizes it.
        steady = simulate(base_cfg, Trace([TraceEvent(0.0, "add", f"n{k}") for k in range(SPOT_NODES)], "steady"), st)
        duration = steady["wall_h"] * 3600.0 * args.speedup
        try:
            window = pick_window(trace, duration, SPOT_NODES, args.window_start)
        except ValueError as err:  # the cluster stops on the way out
            parser.error(f"--trace: {err}")
        print(f"window: {window.describe()}")
        actions = cluster_actions(window.trace, args.speedup, NOTICE_S, SPOT_NODES)
        load_run = host_load()
        shutil.rmtree(out / "live", ignore_errors=True)  # a run folder left there would be resumed
        live = run_live(cluster, cfg, actions, out / "live")
        load_after = host_load()
    predicted_sim = simulate(base_cfg, window.trace, st)
    predicted = sim_figures(predicted_sim, simulated_config(base_cfg, st)[0].step_times.publication_bytes)
    measured_live = live_figures(live)
    rows = compare(predicted, measured_live)
    meta.update(
        what=f"{args.iterations} iterations of {args.config.name} on a loopback Ray cluster (on-demand head + "
             f"{SPOT_NODES} spot nodes of 1 executor; update on the fleet)",
        config=f"{args.config} + the validation overrides (`validation_config`), step times {args.step_times}",
        window=f"{window.describe()}, played {args.speedup:g}x faster with a {NOTICE_S:g} s notice",
        load=f"1-minute load {load_before['load_1m']:.2f} before measuring (waited {load_before['waited_s']:.0f} s "
             f"for a quiet machine: {load_before.get('quiet', 'not asked')}; others testing: "
             f"{len(load_before['others'])}); with the cluster up (its own processes count): "
             f"{load_run['load_1m']:.2f} before the live run, {load_after['load_1m']:.2f} after")
    table = markdown(rows, meta)
    (out / "comparison.md").write_text(table)
    (out / "comparison.json").write_text(json.dumps(
        {"meta": meta, "rows": as_json(rows), "predicted": predicted, "measured": measured_live,
         "load_before": load_before, "load_run": load_run, "load_after": load_after, "played": live["played"],
         "requests_by_node": live["summary"].get("requests_by_node"), "live_log": live["logs"],
         "simulated_log": predicted_sim["iterations_log"], "live_rows": live["rows"]}, indent=2, default=str))
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
