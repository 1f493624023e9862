"""A run's results reach its store, and `spotlight pull` / `spotlight status` read them back from the
store alone (issue 26, "Results home"): spotlight.train.results_sync, spotlight.run_results.

- A finished tiny-DiT run with a folder store: results/ holds metrics, summary, config, cost,
  TensorBoard events, the evaluation grid and final/, with a manifest that says finished; the
  trainer wrote status.json before the first iteration, after each, and at the end.
- `spotlight pull` returns exactly those files, bit-identical to the run folder; a failed pull
  leaves no folder; a non-empty --out is refused.
- `spotlight status` (text and --json) on the finished run with a launched fleet's records, and
  on a run cut short (checkpoints, mid-run results and a status, no final/).
- Against a real S3-compatible server (moto), with S3's own CRC-64/NVME checksums: the same
  round trip, and an object replaced behind the manifest's back fails the pull; a pull during a
  push (the manifest replaced meanwhile) starts over and gets the new results.
- Pushes are incremental (unchanged files are not sent again), a store failure mid-run is logged
  and caught up by the next push, and a resumed run keeps the results earlier heads stored.
- A bad URI, a store with no run, and damaged objects (bad JSON, a wrong field, a replaced or
  missing file, a planted manifest naming ../) each end in one `spotlight: error:` line, exit 2.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from cloud.open_store import open_store
from cloud.store import LocalStore, StoreError
from conftest import small_dit_config
from s3_server import s3, s3_server  # noqa: F401 (fixtures)
from spotlight.cli import main
from spotlight.run_results import pull
from spotlight.train.results_sync import MANIFEST, STATUS, ResultsSync, result_files
from spotlight.train.trainer import Trainer

STEPS = 3


@pytest.fixture(autouse=True)
def _store_roots(tmp_path_factory, monkeypatch):
    """Folder stores anywhere under this session's temporary folders."""
    monkeypatch.setenv("SPOTLIGHT_STORE_ROOTS", str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A 3-iteration tiny-DiT run (checkpoints after 2 and 3, an evaluation at 0 and 2) with a folder
    store; returns (run folder, store folder, every status the trainer wrote)."""
    base = tmp_path_factory.mktemp("finished")
    store, out = base / "store", base / "run"
    statuses = []
    write = ResultsSync.write_status
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPOTLIGHT_STORE_ROOTS", str(tmp_path_factory.getbasetemp()))
        cfg = small_dit_config(train={"steps": STEPS, "checkpoint_every": 2, "eval_prompts": 1, "eval_seeds": 2,
                                      "eval_every": 2}, cloud={"checkpoint_uri": f"file://{store}"})
        mp.setattr(ResultsSync, "write_status", lambda self, s: statuses.append(s) or write(self, s))
        Trainer(cfg, out, progress=False).build().train()
    return out, store, statuses


def _cli(capsys, *argv):
    code = main(list(argv))
    got = capsys.readouterr()
    return code, got.out, got.err


def _one_error(capsys, *argv, says: str) -> None:
    code, out, err = _cli(capsys, *argv)
    assert code == 2 and out == "", (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("spotlight: error: ") and says in lines[0], err


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_finished_run_stores_its_results_with_a_manifest_written_last(finished):
    out, store, statuses = finished
    manifest = json.loads((store / MANIFEST).read_text())
    assert manifest["finished"] is True and manifest["stop_reason"] == "steps"
    names = set(manifest["files"])
    assert {"metrics.jsonl", "summary.json", "config.yaml", "cost.json", "eval/step-000002.png"} <= names
    assert any(n.startswith("tb/events.out.tfevents") for n in names)
    assert any(n.startswith("final/") and n.endswith(".safetensors") for n in names)
    assert names == set(result_files(out, final=True)) and not any(n.startswith("checkpoints/") for n in names)
    for rel, entry in manifest["files"].items():  # the store's own checksum (a folder's: sha256)
        assert entry["size"] == (out / rel).stat().st_size and entry["checksum"].startswith("sha256:")
    # status.json before the first iteration, after each, and once finished (with the stored checkpoint)
    assert [(s["iteration"], s["checkpoint"], s["finished"]) for s in statuses] == [
        (0, None, False), (1, None, False), (2, 2, False), (3, 3, False), (3, 3, True)]
    stored = json.loads((store / STATUS).read_text())
    assert stored["stop_reason"] == "steps" and stored["nodes"] == {"ondemand": 1, "spot": 0}
    assert stored["reward_mean"] == json.loads((out / "summary.json").read_text())["reward_last"]
    assert stored["cost_usd"] > 0 and abs(stored["updated_at"] - time.time()) < 600
    # One figure for the run's dollars: `spotlight status` (status.json), summary.json and cost.json
    # (the meter stops when final/ is written; status once said $0.06 where summary.json said $0.05).
    summary, spent = (json.loads((out / name).read_text()) for name in ("summary.json", "cost.json"))
    assert stored["cost_usd"] == summary["cost_usd"] == spent["cost_usd"]


def test_pull_returns_the_results_bit_identical_and_refuses_a_folder_in_use(finished, tmp_path, capsys):
    out, store, _ = finished
    code, printed, err = _cli(capsys, "pull", f"file://{store}", "--out", str(tmp_path / "got"))
    assert code == 0, err
    assert f"pulled {len(result_files(out, final=True))} files" in printed and "finished (steps)" in printed
    assert "pull:" in err  # the bar on stderr
    pulled = _files(tmp_path / "got")
    assert pulled == {rel: (out / rel).read_bytes() for rel in result_files(out, final=True)}
    assert [p.name for p in tmp_path.iterdir()] == ["got"]  # no staging folder left
    _one_error(capsys, "pull", str(store), "--out", str(tmp_path / "got"), says="not an empty folder")
    (tmp_path / "empty").mkdir()  # an empty --out is fine; --no-progress draws nothing
    code, _, err = _cli(capsys, "pull", str(store), "--out", str(tmp_path / "empty"), "--no-progress")
    assert code == 0 and err == "" and _files(tmp_path / "empty") == pulled


def _fleet_records(store: Path, now: float) -> None:
    (store / "fleet").mkdir(exist_ok=True)
    head = {"run": "smoke", "generation": 2, "address": "10.0.1.5", "port": 6380, "published_at": now - 300}
    done = {"run": "smoke", "reason": "steps", "exit_code": 0, "generation": 2, "at": now - 30}
    (store / "fleet/head.json").write_text(json.dumps({"record": head, "hmac": "00"}))
    (store / "fleet/done.json").write_text(json.dumps({"record": done, "hmac": "00"}))


def test_status_of_a_finished_run_in_text_and_json(finished, tmp_path, capsys):
    store = tmp_path / "store"
    shutil.copytree(finished[1], store)
    _fleet_records(store, time.time())
    code, text, _ = _cli(capsys, "status", f"file://{store}")
    assert code == 0
    for line in ("state:       finished (steps)", f"iteration:   {STEPS} of {STEPS} done", "reward:      ",
                 "live nodes:  1 on-demand, 0 spot (workers: 1 on-demand, 0 spot)",
                 f"checkpoint:  iteration {STEPS} (step-00000{STEPS}/)", "final/ included", "updated:     ",
                 "head:        generation 2 at 10.0.1.5:6380, published 5 min ago",
                 "done:        steps (exit code 0, generation 2, 30 s ago)"):
        assert line in text, text
    code, printed, _ = _cli(capsys, "status", str(store), "--json")
    view = json.loads(printed)
    assert code == 0 and view["finished"] is True and view["stop_reason"] == "steps"
    assert view["status"]["iteration"] == STEPS and view["checkpoints"] == [3, 2] and view["last_checkpoint"] == 3
    assert view["results"]["final"] is True and view["head"]["address"] == "10.0.1.5"
    assert view["done"]["reason"] == "steps" and 0 <= view["updated_ago_s"] < 600


@pytest.fixture
def cut_short(finished, tmp_path):
    """A store of a run cut short after iteration 2: its checkpoints, results pushed mid-run (no
    final/, no summary) and a status that is not finished. Returns (store folder, run folder)."""
    out, store = tmp_path / "run", tmp_path / "store"
    shutil.copytree(finished[0], out, ignore=shutil.ignore_patterns("final", "summary.json"))
    shutil.copytree(finished[1], store, ignore=shutil.ignore_patterns("results"))
    sync = ResultsSync(LocalStore(store), out)
    sync.push()
    status = json.loads((finished[1] / STATUS).read_text())
    sync.write_status({**status, "iteration": 2, "finished": False, "stop_reason": None, "checkpoint": 2,
                       "nodes": {"ondemand": 1, "spot": 3}, "workers": {"ondemand": 1, "spot": 6}})
    return store, out


def test_status_and_pull_of_a_run_cut_short(cut_short, tmp_path, capsys):
    store, out = cut_short
    code, text, _ = _cli(capsys, "status", str(store))
    assert code == 0 and "state:       not finished" in text and "iteration:   2 of 3 done" in text
    assert "live nodes:  1 on-demand, 3 spot (workers: 1 on-demand, 6 spot)" in text and "no final/ yet" in text
    code, printed, _ = _cli(capsys, "status", str(store), "--json")
    assert code == 0 and json.loads(printed)["finished"] is False
    code, printed, _ = _cli(capsys, "pull", str(store), "--out", str(tmp_path / "got"), "--no-progress")
    assert code == 0 and "not finished" in printed
    assert _files(tmp_path / "got") == {rel: (out / rel).read_bytes() for rel in result_files(out, final=False)}
    (store / MANIFEST).unlink()  # checkpoints and a status, no results yet
    code, text, _ = _cli(capsys, "status", str(store))
    assert code == 0 and "results:     none stored yet" in text
    _one_error(capsys, "pull", str(store), "--out", str(tmp_path / "again"), says="no results/MANIFEST.json yet")


def test_a_pull_during_a_push_waits_for_its_manifest_and_a_finished_runs_damage_does_not(cut_short, tmp_path,
                                                                                        capsys, monkeypatch):
    """Issue 41, item 5: a push writes its files, then its manifest; a pull between the two (minutes
    for a multi-GB final/) failed as damaged. A run not finished may be pushing: the pull waits,
    bounded, for the new manifest and starts over on it; without one it is damage, as for a
    finished run, which fails at once."""
    import threading

    from spotlight import run_results

    store, out = cut_short
    monkeypatch.setattr(run_results, "PUSH_POLL_S", 0.05)
    monkeypatch.setattr(run_results, "PUSH_WAIT_S", 30.0)
    (out / "metrics.jsonl").write_text((out / "metrics.jsonl").read_text() + '{"step": 2}\n')
    sync = ResultsSync(LocalStore(store), out, keep_stored=True)
    sync.store.put_file("results/metrics.jsonl", out / "metrics.jsonl")  # the push's files, its manifest still to come
    later = threading.Timer(1.0, sync.push)
    later.start()
    code, printed, err = _cli(capsys, "pull", str(store), "--out", str(tmp_path / "got"), "--no-progress")
    later.join()
    assert code == 0, err
    assert "waiting up to 30 s for the push in progress to store its manifest" in err
    assert (tmp_path / "got" / "metrics.jsonl").read_bytes() == (out / "metrics.jsonl").read_bytes()
    # No push comes: damage, after the wait.
    monkeypatch.setattr(run_results, "PUSH_WAIT_S", 0.3)
    (store / "results" / "config.yaml").write_text("replaced")
    code, _, err = _cli(capsys, "pull", str(store), "--out", str(tmp_path / "again"), "--no-progress")
    waited, line = err.strip().splitlines()
    assert code == 2 and "waiting up to 0.3 s" in waited and not (tmp_path / "again").exists()
    assert line.startswith("spotlight: error: ") and "config.yaml: named by results/MANIFEST.json but holds" in line


class _Counting(LocalStore):
    """A folder store that counts uploads and fails the next `fail` of them."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.sent: list[str] = []
        self.fail = 0

    def put_file(self, key, path):
        if self.fail:
            self.fail -= 1
            raise StoreError(f"{self.uri}/{key}: SlowDown (HTTP 503)")
        self.sent.append(key)
        return super().put_file(key, path)


def test_pushes_send_only_what_changed_and_catch_up_after_a_failure(tmp_path, logged):
    out = tmp_path / "run"
    (out / "tb").mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    (out / "tb/events").write_bytes(b"e0")
    (out / "final").mkdir()
    (out / "final/model.safetensors").write_bytes(b"w")
    store, lines = _Counting(tmp_path / "store"), logged
    sync = ResultsSync(store, out)
    assert sync.push()["sent"] == 2 and sorted(store.sent) == ["results/metrics.jsonl", "results/tb/events"]
    assert sync.push()["sent"] == 0  # nothing changed: nothing sent, the manifest rewritten
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 1}\n')
    store.fail = 1
    assert sync.push() is None and len(lines) == 1 and "results not stored" in lines[0] and "SlowDown" in lines[0]
    store.fail = 1
    with pytest.raises(StoreError):  # the end's push fails the run
        sync.push(final=True, must=True)
    store.sent.clear()
    assert sync.push(final=True, stop_reason="budget", must=True)["sent"] == 2
    assert sorted(store.sent) == ["results/final/model.safetensors", "results/metrics.jsonl"]
    manifest = json.loads((store.root / MANIFEST).read_text())
    assert manifest["finished"] is True and manifest["stop_reason"] == "budget"
    # A head resumed on a fresh disk keeps what the earlier head stored (its TensorBoard events).
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n')
    ResultsSync(store, fresh, keep_stored=True).push()
    kept = json.loads((store.root / MANIFEST).read_text())["files"]
    assert set(kept) == {"metrics.jsonl", "tb/events", "final/model.safetensors"}
    assert kept["metrics.jsonl"]["size"] == (fresh / "metrics.jsonl").stat().st_size


