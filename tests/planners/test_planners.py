"""planners/: seed selection, seed pools, exploration allocation and the stale-rank monitor."""

from __future__ import annotations

import itertools
import json
import time

import numpy as np
import pytest
from scipy.stats import spearmanr

from planners.allocation import BanditPlanner, UniformPlanner, _binary_value, make_planner, planner_from_dict
from planners.seed_pool import Observation, SeedPool
from planners.selection import best_group_variance, contrast_group, group_variance, max_variance_subset
from planners.stale_rank import StaleRankMonitor, spearman

# -- selection ----------------------------------------------------------------------------------


def test_group_variance_is_population_variance():
    assert group_variance([]) == 0.0
    assert group_variance([3.0]) == 0.0
    assert group_variance([1, 2, 3, 4]) == pytest.approx(1.25)


def _random_pool(rng, n):
    kind = rng.integers(3)
    if kind == 0:
        return list(rng.normal(size=n))
    if kind == 1:
        return [float(v) for v in rng.integers(0, 3, size=n)]  # many repeated values
    return [float(v) for v in rng.integers(0, 2, size=n)]  # binary rewards


def test_max_variance_subset_matches_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(150):
        n = int(rng.integers(2, 10))
        rewards = _random_pool(rng, n)
        for g in range(2, n + 1):
            picked = max_variance_subset(rewards, g)
            assert picked == sorted(set(picked)) and len(picked) == g
            best = max(group_variance([rewards[i] for i in c]) for c in itertools.combinations(range(n), g))
            assert group_variance([rewards[i] for i in picked]) == pytest.approx(best, abs=1e-12)


def test_binary_rewards_give_the_most_balanced_group():
    for ones, zeros, g in itertools.product(range(7), range(7), range(1, 9)):
        if ones + zeros < g:
            continue
        rewards = [1.0] * ones + [0.0] * zeros
        chosen = sum(rewards[i] for i in max_variance_subset(rewards, g))
        feasible = range(max(0, g - zeros), min(ones, g) + 1)
        assert abs(2 * chosen - g) == min(abs(2 * k - g) for k in feasible)


def test_max_variance_subset_tie_rule_prefers_fewest_low_values():
    # Sorted stably: 0 (idx 0), 0 (idx 2), 1 (idx 1), 1 (idx 3); k = 1 low plus 1 high wins.
    assert max_variance_subset([0, 1, 0, 1], 2) == [0, 3]
    # Three equal values: every subset ties at variance 0; k = 0 takes the g largest = last ones.
    assert max_variance_subset([5.0, 5.0, 5.0], 2) == [1, 2]


@pytest.mark.parametrize("g", [0, 4, 1.5, True])
def test_max_variance_subset_rejects_bad_group_sizes(g):
    with pytest.raises(ValueError, match="group size"):
        max_variance_subset([0.1, 0.2, 0.3], g)


def test_max_variance_subset_rejects_non_finite_rewards():
    with pytest.raises(ValueError, match="finite"):
        max_variance_subset([0.1, float("nan"), 0.3], 2)


def test_best_group_variance_from_extremes_matches_the_subset():
    rng = np.random.default_rng(1)
    for _ in range(50):
        n, g = int(rng.integers(4, 40)), int(rng.integers(2, 5))
        values = rng.normal(size=n) * 3
        ranked = np.sort(values)
        expected = group_variance([values[i] for i in max_variance_subset(list(values), g)])
        assert best_group_variance(ranked[:g], ranked[-g:]) == pytest.approx(expected, abs=1e-12)


# -- seed pool ----------------------------------------------------------------------------------


