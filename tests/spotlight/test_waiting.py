"""`spotlight.waiting`: a wait is named when it begins and reminded while it lasts, then falls silent."""

import time

import pytest

from spotlight.waiting import waiting


def test_a_wait_is_named_then_reminded_until_it_ends(logged):
    said = logged
    with waiting("starting the actors", every_s=0.05):
        time.sleep(0.28)
    reminders = said[1:]
    assert said[0] == "starting the actors ..."
    assert 3 <= len(reminders) <= 6, said
    assert all(r.startswith("starting the actors: still waiting (") and r.endswith(" s)") for r in reminders)
    time.sleep(0.15)
    assert len(said) == 1 + len(reminders)  # nothing after the wait ended


def test_a_failing_wait_stops_reminding_and_raises(logged):
    said = logged
    with pytest.raises(RuntimeError, match="no cluster"):
        with waiting("joining", every_s=0.05):
            raise RuntimeError("no cluster")
    time.sleep(0.12)
    assert said == ["joining ..."]
