"""The learner as a group of processes (`train.learner_gpus`, issue 40) on the CPU: FSDP2 over gloo,
each rank its own process, checkpoints one file per rank.

- A tiny-DiT full fine-tune with 2 learner processes ends within `TOLERANCE` of the one-process
  run (the gradient is summed in another order; Adam is elementwise), with the same rewards; the
  tiny LLM's too.
- Its `spotlight train` SIGKILLed after a checkpoint leaves no learner process behind, and the
  resumed run ends bit-identical to the undisturbed one.
- A checkpoint written by 2 processes resumes in 1, and one written by 1 resumes in 2, each saying
  so in one line, each ending within `TOLERANCE` of the run that did not switch.
- On the Ray runtime (a loopback multi-node cluster) a spot node killed mid-update loses nothing,
  and the run ends bit-identical to the local one.
- A rank that exits before it connects ends the start in one line; what a group does not do yet
  is refused in one line.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from conftest import small_dit_config, small_llm_config
from ray_cluster import descendants
from spotlight.config import ConfigError, default_config, merge_sections

ROOT = Path(__file__).resolve().parents[3]
STEPS = 2
TOLERANCE = 1e-5
"""Largest |difference| between the two learners' weights over the largest |weight| of the same
tensor, after STEPS iterations of 2 updates (measured on this 2-core machine, 2026-11-29: the tiny
DiT 6.9e-7, 5.6e-8 absolute, the same with the gradient clip off; the tiny LLM 0)."""


RECIPE = ROOT / "experiments" / "tiny_dit_full_group.yaml"
"""The tiny CPU version of experiments/qwen_image_ocr_full.yaml: 2 learner processes, STEPS iterations."""


def _config(n: int):
    """The recipe with `n` learner processes."""
    return default_config(merge_sections(yaml.safe_load(RECIPE.read_text()), {"train": {"learner_gpus": n}}))


def _train(out: Path, n: int) -> dict:
    from spotlight.train.trainer import Trainer

    return Trainer(_config(n), out, progress=False).build().train()


def _final(out: Path) -> dict[str, torch.Tensor]:
    (path,) = (out / "final").glob("*.safetensors")
    return load_file(str(path))


def _relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-12)).item() for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The undisturbed runs: 2 learner processes, and 1."""
    root = tmp_path_factory.mktemp("group")
    return {n: (root / f"n{n}", _train(root / f"n{n}", n)) for n in (2, 1)}


@pytest.mark.slow
def test_two_learner_processes_train_as_one_within_the_tolerance(runs):
    (two, s2), (one, s1) = runs[2], runs[1]
    assert s2["steps"] == s1["steps"] == STEPS and s2["requests_lost"] == 0
    assert sorted(p.name for p in (two / "checkpoints" / "step-000002").iterdir()) == [
        "MANIFEST.json", "shard-00001-model-00001-of-00001.safetensors",
        "shard-00002-model-00001-of-00001.safetensors", "state.json"]
    assert 0 < _relative_difference(_final(one), _final(two)) <= TOLERANCE
    rows = [[json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()] for out in (two, one)]
    assert [r["reward_mean"] for r in rows[0]] == pytest.approx([r["reward_mean"] for r in rows[1]], rel=1e-5)


@pytest.mark.slow
def test_a_tiny_llm_trains_in_a_group_as_in_one_learner(tmp_path, monkeypatch):
    """The LLM's decoder layers sharded the same way: its full fine-tune with 2 learner processes
    ends within `TOLERANCE` of one learner's. Its weights come back through the connection, as
    where shared memory has no room for them (the DiT runs hand them over in /dev/shm)."""
    from spotlight.runtime import learner_group
    from spotlight.train.trainer import Trainer

    monkeypatch.setattr(learner_group, "SHARED_MEMORY", str(tmp_path / "no-shared-memory"))

    finals = []
    for n in (2, 1):
        # 16 samples, 6 a micro-batch: 3 an update round, the second process's last slot empty
        cfg = small_llm_config(train={"steps": STEPS, "learner_gpus": n, "checkpoint_every": STEPS,
                                      "micro_batch": 6})
        summary = Trainer(cfg, tmp_path / f"n{n}", progress=False).build().train()
        assert summary["steps"] == STEPS
        finals.append(_final(tmp_path / f"n{n}"))
    assert _relative_difference(finals[1], finals[0]) <= TOLERANCE


