"""The run loop (`spotlight.iteration.run_loop`): an iteration runs only after the cost control
allowed it, its cost is measured before the next question, a stop comes before an iteration and
never inside one, an interrupted iteration runs again, and a run's own stop ends it after the
iteration that asked. The live trainer and the simulator run it (tests/spotlight/train/test_trainer.py,
tests/spotlight/sim/test_simulator.py); here every step is recorded in order."""

from cloud.cost import Decision
from spotlight.iteration.run_loop import Completed, run_loop


class Script:
    """A cost control, an engine and a run that write what happens to one list."""

    def __init__(self, stop_at=None, switch_at=None, interrupted=(), target_at=None):
        self.events, self.stop_at, self.switch_at = [], stop_at, switch_at
        self.interrupted, self.target_at = list(interrupted), target_at

    # the engine's question (FleetEngine.before_iteration asks the cost control)
    def before_iteration(self, cost, step, total):
        assert cost is self
        self.events.append(("ask", step, total))
        if step == self.stop_at:
            return Decision(stop="budget", message="stop")
        return Decision(switch=step == self.switch_at, message="switch")

    def switched(self, step, decision=None):
        self.events.append(("switched", step))

    def after_iteration(self, checkpoint_s=None):
        self.events.append(("cost", checkpoint_s))
        return 0.0

    # the run
    def before(self, step):
        self.events.append(("before", step))

    def stopped(self, step, decision):
        self.events.append(("stopped", step, decision.stop))

    def run_iteration(self, step):
        if step in self.interrupted:
            self.interrupted.remove(step)
            self.events.append(("interrupted", step))
            return None
        self.events.append(("iteration", step))
        return Completed(step * 10, checkpoint_s=0.5 if step % 2 else None)

    def after(self, step, done):
        self.events.append(("after", step, done.value))
        return "target" if step == self.target_at else None


def test_each_iteration_is_asked_for_then_measured_then_followed():
    s = Script()
    assert run_loop(s, s, 1, 3, s) == (3, None)
    assert s.events == [("before", 1), ("ask", 1, 3), ("iteration", 1), ("cost", 0.5), ("after", 1, 10),
                        ("before", 2), ("ask", 2, 3), ("iteration", 2), ("cost", None), ("after", 2, 20)]


def test_a_stop_comes_before_an_iteration_and_a_switch_is_said():
    s = Script(stop_at=2, switch_at=1)
    assert run_loop(s, s, 0, 5, s) == (2, "budget")
    assert ("switched", 1) in s.events
    assert s.events[-2:] == [("ask", 2, 5), ("stopped", 2, "budget")]
    assert ("iteration", 2) not in s.events


def test_an_interrupted_iteration_runs_again_after_asking_again():
    s = Script(interrupted=[1])
    assert run_loop(s, s, 0, 2, s) == (2, None)
    i = s.events.index(("interrupted", 1))
    assert s.events[i + 1:i + 4] == [("before", 1), ("ask", 1, 2), ("iteration", 1)]
    assert s.events.count(("cost", 0.5)) == 1  # only a completed iteration is measured


def test_the_runs_own_stop_ends_the_loop_after_that_iteration():
    s = Script(target_at=1)
    assert run_loop(s, s, 0, 9, s) == (2, "target")
    assert s.events[-1] == ("after", 1, 10)
