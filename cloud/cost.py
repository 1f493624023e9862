"""Cost accounting and the two policies that act on it: a dollar budget and a deadline.

- `CostMeter` integrates dollars over clock time: every node of the fleet is paid per second at
  its price (spot or on-demand), from the moment the meter starts (instances are paid from launch)
  to the moment it is read. Invariant: the dollars spent never decrease, and a change of the fleet
  is paid at the new rate only from the moment it is made.
- `Forecast` predicts the next iteration's and a clean stop's (a checkpoint and final/) seconds:
  the slowest of the last `WINDOW` measured ones x (1 + `MARGIN`).
- `BudgetPolicy` decides, before each iteration, whether the run can afford it *and* a clean stop
  after it: it continues only while spent + rate x (next iteration + clean stop) <= budget.
- `DeadlinePolicy` decides when spot workers fall back to on-demand (the uniform-progress policy of
  "Can't Be Late", Wu et al., NSDI'24) and when the next iteration could no longer end in time.
- `CostControl` wires them for the controller: the trainer and the simulator call the same
  `before_iteration` / `after_iteration` with a wall or a simulated clock.

All time is read from an injected `Clock`; nothing here sleeps or touches a runtime.
"""

from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cloud.bounded_json import load_file
from schedulers.clock import Clock
from schedulers.input.files import ConfigError

MARGIN = 0.5
"""Forecasts are the slowest recent duration x 1.5. Tiny CPU iterations on a shared 2-core machine
vary by up to ~35% between neighbours (measured here: 1.08-1.47 s); a real GPU iteration varies
far less, and the margin then costs at most half an iteration of unspent budget."""
WINDOW = 5
"""Recent iterations the forecast looks at: long enough to see a slow one, short enough to follow
a fleet change (a switch to on-demand, lost spot workers)."""
PRIOR_FACTOR = 4.0
"""Before any iteration is measured, the forecast is the a-priori lower bound x 4. The bound is
2.8-3.8x under the tiny iterations measured here (6.9x for the tests' smallest LLM run;
`spotlight.iteration.iteration_time`), so x 4 is about one real iteration: a budget that can barely pay for the
first iteration may still be overrun by it. From the second iteration on, forecasts are measured."""


@dataclass(frozen=True)
class Fleet:
    """Nodes being paid for, by kind."""

    ondemand: int
    spot: int



class CostMeter:
    """Dollars spent by a fleet over clock time (module docstring). Prices are per node-hour."""

    def __init__(self, clock: Clock, ondemand_usd_h: float, spot_usd_h: float, fleet: Fleet,
                 spent_usd: float = 0.0) -> None:
        if min(ondemand_usd_h, spot_usd_h, spent_usd) < 0:
            raise ValueError("prices and dollars spent are >= 0")
        self.clock = clock
        self.ondemand_usd_h, self.spot_usd_h = ondemand_usd_h, spot_usd_h
        self.fleet = fleet
        self._settled_usd = spent_usd
        self._since = clock.now()
        self._stopped: float | None = None

    @property
    def rate_usd_h(self) -> float:
        return self.rate_usd_h_of(self.fleet)

    def rate_usd_h_of(self, fleet: Fleet) -> float:
        return fleet.ondemand * self.ondemand_usd_h + fleet.spot * self.spot_usd_h

    def spent_usd(self) -> float:
        now = self.clock.now() if self._stopped is None else self._stopped
        return self._settled_usd + self.rate_usd_h * max(0.0, now - self._since) / 3600.0

    def stop(self) -> None:
        """The run has ended (its final/ written): the dollars are what they are now, one figure for
        summary.json, cost.json and the store's status.json. Shutting the runtime down and the final
        push to a store come after and are not counted (a launched fleet's teardown is SkyPilot's)."""
        if self._stopped is None:
            self._stopped = self.clock.now()

    def restart(self) -> None:
        """Pay from now on only: the seconds since the meter started (or its last change) are not
        counted; what earlier sessions spent stays. A notional fleet is priced for the iterations'
        seconds, not for the start-up of the machine that stands in for it
        (`spotlight.train.cost_control.notional_fleet`)."""
        self._since = self.clock.now()

    def set_fleet(self, fleet: Fleet) -> None:
        """From now on, pay for `fleet` (what was run until now is settled at the old rate)."""
        self._settled_usd = self.spent_usd()
        self._since = self.clock.now()
        self.fleet = fleet


STOP_SLACK_S = 0.5
"""Seconds added to every clean-stop forecast: the stop also summarises the run, and a loaded
machine stalls for tens of milliseconds now and then — on tiny CPU runs whose iterations take
tens of milliseconds, such a stall alone overran a $3 budget by 2 cents. Nothing on a real run."""


