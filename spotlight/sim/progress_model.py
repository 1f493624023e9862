"""Progress to target: the validation score after each iteration, as a function of the useful
learning signal of the iterations so far — and the synthetic seed rewards that signal comes from.

Model (one assumption, stated): every iteration closes a fraction of the remaining gap to the
score the run converges to, and how big that fraction is depends only on the iteration's
learning signal s — the mean within-group reward std of the groups it trains on (GRPO learns only
from reward differences inside a group):

    eval(k) = r_inf - (r_inf - r0) · exp(-λ · Σ_{j<k} (s_j / s_ref)^α)

Calibrated on the exploration ablation's real tiny-DiT runs without `explore_first` (which
explored the first iteration's seeds before its rollout and so credited exploration with an
iteration it did not win in a train phase; `experiments/exploration_ablation.py
--no-explore-first`, 3 seeds per arm): r0 = the random arm's first eval reward, r_inf = the best
arm's final one, the target = the ablation's (75% of the random arm's gain), s_ref = the random
arm's mean group std; λ makes s = s_ref reach the target in the random arm's iterations (17.7),
and α makes the bandit arm's std (0.140) reach it in its iterations (13.3): α = ln(13.3/17.7) /
ln(0.081/0.140) ≈ 0.51. Validated on the arm it was not fit on (`validation`): the uniform arm's
std 0.143 predicts 13.2 iterations, 13.7 measured (-3.3%).
So doubling the group std does *not* halve the iterations (GRPO normalises advantages by the
group std; docs/exploration.md). `iterations_scale` stretches the time axis for a run whose
random-seed baseline needs more iterations (a real Qwen-Image run), keeping the s-dependence.

Signal: `SeedRewards` draws, per iteration and prompt, candidate seeds' fresh rewards
μ_p + σ_p·z and their stale (previous weights) scores μ_p + σ_p·(ρ z + sqrt(1-ρ²) e), with ρ from
the measured stale-rank Spearman 0.93 (ρ = 2 sin(π·0.93/6)); σ_p is lognormal around a mean set so
that a random group's expected std is s_ref. The group a rollout trains on is the live selection
(`planners.selection.contrast_group`): the explored seeds whose *stale* rewards contrast, topped up
with fresh random seeds; its signal is the std of their *fresh* rewards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cloud.bounded_json import load_file, loads
from planners.selection import contrast_group
from planners.stale_rank import MIN_PAIRS

ABLATION_FIGURES = {"target": 0.8755054821570714, "r0": 0.7036881844202677, "r_inf": 0.9389110008875529,
                    "k_random": 17.666666666666668, "k_bandit": 13.333333333333334,
                    "s_random": 0.08053018127878507, "s_bandit": 0.14049673962096373,
                    "k_uniform": 13.666666666666666, "s_uniform": 0.1430353550033437,
                    "spearman": 0.9325738916256159}
"""The figures of the exploration ablation's runs without `explore_first` (tiny DiT, 3 seeds per arm:
`python -m experiments.exploration_ablation --models dit --no-explore-first`, its results.json and the
random arm's first eval reward; docs/simulator.md#progress-model), the uniform arm held out,
shipped so that every machine simulates the same: pass a fresh ablation's results.json to
`ProgressModel.calibrated` to recalibrate."""
_MAX_READ_BYTES = 16 << 20
"""An ablation's results.json (~5 KB) and a metrics row (~1 KB) are read with at most 16 MiB each."""


@dataclass(frozen=True)
class ProgressModel:
    r0: float
    r_inf: float
    target: float
    s_ref: float
    lam: float
    alpha: float
    spearman: float
    source: str
    iterations_scale: float = 1.0
    held_out: tuple[float, float] | None = None
    """(group std, iterations to target) of an ablation arm the model was not fit on (uniform):
    what it is validated on (`validation`)."""

    @classmethod
    def calibrated(cls, path: Path | None = None, iterations_scale: float = 1.0) -> ProgressModel:
        """The model from `ABLATION_FIGURES`, or from an ablation's results.json at `path` (with its
        runs beside it); a file that does not read falls back to the shipped figures."""
        f, source = dict(ABLATION_FIGURES), "the exploration ablation's tiny-DiT runs (docs/measurements.md)"
        if path is not None:
            path = Path(path)
            try:
                dit = load_file(path, max_bytes=_MAX_READ_BYTES)["dit"]  # bounded: a bad file is a ValueError
                arms = dit["arms"]
                f.update(target=dit["target"], k_random=arms["random"]["iterations_to_target"],
                         k_bandit=arms["bandit"]["iterations_to_target"],
                         s_random=arms["random"]["mean_group_reward_std"],
                         s_bandit=arms["bandit"]["mean_group_reward_std"],
                         k_uniform=arms.get("uniform", {}).get("iterations_to_target"),
                         s_uniform=arms.get("uniform", {}).get("mean_group_reward_std"),
                         spearman=arms["bandit"]["stale_rank_spearman_mean"],
                         r_inf=max(a["final_reward"] for a in arms.values()))
                r0 = _first_evals(path.parent / "dit" / "random")
                if r0 is not None:
                    f["r0"] = r0
                source = str(path)
            except (OSError, KeyError, ValueError, TypeError):
                pass
        alpha = math.log(f["k_bandit"] / f["k_random"]) / math.log(f["s_random"] / f["s_bandit"])
        lam = -math.log((f["r_inf"] - f["target"]) / (f["r_inf"] - f["r0"])) / (f["k_random"] * iterations_scale)
        return cls(f["r0"], f["r_inf"], f["target"], f["s_random"], lam, alpha, f["spearman"], source, iterations_scale,
                   held_out=(f["s_uniform"], f["k_uniform"]) if f.get("k_uniform") else None)

    def iterations_at(self, signal: float) -> float:
        """Iterations an unchanging group std `signal` takes to the target (unrounded)."""
        return math.log((self.r_inf - self.r0) / (self.r_inf - self.target)) / self.gain(signal)

    def gain(self, signal: float) -> float:
        """The exponent one iteration with group std `signal` adds."""
        return self.lam * (max(signal, 0.0) / self.s_ref) ** self.alpha

    def score(self, cumulative_gain: float) -> float:
        return self.r_inf - (self.r_inf - self.r0) * math.exp(-cumulative_gain)

    def reached(self, cumulative_gain: float) -> bool:
        return self.score(cumulative_gain) >= self.target - 1e-12

    def validation(self) -> dict | None:
        """What the model predicts for the held-out arm against what the ablation measured (at
        `iterations_scale` 1: the ablation's own axis)."""
        if self.held_out is None:
            return None
        signal, measured = self.held_out
        predicted = self.iterations_at(signal) / self.iterations_scale
        return {"arm": "uniform", "group_std": signal, "iterations_measured": measured,
                "iterations_predicted": predicted, "error": predicted / measured - 1}

    def to_dict(self) -> dict:
        return {"r0": self.r0, "r_inf": self.r_inf, "target": self.target, "s_ref": self.s_ref, "lambda": self.lam,
                "alpha": self.alpha, "stale_rank_spearman": self.spearman, "iterations_scale": self.iterations_scale,
                "calibrated_from": self.source, "validation": self.validation()}


