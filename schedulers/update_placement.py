"""Where the next update runs when the config leaves it to the run (`train.update_on: auto`): on the
learner alone, or on the fleet (`schedulers/update.py`) — whichever its own updates measured faster.

The weights do not depend on the choice (the fleet's parts are summed in micro-batch order, as the
learner sums them), so it is free to change every iteration and needs no checkpoint: a resumed run
measures again. What it measures moves with the fleet (spot workers join and leave, the machines
are shared), so the place not chosen is tried again every `retry_every` updates.

Only seconds are measured here. The other use of the spot workers' time during a learner-only
update — exploring the next iteration's seeds — can be priced against them only with a model of
progress: the simulator has one and passes its priced choice as `prefer` (docs/simulator.md, "What
the spot GPUs do during an update"); a live run has none and goes by its measured seconds. The one
rule is used by both through `spotlight.iteration.iteration_controller`.
"""

from __future__ import annotations

from collections.abc import Callable

PLACES = ("learner", "fleet", "auto")

SP_ROLLOUT_ONLY = "SP groups compute rollouts only"
"""Why a run with SP groups cannot compute its update on the fleet: an SP group holds a sequence
shard per member, and the fleet update's micro-batches are whole samples."""


def fleet_update_refusal(sp_degree: int, memory: str | None = None) -> str | None:
    """Why the fleet cannot compute a run's update — the same reason `spotlight train` refuses
    `train.update_on: fleet` for, and for which `auto` and the simulator keep the update on the
    learner: workers that are SP groups (`sp_degree` > 1), or `memory`, the reason a spot GPU cannot
    hold what the update needs (None: it can). None: the fleet can."""
    if sp_degree > 1:
        return f"SP degree {sp_degree}: {SP_ROLLOUT_ONLY}"
    return memory


class UpdatePlacement:
    def __init__(self, update_on: str, retry_every: int = 10, prefer: Callable[[], bool] | None = None) -> None:
        """`prefer()`: for `auto`, a priced choice (True: the fleet) that replaces the measured
        rule — the simulator's, which prices exploration too; None: the measured rule."""
        if update_on not in PLACES:
            raise ValueError(f"update_on must be one of {PLACES}, got {update_on!r}")
        if retry_every < 2:
            raise ValueError(f"retry_every must be >= 2, got {retry_every!r}")
        self.update_on = update_on
        self.retry_every = retry_every
        self.seconds: dict[bool, float] = {}
        """On the fleet (True) or not -> the seconds its last update there took."""
        self.updates = 0
        self.prefer = prefer

    def on_fleet(self) -> bool:
        """Where the next update runs: as configured, or for `auto` the learner first, then the
        fleet, then the faster of the two, the other again every `retry_every` updates."""
        if self.update_on != "auto":
            return self.update_on == "fleet"
        if self.prefer is not None:
            return self.prefer()
        for place in (False, True):
            if place not in self.seconds:
                return place
        faster = self.seconds[True] < self.seconds[False]
        return not faster if self.updates % self.retry_every == 0 else faster

    def measured(self, on_fleet: bool, seconds: float) -> None:
        self.seconds[on_fleet] = seconds
        self.updates += 1
