"""Nothing read back can run code, and no damaged checkpoint blocks a resume (issue 13).

- Each file of the newest local checkpoint truncated or emptied in turn: the resume sets it aside,
  falls back to the previous one and ends bit-identical to the uninterrupted run.
- Malicious pickles planted in a real S3-compatible server (moto on loopback) at every stored path
  the trainer reads — the in-flight snapshot, the optimiser and RNG file, with and without a
  manifest that covers them: none ever runs, and the run resumes from the newest good checkpoint
  (or starts fresh) and ends bit-identical.
- A kill between a metrics row and its checkpoint loses no row; a NaN loss stops the run with one
  line naming the iteration, and the checkpoint before it stays the newest.
- No product module unpickles anything outside the member pipes of one node.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from conftest import small_llm_config
from planted_pickle import Payload, pickled, torch_saved
from s3_server import s3, s3_server  # noqa: F401 (fixtures)
from spotlight.checkpoints import checkpoint
from spotlight.runtime.learner import NonFiniteUpdate
from spotlight.train.trainer import Trainer
from test_cloud_store import final_weights

REPO = Path(__file__).resolve().parents[3]


def _cfg(**over):
    return small_llm_config(train={"steps": 4, "checkpoint_every": 1}, **over)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run: 4 iterations, a checkpoint after each."""
    out = tmp_path_factory.mktemp("straight")
    Trainer(_cfg(), out, progress=False).build().train()
    return final_weights(out)


def _assert_same(a, b):
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _rows(out):
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def stopped_after_3(tmp_path_factory):
    """A run folder that stopped after 3 of the 4 iterations: checkpoints 2 and 3."""
    out = tmp_path_factory.mktemp("stopped")
    Trainer(small_llm_config(train={"steps": 3, "checkpoint_every": 1}), out, progress=False).build().train()
    assert [c.step for c in checkpoint.list_checkpoints(out / "checkpoints")] == [2, 3]
    return out


def test_the_weights_get_the_modes_of_the_runs_other_files(stopped_after_3):
    # issue 42: safetensors writes 0600, so the weights were the one thing others could not read
    mask = os.umask(0)
    os.umask(mask)
    files = [p for folder in ("final", "checkpoints") for p in (stopped_after_3 / folder).rglob("*") if p.is_file()]
    assert any(p.suffix == ".safetensors" for p in files)
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {p.name: oct(0o666 & ~mask) for p in files}
    assert oct((stopped_after_3 / "config.yaml").stat().st_mode & 0o777) == oct(0o666 & ~mask)


@pytest.mark.parametrize("damage", ["truncate", "empty"])
@pytest.mark.parametrize("name", [*checkpoint.FILES, checkpoint.MANIFEST])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, stopped_after_3, reference, name, damage,
                                                                   logged):
    out = tmp_path / "run"
    shutil.copytree(stopped_after_3, out)
    path = out / "checkpoints" / "step-000003" / name
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"")

    lines = logged
    resumed = Trainer(_cfg(), out, progress=False).build()
    assert resumed.start_step == 2
    skipped = [line for line in lines if "skipped" in line]
    assert len(skipped) == 1 and "step-000003" in skipped[0] and ".skipped-step-000003" in skipped[0], lines
    resumed.train()
    _assert_same(final_weights(out), reference)
    assert _rows(out) == [0, 1, 2, 3]
    assert (out / "checkpoints" / ".skipped-step-000003").is_dir()  # kept for a look, never taken again


def test_every_checkpoint_damaged_starts_fresh_and_ends_the_same(tmp_path, stopped_after_3, reference):
    out = tmp_path / "run"
    shutil.copytree(stopped_after_3, out)
    for ckpt in checkpoint.list_checkpoints(out / "checkpoints"):
        (ckpt.path / "model.safetensors").write_bytes(b"")
    resumed = Trainer(_cfg(), out, progress=False).build()
    assert resumed.start_step == 0
    resumed.train()
    _assert_same(final_weights(out), reference)
    assert _rows(out) == [0, 1, 2, 3]


