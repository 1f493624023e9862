"""A model folder in a bucket, cached on a node's disk (`cloud.model_cache`), on the tiny Qwen-Image
pipeline folder uploaded to a moto S3 server on loopback:
- fetched bit-identical, once: a second fetch (a node recovered on the same disk) downloads
  nothing, and a loader finds it without asking the store;
- an interrupted fetch resumes with only what is missing; an object replaced in the store since,
  or a file cut short here, is fetched again; an object that is not what the store's checksum
  says is refused and nothing is written;
- two fetches at once on one node download each file once;
- `policy.pretrained_path: s3://...` passes `spotlight train`'s input checks (which fetch it) and
  builds the DiT policy of the local folder; the config keeps the URI; a bad URI is one line
  naming the field;
- a Hugging Face repo id goes through `snapshot_download` (replaced here: no network);
- `prefetch(cfg)` and `python -m cloud.model_cache RUN_YAML`, what a fleet node runs before its
  workers, fetch (exit 0) or say one line (exit 2).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from cloud.model_cache import (cache_folder, cached_folder, fetch_model, main, model_folder, prefetch,
                                source_kind)
from cloud.open_store import open_store
from cloud.store import ObjectStat, StoreError
from s3_server import s3, s3_server  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[2]
SHARDS = "transformer/diffusion_pytorch_model.safetensors"


class Counting:
    """A store that counts the calls made to it, and fails `get_file` of the keys in `fail`, or
    reports checksums of other bytes for the keys in `lie`, as a store would whose object changed
    under it."""

    def __init__(self, store, fail=(), lie=()):
        self.store, self.fail, self.lie, self.calls = store, set(fail), set(lie), Counter()
        self.got: list[str] = []
        self.uri = store.uri
        self._guard = threading.Lock()

    def list(self, prefix=""):
        self.calls["list"] += 1
        return self.store.list(prefix)

    def stat(self, key):
        with self._guard:
            self.calls["stat"] += 1
        stat = self.store.stat(key)
        return ObjectStat(stat.size, "crc64nvme:AAAAAAAAAAA=") if key in self.lie else stat

    def get_file(self, key, path, checksum=None):
        with self._guard:
            self.calls["get_file"] += 1
            self.got.append(key)
        if key in self.fail:
            raise StoreError(f"{self.uri}/{key}: connection reset (a test's fault)")
        return self.store.get_file(key, path, checksum)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def uploaded(s3, tiny_qwen_pipeline):
    """The tiny pipeline folder in s3://BUCKET/models/tiny-qwen, as `aws s3 sync` leaves it."""
    uri = f"s3://{s3.bucket}/models/tiny-qwen"
    store = open_store(uri)
    for key in _files(tiny_qwen_pipeline):
        store.put_file(key, tiny_qwen_pipeline / key)
    return uri, store


def test_a_bucket_folder_is_fetched_bit_identical_and_only_once(uploaded, tiny_qwen_pipeline, tmp_path):
    uri, store = uploaded
    first, state = Counting(store), random.getstate()
    folder = fetch_model(uri, tmp_path / "cache", workers=4, store=first)
    assert random.getstate() == state  # a run's checkpointed RNG, whatever the 4 threads did
    assert folder == cache_folder(uri, tmp_path / "cache") and folder.parent == tmp_path / "cache"
    assert _files(folder) == _files(tiny_qwen_pipeline)  # every file, bit for bit, nothing else
    assert sorted(first.got) == sorted(_files(tiny_qwen_pipeline)) and first.calls["list"] == 1

    again = Counting(store)  # a node recovered on the same disk: the store is asked, nothing is downloaded
    assert fetch_model(uri + "/", tmp_path / "cache", store=again) == folder
    assert again.calls["get_file"] == 0 and again.calls["list"] == 1
    # A loader's resolution asks no store at all (none is passed: opening one would be the s3 server's).
    assert cached_folder(uri, tmp_path / "cache") == folder == model_folder(uri, tmp_path / "cache")


