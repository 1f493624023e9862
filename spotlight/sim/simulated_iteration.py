"""What each phase of an iteration does in the simulator: the `IterationWork` of `spotlight
simulate` on the fleet engine with the modelled executor (`spotlight.iteration.iteration_controller`
orders the phases and places the update, as it does for `spotlight train`, whose counterpart is
`spotlight.train.training_iteration.TrainingIteration`).

Modelled, not executed: the reward takes `StepTimes.reward_call_s` of its own (a request's modelled
seconds include its samples' rewards, `StepTimes.reward_s_per_sample`), the advantage none; the
first rollout starts after the fresh workers' warm-up (`StepTimes.worker_warmup_s`); an evaluation is
its samples at degree 1 over the on-demand GPUs; a checkpoint is `checkpoint_s`; the metrics row
is the progress model's bookkeeping, which `Simulation.run` does after the iteration.
"""

from __future__ import annotations

from typing import Any

from schedulers.request import Kind
from spotlight.sim.modelled_executor import requests_of


class SimulatedIteration:
    def __init__(self, sim: Any, explored: dict[int, int]) -> None:
        """`sim`: the `spotlight.sim.simulation.Simulation` it runs on (not imported here: it imports
        this); `explored`: the seeds explored for this iteration (prompt -> count), replaced by a
        critical-path exploration when the iteration runs one."""
        self.sim, self.explored = sim, explored
        self.next_explored: dict[int, int] = {}
        """What the spot GPUs explored for the next iteration during this one's update."""
        self.gradients = 0
        """Gradients the fleet sent for this iteration's update: one per `TRAIN` request completed."""

    def _wait(self, seconds: float) -> None:
        self.sim.engine.wait(self.sim.until(self.sim.clock.now() + seconds))

    def explore_first(self, it: int) -> None:
        sim = self.sim
        session = sim.exploration(it, it - 1, True, sim.cfg.sync_explore_per_prompt * sim.plan_prompts)
        sim.engine.explore(session, sim._score, it - 1)
        self.explored.clear()
        self.explored.update(session.explored())

    def eval(self, it: int) -> None:
        sim = self.sim
        self._wait(sim.eval_samples * sim.st.sample_s(sim.cfg.resolution, 1) / max(sim.ondemand_gpus, 1))

    def rollout(self, it: int) -> None:
        sim, cfg = self.sim, self.sim.cfg
        start = sim.clock.now()
        if it == 0 and sim.st.worker_warmup_s:  # every worker of the first fleet warms up at once
            self._wait(sim.st.worker_warmup_s)
        sim.engine.rollout(requests_of(it, cfg.prompts, cfg.group_size, sim.samples_per_request), it)
        sim.rollout_s = sim.clock.now() - start

    def reward(self, it: int) -> None:
        """In the rollout's modelled seconds (module docstring), besides the runtime's call that
        scores the rollout (`StepTimes.reward_call_s`)."""
        if self.sim.st.reward_call_s:
            self._wait(self.sim.st.reward_call_s)

    def advantage(self, it: int) -> None:
        """Arithmetic on the rewards: no modelled time."""

    def update(self, it: int, on_fleet: bool) -> None:
        sim, cfg = self.sim, self.sim.cfg
        update: Any = sim._fleet_update(it) if on_fleet else sim.until(sim.clock.now() + sim.learner_update_s)
        sim.fleet_updated = on_fleet
        sim.fleet_updates += on_fleet
        if sim.policy.explore == "idle_spot" and it + 1 < cfg.iterations:
            session = sim.exploration(it + 1, it, False, None)
            sim.engine.explore(session, sim._score, it, update=update)
            self.next_explored = session.explored()
        else:
            sim.engine.wait(update, it)
        if on_fleet:  # counted as the live runtime counts them (`gradient_split`): completions
            self.gradients = sum(sim.queue.completions_by_worker(Kind.TRAIN).values())

    def publish(self, it: int) -> None:
        self._wait(self.sim.st.weight_sync_s)

    def record(self, it: int) -> None:
        """The progress model's bookkeeping, in `Simulation.run` after the iteration."""

    def checkpoint(self, it: int) -> None:
        self._wait(self.sim.checkpoint_s)
