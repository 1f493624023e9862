"""What a launched node checks before it acts (issue 41). Item 12, its environment settings:
`SPOTLIGHT_FLEET_POLL_S` and `SPOTLIGHT_HEAD_WAIT_S` are parsed and range-checked before anything
starts, and a bad one is one line naming the variable, exit 2 — not a traceback (`abc`), an OverflowError (`inf`), a busy loop
of store reads (`0`, `-1`, `nan`) or a node that never gives up (`nan` as the head wait). Item 7:
an exit 0 of `spotlight train` is the run's end only with the run's own record of it."""

import pytest

from spotlight import fleet_node


@pytest.mark.parametrize("name", [fleet_node.POLL_ENV, fleet_node.HEAD_WAIT_ENV])
@pytest.mark.parametrize("value", ["abc", "inf", "-inf", "nan", "0", "-1", "1e9", ""])
def test_a_bad_setting_is_one_line_naming_it_before_anything_starts(tmp_path, monkeypatch, capsys, name, value):
    monkeypatch.setenv(name, value)
    config = tmp_path / "run.yaml"  # never read: the settings are checked first
    assert fleet_node.main(["spot", "--config", str(config), "--name", "fleet"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"spotlight fleet: error: ${name}: expected seconds in ["), line


def test_good_settings_and_unset_ones_are_read_as_seconds(monkeypatch):
    monkeypatch.delenv(fleet_node.POLL_ENV, raising=False)
    assert fleet_node.env_seconds(fleet_node.POLL_ENV) == fleet_node.POLL_S
    monkeypatch.setenv(fleet_node.HEAD_WAIT_ENV, " 30 ")
    assert fleet_node.env_seconds(fleet_node.HEAD_WAIT_ENV) == 30.0


def test_an_exit_0_is_the_runs_end_only_with_its_own_record_written_this_session(tmp_path):
    """A reward's os._exit(0) ended `spotlight train` after one checkpoint of six with exit 0 and no
    summary.json: the head would have published done.json and every spot node exited for good."""
    import json
    import os
    import time

    assert fleet_node._stop_reason(tmp_path) is None  # no summary.json
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"steps": 6}))
    assert fleet_node._stop_reason(tmp_path) is None  # no stop reason in it
    summary.write_text(json.dumps({"steps": 6, "stop_reason": "budget"}))
    assert fleet_node._stop_reason(tmp_path) == "finished: budget"
    earlier = time.time() - 3600
    os.utime(summary, (earlier, earlier))  # an earlier session's, left in the folder
    assert fleet_node._stop_reason(tmp_path, since=time.time() - 60) is None