def test_an_interrupted_fetch_resumes_with_only_what_is_missing(uploaded, tiny_qwen_pipeline, tmp_path):
    uri, store = uploaded
    with pytest.raises(StoreError, match=rf"1 of \d+ files not fetched \({SHARDS}: .*next fetch gets the rest") as err:
        fetch_model(uri, tmp_path, store=Counting(store, fail={SHARDS}))
    assert "\n" not in str(err.value)
    folder = cache_folder(uri, tmp_path)
    assert SHARDS not in _files(folder) and cached_folder(uri, tmp_path) is None  # no partial file, not complete
    assert not [p for p in folder.rglob(".tmp-*")]
    resumed = Counting(store)
    fetch_model(uri, tmp_path, store=resumed)
    assert resumed.got == [SHARDS] and _files(folder) == _files(tiny_qwen_pipeline)


def test_a_changed_object_or_a_cut_file_is_fetched_again_and_a_damaged_one_refused(uploaded, tmp_path):
    uri, store = uploaded
    folder = fetch_model(uri, tmp_path, store=store)
    (tmp_path / "new").write_bytes(b"a retrained scheduler")
    store.put_file("scheduler/scheduler_config.json", tmp_path / "new")  # replaced in the store since
    with open(folder / "vae/config.json", "r+b") as f:  # cut short here (a disk that lost its tail)
        f.truncate(10)
    after = Counting(store)
    fetch_model(uri, tmp_path, store=after)
    assert sorted(after.got) == ["scheduler/scheduler_config.json", "vae/config.json"]
    assert (folder / "scheduler/scheduler_config.json").read_bytes() == b"a retrained scheduler"
    assert (folder / "vae/config.json").read_bytes() == store.get("vae/config.json")

    # An object whose bytes are not those of the checksum the store gives: refused, the copy here kept.
    before = (folder / "model_index.json").read_bytes()
    store.put("model_index.json", b"{}")
    with pytest.raises(StoreError, match="model_index.json: .*checksum"):
        fetch_model(uri, tmp_path, store=Counting(store, lie={"model_index.json"}))
    assert (folder / "model_index.json").read_bytes() == before and cached_folder(uri, tmp_path) is None
    fetch_model(uri, tmp_path, store=store)
    assert (folder / "model_index.json").read_bytes() == b"{}"


def test_a_tampered_fetch_record_touches_nothing_outside_the_cache(uploaded, tmp_path):
    """Issue 41, item 11: a key "../../x" in the record, which the store no longer lists, made the
    fetch unlink a file outside the cache. A record with a key that fails the store's key check is
    no record: the folder is checked against the store afresh."""
    import json

    uri, store = uploaded
    folder = fetch_model(uri, tmp_path / "cache", store=store)
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's")
    record = folder.with_name(folder.name + ".fetch.json")
    data = json.loads(record.read_text())
    escape = os.path.relpath(victim, folder)  # "../../victim.txt"
    data["files"][escape] = {"size": 9, "checksum": "sha256:00"}
    data["complete"] = False
    record.write_text(json.dumps(data))
    assert fetch_model(uri, tmp_path / "cache", store=store) == folder
    assert victim.read_text() == "the user's"
    assert escape not in json.loads(record.read_text())["files"] and cached_folder(uri, tmp_path / "cache") == folder


def test_a_killed_fetchs_partial_files_are_removed_by_the_next_and_said(uploaded, tmp_path, logged):
    """Issue 41, item 10: a SIGKILLed fetch leaves `.tmp-*` partial shards (84 MiB after six kills)
    that a later, successful fetch did not remove."""
    uri, store = uploaded
    folder = fetch_model(uri, tmp_path, store=store)
    partial = folder / "transformer" / ".tmp-diffusion_pytorch_model.safetensors-0a1b2c3d"
    partial.write_bytes(b"x" * 3_000_000)
    assert fetch_model(uri, tmp_path, store=store) == folder
    assert not partial.exists()
    assert any(l.endswith(f"removed 1 partial file (3.0 MB) a killed fetch left in {folder}") for l in logged), logged


