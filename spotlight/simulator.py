"""The trace-replay simulator: how long and how much a GRPO run takes on a spot fleet.

A discrete-event engine on an injected `ManualClock`. What is *real* — the same objects the live
runtime runs: the pull queue (`schedulers.queue.PullQueue`: leases, give-back on a notice,
re-queue from the last committed step on a death, exactly-once completion, its
`steps_recomputed` counter), the notice (`PreemptionNotice`), the trace mapping
(`spotlight.traces.replay_schedule`), the regroup policy (`elastic_sp.regroup_policy.regroup` /
`plan_degrees`, with its Ulysses step-time model), the exploration planner
(`planners.allocation.make_planner` over a `SeedPool`, `planners.selection`), and the cost meter
(`cloud.cost.CostMeter` priced from `cloud.prices`). What is *modelled*: who executes a request
(`spotlight.step_time.StepTimes`) and what the learning signal of a chosen group is
(`spotlight.progress_model`).

Granularity (so that 4,096 GPUs x 1,000 iterations stay cheap): a request is `samples_per_request`
samples of one prompt (a whole group, G, by default; split when the fleet has more SP groups than
groups to serve), a worker is one SP group, and events happen only at request boundaries, trace
actions and phase ends. Denoising steps are accounted arithmetically: at a death the worker's
reached step is reported by heartbeat and its last commit (every `commit_every` steps) by
`checkpoint`, exactly as the live worker would have, and the queue counts what is recomputed.

One iteration (elastic policies): [explore on the critical path] -> rollout (pull queue, every
worker) -> train (on the on-demand GPUs; meanwhile, with exploration on idle spot, spot workers
explore the next iteration's seeds, cancelled when the weights are published) -> weight sync.
Spot nodes come and go by the trace; a trace node stands for a block of `spot_gpus / max_live`
GPUs; a removed node gets its notice `notice_s` before (its workers give back at the next step
boundary) and a joining node serves after `join_s`; survivors regroup in place (`regroup_s`).
After the trace ends the fleet stays as it was at its end.

Determinism: no wall clock; every draw comes from generators seeded by (seed, iteration, prompt);
ties in the event heap break by insertion order. Same config and trace -> same result.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

from cloud.cost import BudgetPolicy, CostMeter, Fleet, Forecast
from elastic_sp.regroup_policy import plan_degrees, regroup
from planners.allocation import make_planner
from planners.seed_pool import SeedPool
from schedulers.clock import ManualClock
from schedulers.preemption import Cause, PreemptionNotice
from schedulers.queue import PullQueue
from schedulers.request import Kind, Request
from spotlight.config import ConfigError
from spotlight.input_file import short
from spotlight.progress_model import ProgressModel, SeedRewards
from spotlight.step_time import StepTimes, image_tokens
from spotlight.traces import Trace, replay_schedule


@dataclass(frozen=True)
class Policy:
    name: str
    spot: bool
    """Rolls out on the spot fleet too (else only on the on-demand GPUs)."""
    elastic: bool = True
    """Pull queue with give-back and in-place regroup; False: any preemption restarts the whole job
    from the iteration's checkpoint after a cold start (managed-jobs style), on the capacity live then."""
    explore: str = "none"
    """none | critical_path (on the on-demand GPUs before each rollout) | idle_spot (during training)."""
    oracle: bool = False
    """Knows the trace: work is spread over every live GPU as a fluid, nothing lost, no join cost."""


POLICIES = {
    "ondemand": Policy("ondemand", spot=False),
    "spot_restart": Policy("spot_restart", spot=True, elastic=False),
    "spotlight_noexplore": Policy("spotlight_noexplore", spot=True),
    "sync_explore": Policy("sync_explore", spot=False, explore="critical_path"),
    "spotlight": Policy("spotlight", spot=True, explore="idle_spot"),
    "oracle": Policy("oracle", spot=True, explore="idle_spot", oracle=True),
}


_INT_LIMITS = {"gpus": (1, 16_384), "spot_gpus": (0, 65_536), "iterations": (1, 100_000), "resolution": (16, 8192),
               "prompts": (1, 16_384), "group_size": (2, 4096), "candidates_per_prompt": (1, 65_536),
               "sync_explore_per_prompt": (0, 65_536), "plan_prompts": (1, 4096), "commit_every": (1, 1000),
               "seed": (0, 2**32 - 1)}
"""[low, high] of SimConfig's integer fields (None allowed where the field says so). The maxima bound
what one run allocates — a worker and its members per GPU, a request per group — well above the
4,096-GPU x 1,000-iteration run README "Scale" times at 37.6 s."""
_FLOAT_LIMITS = {"notice_s": (0.0, 3600.0, False), "join_s": (0.0, 86400.0, False),
                 "iterations_scale": (0.0, 1000.0, True), "budget_usd": (0.0, 1e9, True)}
"""(low, high, whether low itself is excluded) of SimConfig's float fields; every one is finite."""


