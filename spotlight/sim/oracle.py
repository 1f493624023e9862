"""The clairvoyant bound of the simulator (`--policy oracle`): it knows the trace.

Rollout and exploration are a fluid spread over every live GPU at the most efficient SP degree,
and so is the update with `fleet_update` (spot GPUs at `fleet_update_efficiency`; they explore
while the learner steps): nothing is lost to a preemption, no node waits to join, no request has
a tail. It does not run the
fleet engine — there is no scheduling to do when the future is known — which is why it lives in a
file of its own; it shares the rest (prices, timeline, the planner and the progress model) with
`spotlight.sim.simulator.Simulation`.
"""

from __future__ import annotations

import math
from typing import Any

from cloud.cost import CostMeter, Fleet
from schedulers.clock import ManualClock
from spotlight.sim.simulation import Simulation


class OracleSimulation(Simulation):
    def run(self) -> dict[str, Any]:
        cfg, st = self.cfg, self.st
        steps = [(t, n * self.block) for t, n in self.trace.live_over_time()]
        per_gpu_s = min(d * st.sample_s(cfg.resolution, d) for d in range(1, st.heads + 1) if st.heads % d == 0)
        train_s = st.train_s(cfg.resolution, cfg.prompts * cfg.group_size, cfg.gpus)
        spot_at = lambda t: next((n for tt, n in reversed(steps) if tt <= t), 0)
        # the timeline for cost and plots
        self.timeline = [(t, cfg.gpus + n) for t, n in steps] or [(0.0, cfg.gpus)]
        if self.timeline[0][0] > 0:
            self.timeline.insert(0, (0.0, cfg.gpus))

        def fluid(t: float, work: float, base: int, spot_weight: float = 1.0) -> float:
            """When `work` GPU-seconds are done from `t` on `base` + the live spot GPUs (each worth
            `spot_weight` of a base GPU)."""
            i = max((k for k, (tt, _) in enumerate(steps) if tt <= t), default=-1)
            while True:
                rate = base + (steps[i][1] if i >= 0 else 0) * spot_weight
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
            started = t
            t = fluid(t, cfg.prompts * cfg.group_size * per_gpu_s, cfg.gpus)
            self.busy_gpu_s += cfg.prompts * cfg.group_size * per_gpu_s
            work = st.train_gpu_s(cfg.resolution, cfg.prompts * cfg.group_size) / st.train_efficiency
            updated = fluid(t, work, cfg.gpus, st.fleet_update_efficiency) if self.policy.fleet_update else None
            if updated is not None and self.fleet_update_pays(updated + st.update_round_s - t, train_s, t - started,
                                                              spot_at(t)):
                # The update a fluid over every live GPU (spot ones at fleet_update_efficiency);
                # the spot GPUs explore while the learner gathers and steps (update_round_s). Only
                # where that pays more than exploring while the on-demand GPUs train alone, as
                # `spotlight` decides.
                self.fleet_updates += 1
                self.busy_gpu_s += work
                idle = (updated, updated + st.update_round_s)
                t_next = updated + st.update_round_s
            else:
                self.busy_gpu_s += cfg.gpus * train_s
                idle = (t, t + train_s)
                t_next = t + train_s
            budget = int(spot_gpu_s(*idle) / per_gpu_s / self.copies)
            nxt = self._explore_free(it + 1, budget) if it + 1 < cfg.iterations else {}
            self.busy_gpu_s += sum(nxt.values()) * self.copies * per_gpu_s
            t = t_next + st.weight_sync_s
            gain += self.progress.gain(self._signal(it, explored))
            explored, it = nxt, it + 1
            if self.on_iteration is not None:
                self.on_iteration(it)
            progress.append((t, self.progress.score(gain)))
            if reached_at is None and self.progress.reached(gain):
                reached_at = t
                if cfg.stop_at_target:
                    break
        self.removals = sum(1 for e in self.trace.events if e.action == "remove" and e.t_s <= t)
        self.clock.advance(t)
        cost_at = None if reached_at is None else self._fluid_cost(reached_at)
        stop_reason = "target" if reached_at is not None and cfg.stop_at_target else "iterations"
        return {**self._result(it, reached_at, cost_at, progress, self._fluid_cost(t)), "stop_reason": stop_reason}

    def _preemptions(self) -> int:
        return self.removals

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
        pool = self.start_planner(budget)
        while alloc := self.planner.next_round(pool):
            for p, n in alloc.items():
                _, _, stale = self.rewards.draw(it, p, cfg.candidates_per_prompt)
                for s in pool.unexplored(p)[:n]:
                    pool.record(p, s, float(stale[s]), it - 1)
        self.explored_samples += pool.total_explored() * self.copies
        return {p: pool.explored_count(p) for p in pool.prompt_ids}
