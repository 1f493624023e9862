"""The all-spot managed-job baseline of the simulator (`--policy managed_restart`): what a user gets
from SkyPilot managed jobs on spot instances alone, checkpointing to object storage — the
restart-from-checkpoint yardstick a user would actually buy.

The job is all spot: no on-demand GPU. Its cluster is a set of spot nodes that roll out and train
(the update data-parallel over the cluster's GPUs, at `train_efficiency`), then sync the weights.
It checkpoints after every `SimConfig.checkpoint_every` iterations, a write holding it up for
`SimConfig.checkpoint_s` seconds. Its life:

- **running** on its cluster. A node that joins meanwhile is not the job's: a managed job never
  grows a running cluster (SkyPilot's controller acts only when the job or its cluster fails).
- **a loss**: any node of its cluster dies (notices are ignored, as the controller ignores them).
  The whole job restarts: the iteration in flight and every iteration done since the last
  checkpoint are lost (`iterations_lost`; their rollouts count in `steps_recomputed`), and it
  relaunches — a cold start, plus a restore when there is a checkpoint to restore.
- **launching**: the cold start (and restore) runs from the loss, or, when no spot node is live,
  from the moment one comes back — the job waits, paying nothing, and never falls back to
  on-demand. Its new cluster is every spot node live when the launch ends (nodes that came back
  during it included); the survivors of the loss are held (and paid) through it. If no node is
  live then, it waits again. A trace that starts empty is the same: the first launch begins when
  the first node comes (`bamboo-g4dn.csv`: at 480 s, serving after the default 300 s cold start,
  at 780 s, on the 23 nodes live then).
  A job with no node and no node left to come stops (`stop_reason` "no_capacity").

Billing: the spot price for the nodes its cluster holds, nothing else (no on-demand GPU, no
controller). Nodes a launch adds are paid from the moment the job serves on them, which leaves
their part of the launch unpaid — in the baseline's favour, as for `spot_restart`.

What SkyPilot does, read in `sky/jobs/recovery_strategy.py` (skypilot-org/skypilot, commit
027bbcd): `StrategyExecutor.launch()` is `_launch(max_retry=None)`, which calls `sky.launch` of
the task's resources and, when they are unavailable, retries for ever with a backoff from
`RETRY_INIT_GAP_SECONDS` (60 s) — so a job submitted when there is no capacity waits and starts
when capacity comes back. On a preemption the controller (`sky/jobs/controller.py`, polling the
job every `JOB_STATUS_CHECK_GAP_SECONDS`, 15-20 s) calls `recover()`: the default
`EAGER_NEXT_REGION` tears the cluster down and relaunches it (elsewhere first, then anywhere),
`FAILOVER` first relaunches the same cluster in its region, keeping the survivors; either way the
user's program starts afresh and restores its own checkpoint. Where this model departs from that,
it departs in the baseline's favour, and says so:
- SkyPilot launches the task's fixed `num_nodes` and retries until all are provisioned; here a
  launch takes whatever capacity is live when it ends (at least one node) — a job that asks, at
  each launch, for the capacity there is. With a fixed size it would stall on traces that rarely
  reach their peak (`bamboo-g4dn.csv`: 12.6 of 24 nodes live on average).
- No detection delay (the controller's poll) and no backoff: the launch starts at the loss, or
  at the moment capacity returns.
- A checkpoint is durable once its write ends (`SimConfig.checkpoint_s`: the blocking part of an
  asynchronous save); the upload behind it is free.

How lost iterations are simulated without a second copy of the iteration loop: the simulation's
loop (`Simulation.run`) counts an iteration when it first completes; after a restart, the next
`_iteration` first runs again the iterations the loss threw away (same work, same signal: this
policy does not explore, so their gain is already counted), then its own. The time to target is
therefore exact; the `progress` curve does not dip at a loss (the score reached is redone, not
shown as lost).

It does not explore (random seeds, as `ondemand`). The invariants, in tests/spotlight/sim/test_sim_baselines.py:
no on-demand GPU billed and nothing billed or done while no spot node is live
(`test_managed_restart_bills_no_ondemand_gpu_and_waits_for_capacity_paying_nothing`, which also
checks that a trace starting empty is not `ondemand`), a loss loses exactly the iterations since
the last checkpoint (`test_managed_restart_loses_exactly_the_iterations_since_its_last_checkpoint`),
capacity that comes back is used at the next launch
(`test_managed_restart_uses_capacity_that_comes_back_at_its_next_launch`), and a job with nothing
left to come stops (`test_managed_restart_with_no_node_left_to_come_stops_and_pays_nothing_more`).
"""

from __future__ import annotations

import bisect
from typing import Any, Callable

from cloud.cost import CostControl, Decision
from spotlight.sim.restart import RestartSimulation
from spotlight.sim.simulation import Until


