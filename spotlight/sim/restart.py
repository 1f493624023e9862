"""The restart-from-checkpoint baseline of the simulator (`--policy spot_restart`): what a managed
job on spot instances does without Spotlight's elasticity.

It runs on the fleet engine with the modelled executor in its non-elastic mode (SP groups planned
once over the spot devices live at the start; no notices are acted on), and behaves differently
in one way, which is why it lives in a file of its own: any preemption of a node in the job's
cluster restarts the whole job. Everything the iteration computed is lost (its finished rollout
requests count as `steps_recomputed`), the fleet is down for a cold start and a restore, and the
iteration runs again on the capacity live then, grouped afresh (`ModelledExecutor.restart_groups`).

Billing: the job pays for the nodes of its cluster, not for every node the trace has live. Its
cluster is the spot nodes live at the start, and after each restart the nodes live then; a node
that joins in between is not the job's until the next restart (a managed job does not rent it),
so it is not paid for. Survivors of a preemption stay the job's (and paid) through the cold start
and restore; nodes a restart adds are paid from the moment the job serves on them, which leaves
their part of the cold start and restore unpaid — in the baseline's favour.
(`tests/spotlight/sim/test_simulator.py::test_spot_restart_pays_only_for_the_nodes_its_job_holds`.)
"""

from __future__ import annotations

from typing import Any

from cloud.cost import Fleet
from schedulers.fleet import FleetAction
from schedulers.request import Kind, Request
from spotlight.sim.modelled_executor import ModelledExecutor, requests_of
from spotlight.sim.simulation import Simulation, Until


class RestartSimulation(Simulation):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cfg = self.cfg
        self.executor = ModelledExecutor(self.clock, self.queue, self.st, cfg.resolution, self.seq, cfg.commit_every,
                                         cfg.join_s, self.requests_per_iteration, self.ondemand_gpus, on_done=self._done,
                                         elastic=False)
        self.engine.executor = self.executor
        self.engine.on_kill = self._killed
        self.restarts = 0
        self.down_until: float | None = None
        self.completed: dict[str, int] = {}
        """This attempt's finished rollout requests, by id: the steps a restart throws away."""
        self.lost_steps = 0
        self.held: set[str] = set()
        """The spot nodes of the job's cluster (module docstring): what it pays for."""

    def _actions(self) -> list[FleetAction]:
        return [a for a in super()._actions() if a.action != "notice"]  # a managed job ignores notices

    def _fleet_changed(self) -> None:
        """The meter and the timeline follow the job's cluster, not the trace's live nodes. At time 0
        every live node is the job's: the executor admits the nodes a trace starts with."""
        nodes = self.engine.nodes
        if self.clock.now() == 0.0:
            self.held.update(name for name, n in nodes.items() if n.spot and n.alive)
        self.held = {name for name in self.held if nodes[name].alive}  # a dead node leaves the cluster for good
        spot = sum(nodes[name].devices for name in self.held)
        self.meter.set_fleet(Fleet(self.ondemand_gpus, spot))
        self.timeline.append((self.clock.now(), self.ondemand_gpus + spot))

    def _done(self, worker: Any, request: Request) -> None:
        if request.kind is Kind.ROLLOUT:
            self.completed[request.id] = request.step

    def _killed(self, node: str) -> None:
        """A node died: if its devices were serving the job, the job restarts."""
        if any(m in self.executor.alive for m in self.executor.node_members.get(node, ())):
            self._restart()

    def _restart(self) -> None:
        if self.down_until is not None:
            return  # already restarting
        self.restarts += 1
        for w in self.engine.reset():
            self.queue.worker_lost(w.name)
        self.lost_steps += sum(self.st.denoise_steps - s for s in self.completed.values())
        self.completed.clear()
        self.queue.cancel(Kind.ROLLOUT)  # the attempt is over: the iteration runs again, afresh
        self.down_until = self.clock.now() + self.st.cold_start_s + self.st.restore_s

    def _before_iteration(self) -> None:
        if self.down_until is None:
            return
        self.engine.wait(Until(self.clock, self.down_until))
        self.down_until = None
        self._relaunch()

    def _relaunch(self) -> None:
        """The job serves again, on every spot node live now: its cluster until the next restart."""
        self.executor.restart_groups(self.engine.nodes["ondemand0"])
        self.held = {name for name, n in self.engine.nodes.items() if n.spot and n.alive}  # as restart_groups admits
        self._fleet_changed()
        self.engine.settle()

    def _iteration(self, it: int, explored: dict[int, int], train_s: float) -> dict[int, int] | None:
        return {} if self._attempt(it, train_s) else None

    def _attempt(self, it: int, train_s: float) -> bool:
        """Iteration `it` on the job's cluster — rollout, an update of `train_s`, the weight sync;
        False when a restart cut it short (it runs again, afresh)."""
        cfg, attempt = self.cfg, self.restarts
        self.completed.clear()
        self.engine.rollout(requests_of(it, cfg.prompts, cfg.group_size, self.samples_per_request, attempt), it)
        for seconds in (train_s, self.st.weight_sync_s):
            if not self._wait_unless_restarted(seconds, attempt):
                return False
        return True

    def _wait_unless_restarted(self, seconds: float, attempt: int) -> bool:
        """Wait `seconds` while the fleet lives on; False (at once) if restart number `attempt`
        is no longer the latest, before or during the wait."""
        restarted = lambda: self.restarts != attempt
        if restarted():
            return False
        self.engine.wait(Until(self.clock, self.clock.now() + seconds, abort=restarted))
        return not restarted()

    def _steps_recomputed_restart(self) -> int:
        return self.lost_steps
