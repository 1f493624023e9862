"""A controller that dies mid-rollout resumes the iteration from the committed in-flight state it
kept in the checkpoint store (`spotlight.train.inflight`), and ends with the weights of a run that never
stopped. Real Ray actors for the interrupted run, the real queue, a real S3 server (moto) on loopback.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from conftest import small_dit_config
from s3_server import s3, s3_server  # noqa: F401 (fixtures)
from planted_pickle import Payload, pickled, torch_saved
from cloud.codec import encode
from cloud.store import LocalStore
from schedulers.sample_state import SampleState
from spotlight.train.inflight import ALLOWED, InflightStore
from spotlight.rl.policy import Rollout
from spotlight.rl.prompts import Prompt
from spotlight.train.trainer import Trainer
from test_cloud_store import final_weights


class ControllerDied(Exception):
    pass


def test_a_controller_restarted_mid_rollout_resumes_from_the_stored_in_flight_state(s3, tmp_path, monkeypatch, logged):
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
    lines = logged
    cfg = small_dit_config(**over, cloud={"checkpoint_uri": uri, "inflight_every_s": 0.02})
    resumed = Trainer(cfg, tmp_path / "second", progress=False).build()
    assert resumed.start_step == 1
    resumed.train()
    said = [line for line in lines if "resumes its rollout" in line]
    assert said == [f"iteration 1 resumes its rollout from {uri}: {stored[1]} results, {stored[2]} requests at "
                    "their committed steps"], lines
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "second")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # The checkpoint after iteration 1 is stored: the snapshot of iteration 1 is gone.
    assert [k for k in InflightStore(resumed.folder.sync.store).store.list("inflight/")] == []


def _result(seeds):
    return Rollout([Prompt(1, "red")] * len(seeds), list(seeds), images=torch.rand(len(seeds), 3, 4, 4),
                   data={"log_probs": torch.randn(len(seeds), 2)})


def _state(seeds, step):
    return SampleState((1,) * len(seeds), tuple(seeds), step, torch.randn(len(seeds), step + 1, 4, 3),
                       torch.randn(len(seeds), step))


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if hasattr(a, "__dataclass_fields__"):
        return type(a) is type(b) and all(_same(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    return a == b


def test_a_snapshot_is_used_only_for_requests_with_the_same_seeds(tmp_path):
    store = InflightStore(LocalStore(tmp_path))
    done, part = _result((1, 2)), (1, _state((3, 4), 1))
    store.save(3, {"a": (1, 2), "b": (3, 4)}, {"a": done}, {"b": part})
    assert _same(store.load(3, {"a": (1, 2), "b": (3, 4)}), ({"a": done}, {"b": part}))
    assert _same(store.load(3, {"a": (1, 2), "b": (9, 9)}), ({"a": done}, {}))  # b was re-planned
    assert store.load(4, {"a": (1, 2)}) == ({}, {})
    store.prune(4)
    assert store.store.list("inflight/") == []


def test_a_damaged_malformed_or_planted_snapshot_is_skipped_never_fatal_never_run(tmp_path, logged):
    lines = logged
    store = InflightStore(LocalStore(tmp_path / "store"))
    seeds = {"a": (1, 2), "b": (3, 4)}
    marker = tmp_path / "PWNED"
    store.save(3, seeds, {"a": _result((1, 2))}, {"b": (1, _state((3, 4), 1))})
    data = (tmp_path / "store" / "inflight" / "it-000003.data").read_bytes()
    manifest = json.loads((tmp_path / "store" / "inflight" / "it-000003.json").read_text())

    def plant(body, fix_manifest=True):
        (tmp_path / "store" / "inflight" / "it-000003.data").write_bytes(body)
        m = dict(manifest, size=len(body), sha256=hashlib.sha256(body).hexdigest()) if fix_manifest else manifest
        (tmp_path / "store" / "inflight" / "it-000003.json").write_text(json.dumps(m))

    def forged(blob):  # a well-formed snapshot of someone else's making
        return encode(blob, ALLOWED)

    cases = {
        "truncated": (data[: len(data) // 2], False),
        "altered": (data[:-1] + bytes([data[-1] ^ 1]), False),
        "pickle": (pickled({"step": 3, "seeds": Payload(marker)}), True),
        "torch.save pickle": (torch_saved({"step": 3, "seeds": seeds, "results": {"a": Payload(marker)},
                                           "partial": {}}), True),
        "not a snapshot": (forged([1, 2, 3]), True),
        "no seeds (was KeyError)": (forged({"step": 3, "results": {}, "partial": {}}), True),
        "another iteration": (forged({"step": 4, "seeds": seeds, "results": {}, "partial": {}}), True),
    }
    for name, (body, fix) in cases.items():
        plant(body, fix)
        lines.clear()
        assert store.load(3, seeds) == ({}, {}), name
        assert len(lines) == 1 and "not used" in lines[0], (name, lines)
    assert not marker.exists()
    # Entries that do not fit their requests are dropped one by one; the others are used.
    plant(forged({"step": 3, "seeds": seeds, "results": {"a": _result((1, 2, 3))},
                  "partial": {"b": (2, _state((3, 4), 1))}}))
    lines.clear()
    assert store.load(3, seeds) == ({}, {}) and "2 entries do not fit" in lines[0]
    (tmp_path / "store" / "inflight" / "it-000003.json").unlink()
    assert store.load(3, seeds) == ({}, {})  # a snapshot without its manifest is not there yet
