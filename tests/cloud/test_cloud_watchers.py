"""The IMDSv2 and GCE metadata watchers against a real HTTP server on 127.0.0.1 that speaks both
formats (tests/metadata_server.py). The NoticeSource contract every source passes is in
tests/cloud/test_cloud_contract.py."""

import pytest

from cloud.aws import ImdsSpotWatcher
from cloud.gcp import GcpPreemptionWatcher
from metadata_server import closed_port_url, metadata, utc  # noqa: F401 (fixtures)
from schedulers.clock import ManualClock
from schedulers.preemption import Cause


def test_fake_server_speaks_imdsv2(metadata):
    import urllib.error
    import urllib.request

    base, _ = metadata
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with pytest.raises(urllib.error.HTTPError) as bad_put:
        opener.open(urllib.request.Request(base + "/latest/api/token", method="PUT"), timeout=5)
    assert bad_put.value.code == 400
    with pytest.raises(urllib.error.HTTPError) as no_token:
        opener.open(base + "/latest/meta-data/spot/instance-action", timeout=5)
    assert no_token.value.code == 401
    with pytest.raises(urllib.error.HTTPError) as no_flavor:
        opener.open(base + "/computeMetadata/v1/instance/preempted", timeout=5)
    assert no_flavor.value.code == 403


def test_imds_no_notice_then_instance_action_with_deadline(metadata):
    base, state = metadata
    clock = ManualClock(1000.0)
    now = [utc("2026-11-22T16:18:00")]
    watcher = ImdsSpotWatcher(clock, base, utcnow=lambda: now[0])
    assert watcher.poll() is None
    assert ("GET", "/latest/meta-data/spot/instance-action", 404) in state.requests
    assert ("GET", "/latest/meta-data/events/recommendations/rebalance", 404) in state.requests

    state.instance_action = {"action": "terminate", "time": "2026-11-22T16:20:00Z"}
    notice = watcher.poll()
    assert notice.cause is Cause.AWS_INSTANCE_ACTION
    assert notice.deadline == 1120.0 and notice.seconds_left(clock) == 120.0
    assert "terminate" in notice.detail
    clock.advance(30)
    now[0] = utc("2026-11-22T16:18:30")
    assert watcher.poll().deadline == 1120.0  # the deadline does not slide between polls
    assert state.token_puts == 1  # one token serves every request until it expires


def test_imds_instance_action_outranks_rebalance(metadata):
    base, state = metadata
    clock = ManualClock()
    watcher = ImdsSpotWatcher(clock, base, utcnow=lambda: utc("2026-11-22T16:00:00"))
    state.rebalance = {"noticeTime": "2026-11-22T15:55:00Z"}
    notice = watcher.poll()
    assert (notice.cause, notice.deadline) == (Cause.AWS_REBALANCE, None)
    assert "2026-11-22T15:55:00Z" in notice.detail
    assert ImdsSpotWatcher(clock, base, rebalance=False).poll() is None
    state.instance_action = {"action": "stop", "time": "2026-11-22T16:02:00Z"}
    notice = watcher.poll()
    assert (notice.cause, notice.deadline) == (Cause.AWS_INSTANCE_ACTION, 120.0)


def test_imds_unreadable_instance_action_is_a_notice_without_deadline(metadata):
    base, state = metadata
    state.instance_action = {"action": "terminate", "time": "soon"}
    notice = ImdsSpotWatcher(ManualClock(), base).poll()
    assert (notice.cause, notice.deadline) == (Cause.AWS_INSTANCE_ACTION, None)


def test_imds_token_refreshed_after_401_and_after_expiry(metadata):
    base, state = metadata
    clock = ManualClock()
    watcher = ImdsSpotWatcher(clock, base)
    assert watcher.poll() is None and state.token_puts == 1
    state.tokens.clear()  # IMDS forgot the token (e.g. the instance was stopped and started)
    state.rebalance = {"noticeTime": "2026-11-22T15:55:00Z"}
    assert watcher.poll().cause is Cause.AWS_REBALANCE
    assert state.token_puts == 2
    assert ("GET", "/latest/meta-data/spot/instance-action", 401) in state.requests
    clock.advance(6 * 3600)  # past the 21600 s TTL: renewed before use, no 401 needed
    failures = sum(status == 401 for *_, status in state.requests)
    assert watcher.poll().cause is Cause.AWS_REBALANCE
    assert state.token_puts == 3 and sum(status == 401 for *_, status in state.requests) == failures


def test_imds_endpoint_from_environment(metadata, monkeypatch):
    base, state = metadata
    monkeypatch.setenv("SPOTLIGHT_IMDS_ENDPOINT", base + "/")
    watcher = ImdsSpotWatcher(ManualClock())
    assert watcher.base == base
    assert watcher.poll() is None and state.token_puts == 1
    monkeypatch.delenv("SPOTLIGHT_IMDS_ENDPOINT")
    assert ImdsSpotWatcher(ManualClock()).base == "http://169.254.169.254"  # constructed, never polled
    with pytest.raises(ValueError, match="SPOTLIGHT_IMDS_ENDPOINT"):
        ImdsSpotWatcher(ManualClock(), "127.0.0.1:1")


def test_gcp_preempted_false_then_true(metadata):
    base, state = metadata
    clock = ManualClock(200.0)
    watcher = GcpPreemptionWatcher(clock, base)
    assert watcher.poll() is None
    assert state.requests[-1] == ("GET", "/computeMetadata/v1/instance/preempted", 200)
    state.preempted = True
    notice = watcher.poll()
    assert (notice.cause, notice.deadline) == (Cause.GCP_PREEMPTED, 230.0)
    clock.advance(10)
    assert watcher.poll() == notice and notice.seconds_left(clock) == 20.0


def test_gcp_endpoint_from_environment(metadata, monkeypatch):
    base, state = metadata
    state.preempted = True
    monkeypatch.setenv("SPOTLIGHT_GCE_METADATA_ENDPOINT", base)
    assert GcpPreemptionWatcher(ManualClock()).poll().cause is Cause.GCP_PREEMPTED
    monkeypatch.delenv("SPOTLIGHT_GCE_METADATA_ENDPOINT")
    assert GcpPreemptionWatcher(ManualClock()).base == "http://metadata.google.internal"


def test_unreachable_endpoints_mean_no_notice(closed_port_url):
    clock = ManualClock()
    assert ImdsSpotWatcher(clock, closed_port_url).poll() is None
    assert GcpPreemptionWatcher(clock, closed_port_url).poll() is None


def test_server_errors_mean_no_notice(metadata):
    base, _ = metadata
    # Paths the fake server does not know: 404 on the token PUT for IMDS, 404 for GCE.
    assert ImdsSpotWatcher(ManualClock(), base + "/nowhere").poll() is None
    assert GcpPreemptionWatcher(ManualClock(), base + "/nowhere").poll() is None
