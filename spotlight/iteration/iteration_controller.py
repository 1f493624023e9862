"""One GRPO iteration, sequenced once: the order of its phases and where its update runs, for
`spotlight train` (the local and Ray runtimes) and `spotlight simulate` (the modelled executor)
alike. A caller supplies only execution (an `IterationWork`: what each phase does on its
runtime) and a clock; the controller decides which phases an iteration runs, in which order,
and whether the update is computed by the learner alone or by the fleet (`UpdatePlacement`).

An iteration's phases, in order (`PHASES`; an iteration runs a subsequence, `plan`):
  explore_first  the first iteration of a session with `exploration.explore_first`: its seeds are
                 explored on the critical path (nothing trained before it to hide that behind);
                 the `sync_explore` baseline of the simulator does it every iteration
  eval           every `train.eval_every` iterations and the last, when evaluation is on
  rollout        the iteration's requests through the pull queue
  reward         scoring the rollout
  advantage      group advantages (and dropping zero-advantage groups)
  update         the GRPO update, on the learner or on the fleet; while it runs, idle workers
                 explore the next iteration's seeds with these weights (when exploration is on)
  publish        the new weights to every worker (cancels exploration still in flight)
  record         the iteration's metrics row, before the checkpoint that covers it
  checkpoint     every `train.checkpoint_every` iterations and the last

Invariant: two runs with the same settings run the same phases in the same order and place
every update alike whether they train or simulate
(`tests/spotlight/iteration/test_iteration_controller.py::test_train_and_simulate_run_the_same_iterations`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from schedulers.update_placement import UpdatePlacement
from spotlight.iteration import exploration

PHASES = ("explore_first", "eval", "rollout", "reward", "advantage", "update", "publish", "record", "checkpoint")


class IterationWork(Protocol):
    """What one iteration's phases do on a runtime (or in the simulator). Each method is called at
    most once per iteration, in `PHASES` order; state passes between them on the object."""

    def explore_first(self, step: int) -> None: ...
    def eval(self, step: int) -> None: ...
    def rollout(self, step: int) -> None: ...
    def reward(self, step: int) -> None: ...
    def advantage(self, step: int) -> None: ...
    def update(self, step: int, on_fleet: bool) -> None:
        """The update, on the fleet or on the learner alone (the controller decided)."""
    def publish(self, step: int) -> None: ...
    def record(self, step: int) -> None: ...
    def checkpoint(self, step: int) -> None: ...


@dataclass
class IterationRecord:
    """What the controller ran for one iteration: `phases` in order, where the update ran, and each
    phase's seconds on the caller's clock."""

    step: int
    phases: list[str] = field(default_factory=list)
    update_on_fleet: bool | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "phases": list(self.phases), "update_on_fleet": self.update_on_fleet}


class IterationController:
    """The iteration's sequence and its update's placement (module docstring)."""

    def __init__(self, placement: UpdatePlacement, clock: Any, steps: int, start_step: int = 0,
                 checkpoint_every: int | None = None, evaluates: Callable[[int], bool] = lambda step: False,
                 explores_first: Callable[[int], bool] = lambda step: False) -> None:
        """`steps`: the run's iterations (the last one evaluates and checkpoints); `start_step`: the
        first iteration of this session; `checkpoint_every` None: never checkpoints (a simulated
        policy without checkpoints); `evaluates(step)` / `explores_first(step)`: whether iteration
        `step` runs those phases (the run's settings decide)."""
        self.placement, self.clock = placement, clock
        self.steps, self.start_step = steps, start_step
        self.checkpoint_every = checkpoint_every
        self.evaluates, self.explores_first = evaluates, explores_first
        self.last: IterationRecord | None = None
        """The record of the iteration run last."""

    @classmethod
    def from_config(cls, cfg: Any, clock: Any, start_step: int, evaluation: bool,
                    explores_first: Callable[[int], bool] | None = None,
                    prefer_fleet: Callable[[], bool] | None = None) -> "IterationController":
        """The controller of a run config (`spotlight.config.RunConfig`): `train.update_on`,
        `train.steps`, `train.checkpoint_every`, `train.eval_every` (with `evaluation`: the run has
        evaluation prompts) and `exploration.explore_first` (from `start_step`, unless
        `explores_first` says better: a resumed explorer that already explored that iteration)."""
        t, ex = cfg.train, cfg.exploration

        def evaluates(step: int) -> bool:
            return evaluation and (step % t.eval_every == 0 or step == t.steps - 1)

        first = explores_first or (lambda step: exploration.explores_first(ex, step, start_step))
        return cls(UpdatePlacement(t.update_on, prefer=prefer_fleet), clock, t.steps, start_step,
                   t.checkpoint_every, evaluates, first)

    def checkpoints(self, step: int) -> bool:
        """Whether iteration `step` ends with a checkpoint: every `checkpoint_every` and the last."""
        every = self.checkpoint_every
        return every is not None and ((step + 1) % every == 0 or step + 1 == self.steps)

    def plan(self, step: int) -> list[str]:
        """The phases iteration `step` runs, in order."""
        skip = set()
        if not self.explores_first(step):
            skip.add("explore_first")
        if not self.evaluates(step):
            skip.add("eval")
        if not self.checkpoints(step):
            skip.add("checkpoint")
        return [p for p in PHASES if p not in skip]

    def run(self, step: int, work: IterationWork) -> IterationRecord:
        """Run iteration `step`'s phases on `work`, each timed on the clock; the update where the
        placement says, and its seconds measured for the next decision."""
        record = self.last = IterationRecord(step)
        for phase in self.plan(step):
            start = self.clock.now()
            if phase == "update":
                record.update_on_fleet = self.placement.on_fleet()
                work.update(step, record.update_on_fleet)
                self.placement.measured(record.update_on_fleet, self.clock.now() - start)
            else:
                getattr(work, phase)(step)
            record.phases.append(phase)
            record.seconds[phase] = record.seconds.get(phase, 0.0) + self.clock.now() - start
        return record
