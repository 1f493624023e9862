"""Progress to target: the validation score after each iteration, as a function of the useful
learning signal of the iterations so far — and the synthetic seed rewards that signal comes from.

Model (one assumption, stated): every iteration closes a fraction of the remaining gap to the
score the run converges to, and how big that fraction is depends only on the iteration's
learning signal s — the mean within-group reward std of the groups it trains on (GRPO learns only
from reward differences inside a group):

    eval(k) = r_inf - (r_inf - r0) · exp(-λ · Σ_{j<k} (s_j / s_ref)^α)

Calibrated on the exploration ablation's real tiny-DiT runs (`experiments/exploration_ablation.py`,
3 seeds per arm): r0 = the random arm's first eval reward, r_inf = the best arm's final one, the
target = the ablation's (75% of the random arm's gain), s_ref = the random arm's mean group std;
λ makes s = s_ref reach the target in the random arm's iterations (17.7), and α makes the bandit
arm's std (0.139) reach it in its iterations (12.7): α = ln(12.7/17.7) / ln(0.081/0.139) ≈ 0.61.
So doubling the group std does *not* halve the iterations (GRPO normalises advantages by the
group std; docs/exploration.md). `iterations_scale` stretches the time axis for a run whose
random-seed baseline needs more iterations (a real Qwen-Image run), keeping the s-dependence.

Signal: `SeedRewards` draws, per iteration and prompt, candidate seeds' fresh rewards
μ_p + σ_p·z and their stale (previous weights) scores μ_p + σ_p·(ρ z + sqrt(1-ρ²) e), with ρ from
the measured stale-rank Spearman 0.93 (ρ = 2 sin(π·0.93/6)); σ_p is lognormal around a mean set so
that a random group's expected std is s_ref. The group a rollout trains on is the G explored seeds
with the most contrasting *stale* rewards (`planners.selection.max_variance_subset`, the live
selection), topped up with fresh random seeds when fewer than G were explored; its signal is the
std of their *fresh* rewards.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planners.selection import max_variance_subset

ABLATION_FIGURES = {"target": 0.8755054821570714, "r0": 0.7036881844202677, "r_inf": 0.9396502243147956,
                    "k_random": 17.666666666666668, "k_bandit": 12.666666666666666,
                    "s_random": 0.08053018127878507, "s_bandit": 0.13925332662959894,
                    "spearman": 0.933070724795789}
"""The figures of the exploration ablation's runs docs/measurements.md reports (tiny DiT, 3 seeds per arm:
`python -m experiments.exploration_ablation`, results.json and the random arm's first eval reward),
shipped so that every machine simulates the same: pass a fresh ablation's results.json to
`ProgressModel.calibrated` to recalibrate."""


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
                dit = json.loads(path.read_text())["dit"]
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
        line = metrics.read_text().splitlines()[0]
        firsts.append(json.loads(line)["eval_reward"])
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
        sigma, fresh, stale = self.draw(iteration, prompt, max(candidates, explored + self.g))
        if explored >= self.g:
            chosen = fresh[max_variance_subset(stale[:explored].tolist(), self.g)]
        else:
            chosen = fresh[:self.g]  # the explored ones are random seeds too: no choice to make
        return float(np.std(chosen, ddof=1))


def _mean_std(g: int) -> float:
    """E[sample std (ddof=1)] of g standard normals: c4(g)."""
    return math.sqrt(2 / (g - 1)) * math.exp(math.lgamma(g / 2) - math.lgamma((g - 1) / 2))