def _first_evals(folder: Path) -> float | None:
    """Mean eval reward of the first iteration over the arm's seeds, or None."""
    firsts = []
    for metrics in sorted(folder.glob("seed*/metrics.jsonl")):
        with open(metrics, encoding="utf-8", errors="replace") as f:
            line = f.readline(_MAX_READ_BYTES + 1)  # the first row only, never the whole file
        firsts.append(loads(line, max_bytes=_MAX_READ_BYTES, what=str(metrics))["eval_reward"])
    return float(np.mean(firsts)) if firsts else None


class SeedRewards:
    """Synthetic fresh and stale rewards of candidate seeds (module docstring), deterministic in
    (seed, iteration, prompt)."""

    SPREAD = 0.3
    """Log-std of σ_p across prompts: prompts differ in how much their seeds matter."""

    def __init__(self, model: ProgressModel, group_size: int, seed: int) -> None:
        self.g = group_size
        self.seed = seed
        self.rho = 2 * math.sin(math.pi * model.spearman / 6)  # Spearman -> Pearson for normals
        self._expectations: dict[tuple[int, int], float] = {}
        """(explored, candidates) -> `expected_std` there, computed once."""
        c = _mean_std(group_size)
        # E[σ_p] · c = s_ref, with σ_p lognormal of log-std SPREAD and mean E[σ_p]
        self.sigma_mean = model.s_ref / c

    def draw(self, iteration: int, prompt: int, candidates: int) -> tuple[float, np.ndarray, np.ndarray]:
        """(σ_p, fresh rewards, stale scores) of the prompt's candidate seeds, in candidate order."""
        rng = np.random.default_rng((self.seed, iteration, prompt))
        sigma = self.sigma_mean * math.exp(self.SPREAD * rng.standard_normal() - self.SPREAD ** 2 / 2)
        z, e = rng.standard_normal(candidates), rng.standard_normal(candidates)
        return sigma, sigma * z, sigma * (self.rho * z + math.sqrt(1 - self.rho ** 2) * e)

    def group_std(self, iteration: int, prompt: int, candidates: int, explored: int) -> float:
        """Std of the fresh rewards of the group the rollout trains on, when the first `explored`
        candidates were scored with stale weights (the rest of the group: the next fresh seeds)."""
        total = max(candidates, explored + self.g)
        sigma, fresh, stale = self.draw(iteration, prompt, total)
        kept = contrast_group(stale[:explored].tolist(), self.g, total - explored, MIN_PAIRS)
        chosen = np.concatenate([fresh[kept], fresh[explored:explored + self.g - len(kept)]])
        return float(np.std(chosen, ddof=1))


    EXPECTATION_DRAWS = 256
    """Draws behind `expected_std` (prompts of iterations no run reaches: a run's own draws stay its own)."""

    def expected_std(self, explored: float, candidates: int) -> float:
        """The expected signal of a group whose prompt had `explored` seeds scored with stale weights
        (fractional: interpolated), with `candidates` candidates — what a planner can promise before
        exploring; the bandit, which spreads its samples to the prompts that pay most, does better."""
        explored = min(max(explored, 0.0), float(candidates))
        lo = math.floor(explored)
        hi = min(lo + 1, candidates)
        a, b = self._expected_std(lo, candidates), self._expected_std(hi, candidates)
        return a + (b - a) * (explored - lo)

    def _expected_std(self, explored: int, candidates: int) -> float:
        cache, key = self._expectations, (explored, candidates)
        if key not in cache:
            far = 1 << 40
            cache[key] = float(np.mean([self.group_std(far + k, 0, candidates, explored)
                                        for k in range(self.EXPECTATION_DRAWS)]))
        return cache[key]


def _mean_std(g: int) -> float:
    """E[sample std (ddof=1)] of g standard normals: c4(g)."""
    return math.sqrt(2 / (g - 1)) * math.exp(math.lgamma(g / 2) - math.lgamma((g - 1) / 2))