class Forecast:
    """Durations of the next iteration and of a clean stop, from measured ones.

    Each is the slowest of the last `window` measured values x (1 + `margin`); before the first
    measurement, the prior x `PRIOR_FACTOR` (the priors are a-priori lower bounds). A clean stop is
    two checkpoint writes — the checkpoint of the iterations done and final/ (the same weights) —
    plus `STOP_SLACK_S`."""

    def __init__(self, prior_iteration_s: float, prior_checkpoint_s: float, margin: float = MARGIN,
                 window: int = WINDOW, reserve_s: float = 0.0) -> None:
        self.prior_iteration_s, self.prior_checkpoint_s = prior_iteration_s, prior_checkpoint_s
        self.reserve_s = reserve_s
        """Seconds added to every clean stop besides the writes: what one more setback between two
        checks may cost (a restart-from-checkpoint run: a cold start and a restore)."""
        self.margin = margin
        self.iterations: deque[float] = deque(maxlen=window)
        self.checkpoints: deque[float] = deque(maxlen=window)

    def observe(self, iteration_s: float, checkpoint_s: float | None = None) -> None:
        """A finished iteration's seconds (its checkpoint excluded) and, if one was written, the checkpoint's."""
        self.iterations.append(max(0.0, iteration_s))
        if checkpoint_s is not None:
            self.checkpoints.append(max(0.0, checkpoint_s))

    def pace_s(self) -> float:
        """The recent pace without margin: the slowest recent iteration (or the prior)."""
        return max(self.iterations) if self.iterations else self.prior_iteration_s

    def iteration_s(self) -> float:
        if not self.iterations:
            return self.prior_iteration_s * PRIOR_FACTOR
        return max(self.iterations) * (1.0 + self.margin)

    def stop_s(self) -> float:
        writes = (2 * self.prior_checkpoint_s * PRIOR_FACTOR if not self.checkpoints
                  else 2 * max(self.checkpoints) * (1.0 + self.margin))
        return writes + STOP_SLACK_S + self.reserve_s


class BudgetPolicy:
    """Stop before the budget would be exceeded: run the next iteration only while
    spent + rate x (next iteration + clean stop) <= budget, durations from `forecast`."""

    def __init__(self, budget_usd: float, forecast: Forecast) -> None:
        if not (math.isfinite(budget_usd) and budget_usd > 0):
            raise ValueError(f"a budget is a finite number of dollars > 0, got {budget_usd!r}")
        self.budget_usd = budget_usd
        self.forecast = forecast

    def forecast_usd(self, rate_usd_h: float) -> float:
        """Dollars the next iteration and a clean stop after it will cost at `rate_usd_h`."""
        return rate_usd_h * (self.forecast.iteration_s() + self.forecast.stop_s()) / 3600.0

    def should_stop(self, spent_usd: float, forecast_usd: float) -> bool:
        return spent_usd + forecast_usd > self.budget_usd

    def affordable(self, spent_usd: float, rate_usd_h: float, lower_bound_s: float) -> bool:
        """Whether what is left pays for one iteration of at least `lower_bound_s` (the pre-run check)."""
        return self.budget_usd - spent_usd >= rate_usd_h * lower_bound_s / 3600.0


