"""The clairvoyant bound of the simulator (`--policy oracle`): it knows the trace.

Rollout and exploration are a fluid spread over every held GPU at the most efficient SP degree:
nothing is lost to a preemption, no node waits to join, no request has a tail. The update with
`fleet_update` is at the runtime's grain, as the policies': its requests on the crews of the nodes
held when it starts (every GPU at `fleet_update_efficiency`), each gradient through the learner's
link (`spotlight.sim.crews`), the spot GPUs exploring once the compute is done; what a fleet of that
grain cannot do faster is no scheduling loss, so the bound does not pretend it away. It does not run the
fleet engine — there is no scheduling to do when the future is known — which is why it lives in a
file of its own; it shares the rest (prices, timeline, the planner and the progress model) with
`spotlight.sim.simulator.Simulation`.

It rents as freely as the spot policies (`SimConfig.objective`, `spotlight.sim.rental.choose`), its
on-demand GPUs too under `cost` and `deadline` (each count of `ondemand_candidates` run whole, the
objective's best kept: `_with_best_ondemand`):
before each iteration it sets a cap on the spot GPUs it holds — the iteration holds
min(live, cap) — by the objective, pricing each cap with the fluid's own iteration on the trace
ahead (exact, not the rule's model), per unit of progress (the exploration a cap leaves room for
raises the next iteration's signal, as `fleet_update_pays` counts it): `time` holds every live
node, `cost` the cap whose iteration costs least, `deadline` the cheapest cap whose iteration,
repeated for the iterations left, meets the deadline. It pays no join, so a cap may change every
iteration at no cost: it bounds the cost of `--objective cost` as it bounds the time of
`--objective time`. Its preemptions are the trace's removals of nodes it holds (while the live
nodes are at or below its cap). (tests/spotlight/sim/test_rental.py)
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

from cloud.cost import CostMeter, Fleet
from schedulers.clock import ManualClock
from spotlight.sim.rental import choose, ondemand_candidates
from spotlight.sim.simulation import Simulation


@dataclass(frozen=True)
class _Plan:
    """One iteration of the fluid from `start` with at most `cap` spot GPUs held."""

    start: float
    cap: float
    rollout_end: float
    fleet: bool
    """The update ran on the fleet (else on the on-demand GPUs alone)."""
    idle: tuple[float, float]
    """When the spot GPUs explore: the learner's step, or the whole update on the on-demand GPUs."""
    end: float
    """After the weight sync."""