def test_a_head_killed_between_a_file_and_its_manifest_leaves_results_the_next_head_can_name(tmp_path):
    """The earlier head stored its events again and died before the manifest: the object is newer
    than the manifest's entry. The next head names it as the store holds it, and the pull verifies
    (a launched-fleet test whose head was killed mid-push failed its pull this way)."""
    first = tmp_path / "first"
    (first / "tb").mkdir(parents=True)
    (first / "tb/events").write_bytes(b"e0")
    store = LocalStore(tmp_path / "store")
    ResultsSync(store, first).push()
    store.put("results/tb/events", b"e0e1")  # the first head's next push, cut short before its manifest
    store.put("results/tb/gone", b"x")
    manifest = json.loads(store.get(MANIFEST))
    manifest["files"]["tb/gone"] = {"size": 1, "checksum": "sha256:0"}
    store.put(MANIFEST, json.dumps(manifest).encode())
    store.delete("results/tb/gone")  # named, then lost: dropped rather than named wrongly
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "metrics.jsonl").write_text('{"step": 0}\n')
    ResultsSync(store, fresh, keep_stored=True).push(final=True, must=True)
    pull(store, tmp_path / "pulled", progress=False)
    assert (tmp_path / "pulled/tb/events").read_bytes() == b"e0e1"
    assert sorted(p.name for p in (tmp_path / "pulled").rglob("*") if p.is_file()) == ["events", "metrics.jsonl"]


