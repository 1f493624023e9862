"""An LLM run from a local transformers folder (issue 25): the tiny Qwen2 folder of
experiments/qwen_lm_folder.py with its byte-level BPE tokenizer and chat template, through `LLMPolicy`
(chat template, stop tokens, the KV-cached rollout against the update's log-probs, gradient
checkpointing), its `final/` through transformers and peft, bad folders through the CLI, and a
GRPO run on a GSM8K-format jsonl with the `answer_match` reward that must learn."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from conftest import small_llm_config
from spotlight.rl.grpo import masked_mean
from spotlight.rl.llm_policy import LLMPolicy, token_logprobs
from spotlight.rl.lora import add_lora
from spotlight.rl.prompts import Prompt, prompt_set
from spotlight.rl.seeding import generator

ROOT = Path(__file__).resolve().parents[3]


def folder_cfg(folder, **over):
    """A small LLM run on `folder`: no warm start, 4 prompts x 4 samples."""
    llm = {"pretrained_path": str(folder), **over.pop("llm", {})}
    return small_llm_config(policy={"kind": "llm", "llm": llm, **over.pop("policy", {})},
                            warm_start={"steps": 0}, **over)


def batch(n_prompts: int = 4, group: int = 4) -> tuple[list[Prompt], list[int]]:
    """Groups of one prompt, plus a longer prompt so that left padding is exercised."""
    ps = [Prompt(i, f"{i:02d}+{i + 3:02d}=") for i in range(n_prompts)]
    prompts = [p for p in ps for _ in range(group)] + [Prompt(99, "What is 12+30? Say the number.")]
    return prompts, list(range(len(prompts)))


def test_the_tiny_folder_loads_through_the_auto_classes(tiny_lm_folder):
    tok = AutoTokenizer.from_pretrained(tiny_lm_folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_lm_folder, local_files_only=True)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    text = tok.apply_chat_template([{"role": "user", "content": "07+13="}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\n07+13=<|im_end|>\n<|im_start|>assistant\n"
    assert (tok.eos_token, tok.pad_token, tok.bos_token) == ("<|im_end|>", "<|endoftext|>", None)
    ids = tok.encode("Natalia sold 48 clips.", add_special_tokens=False)
    assert tok.decode(ids) == "Natalia sold 48 clips." and len(ids) < len("Natalia sold 48 clips.")  # merges
    assert [tok.decode([i]) for i in tok.encode("48", add_special_tokens=False)] == ["4", "8"]  # Qwen2 splits digits


def test_a_folder_policy_samples_through_its_chat_template_and_rollout_equals_update(tiny_lm_folder):
    """The chat template wraps every prompt, completions stop at the template's <|im_end|> (or the
    generation config's <|endoftext|>) and decode without special tokens; with the KV cache, the
    rollout's log-probs are the update's (first ratio 1: nothing clips at clip 1e-4) and a sample
    does not depend on its micro-batch."""
    cfg = folder_cfg(tiny_lm_folder, llm={"max_new_tokens": 16}, grpo={"clip_low": 1e-4, "clip_high": 1e-4},
                     train={"micro_batch": 64})
    policy = LLMPolicy.from_config(cfg)
    tok = policy.tokenizer
    assert policy.chat and policy.prefix == []
    assert policy.stop_ids == sorted(tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))
    rendered = tok.apply_chat_template([{"role": "user", "content": "07+13="}], add_generation_prompt=True, tokenize=False)
    assert policy.prompt_ids("07+13=") == tok.encode(rendered, add_special_tokens=False)

    prompts, seeds = batch()
    ro = policy.rollout(prompts, seeds)
    d, mask = ro.data, ro.data["completion_mask"]
    completions = d["input_ids"][:, -mask.shape[1]:]
    stopped = 0
    for row, m, text in zip(completions.tolist(), mask, ro.completions):
        # A completion ends after its first stop token (the pad after it is <|endoftext|>, a stop too).
        hits = [j for j, t in enumerate(row) if t in policy.stop_ids]
        n = hits[0] + 1 if hits else len(row)
        assert m.tolist() == [1.0] * n + [0.0] * (len(row) - n)
        stopped += bool(hits)
        assert text == tok.decode(row[:n], skip_special_tokens=True)
        assert "<|im_end|>" not in text and "<|endoftext|>" not in text
    assert stopped > 0  # some samples met a stop token: a check that can fail
    with torch.no_grad():
        logp = token_logprobs(policy.model, d["input_ids"], d["attention_mask"], mask.shape[1], 1.0)
    torch.testing.assert_close(logp * mask, d["old_logp"], atol=1e-5, rtol=1e-5)
    adv = torch.randn(len(prompts), generator=generator(7))
    stats = policy.backward(ro, adv)
    assert stats["clip_frac"] == 0.0
    assert stats["loss"] == pytest.approx(float(masked_mean(-adv[:, None].expand_as(mask), mask)), abs=1e-5)

    policy.cfg.train.micro_batch = 5  # other batches, other padding: the same samples
    again = policy.rollout(prompts, seeds)
    for i in (0, 7, len(prompts) - 1):
        alone = policy.rollout([prompts[i]], [seeds[i]])
        for other, j in ((alone, 0), (again, i)):
            assert other.completions[j] == ro.completions[i]
            m = other.data["completion_mask"][j].bool()
            torch.testing.assert_close(other.data["old_logp"][j][m], d["old_logp"][i][mask[i].bool()])
    assert len(set(ro.completions[:4])) > 1  # one prompt, four seeds: different draws


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_gives_the_gradient_without_it(tiny_lm_folder, lora):
    policies = []
    for on in (False, True):
        cfg = folder_cfg(tiny_lm_folder, train={"micro_batch": 6, "gradient_checkpointing": on},
                         policy={"lora": {"rank": 4 if lora else 0}})
        policy = LLMPolicy.from_config(cfg)
        if lora:
            add_lora(policy.model, cfg)
            with torch.no_grad():  # lora_B starts at zero; move it so that every adapter has a gradient
                for i, (name, p) in enumerate(policy.model.named_parameters()):
                    if "lora_B" in name:
                        p.add_(0.1 * torch.randn(p.shape, generator=generator(3, i)))
        policies.append(policy)
    prompts, seeds = batch()
    ro = policies[0].rollout(prompts, seeds)
    adv = torch.randn(len(prompts), generator=generator(5))
    attention_calls = []
    for policy in policies:
        calls = [0]
        hook = policy.model.model.layers[0].self_attn.register_forward_hook(
            lambda *_: calls.__setitem__(0, calls[0] + 1))
        stats = policy.backward_part(ro, adv, 1)
        hook.remove()
        attention_calls.append(calls[0])
        assert not policy.model.model.layers[0].training  # eval mode again after the update
    assert attention_calls == [1, 2]  # checkpointed: the layer ran again in the backward pass
    assert stats["tokens"] > 0
    grads = [(n, p.grad) for n, p in policies[0].model.named_parameters() if p.requires_grad]
    assert grads and all(g is not None for _, g in grads)
    for (name, g), p in zip(grads, (p for p in policies[1].model.parameters() if p.requires_grad)):
        torch.testing.assert_close(p.grad, g, atol=1e-6, rtol=1e-5, msg=name)


def test_final_with_lora_loads_through_peft_on_the_folder_and_reproduces_the_logprobs(tiny_lm_folder, tmp_path):
    from peft import PeftModel

    cfg = folder_cfg(tiny_lm_folder, policy={"lora": {"rank": 4, "alpha": 8}})
    policy = LLMPolicy.from_config(cfg)
    add_lora(policy.model, cfg)
    with torch.no_grad():
        for i, (name, p) in enumerate(policy.model.named_parameters()):
            if "lora_B" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=generator(4, i)))
    final = tmp_path / "final"
    policy.save_pretrained(final)
    assert not (final / "base").exists()  # the base is the folder itself, as the adapter config says
    assert json.loads((final / "adapter_config.json").read_text())["base_model_name_or_path"] == str(tiny_lm_folder)
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_lm_folder), final).eval()
    tok = AutoTokenizer.from_pretrained(final)
    assert tok.chat_template == policy.tokenizer.chat_template

    # A fixed completion, "20<|im_end|>", after the chat-templated prompt: (1, P + 3).
    ids, mask = policy.encode(["07+13="])
    answer = torch.tensor([tok.encode("20", add_special_tokens=False) + [tok.eos_token_id]])
    ids, mask = torch.cat([ids, answer], 1), torch.cat([mask, torch.ones_like(answer)], 1)
    with torch.no_grad():
        want = token_logprobs(policy.model, ids, mask, answer.shape[1], 1.0)
        got = token_logprobs(loaded, ids, mask, answer.shape[1], 1.0)
        base = token_logprobs(AutoModelForCausalLM.from_pretrained(tiny_lm_folder), ids, mask, answer.shape[1], 1.0)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert (base - want).abs().max() > 1e-3  # the adapters matter


def test_final_without_lora_answers_through_plain_transformers_as_the_policy_does(tiny_lm_folder, tmp_path):
    cfg = folder_cfg(tiny_lm_folder, llm={"max_new_tokens": 6})
    policy = LLMPolicy.from_config(cfg)
    prompts = prompt_set(cfg.prompts, cfg.seed)[:6]
    # Larger weights: the folder's random init (std 0.02) answers the same whatever the prompt (the
    # prompts end alike: the template's generation prompt), which would make the comparison weak.
    with torch.no_grad():
        for i, p in enumerate(policy.model.parameters()):
            if p.ndim == 2:
                p.add_(0.3 * torch.randn(p.shape, generator=generator(9, i)))
    policy.save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True).eval()
    assert tok.chat_template == policy.tokenizer.chat_template and tok.eos_token == "<|im_end|>"
    answers = []
    for p in prompts:
        text = tok.apply_chat_template([{"role": "user", "content": p.text}], add_generation_prompt=True,
                                       tokenize=False)
        inputs = tok(text, return_tensors="pt", add_special_tokens=False)
        out = model.generate(**inputs, do_sample=False, max_new_tokens=6)
        answers.append(tok.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
    assert answers == policy.greedy(prompts), answers
    assert len(set(answers)) > 1  # answers that depend on the prompt: a check that can fail


def _broken(folder: Path, tmp_path: Path, case: str) -> Path:
    bad = tmp_path / "model"
    shutil.copytree(folder, bad)
    if case == "no tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            (bad / name).unlink(missing_ok=True)
    else:  # a sequence classifier's config: not a causal LM
        config = json.loads((bad / "config.json").read_text())
        config["architectures"] = ["Qwen2ForSequenceClassification"]
        (bad / "config.json").write_text(json.dumps(config))
    return bad


@pytest.mark.parametrize("case, expect", [("no tokenizer", "has no tokenizer files"),
                                          ("not a causal LM", "is not a causal LM")])
def test_a_bad_folder_is_one_error_line_and_exit_2(tiny_lm_folder, tmp_path, case, expect):
    bad = _broken(tiny_lm_folder, tmp_path, case)
    (tmp_path / "c.yaml").write_text(f"policy:\n  kind: llm\n  llm:\n    pretrained_path: {bad}\n"
                                     "reward:\n  name: arithmetic\nprompts:\n  name: arithmetic\n")
    proc = subprocess.run([sys.executable, "-m", "spotlight.cli", "train", "c.yaml", "--out", "out"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("spotlight: error: c.yaml: policy.llm.pretrained_path: ")
    assert expect in lines[0] and not (tmp_path / "out").exists()
    # The policy refuses the same folder with the same words (a run that skips the CLI's check).
    from spotlight.config import ConfigError

    with pytest.raises(ConfigError, match=expect):
        LLMPolicy.from_config(folder_cfg(bad))


def test_a_folder_with_tied_embeddings_warm_starts_and_checkpoints(tmp_path):
    """Qwen2.5-0.5B/1.5B/3B tie lm_head to the embeddings. A full-parameter run of one caches its warm
    start and writes checkpoints (safetensors refuses tensors that share storage: `lora.storable`
    copies the tied one), and the cached warm start loads back tied and equal."""
    from spotlight.rl.warm_start import apply_warm_start
    from spotlight.checkpoints import checkpoint
    from experiments.qwen_lm_folder import save_tiny_lm

    folder = save_tiny_lm(tmp_path / "tied", tie_word_embeddings=True)
    cfg = small_llm_config(policy={"kind": "llm", "llm": {"pretrained_path": str(folder)}},
                           warm_start={"steps": 1, "batch_size": 2, "cache_dir": str(tmp_path / "cache")})
    policy = LLMPolicy.from_config(cfg)
    assert policy.model.lm_head.weight is policy.model.model.embed_tokens.weight
    checkpoint.save(tmp_path / "checkpoints", 1, policy.model, torch.optim.Adam(policy.model.parameters()))
    assert not apply_warm_start(policy, cfg, prompt_set(cfg.prompts, cfg.seed))["cached"]
    again = LLMPolicy.from_config(cfg)
    assert apply_warm_start(again, cfg, prompt_set(cfg.prompts, cfg.seed))["cached"]
    assert again.model.lm_head.weight is again.model.model.embed_tokens.weight
    assert all(torch.equal(a, b) for a, b in zip(policy.model.state_dict().values(), again.model.state_dict().values()))


def _gsm8k_file(path: Path, n: int = 64) -> Path:
    """A GSM8K-format jsonl of n sums ("07+13=" as the question, so that the warm start's worked
    sums transfer; the answer a worked solution ending "#### 20"), drawn from a fixed shuffle."""
    pairs = [(a, b) for a in range(20) for b in range(20)]
    order = torch.randperm(len(pairs), generator=generator(0, 0x65A8)).tolist()[:n]
    lines = [json.dumps({"question": f"{pairs[i][0]:02d}+{pairs[i][1]:02d}=",
                         "answer": f"{pairs[i][0]} plus {pairs[i][1]} is {sum(pairs[i])}.\n#### {sum(pairs[i])}"})
             for i in order]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.slow
def test_a_folder_llm_learns_answer_match_on_a_gsm8k_jsonl(tiny_lm_folder, tmp_path):
    """`spotlight train` on the folder, a GSM8K-format jsonl (`question`, `answer` "... #### N") and
    the answer_match reward: the reward rises by more than 3 standard errors (last 5 vs first 5
    iterations), and final/ loads through the Auto classes with its chat template.

    A random model never writes the right number (answer_match gives every sample 0: no group has
    variance), so the folder model is first warm-started on worked sums through its chat template
    (400 steps: a sampled pass rate of ~10-25% by seed, room for GRPO). Measured on 2 shared cores,
    run seeds 0-3: +8.3, +6.8, +6.5, +4.1 standard errors in 20 iterations, ~20 s each (600 steps
    and 30 iterations: +8.6..+19.2, ~30 s)."""
    from spotlight.config import default_config, to_yaml

    cfg = default_config({
        "seed": 0,
        "policy": {"kind": "llm", "llm": {"pretrained_path": str(tiny_lm_folder), "max_new_tokens": 4}},
        "reward": {"name": "answer_match"},
        "prompts": {"path": str(_gsm8k_file(tmp_path / "train.jsonl")), "text_field": "question"},
        "grpo": {"clip_low": 0.2, "clip_high": 0.28},
        "warm_start": {"steps": 400, "batch_size": 32, "lr": 3e-3},
        "train": {"steps": 20, "prompts_per_step": 32, "group_size": 8, "lr": 1e-3, "checkpoint_every": 100},
        "runtime": {"kind": "local"},
    })
    (tmp_path / "run.yaml").write_text(to_yaml(cfg))
    proc = subprocess.run([sys.executable, "-m", "spotlight.cli", "train", "run.yaml", "--out", "out", "--json",
                           "--no-progress"], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout.strip().splitlines()[-1])
    assert s["steps"] == 20 and s["improvement_se"] > 3, s
    final = tmp_path / "out" / "final"
    tok = AutoTokenizer.from_pretrained(final, local_files_only=True)
    assert tok.chat_template == AutoTokenizer.from_pretrained(tiny_lm_folder).chat_template
    assert type(AutoModelForCausalLM.from_pretrained(final, local_files_only=True)).__name__ == "Qwen2ForCausalLM"
