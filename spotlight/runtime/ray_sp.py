"""Elastic SP groups inside `spotlight train` on Ray: the run's rollout and exploration requests served
by sequence-parallel groups (`runtime.sp_degree` > 1), re-formed in place when members go.

`RaySPExecutor` is the fleet engine's executor (`schedulers.fleet.Executor`) that `RayRuntime`
builds instead of `RayExecutor` when `runtime.sp_degree` > 1. It is `elastic_sp`'s `SPExecutor`
over an engine-driven `Coordinator` in this process whose groups pull from the run's queue actor
(through `QueueClient`, which serves the coordinator's `GroupQueue` calls), with one node agent per
fleet node as a Ray actor (`elastic_sp.ray_agent`) that owns the node's member processes (one per
device) and its live weights. Where an agent runs:
- a node of a real cluster (`Node.cluster_id`, a Ray node id): pinned to it (hard node affinity),
  holding the node's `spot` units on a spot node (one per device), and a GPU per device when the
  run computes on CUDA (its members use cuda:0.., the GPUs Ray gave the agent);
- a node of a fleet replayed on the one-node local cluster (spot0, spot1, ...): on the
  controller's node (`home`; anywhere when it is not given), a sliver of `spot` for a spot one.

Groups are planned by the live regroup policy with the configured degree as its target
(`regroup_policy.TargetDegree`): groups of `sp_degree` members, the remainder as wide as it goes
(a lone survivor serves at degree 1 until a member joins it).

What the learner, the reward actor and the controller see is unchanged: a request completes with
exactly what a `RolloutWorker` commits for it (rank 0 computes it at the last step with the run's
policy: `spotlight.rl.sp_member.finish`), so final weights equal the same run's at sp_degree 1 bit
for bit wherever Ulysses is exact (the sequence divides by the degree: tests/spotlight/runtime/test_sp_train.py).
After each update `publish` hands every live node's agent the new weights (Ray moves them to the
node once; its members load them from the node's shared memory), and a node that joins later
starts from the newest. Exploration requests are sampled with the run's exploration settings
(`exploration.num_steps`, `exploration.ode`).

Preemption notices (`runtime.notice_sources`): each node's agent watches its node — the metadata
endpoint, SIGTERM — as a rollout worker watches its own (`rollout_worker.notice_sources`), and a
notice it sees is handled as a drain of the node is (`SPExecutor`: the groups there give their
requests back at the next committed step and re-form without the node's members).

Counters (`stats`): `sp_regroups`, in-place regroups (a group re-formed from members of dissolved
groups: a death, a notice, a join, a cancelled exploration), and `sp_regroup_s`, their seconds in
all (`Coordinator.regroups`: from the dissolution seen to the new group ready).

Not covered here (refused with one line where a config asks for it): the LLM policy. Groups commit
every step whatever `runtime.commit_every` says.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from functools import partial
from typing import Any

import ray

from elastic_sp.coordinator import Coordinator
from elastic_sp.fleet_executor import SPExecutor
from elastic_sp.ray_agent import RayAgent
from elastic_sp.regroup_policy import TargetDegree, check_degree
from schedulers.fleet import Event, Node, Pending, Worker
from schedulers.preemption import PreemptionNotice
from schedulers.queue_actor import QueueClient
from schedulers.request import Kind
from spotlight.config import ConfigError, RunConfig
from spotlight.rl.sp_member import serve_spec
from spotlight.runtime.ray_cluster import SPOT_RESOURCE, SPOT_SLIVER
from spotlight.runtime.rollout_worker import notice_sources


def check_sp(cfg: RunConfig) -> None:
    """ConfigError (one line, naming the field) unless run `cfg` can be served by SP groups."""
    rt = cfg.runtime
    if cfg.policy.kind != "dit":
        raise ConfigError(f"runtime.sp_degree: sequence parallelism serves the DiT policy, not policy.kind "
                          f"{cfg.policy.kind!r} (set runtime.sp_degree: 1)")
    heads = serve_spec(cfg).heads
    try:
        check_degree(heads, rt.sp_degree)
    except ValueError as err:
        raise ConfigError(f"runtime.sp_degree: {err}") from None


class RaySPExecutor:
    """See the module docstring. `queue_actor`: the run's `QueueActor`; `weights`: the learner's
    weights of `version` (an ObjectRef); `home`: the controller's Ray node id; `gpus(node_id)`:
    the GPUs of a cluster node (taken for `RayExecutor`'s signature: an agent takes a GPU per
    device when the run computes on CUDA)."""

    def __init__(self, cfg: RunConfig, queue_actor: Any, version: int, weights: Any, clock: Any,
                 home: str | None = None, gpus: Callable[[str | None], int] | None = None,
                 base: Any = None) -> None:
        check_sp(cfg)
        self.cfg, self.clock, self.home = cfg, clock, home
        self.gpus = gpus or (lambda node_id: 0)
        self.weights = weights
        """The newest published weights (an ObjectRef): what a node that joins starts from."""
        self.base = base
        """With LoRA, the learner's whole model (`Learner.full_state`, an ObjectRef) that a joining
        node starts from before the newest adapters (`weights`: published weights carry the
        adapters alone)."""
        # Rendezvous stores listen in this process: on a cluster joined by address, on this node's
        # Ray address, which the other nodes reach.
        host = ray.util.get_node_ip_address() if cfg.runtime.address else "127.0.0.1"
        device = "cuda" if cfg.device.startswith("cuda") else "cpu"
        self.spec = serve_spec(cfg, device=device, host=host, finish=True)
        self.coord = Coordinator(self.spec, [], QueueClient(queue_actor), step_time=TargetDegree(cfg.runtime.sp_degree),
                                 clock=clock, engine_driven=True)
        self.sp = SPExecutor(self.coord, self._agent_for, version, keep_events=False)

    def _agent_for(self, node: Node) -> RayAgent:
        rt = self.cfg.runtime
        watch = {"notices": partial(notice_sources, tuple(rt.notice_sources)) if rt.notice_sources else None,
                 "notice_poll_s": rt.notice_poll_s}
        if self.base is None:
            return RayAgent.start(node.name, self.spec, self.weights, self.sp.version, self._placement(node), **watch)
        # LoRA: the whole model once, then the newest adapters (the agent takes calls in order).
        agent = RayAgent.start(node.name, self.spec, self.base, self.sp.version, self._placement(node), **watch)
        agent.publish(self.sp.version, self.weights)
        return agent

    def _placement(self, node: Node) -> dict[str, Any]:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        where = node.cluster_id if node.cluster_id is not None else self.home
        options: dict[str, Any] = {}
        if where is not None:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(where, soft=False)
        if node.spot:
            options["resources"] = {SPOT_RESOURCE: float(node.devices) if node.cluster_id is not None else SPOT_SLIVER}
        if self.spec.device == "cuda":  # the members (cuda:0..) see the GPUs Ray gives their agent
            options["num_gpus"] = node.devices
        return options

    # ---- the executor interface (`schedulers.fleet.Executor`) -------------------------------------

    def start(self, node: Node, spot: bool) -> list[Worker]:
        return self.sp.start(node, spot)

    def serve(self, worker: Worker, kinds: Collection[Kind], version: int) -> bool:
        return self.sp.serve(worker, kinds, version)

    def serve_crew(self, workers: Sequence[Worker], version: int, at_most: int | None = None) -> bool:
        return self.sp.serve_crew(workers, version, at_most)

    def changed(self, nodes: Collection[Node]) -> None:
        self.sp.changed(nodes)

    def cancelled(self, kind: Kind) -> None:
        self.sp.cancelled(kind)

    def notify(self, worker: Worker, notice: PreemptionNotice) -> None:
        self.sp.notify(worker, notice)

    def stop(self, worker: Worker, lost: bool) -> None:
        self.sp.stop(worker, lost)

    def wait(self, until: float | None, pending: Sequence[Pending] = ()) -> list[Event]:
        return self.sp.wait(until, pending)

    # ---- what RayRuntime calls besides ------------------------------------------------------------

    def publish(self, version: int, weights: Any, workers: list[Worker]) -> None:
        """New weights (`weights`: the learner's ObjectRef) for every live node's members, and for
        every node that joins from now on. `workers`: the engine's (every group is served by it)."""
        self.weights = weights
        self.sp.publish(version, weights)

    def worker_nodes(self, worker: str) -> tuple[str, ...]:
        """The nodes group `worker`'s members ran on (a queue worker name is a group's: g1, g2, ...)."""
        return self.sp.spans.get(worker, ())

    def stats(self) -> dict[str, float]:
        """`sp_regroups` and `sp_regroup_s` (see the module docstring)."""
        return self.sp.stats()

    def close(self) -> None:
        """Stop every member and node agent."""
        self.sp.close()
