"""The fleet of a real Ray cluster: which node runs what, and the engine told when nodes come and go.

Placement (the rule every role follows on a cluster joined with `runtime.address`):
- a **spot node** is one that advertises the `spot` custom resource; `spot: N` means N rollout
  executors (one per GPU on a GPU node). Spot executors run only there, each holding one unit of
  `spot` (and one GPU where the node has GPUs), pinned to their node, so they spread over every
  spot node by construction;
- an **on-demand node** is any node without `spot`. The learner, the request queue and the reward
  worker run on the node the controller runs on (it keeps the learner's checkpoints on the disk the
  run folder is on), which must therefore be an on-demand node; on-demand rollout workers go round
  the on-demand nodes, the controller's first.

Following the cluster (`ClusterFleet.poll`, once a second at most, from the engine's loop):
- a node Ray reports dead (or gone) → `FleetEngine.kill`: its workers are lost, their requests
  re-queued from the last commit;
- a spot node that joins → `FleetEngine.add`: executors start on it and pull at once;
- a node Ray drains (`ray drain-node`, or a cloud integration that turns a preemption notice into
  a drain) → `FleetEngine.notice`: its workers give their requests back at the next step boundary;
- no spot node for `runtime.spot_wait_s` while the run wants spot workers → one line, then
  `spot_workers` rollout workers on the controller's node in their place (`spot_fallback: true`),
  or the same line again every `spot_wait_s` while the run waits (`false`).

A local cluster started for the run has one node: there the fleet is the replayed one
(`fleet_nodes` + trace actions), and nothing here is used.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import ray

from cloud.cost import Fleet
from schedulers.clock import Clock
from schedulers.fleet import FleetEngine, Node
from schedulers.preemption import Cause, PreemptionNotice
from spotlight.config import ConfigError, RuntimeConfig
from spotlight.runtime.ray_cluster import SPOT_RESOURCE

logger = logging.getLogger(__name__)

POLL_S = 1.0
"""How often the cluster's node table is read (one GCS call)."""
RESTART_AFTER_S = 30.0
"""A worker died but Ray still reports its node alive this long after: the worker died alone (its
process, not the node), so the node's executors start again. Longer than Ray's own detection of a
dead node (health checks: 15 s by default), so a node that is really gone is not restarted."""


@dataclass(frozen=True)
class ClusterNode:
    """One alive node of the cluster, as Ray reports it."""

    id: str
    ip: str
    spot_units: int
    gpus: int

    @property
    def spot(self) -> bool:
        return self.spot_units > 0


def alive_nodes() -> dict[str, ClusterNode]:
    """Every alive node of the cluster this process joined, by Ray node id."""
    nodes = {}
    for n in ray.nodes():
        if n.get("Alive"):
            res = n.get("Resources", {})
            nodes[n["NodeID"]] = ClusterNode(n["NodeID"], n.get("NodeManagerAddress", "?"),
                                             int(res.get(SPOT_RESOURCE, 0)), int(res.get("GPU", 0)))
    return nodes


def draining_nodes() -> dict[str, int]:
    """Node id -> drain deadline (ms since the epoch; 0: none) of every node Ray is draining."""
    try:
        return dict(ray._private.state.state.get_draining_nodes())
    except Exception:  # an older GCS, or none reachable this instant: no drains known
        return {}


def node_name(node: ClusterNode) -> str:
    """The fleet engine's name for a cluster node: readable, and unique per Ray node (a machine
    that rejoins is a new Ray node, so it gets a new name)."""
    return f"{'spot' if node.spot else 'ondemand'}@{node.ip}#{node.id[:6]}"


