"""Exploration allocation: how many candidate seeds of each prompt to score with stale weights.

While the trainer trains, idle workers score candidate seeds of the next iteration's prompts with
the previous weights (docs/design.md, idea 1); the next rollout uses, per prompt, the G explored seeds
whose rewards contrast most (`selection.max_variance_subset`). A planner splits the exploration
budget over the prompts in rounds: `next_round` says how many more seeds each prompt gets now, the
caller scores them into the `SeedPool`, and asks again until it gets `{}` or runs out of time.

`UniformPlanner` splits the budget evenly in one round. `BanditPlanner` treats exploration as a
bandit: the arms are the prompts, a pull is a chunk of samples of one prompt, and the payoff is the
increase of the objective

    J = sum over prompts p of V_G(R_p),

the reward variance of the groups the next rollout will use. With R_p the rewards explored for p,
V_G(R) is the variance of R's max-variance G-subset when |R| >= G; with fewer, the missing members
are fresh random seeds, and V_G(R) is the expected variance of R plus G - |R| fresh draws.

Round 0 tops every prompt up to `initial` samples, to learn its spread. Every later round:
1. fits a predictive model of each prompt's rewards (below), including how unsure it is;
2. computes each prompt's value curve f_p(j) = E[V_G(R_p + j new draws)] at a few j;
3. hands out chunks greedily, each to the prompt whose curve rises most steeply per sample,
   judged on the curve's upper concave envelope: the first slope is the best *average* gain per
   sample over any lookahead (the "KG*" rule), which matters because f_p is flat until |R_p|
   passes G (a seed explored only to be used anyway changes nothing in expectation) and rises
   only after; and a prompt that got chunks this round moves along its envelope, so its gains
   shrink as its group saturates, while a flat stretch it has entered is not mistaken for sunk;
4. stops at `round_samples`, at the budget, when candidates run out, or when the best gain is at
   most 1e-12 of J (nothing left to gain).
Optimism under uncertainty, as in UCB: a prompt's spread is widened by 1 + optimism / sqrt(n + 1)
for n observations, so prompts seen little look as promising as they plausibly are, and the bonus
fades as evidence comes in. Beyond that, the curves average over the posterior of the spread (or
pass rate), so a prompt whose few samples happen to lie close together is still credited with
the chance that it is wide.

Predictive model of a new reward of prompt p with n observed rewards R:
- binary tasks (every reward seen, in this pool and in all history, is 0 or 1): pass probability
  ~ Beta(a0 + successes, b0 + failures), a0 + b0 = 2, centred on the prompt's history pass rate
  (exponentially weighted, 0.5 on the newest group) if any, else the pool's pass rate, else 0.5;
  the centre is kept within [0.005, 0.995], since a centre of exactly 0 or 1 would rule out for
  good what a few samples never can. Optimism divides both parameters by the widening squared,
  which keeps the mean and multiplies the variance by about that factor. Its curve is exact
  (Beta-binomial), no Monte Carlo.
- otherwise Gaussian: mean = the sample mean; variance shrunk toward a prior s0^2 with pseudo-count
  k0, s^2 = (k0 s0^2 + sum (r - mean)^2) / (k0 + max(n - 1, 0)); s0^2 = the prompt's history
  variance (exponentially weighted) if any, else the median variance of the pool's prompts with
  >= 2 observations, else 1.0. k0 is 2, or more when the pool's prompts have spreads more alike
  than sampling noise alone would make them (empirical Bayes, `_prior_strength`). The variance
  itself is uncertain: s^2 * nu / chi2(nu), nu = k0 + max(n - 1, 0) (at least 5), times the
  widening squared. Its curve is Monte Carlo with `mc_draws` paths (`_GaussianCurve`).

History helps binary tasks most: a prompt that failed (or passed) every earlier group and again
all its stale samples gets a prior near 0 (or 1) and is explored only once nothing else gains.
Without history, 0/4 is weak evidence: such a prompt may still pass 10% of the time, which is
where exploration pays most, so it competes with prompts that already pass half the time (whose
random group is within ~12% of the best possible variance anyway).

Determinism: the Monte Carlo paths of prompts with n observations come from a generator seeded by
(seed, iteration, round, n), so a result never depends on call order or timing. The prompt id is
deliberately not in the seed: prompts are compared on common random numbers, which cuts the noise
of the comparison and makes prompts with the same evidence tie exactly (ties go to pool order).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
from scipy import optimize, special

from planners.seed_pool import SeedPool
from planners.selection import best_group_variance

_PSEUDO_COUNT = 2.0
"""Prior weight, in observations, of a prompt's prior pass rate or prior variance."""
_NEWEST_WEIGHT = 0.5
"""Weight of the newest group in a prompt's exponentially weighted history."""
_MAX_STRENGTH = 1000.0
"""Largest empirical-Bayes pseudo-count of the pool's prior variance (prompts all alike)."""
_MIN_DOF = 5.0
"""Least degrees of freedom of a path's posterior variance: below 5, Var(V_G) is infinite and the
Monte Carlo mean would be too noisy to rank prompts by (only prompts with < 4 samples hit it)."""
_MAX_STRIDE = 8
"""Most chunks between two points of a value curve (strides double up to it)."""
_RATE_FLOOR = 0.005
"""A prior pass rate is kept in [floor, 1 - floor], so Beta parameters stay > 0."""
_NOTHING_LEFT = 1e-12
"""A round stops once the best gain is at most this fraction of the current objective."""