def test_contrast_group_keeps_only_explored_seeds_that_deviate_more_than_the_spread():
    # mean 0.49, sample std 0.33: only 0.0 and 1.0 deviate by more; the rest of the group is fresh
    rewards = [0.5, 0.0, 0.55, 1.0, 0.4, 0.5]
    assert contrast_group(rewards, 8, fresh=10) == [1, 3]
    # nothing to estimate the spread from: both kept
    assert contrast_group([0.1, 0.9], 8, fresh=10) == [0, 1]
    # all equal: nothing contrasts, the group is all fresh
    assert contrast_group([1.0] * 5, 4, fresh=10) == []
    # the monitor's minimum: the most deviating explored ones
    assert contrast_group(rewards, 8, fresh=10, at_least=3) == [1, 3, 4]
    # too few fresh seeds: the next most deviating explored ones make up the group
    assert contrast_group(rewards, 4, fresh=1) == [1, 3, 4]
    # no fresh seeds at all, or enough contrasting ones: the exact max-variance group
    assert contrast_group(rewards, 4, fresh=0) == max_variance_subset(rewards, 4)
    wide = [0.0] * 8 + [5.0, -5.0, 5.0, -5.0, 4.9]  # five contrast, four are a group
    assert contrast_group(wide, 4, fresh=10) == max_variance_subset(wide, 4)


def test_contrast_group_raises_the_fresh_group_std_in_expectation():
    """The rule's argument (its docstring) on correlated normal rewards: stale scores predict the
    fresh reward with rho 0.93. Keeping the contrasting explored seeds beats taking every explored
    seed and topping up with fresh ones below g, and beats max_variance_subset at g explored."""
    rng = np.random.default_rng(0)
    g, rho = 8, 0.93
    for explored in (4, 6, g):
        chosen, plain = [], []
        for _ in range(3000):
            z = rng.standard_normal(explored + g)
            stale = rho * z + np.sqrt(1 - rho ** 2) * rng.standard_normal(explored + g)
            kept = contrast_group(stale[:explored].tolist(), g, fresh=g, at_least=3)
            group = np.concatenate([z[kept], z[explored:explored + g - len(kept)]])
            chosen.append(np.std(group, ddof=1))
            plain.append(np.std(z[:g], ddof=1))
        assert np.mean(chosen) > 1.02 * np.mean(plain), explored


def test_contrast_group_rejects_bad_input():
    with pytest.raises(ValueError, match="more seeds"):
        contrast_group([0.1, 0.2], 4, fresh=1)
    with pytest.raises(ValueError, match="fresh"):
        contrast_group([0.1, 0.2], 2, fresh=-1)
    with pytest.raises(ValueError, match="finite"):
        contrast_group([0.1, float("nan"), 0.3], 2, fresh=4)


def test_seed_pool_records_in_candidate_order():
    pool = SeedPool({7: [30, 10, 20], 3: [1, 2]})
    assert pool.prompt_ids == [7, 3]
    assert pool.candidates(7) == [30, 10, 20]
    assert pool.record(7, 20, 0.5, version=1)
    assert pool.record(7, 30, 0.25, version=1)
    assert pool.observations(7) == [Observation(30, 0.25, 1), Observation(20, 0.5, 1)]
    assert pool.rewards(7) == {30: 0.25, 20: 0.5}
    assert pool.unexplored(7) == [10]
    assert pool.explored_count(7) == 2 and pool.explored_count(3) == 0
    assert pool.total_explored() == 2


def test_seed_pool_replaces_only_with_same_or_newer_weights():
    pool = SeedPool({0: [5]})
    pool.record(0, 5, 1.0, version=3)
    assert not pool.record(0, 5, 2.0, version=2)  # a late result from older weights
    assert pool.rewards(0) == {5: 1.0}
    assert pool.record(0, 5, 3.0, version=3)
    assert pool.record(0, 5, 4.0, version=4)
    assert pool.observations(0) == [Observation(5, 4.0, 4)]


def test_seed_pool_errors():
    with pytest.raises(ValueError, match="more than once"):
        SeedPool({0: [1, 2, 1]})
    pool = SeedPool({0: [1, 2]})
    with pytest.raises(ValueError, match="seed 9 is not a candidate of prompt 0"):
        pool.record(0, 9, 1.0, version=0)
    with pytest.raises(KeyError, match="prompt 4"):
        pool.record(4, 1, 1.0, version=0)
    with pytest.raises(ValueError, match="finite"):
        pool.record(0, 1, float("inf"), version=0)