def test_a_checkpoint_that_verifies_but_does_not_fit_the_model_is_set_aside_untouched(tmp_path, stopped_after_3):
    """Shapes that differ from the model's: the walk-back refuses it before applying anything."""
    out = tmp_path / "run"
    shutil.copytree(stopped_after_3, out)
    ckpt = checkpoint.latest(out / "checkpoints")
    model = torch.nn.Linear(3, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.Adam(model.parameters())
    with pytest.raises(checkpoint.CheckpointError, match="tensor names differ"):
        checkpoint.load(ckpt, model, opt)
    _assert_same(model.state_dict(), before)
    assert opt.state_dict()["state"] == {}


def test_a_kill_between_a_row_and_its_checkpoint_loses_no_row(tmp_path, reference, monkeypatch):
    out = tmp_path / "run"

    class Killed(Exception):
        pass

    save = checkpoint.save

    def killed_after_3(root, step, *args, **kwargs):
        done = save(root, step, *args, **kwargs)
        if step == 3:
            raise Killed  # the checkpoint is renamed into place; nothing after it ran
        return done

    monkeypatch.setattr(checkpoint, "save", killed_after_3)
    with pytest.raises(Killed):
        Trainer(_cfg(), out, progress=False).build().train()
    monkeypatch.setattr(checkpoint, "save", save)
    assert _rows(out) == [0, 1, 2]  # the row of iteration 2 was written before its checkpoint
    summary = Trainer(_cfg(), out, progress=False).build().train()
    assert _rows(out) == [0, 1, 2, 3] and summary["steps"] == 4
    _assert_same(final_weights(out), reference)


def test_a_nan_loss_stops_the_run_with_one_line_and_keeps_the_checkpoint_before_it(tmp_path, monkeypatch, capsys):
    """A reward model that starts answering NaN at iteration 2 (a real failure mode)."""
    from spotlight import cli
    from spotlight.rl.rewards import RewardWorker

    score = RewardWorker.score
    calls = []

    def nan_from_the_third(self, parts):  # past the worker's own checks: the learner must catch it
        calls.append(1)
        scores = score(self, parts)
        return dataclasses.replace(scores, total=scores.total * float("nan")) if len(calls) > 2 else scores

    monkeypatch.setattr(RewardWorker, "score", nan_from_the_third)
    config = tmp_path / "run.yaml"
    from spotlight.config import to_yaml

    config.write_text(to_yaml(_cfg()))
    out = tmp_path / "out"
    code = cli.main(["train", str(config), "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert len(err) == 1 and err[0].startswith("spotlight: error: iteration 2: loss is nan in update 1 of 2"), err
    assert "nothing after the checkpoint of iteration 2 is kept" in err[0]
    assert checkpoint.latest(out / "checkpoints").step == 2
    assert not (out / "final").exists() and not (out / "summary.json").exists()
    assert _rows(out) == [0, 1]


def test_the_learner_takes_no_step_on_a_non_finite_loss():
    from spotlight.runtime.learner import Learner

    learner = Learner(_cfg())
    learner.build()
    parts = [learner.policy.rollout(learner_prompts(learner), [0, 1, 2, 3])]
    before = {k: v.clone() for k, v in learner.policy.model.state_dict().items()}
    with pytest.raises(NonFiniteUpdate, match="iteration 0: loss is nan"):
        learner.update(parts, torch.tensor([1.0, float("nan"), -1.0, 0.0]))
    _assert_same(learner.policy.model.state_dict(), before)
    assert learner.version == 0


def learner_prompts(learner):
    from spotlight.rl.prompts import prompt_set

    return prompt_set(learner.cfg.prompts, learner.cfg.seed)[:1] * 4


# ---- planted pickles in the checkpoint store ------------------------------------------------------


def _pickles(marker: Path) -> dict[str, bytes]:
    return {"pickle": pickled(Payload(marker)),
            "torch.save": torch_saved({"optimizer": Payload(marker), "rng": Payload(marker)})}


def _put(s3, key, body):
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=body)


def _get(s3, key):
    return s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()


def _plant_covered(s3, prefix, step, rel, body):
    """Replace stored file `rel` of checkpoint `step` with `body` and re-sign both manifests that
    cover it (the store's and the checkpoint's own), as a writer with bucket access could."""
    base = f"{prefix}/step-{step:06d}"
    _put(s3, f"{base}/{rel}", body)
    entry = {"size": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    inner_rel = f"checkpoints/step-{step:06d}/{checkpoint.MANIFEST}"
    inner = json.loads(_get(s3, f"{base}/{inner_rel}"))
    inner["files"][Path(rel).name] = entry
    inner_body = json.dumps(inner).encode()
    _put(s3, f"{base}/{inner_rel}", inner_body)
    outer = json.loads(_get(s3, f"{base}/MANIFEST.json"))
    outer["files"][rel] = entry
    outer["files"][inner_rel] = {"size": len(inner_body), "sha256": hashlib.sha256(inner_body).hexdigest()}
    _put(s3, f"{base}/MANIFEST.json", json.dumps(outer).encode())


def _plant_inflight(s3, prefix, step, body):
    manifest = {"step": step, "size": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    _put(s3, f"{prefix}/inflight/it-{step:06d}.data", body)
    _put(s3, f"{prefix}/inflight/it-{step:06d}.json", json.dumps(manifest).encode())
    _put(s3, f"{prefix}/inflight/it-{step:06d}.pt", body)  # the old name, covered by no manifest


def test_pickles_planted_in_the_store_never_run_and_the_run_resumes_from_the_newest_good_checkpoint(
        s3, tmp_path, reference, logged):
    marker = tmp_path / "PWNED"
    prefix, uri = "runs/poisoned", f"s3://{s3.bucket}/runs/poisoned"
    Trainer(small_llm_config(train={"steps": 3, "checkpoint_every": 1}, cloud={"checkpoint_uri": uri}),
            tmp_path / "first", progress=False).build().train()
    payloads = _pickles(marker)
    opt = f"checkpoints/step-000003/{checkpoint.FILES[1]}"
    # Step 3: its optimiser-and-RNG file is a pickle that both manifests cover; beside it, pickles
    # under the old names that no manifest covers. Step 2 gets only uncovered ones.
    _plant_covered(s3, prefix, 3, opt, payloads["torch.save"])
    for step in (2, 3):
        for name in ("optimizer.pt", "rng.pt", "rng_state.pth"):
            _put(s3, f"{prefix}/step-{step:06d}/checkpoints/step-{step:06d}/{name}", payloads["torch.save"])
    # The in-flight snapshot of the iteration the resume starts at (2), covered by its manifest.
    _plant_inflight(s3, prefix, 2, payloads["pickle"])

    lines = logged
    cfg = _cfg(cloud={"checkpoint_uri": uri})
    resumed = Trainer(cfg, tmp_path / "second", progress=False).build()
    assert resumed.start_step == 2
    assert any("step-000003 skipped" in line and checkpoint.FILES[1] in line for line in lines), lines
    resumed.train()
    assert any("in-flight state of iteration 2" in line and "not used" in line for line in lines), lines
    assert not marker.exists()
    _assert_same(final_weights(tmp_path / "second"), reference)
    installed = {p.name for p in (tmp_path / "second" / "checkpoints").rglob("*") if p.is_file()}
    assert not installed & {"optimizer.pt", "rng.pt", "rng_state.pth"}  # never even copied down


def test_every_stored_checkpoint_poisoned_starts_fresh_and_ends_the_same(s3, tmp_path, reference, logged):
    marker = tmp_path / "PWNED"
    prefix, uri = "runs/all-poisoned", f"s3://{s3.bucket}/runs/all-poisoned"
    Trainer(small_llm_config(train={"steps": 3, "checkpoint_every": 1}, cloud={"checkpoint_uri": uri}),
            tmp_path / "first", progress=False).build().train()
    payloads = _pickles(marker)
    for step in (2, 3):
        _plant_covered(s3, prefix, step, f"checkpoints/step-{step:06d}/{checkpoint.FILES[1]}", payloads["pickle"])
    _plant_inflight(s3, prefix, 0, payloads["torch.save"])
    lines = logged
    resumed = Trainer(_cfg(cloud={"checkpoint_uri": uri}), tmp_path / "second", progress=False).build()
    assert resumed.start_step == 0
    assert sum("skipped" in line for line in lines) == 2, lines
    resumed.train()
    assert not marker.exists()
    _assert_same(final_weights(tmp_path / "second"), reference)


# ---- nothing in the product unpickles -------------------------------------------------------------

# Pickles are allowed only where both ends are processes one agent forked on its own node.
MAY_UNPICKLE = {"elastic_sp/protocol.py": "an agent's pipes to the member processes it forked itself",
                "spotlight/runtime/learner_group.py": "a learner group's connections to the rank processes it "
                "started, over a Unix socket in its own 0700 folder, each authenticated (HMAC challenge) with a "
                "key only they were given"}


def test_no_product_module_unpickles_anything():
    found = []
    for pkg in ("spotlight", "cloud", "schedulers", "planners", "elastic_sp", "experiments"):
        for path in sorted((REPO / pkg).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                    continue
                owner = ast.unparse(node.func.value)
                name = node.func.attr
                unpickles = (name in ("load", "loads", "Unpickler") and owner in ("pickle", "cPickle", "ForkingPickler")) \
                    or (name == "load" and owner == "torch" and not _weights_only(node))
                if unpickles and rel not in MAY_UNPICKLE:
                    found.append(f"{rel}:{node.lineno}: {owner}.{name}")
    assert not found, found


def _weights_only(call: ast.Call) -> bool:
    return any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
               for k in call.keywords)
