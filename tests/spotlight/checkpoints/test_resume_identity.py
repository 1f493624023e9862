"""A resume checks what it loads (issue 27, findings 6-9 and 17): one writer per run folder, the
resume identity of every checkpoint, result-neutral settings that may change, and optimiser
state checked against the model and the config before it is used.

Every case resumes a real run folder of the tiny LLM (`small_llm_config`) that stopped after 3 of
4 iterations with checkpoints 2 and 3; the tampered cases re-sign the checkpoint's manifest, as an
attacker with write access to the folder would.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from cloud.codec import read_file, write_file
from conftest import small_llm_config
from schedulers.input.files import ConfigError
from spotlight.checkpoints import checkpoint
from spotlight.checkpoints.checkpoint import sha256_of
from spotlight.train.trainer import Trainer
from test_cloud_store import final_weights


def _cfg(**train):
    return small_llm_config(train={"steps": 4, "checkpoint_every": 1, **train})


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    out = tmp_path_factory.mktemp("stopped") / "run"
    Trainer(small_llm_config(train={"steps": 3, "checkpoint_every": 1}), out, progress=False).build().train()
    assert [c.step for c in checkpoint.list_checkpoints(out / "checkpoints")] == [2, 3]
    return out


@pytest.fixture
def run(stopped, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(stopped, out)
    return out


def _listing(out):
    return sorted(p.name for p in (out / "checkpoints").iterdir())


@pytest.mark.parametrize("config_yaml", ["kept", "deleted"])
def test_a_changed_config_is_refused_with_one_line_and_the_checkpoints_stay(run, config_yaml):
    if config_yaml == "deleted":
        (run / "config.yaml").unlink()
    before = _listing(run)
    with pytest.raises(ConfigError) as err:
        Trainer(_cfg(lr=1e-3), run, progress=False).build()
    line = str(err.value)
    assert "holds checkpoints of another run" in line and "\n" not in line, line
    if config_yaml == "kept":
        assert "train.lr" in line, line
    assert _listing(run) == before  # nothing renamed away


def test_another_seed_is_refused_by_name(run):
    cfg = _cfg()
    cfg.seed = 7
    with pytest.raises(ConfigError, match="it is of seed 0, this run's is 7"):
        Trainer(cfg, run, progress=False).build()


def test_a_changed_micro_batch_resumes_and_ends_the_same_every_time(run, tmp_path):
    """train.micro_batch bounds memory: a run that ran out of it resumes with a smaller one, from its
    checkpoint, and the resume is deterministic (two resumes end bit-identical)."""
    again = tmp_path / "again"
    shutil.copytree(run, again)
    weights = []
    for out in (run, again):
        resumed = Trainer(_cfg(micro_batch=3), out, progress=False).build()
        assert resumed.start_step == 3
        resumed.train()
        weights.append(final_weights(out))
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_parts_per_request_may_change_on_resume_and_checkpoints_from_before_it_still_fit(run):
    """train.parts_per_request is NEUTRAL (another summation tree: float rounding only), so a
    checkpoint written before the setting existed has this run's identity at any value of it."""
    from spotlight.checkpoints.resume_identity import _digest, _result_determining, differences, mismatch

    cfg = _cfg()
    before = cfg.to_dict()
    del before["train"]["parts_per_request"]  # a config as Spotlight wrote it before the field
    old = {"config": _digest(_result_determining(before)), "seed": cfg.seed}
    for k in (1, 3):
        assert mismatch(old, _cfg(parts_per_request=k)) is None and differences(before, _cfg(parts_per_request=k)) == []
    assert mismatch(old, _cfg(lr=1e-3)) == "it was written with a different config"
    assert Trainer(_cfg(parts_per_request=3), run, progress=False).build().start_step == 3


def _tamper(ckpt_dir, change):
    """Rewrite the optimiser file of checkpoint folder `ckpt_dir` with `change(blob)` applied and
    re-sign its manifest, so that it verifies."""
    path = ckpt_dir / checkpoint.FILES[1]
    blob = read_file(path)
    change(blob["optimizer"])
    write_file(blob, path)
    manifest = json.loads((ckpt_dir / checkpoint.MANIFEST).read_text())
    manifest["files"][path.name] = {"size": path.stat().st_size, "sha256": sha256_of(path)}
    (ckpt_dir / checkpoint.MANIFEST).write_text(json.dumps(manifest))


def _first_moment(optimizer):
    return next(iter(optimizer["state"].values()))


def _nan(optimizer):
    _first_moment(optimizer)["exp_avg"].fill_(float("nan"))


def _shape(optimizer):
    state = _first_moment(optimizer)
    state["exp_avg_sq"] = torch.zeros(*state["exp_avg_sq"].shape, 2)


def _lr(optimizer):
    optimizer["param_groups"][0]["lr"] = 1e9


@pytest.mark.parametrize("change,says", [(_nan, "exp_avg of parameter 0 holds NaN"),
                                         (_shape, "exp_avg_sq of parameter 0 is"),
                                         (_lr, "lr is 1000000000.0, the config's is 0.0005")])
def test_tampered_optimiser_state_is_refused_and_the_previous_checkpoint_used(run, change, says, logged):
    _tamper(run / "checkpoints" / "step-000003", change)
    lines = logged
    trainer = Trainer(_cfg(), run, progress=False).build()
    assert trainer.start_step == 2
    assert any(says in line and "step-000003 skipped" in line for line in lines), lines
    trainer.train()
    weights = final_weights(run)
    assert all(torch.isfinite(w).all() for w in weights.values() if w.is_floating_point())


def test_a_stray_step_folder_is_not_progress(run):
    (run / "checkpoints" / "step-000099").mkdir()
    trainer = Trainer(_cfg(), run, progress=False).build()
    assert trainer.start_step == 3
    trainer.runtime.shutdown()
    trainer.folder.release()


def test_a_second_trainer_on_the_folder_is_refused_naming_the_first_and_changes_nothing(run):
    first = Trainer(_cfg(), run, progress=False).build()
    before = (run / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match=f"in use by another spotlight train \\(PID {os.getpid()}\\)"):
        Trainer(_cfg(), run, progress=False).build()
    assert (run / "metrics.jsonl").read_text() == before
    first.train()
    rows = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows == [0, 1, 2, 3]
    # the first run let the folder go: a later one takes it
    Trainer(_cfg(steps=5), run, progress=False).build().train()


def test_a_checkpoint_whose_tensors_do_not_fit_is_refused_not_set_aside(run):
    """Same config, other tensors (the pretrained folder changed under the run): another run's."""
    state_path = run / "checkpoints" / "step-000003" / "state.json"
    state = json.loads(state_path.read_text())
    state["identity"]["shapes"] = "0" * 64
    state_path.write_text(json.dumps(state))
    manifest_path = state_path.parent / checkpoint.MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["files"]["state.json"] = {"size": state_path.stat().st_size, "sha256": sha256_of(state_path)}
    manifest_path.write_text(json.dumps(manifest))
    before = _listing(run)
    with pytest.raises(ConfigError, match="tensors' names, shapes or dtypes differ"):
        Trainer(_cfg(), run, progress=False).build()
    assert _listing(run) == before
