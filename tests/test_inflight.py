"""A controller that dies mid-rollout resumes the iteration from the committed in-flight state it
kept in the checkpoint store (`spotlight.inflight`), and ends with the weights of a run that never
stopped. Real Ray actors for the interrupted run, the real queue, a real S3 server (moto) on loopback.
"""

from __future__ import annotations

import pytest
import torch

from conftest import small_dit_config
from s3_server import s3, s3_server  # noqa: F401 (fixtures)
from spotlight.inflight import InflightStore
from spotlight.trainer import Trainer
from test_cloud_store import final_weights


class ControllerDied(Exception):
    pass


def test_a_controller_restarted_mid_rollout_resumes_from_the_stored_in_flight_state(s3, tmp_path, monkeypatch):
    # 4 requests of 8 steps on 2 workers: two finish while the other two are part-way.
    over = dict(train={"steps": 2, "prompts_per_step": 4, "checkpoint_every": 1}, sampler={"num_steps": 8})
    Trainer(small_dit_config(**over), tmp_path / "straight", progress=False).build().train()
    uri = f"s3://{s3.bucket}/runs/inflight"

    seen = []
    save = InflightStore.save

    def save_then_die(self, step, seeds, results, partial):
        save(self, step, seeds, results, partial)
        seen.append((step, len(results), len(partial)))
        if step == 1 and results and any(s > 0 for s, _ in partial.values()):
            raise ControllerDied  # right after a snapshot that holds both kinds of progress

    monkeypatch.setattr(InflightStore, "save", save_then_die)
    ray_cfg = small_dit_config(**over, runtime={"kind": "ray", "spot_workers": 1, "ondemand_workers": 1},
                               cloud={"checkpoint_uri": uri, "inflight_every_s": 0.02})
    with pytest.raises(ControllerDied):
        Trainer(ray_cfg, tmp_path / "first", progress=False).build().train()
    monkeypatch.setattr(InflightStore, "save", save)  # (undo() would also drop the S3 fixture's env)
    stored = seen[-1]
    assert stored[0] == 1 and stored[1] >= 1 and stored[2] >= 1, seen

    # A new controller on a fresh machine: empty run folder, same store, the local runtime.
    lines: list[str] = []
    cfg = small_dit_config(**over, cloud={"checkpoint_uri": uri, "inflight_every_s": 0.02})
    resumed = Trainer(cfg, tmp_path / "second", progress=False, log=lines.append).build()
    assert resumed.start_step == 1
    resumed.train()
    said = [line for line in lines if "resumes its rollout" in line]
    assert said == [f"iteration 1 resumes its rollout from {uri}: {stored[1]} results, {stored[2]} requests at "
                    "their committed steps"], lines
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "second")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # The checkpoint after iteration 1 is stored: the snapshot of iteration 1 is gone.
    assert [k for k in InflightStore(resumed.sync.store).store.list("inflight/")] == []


def test_a_snapshot_is_used_only_for_requests_with_the_same_seeds(tmp_path):
    from cloud.store import LocalStore

    store = InflightStore(LocalStore(tmp_path))
    store.save(3, {"a": (1, 2), "b": (3, 4)}, {"a": "result-a"}, {"b": (5, "state-b")})
    assert store.load(3, {"a": (1, 2), "b": (3, 4)}) == ({"a": "result-a"}, {"b": (5, "state-b")})
    assert store.load(3, {"a": (1, 2), "b": (9, 9)}) == ({"a": "result-a"}, {})  # b was re-planned
    assert store.load(4, {"a": (1, 2)}) == ({}, {})
    (tmp_path / "inflight" / "it-000003.pt").write_bytes(b"truncated")
    assert store.load(3, {"a": (1, 2)}) == ({}, {})  # unreadable: not used, never wrong
    store.prune(4)
    assert store.store.list("inflight/") == []