class ManagedRestartSimulation(RestartSimulation):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        assert self.ondemand_gpus == 0, "a managed job here is all spot (Policy.ondemand_gpus = 0)"
        self.checkpointed = 0
        """Iterations in the last checkpoint: where a restart resumes from."""
        self.trained = 0
        """Iterations the job's weights hold now (the checkpointed ones, and those done since)."""
        self.iterations_lost = 0
        """Iterations done and then thrown away by a restart (`trained - checkpointed` at each loss)."""
        self.stranded = False
        """No spot node is live and none will join: the job can never run again."""
        # Replay time is the simulation's clock here: speed-up 1, the trace runs in every phase from t = 0.
        self._joins = sorted(a.at_s for a in self._actions() if a.action == "add")

    # -- the cluster -------------------------------------------------------------------------------

    def _cluster_gpus(self) -> int:
        return sum(self.engine.nodes[name].devices for name in self.held)

    def _launch_s(self) -> float:
        """A launch: provision and load (cold start), and restore the trainer state if there is a checkpoint."""
        return self.st.cold_start_s + (self.st.restore_s if self.checkpointed else 0.0)

    def _capacity_live(self) -> bool:
        return self.engine.spot_devices() > 0

    def _await_capacity(self) -> bool:
        """Wait, holding and paying nothing, until a spot node is live; False if none ever will be."""
        while not self._capacity_live():
            nxt = bisect.bisect_right(self._joins, self.clock.now())
            if nxt == len(self._joins):
                return False
            self.engine.wait(Until(self.clock, self._joins[nxt], abort=self._capacity_live))
        return True

    def _restart(self) -> None:
        if self.down_until is not None:
            return  # already launching
        super()._restart()
        lost = self.trained - self.checkpointed
        self.iterations_lost += lost
        self.lost_steps += lost * self.requests_per_iteration * self.st.denoise_steps
        self.trained = self.checkpointed
        self.down_until = self.clock.now() + self._launch_s()

    def _before_iteration(self) -> None:
        """Launch when the job has no cluster: after a loss, or before the first iteration of a
        trace that starts empty (module docstring)."""
        if self.held and self.down_until is None:
            return  # running
        while True:
            if self.down_until is None or not self._capacity_live():
                if not self._await_capacity():
                    self.stranded = True
                    return
                self.down_until = self.clock.now() + self._launch_s()
            self.engine.wait(Until(self.clock, self.down_until))
            self.down_until = None
            if self._capacity_live():
                break
        self._relaunch()

    # -- an iteration ------------------------------------------------------------------------------

    def _iteration(self, it: int, explored: dict[int, int], train_s: float) -> dict[int, int] | None:
        """Iteration `it`, after again the ones the last restart threw away (module docstring).
        `train_s` (the update on the on-demand GPUs, of which there are none) is not used: the
        cluster trains."""
        while self.trained < it:
            if not self._attempt(self.trained, self._cluster_train_s()):
                return None
        return {} if self._attempt(it, self._cluster_train_s()) else None

    def _cluster_train_s(self) -> float:
        cfg = self.cfg
        return self.st.train_s(cfg.resolution, cfg.prompts * cfg.group_size, self._cluster_gpus())

    def _attempt(self, it: int, train_s: float) -> bool:
        attempt, gpus = self.restarts, self._cluster_gpus()
        if not super()._attempt(it, train_s):
            return False
        self.busy_gpu_s += gpus * train_s
        self.trained = it + 1
        if self.trained % self.cfg.checkpoint_every:
            return True
        if not self._wait_unless_restarted(self.cfg.checkpoint_s, attempt):
            return False  # lost with the write: the restart counted it
        self.checkpointed = self.trained
        return True

    # -- the controller's view -----------------------------------------------------------------------

    def _cost_control(self, train_s: float) -> "StopWhenStranded":
        """The live cost control, its prior the update on the cluster at its largest, and a stop
        when the job is stranded (`stop_reason` "no_capacity")."""
        cfg = self.cfg
        peak_s = self.st.train_s(cfg.resolution, cfg.prompts * cfg.group_size, self.block * self.trace.max_live)
        return StopWhenStranded(super()._cost_control(peak_s), lambda: self.stranded)

    def _result(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return {**super()._result(*args, **kwargs), "iterations_lost": self.iterations_lost}


class StopWhenStranded:
    """The cost control's questions (`cloud.cost.CostControl`), and one more reason to stop before
    an iteration: the job has no node and no node will ever join."""

    def __init__(self, control: CostControl, stranded: Callable[[], bool]) -> None:
        self.control, self.stranded = control, stranded

    def before_iteration(self, step: int, total: int) -> Decision:
        if self.stranded():
            return Decision("no_capacity", False,
                            f"stopping before iteration {step}: no spot node is live and none will join")
        return self.control.before_iteration(step, total)

    def switched(self, step: int) -> None:
        self.control.switched(step)

    def after_iteration(self, checkpoint_s: float | None = None) -> float:
        return self.control.after_iteration(checkpoint_s)