def test_seed_pool_round_trip_is_exact():
    pool = SeedPool({2: [11, 12, 13], 0: [4]})
    pool.record(2, 13, 0.1 + 0.2, version=5)
    pool.record(2, 11, -1e-300, version=6)
    pool.record(0, 4, 1.0, version=6)
    restored = SeedPool.from_dict(json.loads(json.dumps(pool.to_dict())))
    assert restored.to_dict() == pool.to_dict()
    assert restored.prompt_ids == [2, 0]
    assert restored.observations(2) == pool.observations(2)
    assert restored.rewards(2)[13] == 0.1 + 0.2


# -- allocation: uniform -------------------------------------------------------------------------


def test_uniform_planner_splits_the_budget_evenly():
    pool = SeedPool({0: range(10), 1: range(10), 2: range(2)})
    planner = UniformPlanner()
    planner.start(pool, group_size=4, budget=17)
    assert planner.next_round(pool) == {0: 6, 1: 6, 2: 2}  # 17 = 5 + 5 + 5 + 2 extra; prompt 2 capped
    assert planner.next_round(pool) == {}
    planner.start(pool, group_size=4, budget=2)
    assert planner.next_round(pool) == {0: 1, 1: 1}


def test_uniform_planner_round_trip():
    pool = SeedPool({0: range(4)})
    planner = make_planner("uniform")
    planner.start(pool, group_size=2, budget=3)
    restored = planner_from_dict(json.loads(json.dumps(planner.to_dict())))
    assert restored.to_dict() == planner.to_dict()
    assert restored.next_round(pool) == {0: 3}


# -- allocation: bandit --------------------------------------------------------------------------

STDS = np.array([0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0])


def _explore(planner, pool, truth, group_size, budget):
    """Drive `planner` over `pool` like the controller does, scoring seeds with `truth`."""
    planner.start(pool, group_size, budget)
    given, rounds = 0, []
    while allocation := planner.next_round(pool):
        rounds.append(allocation)
        for prompt_id, count in allocation.items():
            assert count > 0
            unexplored = pool.unexplored(prompt_id)
            assert count <= len(unexplored)
            for seed in unexplored[:count]:
                pool.record(prompt_id, seed, truth[prompt_id][seed], version=0)
        given += sum(allocation.values())
        assert given <= budget
    return rounds


def _objective(pool, truth, group_size):
    """sum_p V_G: the best group's variance, or the explored seeds plus the next fresh ones."""
    total = 0.0
    for p in pool.prompt_ids:
        rewards = list(pool.rewards(p).values())
        if len(rewards) >= group_size:
            total += group_variance([rewards[i] for i in max_variance_subset(rewards, group_size)])
        else:
            fresh = [truth[p][s] for s in pool.unexplored(p)[: group_size - len(rewards)]]
            total += group_variance(rewards + fresh)
    return total


def test_bandit_explores_wide_prompts_more_and_beats_uniform():
    g, candidates = 8, 128
    budget = 4 * g * len(STDS)
    allocations, bandit, uniform = [], [], []
    for rep in range(20):
        rng = np.random.default_rng(100 + rep)
        truth = {p: rng.normal(rng.normal(), std, candidates) for p, std in enumerate(STDS)}
        pool = SeedPool({p: range(candidates) for p in truth})
        _explore(BanditPlanner(round_samples=32), pool, truth, g, budget)
        allocations.append([pool.explored_count(p) for p in pool.prompt_ids])
        bandit.append(_objective(pool, truth, g))
        pool = SeedPool({p: range(candidates) for p in truth})
        _explore(UniformPlanner(), pool, truth, g, budget)
        uniform.append(_objective(pool, truth, g))
    mean_allocation = np.mean(allocations, axis=0)
    assert spearmanr(mean_allocation, STDS).statistic > 0.8
    assert mean_allocation[-1] > 4 * mean_allocation[0]
    assert np.mean(bandit) > 1.2 * np.mean(uniform)


def test_binary_value_is_the_beta_binomial_expectation():
    """The exact binary curve against a simulation of what it claims: draw p ~ Beta(a, b), then m
    Bernoulli(p) rewards, and take the best group of the whole pool."""
    rng = np.random.default_rng(2)
    successes, failures, a, b, g, m = 1, 4, 1.5, 3.0, 6, 7
    new_successes = rng.binomial(m, rng.beta(a, b, size=200_000))
    best = []
    for y in range(m + 1):  # the best group of each pool the draws can produce
        pool = [1.0] * (successes + y) + [0.0] * (failures + m - y)
        best.append(group_variance([pool[i] for i in max_variance_subset(pool, g)]))
    simulated = np.asarray(best)[new_successes]
    assert _binary_value(successes, failures, a, b, g, m) == pytest.approx(np.mean(simulated), abs=3e-3)


