"""Seed exploration on stale weights, end to end in-process: the controller's Explorer, the
exploration requests the rollout worker computes, and the trainer's loop around them."""

import json

import pytest
import torch

from planners.seed_pool import SeedPool
from planners.selection import group_variance, max_variance_subset
from schedulers.clock import ManualClock
from schedulers.queue import PullQueue, Status
from schedulers.request import Kind, Request
from spotlight.rl.dit_policy import DiTPolicy
from spotlight.iteration.exploration import Explorer
from spotlight.rl.prompts import Prompt, prompt_set
from spotlight.runtime.rollout_worker import RolloutWorker
from spotlight.train.trainer import Trainer
from tests.conftest import small_dit_config, small_llm_config

EXPLORE = {"enabled": True, "planner": "bandit", "samples_per_step": 16, "candidates_per_prompt": 12,
           "request_size": 4, "round_samples": 8}


def _explorer(cfg):
    return Explorer(cfg, prompt_set(cfg.prompts, cfg.seed))


def _fill(explorer, step, rewards_of):
    """Explore every candidate seed of iteration `step` with rewards_of(prompt_id, seed)."""
    session = explorer.session(step, step - 1)
    for pid in session.pool.prompt_ids:
        for seed in session.pool.candidates(pid):
            session.pool.record(pid, seed, rewards_of(pid, seed), step - 1)
    return session


def test_the_rollout_uses_the_most_contrasting_explored_seeds():
    cfg = small_dit_config(exploration=EXPLORE)
    ex = _explorer(cfg)
    assert [r.seeds for r in ex.plan(0)] == [tuple(ex.candidate_seeds(0)[:4])] * 2  # nothing explored yet

    reward = {}
    gen = torch.Generator().manual_seed(0)
    session = _fill(ex, 1, lambda pid, seed: reward.setdefault((pid, seed), torch.rand(1, generator=gen).item()))
    for req in ex.plan(1):
        seeds = session.pool.candidates(req.prompt_id)
        values = [reward[(req.prompt_id, s)] for s in seeds]
        best = group_variance([values[i] for i in max_variance_subset(values, 4)])
        assert group_variance([reward[(req.prompt_id, s)] for s in req.seeds]) == pytest.approx(best)
        assert req.weight_version == 1 and req.kind is Kind.ROLLOUT


def test_a_prompt_explored_less_than_a_group_keeps_its_contrasting_seeds_and_fresh_ones():
    cfg = small_dit_config(exploration=EXPLORE)
    ex = _explorer(cfg)
    session = ex.session(1, 0)
    values = [0.5, 0.0, 0.55, 1.0, 0.4, 0.5]  # 0.0 and 1.0 contrast; 0.4 is the monitor's third
    for pid in session.pool.prompt_ids:
        for seed, value in zip(session.pool.candidates(pid), values):
            session.pool.record(pid, seed, value, 0)
    seeds = ex.candidate_seeds(1)
    for req in ex.plan(1):
        assert req.seeds == (seeds[1], seeds[3], seeds[4], seeds[6])  # three explored, one fresh


def test_an_llm_skips_prompts_its_stale_weights_always_or_never_solve():
    cfg = small_llm_config(exploration={**EXPLORE, "prompt_candidates": 2})
    ex = _explorer(cfg)
    candidates = ex.candidate_prompts(1)
    assert len(candidates) == 8
    # Prompts 0..5 of the draw are solved always or never; 6 and 7 are split.
    mixed = {candidates[6].id, candidates[7].id}
    always = {p.id for p in candidates[:3]}
    _fill(ex, 1, lambda pid, seed: float(pid in always or (pid in mixed and seed % 2 == 0)))
    chosen = ex.plan(1)
    assert {r.prompt_id for r in chosen} >= mixed
    for req in chosen:
        if req.prompt_id in mixed:  # a split group: right and wrong in equal numbers
            assert sorted(s % 2 for s in req.seeds) == [0, 0, 1, 1]


def test_a_broken_stale_ranking_falls_back_to_random_seeds_and_says_so(logged):
    cfg = small_dit_config(exploration={**EXPLORE, "stale_rank_threshold": 0.5})
    lines = logged
    ex = _explorer(cfg)
    _fill(ex, 1, lambda pid, seed: float(seed))
    requests = ex.plan(1)
    # The fresh weights rank every explored seed the other way round.
    fresh = torch.tensor([-float(s) for r in requests for s in r.seeds])
    out = ex.observe(1, requests, fresh)
    assert out["stale_rank_spearman"] == pytest.approx(-1.0)
    assert out["exploration_fallback"] is True
    assert any("random" in line for line in lines)

    session = _fill(ex, 2, lambda pid, seed: float(seed))
    for req in ex.plan(2):  # random among the explored, not the extremes
        values = [float(s) for s in session.pool.candidates(req.prompt_id)]
        best = group_variance([values[i] for i in max_variance_subset(values, 4)])
        assert group_variance([float(s) for s in req.seeds]) < best


def test_explorer_state_round_trips(tmp_path):
    cfg = small_dit_config(exploration=EXPLORE)
    ex = _explorer(cfg)
    _fill(ex, 1, lambda pid, seed: seed * 0.1 + pid)
    ex.save(tmp_path, 1)
    again = _explorer(cfg)
    assert again.load(tmp_path, 1) and not again.load(tmp_path, 2)
    assert [r.seeds for r in again.plan(1)] == [r.seeds for r in ex.plan(1)]
    assert json.loads((tmp_path / "step-000001.json").read_text())["pool_step"] == 1


