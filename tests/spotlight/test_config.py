import subprocess
import sys
from pathlib import Path

import pytest

from spotlight.config import ConfigError, RunConfig, config_from_yaml, default_config, load_config, to_yaml

ROOT = Path(__file__).resolve().parents[2]


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
    ("policy:\n  kind: llm\n", "reward.name: expected a reward for an llm policy (colour is an image reward)"),
    # issue 13: every float finite, every number in its range, the file itself bounded
    ("train:\n  lr: .inf\n", "train.lr: expected a finite number, got inf"),
    ("grpo:\n  clip_high: .nan\n", "grpo.clip_high: expected a finite number, got nan"),
    ("train:\n  steps: 1000000000\n", "train.steps: expected at most 1,000,000, got 1000000000"),
    ("train:\n  prompts_per_step: 1024\n  group_size: 2048\n", "train.group_size: expected at most 1,024"),
    ("train:\n  parts_per_request: 0\n", "train.parts_per_request: expected a positive integer, got 0"),
    ("train:\n  parts_per_request: 4097\n", "train.parts_per_request: expected at most 4,096, got 4097"),
    ("runtime:\n  notice_s: 1.0e+9\n", "runtime.notice_s: expected at most 3,600 s"),
    ("seed: -1\n", "seed: expected an integer in [0, 4294967295], got -1"),
    ("seed: 4294967296\n", "seed: expected an integer in [0, 4294967295]"),
    ("device: banana\n", "device: expected cpu, cuda, cuda:N or mps, got 'banana'"),
    ("reward:\n  name: bogus\n", "reward.name: expected one of answer_match, arithmetic, clip_score, colour"),
    ("", "empty config file"),
    ("seed: 1\nseed: 2\n", "line 2: duplicate key 'seed'"),
    ("a: &x 1\nseed: *x\n", "line 1: YAML anchors and aliases are not accepted"),
    ("seed: " + "[" * 1000 + "]" * 1000 + "\n", "nested deeper than 64 levels"),
    ("seed: " + "1" * 200 + "\n", "an integer of 200 digits"),
    ("prompts:\n  name: " + "x" * 5000 + "\n", "..."),  # a value is quoted at most ~200 characters
    ("1: 2\n", "1: unknown field"),
])
def test_bad_config_is_one_line_naming_file_and_field(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    line = str(err.value)
    assert line.startswith(f"{path}: ") and message in line and "\n" not in line
    assert len(line) < len(str(path)) + 300


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
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


def test_binary_and_oversized_files_are_one_line(tmp_path):
    binary = tmp_path / "b.yaml"
    binary.write_bytes(bytes(range(256)))
    with pytest.raises(ConfigError, match=r"b\.yaml: a binary file"):
        load_config(binary)
    latin = tmp_path / "l.yaml"
    latin.write_bytes("seed: 1 # café\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"l\.yaml: not a UTF-8 text file"):
        load_config(latin)
    big = tmp_path / "big.yaml"
    big.write_text("seed: 1\n" + "#" * (1 << 20))
    with pytest.raises(ConfigError, match=r"big\.yaml: larger than 1 MiB"):
        load_config(big)


def test_the_reward_names_checked_at_load_are_the_ones_rewards_builds():
    from spotlight.rl import rewards
    from spotlight.config import BUILTIN_REWARDS, LLM_REWARDS

    assert set(BUILTIN_REWARDS) == set(rewards.BUILTIN)
    for name in BUILTIN_REWARDS:
        kind = "llm" if name in LLM_REWARDS else "dit"
        over = {"reward": {"name": name}, "policy": {"kind": kind}}
        if kind == "llm":
            over["prompts"] = {"name": "arithmetic"}
        assert default_config(over).reward.name == name


def test_every_float_field_refuses_inf_and_nan():
    import dataclasses
    import typing

    def floats(cls, prefix=""):
        for f in dataclasses.fields(cls):
            tp = typing.get_type_hints(cls)[f.name]
            if dataclasses.is_dataclass(tp):
                yield from floats(tp, f"{prefix}{f.name}.")
            elif tp is float or float in typing.get_args(tp):
                yield prefix + f.name

    names = list(floats(RunConfig))
    assert "train.lr" in names and "cloud.budget_usd" in names and len(names) > 20
    for name in names:
        for bad in (float("inf"), float("nan"), -float("inf")):
            over = bad
            for key in reversed(name.split(".")):
                over = {key: over}
            with pytest.raises(ConfigError, match=f"^<default config>: {name}: expected a finite number"):
                default_config(over)


def test_policy_pretrained_path_is_the_folder_of_the_policys_kind(tmp_path):
    """The issue's `policy.pretrained_path` names the kind's own folder setting: the same config as
    `policy.dit.pretrained_path` / `policy.llm.pretrained_path`, round trip and warm-start key alike."""
    from spotlight.rl.warm_start import cache_path

    folder = str(tmp_path / "model")
    short = default_config({"policy": {"pretrained_path": folder}})
    long = default_config({"policy": {"dit": {"pretrained_path": folder}}})
    assert short.policy.dit.pretrained_path == folder and short.to_dict() == long.to_dict()
    assert cache_path(short) == cache_path(long) and long.policy.pretrained_path == folder
    assert config_from_yaml(to_yaml(short)).to_dict() == short.to_dict()
    llm = default_config({"policy": {"kind": "llm", "pretrained_path": folder}, "reward": {"name": "arithmetic"},
                          "prompts": {"name": "arithmetic"}})
    assert llm.policy.llm.pretrained_path == folder and llm.policy.dit.pretrained_path is None
    assert cache_path(default_config()) == cache_path(default_config({"policy": {"pretrained_path": None}}))
    with pytest.raises(ConfigError, match=r"^<default config>: policy.pretrained_path: expected the folder of "
                                          r"dit.pretrained_path \('/a'\), or null"):
        default_config({"policy": {"pretrained_path": "/b", "dit": {"pretrained_path": "/a"}}})


def _numeric_fields(cls, prefix=""):
    """(dotted name, pydantic FieldInfo) of every int and float field of section `cls` and those in it."""
    import typing

    from pydantic.dataclasses import is_pydantic_dataclass

    for name, info in cls.__pydantic_fields__.items():
        tp = next((a for a in typing.get_args(info.annotation) if a is not type(None)), info.annotation)
        if is_pydantic_dataclass(tp):
            yield from _numeric_fields(tp, f"{prefix}{name}.")
        elif tp in (int, float):
            yield prefix + name, info


def test_every_number_declares_its_range_on_its_field():
    import annotated_types as at

    cross_field = {"exploration.monitor_seeds"}  # at most candidates_per_prompt: RunConfig checks it
    fields = dict(_numeric_fields(RunConfig))
    assert "train.lr" in fields and "cloud.gpus_per_node" in fields and len(fields) > 40
    for name, info in fields.items():
        lower = any(isinstance(m, (at.Gt, at.Ge)) for m in info.metadata)
        upper = any(isinstance(m, (at.Lt, at.Le)) for m in info.metadata) or name in cross_field
        assert lower and upper, f"{name} declares no {'lower' if not lower else 'upper'} bound"


@pytest.mark.parametrize("over, message", [
    ({"train": {"steps": 3.0}}, "train.steps: expected an integer, got 3.0"),
    ({"train": {"steps": "3"}}, "train.steps: expected an integer, got '3'"),
    ({"train": {"steps": True}}, "train.steps: expected an integer, got True"),
    ({"train": {"lr": "0.1"}}, "train.lr: expected a number, got '0.1'"),
    ({"grpo": {"drop_zero_advantage_groups": 1}}, "grpo.drop_zero_advantage_groups: expected true or false, got 1"),
    ({"cloud": {"gpu": 7}}, "cloud.gpu: expected a string, got 7"),
    ({"cloud": {"budget_usd": "5"}}, "cloud.budget_usd: expected a number or null, got '5'"),
    ({"reward": {"components": [{"name": "colour", "weight": "x"}]}},
     "reward.components[0].weight: expected a number, got 'x'"),
])
def test_values_are_taken_as_their_fields_type_strictly(over, message):
    with pytest.raises(ConfigError) as err:
        default_config(over)
    assert str(err.value) == f"<default config>: {message}"


def test_a_float_field_takes_an_integer_as_a_number():
    assert default_config({"train": {"lr": 1}}).train.lr == 1
