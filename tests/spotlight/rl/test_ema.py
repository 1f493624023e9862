"""`train.ema_decay`: the EMA of the trained parameters (spotlight/rl/ema.py).

- The update against its closed form, and its fixed point (an unmoved parameter's average stays put).
- Checkpoints: the EMA is saved and verified with the rest; a run that keeps one refuses a
  checkpoint without it, or with other names or shapes, in one line; a run without one ignores it.
- A LoRA run: `final/` holds the EMA adapters (diffusers' LoRA file), and a run killed after a
  checkpoint and resumed ends with the weights and the EMA of the uninterrupted run, bit for bit.
- Evaluation (`Runtime.evaluate`): with the EMA equal to the weights it samples what the workers
  sample; after an update it differs from a rollout and leaves the weights and the optimiser as
  they were; through `RayRuntime` it gives the local runtime's samples bit for bit.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

from conftest import small_dit_config
from schedulers.request import Kind, Request
from spotlight.rl.ema import ema_init, ema_step, ema_update_, swapped_in
from spotlight.rl.grpo import group_advantages
from spotlight.rl.lora import trained_state
from spotlight.rl.prompts import prompt_set
from spotlight.runtime.local import LocalRuntime
from spotlight.checkpoints import checkpoint
from spotlight.train.trainer import Trainer

DECAY = 0.5  # large steps: a few updates move the average visibly away from the weights


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


# ---- the math ---------------------------------------------------------------------------------------


def test_the_update_is_the_closed_form_and_leaves_an_unmoved_parameter_exactly():
    gen = torch.Generator().manual_seed(0)
    d, n = 0.9, 7
    e0 = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    ps = [torch.randn(3, 5, generator=gen, dtype=torch.float64) for _ in range(n)]
    ema = {"w": e0.clone()}
    for p in ps:
        ema_update_(ema, {"w": p}, d)
    # e_n = d^n e_0 + (1 - d) sum_k d^(n-k) p_k
    closed = d ** n * e0 + (1 - d) * sum(d ** (n - k) * p for k, p in enumerate(ps, start=1))
    torch.testing.assert_close(ema["w"], closed, rtol=0, atol=1e-12)

    # In float32: in place equals out of place bit for bit; decay 0 is the parameter.
    e, p = torch.randn(1037, generator=gen), torch.randn(1037, generator=gen)
    state = ema_init({"w": e})
    ema_update_(state, {"w": p.bfloat16()}, 0.999)
    assert state["w"].dtype == torch.float32 and torch.equal(state["w"], ema_step(e, p.bfloat16(), 0.999))
    assert torch.equal(ema_step(e, p, 0.0), p)
    # The fixed point, exactly (decay * e + (1 - decay) * e moves ~1/6 of float32 elements by an ulp).
    assert torch.equal(ema_step(e, e.clone(), 0.999), e) and torch.equal(ema_step(e, e.clone(), 0.3), e)


def test_swapped_in_restores_the_model_bit_for_bit_and_keeps_its_parameters():
    model = torch.nn.Linear(3, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = list(model.parameters())
    other = {k: torch.full_like(v, 0.25) for k, v in before.items()}
    with swapped_in(model, other):
        assert torch.equal(model.weight, other["weight"])
    assert _equal(model.state_dict(), before) and list(model.parameters()) == params


# ---- checkpoints ------------------------------------------------------------------------------------


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_a_checkpoint_carries_the_ema_and_a_run_that_keeps_one_refuses_one_without(tmp_path):
    model, optimizer = _model_and_optimizer()
    ema = {k: v.float() + 1 for k, v in model.state_dict().items()}
    with_ema = checkpoint.save(tmp_path / "a", 1, model, optimizer, ema=ema)
    without = checkpoint.save(tmp_path / "b", 1, model, optimizer)
    assert (with_ema.path / checkpoint.EMA).is_file() and not (without.path / checkpoint.EMA).exists()
    assert checkpoint.verify(with_ema) is None and checkpoint.verify(without) is None

    into = {k: torch.zeros_like(v) for k, v in ema.items()}
    checkpoint.load(with_ema, model, optimizer, ema=into)
    assert _equal(into, ema)
    checkpoint.load(with_ema, model, optimizer)  # a run without an EMA ignores it

    with pytest.raises(checkpoint.CheckpointError, match="no ema.safetensors: written by a run without"):
        checkpoint.load(without, model, optimizer, ema=into)
    renamed = {"other": v for v in list(ema.values())[:1]} | dict(list(ema.items())[1:])
    with pytest.raises(checkpoint.CheckpointError, match="ema.safetensors: tensor names differ"):
        checkpoint.load(with_ema, model, optimizer, ema=renamed)
    reshaped = {**ema, "bias": torch.zeros(3)}
    with pytest.raises(checkpoint.CheckpointError, match=r"ema.safetensors: bias is \(2,\)"):
        checkpoint.load(with_ema, model, optimizer, ema=reshaped)
    assert _equal(into, ema)  # refused: nothing of the run's EMA changed

    path = with_ema.path / checkpoint.EMA
    path.write_bytes(path.read_bytes()[:-8])
    assert "ema.safetensors has" in checkpoint.verify(with_ema)


# ---- a LoRA run: final/ and an exact resume ---------------------------------------------------------


def _cfg():
    """3 iterations, each evaluated (by the learner, with the EMA), checkpoints after 2 and 3."""
    return small_dit_config(train={"steps": 3, "checkpoint_every": 2, "ema_decay": DECAY, "eval_prompts": 1,
                                   "eval_seeds": 2}, policy={"lora": {"rank": 2, "alpha": 4}})


class _Killed(Exception):
    pass


class _KilledInUpdate(LocalRuntime):
    """Dies in the update of iteration `at` (after the checkpoint of the iteration before it)."""

    at = 2

    def update(self, *args, **kwargs):
        if self.version == self.at:
            raise _Killed
        return super().update(*args, **kwargs)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted LoRA run of 3 iterations with an EMA: (run folder, its learner)."""
    out = tmp_path_factory.mktemp("straight")
    rt = LocalRuntime(_cfg())
    Trainer(_cfg(), out, progress=False).build(rt).train()
    assert all("eval_reward" in json.loads(row) for row in (out / "metrics.jsonl").read_text().splitlines())
    return out, rt.learner


