"""LLMPolicy and the character tokenizer: sampling determinism, log-prob consistency between rollout
and update, micro-batch invariance of the gradient, save/load, and the warm start. All on CPU with
the tiny Qwen2 built from code."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from spotlight.rl.char_tokenizer import VOCAB, build_char_tokenizer
from spotlight.config import ConfigError, RunConfig, default_config
from spotlight.rl.grpo import masked_mean
from spotlight.rl.llm_policy import LLMPolicy, token_logprobs
from spotlight.rl.prompts import Prompt, prompt_set
from spotlight.rl.seeding import generator


def make_cfg(seed: int = 0, micro_batch: int = 64, kl_beta: float = 0.0, clip: float = 0.2,
             pretrained_path: str | None = None) -> RunConfig:
    return default_config({
        "seed": seed,
        "policy": {"kind": "llm", "llm": {"pretrained_path": pretrained_path}},
        "reward": {"name": "arithmetic"},
        "prompts": {"name": "arithmetic", "count": 64},
        "grpo": {"clip_low": clip, "clip_high": clip, "kl_beta": kl_beta},
        "train": {"micro_batch": micro_batch},
    })


def batch(cfg: RunConfig, n_prompts: int = 4, group: int = 4) -> tuple[list[Prompt], list[int]]:
    """n_prompts groups of `group` samples, plus a shorter prompt so left padding is exercised."""
    ps = prompt_set(cfg.prompts, cfg.seed)[:n_prompts]
    prompts = [p for p in ps for _ in range(group)] + [Prompt(1000, "3+4=")]
    return prompts, list(range(len(prompts)))


def test_char_tokenizer_round_trips_through_save_and_load(tmp_path):
    tok = build_char_tokenizer()
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    ids = tok.encode("07+13=20", add_special_tokens=False)
    assert ids == [VOCAB[c] for c in "07+13=20"]
    assert loaded.encode("07+13=20", add_special_tokens=False) == ids
    assert len(loaded) == len(tok) == len(VOCAB)
    for name in ("pad", "bos", "eos"):
        assert getattr(loaded, f"{name}_token") == getattr(tok, f"{name}_token") == f"<{name}>"
        assert getattr(loaded, f"{name}_token_id") == VOCAB[f"<{name}>"]
    assert loaded.decode([VOCAB["<bos>"]] + ids + [VOCAB["<eos>"]], skip_special_tokens=True) == "07+13=20"


def test_the_saved_tokenizer_starts_with_bos_as_the_policy_does(tmp_path):
    tok = build_char_tokenizer()
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    for t in (tok, loaded):
        assert t("07+13=")["input_ids"] == [VOCAB["<bos>"]] + [VOCAB[c] for c in "07+13="]


def test_final_through_plain_transformers_gives_the_policys_greedy_answers(tmp_path):
    """`final/` is what users load: AutoTokenizer + AutoModelForCausalLM.generate must answer as
    the policy does (a tokenizer without <bos> answered '07+13=' differently)."""
    from transformers import AutoModelForCausalLM

    cfg = make_cfg(seed=3)
    policy = LLMPolicy.from_config(cfg)
    prompts = prompt_set(cfg.prompts, cfg.seed)[:6]
    policy.save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True).eval()
    answers = []
    for p in prompts:
        inputs = tok(p.text, return_tensors="pt")
        out = model.generate(**inputs, do_sample=False, max_new_tokens=cfg.policy.llm.max_new_tokens)
        answers.append(tok.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
    assert answers == policy.greedy(prompts)
    assert len(set(answers)) > 1  # answers that depend on the prompt: a check that can fail


def test_tiny_model_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = LLMPolicy.from_config(make_cfg(seed=0))
    assert torch.equal(torch.rand(3), expected)
    b, c = LLMPolicy.from_config(make_cfg(seed=0)), LLMPolicy.from_config(make_cfg(seed=1))
    wa, wb, wc = (p.model.model.embed_tokens.weight for p in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_rollout_logprobs_match_the_update_path():
    cfg = make_cfg(clip=1e-4)  # any ratio off 1 by more than 1e-4 would show up as clipping
    policy = LLMPolicy.from_config(cfg)
    prompts, seeds = batch(cfg)
    ro = policy.rollout(prompts, seeds)
    d = ro.data
    mask = d["completion_mask"]
    assert len(ro.completions) == len(prompts) and mask[:, 0].all()
    # The completion stops after (and includes) the first <eos>.
    for row, m in zip(d["input_ids"][:, -mask.shape[1]:], mask):
        eos = (row == policy.eos_id).nonzero()
        n = int(eos[0]) + 1 if len(eos) else mask.shape[1]
        assert m.tolist() == [1.0] * n + [0.0] * (mask.shape[1] - n)
    with torch.no_grad():
        logp = token_logprobs(policy.model, d["input_ids"], d["attention_mask"], mask.shape[1], 1.0)
    torch.testing.assert_close(logp * mask, d["old_logp"], atol=1e-5, rtol=1e-5)

    adv = torch.randn(len(prompts), generator=generator(7))
    stats = policy.backward(ro, adv)
    expected = masked_mean(-adv[:, None].expand_as(mask), mask)
    assert stats["loss"] == pytest.approx(float(expected), abs=1e-5)
    assert stats["clip_frac"] == 0.0 and stats["kl"] == 0.0 and stats["tokens"] == float(mask.sum())


def completion(ro, i: int) -> tuple[list[int], torch.Tensor]:
    """Sample i's completion tokens (through its <eos>) and their rollout log-probs."""
    m = ro.data["completion_mask"][i].bool()
    return ro.data["input_ids"][i, -m.shape[0]:][m].tolist(), ro.data["old_logp"][i][m]


