"""The stale-rank health monitor: is seed exploration on stale weights still worth trusting?

Exploration ranks a prompt's seeds by their rewards under the previous weights θ(t-1); the
rollout then uses the top-contrast seeds under θ(t) (docs/design.md, idea 1). That pays only while the
two rankings agree. After each rollout the monitor compares, per prompt, the stale and the fresh
rewards of the same seeds by Spearman rank correlation; when the mean falls below a threshold
(a big update, a learning-rate spike), the controller falls back to random seeds until agreement
returns.

Invariant: the health state changes only on a measured correlation; an iteration without one
(too few seeds, constant rewards) leaves it as it was.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman rank correlation of paired values (average ranks for ties); None with fewer than 3
    pairs or when either side is constant (the correlation is undefined)."""
    if len(a) != len(b):
        raise ValueError(f"spearman needs paired values, got {len(a)} and {len(b)}")
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.size < 3 or np.all(x == x[0]) or np.all(y == y[0]):
        return None
    return float(stats.spearmanr(x, y).statistic)


MIN_PAIRS = 3
"""Explored seeds a rolled-out group needs for the monitor to measure it (Spearman needs 3)."""


class StaleRankMonitor:
    """Healthy while the mean stale-vs-fresh Spearman correlation of the seeds stays >= threshold."""

    def __init__(self, threshold: float, min_pairs: int = MIN_PAIRS) -> None:
        if not (isinstance(threshold, (int, float)) and math.isfinite(threshold) and -1 <= threshold <= 1):
            raise ValueError(f"threshold must be a correlation in [-1, 1], got {threshold!r}")
        if isinstance(min_pairs, bool) or not isinstance(min_pairs, int) or min_pairs < 3:
            raise ValueError(f"min_pairs must be an integer >= 3 (Spearman needs 3 pairs), got {min_pairs!r}")
        self.threshold = float(threshold)
        self.min_pairs = min_pairs
        """Groups with fewer seed pairs than this are not counted."""
        self.healthy = True
        self.last: float | None = None
        """The latest measured mean correlation (None until one was measured)."""
        self.message: str | None = None
        """One log line when the latest `observe` changed the health state, else None."""

    def observe(self, groups: Sequence[tuple[Sequence[float], Sequence[float]]]) -> float | None:
        """Mean Spearman over the groups' (stale rewards, fresh rewards) of the same seeds, groups
        without a correlation skipped; None if none counts. Updates `healthy` and `message`."""
        values = []
        for stale, fresh in groups:
            if len(stale) != len(fresh):
                raise ValueError(f"a group pairs {len(stale)} stale with {len(fresh)} fresh rewards")
            if len(stale) >= self.min_pairs and (rho := spearman(stale, fresh)) is not None:
                values.append(rho)
        self.message = None
        if not values:
            return None
        mean = float(np.mean(values))
        self.last = mean
        healthy = mean >= self.threshold
        if healthy != self.healthy:
            self.healthy = healthy
            if healthy:
                self.message = (
                    f"stale-rank Spearman {mean:.2f} >= {self.threshold:.2f} again: using explored seeds"
                )
            else:
                self.message = f"stale-rank Spearman {mean:.2f} < threshold {self.threshold:.2f}: falling back to random seeds"
        return mean

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable state; `from_dict` restores it exactly."""
        return {
            "threshold": self.threshold,
            "min_pairs": self.min_pairs,
            "healthy": self.healthy,
            "last": self.last,
            "message": self.message,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StaleRankMonitor:
        monitor = cls(d["threshold"], d.get("min_pairs", MIN_PAIRS))
        monitor.healthy = bool(d["healthy"])
        monitor.last = d["last"]
        monitor.message = d.get("message")
        return monitor
