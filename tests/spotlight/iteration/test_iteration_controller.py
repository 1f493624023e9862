"""The iteration is sequenced once (`spotlight.iteration.iteration_controller`): `spotlight train` and
`spotlight simulate` run the same phases in the same order and place every update alike, and a
config training refuses is refused by simulation with the same line."""

import json

import pytest

from conftest import small_dit_config
from schedulers.clock import ManualClock
from schedulers.update_placement import UpdatePlacement
from spotlight import cli
from spotlight.config import to_yaml
from spotlight.iteration.iteration_controller import PHASES, IterationController

TRACE = "t_s,nodes\n0,1\n"
"""A counts trace with one spot node all along (the local runtime has no spot worker anyway)."""


class Recorder:
    """An `IterationWork` that notes the calls and takes 1 s per phase on a manual clock."""

    def __init__(self, clock, update_s=None):
        self.clock, self.calls, self.update_s = clock, [], update_s or {}

    def __getattr__(self, phase):
        if phase not in PHASES:
            raise AttributeError(phase)

        def run(step, *on_fleet):
            self.calls.append((phase, *on_fleet))
            self.clock.advance(self.update_s.get(on_fleet[0], 1.0) if on_fleet else 1.0)
        return run


def test_the_plan_follows_the_settings():
    clock = ManualClock()
    c = IterationController(UpdatePlacement("learner"), clock, steps=5, start_step=1, checkpoint_every=2,
                            evaluates=lambda s: s % 3 == 0, explores_first=lambda s: s == 1)
    assert c.plan(1) == ["explore_first", "rollout", "reward", "advantage", "update", "publish", "record", "checkpoint"]
    assert c.plan(2) == ["rollout", "reward", "advantage", "update", "publish", "record"]
    assert c.plan(3) == ["eval", "rollout", "reward", "advantage", "update", "publish", "record", "checkpoint"]
    assert c.plan(4) == ["rollout", "reward", "advantage", "update", "publish", "record", "checkpoint"]  # the last
    work = Recorder(clock)
    record = c.run(2, work)
    assert [call[0] for call in work.calls] == record.phases == c.plan(2)
    assert ("update", False) in work.calls and record.update_on_fleet is False
    assert record.seconds == {p: 1.0 for p in c.plan(2)}


def test_auto_tries_both_places_then_keeps_the_faster_and_a_price_overrides_the_measurements():
    clock = ManualClock()
    c = IterationController(UpdatePlacement("auto", retry_every=3), clock, steps=10)
    work = Recorder(clock, update_s={True: 2.0, False: 5.0})  # the fleet is faster
    placed = [c.run(s, work).update_on_fleet for s in range(6)]
    assert placed == [False, True, True, False, True, True]  # the slower place again every 3rd update
    priced = IterationController(UpdatePlacement("auto", prefer=lambda: False), clock, steps=10)
    assert [priced.run(s, work).update_on_fleet for s in range(3)] == [False, False, False]


def _train_rows(tmp_path, cfg):
    path = tmp_path / "run.yaml"
    path.write_text(to_yaml(cfg))
    assert cli.main(["train", str(path), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    return path, [{k: r[k] for k in COMPARED if k in r} for r in rows]


COMPARED = ("step", "phases", "update_on_fleet", "gradient_parts", "update_gradient_bytes")
"""What a training run's metrics row and a simulated iteration share: the phases, the update's
place and, on the fleet, its requests' gradients and their bytes (one grain)."""


def _simulated(tmp_path, path, capsys):
    (tmp_path / "trace.csv").write_text(TRACE)
    capsys.readouterr()
    assert cli.main(["simulate", "--config", str(path), "--trace", str(tmp_path / "trace.csv"), "--json"]) == 0
    log = json.loads(capsys.readouterr().out)["policies"]["config"]["iterations_log"]
    return [{k: r[k] for k in COMPARED if k in r} for r in log]


@pytest.mark.parametrize("update_on, steps, more", [
    # exploration first and during every update, an evaluation every other iteration, a checkpoint every 2
    ("fleet", 3, {"exploration": {"enabled": True, "samples_per_step": 8, "candidates_per_prompt": 8,
                                  "request_size": 4},
                  "train": {"eval_prompts": 1, "eval_seeds": 2, "eval_every": 2}}),
    # auto: the learner first, then the fleet (after that the faster, measured or modelled)
    ("auto", 2, {}),
])
def test_train_and_simulate_run_the_same_iterations(tmp_path, capsys, update_on, steps, more):
    train = {"steps": steps, "update_on": update_on, **more.pop("train", {})}
    cfg = small_dit_config(train=train, warm_start={"steps": 0}, **more)
    path, trained = _train_rows(tmp_path, cfg)
    simulated = _simulated(tmp_path, path, capsys)
    assert simulated == trained
    assert len(trained) == steps and trained[-1]["phases"][-1] == "checkpoint"
    if update_on == "fleet":
        assert trained[0]["phases"][:2] == ["explore_first", "eval"] and "eval" not in trained[1]["phases"]
        assert all(r["update_on_fleet"] for r in trained)
    else:
        assert [r["update_on_fleet"] for r in trained] == [False, True]


def test_a_config_training_refuses_is_refused_by_simulation_with_the_same_line(tmp_path, capsys):
    cfg = small_dit_config(train={"update_on": "fleet"})
    text = to_yaml(cfg).replace("sp_degree: 1", "sp_degree: 2")
    path = tmp_path / "run.yaml"
    path.write_text(text)
    (tmp_path / "trace.csv").write_text(TRACE)
    lines = []
    for argv in (["train", str(path), "--out", str(tmp_path / "out")],
                 ["simulate", "--config", str(path), "--trace", str(tmp_path / "trace.csv")]):
        capsys.readouterr()
        assert cli.main(argv) == 2
        lines.append(capsys.readouterr().err.strip())
    assert lines[0] == lines[1] and "SP groups compute rollouts only" in lines[0]
    assert not (tmp_path / "out").exists()