def test_final_holds_the_ema_adapters_not_the_trained_ones(straight):
    out, learner = straight
    final = load_file(str(out / "final" / "pytorch_lora_weights.safetensors"))
    # diffusers' names: "transformer." before, no peft adapter name inside.
    by_ours = {"transformer." + k.replace(".default", ""): v for k, v in learner.ema.items()}
    assert _equal(final, by_ours)
    trained = trained_state(learner.policy.model)
    assert not all(torch.equal(learner.ema[k], trained[k]) for k in trained)
    assert "exponential moving average" in (out / "final" / "README.md").read_text()


def test_a_run_killed_after_a_checkpoint_resumes_to_the_same_weights_and_ema(tmp_path, straight):
    _, learner = straight
    with pytest.raises(_Killed):
        Trainer(_cfg(), tmp_path, progress=False).build(_KilledInUpdate(_cfg())).train()
    assert checkpoint.latest(tmp_path / "checkpoints").step == 2
    rt = LocalRuntime(_cfg())
    trainer = Trainer(_cfg(), tmp_path, progress=False).build(rt)
    assert trainer.start_step == 2
    trainer.train()
    assert _equal(rt.learner.ema, learner.ema)
    assert _equal(trained_state(rt.learner.policy.model), trained_state(learner.policy.model))
    newest = checkpoint.latest(tmp_path / "checkpoints").path / checkpoint.EMA
    assert _equal(load_file(str(newest)), learner.ema)


def test_a_stored_checkpoint_with_an_ema_is_pulled_back(tmp_path, straight):
    from cloud.store import LocalStore
    from spotlight.train.checkpoint_sync import CheckpointSync

    out, learner = straight
    sync = CheckpointSync(LocalStore(tmp_path / "store"))
    sync.push(out, 3, must=True)
    assert sync.pull(tmp_path / "fresh", 0) == 3
    assert _equal(load_file(str(tmp_path / "fresh/checkpoints/step-000003" / checkpoint.EMA)), learner.ema)


