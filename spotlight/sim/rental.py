"""Renting only what pays: how many of the spot nodes on offer a run holds for its next iteration.

A spot node is worth its price only while the seconds it takes off an iteration are worth more than
it costs. Before an iteration the run holds `held` nodes and could hold up to `available` (those and
the ones the provider offers that it does not rent), each a block of `block` GPUs. With s spot GPUs
held, the iteration's modelled seconds are (`IterationModel.seconds`)

    T(s) = R / (G + s) + U(s) + F
    U(s) = min(W / G, W / (e·(G + s)) + r)    the update on the fleet where that is sooner
    U(s) = W / G                              the update on the on-demand GPUs alone

(the simulator gives the fleet's update at the runtime's grain instead of the fluid
W / (e·(G + s)) + r: `IterationModel.fleet_update_s`)

with R the rollout's GPU-seconds, W the update's (at the trainer's efficiency), G the on-demand GPUs,
e a fleet executor's update rate (any GPU: `fleet_update_efficiency`) over a trainer GPU's
(`train_efficiency`), r what a round adds after the fleet's compute (the gather the compute does
not hide, and the step) and F the weight sync: r and F are the seconds no spot GPU shortens. The iteration costs (`RentalRule.iteration_usd`)

    C(s) = (G·p_od + s·p_spot) · T(s)          dollars; prices per GPU-second

and the three objectives choose the nodes n to hold (`choose`, `RentalRule.nodes`):

- `time`: every available node (the soonest: T never rises with s). What the spot policies always did.
- `cost`: the n that minimises  H·C(n·b) + J·|n - held|,  with J = b·p_spot·join_s the join a newly
  rented node pays before it serves and H the iterations the choice should last (the forecast of
  the iterations left). A release is charged J too — the node, should it pay again, is re-rented at
  J — so a held node is kept unless releasing it saves more than J over H: the count does not flap
  when the saving is within a join's cost. Of the n scored within `MODEL_TOLERANCE` (5%) of the
  least, the most are held: a smaller fleet must save more than the model's own error (it favours
  small fleets by ~9%, measured) to be chosen over a sooner one.
- `deadline`: among the n whose forecast H·T(n·b)·pace fits in the seconds left, the one with the
  least cost score; if none fits, every available node. `pace` is the measured seconds of the
  iterations so far over their modelled seconds (1 before any), which carries what T leaves out.

Without the update on the fleet C is convex in x = G + s with its minimum at
x* = sqrt(G·(p_od - p_spot)·R / (p_spot·K)), K = W/G + F, and a first spot GPU (so any) pays only
while p_spot < p_od·R / (R + (G + 1)·K) (tests/spotlight/sim/test_rental.py checks both).

The on-demand GPUs are chosen too under `cost` and `deadline` (`choose_ondemand`), once, before the
first iteration: for each count G of `ondemand_candidates` (1, 2, 4, ... up to the run's `--gpus`) the
rule above, exact (tolerance 0), picks its spot nodes from those on offer then, and the objective
picks the G whose iteration is cheapest (`deadline`: the cheapest whose forecast meets the deadline,
else every GPU), exactly: the rules' `tolerance` corrects a bias of the model on spot fleets, and applied to the
on-demand count it would hold every GPU whenever no spot is on offer at the start (on-demand GPUs
alone cost about the same at every count) — no cost choice at all.
Once, because on-demand capacity does not come and go as spot does, and a live run holds the
on-demand workers its config names (`runtime.ondemand_workers`): the simulator answers which count
to write there. `time` keeps `--gpus`.

What it assumes: T is a fluid — no tails, regroups, joins or preemption losses (the deadline's
`pace` corrects for them; the cost's choice does not need to where they scale T alike for every
n); a spot GPU is worth the seconds it saves, not the exploration it may do (its value to the
learning signal is not counted); each iteration brings the same progress, so the cheapest
iteration is the cheapest run to the target.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

OBJECTIVES = ("time", "cost", "deadline")
"""What the spot nodes held are chosen for: the soonest run, the cheapest, or the cheapest in time."""


@dataclass(frozen=True)
class IterationModel:
    """One iteration's seconds against the spot GPUs held (the module docstring's T(s))."""

    ondemand_gpus: int
    """G: on-demand GPUs (they roll out and train; always held)."""
    rollout_gpu_s: float
    """R: the rollout's work in GPU-seconds at the most efficient SP degree."""
    update_gpu_s: float
    """W: the update's work in seconds of one trainer GPU (its efficiency included)."""
    fixed_s: float
    """F: seconds of every iteration that no GPU shortens (the weight sync)."""
    fleet_efficiency: float = 1.0
    """e: a fleet executor's rate on the update (on-demand and spot GPUs alike), over a trainer GPU's."""
    update_round_s: float = 0.0
    """r: the learner's gather-and-step after an update on the fleet."""
    fleet_update: bool = False
    """The spot GPUs compute the update too, where that is sooner than the on-demand GPUs alone."""
    fleet_update_s: Callable[[float], float] | None = None
    """The update on the fleet with s spot GPUs held, at the runtime's grain — its requests on the
    nodes' crews and its gradients through the learner's link (the simulator's
    `Simulation._round_s`) — instead of the fluid W / (e·(G + s)) + r, which a run with few GPUs
    beats by far (a request of 8 micro-batches on a node's 2 GPUs takes 4 micro-batch times)."""

    def __post_init__(self) -> None:
        if self.ondemand_gpus < 1:
            raise ValueError(f"ondemand_gpus: expected >= 1, got {self.ondemand_gpus}")
        if min(self.rollout_gpu_s, self.update_gpu_s, self.fixed_s, self.update_round_s) < 0:
            raise ValueError("rollout_gpu_s, update_gpu_s, fixed_s, update_round_s: expected >= 0")
        if not 0 < self.fleet_efficiency:
            raise ValueError(f"fleet_efficiency: expected > 0, got {self.fleet_efficiency}")

    def update_s(self, spot_gpus: float) -> float:
        g, w = self.ondemand_gpus, self.update_gpu_s
        alone = w / g
        if not self.fleet_update or spot_gpus <= 0:
            return alone
        if self.fleet_update_s is not None:
            return min(alone, self.fleet_update_s(spot_gpus))
        return min(alone, w / (self.fleet_efficiency * (g + spot_gpus)) + self.update_round_s)

    def seconds(self, spot_gpus: float) -> float:
        """T(s): the iteration's seconds with `spot_gpus` spot GPUs held (a scalar, s >= 0)."""
        return self.rollout_gpu_s / (self.ondemand_gpus + spot_gpus) + self.update_s(spot_gpus) + self.fixed_s