class ClusterFleet:
    """See the module docstring. `FleetSource` of the fleet engine."""

    def __init__(self, rt: RuntimeConfig, clock: Clock, poll_s: float = POLL_S) -> None:
        self.rt, self.clock, self.poll_s = rt, clock, poll_s
        self.controller = ray.get_runtime_context().get_node_id()
        self.known: dict[str, ClusterNode] = alive_nodes()
        here = self.known.get(self.controller)
        if here is not None and here.spot:
            raise ConfigError(f"runtime.address: this controller runs on a spot node ({here.ip} advertises "
                              f"`{SPOT_RESOURCE}`): run spotlight train on an on-demand node (the head), which "
                              "keeps the learner and its checkpoints")
        self.names: dict[str, str] = {}
        """Ray node id -> engine node name, for every node the engine was told of."""
        self._polled = clock.now()
        self._drained: set[str] = set()
        self._suspect: dict[str, float] = {}
        """Engine node name -> when a node the engine counts gone was first seen alive in Ray."""
        self._no_spot_since: float | None = None if self._spot_nodes() else clock.now()
        self._no_spot_said: float | None = None
        self.fallback: str | None = None
        """The engine node of the rollout workers started on the controller's node for want of spot."""

    # ---- the first fleet --------------------------------------------------------------------

    def nodes(self) -> list[Node]:
        """The engine's first fleet: `ondemand_workers` rollout workers round the on-demand nodes
        (the controller's first) and every spot node with its `spot` units as devices."""
        ondemand = sorted((n for n in self.known.values() if not n.spot), key=lambda n: n.id != self.controller)
        counts = dict.fromkeys((n.id for n in ondemand), 0)
        for i in range(self.rt.ondemand_workers):
            counts[ondemand[i % len(ondemand)].id] += 1
        fleet = [self._node(n, devices=counts[n.id]) for n in ondemand if counts[n.id]]
        fleet += [self._node(n, devices=n.spot_units) for n in self._spot_nodes()]
        return fleet

    def paid_fleet(self) -> Fleet:
        """What the cluster bills now — each alive node an instance, on-demand or spot — by the
        node table `poll` last read (the cost meter's fleet on a joined cluster, in place of the
        configured one)."""
        alive = self.known.values()
        return Fleet(ondemand=sum(not n.spot for n in alive), spot=sum(n.spot for n in alive))

    def gpus(self, node_id: str | None) -> int:
        n = self.known.get(node_id) if node_id else None
        return n.gpus if n is not None else 0

    def _node(self, n: ClusterNode, devices: int) -> Node:
        name = self.names[n.id] = node_name(n)
        return Node(name, spot=n.spot, devices=devices, cluster_id=n.id)

    def _spot_nodes(self) -> list[ClusterNode]:
        return sorted((n for n in self.known.values() if n.spot), key=lambda n: n.id)

    # ---- following the cluster ---------------------------------------------------------------

    def capacity_may_come(self) -> bool:
        return True  # a cluster may always gain a node; the wait is said aloud (`_no_spot`)

    def poll(self, engine: FleetEngine) -> None:
        now = self.clock.now()
        if now - self._polled < self.poll_s:
            return
        self._polled = now
        # Ray's view first: the executors started below read a new node's GPUs from it.
        alive = self.known = alive_nodes()
        for node_id, name in list(self.names.items()):
            n = engine.nodes.get(name)
            if n is None:
                continue
            if node_id not in alive:
                self._suspect.pop(name, None)
                if n.alive:
                    logger.info(f"node {name} is gone: its rollout executors are lost, their requests re-queued")
                    engine.kill(name)
            elif not n.alive and not n.noticed:  # a worker of it died, yet Ray says the node lives
                self._restart_later(engine, name, now)
            else:
                self._suspect.pop(name, None)
        fallback = engine.nodes.get(self.fallback) if self.fallback else None
        if fallback is not None and self.controller in alive and not fallback.alive:
            self._restart_later(engine, self.fallback, now)
        for node_id, deadline_ms in draining_nodes().items():
            name = self.names.get(node_id)
            if name in engine.nodes and node_id not in self._drained and engine.nodes[name].alive:
                self._drained.add(node_id)
                logger.info(f"node {name} is being drained: its rollout executors give their requests back")
                engine.notice(name, PreemptionNotice(Cause.RAY_DRAIN, None, name,
                                                     detail=f"drain deadline {deadline_ms} ms" if deadline_ms else ""))
        for node_id, n in alive.items():
            if n.spot and node_id not in self.names and engine.spot_allowed:
                node = self._node(n, devices=n.spot_units)
                logger.info(f"spot node {node.name} joined: {n.spot_units} rollout executor(s) start on it")
                engine.add(node.name, spot=True, devices=node.devices, cluster_id=node_id)
        self._no_spot(engine, now)

    def _restart_later(self, engine: FleetEngine, name: str, now: float) -> None:
        """Start node `name`'s executors again once it has outlived them for `RESTART_AFTER_S`."""
        since = self._suspect.setdefault(name, now)
        if now - since >= RESTART_AFTER_S:
            del self._suspect[name]
            logger.info(f"node {name} outlived its rollout executors: starting them again")
            engine.restart(name)

    def _no_spot(self, engine: FleetEngine, now: float) -> None:
        if self.rt.spot_workers == 0 or self.fallback or not engine.spot_allowed or any(
                n.spot and n.alive for n in engine.nodes.values()):
            self._no_spot_since = self._no_spot_said = None
            return
        if self._no_spot_since is None:
            self._no_spot_since = now
        waited = now - self._no_spot_since
        if waited < self.rt.spot_wait_s or (self._no_spot_said is not None
                                            and now - self._no_spot_said < self.rt.spot_wait_s):
            return
        self._no_spot_said = now
        if self.rt.spot_fallback:
            here = self.known[self.controller]
            self.fallback = f"fallback@{here.ip}#{here.id[:6]}"
            logger.info(f"no spot capacity for {waited:.0f} s (no node advertises `{SPOT_RESOURCE}`): starting "
                        f"{self.rt.spot_workers} rollout worker(s) on the on-demand node {here.ip} in its place "
                        "(runtime.spot_fallback)")
            engine.add(self.fallback, spot=False, devices=self.rt.spot_workers, cluster_id=here.id)
        else:
            logger.info(f"no spot capacity for {waited:.0f} s (no node advertises `{SPOT_RESOURCE}`): waiting for a "
                        f"spot node to join (runtime.spot_fallback: false; Ctrl-C stops the run)")


def placement(node_id: str | None, spot: bool, gpus: int, local: bool) -> dict[str, Any]:
    """Ray actor options that put a rollout executor on `node_id` (None: anywhere), holding one
    unit of `spot` on a spot node (a sliver on the one-node local cluster) and one GPU where the
    node has GPUs."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from spotlight.runtime.ray_cluster import SPOT_SLIVER

    options: dict[str, Any] = {}
    if spot:
        options["resources"] = {SPOT_RESOURCE: SPOT_SLIVER if local else 1.0}
    if gpus:
        options["num_gpus"] = 1
    if node_id is not None:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return options
