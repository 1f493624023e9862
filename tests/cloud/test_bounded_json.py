"""Bounded JSON (cloud/bounded_json.py) and every reader of JSON read back from a disk or a store
(issue 27): a 100k-deep document is refused fast, without a RecursionError, and an oversized one
without being read whole; planted in each read-back site, it ends as that site's documented
outcome — a skipped checkpoint, a fresh explorer, an unused in-flight snapshot, a refused record,
one error line — never a traceback."""

from __future__ import annotations

import hashlib
import json
import os
import time
import tracemalloc

import pytest
import torch

from cloud.aws import ImdsSpotWatcher, S3Store
from cloud.bounded_json import JsonRefused, depth_over, load_file, loads
from cloud.cost import load_spent
from cloud.gcs import NotAServiceAccountKey, service_account_info
from cloud.open_store import open_store
from cloud.rendezvous import HEAD_KEY, Rendezvous
from cloud.store import LocalStore, MissingKey, ObjectTooLarge, StoreError, get_json
from conftest import small_dit_config
from gcs_server import gcs, gcs_server  # noqa: F401 (fixtures)
from s3_server import fault_proxy, s3, s3_server  # noqa: F401 (fixtures)
from schedulers.clock import ManualClock
from schedulers.input.files import ConfigError
from spotlight.rl.prompts import prompt_set
from spotlight.run_results import ResultsError, run_status
from spotlight.checkpoints import checkpoint
from spotlight.train.inflight import InflightStore
from spotlight.train.results_sync import MANIFEST, STATUS, ResultsSync
from spotlight.train.trainer import Trainer

DEEP = b"[" * 100_000 + b"]" * 100_000
"""100k levels: json.loads raises RecursionError on it (not a ValueError)."""
MiB = 1 << 20


# ---- the reader -----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [DEEP, DEEP.decode(), b'{"a":' * 100_000 + b"1" + b"}" * 100_000])
def test_a_100k_deep_document_is_refused_fast_without_recursing(text):
    with pytest.raises(RecursionError):
        json.loads(text)  # what every reader did before
    start = time.perf_counter()
    with pytest.raises(JsonRefused, match=r"^state\.json: nested deeper than 64 levels$") as err:
        loads(text, max_bytes=MiB, what="state.json")
    assert time.perf_counter() - start < 0.5
    assert isinstance(err.value, ValueError) and err.value.reason == "nested deeper than 64 levels"


def test_ordinary_json_passes_and_depth_is_counted_outside_strings():
    value = {"step": 3, "files": {"a": {"size": 1, "sha256": "x"}}, "loss": float("nan"), "é": "[[[{{{"}
    text = json.dumps(value)
    got = loads(text.encode(), max_bytes=MiB)
    assert got["step"] == 3 and got["é"] == "[[[{{{" and got["loss"] != got["loss"]  # NaN read, as before
    assert loads(text, max_bytes=MiB)["files"] == value["files"]
    assert loads("[" * 64 + "]" * 64, max_bytes=MiB) == loads("[" * 64 + "]" * 64, max_bytes=MiB)
    with pytest.raises(JsonRefused, match="nested deeper than 64"):
        loads("[" * 65 + "]" * 65, max_bytes=MiB)
    # brackets in strings, escaped quotes and backslashes count for nothing
    tricky = json.dumps(["\"[[[", "\\", "{{{\\\"[[[" * 100] * 50)
    assert not depth_over(tricky, 2) and depth_over(json.dumps([[[1]]] * 100), 2)
    assert loads(tricky, max_bytes=MiB, max_depth=2)[0] == "\"[[["


@pytest.mark.parametrize("data, says", [
    (b"{not json", "not JSON (Expecting property name"),
    (b"\xff\xfe\xfd", "not JSON"),
    (b"1" * 5000, "not JSON (Exceeds the limit"),
    (b"", "not JSON (Expecting value"),
])
def test_what_is_not_json_is_one_value_error_line(data, says):
    with pytest.raises(ValueError, match=f"^x: {says}".replace("(", r"\(")) as err:
        loads(data, max_bytes=MiB, what="x")
    assert "\n" not in str(err.value)