class DeadlinePolicy:
    """When to fall back from spot to on-demand workers so that the run ends by the deadline.

    Uniform progress ("Can't Be Late", Wu et al., NSDI'24): progress should keep up with the
    straight line from where the iterations started, (t0, k0), to (deadline, total). At each
    iteration boundary the workers switch to on-demand when
    - the run is behind that line by more than `tolerance` iterations (spot capacity, lost to
      preemptions, made it fall behind), or
    - the safety net: the slack left — the deadline minus now minus the remaining iterations at the
      current pace — is less than `restart_s`, the overhead of bringing up replacement workers;
      later it could not be absorbed any more.
    The switch is one-way. Unlike the paper's policy, which returns to spot when ahead, here every
    switch restarts workers (paying `restart_s` each time) and the run is behind *because* spot
    capacity proved unreliable; going back would gamble the slack that is left on the same
    capacity, and a one-way switch keeps the cost forecast monotone (the rate only rises once).

    Times are seconds on the controller's clock since the run started (the meter's origin).
    """

    def __init__(self, deadline_s: float, restart_s: float = 0.0, tolerance: float = 1.0) -> None:
        self.deadline_s = deadline_s
        self.restart_s = restart_s
        self.tolerance = tolerance
        self.origin: tuple[float, int] | None = None
        self.switched_at: int | None = None

    def start(self, now_s: float, done: int) -> None:
        """Iterations start now with `done` already done (a resumed run): the line's origin."""
        self.origin = (now_s, done)

    def expected_done(self, now_s: float, total: int) -> float:
        t0, k0 = self.origin if self.origin is not None else (0.0, 0)
        span = self.deadline_s - t0
        if span <= 0:
            return float(total)
        return k0 + (total - k0) * min(1.0, max(0.0, (now_s - t0) / span))

    def switch_reason(self, now_s: float, done: int, total: int, iteration_s: float) -> str | None:
        """Why the spot workers should switch to on-demand now, or None (always None once switched)."""
        if self.switched_at is not None or done >= total:
            return None
        expected = self.expected_done(now_s, total)
        if done < expected - self.tolerance:
            t0 = self.origin[0] if self.origin is not None else 0.0
            frac = (now_s - t0) / (self.deadline_s - t0) if self.deadline_s > t0 else 1.0
            return (f"behind uniform progress: {done} of {total} iterations done at {frac:.0%} of the time "
                    f"to the deadline, where the line asks for {expected:.1f}")
        left, till = total - done, self.deadline_s - now_s
        if till - left * iteration_s < self.restart_s:
            return (f"the {left} iterations left need {left * iteration_s:.1f} s at {iteration_s:.2f} s each, and "
                    f"{till:.1f} s remain before the deadline: less than that plus the restart overhead "
                    f"({self.restart_s:.1f} s)")
        return None

    def late(self, now_s: float, iteration_s: float, stop_s: float) -> bool:
        """Whether the next iteration and a clean stop after it would end past the deadline."""
        return now_s + iteration_s + stop_s > self.deadline_s


@dataclass(frozen=True)
class Decision:
    """What the controller does before an iteration: stop (with a reason), or switch the workers
    to on-demand first (`switch`), or neither. `message` is the log line's text."""

    stop: str | None = None
    switch: bool = False
    message: str = ""


class CostControl:
    """The controller's view of cost: the meter, a duration forecast, and the budget and deadline
    policies when set. Call `start(done)` when iterations begin, `before_iteration(step, total)`
    before each and act on its `Decision` (after a switch, call `switched(step)`), and
    `after_iteration(checkpoint_s)` after each."""

    def __init__(self, clock: Clock, meter: CostMeter, fleet_after_switch: Fleet, forecast: Forecast,
                 budget: BudgetPolicy | None = None, deadline: DeadlinePolicy | None = None,
                 price: Any = None, peak_fleet: Fleet | None = None) -> None:
        self.clock = clock
        self.meter = meter
        self.fleet_after_switch = fleet_after_switch
        self.forecast = forecast
        self.budget = budget
        self.deadline = deadline
        self.price = price
        """The `cloud.prices.NodePrice` the nodes are priced at (for the summary), if known."""
        self.peak_fleet = peak_fleet
        """The largest fleet the run may pay for before the next check (a simulated fleet grows
        as spot nodes join mid-iteration); None: the meter's fleet, which a live run keeps."""
        self.origin_s = clock.now()
        self._iteration_start: float | None = None
        self.switched_at: int | None = None

    def now_s(self) -> float:
        """Seconds since the meter started."""
        return self.clock.now() - self.origin_s

    def spent_usd(self) -> float:
        return self.meter.spent_usd()

    def stop(self) -> None:
        """The run's end: the meter stops (`CostMeter.stop`)."""
        self.meter.stop()

    def start(self, done: int, restart_s: float | None = None) -> None:
        """Iterations begin now, `done` of them already done; `restart_s`: what bringing up
        replacement workers costs in seconds (the deadline's safety net)."""
        if self.deadline is not None:
            self.deadline.start(self.now_s(), done)
            if restart_s is not None:
                self.deadline.restart_s = restart_s

    def before_iteration(self, step: int, total: int) -> Decision:
        """Whether to run iteration `step` (of `total`), and on which fleet. Budget first (with the
        rate after a switch, if one is due), then the deadline."""
        now, f = self.now_s(), self.forecast
        switch, message = False, ""
        if self.deadline is not None and self.meter.fleet.spot > 0:
            reason = self.deadline.switch_reason(now, step, total, f.pace_s())
            if reason is not None:
                switch, message = True, f"switching spot workers to on-demand at iteration {step}: {reason}"
        if self.budget is not None:
            fleet = self.fleet_after_switch if switch else self.peak_fleet or self.meter.fleet
            rate = self.meter.rate_usd_h_of(fleet)
            spent, ahead = self.spent_usd(), self.budget.forecast_usd(rate)
            if self.budget.should_stop(spent, ahead):
                return Decision("budget", False, (
                    f"stopping before iteration {step} for the budget: ${spent:.4g} spent + ${ahead:.4g} forecast "
                    f"for the next iteration and a clean stop ({f.iteration_s():.3g} s + {f.stop_s():.3g} s at "
                    f"${rate:.4g}/h) would exceed ${self.budget.budget_usd:.4g}"))
        if self.deadline is not None and self.deadline.late(now, f.iteration_s(), f.stop_s()):
            return Decision("deadline", False, (
                f"stopping before iteration {step} for the deadline: {now:.1f} s + {f.iteration_s():.3g} s forecast "
                f"for it + {f.stop_s():.3g} s to stop would end past {self.deadline.deadline_s:.1f} s"))
        self._iteration_start = self.clock.now()
        return Decision(None, switch, message)

    def switched(self, step: int) -> None:
        """The workers run on-demand from iteration `step` on: pay for them as such."""
        self.meter.set_fleet(self.fleet_after_switch)
        self.switched_at = step
        if self.deadline is not None:
            self.deadline.switched_at = step

    def after_iteration(self, checkpoint_s: float | None = None) -> float:
        """The iteration begun at the last `before_iteration` is done (with a checkpoint of
        `checkpoint_s` seconds, if one was written); returns the dollars spent so far."""
        if self._iteration_start is not None:
            self.forecast.observe(self.clock.now() - self._iteration_start - (checkpoint_s or 0.0), checkpoint_s)
            self._iteration_start = None
        return self.spent_usd()

    def summary(self) -> dict[str, Any]:
        """summary.json's cost fields (`stop_reason` is the controller's)."""
        out: dict[str, Any] = {
            "cost_usd": self.spent_usd(),
            "budget_usd": self.budget.budget_usd if self.budget is not None else None,
            "deadline_h": self.deadline.deadline_s / 3600.0 if self.deadline is not None else None,
            "ondemand_switch_step": self.switched_at,
            "cost_rate_usd_h": self.meter.rate_usd_h,
            "fleet": {"ondemand_nodes": self.meter.fleet.ondemand, "spot_nodes": self.meter.fleet.spot},
        }
        if self.price is not None:
            out["node_price"] = {"instance_type": self.price.row.instance_type, "gpu": self.price.row.gpu,
                                 "gpus": self.price.gpus, "ondemand_usd_h": self.meter.ondemand_usd_h,
                                 "spot_usd_h": self.meter.spot_usd_h}
        return out


