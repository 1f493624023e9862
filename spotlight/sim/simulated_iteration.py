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

from typing import Any, Protocol

from schedulers.clock import ManualClock
from schedulers.fleet import FleetEngine
from schedulers.queue import PullQueue
from schedulers.request import Kind, Request
from schedulers.update import FleetUpdate
from spotlight.sim.config import Policy, SimConfig
from spotlight.sim.modelled_executor import requests_of
from spotlight.sim.step_time import StepTimes


class ModelledRun(Protocol):
    """What a simulated iteration's phases use of the simulation they run on
    (`spotlight.sim.simulation.Simulation`)."""

    cfg: SimConfig
    policy: Policy
    st: StepTimes
    clock: ManualClock
    engine: FleetEngine
    queue: PullQueue
    plan_prompts: int
    """Prompts the explorer plans over."""
    samples_per_request: int
    ondemand_gpus: int
    eval_samples: int
    """Evaluation samples per evaluated iteration."""
    checkpoint_s: float

    @property
    def learner_update_s(self) -> float: ...
    def until(self, deadline: float) -> Any:
        """A modelled phase ending at `deadline`, as the engine waits on it."""
    def exploration(self, iteration: int, version: int, critical_path: bool, budget: int | None) -> Any:
        """One phase's exploration of `iteration`'s seeds with weights `version`."""
    def score(self, requests: list[Request]) -> None: ...
    def fleet_update(self, it: int) -> FleetUpdate:
        """The update on the fleet, request for request."""
    def rolled_out(self, seconds: float) -> None: ...
    def updated(self, on_fleet: bool) -> None: ...


class SimulatedIteration:
    def __init__(self, sim: ModelledRun, explored: dict[int, int]) -> None:
        """`sim`: the simulation it runs on; `explored`: the seeds explored for this iteration
        (prompt -> count), replaced by a critical-path exploration when the iteration runs one."""
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
        sim.engine.explore(session, sim.score, it - 1)
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
        sim.rolled_out(sim.clock.now() - start)

    def reward(self, it: int) -> None:
        """In the rollout's modelled seconds (module docstring), besides the runtime's call that
        scores the rollout (`StepTimes.reward_call_s`)."""
        if self.sim.st.reward_call_s:
            self._wait(self.sim.st.reward_call_s)

    def advantage(self, it: int) -> None:
        """Arithmetic on the rewards: no modelled time."""

    def update(self, it: int, on_fleet: bool) -> None:
        sim, cfg = self.sim, self.sim.cfg
        sim.updated(on_fleet)
        explores = sim.policy.explore == "idle_spot" and it + 1 < cfg.iterations
        session = sim.exploration(it + 1, it, False, None) if explores else None
        sim.engine.update(lambda: sim.fleet_update(it) if on_fleet else sim.until(sim.clock.now() + sim.learner_update_s),
                          it, session, sim.score)
        if session is not None:
            self.next_explored = session.explored()
        if on_fleet:  # counted as the live runtime counts them (`gradient_split`): completions
            self.gradients = sum(sim.queue.completions_by_worker(Kind.TRAIN).values())

    def publish(self, it: int) -> None:
        self._wait(self.sim.st.weight_sync_s)

    def record(self, it: int) -> None:
        """The progress model's bookkeeping, in `Simulation.run` after the iteration."""

    def checkpoint(self, it: int) -> None:
        self._wait(self.sim.checkpoint_s)
