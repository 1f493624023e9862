"""Variance-maximising selection of a GRPO group from a prompt's explored seeds.

GRPO learns only from reward differences inside a group (docs/design.md, idea 1), so of the seeds
explored for a prompt the next rollout uses the g whose rewards have the largest population
variance.

Why extremes suffice: let S be a g-subset with mean m. Replacing a member x >= m by an unused value
y > x changes the variance by (y - x)/g * ((x - m) + (y - m) - (y - x)/g) >= 0, and symmetrically
below the mean; so some optimal subset is the k smallest plus the g - k largest values for a k in
0..g. One stable sort plus prefix sums then find it in O(n log n), and only the g smallest and g
largest values of a set matter for its best group variance.

A prompt explored less than the group needs still has something to choose (`contrast_group`):
keep only its explored seeds that contrast, and fill the group with fresh random seeds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np


def group_variance(values: Sequence[float]) -> float:
    """Population variance (ddof=0) of `values`; 0.0 for fewer than 2 values."""
    if len(values) < 2:
        return 0.0
    return float(np.var(np.asarray(values, dtype=np.float64)))


def split_variances(lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
    """Population variance of every extreme g-subset of sets with at least g members.

    lows: (..., g) the g smallest values of each set, ascending; highs: (..., g) its g largest,
    ascending (the two overlap when a set has fewer than 2g members, which is fine: the k smallest
    and the g - k largest of a set of >= g members are disjoint). Returns (..., g + 1): entry k is
    the variance of the k smallest plus the g - k largest values. Values should be centred (near
    their mean, or midrange): E[x^2] - E[x]^2 loses digits to a large common offset.
    """
    g = lows.shape[-1]
    sums, squares = _subset_sums(lows, highs)
    mean = sums / g
    return np.maximum(squares / g - mean * mean, 0.0)


def best_group_variance(lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
    """`split_variances(lows, highs).max(-1)`, with fewer array passes: (...,)."""
    g = lows.shape[-1]
    sums, squares = _subset_sums(lows, highs)
    return np.maximum((squares * g - sums * sums).max(axis=-1), 0.0) / (g * g)


def _subset_sums(lows: np.ndarray, highs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sums and sums of squares of every extreme g-subset, each (..., g + 1)."""
    g = lows.shape[-1]
    x = np.concatenate([lows, highs], axis=-1).reshape(-1, 2 * g)
    rows = x.shape[0]
    # A matrix product gives all g + 1 subset sums at once, several times faster than cumsum along
    # a short last axis. It goes in slices of 128 rows: one large product may be split over
    # OpenBLAS threads, and on a busy machine waking them costs more than the product itself
    # (10+ ms instead of 0.2 for 2048 x 48 @ 48 x 25), while a 128-row slice stays on one thread.
    if rows > _SLICE:
        x = np.concatenate([x, np.zeros((-rows % _SLICE, 2 * g))]).reshape(-1, _SLICE, 2 * g)
    pick = _extreme_sums(g)
    shape = lows.shape[:-1] + (g + 1,)
    sums = (x @ pick).reshape(-1, g + 1)[:rows].reshape(shape)
    squares = ((x * x) @ pick).reshape(-1, g + 1)[:rows].reshape(shape)
    return sums, squares


_SLICE = 128


@functools.lru_cache(maxsize=64)
def _extreme_sums(g: int) -> np.ndarray:
    """(2g, g + 1) 0/1 matrix: column k adds up lows[:k] and highs[k:] (the g - k largest)."""
    i = np.arange(g)[:, None]
    k = np.arange(g + 1)[None, :]
    return np.concatenate([i < k, i >= k]).astype(np.float64)


def max_variance_subset(rewards: Sequence[float], g: int) -> list[int]:
    """Indices (ascending) into `rewards` of the g values with the largest population variance.

    The subset is the k smallest plus the g - k largest values under a stable sort; among the k
    that reach the largest computed variance the smallest k wins, so the answer is deterministic
    (with tied values, the earlier index counts as the smaller).
    """
    n = len(rewards)
    if not isinstance(g, (int, np.integer)) or isinstance(g, bool) or not 1 <= g <= n:
        raise ValueError(f"group size g must be an integer in 1..{n} (the number of rewards), got {g!r}")
    values = np.asarray(rewards, dtype=np.float64)
    if not np.all(np.isfinite(values)):
        raise ValueError(f"rewards must be finite, got {[r for r in rewards if not math.isfinite(r)]}")
    order = np.argsort(values, kind="stable")
    ranked = values[order] - 0.5 * (values.min() + values.max())
    k = int(np.argmax(split_variances(ranked[:g], ranked[n - g :])))
    return sorted(int(i) for i in np.concatenate([order[:k], order[n - (g - k) :]]))


def contrast_group(rewards: Sequence[float], g: int, fresh: int, at_least: int = 0) -> list[int]:
    """Indices (ascending) into a prompt's explored `rewards` of the seeds its next group keeps; the
    group's other g - len(result) seeds are fresh random ones, of which `fresh` are available. At
    least `at_least` explored seeds are kept where there are that many (the stale-rank monitor
    measures only explored seeds that were rolled out again).

    Why: a kept seed whose explored reward deviates by d from the prompt's mean brings an expected
    squared deviation of about ρ²d² + (1 - ρ²)σ² to the fresh group (ρ: how well the explored
    reward predicts the fresh one, σ²: the prompt's reward variance), a fresh seed brings σ²; so a
    seed is worth keeping exactly when |d| > σ, whatever ρ. σ and the mean are estimated from the
    explored rewards (with fewer than 3, all are kept: nothing to estimate from). With g or more
    worth keeping — or no fresh seeds left to fill with — the group is all explored seeds:
    `max_variance_subset`, the exact optimum. Below that, the most deviating are kept. On the
    simulator's synthetic rewards (spotlight/sim/progress_model.py, G = 16, `at_least` 3) this
    raises the fresh group std by 2/9/19% with 4/8/15 explored seeds (taking all explored ones and
    topping up with fresh seeds: no gain), and by 20/7/2% over `max_variance_subset` with 16/24/32."""
    n = len(rewards)
    if not isinstance(fresh, (int, np.integer)) or isinstance(fresh, bool) or fresh < 0:
        raise ValueError(f"fresh must be a non-negative integer, got {fresh!r}")
    if n + fresh < g:
        raise ValueError(f"a group of {g} needs more seeds than the {n} explored and {fresh} fresh ones")
    values = np.asarray(rewards, dtype=np.float64)
    if not np.all(np.isfinite(values)):
        raise ValueError(f"rewards must be finite, got {[r for r in rewards if not math.isfinite(r)]}")
    deviation = np.abs(values - values.mean()) if n else values
    worth = n if n < 3 else int(np.count_nonzero(deviation > values.std(ddof=1)))
    keep = max(min(max(worth, at_least), g, n), g - fresh)
    if keep == g:
        return max_variance_subset(rewards, g)
    return sorted(int(i) for i in np.argsort(-deviation, kind="stable")[:keep])