def test_a_bad_uri_and_a_store_with_no_run_are_one_line(tmp_path, capsys):
    for command in (["status"], ["pull", "--out", str(tmp_path / "got")]):
        _one_error(capsys, command[0], "s3:///runs/x", *command[1:], says="s3:///runs/x: no bucket")
        _one_error(capsys, command[0], "gcs://bucket/x", *command[1:], says="unknown scheme 'gcs'")
        _one_error(capsys, command[0], str(tmp_path / "nothing"), *command[1:], says="no run here")
    # a local run folder (issue 42: "no run here"): named as one, with where its records are
    run = tmp_path / "runs" / "x"
    run.mkdir(parents=True)
    for name in ("config.yaml", "metrics.jsonl"):
        (run / name).write_text("")
    for command in (["status"], ["pull", "--out", str(tmp_path / "got")]):
        _one_error(capsys, command[0], str(run), *command[1:],
                   says=f"'{run}': a run folder, not a run's store (status and pull read the store")
    assert not (tmp_path / "got").exists()


@pytest.mark.parametrize("damage, says", [
    (lambda s: (s / STATUS).write_text("{not json"), "results/status.json: not JSON"),
    (lambda s: (s / STATUS).write_text('{"run": "x", "iteration": "two"}'), "status.json: iteration: expected integer"),
    (lambda s: (s / MANIFEST).write_text("[]"), "results/MANIFEST.json: expected a JSON object"),
    (lambda s: (s / "fleet").mkdir() or (s / "fleet/head.json").write_text('{"record": {"run": "x"}}'),
     "fleet/head.json: record: generation: expected integer"),
])
def test_damaged_records_stop_status_with_one_line(finished, tmp_path, capsys, damage, says):
    store = tmp_path / "store"
    shutil.copytree(finished[1], store)
    damage(store)
    _one_error(capsys, "status", str(store), says=says)


