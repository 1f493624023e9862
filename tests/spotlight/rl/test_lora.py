"""LoRA (`policy.lora`, spotlight/rl/lora.py): adapters injected with peft on the real tiny
diffusers and transformers models; only they train, travel and are checkpointed; the KL reference
is the base with the adapters off; workers rebuild the learner's exact model from its base and
adapters. The learning runs and `final/` round trips are in tests/spotlight/train/test_train_e2e.py, resume in
tests/spotlight/train/test_trainer.py, chaos on Ray in tests/spotlight/runtime/test_ray_runtime.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from spotlight.config import ConfigError, default_config
from spotlight.rl.dit_model import velocity
from spotlight.rl.lora import (LocalBase, Reference, add_lora, base_state, has_lora, load_trained_state, trainable,
                               trained_state)
from spotlight.rl.prompts import prompt_set
from spotlight.runtime.learner import Learner, build_policy
from spotlight.runtime.rollout_worker import RolloutWorker

from conftest import small_dit_config, small_llm_config

LORA = {"lora": {"rank": 4, "alpha": 8}}


def _dit_out(model, policy):
    x = torch.randn(2, policy.tokens, 4 * policy.channels, generator=torch.Generator().manual_seed(1))
    emb, mask = policy._conditioning(["red square", "blue"])
    return velocity(model, x, torch.tensor([0.7, 0.2]), emb, mask, policy.side)


def _perturb(model, seed=0):
    """Adapters away from their zero start, as training moves them."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in trainable(model):
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def test_adapters_start_at_zero_are_the_only_trained_weights_and_are_seeded():
    cfg = small_dit_config(policy=LORA)
    policy = build_policy(cfg)
    before = _dit_out(policy.model, policy)
    torch.manual_seed(5)
    expected_draw = torch.rand(3)
    torch.manual_seed(5)
    add_lora(policy.model, cfg)
    assert torch.equal(torch.rand(3), expected_draw)  # the global RNG is left as it was
    assert torch.equal(_dit_out(policy.model, policy), before)  # lora_B starts at zero
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    assert set(trained_state(policy.model)) == set(names)
    # 12 target linears per block x 2 blocks x (A, B)
    assert len(names) == 12 * 2 * 2
    again = add_lora(build_policy(cfg).model, cfg)
    other = add_lora(build_policy(small_dit_config(policy=LORA, seed=1)).model, small_dit_config(policy=LORA, seed=1))
    a, b, c = trained_state(policy.model), trained_state(again), trained_state(other)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if "lora_A" in k)


def test_the_reference_is_the_base_with_no_copy_and_leaves_the_adapters_trainable():
    cfg = small_dit_config(policy=LORA, grpo={"kl_beta": 0.01})
    policy = build_policy(cfg)
    base_out = _dit_out(policy.model, policy)
    add_lora(policy.model, cfg)
    policy.set_reference()
    assert isinstance(policy.ref_model, Reference) and policy.ref_model.model is policy.model
    _perturb(policy.model)
    trained_out = _dit_out(policy.model, policy)
    assert not torch.equal(trained_out, base_out)
    with torch.no_grad():
        assert torch.equal(_dit_out(policy.ref_model, policy), base_out)
    assert torch.equal(_dit_out(policy.model, policy), trained_out)  # adapters back on
    assert all(p.requires_grad for p in trainable(policy.model))


def test_trained_state_refuses_a_full_state_dict_and_base_state_has_the_plain_names():
    cfg = small_llm_config(policy=LORA)
    policy = build_policy(cfg)
    plain = {k: v.clone() for k, v in policy.model.state_dict().items()}
    add_lora(policy.model, cfg)
    base = base_state(policy.model)
    assert base.keys() == plain.keys() and all(torch.equal(base[k], plain[k]) for k in plain)
    with pytest.raises(KeyError, match="adapters"):
        load_trained_state(policy.model, plain)
    adapters = {k: torch.zeros_like(v) for k, v in trained_state(policy.model).items()}
    load_trained_state(policy.model, adapters)
    assert all(float(p.detach().abs().sum()) == 0 for p in trainable(policy.model))