class AllocationPlanner(Protocol):
    """Splits an iteration's exploration budget over its prompts, round by round."""

    def start(self, pool: SeedPool, group_size: int, budget: int) -> None:
        """A new iteration over `pool`'s prompts: `budget` exploration samples in all (may be large,
        e.g. when time bounds exploration instead)."""
        ...

    def next_round(self, pool: SeedPool) -> dict[int, int]:
        """prompt_id -> how many more samples to explore now (only counts > 0; never more than the
        prompt's unexplored candidates; the sum never exceeds the budget left). `{}` means this
        iteration's exploration is finished. The caller records the results into `pool` before
        asking again, and may stop asking at any time."""
        ...

    def observe_group(self, prompt_id: int, rewards: Sequence[float]) -> None:
        """The prompt's fresh group rewards after an iteration's rollout (history for priors)."""
        ...

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable state for checkpoints; `from_dict` restores it exactly."""
        ...

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AllocationPlanner: ...


class UniformPlanner:
    """One round: every prompt gets budget // P samples, the first budget % P prompts (pool order) one
    more, each capped by the prompt's unexplored candidates; then `{}`."""

    def __init__(self) -> None:
        self._budget_left: int | None = None
        """Samples this iteration may still hand out; None before the first `start`."""
        self._done = False

    def start(self, pool: SeedPool, group_size: int, budget: int) -> None:
        _check_start(group_size, budget)
        self._budget_left = budget
        self._done = False

    def next_round(self, pool: SeedPool) -> dict[int, int]:
        if self._budget_left is None:
            raise RuntimeError("next_round called before start")
        if self._done or not pool.prompt_ids:
            return {}
        self._done = True
        share, extra = divmod(self._budget_left, len(pool.prompt_ids))
        allocation = {}
        for i, prompt_id in enumerate(pool.prompt_ids):
            count = min(share + (i < extra), len(pool.unexplored(prompt_id)))
            if count > 0:
                allocation[prompt_id] = count
        self._budget_left -= sum(allocation.values())
        return allocation

    def observe_group(self, prompt_id: int, rewards: Sequence[float]) -> None:
        """Uniform allocation uses no history."""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "uniform", "budget_left": self._budget_left, "done": self._done}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> UniformPlanner:
        planner = cls()
        planner._budget_left = d["budget_left"]
        planner._done = bool(d["done"])
        return planner


@dataclass
class _History:
    """What past rollouts said about one prompt, exponentially weighted (0.5 on the newest group)."""

    mean: float
    """Mean reward (the pass rate on binary tasks)."""
    var: float | None
    """Unbiased reward variance, over groups of >= 2 rewards; None if there were none."""
    groups: int


@dataclass(frozen=True)
class _Model:
    """Predictive distribution of a prompt's next rewards: Beta-Bernoulli when `binary`, with pass
    probability ~ Beta(a, b); else Normal(mean, sigma^2), sigma^2 ~ std^2 * dof / chi2(dof)."""

    binary: bool
    a: float = 0.0
    b: float = 0.0
    mean: float = 0.0
    std: float = 0.0
    dof: float = 1.0