def _replaced(path: Path) -> None:
    """Other bytes of the same size: only the checksum can tell."""
    data = path.read_bytes()
    path.write_bytes(bytes(b ^ 1 for b in data[:1]) + data[1:])


def _planted(store: Path, rel: str) -> None:
    manifest = json.loads((store / MANIFEST).read_text())
    manifest["files"][rel] = {"size": 1, "checksum": manifest["files"]["config.yaml"]["checksum"]}
    (store / MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("damage, says", [
    (lambda s: _replaced(s / "results/config.yaml"), "config.yaml: named by results/MANIFEST.json "
                                                     "but does not match its checksum"),
    (lambda s: (s / "results/config.yaml").write_text("replaced"), "config.yaml: named by results/MANIFEST.json "
                                                                   "but holds 8 bytes, not "),
    (lambda s: (s / "results/summary.json").unlink(), "summary.json: named by results/MANIFEST.json but is missing"),
    (lambda s: _planted(s, "../../escaped.txt"), "names '../../escaped.txt', not a relative path"),
    (lambda s: _planted(s, "MANIFEST.json"), "a name of the results' own records"),
])
def test_a_damaged_result_fails_the_pull_with_one_line_and_leaves_nothing(finished, tmp_path, capsys, damage, says):
    store = tmp_path / "store"
    shutil.copytree(finished[1], store)
    damage(store)
    _one_error(capsys, "pull", str(store), "--out", str(tmp_path / "pulled" / "got"), "--no-progress", says=says)
    assert not (tmp_path / "pulled" / "got").exists() and list((tmp_path / "pulled").glob("*")) == []
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path.parent / "escaped.txt").exists()


