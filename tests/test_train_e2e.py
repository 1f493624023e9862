"""End-to-end GRPO runs, shortened: the tiny DiT and the tiny LLM must clearly learn.

"Clearly" is the issue's bar: the mean reward of the last 5 iterations exceeds that of the first 5
by more than 3 standard errors. The full-length runs are `make train` and the experiments/ configs.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spotlight.config import load_config, to_yaml

ROOT = Path(__file__).resolve().parents[1]


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
    s = _train(tmp_path, "experiments/tiny_dit.yaml", {"warm_start": {"steps": 600}, "train": {"steps": 20}, "runtime": {"kind": "local"}})
    assert s["steps"] == 20
    assert s["reward_last5"] > s["reward_first5"]
    assert s["improvement_se"] > 3, s
    assert (tmp_path / "out" / "final" / "diffusion_pytorch_model.safetensors").is_file()


@pytest.mark.slow
def test_tiny_llm_learns_arithmetic(tmp_path):
    s = _train(tmp_path, "experiments/tiny_llm.yaml", {"train": {"steps": 40}, "runtime": {"kind": "local"}})
    assert s["steps"] == 40
    assert s["reward_last5"] > s["reward_first5"]
    assert s["improvement_se"] > 3, s

    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = tmp_path / "out" / "final"
    tokenizer = AutoTokenizer.from_pretrained(str(final))
    model = AutoModelForCausalLM.from_pretrained(str(final))
    assert tokenizer.decode(tokenizer.encode("07+13=", add_special_tokens=False)) == "07+13="
    assert model.config.num_hidden_layers == 2
