"""One policy on one trace: the live fleet engine (`schedulers.fleet.FleetEngine`) with the modelled
executor (`spotlight.sim.modelled_executor`) on a `ManualClock`, the modelled exploration session,
and the progress and cost bookkeeping (`spotlight.sim.simulator` has the whole picture). The two
baselines that behave differently subclass `Simulation` in `restart.py` and `oracle.py`."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable

from cloud.cost import BudgetPolicy, CostControl, CostMeter, Decision, Fleet, Forecast
from planners.allocation import make_planner
from planners.seed_pool import SeedPool
from schedulers.clock import ManualClock
from schedulers.fleet import FleetAction, FleetEngine, Node
from schedulers.queue import PullQueue
from schedulers.request import Kind, Request
from schedulers.traces import Trace, replay_schedule
from schedulers.update import FleetUpdate
from spotlight.sim import crews
from spotlight.sim.config import Policy, SimConfig
from schedulers.update_placement import UpdatePlacement, fleet_update_refusal
from spotlight.sim.modelled_executor import ModelledExecutor, request_size
from spotlight.sim.simulated_iteration import SimulatedIteration
from spotlight.config import RunConfig
from spotlight.iteration.iteration_controller import IterationController
from spotlight.iteration.run_loop import Completed, run_loop
from spotlight.sim.progress_model import ProgressModel, SeedRewards
from spotlight.sim.rental import MODEL_TOLERANCE, IterationModel, RentalRule, choose_ondemand, ondemand_candidates
from spotlight.sim.step_time import image_tokens, update_memory_refusal


def spot_block(cfg: SimConfig, trace: Trace) -> int:
    """GPUs a trace node stands for: the spot fleet's peak spread over the trace's most live nodes
    (at least 1, so that a trace with more nodes than spot GPUs still has GPUs on every node)."""
    return max(1, cfg.peak_spot_gpus // max(trace.max_live, 1))


def spot_peak_gpus(cfg: SimConfig, trace: Trace) -> int:
    """The spot GPUs live at the trace's peak, as simulated (`spot_block` x the most live nodes):
    what `ondemand_total` rents on demand besides `cfg.gpus`."""
    return spot_block(cfg, trace) * trace.max_live


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
                 on_iteration: Callable[[int], None] | None = None, ondemand_gpus: int | None = None,
                 run: RunConfig | None = None):
        """`ondemand_gpus`: hold that many on-demand GPUs, chosen by the caller (the oracle weighing
        each count); None: the policy's or `cfg.gpus`, or under a renting objective the count
        `choose_ondemand` picks when the run starts. `run`: the run config this simulates as
        `spotlight train` would run it (`simulate --config`, `spotlight.sim.run_config`): its
        evaluation samples, its iteration controller, and every iteration logged (`iterations_log`)."""
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
        # the live defaults (config.exploration.round_samples and optimism, chunk G/2: spotlight/iteration/exploration.py)
        self.planner = make_planner(cfg.planner, **({"round_samples": 64, "chunk": max(1, cfg.group_size // 2),
                                                     "seed": cfg.seed} if cfg.planner == "bandit" else {}))
        self.block = spot_block(cfg, trace) if policy.spot else 0
        self.ondemand_chosen = ondemand_gpus is not None
        """The on-demand count was given (else a renting objective chooses it: `_choose_ondemand`)."""
        self.ondemand_gpus = ondemand_gpus if ondemand_gpus is not None else (
            (cfg.gpus if policy.ondemand_gpus is None else policy.ondemand_gpus)
            + (spot_peak_gpus(cfg, trace) if policy.all_ondemand else 0))
        """On-demand GPUs: `cfg.gpus` (or the policy's own count: 1 for `near_all_spot`, 0 for
        `managed_restart`), and for `ondemand_total` the spot fleet's peak besides; under a renting
        objective the count it chooses (`_choose_ondemand`)."""
        self.group_gpus = max(0, (cfg.learner_gpus or 1) - 1) if self.st.lora_rank == 0 else 0
        """A run config's learner group holds `train.learner_gpus` GPUs, one of them its rollout
        worker's or the head's: the others are paid for, and compute no rollout."""
        self.meter = CostMeter(self.clock, prices[0], prices[1], Fleet(self.paid_ondemand, 0))
        self.timeline: list[tuple[float, int]] = []
        self.explored_samples = 0
        self.busy_gpu_s = 0.0
        self.fleet_updated = False
        """The last iteration's update ran on the fleet (`fleet_update`), not on the on-demand GPUs alone."""
        self.fleet_updates = 0
        """Iterations whose update ran on the fleet."""
        self.rollout_s = 0.0
        """The last rollout's seconds (`_update_on_fleet` prices an iteration with them)."""
        self.ingress_free = 0.0
        """When the learner's ingress link is next free: a fleet update's gradients arrive one after
        the other as their requests complete (`_done`)."""
        self._stats: dict[str, int] = {}
        """Counters of the queues of earlier iterations (`_new_queue`)."""
        # Training refuses SP groups with an update on the fleet (`fleet_update_refusal`), so a policy
        # whose update may run there has workers of one GPU each: with one head the regroup policy
        # plans degree 1 only (at 512² it does anyway; at 1280² it would form SP groups).
        workers_st = self.workers_st = replace(st, heads=1) if policy.fleet_update else st
        self._size_requests()
        self.executor = ModelledExecutor(self.clock, self.queue, workers_st, cfg.resolution, self.seq, cfg.commit_every,
                                         cfg.join_s, self.requests_per_iteration, self.ondemand_gpus,
                                         on_done=self._done)
        self.engine = FleetEngine(self.clock, self.queue, self.executor,
                                  [Node("ondemand0", spot=False, devices=self.ondemand_gpus)], self._actions(),
                                  replay_phases=("rollout", "train", "idle"), spot_devices=self.block,
                                  on_fleet=self._fleet_changed)
        self.max_sp_degree = workers_st.heads
        """The largest SP degree the regroup policy may give a worker (degrees divide the heads): 1
        for a policy whose update may run on the fleet (> 1: SP groups, which compute rollouts only)."""
        self.eval_samples = run.train.eval_prompts * run.train.eval_seeds if run is not None else 0
        """Evaluation samples per evaluated iteration (a simulated run config's; named policies: none)."""
        self.checkpoint_s = cfg.checkpoint_s
        self._gain = 0.0
        """The progress model's gain of the iterations done (`run`)."""
        self._scores: list[tuple[float, float]] = [(0.0, progress.score(0.0))]
        """The validation score over time: (clock seconds, score) after each iteration."""
        self._explored: dict[int, int] = {}
        """What was explored for the next iteration (prompt -> samples)."""
        self._train_s = 0.0
        """The update on the on-demand GPUs alone (`learner_update_s` when the run starts)."""
        self.reached_at: float | None = None
        """When the target score was reached (None: not yet); `cost_at` the dollars spent by then."""
        self.cost_at: float | None = None
        self.iterations_log: list[dict[str, Any]] | None = [] if run is not None else None
        """Each iteration's phases and update placement, for a run config (`simulate --config`)."""
        self.controller = IterationController.from_config(run, self.clock, 0, evaluation=run.evaluates) \
            if run is not None else IterationController(
                UpdatePlacement("auto" if policy.fleet_update else "learner", prefer=self._update_on_fleet),
                self.clock, cfg.iterations, explores_first=lambda it: policy.explore == "critical_path")

    def _size_requests(self) -> None:
        """Samples per rollout request for the fleet at its peak (`request_size`), and so the requests of an iteration."""
        cfg = self.cfg
        peak = self.ondemand_gpus + (self.block * self.trace.max_live if self.policy.spot else 0)
        self.samples_per_request = cfg.samples_per_request or request_size(
            peak, cfg.prompts, cfg.group_size, self.seq, self.workers_st, cfg.resolution)
        self.requests_per_iteration = cfg.prompts * math.ceil(cfg.group_size / self.samples_per_request)

    def _actions(self) -> list[FleetAction]:
        """Trace node k is fleet node `spotK` (one node per trace node: `replay_schedule` on as many slots)."""
        if not self.policy.spot:
            return []
        return [FleetAction(a.at_s, f"spot{a.slot}", a.action)
                for a in replay_schedule(self.trace, max(len(self.trace.nodes), 1), 1.0, self.cfg.notice_s)]

    def _done(self, worker: Any, request: Request) -> None:
        """A request committed (the executor's hook). A gradient request's one gradient starts for
        the learner now, or when the gradients before it have arrived (one ingress link)."""
        if request.kind is Kind.TRAIN:
            st = self.st
            self.ingress_free = crews.arrival(self.ingress_free, self.clock.now(), st.gradient_transfer_s(worker.spot),
                                              st.gradient_transfer_s(worker.spot, queued=True))

    def _fleet_changed(self) -> None:
        spot = self.engine.spot_devices()
        self.meter.set_fleet(Fleet(self.paid_ondemand, spot))
        self.timeline.append((self.clock.now(), self.paid_ondemand + spot))

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
    def score(requests: list[Request]) -> None:
        return None  # the stale rewards come from the progress model, in `SimExploration.record`

    # -- the run -------------------------------------------------------------------------------------

    def _iteration(self, it: int, explored: dict[int, int], train_s: float) -> dict[int, int] | None:
        """One iteration on the engine, sequenced by the controller a training run uses
        (`spotlight.iteration.iteration_controller`, the phases in `SimulatedIteration`); returns what
        was explored for the next one (None: the iteration was interrupted and must run again —
        only the restart baseline does that)."""
        work = SimulatedIteration(self, explored)
        record = self.controller.run(it, work)
        if self.iterations_log is not None:
            self.iterations_log.append(self._log_row(record, work))
        return work.next_explored

    def _log_row(self, record: Any, work: SimulatedIteration) -> dict[str, Any]:
        """An iteration as `simulate --config` reports it, with the keys of a training run's
        metrics.jsonl row where the simulator has them: the phases run and their seconds
        (`time_<phase>_s`; `wall_s` without the checkpoint, as the live row is written before it),
        where the update ran and, on the fleet, the gradients sent and their bytes (one part's
        bytes each: `StepTimes.part_bytes`)."""
        row = {**record.to_dict(), **{f"time_{p}_s": s for p, s in record.seconds.items()},
               "wall_s": sum(s for p, s in record.seconds.items() if p != "checkpoint")}
        if record.update_on_fleet:
            row.update(gradient_parts=work.gradients, update_gradient_bytes=work.gradients * self.st.part_bytes)
        return row

    def rolled_out(self, seconds: float) -> None:
        """The iteration's rollout took `seconds` (the next update's placement prices with them)."""
        self.rollout_s = seconds

    def updated(self, on_fleet: bool) -> None:
        """The iteration's update ran on the fleet (`on_fleet`) or on the on-demand GPUs alone."""
        self.fleet_updated = on_fleet
        self.fleet_updates += on_fleet

    def until(self, deadline: float) -> Until:
        """A modelled phase ending at `deadline` on this simulation's clock, as the engine waits on it."""
        return Until(self.clock, deadline)

    def exploration(self, iteration: int, version: int, critical_path: bool, budget: int | None) -> SimExploration:
        """One phase's exploration of `iteration`'s seeds with weights `version` (`SimExploration`)."""
        return SimExploration(self, iteration, version, critical_path, budget)

    @property
    def paid_ondemand(self) -> int:
        """On-demand GPUs the meter pays for: the rollout's and a learner group's others (`group_gpus`)."""
        return self.ondemand_gpus + self.group_gpus

    @property
    def learner_update_s(self) -> float:
        """The update on the learner alone, `updates_per_step` rounds over every sample: a full
        fine-tune on a learner group (`StepTimes.group_round_s`) of `cfg.learner_gpus` GPUs (a
        simulated run config: its `train.learner_gpus`), or of the on-demand GPUs up to one node's;
        LoRA data parallel over the on-demand GPUs, or `cfg.learner_gpus` of them (a run config:
        the runtime's one learner process)."""
        cfg, st = self.cfg, self.st
        samples = cfg.prompts * cfg.group_size
        if st.lora_rank == 0:  # the runtime's group lives on one node
            n = cfg.learner_gpus or min(max(self.ondemand_gpus, 1), st.gpus_per_node)
            return cfg.updates_per_step * st.group_round_s(cfg.resolution, samples, n)
        gpus = self.ondemand_gpus if cfg.learner_gpus is None else min(cfg.learner_gpus, max(self.ondemand_gpus, 1))
        return cfg.updates_per_step * st.train_s(cfg.resolution, samples, gpus)

    def _update_on_fleet(self) -> bool:
        """What the spot GPUs do during this update, by its value for time to target (issue 16):
        the update's micro-batches with the on-demand GPUs (the iteration is shorter; the spot GPUs
        explore only while the learner gathers and steps), or exploration while the on-demand GPUs
        train alone (a longer iteration, but more explored seeds, so more signal and fewer
        iterations). Each is priced in seconds per unit of progress: (the last rollout's seconds +
        the update's + the weight sync) over the progress model's gain at the signal the
        exploration it leaves room for is expected to give (`SeedRewards.expected_std`: that many
        samples spread evenly over the prompts, a full rollout each on the live spot GPUs). A
        policy that does not explore only asks which update is sooner: the fleet's is never with no
        spot GPU alive, and rarely when the update is short next to the gather (`StepTimes.round_tail_s`)."""
        return self.fleet_update_pays(self._fleet_update_s(), self.learner_update_s, self.rollout_s,
                                      self.engine.spot_devices())

    def fleet_refusal(self) -> str | None:
        """Why the fleet cannot compute this run's update, as `spotlight train` refuses it (the
        same reason, `schedulers.update_placement.fleet_update_refusal`); None: it can."""
        return fleet_update_refusal(self.max_sp_degree, update_memory_refusal(self.st))

    def fleet_update_pays(self, fleet_s: float, train_s: float, rollout_s: float, spot_gpus: float) -> bool:
        """`_update_on_fleet`'s pricing (the oracle's too): an update of `fleet_s` seconds on the
        fleet against `train_s` on the on-demand GPUs, after a rollout of `rollout_s`, with
        `spot_gpus` live spot GPUs to explore."""
        cfg, st = self.cfg, self.st
        if self.fleet_refusal() is not None:
            return False
        if self.policy.explore != "idle_spot":
            return fleet_s < train_s
        per_sample = st.sample_s(cfg.resolution, 1)

        def seconds_per_progress(update_s: float, exploring_s: float) -> float:
            explored = spot_gpus * exploring_s / per_sample / cfg.prompts
            signal = self.rewards.expected_std(explored, cfg.candidates_per_prompt)
            return (rollout_s + update_s + st.weight_sync_s) / self.progress.gain(signal)

        return seconds_per_progress(fleet_s, st.round_tail_s(fleet_s)) < seconds_per_progress(train_s, train_s)

    def _fleet_update_s(self) -> float:
        """What the update would take on the fleet live now (`_round_s` per round): the fleet
        computes it only when that is sooner than the on-demand GPUs alone — never with no spot
        GPU alive, rarely when the update is short next to the gather."""
        return self.cfg.updates_per_step * self._round_s()

    def _round_s(self, gather: bool = True, nodes: list[tuple[int, bool]] | None = None) -> float:
        """One round of the update on the fleet live now — or on `nodes`, (GPUs, spot) each — at the
        runtime's grain: its requests on the nodes' crews, every GPU at `fleet_update_efficiency`,
        each gradient through the learner's link as its request completes, then the step
        (`spotlight.sim.crews.round_s`; a given `update_round_s` after the last request instead).
        `gather` False: the compute alone."""
        cfg, st = self.cfg, self.st
        part_s = st.train_gpu_s(cfg.resolution, cfg.prompts * cfg.group_size) / st.gradient_parts / st.fleet_update_efficiency
        given = not st.is_derived("update_round_s")
        if nodes is None:
            nodes = [(n.devices, n.spot) for n in self.engine.nodes.values() if n.alive and not n.noticed]
        crew_nodes = [crews.CrewNode(gpus, part_s,
                                     *((0.0, 0.0) if given or not gather else
                                       (st.gradient_transfer_s(spot), st.gradient_transfer_s(spot, queued=True))))
                      for gpus, spot in sorted(nodes, key=lambda n: n[1])]
        after = 0.0 if not gather else st.update_round_s if given else st.learner_step_s
        return crews.round_s(st.gradient_parts, st.parts_per_request, crew_nodes, after)

    def fleet_update(self, it: int) -> FleetUpdate:
        """The update as the live `train.update_on: fleet` runs it (`schedulers.update`), request for
        request: `updates_per_step` rounds of `gradient_parts` micro-batches in requests of
        `parts_per_request`, each pulled by a node's crew (every GPU at `fleet_update_efficiency`);
        each request's gradient then crosses the learner's ingress (`_done`), and the round ends
        when the last has arrived and the learner has stepped (`learner_step_s`) — or, with a given
        `update_round_s`, that long after its last request."""
        cfg, st, clock = self.cfg, self.st, self.clock
        part_s = st.train_gpu_s(cfg.resolution, cfg.prompts * cfg.group_size) / st.gradient_parts
        given = not st.is_derived("update_round_s")

        def step(round: int, ids: list[str]) -> Until:
            if given:
                return Until(clock, clock.now() + st.update_round_s)
            return Until(clock, max(self.ingress_free, clock.now()) + st.learner_step_s)

        return FleetUpdate(self.queue, it, cfg.updates_per_step, st.gradient_parts, part_s, step,
                           weights=lambda: None, per_request=st.parts_per_request)

    def run(self) -> dict[str, Any]:
        self._choose_ondemand()
        self._fleet_changed()
        self.engine.start()
        self._train_s = self.learner_update_s
        cost = self._cost_control(self._train_s)
        it, stopped = run_loop(self.engine, cost, 0, self.cfg.iterations, self)
        self._fleet_changed()
        return {**self._result(it, self.reached_at, self.cost_at, self._scores, self.meter.spent_usd()),
                "stop_reason": stopped or "iterations"}

    # -- the run loop's steps (`spotlight.iteration.run_loop.Run`) ------------------------------------

    def before(self, it: int) -> None:
        self._before_iteration()

    def stopped(self, it: int, decision: Decision) -> None:
        pass  # the result says why (`stop_reason`)

    def switched(self, it: int, decision: Decision) -> None:
        pass  # the engine switched the fleet; the meter follows it (`_fleet_changed`)

    def run_iteration(self, it: int) -> Completed | None:
        self._new_queue()
        nxt = self._iteration(it, self._explored, self._train_s)
        if nxt is None:
            return None
        if not self.fleet_updated:  # else the executor counted the update's micro-batches
            self.busy_gpu_s += self.paid_ondemand * self._train_s
        self._gain += self.progress.gain(self._signal(it, self._explored))
        self._explored = nxt
        self._scores.append((self.clock.now(), self.progress.score(self._gain)))
        return Completed(nxt)

    def after(self, it: int, done: Completed) -> str | None:
        if self.on_iteration is not None:
            self.on_iteration(it + 1)
        if self.reached_at is None and self.progress.reached(self._gain):
            self.reached_at, self.cost_at = self.clock.now(), self.meter.spent_usd()
            if self.cfg.stop_at_target:
                return "target"
        return None

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
        peak = Fleet(self.paid_ondemand, cfg.peak_spot_gpus if self.policy.spot else 0)
        return CostControl(self.clock, self.meter, peak, forecast, budget, peak_fleet=peak)

    def _before_iteration(self) -> None:
        """Hook: the restart baseline waits out a restart here; the elastic spot policies hold the
        spot nodes their objective chooses (`_rent`)."""
        self._rent()

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
            "preemption_times_h": [e.t_s / 3600.0 for e in self.trace.events  # the trace's removals in the run
                                   if e.action == "remove" and e.t_s <= end] if self.policy.spot else [],
            "steps_recomputed": stats["steps_recomputed"] + self._steps_recomputed_restart(),
            "iterations": iterations,
            "iterations_to_target": next((i for i, (t, s) in enumerate(progress) if s >= self.progress.target - 1e-12), None),
            "wall_h": end / 3600.0,
            "total_cost_usd": total_usd,
            # What the meter billed, by kind (the timeline is the meter's fleet): the dollars at other
            # prices without a re-run where no decision reads a price (`simulator.reprice`).
            "ondemand_gpu_h": self.paid_ondemand * end / 3600.0,
            "spot_gpu_h": (paid - self.paid_ondemand * end) / 3600.0,
            "ondemand_gpu_h_to_target": None if reached_at is None else self.paid_ondemand * reached_at / 3600.0,
            "spot_gpu_h_to_target": None if reached_at is None else
            (self._paid_gpu_s(reached_at) - self.paid_ondemand * reached_at) / 3600.0,
            "restarts": getattr(self, "restarts", 0),
            "requests_given_back": stats["requests_given_back"],
            "requests_requeued": stats["requests_requeued"],
            "requests_duplicated": stats["requests_duplicated"],
            "regroups": self.executor.regroups,
            "explored_samples": self.explored_samples,
            "fleet_update_iterations": self.fleet_updates,
            **self._rental_result(end),
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

    # -- renting only what pays (`spotlight.sim.rental`; docs/simulator.md#renting-only-what-pays) ---------

    renting: "Renting | None" = None
    """The rental rule's state from the first iteration on where `_rents`; None: every spot node
    the trace offers is held."""

    def _objective_governs(self) -> bool:
        """Whether `cfg.objective` chooses this policy's spot nodes: the elastic spot policies and the
        oracle (on its fluid); a restart baseline's job holds its cluster."""
        return self.policy.spot and self.policy.elastic

    def _rents(self) -> bool:
        """Whether `_rent` sets the spot nodes held (the oracle chooses its own, in `oracle.py`)."""
        return self._objective_governs() and not self.policy.oracle and self.cfg.objective != "time"

    def iteration_model(self, ondemand_gpus: int | None = None, spot_nodes: int | None = None) -> IterationModel:
        """The rental rule's T(s) for this run (with `ondemand_gpus` on-demand GPUs, None: those
        held; its gather priced with `spot_nodes` spot nodes, None: those live): the rollout's work
        at the most efficient SP degree (as the oracle's fluid), the update's at the trainer's
        efficiency, or on the fleet where the policy does that and the fleet can (`fleet_refusal`)
        at the runtime's grain for each count of spot nodes (`_round_s`), the weight sync fixed."""
        cfg, st = self.cfg, self.st
        g = self.ondemand_gpus if ondemand_gpus is None else ondemand_gpus
        samples = cfg.prompts * cfg.group_size
        per_gpu_s = min(d * st.sample_s(cfg.resolution, d) for d in range(1, st.heads + 1) if st.heads % d == 0)
        update_gpu_s = cfg.updates_per_step * st.train_gpu_s(cfg.resolution, samples) / st.train_efficiency
        spot = ([(n.devices, True) for n in self.engine.nodes.values() if n.spot and n.alive] if spot_nodes is None
                else [(self.block, True)] * spot_nodes)
        nodes = [(g, False)] + spot
        tail = cfg.updates_per_step * (self._round_s(nodes=nodes) - self._round_s(gather=False, nodes=nodes))
        rounds: dict[int, float] = {}

        def fleet_update_s(spot_gpus: float) -> float:
            """The update on the fleet at the runtime's grain with that many spot GPUs, in nodes of
            `block` (once per node count: the rule prices every count before each iteration)."""
            n = round(spot_gpus / max(self.block, 1))
            if n not in rounds:
                rounds[n] = cfg.updates_per_step * self._round_s(nodes=[(g, False)] + [(self.block, True)] * n)
            return rounds[n]

        return IterationModel(g, samples * per_gpu_s, update_gpu_s, st.weight_sync_s,
                              st.fleet_update_efficiency / st.train_efficiency,
                              tail, self.policy.fleet_update and self.fleet_refusal() is None, fleet_update_s)

    def _chooses_ondemand(self) -> bool:
        """Whether the objective chooses this run's on-demand GPUs (`rental.choose_ondemand`): a
        renting objective, a policy whose count is not its own, and none given."""
        return self._rents() and self.policy.ondemand_gpus is None and not self.ondemand_chosen

    def _choose_ondemand(self) -> None:
        """Before the first iteration, under `--objective cost|deadline`: hold the on-demand GPUs the
        objective chooses among `ondemand_candidates` (rental module docstring), pricing each count
        with the spot nodes on offer now and the rule's own choice of them."""
        if not self._chooses_ondemand():
            return
        cfg = self.cfg
        offered = sum(1 for e in self.trace.events if e.t_s == 0.0 and e.action == "add")
        # Exact rules (no `MODEL_TOLERANCE`): each count priced at its cheapest spot choice; the live
        # rule's tolerance then picks the spot nodes of the count held (`_rent`).
        rules = {g: RentalRule(cfg.objective, self.iteration_model(g, offered), max(self.block, 1), self.meter.ondemand_usd_h,
                               self.meter.spot_usd_h, cfg.join_s) for g in ondemand_candidates(cfg.gpus)}
        seconds_left = None if cfg.deadline_h is None else cfg.deadline_h * 3600.0
        g = choose_ondemand(cfg.objective, rules, offered, self.iterations_left(0), seconds_left)
        if g != self.ondemand_gpus:
            self.ondemand_gpus = g
            self.engine.nodes["ondemand0"].devices = g
            self.executor.ondemand_devices = g
            self._size_requests()
            self.executor.pending_per_iteration = self.requests_per_iteration

    def iterations_left(self, done: int) -> float:
        """The forecast of the iterations to the target after `done` (at least 1): the progress
        model's at the random seeds' signal, s_ref — at most what a run that explores needs (177 at
        the defaults; `spotlight` takes 175-177), so a deadline forecast errs on the safe side."""
        return max(1.0, self.progress.iterations_at(self.progress.s_ref) - done)

    def _held(self) -> list[Node]:
        """The spot nodes held and not noticed (a noticed node is paid until it goes, but serves no more)."""
        return [n for n in self.engine.nodes.values() if n.spot and n.alive and not n.noticed]

    def _rent(self) -> None:
        """Before an iteration, hold the spot nodes the rule chooses (`RentalRule.nodes`) of those held
        and on offer: release the last held beyond them (`FleetEngine.release`: no preemption, paid no
        more), rent offered ones up to them (`FleetEngine.rent`: each pays `join_s` before it serves).
        Until the next iteration a node the trace adds joins only while fewer are held than the rule
        would hold were every trace node on offer (`Renting.wanted`; `FleetEngine.admit`). The
        deadline's forecast: `iterations_left` x T(held) x the pace so far (measured over modelled
        seconds)."""
        if not self._rents():
            return
        cfg, engine, now = self.cfg, self.engine, self.clock.now()
        r = self.renting
        if r is None:
            r = self.renting = Renting(RentalRule(cfg.objective, self.iteration_model(), self.block,
                                                  self.meter.ondemand_usd_h, self.meter.spot_usd_h, cfg.join_s,
                                                  MODEL_TOLERANCE))
            engine.admit = lambda node: len(self._held()) < r.wanted
        else:
            r.measured_s += now - r.since
            r.modelled_s += r.planned_s
        held = self._held()
        offered = [n for n in engine.nodes.values() if n.spot and n.released]
        seconds_left = None if cfg.deadline_h is None else cfg.deadline_h * 3600.0 - now
        pace = r.measured_s / r.modelled_s if r.modelled_s > 0 else 1.0
        left = self.iterations_left(r.iterations)
        r.target = r.rule.nodes(len(held), len(held) + len(offered), left, seconds_left, pace)
        r.wanted = r.rule.nodes(len(held), max(self.trace.max_live, len(held) + len(offered)), left, seconds_left,
                                pace)
        for n in held[r.target:]:
            engine.release(n.name)
        for n in offered[:max(0, r.target - len(held))]:
            engine.rent(n.name)
        r.since, r.iterations, r.planned_s = now, r.iterations + 1, r.rule.model.seconds(r.target * self.block)

    def _releases(self) -> int:
        """Spot nodes released because they did not pay (`FleetEngine.release`)."""
        return self.engine.releases

    def _rental_result(self, end: float) -> dict[str, Any]:
        """The result's `objective` (None where it chooses no spot node: `_objective_governs`),
        `spot_gpus_held_mean` (the spot GPUs paid for, averaged over the run's seconds) and
        `spot_releases`."""
        held_gpu_s = self._paid_gpu_s(end) - self.paid_ondemand * end
        return {"objective": self.cfg.objective if self._objective_governs() else None,
                "ondemand_gpus_held": self.paid_ondemand,
                "spot_gpus_held_mean": max(0.0, held_gpu_s / end) if end > 0 else 0.0,
                "spot_releases": self._releases()}


@dataclass
class Renting:
    """What `Simulation._rent` keeps between iterations."""

    rule: RentalRule
    target: int = 0
    """Spot nodes (not noticed) held from the last choice on: the rule's of those on offer then."""
    wanted: int = 0
    """The rule's choice were every trace node on offer: a node the trace adds joins while fewer are held."""
    iterations: int = 0
    """Iterations the rule has chosen for so far."""
    since: float = 0.0
    """When the last choice was made."""
    planned_s: float = 0.0
    """The modelled seconds of the iteration it was made for."""
    measured_s: float = 0.0
    modelled_s: float = 0.0
    """Sums over the iterations so far: their seconds as run and as modelled (the deadline's pace)."""