@dataclass(frozen=True)
class SimConfig:
    """What to simulate; every numeric field is in the range `_INT_LIMITS` / `_FLOAT_LIMITS` give
    (checked at construction, the error naming the field)."""

    gpus: int = 16
    """On-demand GPUs, the same for every policy: they train, and roll out during the rollout; 1..16,384."""
    spot_gpus: int | None = None
    """Spot GPUs at the trace's peak (a trace node is a block of spot_gpus // max_live GPUs), 0..65,536;
    None: 4 x gpus (spot costs ~0.3-0.45x on-demand, so the fleet a budget buys is mostly spot)."""
    iterations: int = 300
    """Most iterations simulated (the run stops at the target unless stop_at_target is off); 1..100,000."""
    resolution: int = 512
    """Image side in pixels, 16..8,192."""
    prompts: int = 64
    """Prompts per iteration (64 x 16 = 1024 images, Flow-GRPO's batch size class); 1..16,384."""
    group_size: int = 16
    """Samples per prompt, 2..4,096."""
    samples_per_request: int | None = None
    """Samples per request, 1..group_size; None: the group, halved while there are fewer requests than
    6x the SP groups at the fleet's peak (so the pull queue can balance)."""
    candidates_per_prompt: int = 64
    """Seeds explored per prompt at most, group_size..65,536."""
    sync_explore_per_prompt: int = 32
    """sync_explore's fixed exploration samples per prompt (2G), scored before each rollout; 0..65,536."""
    plan_prompts: int = 16
    """Prompts the real planner plans over, 1..4,096; each stands for prompts / plan_prompts alike prompts
    (the bandit's cost grows with prompts: 90 ms an iteration at 64 prompts)."""
    planner: str = "bandit"
    """bandit or uniform (`planners.allocation.make_planner`)."""
    notice_s: float = 120.0
    """Preemption warning in seconds, 0..3,600 (AWS: 120 s, GCP: 30 s, 0: none)."""
    commit_every: int = 1
    """Denoising steps between commits, 1..1,000."""
    join_s: float = 60.0
    """A new spot node serving: start its agent and members, weights from a peer node (41 GB at
    ~50 GB/s) — not from object storage. 0..86,400 s."""
    seed: int = 0
    """0..2**32 - 1."""
    stop_at_target: bool = True
    iterations_scale: float = 10.0
    """Stretch the progress model's iteration axis, in (0, 1,000]: the tiny DiT's random-seed
    baseline reaches the target in 17.7 iterations; a Qwen-Image run needs hundreds (Flow-GRPO trains
    for hundreds to thousands of steps), so by default 10x: 177 (README)."""
    step_times: StepTimes = field(default_factory=StepTimes)
    price_gpu: str | None = None
    """GPU row of the price table (None: step_times.gpu; the tiny-cpu profile, which no table prices,
    is priced as an H100). A GPU the table does not price is refused by `gpu_prices`."""
    prices: str | None = None
    """Price table CSV (None: the shipped cloud/prices.csv)."""
    budget_usd: float | None = None
    """Stop before this would be exceeded, decided before every iteration by the live trainer's
    budget policy (`cloud.cost.BudgetPolicy` over a `Forecast` of measured iteration times) on the
    simulated clock; the oracle, a bound, ignores it. In (0, 1e9] dollars."""

    def __post_init__(self) -> None:
        for name, (low, high) in _INT_LIMITS.items():
            v = getattr(self, name)
            if v is None and name == "spot_gpus":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
                raise ConfigError(f"{name}: expected an integer in [{low:,}, {high:,}], got {short(v)}")
        for name, (low, high, open_low) in _FLOAT_LIMITS.items():
            v = getattr(self, name)
            if v is None and name == "budget_usd":
                continue
            number = not isinstance(v, bool) and isinstance(v, (int, float))
            if not (number and low <= v <= high and not (open_low and v == low)):  # (nan fails low <= v)
                raise ConfigError(f"{name}: expected a number {'>' if open_low else '>='} {low:g} and at most "
                                  f"{high:,.0f}, got {short(v)}")
        if self.samples_per_request is not None and not (
                isinstance(self.samples_per_request, int) and 1 <= self.samples_per_request <= self.group_size):
            raise ConfigError(f"samples_per_request: expected 1..group_size, got {short(self.samples_per_request)}")
        if self.candidates_per_prompt < self.group_size:
            raise ConfigError(f"candidates_per_prompt: expected >= group_size ({self.group_size})")
        if self.planner not in ("bandit", "uniform"):
            raise ConfigError(f"planner: expected bandit or uniform, got {short(self.planner)}")

    @property
    def peak_spot_gpus(self) -> int:
        return 4 * self.gpus if self.spot_gpus is None else self.spot_gpus


@dataclass
class _Worker:
    """One SP group pulling requests."""

    name: str
    members: list[str]
    spot: bool
    step_s_per_sample: float
    ready_at: float
    lease: Request | None = None
    start: float = 0.0
    """When it began computing the leased request (from `lease.step`)."""
    step_s: float = 0.0
    gen: int = 0
    retiring: bool = False


_TRACE, _DONE, _GIVEBACK, _READY, _WAKE = range(5)


