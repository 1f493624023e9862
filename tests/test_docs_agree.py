"""What the docs and the help list agrees with what the code does:

- `spotlight simulate --help` names every policy `--policy all` runs, and docs/simulator.md's policy
  table names the same ones, in the same order;
- every key of a real `metrics.jsonl` row and of a real `summary.json` (and the fields of its
  objects) is in docs/training.md's key tables. Two tiny runs produce them (~10 s together): a DiT
  with evaluation, exploration, group dropping and the update on the fleet, and an LLM.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from spotlight.config import to_yaml
from spotlight.cli import main

from conftest import small_dit_config, small_llm_config

REPO = Path(__file__).resolve().parent.parent
TRAINING = REPO / "docs" / "training.md"
SIMULATOR = REPO / "docs" / "simulator.md"
TRACE = REPO / "experiments" / "traces" / "bamboo-p3.csv"


# ---- simulate: the policies ---------------------------------------------------------------------


def _policies_run_by_all(monkeypatch, capsys) -> list[str]:
    """The names `simulate --policy all` hands the simulator (its run replaced by a recorder)."""
    from spotlight.sim import simulator

    asked: list[list[str]] = []

    def record(cfg, trace, names, **kwargs):
        asked.append(list(names))
        return {}

    monkeypatch.setattr(simulator, "simulate", record)
    assert main(["simulate", "--trace", str(TRACE), "--policy", "all", "--json"]) == 0
    capsys.readouterr()
    (names,) = asked
    return names


def _policies_in_help(capsys) -> list[str]:
    with pytest.raises(SystemExit) as done:
        main(["simulate", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse's wrapping undone
    listed = re.search(r"comma-separated names of them: (.+?) \(the baselines", text)
    assert listed, text
    return listed.group(1).split(", ")


def _policies_in_simulator_doc() -> list[str]:
    text = SIMULATOR.read_text()
    section = text[text.index("\n## Policies\n"):text.index("\n## Baselines\n")]
    return [m.group(1) for m in re.finditer(r"^\| `([a-z_]+)` \|", section, re.MULTILINE)]


def test_simulate_help_and_the_simulator_doc_list_every_policy_all_runs(monkeypatch, capsys):
    run = _policies_run_by_all(monkeypatch, capsys)
    assert len(run) >= 8
    assert _policies_in_help(capsys) == run
    assert _policies_in_simulator_doc() == run


# ---- training: the keys of metrics.jsonl and summary.json ---------------------------------------

RUNS = {
    # the reward components' labels of each run: its reward's name (no `reward.components`)
    "dit": (small_dit_config(train={"eval_prompts": 2, "eval_seeds": 2, "update_on": "fleet"},
                             grpo={"drop_zero_advantage_groups": True},
                             exploration={"enabled": True, "candidates_per_prompt": 8, "samples_per_step": 8,
                                          "request_size": 4}), ("colour",)),
    "llm": (small_llm_config(train={"steps": 2}), ("arithmetic",)),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, tuple[list[dict], dict, tuple[str, ...]]]:
    """name -> (metrics rows, summary, reward labels) of each run in `RUNS`, trained by `spotlight train`."""
    out = {}
    for name, (cfg, labels) in RUNS.items():
        folder = tmp_path_factory.mktemp(f"docs-agree-{name}")
        config = folder / "run.yaml"
        config.write_text(to_yaml(cfg))
        assert main(["train", str(config), "--out", str(folder / "run"), "--no-progress"]) == 0
        rows = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]
        out[name] = (rows, json.loads((folder / "run" / "summary.json").read_text()), labels)
    return out


def _documented(heading: str) -> list[str]:
    """The key names in the first column of the table under `heading` in docs/training.md."""
    text = TRAINING.read_text()
    start = text.index(f"\n{heading}\n")
    end = min(i for i in (text.find("\n### ", start + 1), text.find("\n## ", start + 1), len(text)) if i > 0)
    names = []
    for line in text[start:end].splitlines():
        if line.startswith("| `"):
            names += re.findall(r"`([^`]+)`", line.split("|")[1])
    assert names, f"no key table under {heading!r} in {TRAINING}"
    return names


def _placeholders(labels: tuple[str, ...]) -> dict[str, str]:
    from spotlight.iteration.iteration_controller import PHASES

    return {"label": "|".join(map(re.escape, labels)), "phase": "|".join(map(re.escape, PHASES)),
            "w": "[0-9]+", "node": "[^.]+"}


def _undocumented(keys, documented: list[str], labels: tuple[str, ...]) -> list[str]:
    """The keys no documented name matches; a name's `<label>`, `<phase>`, `<w>` and `<node>` stand
    for a reward component's label, a phase of `PHASES`, a window size and a node's name."""
    slots = _placeholders(labels)

    def pattern(name: str) -> re.Pattern:
        parts = re.split(r"<(\w+)>", name)
        return re.compile("".join(f"(?:{slots[p]})" if i % 2 else re.escape(p) for i, p in enumerate(parts)))

    patterns = [pattern(name) for name in documented]
    return sorted(k for k in keys if not any(p.fullmatch(k) for p in patterns))


def _summary_keys(summary: dict) -> list[str]:
    """The summary's keys and, for an object, its fields as `key.field`."""
    keys = []
    for key, value in summary.items():
        keys.append(key)
        if isinstance(value, dict):
            keys += [f"{key}.{field}" for field in value]
    return keys