MODEL_TOLERANCE = 0.05
"""A live run's rule (`RentalRule.tolerance`, as `spotlight.sim.simulation` makes it) takes the
most nodes whose score is within this fraction of the cheapest (`choose`'s `tolerance`): a smaller fleet must save more than the model's own error to be chosen
over a sooner one. Measured on `bamboo-p3.csv` (a trace the figure is not checked on later) with one
on-demand GPU: the model's T is 2.2% slower than the simulated iteration at 57 spot GPUs held and
7.1% faster at 27 — a bias of ~9% towards the smaller fleet (tails and the update's grain at few
GPUs). The oracle chooses exactly (0): it prices its own exact fluid."""


def choose(objective: str, held: int, options: Sequence[tuple[float, float]], join_usd: float = 0.0,
           horizon: float = 1.0, seconds_left: float | None = None, pace: float = 1.0,
           tolerance: float = 0.0) -> int:
    """The nodes to hold, 0..len(options) - 1, by `objective` (the module docstring's rule).

    `options[n]` = (seconds, dollars) of the iteration with n nodes held, n = 0..available (the
    modelled T and C, or the oracle's exact fluid); `held`: nodes held now; `join_usd`: J, what a
    newly rented node pays before it serves; `horizon`: H, iterations the choice should last (>= 1
    is sensible; the forecast of the iterations left); `seconds_left` (deadline only): until the
    deadline; `pace`: measured over modelled seconds so far; `tolerance`: the most nodes whose
    score is within this fraction of the least is taken (`MODEL_TOLERANCE`; 0: the least, ties to
    more nodes, sooner).
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective: expected one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if not options:
        raise ValueError("options: expected at least the option of holding no node")
    most = len(options) - 1
    if objective == "time":
        return most

    def score(n: int) -> float:
        return horizon * options[n][1] + join_usd * abs(n - held)

    candidates = range(len(options))
    if objective == "deadline":
        if seconds_left is None:
            raise ValueError("seconds_left: required with the deadline objective")
        candidates = [n for n in candidates if horizon * options[n][0] * pace <= seconds_left]
        if not candidates:
            return most  # late whatever is held: as soon as possible
    least = min(score(n) for n in candidates)
    return max(n for n in candidates if score(n) <= least + abs(least) * tolerance)


@dataclass(frozen=True)
class RentalRule:
    """`choose` over the modelled iteration (`IterationModel`), for nodes of `block` GPUs."""

    objective: str
    model: IterationModel
    block: int
    """GPUs per spot node."""
    ondemand_usd_h: float
    """Per on-demand GPU-hour."""
    spot_usd_h: float
    """Per spot GPU-hour."""
    join_s: float = 0.0
    """Seconds a newly rented node is paid before it serves."""
    tolerance: float = 0.0
    """The most nodes scored within this fraction of the cheapest are held (`choose`): a live run's
    rule takes `MODEL_TOLERANCE`, the closed forms 0."""

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective: expected one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.block < 1:
            raise ValueError(f"block: expected >= 1 GPU per node, got {self.block}")
        if min(self.ondemand_usd_h, self.spot_usd_h, self.join_s) < 0:
            raise ValueError("ondemand_usd_h, spot_usd_h, join_s: expected >= 0")

    def iteration_usd(self, spot_gpus: float) -> float:
        """C(s): dollars of one iteration with `spot_gpus` spot GPUs held."""
        rate_usd_h = self.model.ondemand_gpus * self.ondemand_usd_h + spot_gpus * self.spot_usd_h
        return rate_usd_h * self.model.seconds(spot_gpus) / 3600.0

    @property
    def join_usd(self) -> float:
        """J: a node's join, paid and not serving."""
        return self.block * self.spot_usd_h * self.join_s / 3600.0

    def nodes(self, held: int, available: int, horizon: float = 1.0, seconds_left: float | None = None,
              pace: float = 1.0) -> int:
        """The nodes to hold of `available` (`choose`'s arguments; `held` is clamped to it)."""
        options = [(self.model.seconds(n * self.block), self.iteration_usd(n * self.block))
                   for n in range(available + 1)]
        return choose(self.objective, min(held, available), options, self.join_usd, horizon, seconds_left, pace,
                      self.tolerance)