class Simulation:
    """One policy on one trace. `run()` returns the result dict (README, "Simulating a run")."""

    def __init__(self, cfg: SimConfig, policy: Policy, trace: Trace, progress: ProgressModel, prices: tuple[float, float]):
        self.cfg, self.policy, self.trace, self.progress = cfg, policy, trace, progress
        st = cfg.step_times
        self.st = st
        self.seq = image_tokens(cfg.resolution)
        self.model = st.step_model(cfg.resolution)
        self.clock = ManualClock()
        self.queue = PullQueue(self.clock, lease_s=1e15)  # deaths are reported at once (Ray sees them), never by expiry
        self._stats: dict[str, int] = {}
        """Counters of the queues of earlier iterations (one queue per iteration, see `_new_queue`)."""
        self.rewards = SeedRewards(progress, cfg.group_size, cfg.seed)
        self.plan_prompts = max(d for d in range(1, min(cfg.plan_prompts, cfg.prompts) + 1) if cfg.prompts % d == 0)
        self.copies = cfg.prompts // self.plan_prompts
        # the live defaults (config.exploration.round_samples, chunk G/2: spotlight/exploration.py)
        self.planner = make_planner(cfg.planner, **({"round_samples": 64, "chunk": max(1, cfg.group_size // 2),
                                                     "seed": cfg.seed} if cfg.planner == "bandit" else {}))
        self.block = max(1, cfg.peak_spot_gpus // max(trace.max_live, 1)) if policy.spot else 0
        self.heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self.workers: dict[str, _Worker] = {}
        self.idle: dict[bool, dict[str, None]] = {False: {}, True: {}}
        """Idle ready workers, on-demand (False) and spot (True), in the order they became idle."""
        self._wid = 0
        self.member_worker: dict[str, str] = {}
        """Member -> the worker (SP group) it is in."""
        self.spot_alive: dict[str, str] = {}
        """Spot member -> node, for members ready to serve."""
        self.noticed: set[str] = set()
        self.node_members: dict[str, list[str]] = {}
        self.live_nodes: set[str] = set()
        self.meter = CostMeter(self.clock, prices[0], prices[1], Fleet(cfg.gpus, 0))
        self.phase_kinds: tuple[Kind, ...] = ()
        self.phase_spot_only = False
        self.version = 0
        self.completed: dict[str, int] = {}
        self.chunks: dict[tuple[int, int], list] = {}
        self.counts = {"preemptions": 0, "steps_recomputed_restart": 0, "restarts": 0, "regroups": 0,
                       "explored_samples": 0}
        self.busy_gpu_s = 0.0
        self.timeline: list[tuple[float, int]] = []
        self.down_until: float | None = None
        self._restart_pending = False
        self.samples_per_request = self._request_size()
        self.requests_per_iteration = cfg.prompts * math.ceil(cfg.group_size / self.samples_per_request)

    # -- sizing --------------------------------------------------------------------------------------

    def _request_size(self) -> int:
        if self.cfg.samples_per_request is not None:
            return self.cfg.samples_per_request
        peak = self.cfg.gpus + (self.block * self.trace.max_live if self.policy.spot else 0)
        groups = len(plan_degrees(peak, self.seq, self.st.heads, self.model, pending=self.cfg.prompts))
        size = self.cfg.group_size
        # >= 6 requests per SP group: the last round's tail is then <= 1/6 of the rollout
        while size > 1 and self.cfg.prompts * math.ceil(self.cfg.group_size / size) < 6 * groups:
            size = math.ceil(size / 2)
        return size

    # -- events --------------------------------------------------------------------------------------

    def _push(self, t: float, code: int, data: Any) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, self._seq, code, data))

    def _advance_to(self, t: float, until=None) -> None:
        """Handle events up to time `t` (or until `until()` holds), then move the clock to `t`."""
        while self.heap and self.heap[0][0] <= t:
            if until is not None and until():
                return
            ev_t, _, code, data = heapq.heappop(self.heap)
            self.clock.advance(max(0.0, ev_t - self.clock.now()))
            self._handle(code, data)
        if until is not None and until():
            return
        self.clock.advance(max(0.0, t - self.clock.now()))

    def _run_until(self, until) -> None:
        while not until():
            if not self.heap:
                raise RuntimeError(f"{self.policy.name}: nothing left to happen but the phase is not done")
            self._advance_to(self.heap[0][0], until)

    def _handle(self, code: int, data: Any) -> None:
        if code == _TRACE:
            self._trace_action(*data)
        elif code == _DONE:
            self._done(*data)
        elif code == _GIVEBACK:
            self._give_back(*data)
        elif code == _READY:
            self._ready(data)
        # _WAKE only moves time
        self._dispatch()

    # -- fleet ---------------------------------------------------------------------------------------

    def _spot_gpus(self) -> int:
        return len(self.live_nodes) * self.block

    def _fleet_changed(self) -> None:
        self.meter.set_fleet(Fleet(self.cfg.gpus, self._spot_gpus()))
        self.timeline.append((self.clock.now(), self.cfg.gpus + self._spot_gpus()))

    def _new_worker(self, members: list[str], spot: bool, ready_at: float) -> _Worker:
        self._wid += 1
        w = _Worker(f"w{self._wid}", list(members), spot, self.st.denoise_s(self.cfg.resolution, len(members)), ready_at)
        self.workers[w.name] = w
        for m in w.members:
            self.member_worker[m] = w.name
        if ready_at > self.clock.now():
            self._push(ready_at, _READY, ("worker", w.name))
        else:
            self.idle[spot][w.name] = None
        return w

    def _start_fleet(self) -> None:
        od = [f"od{i}" for i in range(self.cfg.gpus)]
        for d in plan_degrees(len(od), self.seq, self.st.heads, self.model, pending=self.requests_per_iteration):
            self._new_worker(od[:d], False, 0.0)
            od = od[d:]
        if self.policy.spot:
            for i, a in enumerate(replay_schedule(self.trace, max(len(self.trace.nodes), 1), 1.0, self.cfg.notice_s)):
                self._push(a.at_s, _TRACE, (a.action, f"n{a.slot}"))
        self._fleet_changed()

    def _trace_action(self, action: str, node: str) -> None:
        if action == "add":
            members = [f"{node}#{j}" for j in range(self.block)]
            self.node_members[node] = members
            self.live_nodes.add(node)
            self._fleet_changed()
            at_start = self.clock.now() == 0.0
            if self.policy.elastic and not self.policy.oracle:
                self._push(self.clock.now() + (0.0 if at_start else self.cfg.join_s), _READY, ("node", node))
            elif at_start:
                self._ready(("node", node))
            return
        members = self.node_members.get(node, [])
        if action == "notice":
            if self.policy.elastic and not self.policy.oracle:
                self._notice(node, members)
            return
        # kill
        self.counts["preemptions"] += 1
        self.live_nodes.discard(node)
        self._fleet_changed()
        hit = [self.workers[x] for x in sorted({self.member_worker[m] for m in members if m in self.member_worker},
                                                key=lambda x: int(x[1:]))]
        in_cluster = any(m in self.spot_alive for m in members)
        for m in members:
            self.spot_alive.pop(m, None)
            self.noticed.discard(m)
        if not self.policy.elastic:
            if in_cluster:  # a node of the job's cluster is gone: the managed job restarts
                self._restart()
            return
        affected = {node}
        for w in hit:
            affected |= self._nodes_of(w)
            self._lost(w)
        self._regroup(affected)

    def _ready(self, data: tuple[str, str]) -> None:
        kind, name = data
        if kind == "worker":
            if name in self.workers:
                self.idle[self.workers[name].spot][name] = None
            return
        if kind == "restart":
            self._after_restart()
            return
        if name in self.live_nodes:
            for j, m in enumerate(self.node_members[name]):
                self.spot_alive[m] = f"{name}/{j // self.st.gpus_per_node}"
            if self.policy.elastic:
                self._regroup({name})
            elif self.clock.now() == 0.0:
                self._static_spot_groups()

    def _regroup(self, nodes: set[str]) -> None:
        """Re-plan the SP groups of the spot members on trace nodes `nodes` (where membership just
        changed) with the real regroup policy. Only those nodes' groups and free members are
        passed: the policy's placement is quadratic in the groups it sees, and a change on one
        node leaves groups elsewhere alone anyway (it never touches a busy intact group, and
        re-planning idle groups far away would only pay their regroup again)."""
        names = {self.member_worker[m] for n in nodes for m in self.node_members.get(n, ()) if m in self.member_worker}
        spot = [self.workers[x] for x in sorted(names, key=lambda x: int(x[1:])) if not self.workers[x].retiring]
        members = [m for w in spot for m in w.members]
        members += [m for n in sorted(nodes) for m in self.node_members.get(n, ())
                    if m in self.spot_alive and m not in self.member_worker and m not in self.noticed]
        alive = {m: self.spot_alive[m] for m in members if m in self.spot_alive and m not in self.noticed}
        busy = {i for i, w in enumerate(spot) if w.lease is not None}
        # The work the groups will serve: their share of what is queued, and never less than their
        # share of one iteration's rollout (a regroup during the train phase plans for the rollout
        # that follows; with pending = 1 the policy would rightly pick the widest group for a lone
        # request).
        share = len(alive) / max(1, self.cfg.gpus + len(self.live_nodes) * self.block)
        pending = max(1, round(max(self._queued, self.requests_per_iteration) * share))
        plan = regroup([w.members for w in spot], busy, alive, self.seq, self.st.heads, self.model, pending)
        keep = {tuple(g) for g in plan.keep}
        for w in spot:
            if tuple(w.members) not in keep:
                assert w.lease is None, "the regroup policy never breaks a busy intact group"
                self._drop(w)
        if plan.form:
            self.counts["regroups"] += 1
        setup = self.st.regroup_s if self.clock.now() > 0 else 0.0  # the fleet at t = 0 is up and grouped
        for g in plan.form:
            self._new_worker(g, True, self.clock.now() + setup)

    def _drop(self, w: _Worker) -> None:
        self.workers.pop(w.name, None)
        self.idle[w.spot].pop(w.name, None)
        for m in w.members:
            if self.member_worker.get(m) == w.name:
                del self.member_worker[m]

    @staticmethod
    def _nodes_of(w: _Worker) -> set[str]:
        return {m.split("#", 1)[0] for m in w.members}

    def _static_spot_groups(self) -> None:
        """The restart policy's cluster: SP groups planned once over the spot GPUs live now."""
        for w in [w for w in self.workers.values() if w.spot]:
            self._drop(w)
        plan = regroup([], set(), self.spot_alive, self.seq, self.st.heads, self.model, self.requests_per_iteration)
        for g in plan.form:
            self._new_worker(g, True, self.clock.now())

    def queue_queued(self) -> int:
        return self._queued

    # -- requests ------------------------------------------------------------------------------------

    _queued = 0

    def _put(self, requests: list[Request]) -> None:
        self.queue.put(requests)
        self._queued += len(requests)

    def _dispatch(self) -> None:
        if self._queued <= 0 or self.down_until is not None:
            return
        for spot in ((True,) if self.phase_spot_only else (False, True)):
            idle = self.idle[spot]
            while idle and self._queued > 0:
                name = next(iter(idle))
                w = self.workers[name]
                leases = self.queue.pull(name, 1, self.phase_kinds, self.version)
                if not leases:
                    return
                self._queued -= 1
                del idle[name]
                r = leases[0].request
                w.lease, w.start, w.gen = r, self.clock.now(), w.gen + 1
                w.step_s = len(r.seeds) * w.step_s_per_sample
                end = w.start + (self.st.denoise_steps - r.step) * w.step_s + len(r.seeds) * self.st.reward_s_per_sample
                self._push(end, _DONE, (name, w.gen))

    def _reached(self, w: _Worker) -> int:
        done = int((self.clock.now() - w.start) / w.step_s + 1e-9) if w.step_s > 0 else 0
        return min(self.st.denoise_steps, w.lease.step + done)

    def _done(self, name: str, gen: int) -> None:
        w = self.workers.get(name)
        if w is None or w.gen != gen or w.lease is None:
            return
        r = w.lease
        if self.queue.complete(name, r.id, None):
            self.busy_gpu_s += len(w.members) * len(r.seeds) * (self.st.denoise_steps * w.step_s_per_sample
                                                               + self.st.reward_s_per_sample)
            if r.kind is Kind.EXPLORATION:
                self._explored(r)
            else:
                self.completed[r.id] = r.step
        w.lease = None
        if w.retiring:
            self._retire(w)
        else:
            self.idle[w.spot][name] = None

    def _lost(self, w: _Worker) -> None:
        """`w` died without finishing: report its progress and last commit as the live worker
        would have, then let the queue re-queue it."""
        if w.lease is not None:
            reached = self._reached(w)
            committed = w.lease.step + (reached - w.lease.step) // self.cfg.commit_every * self.cfg.commit_every
            self.queue.heartbeat(w.name, {w.lease.id: reached})
            if committed > w.lease.step:
                self.queue.checkpoint(w.name, w.lease.id, None, committed)
            if self.queue.worker_lost(w.name):
                self._queued += 1
        self._drop(w)

    def _notice(self, node: str, members: list[str]) -> None:
        notice = PreemptionNotice(Cause.TRACE, self.clock.now() + self.cfg.notice_s, node=node)
        self.noticed.update(members)
        hit = [self.workers[x] for x in sorted({self.member_worker[m] for m in members if m in self.member_worker},
                                                key=lambda x: int(x[1:]))]
        affected = {node}.union(*(self._nodes_of(w) for w in hit))
        for w in hit:  # all of them first: a regroup must not see a half-noticed busy group as intact
            self.queue.notify(w.name, notice)
            w.retiring = True
        for w in hit:
            if w.lease is None:
                self._retire(w, regroup=False)
                continue
            boundary = w.start + (self._reached(w) - w.lease.step + 1) * w.step_s
            if self._reached(w) + 1 < self.st.denoise_steps:
                self._push(boundary, _GIVEBACK, (w.name, w.gen))
        self._regroup(affected)

    def _give_back(self, name: str, gen: int) -> None:
        w = self.workers.get(name)
        if w is None or w.gen != gen or w.lease is None:
            return
        reached = self._reached(w)
        self.queue.heartbeat(name, {w.lease.id: reached})
        if self.queue.give_back(name, w.lease.id, None, reached):
            self._queued += 1
        w.lease = None
        self._retire(w)

    def _retire(self, w: _Worker, regroup: bool = True) -> None:
        self._drop(w)
        if regroup:
            self._regroup(self._nodes_of(w))

    # -- restart-from-checkpoint (spot_restart) -------------------------------------------------------

    def _restart(self) -> None:
        """A preemption hit the job: everything this iteration computed is lost; the job comes back
        after a cold start and a restore, on the capacity live then."""
        if self.down_until is not None:
            return
        self.counts["restarts"] += 1
        for w in list(self.workers.values()):
            if w.lease is not None:
                self.queue.heartbeat(w.name, {w.lease.id: self._reached(w)})
                self.queue.worker_lost(w.name)
            w.lease = None
        lost = sum(self.st.denoise_steps - s for s in self.completed.values())
        self.counts["steps_recomputed_restart"] += lost
        self.completed.clear()
        self.queue.cancel(Kind.ROLLOUT)
        self._queued = 0
        self.workers.clear()
        self.member_worker.clear()
        self.idle = {False: {}, True: {}}
        self.down_until = self.clock.now() + self.st.cold_start_s + self.st.restore_s
        self._restart_pending = True
        self._push(self.down_until, _READY, ("restart", ""))

    def _after_restart(self) -> None:
        self.down_until = None
        for node in list(self.live_nodes):
            for j, m in enumerate(self.node_members[node]):
                self.spot_alive[m] = f"{node}/{j // self.st.gpus_per_node}"
        od = [f"od{i}" for i in range(self.cfg.gpus)]
        for d in plan_degrees(len(od), self.seq, self.st.heads, self.model, pending=self.requests_per_iteration):
            self._new_worker(od[:d], False, self.clock.now())
            od = od[d:]
        self._static_spot_groups()

    # -- phases --------------------------------------------------------------------------------------

    def _new_queue(self) -> None:
        """A fresh queue for the next iteration, its predecessor's counters kept. Between iterations
        nothing is queued or leased, so no request crosses over. Why: `PullQueue.cancel` scans every
        request the queue has ever held, which over 1,000 iterations of thousands of requests is
        quadratic (a live run would want an index of open requests by kind there too)."""
        for k, v in self.queue.stats().items():
            self._stats[k] = self._stats.get(k, 0) + v
        self.queue = PullQueue(self.clock, lease_s=1e15)

    def _rollout(self, it: int, attempt: int) -> bool:
        """Roll out iteration `it`'s groups; False if a restart interrupted it."""
        cfg, size = self.cfg, self.samples_per_request
        self.version, self.phase_kinds, self.phase_spot_only = it, (Kind.ROLLOUT,), False
        requests = [Request(f"it{it}.{attempt}/p{p}/s{s}", Kind.ROLLOUT, p, "", tuple(range(s, min(s + size, cfg.group_size))),
                            weight_version=it) for p in range(cfg.prompts) for s in range(0, cfg.group_size, size)]
        self.completed.clear()
        self._put(requests)
        self._dispatch()
        restarts = self.counts["restarts"]
        self._run_until(lambda: len(self.completed) == len(requests) or self.counts["restarts"] > restarts)
        return self.counts["restarts"] == restarts

    def _wait(self, seconds: float) -> bool:
        """Let `seconds` pass (training, weight sync); False if a restart interrupted it."""
        restarts = self.counts["restarts"]
        self._push(self.clock.now() + seconds, _WAKE, None)
        self._advance_to(self.clock.now() + seconds, lambda: self.counts["restarts"] > restarts)
        return self.counts["restarts"] == restarts

    def _explore(self, it: int, on_spot: bool, budget: int, until_s: float | None) -> dict[int, int]:
        """Explore iteration `it`'s seeds with weights `it - 1` through the pull queue, in planner
        rounds, until the budget is spent (or, time-bounded, until `until_s`, then cancel).
        Returns explored seeds per planned prompt."""
        pool = self._start_planner(budget)
        self.version, self.phase_kinds, self.phase_spot_only = it - 1, (Kind.EXPLORATION,), on_spot
        self.chunks = {}
        rnd = 0
        while until_s is None or self.clock.now() < until_s:
            alloc = self.planner.next_round(pool)
            if not alloc:
                break
            requests = []
            for p, n in alloc.items():
                seeds = pool.unexplored(p)[:n]
                for lo in range(0, len(seeds), self.samples_per_request):
                    chunk = tuple(seeds[lo:lo + self.samples_per_request])
                    self.chunks[(p, chunk[0])] = [self.copies, chunk, pool]
                    requests += [Request(f"ex{it}/r{rnd}/p{p}/s{chunk[0]}/c{c}", Kind.EXPLORATION, p, "", chunk,
                                         weight_version=it - 1) for c in range(self.copies)]
            rnd += 1
            self._put(requests)
            self._dispatch()
            ids = [r.id for r in requests]
            left = [len(ids)]
            self._round_left = left
            done = lambda: left[0] == 0 or (until_s is not None and self.clock.now() >= until_s)
            if until_s is None:
                self._run_until(done)
            else:
                self._advance_to(until_s, done)
        if until_s is not None:
            self._queued -= self.queue.cancel(Kind.EXPLORATION) - self._leased_exploration()
            self._queued = max(self._queued, 0)
            retired = []
            for w in self.workers.values():
                if w.lease is not None and w.lease.kind is Kind.EXPLORATION:
                    w.gen += 1  # its pending completion or give-back is void: the request is cancelled
                    w.lease = None
                    if w.retiring:
                        retired.append(w)
                    else:
                        self.idle[w.spot][w.name] = None
            for w in retired:
                self._retire(w)
        return {p: pool.explored_count(p) for p in pool.prompt_ids}

    def _start_planner(self, budget: int) -> SeedPool:
        """A fresh seed pool of the planned prompts' candidates, the planner started on it with
        `budget` samples (at most every candidate)."""
        cfg = self.cfg
        pool = SeedPool({p: list(range(cfg.candidates_per_prompt)) for p in range(self.plan_prompts)})
        self.planner.start(pool, cfg.group_size, max(0, min(budget, cfg.candidates_per_prompt * self.plan_prompts)))
        return pool

    def _leased_exploration(self) -> int:
        return sum(1 for w in self.workers.values() if w.lease is not None and w.lease.kind is Kind.EXPLORATION)

    def _explored(self, r: Request) -> None:
        self._round_left[0] -= 1
        entry = self.chunks.get((r.prompt_id, r.seeds[0]))
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:  # every prompt this planned prompt stands for has scored the chunk
            _, chunk, pool = entry
            _, _, stale = self.rewards.draw(self.version + 1, r.prompt_id, self.cfg.candidates_per_prompt)
            for s in chunk:
                pool.record(r.prompt_id, s, float(stale[s]), self.version)
            self.counts["explored_samples"] += len(chunk) * self.copies

    def _signal(self, it: int, explored: dict[int, int]) -> float:
        k = self.cfg.candidates_per_prompt
        return sum(self.rewards.group_std(it, p, k, explored.get(p, 0)) for p in range(self.plan_prompts)) / self.plan_prompts

    # -- the run -------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        if self.policy.oracle:
            return self._run_oracle()
        cfg, st = self.cfg, self.st
        self._start_fleet()
        self._advance_to(0.0)
        gain, progress, reached_at, cost_at, explored = 0.0, [(0.0, self.progress.score(0.0))], None, None, {}
        train_s = st.train_s(cfg.resolution, cfg.prompts * cfg.group_size, cfg.gpus)
        per_sample = st.sample_s(cfg.resolution, 1)
        # The live trainer's budget rule; its prior, before an iteration is measured, is the part of an
        # iteration no fleet shortens (train + weight sync), x Forecast's prior factor.
        forecast = Forecast(train_s + st.weight_sync_s, 0.0)
        budget = BudgetPolicy(cfg.budget_usd, forecast) if cfg.budget_usd is not None else None
        # Priced at the fleet's peak (spot nodes may join mid-iteration), and a restart-from-checkpoint
        # policy also keeps one cold start + restore in reserve: a preemption between two checks
        # costs that much before the next check can stop the run.
        peak_usd_h = self.meter.rate_usd_h_of(Fleet(cfg.gpus, cfg.peak_spot_gpus if self.policy.spot else 0))
        reserve_s = 0.0 if self.policy.elastic else st.cold_start_s + st.restore_s
        stop_reason = "iterations"
        it = 0
        while it < cfg.iterations:
            if self.down_until is not None:
                self._run_until(lambda: self.down_until is None)
            if budget is not None and budget.should_stop(
                    self.meter.spent_usd(), budget.forecast_usd(peak_usd_h) + peak_usd_h * reserve_s / 3600.0):
                stop_reason = "budget"
                break
            started = self.clock.now()
            self._new_queue()
            if self.policy.explore == "critical_path":
                explored = self._explore(it, False, cfg.sync_explore_per_prompt * self.plan_prompts, None)
            attempt = self.counts["restarts"]
            if not self._rollout(it, attempt):
                continue
            self.phase_kinds = ()
            if self.policy.explore == "idle_spot" and it + 1 < cfg.iterations:
                estimate = int(self._spot_gpus() * train_s / per_sample / self.copies)
                nxt = self._explore(it + 1, True, estimate, self.clock.now() + train_s)
                self._advance_to(self.clock.now())
            elif not self._wait(train_s):
                continue
            if not self._wait(st.weight_sync_s):
                continue
            self.busy_gpu_s += cfg.gpus * train_s
            gain += self.progress.gain(self._signal(it, explored))
            explored = nxt if self.policy.explore == "idle_spot" and it + 1 < cfg.iterations else {}
            progress.append((self.clock.now(), self.progress.score(gain)))
            forecast.observe(self.clock.now() - started)
            it += 1
            if reached_at is None and self.progress.reached(gain):
                reached_at, cost_at = self.clock.now(), self.meter.spent_usd()
                if cfg.stop_at_target:
                    stop_reason = "target"
                    break
        self._fleet_changed()
        return {**self._result(it, reached_at, cost_at, progress, self.meter.spent_usd()), "stop_reason": stop_reason}

    def _result(self, iterations: int, reached_at, cost_at, progress, total_usd: float) -> dict[str, Any]:
        end = self.clock.now()
        paid = self._paid_gpu_s(end)
        stats = dict(self._stats)
        for k, v in self.queue.stats().items():
            stats[k] = stats.get(k, 0) + v
        return {
            "time_to_target_h": None if reached_at is None else reached_at / 3600.0,
            "cost_usd": None if cost_at is None else cost_at,
            "gpu_utilization": min(1.0, self.busy_gpu_s / paid) if paid > 0 else 0.0,
            "preemptions": self.counts["preemptions"],
            "steps_recomputed": stats["steps_recomputed"] + self.counts["steps_recomputed_restart"],
            "iterations": iterations,
            "iterations_to_target": next((i for i, (t, s) in enumerate(progress) if s >= self.progress.target - 1e-12), None),
            "wall_h": end / 3600.0,
            "total_cost_usd": total_usd,
            "restarts": self.counts["restarts"],
            "requests_given_back": stats["requests_given_back"],
            "requests_requeued": stats["requests_requeued"],
            "requests_duplicated": stats["requests_duplicated"],
            "regroups": self.counts["regroups"],
            "explored_samples": self.counts["explored_samples"],
            "samples_per_request": self.samples_per_request,
            "final_score": progress[-1][1],
            "timeline": [(t / 3600.0, n) for t, n in self.timeline],
            "progress": [(t / 3600.0, s) for t, s in progress],
        }

    def _paid_gpu_s(self, end: float) -> float:
        total, points = 0.0, self.timeline + [(end, 0)]
        for (t0, n), (t1, _) in zip(points, points[1:]):
            total += n * max(0.0, min(t1, end) - t0)
        return total

    # -- the clairvoyant bound -------------------------------------------------------------------------

    def _run_oracle(self) -> dict[str, Any]:
        """Knows the trace: rollout and exploration are a fluid spread over every live GPU at the most
        efficient degree, nothing is lost to a preemption and no node waits to join."""
        cfg, st = self.cfg, self.st
        steps = [(t, n * self.block) for t, n in self.trace.live_over_time()]
        per_gpu_s = min(d * st.sample_s(cfg.resolution, d) for d in range(1, st.heads + 1) if st.heads % d == 0)
        train_s = st.train_s(cfg.resolution, cfg.prompts * cfg.group_size, cfg.gpus)
        spot_at = lambda t: next((n for tt, n in reversed(steps) if tt <= t), 0)
        # the timeline for cost and plots
        self.timeline = [(t, cfg.gpus + n) for t, n in steps] or [(0.0, cfg.gpus)]
        if self.timeline[0][0] > 0:
            self.timeline.insert(0, (0.0, cfg.gpus))

        def fluid(t: float, work: float, base: int) -> float:
            """When `work` GPU-seconds are done from `t` on `base` + the live spot GPUs."""
            i = max((k for k, (tt, _) in enumerate(steps) if tt <= t), default=-1)
            while True:
                rate = base + (steps[i][1] if i >= 0 else 0)
                nxt = steps[i + 1][0] if i + 1 < len(steps) else math.inf
                if rate > 0 and t + work / rate <= nxt:
                    return t + work / rate
                work -= rate * (nxt - t)
                t, i = nxt, i + 1

        def spot_gpu_s(t0: float, t1: float) -> float:
            total, t = 0.0, t0
            while t < t1:
                nxt = min([tt for tt, _ in steps if tt > t] + [t1])
                total += spot_at(t) * (nxt - t)
                t = nxt
            return total

        t, gain, it, explored = 0.0, 0.0, 0, {}
        progress, reached_at = [(0.0, self.progress.score(0.0))], None
        while it < cfg.iterations:
            t = fluid(t, cfg.prompts * cfg.group_size * per_gpu_s, cfg.gpus)
            self.busy_gpu_s += cfg.prompts * cfg.group_size * per_gpu_s + cfg.gpus * train_s
            budget = int(spot_gpu_s(t, t + train_s) / per_gpu_s / self.copies)
            nxt = self._explore_free(it + 1, budget) if it + 1 < cfg.iterations else {}
            self.busy_gpu_s += sum(nxt.values()) * self.copies * per_gpu_s
            t += train_s + st.weight_sync_s
            gain += self.progress.gain(self._signal(it, explored))
            explored, it = nxt, it + 1
            progress.append((t, self.progress.score(gain)))
            if reached_at is None and self.progress.reached(gain):
                reached_at = t
                if cfg.stop_at_target:
                    break
        self.counts["preemptions"] = sum(1 for e in self.trace.events if e.action == "remove" and e.t_s <= t)
        self.clock.advance(t)
        cost_at = None if reached_at is None else self._fluid_cost(reached_at)
        stop_reason = "target" if reached_at is not None and cfg.stop_at_target else "iterations"
        return {**self._result(it, reached_at, cost_at, progress, self._fluid_cost(t)), "stop_reason": stop_reason}

    def _fluid_cost(self, until: float) -> float:
        clock = ManualClock()
        meter = CostMeter(clock, self.meter.ondemand_usd_h, self.meter.spot_usd_h, Fleet(self.cfg.gpus, 0))
        for t, n in self.timeline:
            if t > until:
                break
            clock.advance(max(0.0, t - clock.now()))
            meter.set_fleet(Fleet(self.cfg.gpus, n - self.cfg.gpus))
        clock.advance(max(0.0, until - clock.now()))
        return meter.spent_usd()

    def _explore_free(self, it: int, budget: int) -> dict[int, int]:
        """The oracle's exploration: the planner's rounds with every sample scored at once."""
        cfg = self.cfg
        pool = self._start_planner(budget)
        while alloc := self.planner.next_round(pool):
            for p, n in alloc.items():
                _, _, stale = self.rewards.draw(it, p, cfg.candidates_per_prompt)
                for s in pool.unexplored(p)[:n]:
                    pool.record(p, s, float(stale[s]), it - 1)
        self.counts["explored_samples"] += pool.total_explored() * self.copies
        return {p: pool.explored_count(p) for p in pool.prompt_ids}