METRICS = "### `metrics.jsonl`: one row per iteration"
SUMMARY = "### `summary.json`: the run at its end"


@pytest.mark.parametrize("run", list(RUNS))
def test_every_metrics_key_is_in_the_training_doc(trained, run):
    rows, _, labels = trained[run]
    keys = set().union(*rows)
    assert _undocumented(keys, _documented(METRICS), labels) == []


@pytest.mark.parametrize("run", list(RUNS))
def test_every_summary_key_is_in_the_training_doc(trained, run):
    _, summary, labels = trained[run]
    assert _undocumented(_summary_keys(summary), _documented(SUMMARY), labels) == []


def test_the_runs_cover_the_keys_that_come_with_settings(trained):
    """The runs produce the optional keys the two tests above check (else they would check less)."""
    dit, _, _ = trained["dit"]
    keys = set().union(*dit)
    assert {"eval_reward", "groups_dropped", "gradient_parts", "update_gradient_bytes", "explored_first_samples",
            "explore_budget", "ratio_dev"} <= keys
    assert "tokens" in set().union(*trained["llm"][0])
    assert {"reward_first2", "improvement_se", "warm_start"} <= set(trained["dit"][1])


def test_the_check_finds_a_key_the_doc_does_not_have():
    documented = _documented(METRICS)
    labels = ("colour",)
    assert _undocumented({"step", "reward_colour_mean", "time_rollout_s"}, documented, labels) == []
    # a made-up key, a component label the run does not have, a phase that is not one
    assert _undocumented({"made_up_s", "reward_other_mean", "time_nap_s"}, documented, labels) == [
        "made_up_s", "reward_other_mean", "time_nap_s"]
    assert _undocumented(["fleet.made_up"], _documented(SUMMARY), labels) == ["fleet.made_up"]


def test_every_test_file_the_code_and_docs_name_exists():
    """A docstring that claims an invariant names the test that checks it (STYLE.md): a moved or
    renamed test file must not leave the claim pointing nowhere."""
    import re
    import subprocess

    files = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.yaml"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    named = {m for f in files if (REPO / f).is_file()
             for m in re.findall(r"tests/[a-z0-9_/]+\.py", (REPO / f).read_text(errors="replace"))}
    assert "tests/test_imports.py" in named
    missing = sorted(t for t in named if not (REPO / t).is_file())
    assert not missing, f"named but not there: {missing}"


# ---- measured figures carry their date ------------------------------------------------------------

_FIGURE = r"\d+(?:\.\d+)? ?(?:s|min|ms|GiB|MiB|MB|GB|h)\b"
_MEASURED = re.compile(rf"\bmeasured\b[^.\n|]{{0,40}}?{_FIGURE}|\btook {_FIGURE}|\btakes (?:about |~)?{_FIGURE}")
_DATE = re.compile(r"20\d\d-\d\d-\d\d")


def undated_figures(text: str) -> list[str]:
    """The sections (## or ###) of a markdown text that state a measured figure ("measured 28.6 s",
    "took 51 s", "takes ~3 min") with no date in the section and no pointer to docs/measurements.md,
    where every row carries its date and machine: a figure without its date goes stale unseen (the
    README said ~28 min for a suite that took 38)."""
    return [section.splitlines()[0] for section in re.split(r"\n(?=#{2,3} )", text)
            if _MEASURED.search(section) and not _DATE.search(section) and "measurements.md" not in section]


def test_every_measured_figure_in_the_readme_and_docs_carries_its_date():
    docs = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
    found = {str(p.relative_to(REPO)): undated_figures(p.read_text()) for p in docs}
    assert {p: s for p, s in found.items() if s} == {}
    # The check finds one.
    assert undated_figures("# a\n\n## Speed\n\nThe suite took 38 s.\n\n## Other\n\nmeasured 3 s on 2026-11-28\n") \
        == ["## Speed"]