class BanditPlanner:
    """Optimistic greedy allocation of exploration chunks to the prompts whose selected group's
    reward variance is expected to grow most per sample (see the module docstring)."""

    def __init__(
        self,
        round_samples: int,
        chunk: int = 4,
        initial: int | None = None,
        optimism: float = 1.0,
        mc_draws: int = 256,
        seed: int = 0,
    ) -> None:
        _check_int("round_samples", round_samples, 1)
        _check_int("chunk", chunk, 1)
        if initial is not None:
            _check_int("initial", initial, 0)
        if not (isinstance(optimism, (int, float)) and math.isfinite(optimism) and optimism >= 0):
            raise ValueError(f"optimism must be a finite number >= 0, got {optimism!r}")
        _check_int("mc_draws", mc_draws, 1)
        _check_int("seed", seed, 0)
        self.round_samples = round_samples
        """Samples one later round hands out at most (round 0 gives every prompt `initial`)."""
        self.chunk = chunk
        """Samples per pull: the greedy hands out whole chunks (a smaller last one at a cap)."""
        self.initial = chunk if initial is None else initial
        """Samples every prompt is topped up to in round 0, to learn its spread."""
        self.optimism = float(optimism)
        self.mc_draws = mc_draws
        self.seed = seed
        self._history: dict[int, _History] = {}
        self._history_binary = True
        """Whether every history reward so far was 0 or 1."""
        self._iteration = 0
        """How many times `start` was called (part of the Monte Carlo seed)."""
        self._round = 0
        self._group_size: int | None = None
        """G of the current iteration; None before the first `start`."""
        self._budget_left = 0

    # -- the iteration -------------------------------------------------------------------------

    def start(self, pool: SeedPool, group_size: int, budget: int) -> None:
        _check_start(group_size, budget)
        self._iteration += 1
        self._round = 0
        self._group_size = group_size
        self._budget_left = budget

    def next_round(self, pool: SeedPool) -> dict[int, int]:
        if self._group_size is None:
            raise RuntimeError("next_round called before start")
        avail = {p: len(pool.candidates(p)) - pool.explored_count(p) for p in pool.prompt_ids}
        if self._budget_left <= 0 or not any(avail.values()):
            return {}
        allocation = self._initial_round(pool, avail) if self._round == 0 else {}
        if not allocation:
            budget = min(self.round_samples, self._budget_left)
            allocation = self._greedy_round(self._curves(pool, avail), budget)
        self._round += 1
        self._budget_left -= sum(allocation.values())
        return {p: allocation[p] for p in pool.prompt_ids if allocation.get(p, 0) > 0}

    def observe_group(self, prompt_id: int, rewards: Sequence[float]) -> None:
        prompt_id = int(prompt_id)
        values = np.asarray(rewards, dtype=np.float64)
        if values.size == 0 or not np.all(np.isfinite(values)):
            raise ValueError(
                f"group rewards of prompt {prompt_id} must be finite and non-empty, got {list(rewards)}"
            )
        self._history_binary &= bool(np.all((values == 0) | (values == 1)))
        mean = float(values.mean())
        var = float(values.var(ddof=1)) if values.size >= 2 else None
        old = self._history.get(prompt_id)
        if old is None:
            self._history[prompt_id] = _History(mean, var, 1)
            return
        w = _NEWEST_WEIGHT
        old.mean = w * mean + (1 - w) * old.mean
        if var is not None:
            old.var = var if old.var is None else w * var + (1 - w) * old.var
        old.groups += 1

    # -- the two kinds of round ----------------------------------------------------------------

    def _initial_round(self, pool: SeedPool, avail: dict[int, int]) -> dict[int, int]:
        """Top every prompt up to `initial` explored samples; if the budget cannot, hand out chunks
        round-robin over the prompts in order of their prior gain (ties in pool order)."""
        need = {p: min(max(0, self.initial - pool.explored_count(p)), avail[p]) for p in pool.prompt_ids}
        need = {p: n for p, n in need.items() if n > 0}
        if sum(need.values()) <= self._budget_left:
            return need
        curves = self._curves(pool, avail)
        order = sorted(need, key=lambda p: -_Walk(curves[p]).slope)  # stable: ties keep pool order
        allocation = dict.fromkeys(order, 0)
        left = self._budget_left
        while left > 0:
            for p in order:
                count = min(self.chunk, need[p] - allocation[p], left)
                allocation[p] += count
                left -= count
        return allocation

    def _greedy_round(self, curves: dict[int, _Curve], left: int) -> dict[int, int]:
        """Hand out up to `left` samples, a chunk at a time, each to the prompt whose value curve's
        concave envelope rises most steeply at the samples it has got this round."""
        objective = sum(curve.values[0] for curve in curves.values())
        walks = {p: _Walk(curve) for p, curve in curves.items() if curve.can_grow(0)}
        allocation = dict.fromkeys(curves, 0)
        while left > 0 and walks:
            best = max(walks, key=lambda p: walks[p].slope)  # the first maximum: ties in pool order
            walk = walks[best]
            if walk.slope <= 0 or walk.slope * self.chunk <= _NOTHING_LEFT * objective:
                break
            count = walk.take(min(self.chunk, left))
            allocation[best] += count
            left -= count
            if walk.done:
                del walks[best]
        return allocation

    # -- the predictive model ------------------------------------------------------------------

    def _curves(self, pool: SeedPool, avail: dict[int, int]) -> dict[int, _Curve]:
        """Every prompt's value curve, computed far enough for the greedy's first look."""
        observed = {p: np.fromiter(pool.rewards(p).values(), dtype=np.float64) for p in pool.prompt_ids}
        models = self._models(observed)
        g, chunk = self._group_size, self.chunk
        curves: dict[int, _Curve] = {}
        gaussian: dict[int, list[int]] = {}
        for p in pool.prompt_ids:
            if models[p].binary:
                curves[p] = _BinaryCurve(observed[p], models[p], g, chunk, avail[p])
            else:
                gaussian.setdefault(observed[p].size, []).append(p)
        for n, members in gaussian.items():
            paths = _Paths(self.mc_draws, (self.seed, self._iteration, self._round, n))
            built = _GaussianCurve.build(
                [observed[p] for p in members],
                [models[p] for p in members],
                [avail[p] for p in members],
                paths,
                g,
                chunk,
            )
            curves.update(zip(members, built))
        return {p: curves[p] for p in pool.prompt_ids}

    def _models(self, observed: dict[int, np.ndarray]) -> dict[int, _Model]:
        every = np.concatenate([np.zeros(0), *observed.values()])
        seen_any = every.size > 0 or bool(self._history)
        binary = seen_any and self._history_binary and bool(np.all((every == 0) | (every == 1)))
        models = {}
        if binary:
            pool_rate = float(every.mean()) if every.size else 0.5
            for p, r in observed.items():
                centre = self._history[p].mean if p in self._history else pool_rate
                centre = min(max(centre, _RATE_FLOOR), 1 - _RATE_FLOOR)
                successes = float(r.sum())
                # Widening the Beta by w (variance x ~w^2) divides both its parameters by w^2.
                shrink = self._widening(r.size) ** 2
                models[p] = _Model(
                    binary=True,
                    a=(_PSEUDO_COUNT * centre + successes) / shrink,
                    b=(_PSEUDO_COUNT * (1 - centre) + r.size - successes) / shrink,
                )
            return models
        spreads = [float(r.var(ddof=1)) for r in observed.values() if r.size >= 2]
        # The median, not the mean: prompts' variances spread over orders of magnitude, and the
        # mean would be set by the widest prompt and make every narrow one look wide for its first
        # ~10 samples (std 0.01 looking like 0.2 in a pool with stds 0.01..1).
        pool_var = float(np.median(spreads)) if spreads else 1.0
        pool_strength = _prior_strength(list(observed.values()))
        pool_mean = float(every.mean()) if every.size else 0.0
        for p, r in observed.items():
            history = self._history.get(p)
            if history is not None and history.var is not None:
                prior_var, strength = history.var, _PSEUDO_COUNT
            else:
                prior_var, strength = pool_var, pool_strength
            mean = float(r.mean()) if r.size else (history.mean if history is not None else pool_mean)
            dof = strength + max(r.size - 1, 0)
            var = (strength * prior_var + float(((r - mean) ** 2).sum())) / dof
            models[p] = _Model(
                binary=False, mean=mean, std=math.sqrt(var) * self._widening(r.size), dof=max(dof, _MIN_DOF)
            )
        return models

    def _widening(self, n: int) -> float:
        return 1.0 + self.optimism / math.sqrt(n + 1)

    # -- checkpoints ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "bandit",
            "config": {
                "round_samples": self.round_samples,
                "chunk": self.chunk,
                "initial": self.initial,
                "optimism": self.optimism,
                "mc_draws": self.mc_draws,
                "seed": self.seed,
            },
            "history": {str(p): asdict(h) for p, h in self._history.items()},
            "history_binary": self._history_binary,
            "iteration": self._iteration,
            "round": self._round,
            "group_size": self._group_size,
            "budget_left": self._budget_left,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BanditPlanner:
        planner = cls(**d["config"])
        planner._history = {int(p): _History(**h) for p, h in d["history"].items()}
        planner._history_binary = bool(d["history_binary"])
        planner._iteration = int(d["iteration"])
        planner._round = int(d["round"])
        planner._group_size = d["group_size"]
        planner._budget_left = int(d["budget_left"])
        return planner


