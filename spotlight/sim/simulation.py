"""One policy on one trace: the live fleet engine (`schedulers.fleet.FleetEngine`) with the modelled
executor (`spotlight.sim.modelled_executor`) on a `ManualClock`, the modelled exploration session,
and the progress and cost bookkeeping (`spotlight.sim.simulator` has the whole picture). The two
baselines that behave differently subclass `Simulation` in `restart.py` and `oracle.py`."""

from __future__ import annotations

import math
from typing import Any, Callable

from cloud.cost import BudgetPolicy, CostControl, CostMeter, Fleet, Forecast
from planners.allocation import make_planner
from planners.seed_pool import SeedPool
from schedulers.clock import ManualClock
from schedulers.fleet import FleetAction, FleetEngine, Node
from schedulers.queue import PullQueue
from schedulers.request import Kind, Request
from schedulers.traces import Trace, replay_schedule
from schedulers.update import FleetUpdate
from spotlight.sim.config import Policy, SimConfig
from spotlight.sim.modelled_executor import ModelledExecutor, request_size, requests_of
from spotlight.sim.progress_model import ProgressModel, SeedRewards
from spotlight.sim.step_time import image_tokens


def spot_block(cfg: SimConfig, trace: Trace) -> int:
    """GPUs a trace node stands for: the spot fleet's peak spread over the trace's most live nodes
    (at least 1, so that a trace with more nodes than spot GPUs still has GPUs on every node)."""
    return max(1, cfg.peak_spot_gpus // max(trace.max_live, 1))


def spot_peak_gpus(cfg: SimConfig, trace: Trace) -> int:
    """The spot GPUs live at the trace's peak, as simulated (`spot_block` x the most live nodes):
    what `ondemand_total` rents on demand besides `cfg.gpus`."""
    return spot_block(cfg, trace) * trace.max_live


UPDATE_PART_SAMPLES = 4
"""Samples' worth of the update per TRAIN micro-batch in the simulator (live: `train.micro_batch`
(sample, SDE step) rows): fine enough that a fleet of hundreds of workers shares the update
evenly, coarse enough that 1,000 iterations stay cheap."""


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
        # the live defaults (config.exploration.round_samples and optimism, chunk G/2: spotlight/train/exploration.py)
        self.planner = make_planner(cfg.planner, **({"round_samples": 64, "chunk": max(1, cfg.group_size // 2),
                                                     "seed": cfg.seed} if cfg.planner == "bandit" else {}))
        self.block = spot_block(cfg, trace) if policy.spot else 0
        self.ondemand_gpus = cfg.gpus + (spot_peak_gpus(cfg, trace) if policy.all_ondemand else 0)
        """On-demand GPUs: `cfg.gpus`, and for `ondemand_total` the spot fleet's peak besides."""
        self.meter = CostMeter(self.clock, prices[0], prices[1], Fleet(self.ondemand_gpus, 0))
        self.timeline: list[tuple[float, int]] = []
        self.explored_samples = 0
        self.busy_gpu_s = 0.0
        self.fleet_updated = False
        """The last iteration's update ran on the fleet (`_fleet_update`), not on the on-demand GPUs alone."""
        self.fleet_updates = 0
        """Iterations whose update ran on the fleet."""
        self.rollout_s = 0.0
        """The last rollout's seconds (`_update_on_fleet` prices an iteration with them)."""
        self._stats: dict[str, int] = {}
        """Counters of the queues of earlier iterations (`_new_queue`)."""
        peak = self.ondemand_gpus + (self.block * trace.max_live if policy.spot else 0)
        self.samples_per_request = cfg.samples_per_request or request_size(
            peak, cfg.prompts, cfg.group_size, self.seq, st, cfg.resolution)
        self.requests_per_iteration = cfg.prompts * math.ceil(cfg.group_size / self.samples_per_request)
        self.executor = ModelledExecutor(self.clock, self.queue, st, cfg.resolution, self.seq, cfg.commit_every,
                                         cfg.join_s, self.requests_per_iteration, self.ondemand_gpus,
                                         on_done=self._done)
        self.engine = FleetEngine(self.clock, self.queue, self.executor,
                                  [Node("ondemand0", spot=False, devices=self.ondemand_gpus)], self._actions(),
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
        self.meter.set_fleet(Fleet(self.ondemand_gpus, spot))
        self.timeline.append((self.clock.now(), self.ondemand_gpus + spot))

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
        start = self.clock.now()
        self.engine.rollout(requests_of(it, cfg.prompts, cfg.group_size, self.samples_per_request), it)
        self.rollout_s = self.clock.now() - start
        nxt: dict[int, int] = {}
        fleet = self.policy.fleet_update and self._update_on_fleet(train_s)
        update = self._fleet_update(it) if fleet else Until(self.clock, self.clock.now() + train_s)
        self.fleet_updated = fleet
        self.fleet_updates += fleet
        if self.policy.explore == "idle_spot" and it + 1 < cfg.iterations:
            session = SimExploration(self, it + 1, it, False, None)
            self.engine.explore(session, self._score, it, update=update)
            nxt = session.explored()
        else:
            self.engine.wait(update, it)
        self.engine.wait(Until(self.clock, self.clock.now() + self.st.weight_sync_s))
        return nxt

    def _update_on_fleet(self, train_s: float) -> bool:
        """What the spot GPUs do during this update, by its value for time to target (issue 16):
        the update's micro-batches with the on-demand GPUs (the iteration is shorter; the spot GPUs
        explore only while the learner gathers and steps), or exploration while the on-demand GPUs
        train alone (a longer iteration, but more explored seeds, so more signal and fewer
        iterations). Each is priced in seconds per unit of progress: (the last rollout's seconds +
        the update's + the weight sync) over the progress model's gain at the signal the
        exploration it leaves room for is expected to give (`SeedRewards.expected_std`: that many
        samples spread evenly over the prompts, a full rollout each on the live spot GPUs). A
        policy that does not explore only asks which update is sooner: the fleet's is never with no
        spot GPU alive, and rarely when the update is short next to `update_round_s`."""
        return self.fleet_update_pays(self._fleet_update_s(), train_s, self.rollout_s, self.engine.spot_devices())

    def fleet_update_pays(self, fleet_s: float, train_s: float, rollout_s: float, spot_gpus: float) -> bool:
        """`_update_on_fleet`'s pricing (the oracle's too): an update of `fleet_s` seconds on the
        fleet against `train_s` on the on-demand GPUs, after a rollout of `rollout_s`, with
        `spot_gpus` live spot GPUs to explore."""
        cfg, st = self.cfg, self.st
        if self.policy.explore != "idle_spot":
            return fleet_s < train_s
        per_sample = st.sample_s(cfg.resolution, 1)

        def seconds_per_progress(update_s: float, exploring_s: float) -> float:
            explored = spot_gpus * exploring_s / per_sample / cfg.prompts
            signal = self.rewards.expected_std(explored, cfg.candidates_per_prompt)
            return (rollout_s + update_s + st.weight_sync_s) / self.progress.gain(signal)

        return seconds_per_progress(fleet_s, st.update_round_s) < seconds_per_progress(train_s, train_s)

    def _fleet_update_s(self) -> float:
        """What the update would take on the fleet live now (the on-demand GPUs and the spot ones
        at `fleet_update_efficiency`, plus the learner's gather-and-step): the fleet computes it
        only when that is sooner than the on-demand GPUs alone — never with no spot GPU alive,
        rarely when the update is short next to `update_round_s`."""
        cfg, st = self.cfg, self.st
        rate = (self.ondemand_gpus + self.engine.spot_devices() * st.fleet_update_efficiency) * st.train_efficiency
        return st.train_gpu_s(cfg.resolution, cfg.prompts * cfg.group_size) / rate + st.update_round_s

    def _fleet_update(self, it: int) -> FleetUpdate:
        """The update as the live `train.update_on: fleet` runs it (`schedulers.update`): micro-batches
        of `update_part_samples` samples' work each, pulled by every live worker (a spot one at
        `fleet_update_efficiency`), then the learner's gather-and-step (`update_round_s`)."""
        cfg, st, clock = self.cfg, self.st, self.clock
        samples = cfg.prompts * cfg.group_size
        parts = math.ceil(samples / UPDATE_PART_SAMPLES)
        work = st.train_gpu_s(cfg.resolution, samples) / parts
        return FleetUpdate(self.queue, it, 1, parts, work, lambda r, ids: Until(clock, clock.now() + st.update_round_s),
                           weights=lambda: None)

    def run(self) -> dict[str, Any]:
        cfg, st = self.cfg, self.st
        self._fleet_changed()
        self.engine.start()
        gain, progress, reached_at, cost_at, explored = 0.0, [(0.0, self.progress.score(0.0))], None, None, {}
        train_s = st.train_s(cfg.resolution, cfg.prompts * cfg.group_size, self.ondemand_gpus)
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
            if not self.fleet_updated:  # else the executor counted the update's micro-batches
                self.busy_gpu_s += self.ondemand_gpus * train_s
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
        peak = Fleet(self.ondemand_gpus, cfg.peak_spot_gpus if self.policy.spot else 0)
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
            "fleet_update_iterations": self.fleet_updates,
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