def test_two_fetches_at_once_download_each_file_once(uploaded, tiny_qwen_pipeline, tmp_path):
    uri, store = uploaded
    counting = Counting(store)
    threads = [threading.Thread(target=fetch_model, args=(uri, tmp_path), kwargs={"store": counting}) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(counting.got) == sorted(_files(tiny_qwen_pipeline))  # the second waited on the lock, found all
    assert _files(cache_folder(uri, tmp_path)) == _files(tiny_qwen_pipeline)


def test_an_s3_pretrained_path_passes_the_train_checks_and_builds_the_folders_policy(
        uploaded, tiny_qwen_pipeline, tmp_path, monkeypatch, logged):
    from test_dit_pipeline import pipeline_config

    from spotlight.cli import check_train_inputs
    from spotlight.config import ConfigError, default_config
    from spotlight.rl.dit_policy import DiTPolicy

    uri, _ = uploaded
    monkeypatch.setenv("SPOTLIGHT_MODEL_CACHE", str(tmp_path / "cache"))
    cfg = pipeline_config(uri)
    assert cfg.policy.pretrained_path == uri  # keys and fingerprints keep the URI, the same on every node
    assert "not in this machine's model cache" in cfg.policy.dit.folder_problem()
    args = argparse.Namespace(config=None, device=None, preemption_trace=None)
    check_train_inputs(cfg, args, tmp_path / "out")  # fetches, then checks the copy
    assert cfg.policy.dit.folder_problem() is None and cfg.policy.dit.pipeline
    logged.clear()  # check_train_inputs' fetch
    assert prefetch(cfg) == cfg.policy.dit.folder
    assert logged == [f"spotlight: model {uri} is at {cfg.policy.dit.folder}"]
    assert prefetch(pipeline_config(tiny_qwen_pipeline)) is None  # a local folder: nothing to fetch
    remote, local = DiTPolicy.from_config(cfg), DiTPolicy.from_config(pipeline_config(tiny_qwen_pipeline))
    assert remote.side == local.side == 8 and remote.sampler.sigmas.tolist() == local.sampler.sigmas.tolist()
    theirs = local.model.state_dict()
    assert all((v == theirs[k]).all() for k, v in remote.model.state_dict().items())

    with pytest.raises(ConfigError, match=r"^<default config>: policy.dit.pretrained_path: s3://Bad_Bucket/m: "):
        default_config({"policy": {"pretrained_path": "s3://Bad_Bucket/m"}})
    with pytest.raises(ConfigError, match=r"policy.llm.pretrained_path: 'ftp://host/m': expected a local folder"):
        default_config({"policy": {"kind": "llm", "llm": {"pretrained_path": "ftp://host/m"}},
                        "reward": {"name": "arithmetic"}})
    empty = pipeline_config(uri + "-nothing-here")
    with pytest.raises(ConfigError, match=r"^policy.dit.pretrained_path: s3://.*-nothing-here: no objects under it"):
        check_train_inputs(empty, args, tmp_path / "out2")


def test_a_hub_repo_id_goes_through_snapshot_download(tmp_path, monkeypatch):
    import huggingface_hub

    calls = []

    def snapshot_download(repo_id, local_dir):
        calls.append(repo_id)
        Path(local_dir).mkdir(parents=True, exist_ok=True)
        (Path(local_dir) / "config.json").write_text("{}")
        return local_dir

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.chdir(tmp_path)
    folder = fetch_model("Qwen/Qwen-Image", tmp_path / "cache")
    assert calls == ["Qwen/Qwen-Image"] and (folder / "config.json").is_file()
    assert model_folder("Qwen/Qwen-Image", tmp_path / "cache") == folder and calls == ["Qwen/Qwen-Image"]
    (tmp_path / "org" / "name").mkdir(parents=True)  # an existing local path is a folder, never a repo id
    assert source_kind("org/name") == "local" and source_kind("a/b/c") == "local"


def test_the_node_entry_point_fetches_or_says_one_line(uploaded, tiny_qwen_pipeline, tmp_path, monkeypatch, capsys):
    uri, _ = uploaded
    monkeypatch.setenv("SPOTLIGHT_MODEL_CACHE", str(tmp_path / "cache"))
    (tmp_path / "run.yaml").write_text(f"policy:\n  dit:\n    pretrained_path: {uri}\n")
    assert main([str(tmp_path / "run.yaml")]) == 0
    out = capsys.readouterr().out
    folder = cache_folder(uri)
    assert "spotlight: fetching " in out and out.endswith(f"spotlight: model {uri} is at {folder}\n")
    assert _files(folder) == _files(tiny_qwen_pipeline)
    assert main([str(tmp_path / "run.yaml")]) == 0  # a recovered node: nothing fetched
    assert "fetching" not in capsys.readouterr().out

    (tmp_path / "bad.yaml").write_text("policy:\n  pretrained_path: s3://Bad_Bucket/m\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "cloud.model_cache", str(tmp_path / "bad.yaml")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"spotlight: error: {tmp_path}/bad.yaml: policy.pretrained_path: s3://Bad_Bucket/m")