def test_bandit_leaves_prompts_that_always_fail_or_pass_alone():
    """With history saying prompts 0-3 never (or always) pass and 4-7 pass half the time, only
    the latter get more than their initial chunk while the budget is short."""
    g, rates = 8, [0, 0, 1, 1, 0.5, 0.5, 0.5, 0.5]
    for rep in range(5):
        rng = np.random.default_rng(rep)
        planner = BanditPlanner(round_samples=16)
        for p, rate in enumerate(rates):  # the previous epoch's groups of the same prompts
            planner.observe_group(p, (rng.random(g) < rate).astype(float))
        truth = {p: (rng.random(64) < rate).astype(float) for p, rate in enumerate(rates)}
        pool = SeedPool({p: range(64) for p in truth})
        _explore(planner, pool, truth, g, budget=g * len(rates))
        explored = [pool.explored_count(p) for p in pool.prompt_ids]
        assert explored[:4] == [4, 4, 4, 4]
        assert sum(explored[4:]) > 4 * 4 + 16


def test_bandit_stops_when_every_group_is_as_varied_as_it_can_be():
    pool = SeedPool({p: range(10) for p in range(3)})
    for p in range(3):
        pool.record(p, 0, 0.0, version=0)
        pool.record(p, 1, 1.0, version=0)
    planner = BanditPlanner(round_samples=64, initial=2)
    planner.start(pool, group_size=2, budget=100)
    assert planner.next_round(pool) == {}  # a 0 and a 1: variance 0.25, the most a pair can have


def test_bandit_respects_candidates_and_stops_when_they_run_out():
    rng = np.random.default_rng(3)
    truth = {p: rng.normal(0, 1, 6) for p in range(4)}
    pool = SeedPool({p: range(6) for p in truth})
    _explore(BanditPlanner(round_samples=64), pool, truth, 4, budget=1000)
    assert pool.total_explored() <= 24


def test_bandit_round_zero_with_a_short_budget_follows_pool_order_on_ties():
    pool = SeedPool({p: range(20) for p in [5, 3, 9, 1, 7]})
    planner = BanditPlanner(round_samples=16, chunk=4)
    planner.start(pool, group_size=8, budget=10)
    assert planner.next_round(pool) == {5: 4, 3: 4, 9: 2}
    assert planner.next_round(pool) == {}


def test_bandit_is_deterministic_and_resumes_from_its_state():
    rng = np.random.default_rng(7)
    truth = {p: rng.normal(0, std, 64) for p, std in enumerate(STDS)}

    def run(planner):
        pool = SeedPool({p: range(64) for p in truth})
        return _explore(planner, pool, truth, 8, budget=200)

    first = run(BanditPlanner(round_samples=24, seed=3))
    assert run(BanditPlanner(round_samples=24, seed=3)) == first

    # Stop after two rounds, checkpoint through JSON, and go on with the restored planner.
    planner = BanditPlanner(round_samples=24, seed=3)
    pool = SeedPool({p: range(64) for p in truth})
    planner.start(pool, 8, 200)
    rounds = []
    for _ in range(2):
        rounds.append(planner.next_round(pool))
        for p, count in rounds[-1].items():
            for seed in pool.unexplored(p)[:count]:
                pool.record(p, seed, truth[p][seed], version=0)
    planner = planner_from_dict(json.loads(json.dumps(planner.to_dict())))
    while allocation := planner.next_round(pool):
        rounds.append(allocation)
        for p, count in allocation.items():
            for seed in pool.unexplored(p)[:count]:
                pool.record(p, seed, truth[p][seed], version=0)
    assert rounds == first


def test_bandit_state_round_trip_keeps_history():
    planner = BanditPlanner(round_samples=8, chunk=2, initial=3, optimism=0.5, mc_draws=64, seed=11)
    planner.observe_group(4, [0.1, 0.7, 0.4])
    planner.observe_group(4, [0.2, 0.2])
    planner.observe_group(9, [1.5])
    state = json.loads(json.dumps(planner.to_dict()))
    restored = BanditPlanner.from_dict(state)
    assert restored.to_dict() == planner.to_dict() == state


