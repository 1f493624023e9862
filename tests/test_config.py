import subprocess
import sys
from pathlib import Path

import pytest

from spotlight.config import ConfigError, RunConfig, default_config, load_config, to_yaml

ROOT = Path(__file__).resolve().parents[1]


def test_tiny_dit_yaml_is_the_embedded_default():
    assert load_config(ROOT / "experiments/tiny_dit.yaml") == RunConfig()


def test_yaml_round_trip(tmp_path):
    cfg = default_config({"seed": 7, "sampler": {"sde_window": [1, 5]}})
    (tmp_path / "c.yaml").write_text(to_yaml(cfg))
    assert load_config(tmp_path / "c.yaml") == cfg
    assert cfg.sampler.sde_steps == range(1, 5)


@pytest.mark.parametrize("text, message", [
    ("train:\n  lrr: 0.1\n", "train.lrr: unknown field"),
    ("train:\n  lr: -1\n", "train.lr: expected a number > 0, got -1"),
    ("train:\n  steps: ten\n", "train.steps: expected an integer, got 'ten'"),
    ("policy:\n  kind: gan\n", "policy.kind: expected one of 'dit', 'llm'"),
    ("sampler:\n  sde_window: [3, 2]\n", "sampler.sde_window: expected [first, last)"),
    ("policy:\n  dit:\n    resolution: 15\n", "policy.dit.resolution: expected a size whose latent side"),
    ("seed: 1\ntrain: @x\n", "line 2: not valid YAML"),
    ("- 1\n", "expected a mapping of RunConfig fields"),
    ("policy:\n  kind: llm\n", "reward.name: expected one of ['arithmetic'] for an llm policy"),
])
def test_bad_config_is_one_line_naming_file_and_field(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    line = str(err.value)
    assert line.startswith(f"{path}: ") and message in line and "\n" not in line


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "nope.yaml")


def test_cli_bad_config_prints_one_line_and_no_traceback(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train:\n  group_size: 1\n")
    proc = subprocess.run([sys.executable, "-m", "spotlight.cli", "train", str(path), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"spotlight: error: {path}: train.group_size: expected an integer >= 2 (GRPO needs a group), got 1"]
    assert not (tmp_path / "o").exists()
