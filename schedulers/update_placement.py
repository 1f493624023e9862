"""Where the next update runs when the config leaves it to the run (`train.update_on: auto`): on the
learner alone, or on the fleet (`schedulers/update.py`) — whichever its own updates measured faster.

The weights do not depend on the choice (the fleet's parts are summed in micro-batch order, as the
learner sums them), so it is free to change every iteration and needs no checkpoint: a resumed run
measures again. What it measures moves with the fleet (spot workers join and leave, the machines
are shared), so the place not chosen is tried again every `retry_every` updates.

Only seconds are priced here. The other use of the spot workers' time during a learner-only update
— exploring the next iteration's seeds — is priced against them by the simulator, which has a
progress model to turn explored seeds into iterations saved (docs/simulator.md, "What the spot
GPUs do during an update"); on the fleets it simulated the update's seconds won every time.
"""

from __future__ import annotations

PLACES = ("learner", "fleet", "auto")


class UpdatePlacement:
    def __init__(self, update_on: str, retry_every: int = 10) -> None:
        if update_on not in PLACES:
            raise ValueError(f"update_on must be one of {PLACES}, got {update_on!r}")
        if retry_every < 2:
            raise ValueError(f"retry_every must be >= 2, got {retry_every!r}")
        self.update_on = update_on
        self.retry_every = retry_every
        self.seconds: dict[bool, float] = {}
        """On the fleet (True) or not -> the seconds its last update there took."""
        self.updates = 0

    def on_fleet(self) -> bool:
        """Where the next update runs: as configured, or for `auto` the learner first, then the
        fleet, then the faster of the two, the other again every `retry_every` updates."""
        if self.update_on != "auto":
            return self.update_on == "fleet"
        for place in (False, True):
            if place not in self.seconds:
                return place
        faster = self.seconds[True] < self.seconds[False]
        return not faster if self.updates % self.retry_every == 0 else faster

    def measured(self, on_fleet: bool, seconds: float) -> None:
        self.seconds[on_fleet] = seconds
        self.updates += 1
