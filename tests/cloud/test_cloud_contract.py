"""The contract suites of the cloud Protocols. Every implementation, fakes included, passes its
suite unchanged:
- `Store`: LocalStore, S3Store (against a moto server on loopback), GcsStore (against
  gcp-storage-emulator on loopback);
- `NoticeSource`: the IMDSv2 and GCE watchers (against a fake metadata server), SIGTERM, the
  trace replay, an in-memory stand-in;
- `Provider`: aws, gcp and local — a store each opens, and its notice source.
"""

import os
import signal

import pytest

from cloud.aws import AwsProvider, ImdsSpotWatcher, S3Store
from cloud.gcp import GcpPreemptionWatcher, GcpProvider
from cloud.gcs import GcsStore
from cloud.local import LocalProvider, TraceNoticeSource
from cloud.provider import Provider, get_provider
from cloud.store import ChecksumMismatch, LocalStore, MissingKey, ObjectStat, Store, StoreURIError
from cloud.open_store import open_store
from gcs_server import gcs, gcs_server  # noqa: F401 (fixtures)
from metadata_server import metadata, utc  # noqa: F401 (fixtures)
from s3_server import s3, s3_server  # noqa: F401 (fixtures)
from schedulers.clock import ManualClock
from schedulers.preemption import Cause, NoticeSource, PreemptionNotice, SigtermSource
from schedulers.traces import Trace, TraceEvent, replay_schedule

# ---- Store ----------------------------------------------------------------------------------------