# ---- the worker side ------------------------------------------------------------------------------

def test_cheaper_exploration_replays_the_seed_and_ships_no_trajectory():
    cfg = small_dit_config(sampler={"num_steps": 6}, exploration={**EXPLORE, "num_steps": 3})
    policy = DiTPolicy.from_config(cfg)
    cheap = policy.for_exploration(3, ode=False)
    assert cheap.model is policy.model and cheap.num_steps == 3 and policy.num_steps == 6
    prompts = [Prompt(0, "a red image")] * 2
    full, short = policy.init_state(prompts, (5, 6)), cheap.init_state(prompts, (5, 6))
    assert torch.equal(full.trajectory, short.trajectory)  # same initial noise
    assert torch.equal(cheap.sampler.step_noise(short, 1), policy.sampler.step_noise(full, 1))
    ode = policy.for_exploration(None, ode=True)
    assert torch.equal(ode.advance(prompts, ode.init_state(prompts, (5, 6))).latest,
                       ode.advance(prompts, ode.init_state(prompts, (5, 6))).latest)
    assert len(ode.sampler.sde_steps) == 0

    queue = PullQueue(ManualClock())
    queue.put(Request("ex", Kind.EXPLORATION, 0, "a red image", (5, 6), weight_version=0))
    worker = RolloutWorker("w", cfg, queue, policy=policy)
    worker.set_weights(0)
    assert worker.serve([Kind.EXPLORATION])["completed"] == 1
    result = queue.result("ex")
    assert result.images.shape[0] == 2 and result.data == {}
    assert queue.stats()["checkpoints"] == 2  # steps 1 and 2 of 3 committed: the short schedule ran


class CancelAfter:
    """A queue wrapper that cancels exploration once the worker has heartbeated `beats` times."""

    def __init__(self, queue, beats):
        self.queue, self.beats = queue, beats

    def __getattr__(self, name):
        return getattr(self.queue, name)

    def heartbeat(self, worker, progress=None, report_cancelled=False):
        self.beats -= 1
        if self.beats == 0:
            self.queue.cancel(Kind.EXPLORATION)
        return self.queue.heartbeat(worker, progress, report_cancelled)


def test_a_worker_drops_cancelled_exploration_at_the_next_step():
    cfg = small_dit_config(exploration=EXPLORE)
    policy = DiTPolicy.from_config(cfg)
    queue = PullQueue(ManualClock())
    queue.put([Request(f"ex{i}", Kind.EXPLORATION, 0, "a red image", (i,), weight_version=0, order=i)
               for i in range(2)])
    worker = RolloutWorker("w", cfg, CancelAfter(queue, beats=2), policy=policy)
    worker.set_weights(0)
    out = worker.serve()
    assert out["cancelled"] == 1 and out["completed"] == 0
    assert queue.status("ex0") is Status.CANCELLED and queue.status("ex1") is Status.CANCELLED
    assert queue.stats()["checkpoints"] == 1  # it stopped after one step, not at the end


# ---- the trainer ----------------------------------------------------------------------------------

def _run(tmp_path, name, cfg):
    summary = Trainer(cfg, tmp_path / name, progress=False).build().train()
    rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return summary, rows


def test_training_with_exploration_reports_it_and_resumes_bit_identically(tmp_path):
    cfg = small_dit_config(exploration=EXPLORE)
    _, rows = _run(tmp_path, "full", cfg)
    # The last train phase explores too: a run extended with more steps resumes with its seeds.
    assert [r["explored_samples"] for r in rows] == [16, 16, 16, 16]
    # The first iteration is explored too, with the starting weights, before its rollout; its
    # exploration used the rollout's own weights, so it says nothing of stale ranks.
    assert [r.get("explored_first_samples") for r in rows] == [16, None, None, None]
    assert rows[0]["stale_rank_spearman"] is None
    assert all(isinstance(r["stale_rank_spearman"], float) for r in rows[1:])
    assert all("group_reward_std" in r for r in rows)

    # Stop after iteration 2 (a checkpoint), resume: the same weights as the run that never stopped.
    _run(tmp_path, "resumed", small_dit_config(exploration=EXPLORE, train={"steps": 2}))
    _run(tmp_path, "resumed", cfg)
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "full" / "final" / "diffusion_pytorch_model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "final" / "diffusion_pytorch_model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    resumed = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("explored_first_samples") for r in resumed] == [16, None, None, None]  # not again at 2


def test_without_explore_first_the_first_iteration_rolls_out_plain_seeds(tmp_path):
    cfg = small_dit_config(exploration={**EXPLORE, "explore_first": False}, train={"steps": 1})
    _, rows = _run(tmp_path, "plain", cfg)
    assert "explored_first_samples" not in rows[0] and rows[0]["explored_for_this_step"] == 0


def test_the_random_planner_explores_only_probe_seeds_and_still_measures(tmp_path):
    cfg = small_llm_config(exploration={**EXPLORE, "planner": "random", "monitor_seeds": 3})
    _, rows = _run(tmp_path, "random", cfg)
    assert [r["explored_samples"] for r in rows] == [12, 12, 12, 12]  # 4 prompts x 3 probes
    assert all("stale_rank_spearman" in r for r in rows)


def test_a_pool_rejects_seeds_that_are_not_candidates():
    pool = SeedPool({0: [1, 2]})
    with pytest.raises(ValueError):
        pool.record(0, 3, 1.0, 0)