def test_status_and_pull_print_nothing_raw_from_the_store_and_say_which_records_are_unverified(
        finished, tmp_path, capsys):
    """Issue 41, item 3: a newline in status.json's run name forged a `spotlight:` line, and the
    escape bytes of a reason or an address reached the terminal; the fleet records read as fact."""
    store = tmp_path / "store"
    shutil.copytree(finished[1], store)
    status = json.loads((store / STATUS).read_text())
    status["run"] = "tiny\nspotlight: error: forged"
    status["stop_reason"] = "steps\x1b[2J\x07"
    (store / STATUS).write_text(json.dumps(status))
    manifest = json.loads((store / MANIFEST).read_text())
    manifest["stop_reason"] = "steps\x1b]0;title\x07"
    (store / MANIFEST).write_text(json.dumps(manifest))
    _fleet_records(store, time.time())
    head = json.loads((store / "fleet/head.json").read_text())
    head["record"]["address"] = "10.0.1.5\x1b[31m"
    (store / "fleet/head.json").write_text(json.dumps(head))
    for argv in (["status", str(store)], ["pull", str(store), "--out", str(tmp_path / "got"), "--no-progress"]):
        code, text, err = _cli(capsys, *argv)
        assert code == 0, err
        assert "\x1b" not in text + err and "\x07" not in text + err, text
        assert not any(line.startswith("spotlight:") for line in text.splitlines()), text
    code, text, _ = _cli(capsys, "status", str(store))
    assert "run tiny\\nspotlight: error: forged in " in text and "10.0.1.5\\x1b[31m:6380" in text
    assert "unverified" in next(l for l in text.splitlines() if l.startswith("  head:"))
    assert "unverified" in next(l for l in text.splitlines() if l.startswith("  done:"))