@pytest.mark.parametrize("config", [small_dit_config, small_llm_config])
def test_a_worker_rebuilds_the_learners_model_from_its_base_and_published_adapters(config):
    cfg = config(policy=LORA, warm_start={"steps": 5})
    learner = Learner(cfg)
    learner.build()
    _perturb(learner.policy.model, seed=3)
    weights, base = learner.weights(), learner.base()
    assert set(weights) == set(trained_state(learner.policy.model)) and all("lora_" in k for k in weights)
    assert len(learner.optimizer.param_groups[0]["params"]) == len(weights)

    worker = RolloutWorker("w", cfg, queue=None).build(base)
    worker.set_weights(1, weights)
    assert has_lora(worker.policy.model)
    prompts = prompt_set(cfg.prompts, cfg.seed)[:2]
    a = learner.policy.rollout(prompts, [0, 1])
    b = worker.policy.rollout(prompts, [0, 1])
    assert a.data.keys() == b.data.keys() and all(torch.equal(a.data[k], b.data[k]) for k in a.data)
    with pytest.raises(ValueError, match="base"):
        RolloutWorker("w2", cfg, queue=None).build(None)


def test_adapters_train_in_float32_over_a_bfloat16_base():
    cfg = small_dit_config(policy=LORA)
    policy = build_policy(cfg)
    policy.model.to(torch.bfloat16)
    add_lora(policy.model, cfg)
    assert {p.dtype for p in trainable(policy.model)} == {torch.float32}
    assert {t.dtype for t in base_state(policy.model).values()} == {torch.bfloat16}
    _perturb(policy.model)
    out = _dit_out(policy.model, policy)
    out.square().mean().backward()
    # (the last block's text-stream outputs feed nothing: its text adapters get no gradient)
    grads = [p.grad for p in trainable(policy.model) if p.grad is not None]
    assert len(grads) > len(trainable(policy.model)) // 2 and all(g.dtype == torch.float32 for g in grads)
    with torch.no_grad():
        assert not torch.equal(_dit_out(Reference(policy.model), policy), out.detach())


def test_lora_config_is_checked():
    with pytest.raises(ConfigError, match="rank"):
        small_dit_config(policy={"lora": {"rank": -1}})
    with pytest.raises(ConfigError, match="target_modules"):
        small_dit_config(policy={"lora": {"rank": 2, "target_modules": []}})
    cfg = small_dit_config(policy={"lora": {"rank": 2, "target_modules": ["no_such_layer"]}})
    with pytest.raises(ValueError, match="no_such_layer"):
        add_lora(build_policy(cfg).model, cfg)


def test_the_model_card_names_the_base_reward_iterations_loading_and_config():
    import yaml

    from spotlight.checkpoints.model_card import model_card

    cfg = small_llm_config(policy={**LORA, "llm": {"pretrained_path": "/models/Qwen2.5-0.5B"}})
    card = model_card(cfg, 7)
    front = yaml.safe_load(card.split("---")[1])
    assert front["library_name"] == "peft" and front["base_model"] == "Qwen2.5-0.5B" and "lora" in front["tags"]
    assert "Base model: /models/Qwen2.5-0.5B" in card and "7 iterations" in card and "Reward: arithmetic" in card
    # The warm start changed the folder's weights: the base to load is the one final/ holds.
    assert 'PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("final/base"), "final")' in card
    assert "rank 4, alpha 8" in card and "warm-started for 20 supervised steps" in card
    as_released = model_card(small_llm_config(policy={**LORA, "llm": {"pretrained_path": "/models/Qwen2.5-0.5B"}},
                                              warm_start={"steps": 0}), 7)
    assert 'PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("/models/Qwen2.5-0.5B"), "final")' in as_released
    shown = yaml.safe_load(card.split("```yaml\n")[1].split("```")[0])
    assert default_config(shown) == cfg and "colour_width" not in shown["reward"]  # the same run, unused fields out
    # Components and a prompt file: no default reward name or built-in prompt set where neither trained it
    used = small_dit_config(reward={"components": [{"name": "colour", "weight": 1.0}, {"name": "ocr", "weight": 0.5}]},
                            prompts={"path": "my_prompts.txt"})
    shown = yaml.safe_load(model_card(used, 3).split("```yaml\n")[1].split("```")[0])
    assert "name" not in shown["reward"] and shown["reward"]["colour_width"] == 0.5
    assert "name" not in shown["prompts"] and "count" not in shown["prompts"]
    back = default_config(shown)  # the same run: only prompts.count, which a file's run never reads, came back default
    assert shown["prompts"]["path"] == "my_prompts.txt" and back.prompts.count != used.prompts.count
    assert replace(back, prompts=replace(back.prompts, count=used.prompts.count)) == used
    # a base in a bucket: no from_pretrained reads s3://, the snippet goes through Spotlight's cache
    bucket = model_card(small_llm_config(policy={**LORA, "llm": {"pretrained_path": "s3://my-models/qwen"}},
                                         warm_start={"steps": 0}), 7)
    assert ("from cloud.model_cache import model_folder" in bucket and
            'AutoModelForCausalLM.from_pretrained(model_folder("s3://my-models/qwen"))' in bucket)
    full = model_card(small_dit_config(), 3)
    assert "base_model" not in yaml.safe_load(full.split("---")[1])  # a random base has no name to give
    assert "every parameter trained" in full and "QwenImageTransformer2DModel.from_pretrained" in full


