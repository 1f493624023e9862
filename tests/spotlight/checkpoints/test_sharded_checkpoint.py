"""A learner group's checkpoint format (`spotlight.checkpoints.sharded`) in one process (no process
group: torch's distributed checkpoint writes and reads it the same way): the folder is the
protocol's (manifest last, `checkpoint.read` verifies it, the store syncs its files), loading
restores the weights and Adam's state exactly, and damage or another model is refused with nothing
applied. The group itself: tests/spotlight/runtime/test_learner_group.py."""

from __future__ import annotations

import json

import pytest
import torch

from spotlight.checkpoints import checkpoint, sharded
from spotlight.train.checkpoint_sync import checkpoint_files


def _trained(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return model, opt


def test_a_sharded_checkpoint_round_trips_and_is_verified_like_any(tmp_path):
    model, opt = _trained(0)
    ckpt = sharded.save(tmp_path / "checkpoints", 3, model, opt, extra={"identity": {"seed": 0}})
    names = sorted(p.name for p in ckpt.path.iterdir())
    assert names == ["MANIFEST.json", "shard-00001-model-00001-of-00001.safetensors", "state.json"]
    assert json.loads((ckpt.path / "MANIFEST.json").read_text())["format"] == "sharded"
    assert sharded.is_sharded(ckpt) and checkpoint.verify(ckpt) is None
    assert checkpoint.read(ckpt, weights=False).state == {"step": 3, "identity": {"seed": 0}, "learner_gpus": 1}
    assert checkpoint_files(tmp_path, 3)[:3] == [f"checkpoints/step-000003/{n}" for n in (  # what a push sends
        "state.json", "shard-00001-model-00001-of-00001.safetensors", "MANIFEST.json")]

    fresh, fresh_opt = _trained(1)
    assert sharded.load(ckpt, fresh, fresh_opt)["step"] == 3
    for (name, a), b in zip(model.named_parameters(), fresh.parameters()):
        assert torch.equal(a, b), name
        for key in sharded.ADAM:
            assert torch.equal(opt.state[a][key], fresh_opt.state[b][key]), (name, key)


def test_damage_and_another_model_are_refused_with_nothing_applied(tmp_path):
    model, opt = _trained(0)
    ckpt = sharded.save(tmp_path, 1, model, opt)
    other, other_opt = _trained(1)
    before = [p.detach().clone() for p in other.parameters()]
    wider = torch.nn.Sequential(torch.nn.Linear(4, 9), torch.nn.Linear(9, 2))
    with pytest.raises(checkpoint.CheckpointMismatch, match="its tensors are not the model's"):
        sharded.load(ckpt, wider, torch.optim.Adam(wider.parameters()))
    with pytest.raises(checkpoint.CheckpointMismatch, match="not this run's checkpoint: another"):
        sharded.load(ckpt, other, other_opt, belongs=lambda state: "another")
    shard = next(ckpt.path.glob("shard-*"))
    shard.write_bytes(shard.read_bytes()[:-8])
    assert "has" in checkpoint.verify(ckpt) and "truncated" in checkpoint.verify(ckpt)
    with pytest.raises(checkpoint.CheckpointError):
        sharded.load(ckpt, other, other_opt)
    assert all(torch.equal(a, b) for a, b in zip(before, other.parameters()))
    assert checkpoint.newest_usable(tmp_path, lambda line: None) is None  # set aside, the run starts fresh
    assert (tmp_path / ".skipped-step-000001").is_dir()