def test_a_planted_manifest_name_is_damage_a_resumed_push_stores_anew(finished, tmp_path, logged):
    """Issue 41, item 2: "tb/../../../../etc/x" added to results/MANIFEST.json ended every resume in
    a ValueError traceback after its first checkpoint, and the results were never stored again."""
    out, stored, _ = finished
    store_dir = tmp_path / "store"
    shutil.copytree(stored, store_dir)
    manifest = json.loads((store_dir / MANIFEST).read_text())
    manifest["files"]["tb/../../../../etc/x"] = {"size": 1, "checksum": "sha256:00"}
    (store_dir / MANIFEST).write_text(json.dumps(manifest))
    sync = ResultsSync(open_store(str(store_dir)), out, keep_stored=True)
    assert sync.push(must=True)["files"] == len(result_files(out, final=False))
    (line,) = [l for l in logged if "MANIFEST.json unreadable" in l]
    assert "names 'tb/../../../../etc/x', not a relative path inside the run folder" in line, line
    assert "the results are stored anew" in line and "\n" not in line
    assert "tb/../../../../etc/x" not in json.loads((store_dir / MANIFEST).read_text())["files"]


def test_pull_refuses_a_place_it_cannot_write_or_a_link_before_the_first_byte(finished, tmp_path, capsys,
                                                                             monkeypatch):
    """Issue 41, item 9: a read-only place, or a symlinked or dangling --out, failed with a traceback
    or only after the whole download."""
    from spotlight.config import ConfigError
    from spotlight.run_results import pull

    store = open_store(str(finished[1]))
    got = []
    monkeypatch.setattr(store, "get_file", lambda key, path, checksum=None: got.append(key))
    with pytest.raises(ConfigError, match=r"--out: /proc/self/got: cannot write there \(.*\); nothing was downloaded"):
        pull(store, Path("/proc/self/got"), progress=False)  # a read-only file system, for root too
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for name in ("link", "dangling"):
        with pytest.raises(ConfigError, match=f"--out: .*{name} is a symbolic link"):
            pull(store, tmp_path / name, progress=False)
    assert got == [] and sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "elsewhere", "link"]


