"""A launched node's environment settings (issue 41, item 12): `SPOTLIGHT_FLEET_POLL_S` and
`SPOTLIGHT_HEAD_WAIT_S` are parsed and range-checked before anything starts, and a bad one is one
line naming the variable, exit 2 — not a traceback (`abc`), an OverflowError (`inf`), a busy loop
of store reads (`0`, `-1`, `nan`) or a node that never gives up (`nan` as the head wait)."""

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