class OracleSimulation(Simulation):
    def run(self) -> dict[str, Any]:
        if self._oracle_chooses_ondemand():
            return self._with_best_ondemand()
        cfg, st = self.cfg, self.st
        self.steps = [(t, n * self.block) for t, n in self.trace.live_over_time()]
        self.times = [t for t, _ in self.steps]
        self.per_gpu_s = min(d * st.sample_s(cfg.resolution, d) for d in range(1, st.heads + 1) if st.heads % d == 0)
        self.train_s = cfg.updates_per_step * st.train_s(cfg.resolution, cfg.prompts * cfg.group_size, self.ondemand_gpus)
        self.update_work = (cfg.updates_per_step * st.train_gpu_s(cfg.resolution, cfg.prompts * cfg.group_size)
                            / st.train_efficiency)
        rents = self._objective_governs() and cfg.objective != "time"
        top = max((n for _, n in self.steps), default=0)
        self.timeline, self.caps, self.released = [], [], 0
        t, gain, it, explored, cap = 0.0, 0.0, 0, {}, math.inf
        progress, reached_at = [(0.0, self.progress.score(0.0))], None
        while it < cfg.iterations:
            plan = self._choose(t, it, top) if rents else self._plan(t, math.inf)
            live = self._spot_at(t)
            self.released += max(0, int(min(live, cap) - min(live, plan.cap))) // max(self.block, 1)
            cap = plan.cap
            self.caps.append((t, cap))
            self._held_timeline(t, plan.end, cap)
            self.busy_gpu_s += cfg.prompts * cfg.group_size * self.per_gpu_s
            if plan.fleet:
                self.fleet_updates += 1
                self.busy_gpu_s += self.update_work
            else:
                self.busy_gpu_s += self.ondemand_gpus * self.train_s
            budget = int(self._spot_gpu_s(*plan.idle, cap) / self.per_gpu_s / self.copies)
            nxt = self._explore_free(it + 1, budget) if it + 1 < cfg.iterations else {}
            self.busy_gpu_s += sum(nxt.values()) * self.copies * self.per_gpu_s
            t = plan.end
            gain += self.progress.gain(self._signal(it, explored))
            explored, it = nxt, it + 1
            if self.on_iteration is not None:
                self.on_iteration(it)
            progress.append((t, self.progress.score(gain)))
            if reached_at is None and self.progress.reached(gain):
                reached_at = t
                if cfg.stop_at_target:
                    break
        self.removals = self._held_removals(t)
        self.clock.advance(t)
        cost_at = None if reached_at is None else self._fluid_cost(reached_at)
        stop_reason = "target" if reached_at is not None and cfg.stop_at_target else "iterations"
        return {**self._result(it, reached_at, cost_at, progress, self._fluid_cost(t)), "stop_reason": stop_reason}

    def _oracle_chooses_ondemand(self) -> bool:
        """Under `--objective cost|deadline` the oracle chooses its on-demand GPUs too, as the
        renting policies do (`Simulation._chooses_ondemand`), but knowing the trace."""
        return (self._objective_governs() and self.cfg.objective != "time" and self.policy.ondemand_gpus is None
                and not self.ondemand_chosen)

    def _with_best_ondemand(self) -> dict[str, Any]:
        """Its whole run with each count of `ondemand_candidates`, the one the objective prefers:
        the cheapest to the target (`deadline`: of those reaching it by the deadline; none: the most
        GPUs; a run of fixed iterations none of whose counts reaches it: the cheapest in all) — exact on the trace, where the policies choose from a model before they start."""
        cfg = self.cfg
        runs = {}
        for g in ondemand_candidates(cfg.gpus):
            sim = OracleSimulation(cfg, self.policy, self.trace, self.progress,
                                   (self.meter.ondemand_usd_h, self.meter.spot_usd_h), ondemand_gpus=g)
            runs[g] = sim.run()
        reached = {g: r for g, r in runs.items() if r["cost_usd"] is not None and (
            cfg.deadline_h is None or r["time_to_target_h"] <= cfg.deadline_h)}
        if reached:
            best = min(reached, key=lambda g: (reached[g]["cost_usd"], -g))
        elif cfg.deadline_h is None and not cfg.stop_at_target:  # every iteration run, none to the target
            best = min(runs, key=lambda g: (runs[g]["total_cost_usd"], -g))
        else:
            best = max(runs)
        if self.on_iteration is not None:
            self.on_iteration(runs[best]["iterations"])
        return runs[best]

    # -- the fluid ----------------------------------------------------------------------------------

    def _spot_at(self, t: float, cap: float = math.inf) -> float:
        """Spot GPUs held at `t`: the live ones, at most `cap`."""
        i = bisect.bisect_right(self.times, t) - 1
        return min(self.steps[i][1], cap) if i >= 0 else 0

    def _fluid(self, t: float, work: float, base: int, spot_weight: float = 1.0, cap: float = math.inf) -> float:
        """When `work` GPU-seconds are done from `t` on `base` + the held spot GPUs (each worth
        `spot_weight` of a base GPU)."""
        steps = self.steps
        i = bisect.bisect_right(self.times, t) - 1
        while True:
            rate = base + (min(steps[i][1], cap) if i >= 0 else 0) * spot_weight
            nxt = steps[i + 1][0] if i + 1 < len(steps) else math.inf
            if rate > 0 and t + work / rate <= nxt:
                return t + work / rate
            work -= rate * (nxt - t)
            t, i = nxt, i + 1

    def _spot_gpu_s(self, t0: float, t1: float, cap: float = math.inf) -> float:
        """Held spot GPU-seconds over [t0, t1]."""
        total, t = 0.0, t0
        i = bisect.bisect_right(self.times, t0)  # the first step after t0
        while t < t1:
            nxt = min(self.times[i], t1) if i < len(self.times) else t1
            total += self._spot_at(t, cap) * (nxt - t)
            t, i = nxt, i + 1
        return total

    def _plan(self, t: float, cap: float) -> _Plan:
        """The iteration from `t` holding at most `cap` spot GPUs (no side effects)."""
        cfg, st = self.cfg, self.st
        rolled = self._fluid(t, cfg.prompts * cfg.group_size * self.per_gpu_s, self.ondemand_gpus, cap=cap)
        if self.policy.fleet_update:
            # The update at the runtime's grain, on the nodes held when it starts: its requests on
            # their crews, each gradient through the learner's link (`Simulation._round_s`).
            held = [(self.ondemand_gpus, False)] + [(self.block, True)] * int(self._spot_at(rolled, cap) // max(self.block, 1))
            computed = rolled + cfg.updates_per_step * self._round_s(gather=False, nodes=held)
            done = rolled + cfg.updates_per_step * self._round_s(nodes=held)
            if self.fleet_update_pays(done - rolled, self.train_s, rolled - t, self._spot_at(rolled, cap)):
                # Only where that pays more than exploring while the on-demand GPUs train alone, as
                # `spotlight` decides; the spot GPUs explore once the compute is done.
                return _Plan(t, cap, rolled, True, (computed, done), done + st.weight_sync_s)
        done = rolled + self.train_s
        return _Plan(t, cap, rolled, False, (rolled, done), done + st.weight_sync_s)

    def _choose(self, t: float, it: int, top: int) -> _Plan:
        """The iteration from `t` at the cap `cfg.objective` chooses among 0, 1, ... nodes (the
        most live in the trace, `top` GPUs, is every node): each priced exactly on the fluid."""
        cfg, block = self.cfg, max(self.block, 1)
        plans = [self._plan(t, n * block) for n in range(top // block)] + [self._plan(t, math.inf)]
        rate_od, rate_spot = self.ondemand_gpus * self.meter.ondemand_usd_h / 3600.0, self.meter.spot_usd_h / 3600.0
        reference = self.progress.gain(self.progress.s_ref)
        options = []
        for p in plans:
            # Per a random-seed iteration's progress: what the spot GPUs explore in `idle` raises the
            # next iteration's signal (as `fleet_update_pays` prices it), so fewer of them may cost
            # iterations (measured on bamboo-p3 before this: 175 iterations against `time`'s 174).
            explored = self._spot_gpu_s(*p.idle, p.cap) / self.per_gpu_s / cfg.prompts
            per = reference / self.progress.gain(self.rewards.expected_std(explored, cfg.candidates_per_prompt))
            usd = rate_od * (p.end - t) + rate_spot * self._spot_gpu_s(t, p.end, p.cap)
            options.append(((p.end - t) * per, usd * per))
        seconds_left = None if cfg.deadline_h is None else cfg.deadline_h * 3600.0 - t
        return plans[choose(cfg.objective, 0, options, horizon=self.iterations_left(it), seconds_left=seconds_left)]

    def _held_timeline(self, t0: float, t1: float, cap: float) -> None:
        """The paid GPUs over [t0, t1) into the timeline (one point per change)."""
        points = [t0] + self.times[bisect.bisect_right(self.times, t0):bisect.bisect_left(self.times, t1)]
        for t in points:
            n = self.ondemand_gpus + self._spot_at(t, cap)
            if not self.timeline or self.timeline[-1][1] != n:
                self.timeline.append((t, n))

    def _held_removals(self, until: float) -> int:
        """The trace's removals by `until` of nodes held: a removal with L nodes live before it takes a
        held node when (L - 1) nodes are fewer than the cap then (with no cap: every removal)."""
        count, live = 0, 0
        starts = [t for t, _ in self.caps]
        for e in self.trace.events:
            if e.action == "add":
                live += 1
                continue
            if e.t_s <= until:
                i = bisect.bisect_right(starts, e.t_s) - 1
                cap = self.caps[i][1] if i >= 0 else math.inf
                count += (live - 1) * self.block < cap
            live -= 1
        return count

    def _preemptions(self) -> int:
        return self.removals

    def _releases(self) -> int:
        return self.released

    def _fluid_cost(self, until: float) -> float:
        clock = ManualClock()
        meter = CostMeter(clock, self.meter.ondemand_usd_h, self.meter.spot_usd_h, Fleet(self.ondemand_gpus, 0))
        for t, n in self.timeline:
            if t > until:
                break
            clock.advance(max(0.0, t - clock.now()))
            meter.set_fleet(Fleet(self.ondemand_gpus, n - self.ondemand_gpus))
        clock.advance(max(0.0, until - clock.now()))
        return meter.spent_usd()

    def _explore_free(self, it: int, budget: int) -> dict[int, int]:
        """The oracle's exploration: the planner's rounds with every sample scored at once."""
        cfg = self.cfg
        pool = self.start_planner(budget)
        while alloc := self.planner.next_round(pool):
            for p, n in alloc.items():
                _, _, stale = self.rewards.draw(it, p, cfg.candidates_per_prompt)
                for s in pool.unexplored(p)[:n]:
                    pool.record(p, s, float(stale[s]), it - 1)
        self.explored_samples += pool.total_explored() * self.copies
        return {p: pool.explored_count(p) for p in pool.prompt_ids}