@pytest.fixture(params=["local", "s3", "gcs"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    if request.param == "gcs":
        env = request.getfixturevalue("gcs")
        return open_store(f"gs://{env.bucket}/runs/a")  # the endpoint comes from STORAGE_EMULATOR_HOST
    env = request.getfixturevalue("s3")
    return open_store(f"s3://{env.bucket}/runs/a")  # the endpoint comes from AWS_ENDPOINT_URL


def test_store_round_trip(store, tmp_path):
    assert isinstance(store, Store)
    store.put("step-000002/state.json", b'{"step": 2}')
    assert store.get("step-000002/state.json") == b'{"step": 2}'
    payload = os.urandom(300_000)
    (tmp_path / "w.bin").write_bytes(payload)
    store.put_file("step-000002/checkpoints/w.bin", tmp_path / "w.bin")
    store.get_file("step-000002/checkpoints/w.bin", tmp_path / "back" / "w.bin")
    assert (tmp_path / "back" / "w.bin").read_bytes() == payload
    assert sorted(p.name for p in (tmp_path / "back").iterdir()) == ["w.bin"]  # no temporary left behind
    store.put("empty", b"")
    assert store.get("empty") == b""


def test_store_overwrite_replaces_the_whole_object(store):
    store.put("a/x", b"a much longer first version")
    store.put("a/x", b"short")
    assert store.get("a/x") == b"short"


def test_store_lists_sorted_keys_under_a_prefix(store):
    for key in ["step-000010/m", "step-000001/m", "step-000001/sub/f", "other"]:
        store.put(key, b".")
    assert store.list() == ["other", "step-000001/m", "step-000001/sub/f", "step-000010/m"]
    assert store.list("step-000001/") == ["step-000001/m", "step-000001/sub/f"]
    assert store.list("step-00001") == ["step-000010/m"]
    assert store.list("nothing/") == []


def test_store_missing_keys_and_deletes(store, tmp_path):
    with pytest.raises(MissingKey, match="no-such"):
        store.get("no-such")
    with pytest.raises(MissingKey):
        store.get_file("no-such/file", tmp_path / "f")
    assert not (tmp_path / "f").exists()
    store.delete("no-such")  # not an error
    store.put("d/x", b"1")
    store.delete("d/x")
    assert store.list() == []
    with pytest.raises(MissingKey):
        store.get("d/x")


def test_store_put_file_stores_only_a_regular_file_as_opened(store, tmp_path):
    """Issue 41: the run folder's files were checked with lstat and then opened by name, so a file
    swapped for a symlink in between was followed and its target stored. `put_file` judges the file
    it opened: a symlink (to a file or dangling) or a FIFO in its place is refused, nothing stored."""
    from cloud.store import LocalFileRefused

    secret = tmp_path / "secret"
    secret.write_bytes(b"not the run's")
    (tmp_path / "link").symlink_to(secret)
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    os.mkfifo(tmp_path / "fifo")  # no writer: opening it must not wait
    for name, what in (("link", "a symbolic link"), ("dangling", "a symbolic link"), ("fifo", "not a regular file")):
        with pytest.raises(LocalFileRefused, match=f"{name}: {what} \\(expected a regular file of this user; not stored"):
            store.put_file(f"r/{name}", tmp_path / name)
    assert store.list("r/") == []
    assert store.put_file("r/secret", secret) and store.get("r/secret") == b"not the run's"


def test_store_put_file_returns_the_checksum_get_file_verifies(store, tmp_path):
    payload = os.urandom(200_000)
    (tmp_path / "w.bin").write_bytes(payload)
    checksum = store.put_file("step-000002/w.bin", tmp_path / "w.bin")
    algorithm, _, value = checksum.partition(":")
    assert algorithm and value and algorithm.isidentifier() and "\n" not in checksum
    assert store.put_file("again/w.bin", tmp_path / "w.bin") == checksum  # the same bytes, the same checksum
    store.get_file("step-000002/w.bin", tmp_path / "back" / "w.bin", checksum=checksum)
    assert (tmp_path / "back" / "w.bin").read_bytes() == payload


def test_store_stat_gives_the_size_and_the_checksum_get_file_verifies(store, tmp_path):
    payload = os.urandom(200_000)
    (tmp_path / "w.bin").write_bytes(payload)
    checksum = store.put_file("m/w.bin", tmp_path / "w.bin")
    assert store.stat("m/w.bin") == ObjectStat(len(payload), checksum)
    store.put("m/w.bin", b"replaced")
    replaced = store.stat("m/w.bin")
    assert replaced.size == 8 and replaced.checksum != checksum  # a manifest-free "changed since?"
    store.get_file("m/w.bin", tmp_path / "back", checksum=replaced.checksum)
    assert (tmp_path / "back").read_bytes() == b"replaced"
    with pytest.raises(MissingKey, match="m/none"):
        store.stat("m/none")


@pytest.mark.parametrize("change", ["replaced", "truncated"])
def test_store_get_file_refuses_an_object_that_is_not_the_checksummed_one(store, tmp_path, change):
    payload = os.urandom(200_000)
    (tmp_path / "w.bin").write_bytes(payload)
    checksum = store.put_file("k/w.bin", tmp_path / "w.bin")
    store.put("k/w.bin", os.urandom(len(payload)) if change == "replaced" else payload[:-1000])
    (tmp_path / "back").mkdir()
    with pytest.raises(ChecksumMismatch, match="k/w.bin") as err:
        store.get_file("k/w.bin", tmp_path / "back" / "w.bin", checksum=checksum)
    assert "\n" not in str(err.value)
    assert list((tmp_path / "back").iterdir()) == []  # nothing at the path, no temporary left
    (tmp_path / "back" / "w.bin").write_bytes(b"older")  # an existing file is not replaced either
    with pytest.raises(ChecksumMismatch):
        store.get_file("k/w.bin", tmp_path / "back" / "w.bin", checksum=checksum)
    assert (tmp_path / "back" / "w.bin").read_bytes() == b"older"


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/../b", "trailing/", ".", ".tmp-x"])
def test_store_refuses_keys_that_are_not_relative_paths(store, key):
    with pytest.raises(ValueError, match="invalid store key"):
        store.put(key, b"x")


def test_local_store_leaves_no_partial_file_when_a_write_fails(tmp_path):
    store = LocalStore(tmp_path)
    store.put("k", b"old")

    class Boom(Exception):
        pass

    def failing(f):
        f.write(b"half")
        raise Boom

    with pytest.raises(Boom):
        store._write_atomically("k", failing)
    assert store.get("k") == b"old" and store.list() == ["k"]


# ---- NoticeSource ---------------------------------------------------------------------------------


class TriggeredSource:
    """The in-memory NoticeSource tests and the simulator use as a stand-in."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock, self.fired = clock, False

    def poll(self):
        return PreemptionNotice(Cause.TRACE, self.clock.now() + 5.0) if self.fired else None


# A two-node fleet; node a goes at 300 s (trace time). Replayed 10x faster with the 120 s AWS
# notice: slot 0 is warned at 18 s and killed at 30 s of replay time.
TRACE = Trace([TraceEvent(0.0, "add", "a"), TraceEvent(0.0, "add", "b"), TraceEvent(300.0, "remove", "a")], "test")


def _imds(base, state, clock):
    def trigger():
        state.instance_action = {"action": "terminate", "time": "2026-11-22T16:02:00Z"}

    return ImdsSpotWatcher(clock, base, utcnow=lambda: utc("2026-11-22T16:00:00")), trigger


def _gcp(base, state, clock):
    return GcpPreemptionWatcher(clock, base), lambda: setattr(state, "preempted", True)


def _sigterm(base, state, clock):
    return SigtermSource(clock, grace_s=30.0), lambda: os.kill(os.getpid(), signal.SIGTERM)


def _trace(base, state, clock):
    source = TraceNoticeSource(replay_schedule(TRACE, 2, speedup=10.0, notice_s=120.0), 0, clock)
    return source, lambda: clock.advance(18.0)


def _fake(base, state, clock):
    source = TriggeredSource(clock)
    return source, lambda: setattr(source, "fired", True)


# Each provider's notice source, triggered the way its cloud would.
def _aws_provider(base, state, clock):
    source = AwsProvider(imds_endpoint=base).notice_source(clock)
    return source, lambda: setattr(state, "instance_action", {"action": "stop", "time": "2099-01-01T00:00:00Z"})


def _gcp_provider(base, state, clock):
    return GcpProvider(metadata_endpoint=base).notice_source(clock), lambda: setattr(state, "preempted", True)


def _local_provider(base, state, clock):
    return LocalProvider(TRACE, slot=0, slots=2, speedup=10.0).notice_source(clock), lambda: clock.advance(20.0)


SOURCES = [_imds, _gcp, _sigterm, _trace, _fake, _aws_provider, _gcp_provider, _local_provider]


@pytest.mark.parametrize("make", SOURCES, ids=lambda f: f.__name__.strip("_"))
def test_notice_source_contract(make, metadata):
    base, state = metadata
    previous = signal.getsignal(signal.SIGTERM)
    clock = ManualClock(10.0)
    try:
        source, trigger = make(base, state, clock)
        assert isinstance(source, NoticeSource)
        assert source.poll() is None and source.poll() is None
        trigger()
        first = source.poll()
        assert first is not None and isinstance(first.cause, Cause)
        assert first.deadline is None or first.deadline >= clock.now()
        assert source.poll().cause is first.cause  # a notice stays until acted on
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_trace_notice_deadline_is_the_replayed_kill():
    clock = ManualClock(100.0)
    source = TraceNoticeSource(replay_schedule(TRACE, 2, speedup=10.0, notice_s=120.0), 0, clock)
    clock.advance(17.9)
    assert source.poll() is None
    clock.advance(0.1)
    notice = source.poll()
    assert (notice.cause, notice.deadline, notice.node) == (Cause.TRACE, 130.0, "slot-0")
    clock.advance(5.0)
    assert source.poll() == notice  # the deadline does not slide
    # slot 1 is never preempted; a source made after slot 0's kill is not warned about it
    assert TraceNoticeSource(replay_schedule(TRACE, 2, 10.0), 1, clock).poll() is None
    assert TraceNoticeSource(replay_schedule(TRACE, 2, 10.0), 0, clock, start=clock.now() - 40.0).poll() is None


# ---- Provider -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["aws", "gcp", "local"])
def test_provider_contract(name, tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTLIGHT_STORE_ROOTS", str(tmp_path))  # folder stores only in allowed folders
    provider = get_provider(name)
    assert isinstance(provider, Provider) and provider.name == name
    store = provider.open_store(str(tmp_path / "ckpt"))
    store.put("x/y", b"z")
    assert provider.open_store(f"file://{tmp_path}/ckpt").get("x/y") == b"z"
    bad_uris = ["s3:///no-bucket", "gs://Not_A_Bucket/x", "gcs://bucket/x", "ftp://host/x", "file:///etc",
                str(tmp_path.parent)]
    for bad in bad_uris + ([] if name == "gcp" else ["gs://bucket/x"]):  # gcp opens gs:// (next test)
        with pytest.raises(StoreURIError):
            provider.open_store(bad)
    clock = ManualClock()
    assert isinstance(provider.notice_source(clock), NoticeSource)


def test_s3_uris_open_s3_stores_on_aws_and_gcp_not_local(s3):
    for provider in (AwsProvider(), GcpProvider()):
        store = provider.open_store(f"s3://{s3.bucket}/p")
        assert isinstance(store, S3Store) and store.endpoint_url == s3.endpoint
    with pytest.raises(StoreURIError, match="local provider stores in a folder"):
        LocalProvider().open_store(f"s3://{s3.bucket}/p")


def test_gs_uris_open_gcs_stores_on_gcp_not_aws_or_local(gcs):
    store = GcpProvider(endpoint_url="http://127.0.0.1:9", region="us-east-1").open_store(f"gs://{gcs.bucket}/p")
    assert isinstance(store, GcsStore) and store.uri == f"gs://{gcs.bucket}/p"  # S3-only options left out
    store.put("x", b"y")
    assert store.get("x") == b"y"
    with pytest.raises(StoreURIError, match="not a store the AWS provider opens"):
        AwsProvider().open_store(f"gs://{gcs.bucket}/p")
    with pytest.raises(StoreURIError, match="local provider stores in a folder"):
        LocalProvider().open_store(f"gs://{gcs.bucket}/p")