def ondemand_candidates(most: int) -> list[int]:
    """The on-demand GPU counts a renting run weighs (`choose_ondemand`): 1, 2, 4, ... below `most`, and `most`."""
    counts, g = [], 1
    while g < most:
        counts.append(g)
        g *= 2
    return counts + [most]


def choose_ondemand(objective: str, rules: dict[int, RentalRule], offered: int, horizon: float = 1.0,
                    seconds_left: float | None = None) -> int:
    """The on-demand GPUs to hold (a key of `rules`: count -> the rental rule with that many) with
    `offered` spot nodes on offer, each count's spot nodes chosen by its rule (module docstring; a
    simulation prices the counts with exact rules, tolerance 0: each at its cheapest).
    `time` (or no choice that meets a deadline): the most."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective: expected one of {', '.join(OBJECTIVES)}, got {objective!r}")
    most = max(rules)
    if objective == "time":
        return most
    options = {}
    for g, rule in rules.items():
        n = rule.nodes(offered, offered, horizon, seconds_left)
        options[g] = (rule.model.seconds(n * rule.block), rule.iteration_usd(n * rule.block))
    fits = [g for g in rules if seconds_left is None or horizon * options[g][0] <= seconds_left]
    if not fits:
        return most
    # Exactly the cheapest count (ties to the most GPUs: sooner), never within a tolerance: on-demand
    # GPUs alone cost about the same at every count (C(G) = p (R + W + G F)), so a tolerance here
    # would hold all of them whenever no spot is on offer at the start: no cost choice at all.
    return min(fits, key=lambda g: (options[g][1], -g))
