"""Elastic SP groups as the fleet engine's executor: the engine's workers are the coordinator's groups.

`SPExecutor` implements `schedulers.fleet.Executor` over an engine-driven `coordinator.Coordinator`
(`engine_driven=True`) and its node agents (`agent.NodeAgent` in this process, or
`ray_agent.RayAgent`):

- a fleet node is one agent's node, and its devices are the members started on it (one member
  process per device, named NODE.GENERATION#j, so a node that joins again brings new names);
- the engine's *workers* are the coordinator's SP groups. The coordinator forms them by the live
  regroup policy whenever membership changes (`regroup_policy.regroup`): a formed group is
  reported `Ready`, a group it re-plans away while idle `Dissolved`, a group a member's death
  broke `Died` (a death the engine did not cause itself: its own kills are already accounted);
- the engine decides when a group serves (`serve` -> `Coordinator.serve`); a serving group pulls on
  after each completion and reports `Served` when the queue has nothing more for it;
- a notice retires the node's members (`Coordinator.retire`: a computing group gives its request
  back at the next committed step, then `Served(noticed=True)`) — the engine's (a drain, a replayed
  trace) through `notify` and `changed`, or the node's own (its agent's watcher: `Agent.notice`),
  which `wait` takes in and handles the same way (`_node_noticed`), reporting the groups it ends
  `Served(noticed=True)` as a worker reports a notice it saw itself; a death kills them
  (`Coordinator.kill`), and the group's request is re-queued from its last commit once (the
  coordinator's `_dissolve` and the engine both call `PullQueue.worker_lost`; the second finds
  nothing left).

Who models what: nothing is modelled here — members compute for real (gloo on CPU, NCCL on GPUs),
the regroup policy plans with the coordinator's step-time model, and time is the coordinator's
clock (a `WallClock`: processes do not run on a `ManualClock`).

Where it blocks (the engine expects workers to exist once it has started a node): `start` returns
when the node's members are ready and grouped — the engine's first phase then starts with the whole
first fleet; a node joining mid-phase holds the engine's dispatch of *idle* groups for the member
start (~0.4 s from the fork server on CPU, seconds for a real model's node copy) while serving
groups go on, as they pull by themselves. `changed` and a lost worker's `stop` return once the
coordinator has seen the deaths they caused (so it never re-plans a dead member into a group) and
formed the groups it re-planned (a rendezvous, ~0.08 s at degree 2 on CPU), so the engine's next
look finds them. The ends of groups a re-plan replaced are reported with the new groups, not before
(`_collect`): the engine never sees a fleet emptier than it is.

Weights: `publish(version, state)` hands every live node's agent the new weights (it makes them
the node's live copy and its members load them after what they were told before: `protocol.Load`),
and the groups serve that version from then on; serving another version than the one published is
an error. An exploration request is sampled with the builder's explorer (`exploration.num_steps`,
`exploration.ode`). A result is the committed `SampleState` (trajectory and log-probs; nothing
decoded), or with `spec.finish` what the builder's `finish` makes of it (`spotlight train` on Ray:
`spotlight.runtime.ray_sp`, whose agents are Ray actors, `ray_agent`).

Invariants (tests/schedulers/test_fleet_contract.py: the contract's scenario beside the in-process, Ray and
modelled executors; a notice and a death mid-request; regrouping in place as nodes join and die;
tests/spotlight/runtime/test_sp_train.py: publishing, exploration's own sampler and `spec.finish` in training runs):
the same engine and queue counters as every other executor; with degree-1 groups results
bit-identical to a `RolloutWorker`'s, a request given back or re-queued included; a group is
reported `Ready` once, and ends with one report — `Served(noticed=True)`, `Died` or `Dissolved` —
unless the engine ended it first (then none).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any

from elastic_sp.agent import Agent
from elastic_sp.coordinator import Coordinator, GroupPhase
from schedulers.fleet import Died, Dissolved, Event, Node, Pending, Ready, Served, Worker
from schedulers.preemption import PreemptionNotice
from schedulers.request import Kind
from schedulers.update_placement import SP_ROLLOUT_ONLY

POLL_S = 0.05
"""Longest single wait on the members' pipes: how often `wait` re-checks its deadline and pendings."""