@pytest.mark.slow
def test_a_group_run_sigkilled_after_a_checkpoint_resumes_bit_identical(runs, tmp_path):
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "spotlight.cli", "train", str(RECIPE), "--out", str(out), "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline, ranks = time.monotonic() + 240, []
    while not (out / "checkpoints" / "step-000001").is_dir():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-3000:]
        ranks = descendants(proc.pid) or ranks
        time.sleep(0.05)
    ranks = descendants(proc.pid) or ranks
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(ranks) >= 2, ranks
    folders = {arg.rsplit("/", 1)[0] for pid in ranks for arg in _cmdline(Path(f"/proc/{pid}")).decode().split("\0")
               if arg.endswith("group.sock")}
    gone = time.monotonic() + 60
    while any(Path(f"/proc/{pid}").exists() and b"zombie" not in _state(pid) for pid in ranks):
        assert time.monotonic() < gone, f"learner processes left behind: {ranks}"
        time.sleep(0.1)
    assert len(folders) == 1 and not any(Path(f).exists() for f in folders), folders  # its socket, its store
    again = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    said = again.stdout + again.stderr
    assert "resuming from" in said and "Warning" not in said, said[-3000:]
    final, undisturbed = _final(out), _final(runs[2][0])
    assert all(torch.equal(final[k], undisturbed[k]) for k in undisturbed)