class _Curve:
    """f(j) = E[V_G(R + j new draws)] of one prompt at j = explored[i], values[i]; grows on demand.

    Points: 0, then the first multiple of `chunk` past the fill (f is flat before it: while fewer
    than G samples are explored, the group is completed with fresh seeds, and a seed explored only
    to be used anyway changes nothing in expectation), then strides of 1, 2, 4, 8, 8, ... chunks,
    all capped by the prompt's unexplored candidates `avail`. f is non-decreasing: a larger pool
    only offers more subsets.
    """

    def __init__(self, group_size: int, chunk: int, avail: int, n: int) -> None:
        self._g = group_size
        self._chunk = chunk
        self._avail = avail
        self._fill = max(0, group_size - n)
        """Fresh draws that complete the group while fewer than G samples are explored."""
        self.explored = [0]
        self.values: list[float] = []

    def can_grow(self, i: int) -> bool:
        """Whether the prompt has unexplored candidates beyond point i."""
        return self.explored[i] < self._avail

    def best_rate(self, i: int) -> tuple[int, float]:
        """(k, rate): the later point k with the best average gain per sample from point i, the
        farthest one on ties; its rate is the slope of the curve's upper concave envelope at i."""
        base, at = self.values[i], self.explored[i]
        best, rate = i + 1, -math.inf
        for k in range(i + 1, len(self.values)):
            r = (self.values[k] - base) / (self.explored[k] - at)
            if r >= rate:
                best, rate = k, r
        return best, rate

    def rising(self, i: int) -> bool:
        """Whether the best average rate from point i may lie beyond the last point computed: the
        last point's rate beats every earlier one's (strictly, so a flat or straight curve stops)."""
        last = len(self.explored) - 1
        if last <= i + 1 or not self.can_grow(last):
            return last == i + 1 and self.can_grow(last) and self.values[last] > self.values[i]
        base, at = self.values[i], self.explored[i]
        earlier = max((self.values[k] - base) / (self.explored[k] - at) for k in range(i + 1, last))
        return (self.values[last] - base) / (self.explored[last] - at) > earlier * (1 + 1e-9)

    def extend(self) -> None:
        """Compute the next point."""
        j = self._next_point(len(self.explored))
        self.values.append(self._value_at(j))
        self.explored.append(j)

    @property
    def first(self) -> int:
        """The first point past the fill, before the cap by `avail`."""
        return self._chunk * (self._fill // self._chunk + 1)

    def _next_point(self, index: int) -> int:
        """Explored count of point `index` (>= 1)."""
        if index == 1:
            return min(self.first, self._avail)
        return min(self.explored[index - 1] + self._chunk * min(2 ** (index - 2), _MAX_STRIDE), self._avail)

    def _value_at(self, j: int) -> float:
        raise NotImplementedError


class _Walk:
    """The greedy's position on one prompt's value curve during a round: it moves along the upper
    concave envelope, so every sample on a segment earns the segment's slope. (Re-measuring the
    rate from each new position instead would count a flat stretch as sunk once a chunk went into
    it, and pour a whole round into the first prompt that got one.)"""

    def __init__(self, curve: _Curve) -> None:
        self._curve = curve
        self.position = 0
        """Samples given to the prompt this round."""
        self.done = False
        """Whether the prompt has no unexplored candidates left."""
        self._aim(0)

    def take(self, most: int) -> int:
        """Move up to `most` samples on, stopping at the next envelope vertex; returns how many."""
        curve = self._curve
        count = min(most, curve.explored[self._target] - self.position)
        self.position += count
        if self.position == curve.explored[self._target]:
            if curve.can_grow(self._target):
                self._aim(self._target)
            else:
                self.done = True
        return count

    def _aim(self, vertex: int) -> None:
        curve = self._curve
        if len(curve.explored) == vertex + 1:
            curve.extend()
        while curve.rising(vertex):
            curve.extend()
        self._target, self.slope = curve.best_rate(vertex)


class _BinaryCurve(_Curve):
    """The value curve of a prompt with 0/1 rewards, computed exactly: with s successes, f failures
    and m new draws, the number of new successes is Beta-binomial(m, a, b), and the best group
    takes as close to G/2 successes as the pool has."""

    def __init__(self, observed: np.ndarray, model: _Model, group_size: int, chunk: int, avail: int) -> None:
        super().__init__(group_size, chunk, avail, observed.size)
        self._successes = int(observed.sum())
        self._failures = observed.size - self._successes
        self._a, self._b = model.a, model.b
        self.values.append(self._value_at(0))
        while self.rising(0):
            self.extend()

    def _value_at(self, j: int) -> float:
        return _binary_value(self._successes, self._failures, self._a, self._b, self._g, max(j, self._fill))


@functools.lru_cache(maxsize=4096)
def _binary_value(successes: int, failures: int, a: float, b: float, g: int, m: int) -> float:
    """E[best group variance] of a 0/1 pool after m more Bernoulli(p) draws, p ~ Beta(a, b).
    Cached: prompts with the same evidence and prior (common in a pool) share their curves."""
    y = np.arange(m + 1)
    log_pmf = (
        special.gammaln(m + 1)
        - special.gammaln(y + 1)
        - special.gammaln(m - y + 1)
        + special.betaln(y + a, m - y + b)
        - special.betaln(a, b)
    )
    ones = successes + y
    zeros = failures + m - y
    picked = np.clip(g // 2, np.maximum(0, g - zeros), np.minimum(ones, g))
    return float(np.exp(log_pmf) @ (picked * (g - picked))) / (g * g)


class _Paths:
    """The Monte Carlo paths of the Gaussian prompts that have n observations in a round.

    Row r holds every path's r-th standard normal draw; all these prompts read the same rows
    (common random numbers) and scale them by their own spread. Rows come from one stream seeded
    by (seed, iteration, round, n), so row r is the same however many rows were asked for before.
    """

    def __init__(self, draws: int, entropy: tuple[int, ...]) -> None:
        self.draws = draws
        self._entropy = entropy
        self._rng = np.random.default_rng(list(entropy))
        self._rows = np.empty((0, draws))
        self._scales: dict[float, np.ndarray] = {}

    def rows(self, start: int, stop: int) -> np.ndarray:
        """(stop - start, draws) standard normal draws."""
        if stop > len(self._rows):
            more = self._rng.standard_normal((stop - len(self._rows), self.draws))
            self._rows = np.concatenate([self._rows, more])
        return self._rows[start:stop]

    def scales(self, dof: float) -> np.ndarray:
        """(draws,) sqrt(dof / chi2(dof)): per path, a spread drawn from its posterior relative to
        the point estimate; from a stream of its own, and equal for equal dof."""
        if dof not in self._scales:
            chi2 = np.random.default_rng([*self._entropy, 1]).chisquare(dof, size=self.draws)
            self._scales[dof] = np.sqrt(dof / chi2)
        return self._scales[dof]


class _GaussianCurve(_Curve):
    """The value curve of a prompt with real-valued rewards: Monte Carlo for its first point past
    j = 0, a standard-normal template for the points after.

    Every path draws a spread, then one sequence d_1, d_2, ...: after j explored samples the pool
    is R + d_1..d_j, and while it has fewer than G members the group is completed with the next
    draws, so the pool used is R + d_1..d_max(j, fill). Nesting the draws makes the first step's
    gain a difference on the same paths, never negative noise. A path keeps only its pool's G
    smallest and G largest members (`selection` says why they suffice).

    The first point is where the prompt's own rewards matter (how far new draws reach past its
    current extremes). Further out the pool is mostly new draws, so later increments are taken as
    E[sigma^2] * (c(n + j) - c(n + j1)), c the expected best-G variance of iid N(0, 1) samples
    (`_NormalTemplate`): this keeps a round at one Monte Carlo pass, where the far points by Monte
    Carlo would cost five or six more (100+ ms for 64 prompts with G = 24).
    """

    def __init__(
        self, observed: np.ndarray, model: _Model, paths: _Paths, group_size: int, chunk: int, avail: int
    ) -> None:
        super().__init__(group_size, chunk, avail, observed.size)
        self._n = observed.size
        self._paths = paths
        scales = paths.scales(model.dof)
        self._spread = model.std * scales[:, None]
        """(paths, 1) standard deviation per path."""
        self._var = model.std**2 * float(np.mean(scales**2))
        """E[sigma^2] over the paths."""
        self._kept = np.sort(observed - model.mean)[None, :]
        """(paths or 1, <= 2G), centred on the model mean: the G smallest and G largest of each
        path's pool, ascending (unsorted while the pool is just the filled group: `_grow` sorts)."""

    @classmethod
    def build(
        cls,
        observed: list[np.ndarray],
        models: list[_Model],
        avail: list[int],
        paths: _Paths,
        group_size: int,
        chunk: int,
    ) -> list[_GaussianCurve]:
        """Curves of prompts with equally many observations, their Monte Carlo points computed in
        one array pass for all of them (for 64 prompts x 256 paths ~5x faster than one prompt at a
        time, whose arrays are too small to amortise numpy's per-call overhead)."""
        g = group_size
        curves = [cls(r, m, paths, g, chunk, a) for r, m, a in zip(observed, models, avail)]
        everyone = list(range(len(curves)))
        fill = curves[0]._fill
        own = np.stack([c._kept for c in curves])
        if fill:
            # The pool at j = 0 is exactly the group: its plain variance, no sort and no split.
            own = np.broadcast_to(own, (len(curves), paths.draws, g - fill))
            pools = np.concatenate([own, cls._draws(curves, everyone, 0, fill)], axis=-1)
            values = pools.var(axis=-1).mean(axis=-1)
        else:
            pools = _trim(own, g)
            values = _mean_value(pools, g)
        for i, curve in enumerate(curves):
            curve._kept = pools[i]
            curve.values.append(float(values[i]))
        first = curves[0].first
        full = [i for i in everyone if curves[i]._avail >= first]  # the others go lazily
        if full:
            pools = _grow(pools[full], cls._draws(curves, full, fill, first), g)
            values = _mean_value(pools, g)
            for row, i in enumerate(full):
                curves[i]._kept = pools[row]
                curves[i].explored.append(first)
                curves[i].values.append(float(values[row]))
        for curve in curves:
            while curve.rising(0):
                curve.extend()
        return curves

    @staticmethod
    def _draws(curves: list[_GaussianCurve], members: list[int], start: int, stop: int) -> np.ndarray:
        """(members, paths, stop - start): draws d_start+1..d_stop of each member."""
        standard = curves[members[0]]._paths.rows(start, stop).T
        return np.stack([curves[i]._spread for i in members]) * standard

    def _value_at(self, j: int) -> float:
        if len(self.explored) >= 2:
            template = _NormalTemplate.of(self._g)
            start = self._n + self.explored[1]
            return self.values[1] + self._var * (template(self._n + j) - template(start))
        self._kept = _grow(self._kept, self._spread * self._paths.rows(self._fill, j).T, self._g)
        return float(_mean_value(self._kept, self._g))


class _NormalTemplate:
    """c(m) = E[best group variance, size G] of m iid N(0, 1) samples, m >= G: Monte Carlo on
    nested draws with a fixed seed, on a grid refined where c bends most (every m up to 2G, then
    steps of ~1/16 of m), linear in between. One per G per process, grown on demand."""

    _PATHS = 2048
    _made: ClassVar[dict[int, _NormalTemplate]] = {}

    @classmethod
    def of(cls, group_size: int) -> _NormalTemplate:
        if group_size not in cls._made:
            cls._made[group_size] = cls(group_size)
        return cls._made[group_size]

    def __init__(self, group_size: int) -> None:
        self._g = group_size
        self._rng = np.random.default_rng([group_size, 0x7E3])
        self._kept = self._rng.standard_normal((self._PATHS, group_size))
        self._m = [group_size]
        self._c = [float(self._kept.var(axis=-1).mean())]

    def __call__(self, m: float) -> float:
        while self._m[-1] < m:
            step = max(1, self._m[-1] // 16 if self._m[-1] >= 2 * self._g else 1)
            self._kept = _grow(self._kept, self._rng.standard_normal((self._PATHS, step)), self._g)
            self._m.append(self._m[-1] + step)
            self._c.append(max(self._c[-1], float(_mean_value(self._kept, self._g))))
        return float(np.interp(m, self._m, self._c))


def _prior_strength(observed: list[np.ndarray]) -> float:
    """Pseudo-count k0 >= 2 of the pool's median variance as a prompt's prior (empirical Bayes).

    A sample variance with d = n - 1 degrees of freedom scatters around its prompt's true one with
    Var(log) = trigamma(d / 2); whatever spread of log variances across the pool's prompts exceeds
    that is real, tau^2. A scaled-inverse-chi2 prior with k0 degrees of freedom has
    Var(log) = trigamma(k0 / 2), so k0 solves trigamma(k0 / 2) = tau^2. Prompts that really differ
    keep the weak k0 = 2; prompts that are alike get a strong prior, and the bandit then stops
    chasing noise in their first few samples (a 5-10% loss against uniform allocation otherwise,
    when all prompts have the same spread).
    """
    sizes = np.array([r.size for r in observed if r.size >= 2])
    spreads = np.array([r.var(ddof=1) for r in observed if r.size >= 2])
    sizes, spreads = sizes[spreads > 0], spreads[spreads > 0]
    if spreads.size < 4:  # too few prompts to tell real differences from noise
        return _PSEUDO_COUNT
    excess = float(np.var(np.log(spreads), ddof=1) - special.polygamma(1, (sizes - 1) / 2).mean())
    if excess >= special.polygamma(1, _PSEUDO_COUNT / 2):
        return _PSEUDO_COUNT
    if excess <= special.polygamma(1, _MAX_STRENGTH / 2):
        return _MAX_STRENGTH
    return float(
        optimize.brentq(lambda k: special.polygamma(1, k / 2) - excess, _PSEUDO_COUNT, _MAX_STRENGTH)
    )


def _grow(kept: np.ndarray, block: np.ndarray, g: int) -> np.ndarray:
    """Pools (..., paths or 1, w) ascending, plus new members (..., paths, b): ascending, trimmed."""
    kept = np.broadcast_to(kept, block.shape[:-1] + kept.shape[-1:])
    return _trim(np.sort(np.concatenate([kept, block], axis=-1), axis=-1), g)


def _trim(ranked: np.ndarray, g: int) -> np.ndarray:
    """Drop the middle of ascending rows longer than 2G: those values can never be among a pool's
    G smallest or G largest again, whatever is added later."""
    if ranked.shape[-1] <= 2 * g:
        return ranked
    return np.concatenate([ranked[..., :g], ranked[..., -g:]], axis=-1)


def _mean_value(kept: np.ndarray, g: int) -> np.ndarray:
    """E over paths of the best group variance: (..., paths, w) -> (...,)."""
    rows = kept.reshape(-1, kept.shape[-1])
    # Blocks of ~4k paths keep the temporaries in cache: 2x faster than one pass over 64 x 256.
    step = max(1, 4096 // kept.shape[-2]) * kept.shape[-2]
    best = np.concatenate(
        [
            best_group_variance(rows[i : i + step, :g], rows[i : i + step, -g:])
            for i in range(0, len(rows), step)
        ]
    )
    return best.reshape(kept.shape[:-1]).mean(axis=-1)


def make_planner(kind: str, **kw: Any) -> AllocationPlanner:
    """A planner by name: "uniform" (no arguments) or "bandit" (`BanditPlanner`'s arguments)."""
    kinds = {"uniform": UniformPlanner, "bandit": BanditPlanner}
    if kind not in kinds:
        raise ValueError(f"unknown planner kind {kind!r}; expected one of {sorted(kinds)}")
    return kinds[kind](**kw)


def planner_from_dict(d: Mapping[str, Any]) -> AllocationPlanner:
    """Restore a planner from its `to_dict()`, whichever kind it is."""
    kinds = {"uniform": UniformPlanner, "bandit": BanditPlanner}
    if d.get("kind") not in kinds:
        raise ValueError(f"planner state has kind {d.get('kind')!r}; expected one of {sorted(kinds)}")
    return kinds[d["kind"]].from_dict(d)


def _check_start(group_size: int, budget: int) -> None:
    _check_int("group_size", group_size, 1)
    _check_int("budget", budget, 0)


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
