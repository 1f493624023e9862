"""The trace-replay simulator: how long and how much a GRPO run takes on a spot fleet.

The simulator is the live fleet engine (`schedulers.fleet.FleetEngine`) with a modelled executor
(`spotlight.modelled_executor`) on a `ManualClock`: who serves when, what a notice, a death or a
join does, the train phase's exploration and its cancel-on-publish are the code the live runtimes
run. Also live: the pull queue (leases, give-back, re-queue from the last commit, exactly-once,
its `steps_recomputed` counter), the trace mapping (`schedulers.traces.replay_schedule`), the
regroup policy (`elastic_sp.regroup_policy`), the exploration planner (`planners.allocation` over
a `SeedPool`), and the cost meter and budget policy (`cloud.cost`) priced from `cloud.prices`.
What is *modelled*: how long a request takes (`spotlight.step_time.StepTimes`), and what the
learning signal of a chosen group is (`spotlight.progress_model`).

Policies that differ only in configuration run here: `ondemand` (no spot nodes),
`spotlight_noexplore` (spot nodes), `sync_explore` (exploration on the critical path before each
rollout), `spotlight` (spot nodes, exploring on idle spot workers while the learner trains). Two
baselines behave differently and live in files of their own: `spot_restart` (any preemption
restarts the job from the iteration's checkpoint: `spotlight.sim_restart`) and the clairvoyant
`oracle` (`spotlight.sim_oracle`).

One iteration: [explore on the critical path] -> rollout (every worker) -> train (on the
on-demand GPUs; meanwhile, with exploration on idle spot, spot workers explore the next
iteration's seeds, cancelled when the weights are published) -> weight sync. Spot nodes come and go
by the trace (it runs through every phase here); a trace node stands for a block of
`spot_gpus / max_live` GPUs; a removed node gets its notice `notice_s` before and a joining node
serves after `join_s`. After the trace ends the fleet stays as it was at its end.

Determinism: no wall clock; every draw comes from generators seeded by (seed, iteration, prompt);
ties in the event heap break by insertion order. Same config and trace -> same result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from cloud.cost import BudgetPolicy, CostControl, CostMeter, Fleet, Forecast
from planners.allocation import make_planner
from planners.seed_pool import SeedPool
from schedulers.clock import ManualClock
from schedulers.fleet import FleetAction, FleetEngine, Node
from schedulers.queue import PullQueue
from schedulers.request import Kind, Request
from spotlight.config import ConfigError
from schedulers.input_file import short
from spotlight.modelled_executor import ModelledExecutor, request_size, requests_of
from spotlight.progress_model import ProgressModel, SeedRewards
from spotlight.step_time import StepTimes, image_tokens
from schedulers.traces import Trace, replay_schedule


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


class Until:
    """A modelled phase of known length (training, a weight sync) as the engine waits on it."""

    def __init__(self, clock: ManualClock, deadline: float, abort: Callable[[], bool] = lambda: False) -> None:
        self.clock, self.deadline, self.abort = clock, deadline, abort

    def done(self) -> bool:
        return self.clock.now() >= self.deadline or self.abort()


class SimExploration:
    """One phase's exploration rounds for the simulator (the engine's `Session`): the live planner
    over `plan_prompts` representative prompts, each standing for `copies` alike prompts, so every
    chunk of seeds it plans is computed `copies` times and recorded once all copies are scored."""

    def __init__(self, sim: "Simulation", iteration: int, version: int, critical_path: bool, budget: int | None) -> None:
        self.sim, self.iteration, self.version = sim, iteration, version
        self.critical_path = critical_path
        self.fixed_budget = budget
        """The budget of a sample-bounded session; None: time-bounded (sized from the measured rate)."""
        self.samples = self.cancelled = self.budget = 0
        self.pool: SeedPool | None = None
        self._round = 0
        self._chunks: dict[tuple[int, int], tuple[int, ...]] = {}

    @property
    def time_bounded(self) -> bool:
        return self.fixed_budget is None

    def begin(self, estimated_samples: int | None = None) -> None:
        everything = self.sim.cfg.candidates_per_prompt * self.sim.plan_prompts
        if self.fixed_budget is not None:
            self.budget = self.fixed_budget
        else:  # the live rule (`ExplorationSession.begin`): what the measured rate says, or everything
            self.budget = everything if estimated_samples is None else max(1, min(estimated_samples, everything))
        self.pool = self.sim.start_planner(self.budget)

    def next_requests(self) -> list[Request]:
        alloc = self.sim.planner.next_round(self.pool)
        requests, size = [], self.sim.samples_per_request
        for p, n in alloc.items():
            seeds = self.pool.unexplored(p)[:n]
            for lo in range(0, len(seeds), size):
                chunk = tuple(seeds[lo:lo + size])
                self._chunks[(p, chunk[0])] = chunk
                requests += [Request(f"ex{self.iteration}/r{self._round}/p{p}/s{chunk[0]}/c{c}", Kind.EXPLORATION, p,
                                     "", chunk, weight_version=self.version) for c in range(self.sim.copies)]
        self._round += 1
        return requests

    def record(self, requests: list[Request], rewards: Any) -> None:
        """Chunks all of whose copies were scored get their stale rewards (the progress model's)."""
        copies: dict[tuple[int, int], int] = {}
        for r in requests:
            key = (r.prompt_id, r.seeds[0])
            copies[key] = copies.get(key, 0) + 1
        for (p, first), n in copies.items():
            if n < self.sim.copies:
                continue
            chunk = self._chunks.pop((p, first))
            _, _, stale = self.sim.rewards.draw(self.version + 1, p, self.sim.cfg.candidates_per_prompt)
            for seed in chunk:
                self.pool.record(p, seed, float(stale[seed]), self.version)
            self.samples += len(chunk)
            self.sim.explored_samples += len(chunk) * self.sim.copies

    def explored(self) -> dict[int, int]:
        return {p: self.pool.explored_count(p) for p in self.pool.prompt_ids}


class Simulation:
    """One policy on one trace. `run()` returns the result dict (docs/simulator.md)."""

    def __init__(self, cfg: SimConfig, policy: Policy, trace: Trace, progress: ProgressModel, prices: tuple[float, float],
                 on_iteration: Callable[[int], None] | None = None):
        self.cfg, self.policy, self.trace, self.progress = cfg, policy, trace, progress
        self.on_iteration = on_iteration
        """Called with the iterations done after each one (a progress bar); None: nobody is told."""
        st = self.st = cfg.step_times
        self.seq = image_tokens(cfg.resolution)
        self.clock = ManualClock()
        self.queue = PullQueue(self.clock, lease_s=1e15)  # deaths are reported at once (Ray sees them), never by expiry
        self.rewards = SeedRewards(progress, cfg.group_size, cfg.seed)
        self.plan_prompts = max(d for d in range(1, min(cfg.plan_prompts, cfg.prompts) + 1) if cfg.prompts % d == 0)
        self.copies = cfg.prompts // self.plan_prompts
        # the live defaults (config.exploration.round_samples and optimism, chunk G/2: spotlight/exploration.py)
        self.planner = make_planner(cfg.planner, **({"round_samples": 64, "chunk": max(1, cfg.group_size // 2),
                                                     "seed": cfg.seed} if cfg.planner == "bandit" else {}))
        self.block = max(1, cfg.peak_spot_gpus // max(trace.max_live, 1)) if policy.spot else 0
        self.meter = CostMeter(self.clock, prices[0], prices[1], Fleet(cfg.gpus, 0))
        self.timeline: list[tuple[float, int]] = []
        self.explored_samples = 0
        self.busy_gpu_s = 0.0
        self._stats: dict[str, int] = {}
        """Counters of the queues of earlier iterations (`_new_queue`)."""
        peak = cfg.gpus + (self.block * trace.max_live if policy.spot else 0)
        self.samples_per_request = cfg.samples_per_request or request_size(
            peak, cfg.prompts, cfg.group_size, self.seq, st, cfg.resolution)
        self.requests_per_iteration = cfg.prompts * math.ceil(cfg.group_size / self.samples_per_request)
        self.executor = ModelledExecutor(self.clock, self.queue, st, cfg.resolution, self.seq, cfg.commit_every,
                                         cfg.join_s, self.requests_per_iteration, cfg.gpus, on_done=self._done)
        self.engine = FleetEngine(self.clock, self.queue, self.executor,
                                  [Node("ondemand0", spot=False, devices=cfg.gpus)], self._actions(),
                                  replay_phases=("rollout", "train", "idle"), spot_devices=self.block)
        self.engine.on_fleet = self._fleet_changed

    def _actions(self) -> list[FleetAction]:
        """Trace node k is fleet node `spotK` (one node per trace node: `replay_schedule` on as many slots)."""
        if not self.policy.spot:
            return []
        return [FleetAction(a.at_s, f"spot{a.slot}", a.action)
                for a in replay_schedule(self.trace, max(len(self.trace.nodes), 1), 1.0, self.cfg.notice_s)]

    def _done(self, group: Any, request: Request) -> None:
        """A request committed (the executor's hook): its devices were busy for its samples."""

    def _fleet_changed(self) -> None:
        spot = self.engine.spot_devices()
        self.meter.set_fleet(Fleet(self.cfg.gpus, spot))
        self.timeline.append((self.clock.now(), self.cfg.gpus + spot))

    def start_planner(self, budget: int) -> SeedPool:
        """A fresh seed pool of the planned prompts' candidates, the planner started on it with
        `budget` samples (at most every candidate)."""
        cfg = self.cfg
        pool = SeedPool({p: list(range(cfg.candidates_per_prompt)) for p in range(self.plan_prompts)})
        self.planner.start(pool, cfg.group_size, max(0, min(budget, cfg.candidates_per_prompt * self.plan_prompts)))
        return pool

    def _signal(self, it: int, explored: dict[int, int]) -> float:
        k = self.cfg.candidates_per_prompt
        return sum(self.rewards.group_std(it, p, k, explored.get(p, 0)) for p in range(self.plan_prompts)) / self.plan_prompts

    @staticmethod
    def _score(requests: list[Request]) -> None:
        return None  # the stale rewards come from the progress model, in `SimExploration.record`

    # -- the run -------------------------------------------------------------------------------------

    def _iteration(self, it: int, explored: dict[int, int], train_s: float) -> dict[int, int] | None:
        """One iteration on the engine; returns what was explored for the next one (None: the
        iteration was interrupted and must run again — only the restart baseline does that)."""
        cfg = self.cfg
        if self.policy.explore == "critical_path":
            session = SimExploration(self, it, it - 1, True, cfg.sync_explore_per_prompt * self.plan_prompts)
            self.engine.explore(session, self._score, it - 1)
            explored.clear()
            explored.update(session.explored())
        self.engine.rollout(requests_of(it, cfg.prompts, cfg.group_size, self.samples_per_request), it)
        nxt: dict[int, int] = {}
        if self.policy.explore == "idle_spot" and it + 1 < cfg.iterations:
            session = SimExploration(self, it + 1, it, False, None)
            self.engine.explore(session, self._score, it, update=Until(self.clock, self.clock.now() + train_s))
            nxt = session.explored()
        else:
            self.engine.wait(Until(self.clock, self.clock.now() + train_s))
        self.engine.wait(Until(self.clock, self.clock.now() + self.st.weight_sync_s))
        return nxt

    def run(self) -> dict[str, Any]:
        cfg, st = self.cfg, self.st
        self._fleet_changed()
        self.engine.start()
        gain, progress, reached_at, cost_at, explored = 0.0, [(0.0, self.progress.score(0.0))], None, None, {}
        train_s = st.train_s(cfg.resolution, cfg.prompts * cfg.group_size, cfg.gpus)
        cost = self._cost_control(train_s)
        stop_reason = "iterations"
        it = 0
        while it < cfg.iterations:
            self._before_iteration()
            decision = self.engine.before_iteration(cost, it, cfg.iterations)  # the live trainer's question
            if decision.stop is not None:
                stop_reason = decision.stop
                break
            self._new_queue()
            nxt = self._iteration(it, explored, train_s)
            if nxt is None:
                continue
            self.busy_gpu_s += cfg.gpus * train_s
            gain += self.progress.gain(self._signal(it, explored))
            explored = nxt
            progress.append((self.clock.now(), self.progress.score(gain)))
            cost.after_iteration()
            it += 1
            if self.on_iteration is not None:
                self.on_iteration(it)
            if reached_at is None and self.progress.reached(gain):
                reached_at, cost_at = self.clock.now(), self.meter.spent_usd()
                if cfg.stop_at_target:
                    stop_reason = "target"
                    break
        self._fleet_changed()
        return {**self._result(it, reached_at, cost_at, progress, self.meter.spent_usd()), "stop_reason": stop_reason}

    def _new_queue(self) -> None:
        """A fresh queue for the iteration, its predecessor's counters kept. Between iterations
        nothing is queued or leased and no worker holds a notice, so nothing crosses over. Why:
        a queue that has held a million requests makes every call slower (dictionaries far
        larger than the caches; measured: 4,096 GPUs x 1,000 iterations 50 s -> ? s)."""
        for k, v in self.queue.stats().items():
            self._stats[k] = self._stats.get(k, 0) + v
        self.queue = self.engine.queue = self.executor.queue = PullQueue(self.clock, lease_s=1e15)

    def _cost_control(self, train_s: float) -> CostControl:
        """The live trainer's cost control on the simulated meter, with `budget_usd` when set. Its
        prior, before an iteration is measured, is the part of an iteration no fleet shortens (train +
        weight sync); forecasts are priced at the fleet's peak (spot nodes may join mid-iteration),
        and a restart-from-checkpoint policy keeps one cold start + restore in reserve: a preemption
        between two checks costs that much before the next check can stop the run."""
        cfg, st = self.cfg, self.st
        reserve_s = 0.0 if self.policy.elastic else st.cold_start_s + st.restore_s
        forecast = Forecast(train_s + st.weight_sync_s, 0.0, reserve_s=reserve_s)
        budget = BudgetPolicy(cfg.budget_usd, forecast) if cfg.budget_usd is not None else None
        peak = Fleet(cfg.gpus, cfg.peak_spot_gpus if self.policy.spot else 0)
        return CostControl(self.clock, self.meter, peak, forecast, budget, peak_fleet=peak)

    def _before_iteration(self) -> None:
        """Hook: the restart baseline waits out a restart here."""

    def _steps_recomputed_restart(self) -> int:
        return 0

    def _preemptions(self) -> int:
        """Spot nodes removed while the run lasted."""
        return self.engine.counters["kills"]

    def _result(self, iterations: int, reached_at, cost_at, progress, total_usd: float) -> dict[str, Any]:
        end = self.clock.now()
        paid = self._paid_gpu_s(end)
        stats = dict(self._stats)
        for k, v in self.queue.stats().items():
            stats[k] = stats.get(k, 0) + v
        busy = self.busy_gpu_s + self.executor.busy_gpu_s
        return {
            "time_to_target_h": None if reached_at is None else reached_at / 3600.0,
            "cost_usd": None if cost_at is None else cost_at,
            "gpu_utilization": min(1.0, busy / paid) if paid > 0 else 0.0,
            "preemptions": self._preemptions(),
            "steps_recomputed": stats["steps_recomputed"] + self._steps_recomputed_restart(),
            "iterations": iterations,
            "iterations_to_target": next((i for i, (t, s) in enumerate(progress) if s >= self.progress.target - 1e-12), None),
            "wall_h": end / 3600.0,
            "total_cost_usd": total_usd,
            "restarts": getattr(self, "restarts", 0),
            "requests_given_back": stats["requests_given_back"],
            "requests_requeued": stats["requests_requeued"],
            "requests_duplicated": stats["requests_duplicated"],
            "regroups": self.executor.regroups,
            "explored_samples": self.explored_samples,
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


def make_simulation(cfg: SimConfig, policy: Policy, trace: Trace, progress: ProgressModel,
                    prices: tuple[float, float], on_iteration: Callable[[int], None] | None = None) -> Simulation:
    """The simulation of `policy`: the engine's, or one of the two baselines that behave differently."""
    if policy.oracle:
        from spotlight.sim_oracle import OracleSimulation

        return OracleSimulation(cfg, policy, trace, progress, prices, on_iteration)
    if not policy.elastic:
        from spotlight.sim_restart import RestartSimulation

        return RestartSimulation(cfg, policy, trace, progress, prices, on_iteration)
    return Simulation(cfg, policy, trace, progress, prices, on_iteration)


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
             progress: ProgressModel | None = None,
             on_iteration: Callable[[str, int], None] | None = None) -> dict[str, Any]:
    """Every policy in `policies` (default all) on `trace`: {"policies": {name: result}, ...}.
    `on_iteration(policy, iterations done)` is called after each simulated iteration (a progress bar)."""
    names = list(POLICIES) if policies is None else policies
    for n in names:
        if n not in POLICIES:
            raise ConfigError(f"--policy: unknown policy {n!r} (expected all or one of {', '.join(POLICIES)})")
    progress = progress or ProgressModel.calibrated(iterations_scale=cfg.iterations_scale)
    od, spot, row = gpu_prices(cfg)
    out = {name: make_simulation(cfg, POLICIES[name], trace, progress, (od, spot),
                                 None if on_iteration is None else lambda it, name=name: on_iteration(name, it)).run()
           for name in names}
    return {
        "policies": out,
        "trace": trace.source,
        "config": {"gpus": cfg.gpus, "spot_gpus_peak": cfg.peak_spot_gpus if trace.max_live else 0,
                   "iterations": cfg.iterations, "resolution": cfg.resolution, "prompts": cfg.prompts,
                   "group_size": cfg.group_size, "seed": cfg.seed, "gpu": cfg.step_times.gpu,
                   "price_per_gpu_h": {"ondemand": od, "spot": spot, "priced_from": row}},
        "progress_model": progress.to_dict(),
    }