def scaled(scale: float) -> str:
    return f", x {scale:g} (cloud.price_scale)" if scale != 1.0 else ""


# ---- what a run has spent, across resumes -------------------------------------------------------

SPENT_FILE = "cost.json"
"""In the run folder: {"cost_usd": dollars every session of the run spent so far, "startup_s": the
last session's start-up seconds (warm-start training aside)}. A resumed run adds to the dollars, and
its pre-run check asks the budget left to pay for a start-up like the last one plus one iteration."""
MAX_SPENT_BYTES = 64 * 1024
"""cost.json is read with at most this: it is ~50 bytes, so a larger file is not one."""


@dataclass(frozen=True)
class Spent:
    cost_usd: float = 0.0
    startup_s: float = 0.0


def load_spent(run_dir: Path) -> Spent:
    """What earlier sessions of the run in `run_dir` spent (nothing for a new run)."""
    path = Path(run_dir) / SPENT_FILE
    if not path.is_file():
        return Spent()
    try:
        data = load_file(path, max_bytes=MAX_SPENT_BYTES)  # bounded: too large, too deep, not JSON are ValueErrors
    except (OSError, ValueError):
        data = None
    return spent_of(data, str(path))


def spent_of(data: Any, where: str) -> Spent:
    """The `Spent` a cost.json's parsed `data` records; a ConfigError naming `where` when it is not one."""
    try:
        spent = Spent(float(data["cost_usd"]), float(data.get("startup_s", 0.0)))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ConfigError(f"{where}: expected {{\"cost_usd\": dollars, \"startup_s\": seconds}} (what earlier "
                          "sessions of this run spent); fix or delete it") from None
    for name, value in (("cost_usd", spent.cost_usd), ("startup_s", spent.startup_s)):
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{where}: {name}: expected a number >= 0, got {value!r}")
    return spent


def save_spent(run_dir: Path, spent: Spent) -> None:
    """Record what the run has spent so far (written whole, then renamed: never half a file)."""
    path = Path(run_dir) / SPENT_FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"cost_usd": spent.cost_usd, "startup_s": spent.startup_s}))
    tmp.replace(path)