def test_bandit_rejects_bad_arguments():
    with pytest.raises(ValueError, match="round_samples"):
        BanditPlanner(round_samples=0)
    with pytest.raises(ValueError, match="optimism"):
        BanditPlanner(round_samples=8, optimism=-1)
    with pytest.raises(ValueError, match="finite"):
        BanditPlanner(round_samples=8).observe_group(0, [float("nan")])
    with pytest.raises(RuntimeError, match="before start"):
        BanditPlanner(round_samples=8).next_round(SeedPool({0: [1]}))
    with pytest.raises(ValueError, match=r"'bandit', 'uniform'"):
        make_planner("thompson")


def test_bandit_round_is_fast_for_64_prompts():
    rng = np.random.default_rng(5)
    pool = SeedPool({p: range(200) for p in range(64)})
    for p in range(64):
        for seed in range(8):
            pool.record(p, seed, rng.normal(0, rng.uniform(0.1, 1)), version=0)
    planner = BanditPlanner(round_samples=128, mc_draws=256)
    planner.start(pool, group_size=16, budget=10_000)
    planner.next_round(pool)  # round 0: nothing to top up (initial 4 < 8), so a greedy round
    times = []
    for _ in range(3):
        start = time.perf_counter()
        planner.next_round(pool)
        times.append(time.perf_counter() - start)
    # ~20 ms on one idle core; the bound leaves room for a loaded test machine.
    assert min(times) < 0.25


# -- stale-rank monitor --------------------------------------------------------------------------


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # Average ranks for ties: ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4).
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(
        np.corrcoef([1, 2.5, 2.5, 4], [1, 2, 3, 4])[0, 1]
    )
    assert spearman([1, 1, 1], [1, 2, 3]) is None
    assert spearman([1, 2], [2, 1]) is None


def test_stale_rank_monitor_falls_back_and_recovers():
    rng = np.random.default_rng(0)
    monitor = StaleRankMonitor(threshold=0.3)
    assert monitor.healthy and monitor.last is None and monitor.message is None

    def groups(sign):
        out = []
        for _ in range(6):
            stale = rng.normal(size=8)
            out.append((stale, sign * stale + rng.normal(0, 0.1, 8)))
        return out

    assert monitor.observe(groups(+1)) > 0.9
    assert monitor.healthy and monitor.message is None
    rho = monitor.observe(groups(-1))  # the new weights rank the seeds the other way round
    assert rho < -0.9 and not monitor.healthy and monitor.last == rho
    assert monitor.message == f"stale-rank Spearman {rho:.2f} < threshold 0.30: falling back to random seeds"
    assert monitor.observe(groups(-1)) < 0 and monitor.message is None  # no change, no message
    assert monitor.observe([([1, 1, 1], [1, 2, 3]), ([1, 2], [1, 2])]) is None  # nothing measurable
    assert not monitor.healthy and monitor.message is None
    rho = monitor.observe(groups(+1))
    assert monitor.healthy
    assert monitor.message == f"stale-rank Spearman {rho:.2f} >= 0.30 again: using explored seeds"


def test_stale_rank_monitor_skips_groups_without_a_correlation():
    monitor = StaleRankMonitor(threshold=0.5, min_pairs=4)
    groups = [([1, 2, 3, 4], [1, 2, 3, 4]), ([5, 5, 5, 5], [1, 2, 3, 4]), ([1, 2, 3], [3, 2, 1])]
    assert monitor.observe(groups) == pytest.approx(1.0)  # only the first group counts


def test_stale_rank_monitor_round_trip():
    monitor = StaleRankMonitor(threshold=0.25, min_pairs=5)
    monitor.observe([([1, 2, 3, 4, 5], [5, 4, 3, 2, 1])])
    restored = StaleRankMonitor.from_dict(json.loads(json.dumps(monitor.to_dict())))
    assert restored.to_dict() == monitor.to_dict()
    assert not restored.healthy and restored.last == pytest.approx(-1.0)
