"""Nothing leaves the run folder that the run did not write, and a pull writes nothing else
(issue 27, finding 1): `spotlight.train.run_files`.

The run folder here is a real checkpoint folder and real records; the planted things are what an
attacker with write access to --out could leave: a symlink to a secret file, a symlink to a
folder, a FIFO, a stray file. The pushes go to a real folder store (`cloud.store.LocalStore`).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch

from cloud.store import LocalStore
from spotlight.run_results import ResultsError, read_manifest
from spotlight.checkpoints import checkpoint
from spotlight.train import run_files
from spotlight.train.checkpoint_sync import CheckpointSync, checkpoint_files
from spotlight.train.results_sync import ResultsSync, result_files


@pytest.fixture
def planted(tmp_path):
    """A run folder with checkpoint 1, its records, and the planted things next to them."""
    out = tmp_path / "run"
    model = torch.nn.Linear(2, 2)
    checkpoint.save(out / "checkpoints", 1, model, torch.optim.Adam(model.parameters()))
    for name in run_files.RUN_FILES:
        (out / name).write_text("{}\n")
    (out / "tb").mkdir()
    (out / "tb" / "events.out").write_bytes(b"e")
    secret = tmp_path / "secret"
    secret.write_text("root:x:0:0\n")
    (out / "shadow").symlink_to(secret)
    (out / "tb" / "shadow").symlink_to(secret)
    (out / "tb" / "etc").symlink_to(tmp_path, target_is_directory=True)
    (out / "eval").symlink_to(tmp_path, target_is_directory=True)  # a whole tree by a link
    os.mkfifo(out / "fifo")
    os.mkfifo(out / "tb" / "fifo")
    (out / "notes.txt").write_text("not the run's")
    (out / "metrics.jsonl").unlink()
    (out / "metrics.jsonl").symlink_to(secret)  # a record's own name, as a link
    return out


def test_the_checkpoint_push_sends_only_the_runs_own_regular_files(planted, tmp_path):
    files = checkpoint_files(planted, 1)
    assert files == [f"checkpoints/step-000001/{n}" for n in (*checkpoint.FILES, checkpoint.MANIFEST)] + \
        ["config.yaml", "cost.json", "summary.json"]
    store = LocalStore(tmp_path / "store")
    assert CheckpointSync(store).push(planted, 1, must=True)["files"] == len(files)
    stored = set(store.list(""))
    assert not any("shadow" in k or "fifo" in k or "notes" in k or "metrics" in k for k in stored), stored


def test_the_results_push_follows_no_link_and_reads_no_fifo(planted, tmp_path):
    assert result_files(planted, final=True) == ["config.yaml", "cost.json", "summary.json", "tb/events.out"]
    store = LocalStore(tmp_path / "store")
    ResultsSync(store, planted).push(final=True, must=True)
    assert not any("root:x" in (tmp_path / "store" / k).read_text(errors="replace") for k in store.list("results/"))


def test_a_stored_checkpoint_naming_a_file_the_run_does_not_write_is_skipped(planted, tmp_path, logged):
    """A manifest re-written to carry `shadow` (a planted object): the pull refuses that checkpoint."""
    store = LocalStore(tmp_path / "store")
    sync = CheckpointSync(store)
    sync.push(planted, 1, must=True)
    key = "step-000001/MANIFEST.json"
    manifest = json.loads(store.get(key))
    manifest["files"]["shadow"] = {"size": 4, "checksum": store.put("step-000001/shadow", b"pwnd")}
    store.put(key, json.dumps(manifest).encode())
    logged.clear()  # the push's line
    lines = logged
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert CheckpointSync(store).pull(fresh) is None
    assert "names 'shadow', which no checkpoint of iteration 1 holds" in lines[0], lines
    assert not (fresh / "shadow").exists()


def test_a_pulled_checkpoint_has_the_runs_own_modes(planted, tmp_path):
    store = LocalStore(tmp_path / "store")
    CheckpointSync(store).push(planted, 1, must=True)
    for path in (tmp_path / "store").rglob("*"):
        if path.is_file():
            path.chmod(0o755)  # what the object came with must not matter
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert CheckpointSync(store).pull(fresh) == 1
    modes = {stat.S_IMODE(p.stat().st_mode) for p in fresh.rglob("*") if p.is_file()}
    assert modes == {checkpoint.own_mode()}, modes


def test_results_pull_refuses_a_manifest_naming_a_file_the_run_does_not_write(tmp_path):
    store = LocalStore(tmp_path / "store")
    store.put("results/shadow", b"x")
    store.put("results/MANIFEST.json", json.dumps(
        {"files": {"shadow": {"size": 1, "checksum": "sha256:0"}}, "finished": True, "stop_reason": None}).encode())
    with pytest.raises(ResultsError, match="names 'shadow', which is not a file a run writes"):
        read_manifest(store)


def test_a_file_of_another_user_is_not_the_runs(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("x")
    assert run_files.regular(path)
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    os.chown(path, 65534, 65534)
    assert not run_files.regular(path)
    assert run_files.top_level(tmp_path) == []