def _pretrained(folder, seed):
    """A tiny DiT saved where `policy.dit.pretrained_path` reads it (each node's own disk)."""
    build_policy(small_dit_config(seed=seed)).model.save_pretrained(str(folder))
    return str(folder)


def test_without_a_warm_start_workers_load_the_base_themselves_and_check_its_fingerprint(tmp_path):
    """A pretrained base is read from each node's disk, not sent: only its fingerprint goes, and a
    node whose folder holds other weights is refused rather than sampling with them."""
    same, other = _pretrained(tmp_path / "a", seed=0), _pretrained(tmp_path / "b", seed=1)
    cfg = small_dit_config(policy={**LORA, "dit": {"pretrained_path": same}}, warm_start={"steps": 0})
    learner = Learner(cfg)
    learner.build()
    _perturb(learner.policy.model, seed=4)
    base = learner.base()
    assert isinstance(base, LocalBase) and base.fingerprint.startswith("crc64nvme:")
    worker = RolloutWorker("w", cfg, queue=None).build(base)
    worker.set_weights(1, learner.weights())
    prompts = prompt_set(cfg.prompts, cfg.seed)[:2]
    assert torch.equal(learner.policy.rollout(prompts, [0, 1]).images, worker.policy.rollout(prompts, [0, 1]).images)
    elsewhere = small_dit_config(policy={**LORA, "dit": {"pretrained_path": other}}, warm_start={"steps": 0})
    refused = RolloutWorker("w2", elsewhere, queue=None)
    with pytest.raises(RuntimeError, match="not the learner's"):
        refused.build(base)
    with pytest.raises(RuntimeError, match="not the learner's"):  # what the Ray runtime waits on says so too
        refused.set_weights(1, learner.weights())


@pytest.mark.slow
def test_a_ray_run_on_a_pretrained_base_ends_with_the_local_runs_adapters(tmp_path):
    from safetensors.torch import load_file

    from spotlight.train.trainer import Trainer

    folder = _pretrained(tmp_path / "base", seed=0)
    adapters = {}
    for kind in ("local", "ray"):
        cfg = small_dit_config(policy={**LORA, "dit": {"pretrained_path": folder}}, warm_start={"steps": 0},
                               train={"steps": 2, "checkpoint_every": 2},
                               runtime={"kind": kind, "spot_workers": 2, "ondemand_workers": 1})
        Trainer(cfg, tmp_path / kind, progress=False).build().train()
        final = tmp_path / kind / "final"
        assert not (final / "transformer").exists()  # the base is the pretrained folder, named in the card
        assert folder in (final / "README.md").read_text()
        adapters[kind] = load_file(str(final / "pytorch_lora_weights.safetensors"))
    assert adapters["ray"].keys() == adapters["local"].keys()
    assert all(torch.equal(adapters["ray"][k], adapters["local"][k]) for k in adapters["local"])
    assert any(float(v.abs().sum()) > 0 for k, v in adapters["ray"].items() if "lora_B" in k)