# ---- evaluation ------------------------------------------------------------------------------------


def _eval_cfg(kind: str = "local"):
    runtime = {"kind": kind, "spot_workers": 0, "ondemand_workers": 1}
    return small_dit_config(train={"ema_decay": DECAY}, runtime=runtime)


def _requests(cfg, name: str, version: int) -> list[Request]:
    prompts = prompt_set(cfg.prompts, cfg.seed)[:2]
    return [Request(f"{name}/p{p.id}", Kind.ROLLOUT, p.id, p.text, (7, 8), weight_version=version, order=i)
            for i, p in enumerate(prompts)]


def _advantages(cfg) -> torch.Tensor:
    n = 2 * len(_requests(cfg, "x", 0)[0].seeds)
    return group_advantages(torch.arange(n, dtype=torch.float32), n // 2)


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """A local runtime's evaluation before and after one update (full weights: no LoRA here)."""
    cfg = _eval_cfg()
    rt = LocalRuntime(cfg)
    rt.build(tmp_path_factory.mktemp("eval") / "checkpoints")
    before = {"evaluate": rt.evaluate(_requests(cfg, "e0", 0)), "rollout": rt.rollout(_requests(cfg, "r0", 0))}
    rt.update(rt.rollout(_requests(cfg, "it0", 0)), _advantages(cfg))
    rt.publish()
    weights = {k: v.clone() for k, v in trained_state(rt.learner.policy.model).items()}
    optimizer = copy.deepcopy(rt.learner.optimizer.state_dict())
    after = {"evaluate": rt.evaluate(_requests(cfg, "e1", 1)), "rollout": rt.rollout(_requests(cfg, "r1", 1))}
    return rt, before, after, weights, optimizer


def test_evaluation_samples_with_the_ema_and_touches_no_weight(evaluated):
    rt, before, after, weights, optimizer = evaluated
    # The EMA starts at the weights: the learner then samples exactly what a worker samples.
    assert all(torch.equal(e.images, r.images) for e, r in zip(before["evaluate"], before["rollout"]))
    assert len(after["evaluate"]) == 2 and all(e.data == {} for e in after["evaluate"])
    assert not any(torch.equal(e.images, r.images) for e, r in zip(after["evaluate"], after["rollout"]))
    assert _equal(trained_state(rt.learner.policy.model), weights)
    state = rt.learner.optimizer.state_dict()
    assert state["param_groups"] == optimizer["param_groups"]
    assert all(_equal(state["state"][i], optimizer["state"][i]) for i in optimizer["state"])


def test_without_ema_evaluation_is_the_rollout(tmp_path):
    cfg = small_dit_config(train={"ema_decay": 0.0})
    rt = LocalRuntime(cfg)
    rt.build(tmp_path / "checkpoints")
    assert rt.learner.ema is None
    got = rt.evaluate(_requests(cfg, "e0", 0))
    assert len(got) == 2 and all(r.data for r in got)  # the workers' results, trajectories and all


@pytest.mark.slow  # a Ray cluster and four actors: ~20 s on 2 shared cores
def test_ray_runtime_evaluates_with_the_learners_ema_as_the_local_runtime_does(tmp_path, evaluated):
    import ray

    from spotlight.runtime.ray_runtime import RayRuntime

    _, _, local, weights, _ = evaluated
    cfg = _eval_cfg("ray")
    rt = RayRuntime(cfg)
    try:
        rt.build(tmp_path / "checkpoints")
        rt.update(rt.rollout(_requests(cfg, "it0", 0)), _advantages(cfg))
        rt.publish()
        got = rt.evaluate(_requests(cfg, "e1", 1))
        assert isinstance(got, ray.ObjectRef)  # as a rollout's: it goes to the reward actor as it is
        rt.rewards(got)  # the reward actor takes the ref as it is
        got = rt.fetch(got)
        assert all(torch.equal(g.images, e.images) for g, e in zip(got, local["evaluate"]))
        assert _equal(ray.get(rt.learner.weights.remote()), weights)
    finally:
        rt.shutdown()
