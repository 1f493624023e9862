"""`spotlight launch` ends with the next steps (`cloud.sky.next_steps`): after a dry run, the command
that launches the fleet and why `sky jobs launch fleet.yaml` alone does not; then how to see where
the run stands, its tasks and their logs, how to cancel it, how to pull its results, and where the
walkthrough is. Every SkyPilot command printed is parsed by the pinned SkyPilot's own CLI."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from cloud import sky
from spotlight.cli import main
from spotlight.config import to_yaml

from conftest import small_dit_config

REPO = Path(__file__).resolve().parents[2]
URI = "s3://fleet-bucket/runs/steps"


@pytest.fixture(autouse=True)
def no_store_credentials(monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def _dry_run(tmp_path, capsys) -> tuple[list[str], Path]:
    """The dry run's stdout from its "next steps" line on, and the task folder."""
    config = tmp_path / "steps.yaml"
    config.write_text(to_yaml(small_dit_config(runtime={"kind": "ray", "spot_workers": 2},
                                               cloud={"gpu": "T4", "provider": "aws", "region": "us-east-1"})))
    out = tmp_path / "tasks"
    assert main(["launch", str(config), "--dryrun", "--out", str(out), "--name", "steps",
                 "--checkpoint-uri", URI]) == 0
    printed = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(printed) if line.startswith("next steps"))
    return printed[start:], out


def _rows(lines: list[str]) -> dict[str, tuple[str, str]]:
    """label -> (command, what it is for), from the aligned "  label   command  # why" lines."""
    rows, label = {}, ""
    for line in lines[1:]:
        assert line.startswith("  "), line
        label = line[2:10].strip() or label + "+"
        command, _, why = line[10:].partition("# ")
        rows[label] = (command.rstrip(), why)
    return rows


def test_the_dry_run_ends_with_the_launch_command_and_how_to_follow_and_cancel_the_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(sky.SKY_PYTHON_ENV, str(tmp_path / "no-such-python"))  # no SkyPilot: `sky` as typed
    lines, out = _dry_run(tmp_path, capsys)
    assert lines[0] == "next steps (the walkthrough: docs/launch-on-aws-gcp.md):"
    rows = _rows(lines)
    assert list(rows) == ["launch", "launch+", "status", "queue", "logs", "cancel", "pull"]
    assert rows["launch"][0] == (f"spotlight launch {tmp_path / 'steps.yaml'} --name steps --checkpoint-uri {URI} "
                                 f"--out {out}")
    alone = rows["launch+"][1]  # the pointer: the YAML is not a launch by itself
    assert alone.startswith(f"not `sky jobs launch {out / 'fleet.yaml'}` alone: spotlight launch gives the nodes "
                            "the fleet's Ray token and the store's credentials as SkyPilot secrets")
    assert "docs/launching.md" in alone
    assert {label: command for label, (command, _) in rows.items() if label != "launch+"} == {
        "launch": rows["launch"][0],
        "status": f"spotlight status {URI}",
        "queue": "sky jobs queue",
        "logs": "sky jobs logs -n steps",
        "cancel": "sky jobs cancel -y -n steps",
        "pull": f"spotlight pull {URI} --out runs/steps",
    }
    # what the lines point at is there: the walkthrough, and the page that says what a launch adds
    assert (REPO / "docs" / "launch-on-aws-gcp.md").is_file()
    assert "sky jobs launch" in (REPO / "docs" / "launching.md").read_text()


# Runs in SkyPilot's Python: parse each command line with SkyPilot's own click CLI, down to the
# subcommand, without running it; one JSON list of {line, error}.
_PARSE = r"""
import json, shlex, sys
import click
from sky.client.cli import command
out = []
for line in sys.argv[1:]:
    cmd, ctx, args = command.cli, None, shlex.split(line)[1:]
    try:
        while True:
            ctx = cmd.make_context(cmd.name or "sky", args, parent=ctx)
            if not isinstance(cmd, click.Group):
                break
            _, cmd, args = cmd.resolve_command(ctx, ctx.protected_args + ctx.args)
        out.append({"line": line, "error": None})
    except click.exceptions.ClickException as err:
        out.append({"line": line, "error": err.format_message()})
print("SPOTLIGHT-SKY " + json.dumps(out))
"""


def _parsed_by_skypilot(python: Path, lines: list[str]) -> dict[str, str | None]:
    proc = subprocess.run([str(python), "-c", _PARSE, *lines], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"})
    (answer,) = [line for line in proc.stdout.splitlines() if line.startswith("SPOTLIGHT-SKY ")]
    return {r["line"]: r["error"] for r in json.loads(answer.removeprefix("SPOTLIGHT-SKY "))}


def test_every_skypilot_command_printed_is_one_the_pinned_skypilot_parses(tmp_path, capsys, monkeypatch, sky_python):
    monkeypatch.setenv(sky.SKY_PYTHON_ENV, str(sky_python))
    lines, _ = _dry_run(tmp_path, capsys)
    exe = sky.shown(sky_python.parent / "sky")
    commands = [command for command, _ in _rows(lines).values() if command.startswith(exe + " ")]
    assert len(commands) == 3  # queue, logs, cancel: `sky` beside the Python that validated the tasks
    head_log = next(why for command, why in _rows(lines).values() if command.endswith(" jobs logs -n steps"))
    commands.append(head_log.partition("alone: ")[2].partition(" (")[0].replace("JOB_ID", "7"))
    assert commands[-1] == f"{exe} jobs logs 7 head"
    assert _parsed_by_skypilot(sky_python, commands) == dict.fromkeys(commands)
    # and the parse can fail: SkyPilot's own help example names a task after -n, which 0.14.1 takes for JOB_ID
    assert "not a valid integer" in _parsed_by_skypilot(sky_python, ["sky jobs logs -n steps head"])[
        "sky jobs logs -n steps head"]