def gpu_prices(cfg: SimConfig) -> tuple[float, float, str]:
    """(on-demand, spot) dollars per GPU-hour from the price table, and the row used."""
    from cloud.prices import PriceTable

    table = PriceTable.load(cfg.prices)
    gpu = cfg.price_gpu or cfg.step_times.gpu
    if cfg.price_gpu is None and gpu == "tiny-cpu":  # the measured CPU profile: no table prices a CPU
        gpu = "H100"
    price = table.node_price(gpu, 1)  # an unknown GPU: a PriceError naming the GPUs the table prices
    return price.ondemand_usd_h, price.spot_usd_h, price.row.instance_type


def simulate(cfg: SimConfig, trace: Trace, policies: list[str] | None = None,
             progress: ProgressModel | None = None) -> dict[str, Any]:
    """Every policy in `policies` (default all) on `trace`: {"policies": {name: result}, ...}."""
    names = list(POLICIES) if policies is None else policies
    for n in names:
        if n not in POLICIES:
            raise ConfigError(f"--policy: unknown policy {n!r} (expected all or one of {', '.join(POLICIES)})")
    progress = progress or ProgressModel.calibrated(iterations_scale=cfg.iterations_scale)
    od, spot, row = gpu_prices(cfg)
    out = {name: Simulation(cfg, POLICIES[name], trace, progress, (od, spot)).run() for name in names}
    return {
        "policies": out,
        "trace": trace.source,
        "config": {"gpus": cfg.gpus, "spot_gpus_peak": cfg.peak_spot_gpus if trace.max_live else 0,
                   "iterations": cfg.iterations, "resolution": cfg.resolution, "prompts": cfg.prompts,
                   "group_size": cfg.group_size, "seed": cfg.seed, "gpu": cfg.step_times.gpu,
                   "price_per_gpu_h": {"ondemand": od, "spot": spot, "priced_from": row}},
        "progress_model": progress.to_dict(),
    }
