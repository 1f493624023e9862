"""End-to-end GRPO runs, shortened: the tiny DiT and the tiny LLM must clearly learn.

"Clearly" is the issue's bar: the mean reward of the last 5 iterations exceeds that of the first 5
by more than 3 standard errors. The full-length runs are `make train` and the experiments/ configs.
The two full fine-tunes below run their learner as a group of 2 processes (`train.learner_gpus`,
FSDP2 over gloo): a sharded learner must learn as one does. One learner's learning is the LoRA
runs' below and tests/spotlight/test_your_own_task.py's (DiT), tests/spotlight/rl/test_llm_folder.py's (LLM).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spotlight.config import load_config, to_yaml

ROOT = Path(__file__).resolve().parents[3]


def _train(tmp_path, config, overrides):
    cfg = load_config(ROOT / config, overrides)
    path = tmp_path / "run.yaml"
    path.write_text(to_yaml(cfg))
    proc = subprocess.run([sys.executable, "-m", "spotlight.cli", "train", str(path), "--out", str(tmp_path / "out"),
                           "--json", "--no-progress"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary == json.loads((tmp_path / "out" / "summary.json").read_text())
    return summary


@pytest.mark.slow
def test_tiny_dit_learns_the_colour_reward(tmp_path):
    s = _train(tmp_path, "experiments/tiny_dit.yaml", {"warm_start": {"steps": 600},
                                                        "train": {"steps": 20, "learner_gpus": 2},
                                                        "runtime": {"kind": "local"}})
    assert s["steps"] == 20
    assert s["reward_last5"] > s["reward_first5"]
    assert s["improvement_se"] > 3, s
    assert (tmp_path / "out" / "final" / "diffusion_pytorch_model.safetensors").is_file()


@pytest.mark.slow
def test_tiny_llm_learns_arithmetic(tmp_path):
    s = _train(tmp_path, "experiments/tiny_llm.yaml", {"train": {"steps": 40, "learner_gpus": 2},
                                                        "runtime": {"kind": "local"}})
    assert s["steps"] == 40
    assert s["reward_last5"] > s["reward_first5"]
    assert s["improvement_se"] > 3, s

    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = tmp_path / "out" / "final"
    tokenizer = AutoTokenizer.from_pretrained(str(final))
    model = AutoModelForCausalLM.from_pretrained(str(final))
    assert tokenizer.decode(tokenizer.encode("07+13=", add_special_tokens=False)) == "07+13="
    assert model.config.num_hidden_layers == 2


def _trained_learner(tmp_path, summary):
    """The run's learner as its newest checkpoint (the last iteration's) rebuilds it."""
    from spotlight.runtime.learner import Learner

    cfg = load_config(tmp_path / "run.yaml")
    learner = Learner(cfg)
    assert learner.build(tmp_path / "out" / "checkpoints")["step"] == summary["steps"]
    return cfg, learner


@pytest.mark.slow
def test_tiny_dit_lora_learns_and_its_final_loads_through_load_lora_weights(tmp_path):
    s = _train(tmp_path, "experiments/tiny_dit_lora.yaml",
               {"warm_start": {"steps": 600}, "train": {"steps": 20}, "runtime": {"kind": "local"}})
    assert s["steps"] == 20
    assert s["improvement_se"] > 3, s

    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline, QwenImageTransformer2DModel

    from spotlight.rl.dit_policy import DiTPolicy
    from spotlight.rl.prompts import prompt_set

    final = tmp_path / "out" / "final"
    assert (final / "pytorch_lora_weights.safetensors").is_file() and "lora" in (final / "README.md").read_text()
    # What a user does: the base transformer, a pipeline around it, and the pipeline's LoRA loader.
    pipe = QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=None, text_encoder=None,
                             tokenizer=None, transformer=QwenImageTransformer2DModel.from_pretrained(final / "transformer"))
    pipe.load_lora_weights(final)
    cfg, learner = _trained_learner(tmp_path, s)
    loaded = DiTPolicy.from_config(cfg)
    loaded.model = pipe.transformer
    prompts = prompt_set(cfg.prompts, cfg.seed)[:4]
    seeds = [11, 12, 13, 14]
    want, got = learner.policy.rollout(prompts, seeds), loaded.rollout(prompts, seeds)
    assert torch.equal(got.images, want.images)
    # ...and the adapters matter: the base alone samples other images.
    pipe.unload_lora_weights()
    assert not torch.equal(loaded.rollout(prompts, seeds).images, want.images)


@pytest.mark.slow
def test_tiny_llm_lora_learns_and_its_final_loads_through_peft(tmp_path):
    s = _train(tmp_path, "experiments/tiny_llm_lora.yaml", {"runtime": {"kind": "local"}})
    assert s["steps"] == 60
    assert s["improvement_se"] > 3, s

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from spotlight.rl.prompts import prompt_set

    final = tmp_path / "out" / "final"
    assert (final / "adapter_config.json").is_file() and (final / "base" / "config.json").is_file()
    tok = AutoTokenizer.from_pretrained(final)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(final / "base"), final).eval()
    cfg, learner = _trained_learner(tmp_path, s)
    prompts = prompt_set(cfg.prompts, cfg.seed)[:24]

    def greedy():
        answers = []
        for p in prompts:
            inputs = tok(p.text, return_tensors="pt")
            out = model.generate(**inputs, do_sample=False, max_new_tokens=cfg.policy.llm.max_new_tokens)
            answers.append(tok.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
        return answers

    answers = greedy()
    assert answers == learner.policy.greedy(prompts)
    with model.disable_adapter():  # the adapters matter: the base alone answers otherwise
        assert greedy() != answers