def test_a_killed_pulls_leftovers_are_removed_by_the_next_pull_and_a_running_ones_kept(finished, tmp_path, logged):
    """Issue 41, item 10: a killed pull left `.DIR.pull-*` (86 MB, 21,712 files) behind for good."""
    import os
    import subprocess
    import sys

    from spotlight.run_results import pull

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()  # a process that has ended
    dead, running = tmp_path / f".got.pull-{gone}-0a1b2c3d", tmp_path / f".got.pull-{os.getpid()}-0a1b2c3e"
    for folder in (dead, running):
        (folder / "tb").mkdir(parents=True)
        (folder / "tb" / "events").write_bytes(b"x" * 2_000_000)
    pull(open_store(str(finished[1])), tmp_path / "got", progress=False)
    assert not dead.exists() and running.exists()
    (line,) = [l for l in logged if l.startswith("removed .got.pull-")]
    assert line == f"removed {dead.name}, what a pull that was killed left (1 file, 2.0 MB)"


def test_pull_checks_an_objects_size_before_it_writes_a_byte_of_it(finished, tmp_path, monkeypatch):
    """Issue 41, item 4: a manifest entry declaring 10 bytes for a 1 GiB object had the whole GiB
    written before the refusal (300 MiB on S3, the bar at 0/10 B)."""
    from spotlight.run_results import ResultsError, _download, read_manifest

    store_dir = tmp_path / "store"
    shutil.copytree(finished[1], store_dir)
    (store_dir / "results" / "metrics.jsonl").write_bytes(b"x" * 5_000_000)  # far more than it declares
    store = open_store(str(store_dir))
    got = []
    fetch = store.get_file
    monkeypatch.setattr(store, "get_file", lambda key, path, checksum=None: (got.append(key), fetch(key, path, checksum)))
    with pytest.raises(ResultsError, match=r"metrics\.jsonl: named by results/MANIFEST\.json but holds 5000000 bytes"):
        _download(store, read_manifest(store), tmp_path / "staging", progress=False)
    assert "results/metrics.jsonl" not in got and not (tmp_path / "staging").exists()


def test_pull_and_status_through_s3_with_its_own_checksums(finished, s3, tmp_path, capsys):
    out = finished[0]
    uri = f"s3://{s3.bucket}/runs/tiny"
    sync = ResultsSync(open_store(uri), out)
    sync.push(final=True, stop_reason="budget", must=True)
    assert json.loads(s3.client.get_object(Bucket=s3.bucket, Key="runs/tiny/" + MANIFEST)["Body"].read())[
        "files"]["summary.json"]["checksum"].startswith("crc64nvme:")
    sync.write_status(json.loads((finished[1] / STATUS).read_text()))
    code, printed, err = _cli(capsys, "pull", uri, "--out", str(tmp_path / "got"), "--no-progress")
    assert code == 0, err
    assert _files(tmp_path / "got") == {rel: (out / rel).read_bytes() for rel in result_files(out, final=True)}
    code, text, _ = _cli(capsys, "status", uri)
    assert code == 0 and "state:       finished (budget)" in text and "checkpoint:  none stored yet" in text
    s3.client.put_object(Bucket=s3.bucket, Key="runs/tiny/results/summary.json", Body=b"{}")
    _one_error(capsys, "pull", uri, "--out", str(tmp_path / "again"), "--no-progress",
               says="summary.json: named by results/MANIFEST.json but does not match its checksum")
    assert not (tmp_path / "again").exists()


class _PushedMeanwhile(LocalStore):
    """A folder store whose head pushes new results while the first file is being pulled."""

    def __init__(self, root, head: ResultsSync) -> None:
        super().__init__(root)
        self.head = head

    def get_file(self, key, path, checksum=None):
        if self.head is not None:
            head, self.head = self.head, None
            (head.out / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
            (head.out / "config.yaml").write_text("seed: 2\n")
            head.push()
        return super().get_file(key, path, checksum)


def test_a_pull_during_a_push_starts_over_and_gets_the_new_results(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text("seed: 1\n")
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    head = ResultsSync(LocalStore(tmp_path / "store"), out)
    head.push()
    got = pull(_PushedMeanwhile(tmp_path / "store", head), tmp_path / "got", progress=False)
    assert got["files"] == 2 and _files(tmp_path / "got") == _files(out)
