"""The fleet's meeting place in its store (cloud/rendezvous.py): records signed with the fleet's
token, generations that count head restarts, and the done record that lets spot tasks end."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from cloud.rendezvous import DONE_KEY, HEAD_KEY, ForgedRecord, Rendezvous, signed, verify
from cloud.store import LocalStore

TOKEN = "ab" * 32


def _fleet(tmp_path, token=TOKEN, run="r"):
    return Rendezvous(LocalStore(tmp_path / "store"), token, run, wall=lambda: 1000.0)


def test_each_head_publishes_the_next_generation_and_a_new_head_undoes_done(tmp_path):
    fleet = _fleet(tmp_path)
    assert fleet.head() is None and fleet.done() is None
    first = fleet.publish_head("10.0.0.5", 6379)
    assert (first.generation, first.address, first.port) == (1, "10.0.0.5", 6379)
    assert fleet.head() == first
    fleet.publish_done("failed: " + "é" * 5000, 2, first.generation)  # a long error line still makes a record
    assert fleet.done().reason.startswith("failed: é") and fleet.done().exit_code == 2
    fleet.publish_done("finished: steps", 0, first.generation)
    assert fleet.done().reason == "finished: steps"
    # a recovered head elsewhere: the next generation, and the run is no longer done
    second = fleet.publish_head("10.0.7.9", 6379)
    assert second.generation == 2 and fleet.head().address == "10.0.7.9" and fleet.done() is None


def test_a_record_signed_without_the_token_or_for_another_run_is_refused_once(tmp_path, logged):
    said = logged
    fleet = _fleet(tmp_path)
    store = fleet.store
    forged = {"run": "r", "generation": 9, "address": "203.0.113.7", "port": 6379, "published_at": 1.0}
    store.put(HEAD_KEY, signed(forged, "cd" * 32))
    assert fleet.head() is None and fleet.head() is None
    assert len(said) == 1 and "does not verify with this fleet's token" in said[0], said
    # the same token, another run's record
    store.put(HEAD_KEY, signed({**forged, "run": "other"}, TOKEN))
    assert fleet.head() is None and "a record of run 'other'" in said[-1]
    # a changed field breaks the signature
    blob = json.loads(signed(forged, TOKEN))
    blob["record"]["address"] = "198.51.100.1"
    store.put(HEAD_KEY, json.dumps(blob).encode())
    assert fleet.head() is None
    # a forged head does not make the next generation start above it
    assert fleet.publish_head("10.0.0.5", 6379).generation == 1
    store.put(DONE_KEY, b"not json")
    assert fleet.done() is None and "not a fleet record" in said[-1]


@pytest.mark.parametrize("blob", [b"", b"[]", b'{"record": 1, "hmac": "x"}', b"x" * 5000])
def test_what_is_not_a_record_is_refused(blob):
    with pytest.raises(ForgedRecord, match="fleet/head.json: not a fleet record"):
        verify(blob, TOKEN, HEAD_KEY)


def test_an_empty_token_is_refused(tmp_path):
    with pytest.raises(ValueError, match="token is empty"):
        _fleet(tmp_path, token="")


def test_a_replayed_head_or_done_record_is_refused_and_the_newest_head_stands(tmp_path, logged):
    """Issue 41, item 1: a store writer without the token saved the signed records of generation 1
    and wrote them back after the head had moved to generation 2: spot nodes re-joined the old
    address, and the old done record made them exit 0 for good."""
    said = logged
    head = _fleet(tmp_path)
    first = head.publish_head("10.0.0.5", 6379)
    head.publish_done("finished: steps", 0, first.generation)
    old_head, old_done = head.store.get(HEAD_KEY), head.store.get(DONE_KEY)
    second = _fleet(tmp_path).publish_head("10.0.7.9", 6379)  # a recovered head elsewhere
    node = _fleet(tmp_path)
    assert node.head() == second and node.done() is None
    head.store.put(HEAD_KEY, old_head)  # written back
    assert node.head() == second and node.head() == second  # the newest head stands
    assert sum("generation 1 replayed after generation 2" in line for line in said) == 1, said
    head.store.put(DONE_KEY, old_done)
    assert node.done() is None
    # A node that starts now has seen nothing yet: it reads the head first, and the done record of
    # generation 1 is below the head's 2.
    head.store.put(HEAD_KEY, signed(asdict(second), TOKEN))
    assert _fleet(tmp_path).done() is None
    # A head publishes above every generation it has seen, even when the store was rolled back.
    assert node.highest == 2
    node.store.put(HEAD_KEY, old_head)
    assert node.publish_head("10.0.0.8", 6379).generation == 3
    # The head's own end record counts.
    node.publish_done("finished: steps", 0, 3)
    assert _fleet(tmp_path).done().generation == 3


def test_refused_records_are_remembered_and_logged_within_bounds(tmp_path, logged):
    from cloud.rendezvous import REFUSALS_KEPT, REFUSALS_LOGGED

    fleet = _fleet(tmp_path)
    for i in range(2000):
        forged = {"run": "r", "generation": i, "address": "203.0.113.7", "port": 6379, "published_at": 1.0}
        fleet.store.put(HEAD_KEY, signed(forged, "cd" * 32))
        assert fleet.head() is None
    assert fleet.refusals == 2000 and len(fleet._refused) == REFUSALS_KEPT
    assert len(logged) == REFUSALS_LOGGED + 1 and "further ones are counted, not logged" in logged[-1]