def test_a_sample_does_not_depend_on_its_batch():
    cfg = make_cfg(micro_batch=5)
    policy = LLMPolicy.from_config(cfg)
    prompts, seeds = batch(cfg)
    together = policy.rollout(prompts, seeds)
    for i in (0, 6, len(prompts) - 1):
        alone = policy.rollout([prompts[i]], [seeds[i]])
        (tokens, logp), (tokens_b, logp_b) = completion(alone, 0), completion(together, i)
        assert tokens == tokens_b and alone.completions[0] == together.completions[i]
        torch.testing.assert_close(logp, logp_b)
    # Same prompt, different seeds: different draws (8 samples of a near-uniform random policy).
    assert len(set(together.completions[:8])) > 1


@pytest.mark.parametrize("kl_beta", [0.0, 0.1])
def test_micro_batched_backward_accumulates_the_full_batch_gradient(kl_beta):
    small, full = (LLMPolicy.from_config(make_cfg(micro_batch=mb, kl_beta=kl_beta)) for mb in (3, 64))
    for policy in (small, full):
        policy.set_reference()
        with torch.no_grad():  # move off the reference so the KL term has a gradient
            for i, p in enumerate(policy.model.parameters()):
                p.add_(0.02 * torch.randn(p.shape, generator=generator(11, i)))
    prompts, seeds = batch(small.cfg)
    ro = small.rollout(prompts, seeds)
    adv = torch.randn(len(prompts), generator=generator(5))
    # Another update's worth of drift so ratios differ from 1 and some tokens are clipped.
    with torch.no_grad():
        for policy in (small, full):
            for i, p in enumerate(policy.model.parameters()):
                p.add_(0.05 * torch.randn(p.shape, generator=generator(12, i)))
    s_small, s_full = small.backward(ro, adv), full.backward(ro, adv)
    for key in ("loss", "clip_frac", "kl", "tokens"):
        assert s_small[key] == pytest.approx(s_full[key], abs=1e-5)
    assert s_full["clip_frac"] > 0 and (s_full["kl"] > 0) == (kl_beta > 0)
    for (name, a), b in zip(small.model.named_parameters(), full.model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_kl_needs_a_reference():
    cfg = make_cfg(kl_beta=0.1)
    policy = LLMPolicy.from_config(cfg)
    ro = policy.rollout(*batch(cfg, n_prompts=1))
    with pytest.raises(RuntimeError, match="set_reference"):
        policy.backward(ro, torch.zeros(len(ro)))


def test_save_pretrained_loads_back_identically(tmp_path):
    cfg = make_cfg(seed=3)
    policy = LLMPolicy.from_config(cfg)
    policy.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    # Another run seed: the weights must come from the folder, not from a seeded init.
    loaded = LLMPolicy.from_config(make_cfg(seed=99, pretrained_path=str(tmp_path)))
    ids, mask = policy.encode(["07+13=", "1+2="])
    assert torch.equal(ids, loaded.encode(["07+13=", "1+2="])[0])
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(input_ids=ids, attention_mask=mask).logits,
                                   policy.model(input_ids=ids, attention_mask=mask).logits, atol=0, rtol=0)
    # Greedy decoding draws nothing, so it compares across the two run seeds.
    prompts, _ = batch(cfg, n_prompts=2)
    assert policy.greedy(prompts) == loaded.greedy(prompts)


def test_missing_pretrained_path_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="policy.llm.pretrained_path"):
        LLMPolicy.from_config(make_cfg(pretrained_path=str(tmp_path / "absent")))


def test_warm_start_raises_greedy_accuracy():
    cfg = make_cfg()
    policy = LLMPolicy.from_config(cfg)
    prompts = prompt_set(cfg.prompts, cfg.seed)
    before = policy.accuracy(prompts)
    stats = policy.warm_start(prompts, steps=100, batch_size=32, lr=3e-3, seed=cfg.seed)
    assert stats["accuracy"] == policy.accuracy(prompts)
    assert stats["accuracy"] > before + 0.05
    assert stats["loss"] < 1.5


def test_flow_grpos_kl_scale_is_the_dits_only():
    from spotlight.config import from_dict

    data = make_cfg(kl_beta=0.1).to_dict()
    data["grpo"]["kl_estimator"] = "flow_grpo"
    with pytest.raises(ConfigError, match="grpo.kl_estimator: expected exact for an llm policy"):
        from_dict(RunConfig, data)