def test_the_size_cap_refuses_a_50_mb_file_without_reading_it_whole(tmp_path):
    big = tmp_path / "MANIFEST.json"
    with open(big, "wb") as f:
        f.write(b'{"files": ' + b" " * (50 * MiB) + b"{}}")
    tracemalloc.start()
    try:
        with pytest.raises(JsonRefused, match=r"^MANIFEST\.json: larger than 1 MiB$"):
            load_file(big, max_bytes=MiB)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * MiB, peak  # read whole, it would be 50 MiB
    for special in ("/dev/zero", tmp_path):  # a device (endless), a folder
        with pytest.raises(JsonRefused, match="not a regular file"):
            load_file(special, max_bytes=MiB)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(JsonRefused, match=r"^fifo: not a regular file$"):
        load_file(tmp_path / "fifo", max_bytes=MiB)  # opened without waiting for a writer
    with pytest.raises(FileNotFoundError):
        load_file(tmp_path / "none.json", max_bytes=MiB)  # a missing file is the reader's to tell apart


# ---- the store's bounded get ----------------------------------------------------------------------


@pytest.fixture(params=["local", "s3", "gcs"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    env = request.getfixturevalue(request.param)
    return open_store(f"{'gs' if request.param == 'gcs' else 's3'}://{env.bucket}/runs/a")


def test_every_store_refuses_an_object_over_max_bytes_and_reads_one_within_it(store):
    store.put("m/MANIFEST.json", b'{"step": 1}')
    assert store.get("m/MANIFEST.json", max_bytes=11) == b'{"step": 1}'
    assert get_json(store, "m/MANIFEST.json", max_bytes=MiB) == {"step": 1}
    with pytest.raises(ObjectTooLarge, match=r"m/MANIFEST\.json: 11 bytes, more than the 10 bytes") as err:
        store.get("m/MANIFEST.json", max_bytes=10)
    assert isinstance(err.value, StoreError) and isinstance(err.value, ValueError) and "\n" not in str(err.value)
    with pytest.raises(MissingKey):
        store.get("m/none", max_bytes=10)
    store.put("m/deep.json", DEEP)
    with pytest.raises(JsonRefused, match=r"m/deep\.json: nested deeper than 64 levels"):
        get_json(store, "m/deep.json", max_bytes=MiB)


def test_a_50_mb_local_object_read_with_a_1_mib_cap_costs_no_50_mb(tmp_path):
    store = LocalStore(tmp_path / "store")
    store.put("step-000001/MANIFEST.json", b"[" + b"0," * (25 * MiB) + b"0]")
    tracemalloc.start()
    try:
        with pytest.raises(ObjectTooLarge):
            store.get("step-000001/MANIFEST.json", max_bytes=MiB)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * MiB, peak  # issue 27: a 400 MB manifest cost 1.17 GB
    os.mkfifo(tmp_path / "store" / "fifo")
    with pytest.raises(MissingKey):
        store.get("fifo", max_bytes=MiB)  # no object there, and no wait for a writer


def test_s3_closes_a_body_over_the_cap_unread(s3):
    store = open_store(f"s3://{s3.bucket}/runs/a")
    store.put("big", os.urandom(8 * MiB))
    bodies = []
    get_object = store.client.get_object

    def spy(**kwargs):
        answer = get_object(**kwargs)
        bodies.append(answer["Body"])
        return answer

    store.client.get_object = spy
    with pytest.raises(ObjectTooLarge, match="8388608 bytes"):
        store.get("big", max_bytes=MiB)
    assert len(bodies) == 1 and bodies[0]._amount_read == 0  # closed on its Content-Length


def test_a_bounded_s3_get_still_checks_the_body_against_s3s_checksum(s3, fault_proxy):
    store = S3Store(s3.bucket, "run", endpoint_url=fault_proxy.url, clock=ManualClock(), request_attempts=1)
    data = os.urandom(300_000)
    store.put("w", data)
    fault_proxy.damage(1, match="GET ")  # one byte of the body flipped on its way: fetched again
    assert store.get("w", max_bytes=MiB) == data and store.retries == 1 and fault_proxy.faults == 1


def test_gcs_never_downloads_an_object_over_the_cap(gcs, monkeypatch):
    from google.cloud.storage import Blob

    store = open_store(f"gs://{gcs.bucket}/runs/a")
    store.put("big", os.urandom(3 * MiB))
    downloads = []
    download = Blob.download_as_bytes
    monkeypatch.setattr(Blob, "download_as_bytes", lambda self, **kw: downloads.append(1) or download(self, **kw))
    with pytest.raises(ObjectTooLarge, match="3145728 bytes"):
        store.get("big", max_bytes=MiB)
    assert downloads == []  # its metadata said enough
    assert len(store.get("big", max_bytes=4 * MiB)) == 3 * MiB and downloads == [1]


# ---- every read-back site, with a 100k-deep document planted ----------------------------------------


def _two_checkpoints(root):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    return [checkpoint.save(root, step, model, optimizer, keep=3) for step in (1, 2)]


@pytest.mark.parametrize("name", [checkpoint.MANIFEST, checkpoint.FILES[2]])
def test_a_deep_manifest_or_state_json_skips_the_checkpoint_with_one_line(tmp_path, name):
    root = tmp_path / "checkpoints"
    _, newest = _two_checkpoints(root)
    (newest.path / name).write_bytes(DEEP)
    if name != checkpoint.MANIFEST:  # the manifest names the planted file's size and hash: only its content is bad
        manifest = json.loads((newest.path / checkpoint.MANIFEST).read_text())
        manifest["files"][name] = {"size": len(DEEP), "sha256": hashlib.sha256(DEEP).hexdigest()}
        (newest.path / checkpoint.MANIFEST).write_text(json.dumps(manifest))
    assert checkpoint.verify(newest) == f"unreadable {name}: nested deeper than 64 levels"
    lines: list[str] = []
    assert checkpoint.newest_usable(root, lines.append).step == 1
    assert len(lines) == 1 and "step-000002 skipped: unreadable" in lines[0]


def test_an_oversized_checkpoint_manifest_is_skipped_unread(tmp_path):
    _, newest = _two_checkpoints(tmp_path / "checkpoints")
    with open(newest.path / checkpoint.MANIFEST, "ab") as f:
        f.truncate(checkpoint.MAX_MANIFEST_BYTES + 1)
    assert checkpoint.verify(newest) == "unreadable MANIFEST.json: larger than 1 MiB"


def test_a_deep_inflight_manifest_or_an_oversized_snapshot_is_not_used(tmp_path, logged):
    lines = logged
    inflight = InflightStore(LocalStore(tmp_path / "store"))
    inflight.store.put("inflight/it-000001.json", b"[" * 30_000 + b"]" * 30_000)  # within its 64 KiB
    assert inflight.load(1, {"r": (1, 2)}) == ({}, {})
    assert len(lines) == 1 and lines[0].endswith("not used: unreadable manifest (nested deeper than 64 levels)")
    inflight.store.put("inflight/it-000001.json", DEEP)  # 200 KB: never read
    assert inflight.load(1, {"r": (1, 2)}) == ({}, {})
    assert lines[-1].endswith("not used: its manifest is over 65536 bytes (not read)")
    # a manifest that says 10 bytes, a snapshot of 3 MiB: refused before it is read
    inflight.store.put("inflight/it-000002.data", b"\0" * (3 * MiB))
    inflight.store.put("inflight/it-000002.json", json.dumps({"step": 2, "size": 10, "sha256": "0" * 64}).encode())
    assert inflight.load(2, {"r": (1, 2)}) == ({}, {})
    assert "larger than its manifest's 10 bytes" in lines[-1]


def test_a_deep_explorer_state_gives_a_fresh_explorer(tmp_path, logged):
    cfg = small_dit_config(exploration={"enabled": True, "planner": "bandit", "samples_per_step": 16,
                                        "candidates_per_prompt": 12, "request_size": 4, "round_samples": 8})
    lines = logged
    trainer = Trainer(cfg, tmp_path / "out", progress=False)  # cheap: nothing built
    trainer.prompts, trainer.start_step = prompt_set(cfg.prompts, cfg.seed), 1
    (tmp_path / "out" / "explorer").mkdir(parents=True)
    (tmp_path / "out" / "explorer" / "step-000001.json").write_bytes(DEEP)
    explorer = trainer._explorer()
    assert explorer.pool_step == -1  # nothing half-loaded: as made
    assert len(lines) == 1 and lines[0].startswith("explorer state for iteration 1: unreadable (JsonRefused)")


@pytest.mark.parametrize("planted", [DEEP, b"{" + b" " * (64 * 1024) + b"}"])
def test_a_deep_or_oversized_cost_json_is_one_config_error_line(tmp_path, planted):
    (tmp_path / "cost.json").write_bytes(planted)
    with pytest.raises(ConfigError, match=r"cost\.json: expected \{\"cost_usd\"") as err:
        load_spent(tmp_path)
    assert "\n" not in str(err.value)


def test_a_deep_or_oversized_fleet_record_is_refused_once(tmp_path, logged):
    lines = logged
    fleet = Rendezvous(LocalStore(tmp_path / "store"), "ab" * 32, "r", wall=lambda: 1.0)
    fleet.store.put(HEAD_KEY, b"[" * 4000 + b"]" * 96)  # within the record's 4 KiB, 4,000 levels deep
    assert fleet.head() is None and fleet.head() is None
    assert len(lines) == 1 and "nested deeper than 64 levels" in lines[0]
    fleet.store.put(HEAD_KEY, DEEP)  # 200 KB: over the record's size, never read
    assert fleet.head() is None and fleet.head() is None
    assert len(lines) == 2 and "over 4096 bytes, not read" in lines[1]
    assert fleet.publish_head("10.0.0.5", 6379).generation == 1  # a refused record is no generation


def test_deep_results_records_are_a_fresh_manifest_on_the_head_and_one_error_line_on_a_laptop(tmp_path, logged):
    store = LocalStore(tmp_path / "store")
    store.put(MANIFEST, DEEP)
    lines = logged
    sync = ResultsSync(store, tmp_path / "out", keep_stored=True)
    assert sync._stored() == {} and len(lines) == 1 and "nested deeper than 64 levels" in lines[0]
    for key in (STATUS, MANIFEST):
        store.put(key, DEEP)
        with pytest.raises(ResultsError, match=f"{key}: nested deeper than 64 levels") as err:
            run_status(store, now=0.0)
        assert "\n" not in str(err.value)
        store.delete(key)


def test_imds_answers_too_deep_to_parse_are_still_a_notice_and_poll_never_raises():
    watcher = ImdsSpotWatcher(ManualClock(), "http://127.0.0.1:9")
    watcher._request = lambda method, path, headers: (200, b"[" * 60_000)
    notice = watcher.poll()
    assert notice is not None and notice.deadline is None and len(notice.detail) < 300


def test_a_deep_service_account_key_is_refused_with_one_line():
    with pytest.raises(NotAServiceAccountKey, match="nested deeper than 64 levels"):
        service_account_info("[" * 30_000)


def test_deep_files_read_elsewhere_fall_back_as_documented(tmp_path):
    from cloud.model_cache import _read_record
    from spotlight.fleet_node import _stop_reason
    from spotlight.sim.progress_model import ProgressModel

    (tmp_path / "summary.json").write_bytes(DEEP)
    assert _stop_reason(tmp_path) is None  # no record of the run's end: an exit 0 is then not "done"
    (tmp_path / "model.fetch.json").write_bytes(DEEP)
    assert _read_record(tmp_path / "model", "s3://b/model") == {}  # no record: the folder is checked anew
    (tmp_path / "results.json").write_bytes(DEEP)
    assert ProgressModel.calibrated(tmp_path / "results.json").source == ProgressModel.calibrated().source