class SPExecutor:
    """See the module docstring. `agent_for(node)` makes the agent of a node that joins (a new one
    at every join: a preempted node's agent went with it)."""

    def __init__(self, coordinator: Coordinator, agent_for: Callable[[Node], Agent], version: int = 0,
                 start_timeout_s: float = 300.0, keep_events: bool = True) -> None:
        if not coordinator.engine_driven:
            raise ValueError("SPExecutor needs a coordinator made with engine_driven=True: the engine decides "
                             "when a group serves")
        self.coord = coordinator
        self.clock = coordinator.clock
        self.agent_for = agent_for
        self.version = version
        """The weight version every member holds."""
        self.start_timeout_s = start_timeout_s
        self.nodes: dict[str, Node] = {}
        """Every node started, by name (the engine's own objects: they say whether a node is alive)."""
        self.node_members: dict[str, list[str]] = {}
        """Node -> the members of its current join."""
        self.workers: dict[str, Worker] = {}
        """Groups reported `Ready` and not yet reported ended, by name."""
        self.spans: dict[str, tuple[str, ...]] = {}
        """Every group ever reported `Ready` -> the nodes its members ran on (which node computed what)."""
        self.keep_events = keep_events
        """Keep the coordinator's event log (tests and benchmarks read it); False: drop what has
        been translated (a training run commits an event per step for as long as it runs)."""
        self._seen = 0
        """Coordinator events already translated."""
        self._out: list[Event] = []
        self._ended: list[Event] = []
        """Died / Dissolved held while a re-plan's new groups are still forming (see `_collect`)."""
        self._noticed: dict[str, Agent] = {}
        """Node -> the agent whose own notice was handled (a node that joins again has a new agent)."""

    # ---- the executor interface -------------------------------------------------------------------

    def start(self, node: Node, spot: bool) -> list[Worker]:
        """Start a member per device of `node` and return once they are ready (or dead) and grouped;
        the groups formed are reported `Ready` by the next `wait`."""
        self.coord.attach(self.agent_for(node))
        names = [f"{node.name}.{node.generation}#{j}" for j in range(node.devices)]
        self.nodes[node.name] = node
        self.node_members[node.name] = names
        for name in names:
            self.coord.add(node.name, name)
        handles = [self.coord.members[n] for n in names]
        self.coord.run_until(lambda: all(h.ready is not None or not h.alive for h in handles),
                             self.start_timeout_s, f"node {node.name}'s members to start")
        self._await_formed()
        self._collect()
        return []

    def serve(self, worker: Worker, kinds: Collection[Kind], version: int) -> bool:
        if version != self.version:
            raise RuntimeError(f"SP group {worker.name} holds weights v{self.version}, asked to serve v{version}: "
                               f"publish them first")
        if worker.name not in self.coord.groups:
            return True  # dissolved since: its Died / Dissolved is on its way and ends it
        return self.coord.serve(worker.name, sorted(kinds), version)

    def serve_crew(self, workers: Sequence[Worker], version: int, at_most: int | None = None) -> bool:
        raise RuntimeError(f"SP groups cannot serve the update's gradient work: {SP_ROLLOUT_ONLY}")

    def changed(self, nodes: Collection[Node]) -> None:
        """Members the engine's notices and deaths have not reached through a group (free ones,
        ones still starting) follow their node: retired on a noticed node, killed on a dead one.
        Returns once the coordinator has seen those deaths and formed the groups it re-planned, so
        the engine's next look (`FleetEngine.settle`) finds the fleet as it now is."""
        for n in nodes:
            live = [m for m in self.node_members.get(n.name, ()) if self.coord.members[m].alive]
            if not n.alive:
                for m in live:
                    self.coord.kill(m)
            elif n.noticed:
                self.coord.retire(*[m for m in live if m not in self.coord.retiring])
        self._await_deaths([m for n in nodes if not n.alive for m in self.node_members.get(n.name, ())])
        self._await_formed()
        self._collect()

    def cancelled(self, kind: Kind) -> None:
        self.coord.cancelled(kind)
        self._collect()

    def notify(self, worker: Worker, notice: PreemptionNotice) -> None:
        """The group's members on the noticed node retire (all of them when the notice names no node)."""
        g = self.coord.groups.get(worker.name)
        if g is not None:
            on = [m for m in g.members if notice.node is None or self.coord.members[m].node == notice.node]
            self.coord.retire(*on)
        if worker.name not in self.coord.groups:
            # It was idle, so the retirement dissolved it: the engine retires it now (or on the
            # Served it has not taken in yet), and needs no Dissolved.
            self.workers.pop(worker.name, None)
        self._collect()

    def stop(self, worker: Worker, lost: bool) -> None:
        """Lost: kill the group's members on dead nodes (all of them when none is dead: a reset, or
        spot nodes replaced by on-demand ones). Retired or dissolved: the coordinator has already
        stopped or re-planned its members."""
        self.workers.pop(worker.name, None)
        g = self.coord.groups.get(worker.name)
        if lost and g is not None:
            members = [m for m in g.members if self.coord.members[m].alive]
            dead = [m for m in members if not self.nodes[self.coord.members[m].node].alive]
            for m in dead or members:
                self.coord.kill(m)
            self._await_deaths(dead or members)
            self._await_formed()
        self._collect()

    def wait(self, until: float | None, pending: Sequence[Pending] = ()) -> list[Event]:
        """Poll the coordinator (it handles the members' reports and deaths, re-plans, pulls on)
        until it has something to report, a `pending` is done, or the clock reaches `until`."""
        while True:
            now = self.clock.now()
            left = None if until is None else until - now
            self.coord.poll(POLL_S if left is None else max(0.0, min(POLL_S, left)))
            self._take_notices()
            self._collect()
            if self._out or any(p.done() for p in pending) or (until is not None and self.clock.now() >= until):
                break
        out, self._out = self._out, []
        return out

    def publish(self, version: int, state: Any) -> None:
        """Weight version `version` (`state`: the weights as the agents take them — a state dict, or
        on Ray its ObjectRef) for every live node's members, after what they were told before; a
        node that joins later gets it from `agent_for`. Call it between phases (no group computing)."""
        for name, agent in self.coord.agents.items():
            node = self.nodes.get(name)
            if node is not None and node.alive and any(self.coord.members[m].alive for m in self.node_members[name]):
                agent.publish(version, state)
        self.version = version

    def stats(self) -> dict[str, float]:
        """In-place regroups (`Coordinator.regroups`): how many, and their seconds in all."""
        return {"sp_regroups": len(self.coord.regroups), "sp_regroup_s": sum(self.coord.regroups)}

    def close(self) -> None:
        """Stop every member and agent."""
        self.coord.close()

    # ---- internals --------------------------------------------------------------------------------

    def _take_notices(self) -> None:
        """Handle each live node's own notice (`Agent.notice`) once."""
        for name, agent in list(self.coord.agents.items()):
            node = self.nodes.get(name)
            if (agent.notice is None or self._noticed.get(name) is agent or node is None or not node.alive
                    or node.noticed):  # the engine noticed it first (a drain): handled already
                continue
            self._noticed[name] = agent
            self._node_noticed(name, agent.notice)

    def _node_noticed(self, node: str, notice: PreemptionNotice) -> None:
        """Node `node` saw a notice the engine did not send: what a drain of it does (`notify` each
        group with a member there — a computing one gives its request back at the next committed
        step, then reports `Served(noticed=True)` — and `changed`'s retiring of its free members),
        with an idle group the retirement dissolved reported `Served(noticed=True)` here, since
        the engine, which did not send the notice, does not retire it by itself."""
        notice = replace(notice, node=node)  # only this node's members: the group's others serve on
        for w in [w for w in self.workers.values() if node in w.nodes]:
            self.notify(w, notice)
            if w.name not in self.workers:
                self._out.append(Served(w.name, noticed=True))
        self.coord.retire(*[m for m in self.node_members.get(node, ())
                            if self.coord.members[m].alive and m not in self.coord.retiring])
        self._await_formed()

    def _await_formed(self) -> None:
        self.coord.run_until(lambda: not any(g.phase is GroupPhase.FORMING for g in self.coord.groups.values()),
                             self.start_timeout_s, "the re-planned groups to form")

    def _await_deaths(self, members: Sequence[str]) -> None:
        members = [m for m in members if m in self.coord.members]
        self.coord.run_until(lambda: not any(self.coord.members[m].alive for m in members), 60.0,
                             f"the coordinator to see {members} die")

    def _collect(self) -> None:
        """Translate the coordinator's new events into the engine's."""
        events = self.coord.events
        for e in events[self._seen:]:
            if e.kind == "formed":
                g = self.coord.groups.get(e.data["group"])
                if g is None or g.generation != e.data["generation"]:
                    continue  # dissolved again before anyone was told
                nodes = tuple(dict.fromkeys(self.coord.members[m].node for m in g.members))
                self.spans[g.name] = nodes
                w = Worker(g.name, nodes, any(self.nodes[n].spot for n in nodes), handle=g.name)
                self.workers[g.name] = w
                self._out.append(Ready(w))
            elif e.kind == "served":
                if e.data["group"] in self.workers:
                    self._out.append(Served(e.data["group"], noticed=e.data["noticed"]))
                    if e.data["noticed"]:  # it ends here: the engine retires it
                        del self.workers[e.data["group"]]
            elif e.kind == "dissolved":
                w = self.workers.pop(e.data["group"], None)
                if w is not None:  # the engine knows it: tell it how it ended
                    self._ended.append(Died(w.name) if e.data["lost"] else Dissolved(w.name))
        self._seen = len(events)
        if not self.keep_events:
            del events[:self._seen]
            self._seen = 0
        # A re-plan dissolves groups at once and reports the groups it forms a rendezvous later: the
        # engine hears of the ends together with the new groups, so it never sees a fleet emptier
        # than it is (with no worker left it would stop the phase for want of capacity). Meanwhile
        # a dissolved group it tells to serve just waits for its end (`serve` returns True).
        if self._ended and not any(g.phase is GroupPhase.FORMING for g in self.coord.groups.values()):
            self._out += self._ended
            self._ended = []
