"""The run loop, written once: for each iteration, the cost control's question through the fleet
engine (a budget or a deadline may stop the run; a deadline may switch the workers to on-demand
first: `FleetEngine.before_iteration`), the iteration, the cost control's measurement of it, and
what the run does after it — for `spotlight train` (`spotlight.train.trainer.Trainer`) and every
simulated policy that runs on the engine (`spotlight.sim.simulation.Simulation` and its restart
baselines, whose interrupted iterations run again). The iteration itself is sequenced by the
`IterationController` inside `Run.run_iteration`.

The oracle (`spotlight.sim.oracle`) is not a run of this loop: it plans a fluid fleet with
perfect foresight and has no engine, no cost control and no iteration to interrupt.

Invariant: an iteration runs only after the cost control allowed it, its cost is measured before
the next question, and a stop is asked for before an iteration starts, never in the middle of
one (`tests/spotlight/iteration/test_run_loop.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from cloud.cost import Decision


@dataclass
class Completed:
    """An iteration that ran to its end: `checkpoint_s` is the seconds its checkpoint took (None:
    it wrote none; the cost control's forecast separates them), `value` what the run keeps of it."""

    value: Any = None
    checkpoint_s: float | None = None


class Run(Protocol):
    """What a run does around the loop's steps."""

    def before(self, step: int) -> None:
        """Before the cost control's question (a simulated baseline waits out a restart, an elastic
        policy rents the spot nodes its objective chooses)."""

    def stopped(self, step: int, decision: Decision) -> None:
        """The cost control stopped the run before iteration `step` (a trainer checkpoints what it
        has not saved and says why)."""

    def switched(self, step: int, decision: Decision) -> None:
        """The workers were switched to on-demand before iteration `step` (the engine did it)."""

    def run_iteration(self, step: int) -> Completed | None:
        """Run iteration `step`; None when it was cut short and must run again (a restart baseline)."""

    def after(self, step: int, done: Completed) -> str | None:
        """After iteration `step` completed and its cost was measured; a stop reason ends the run
        after it (a simulation that reached its target), None goes on."""


class CostQuestion(Protocol):
    """The cost control as the loop uses it (`cloud.cost.CostControl`)."""

    def before_iteration(self, step: int, total: int) -> Decision: ...
    def switched(self, step: int) -> None: ...
    def after_iteration(self, checkpoint_s: float | None = None) -> float: ...


class Engine(Protocol):
    def before_iteration(self, cost: Any, step: int, total: int) -> Decision: ...


def run_loop(engine: Engine, cost: CostQuestion, start: int, steps: int, run: Run) -> tuple[int, str | None]:
    """Iterations `start` .. `steps - 1` of `run`, each after the cost control allowed it. Returns
    the iterations done and why the loop stopped early (the cost control's reason or `run.after`'s;
    None: every iteration ran)."""
    step = start
    while step < steps:
        run.before(step)
        decision = engine.before_iteration(cost, step, steps)
        if decision.stop is not None:
            run.stopped(step, decision)
            return step, decision.stop
        if decision.switch:
            run.switched(step, decision)
        done = run.run_iteration(step)
        if done is None:
            continue
        cost.after_iteration(done.checkpoint_s)
        step += 1
        reason = run.after(step - 1, done)
        if reason is not None:
            return step, reason
    return step, None