def _state(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/status").read_bytes()
    except OSError:
        return b"zombie"


@pytest.mark.slow
@pytest.mark.parametrize("written, resumed", [(2, 1), (1, 2)])
def test_a_checkpoint_resumes_with_another_number_of_learner_processes(runs, tmp_path, logged, written, resumed):
    source, _ = runs[written]
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(source / "checkpoints" / "step-000001", out / "checkpoints" / "step-000001")
    shutil.copy(source / "config.yaml", out / "config.yaml")
    _train(out, resumed)
    said = [line for line in logged if "learner process" in line]
    if resumed == 1:
        assert said == ["checkpoint step-000001 was written by 2 learner processes; its shards are gathered "
                        "into this one"], said
    else:
        assert said == ["checkpoint step-000001 was written by one learner process; it is cut into 2 shards"], said
    assert _relative_difference(_final(runs[resumed][0]), _final(out)) <= TOLERANCE


@pytest.mark.slow
def test_a_group_on_the_cluster_loses_nothing_when_a_spot_node_dies_mid_update(runs, tmp_path, logged):
    """The Ray runtime on a loopback multi-node cluster (the head and two spot nodes), the learner a
    group of 2 processes on the head: spot-b is SIGKILLed while the first update computes. Nothing is
    lost, and the run ends bit-identical to the local run of 2 learner processes."""
    from ray_cluster import LoopbackCluster
    from spotlight.runtime.ray_runtime import RayRuntime
    from spotlight.train.trainer import Trainer

    with LoopbackCluster() as cluster:
        cluster.add_node({"spot": 1}, name="spot-a")
        spot_b = cluster.add_node({"spot": 1}, name="spot-b")
        cfg = default_config(merge_sections(yaml.safe_load(RECIPE.read_text()), {"runtime": {
            "kind": "ray", "address": cluster.address, "spot_workers": 2, "ondemand_workers": 1}}))
        runtime = RayRuntime(cfg)
        update, rollout, seen = runtime.update, runtime.rollout, {}

        def kill() -> None:
            cluster.kill(spot_b)
            seen["killed_at"] = time.monotonic()

        def disturbed_update(*args, **kwargs):
            if seen:
                return update(*args, **kwargs)
            # the first update: its ranks compute while spot-b dies
            seen["ranks"] = _rank_processes()
            seen["kill"] = threading.Thread(target=kill, daemon=True)
            seen["kill"].start()
            stats = update(*args, **kwargs)
            seen["updated_at"] = time.monotonic()
            return stats

        def followed_rollout(requests, *args, **kwargs):
            if "kill" in seen:  # the next rollout starts once the run has seen spot-b's death
                seen["kill"].join()
                deadline = time.monotonic() + 90
                while not any(spot_b.ip in name and not n.alive for name, n in runtime.engine.nodes.items()):
                    assert time.monotonic() < deadline, logged
                    runtime.engine.poll_sources()
                    runtime.engine.settle()
                    time.sleep(0.05)
            return rollout(requests, *args, **kwargs)

        runtime.update, runtime.rollout = disturbed_update, followed_rollout
        summary = Trainer(cfg, tmp_path / "cluster", progress=False).build(runtime).train()
    assert len(seen["ranks"]) == 2 and seen["killed_at"] < seen["updated_at"], seen
    gone = time.monotonic() + 60
    while any(Path(f"/proc/{pid}").exists() and b"zombie" not in _state(pid) for pid in seen["ranks"]):
        assert time.monotonic() < gone, f"learner processes left behind: {seen['ranks']}"
        time.sleep(0.1)
    assert summary["steps"] == STEPS and summary["requests_lost"] == 0 and summary["requests_duplicated"] == 0
    assert summary["workers_lost"] >= 1, (summary, logged)
    final, local = _final(tmp_path / "cluster"), _final(runs[2][0])
    assert final.keys() == local.keys() and all(torch.equal(final[k], local[k]) for k in local)


def _rank_processes() -> list[int]:
    """The learner group's rank processes on this machine (only this module starts groups)."""
    return [int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and b"spotlight.runtime.learner_group" in _cmdline(p)]


@pytest.mark.parametrize("over, line", [
    ({"policy": {"lora": {"rank": 4, "alpha": 8}}}, "policy.lora.rank: expected 0 with train.learner_gpus: 2"),
    ({"train": {"ema_decay": 0.9}}, "train.ema_decay: expected 0 with train.learner_gpus: 2"),
    ({"train": {"update_on": "fleet"}}, "train.update_on: expected learner with train.learner_gpus: 2"),
])
def test_what_a_group_does_not_do_yet_is_refused_in_one_line(over, line):
    train = {"learner_gpus": 2, **over.pop("train", {})}
    pattern = "^<default config>: " + line.replace(".", r"\.") + r" \(a sharded learner"
    with pytest.raises(ConfigError, match=pattern) as err:
        small_dit_config(train=train, **over)
    assert "\n" not in str(err.value)


def test_a_learner_process_that_exits_before_it_connects_ends_the_start_in_one_line(monkeypatch):
    """A rank that cannot start (a broken import in its environment) ends `build` at once with one
    line naming it, and the rank already started is not left behind (the start waited forever)."""
    from spotlight.runtime import learner_group

    marker = "spotlight-test-rank-that-waits"
    commands = {0: [sys.executable, "-c", f"import time; time.sleep(600)  # {marker}"],
                1: [sys.executable, "-c", "import sys; sys.exit(3)"]}
    monkeypatch.setattr(learner_group, "rank_command", lambda address, rank, world, rendezvous: commands[rank])
    group = learner_group.LearnerGroup(small_dit_config(train={"learner_gpus": 2}))
    start = time.monotonic()
    with pytest.raises(learner_group.LearnerGroupError,
                       match=r"^learner process 1 of 2 exited with code 3 before it connected"):
        group.build()
    group.close()
    assert time.monotonic() - start < 30
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and marker.encode() in _cmdline(p)]


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:  # it ended meanwhile
        return b""
