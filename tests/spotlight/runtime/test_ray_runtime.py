"""The Ray runtime under preemptions: spot workers die at random moments, with and without a
notice, and a shipped trace is replayed fast — training still ends with the same weights as an
undisturbed run (computed in this process: a Ray run's weights are the local run's, bit for bit),
and no request is lost or committed twice."""

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from spotlight.runtime.ray_runtime import RayRuntime
from schedulers.traces import ReplayAction, load_trace, replay_schedule
from spotlight.train.trainer import Trainer

from conftest import small_dit_config, small_llm_config
from ray_cluster import descendants

TRACES = Path(__file__).resolve().parents[3] / "experiments" / "traces"
SPOT = 4


def _config(kind="ray", **over):
    return small_dit_config(
        train={"steps": 5, "prompts_per_step": 4, "group_size": 4, "checkpoint_every": 5},
        sampler={"num_steps": 8},
        runtime={"kind": kind, "spot_workers": SPOT, "ondemand_workers": 1},
        **over,
    )


def _run(tmp_path, name, actions, **over):
    runtime = RayRuntime(_config(**over), actions=actions)
    summary = Trainer(_config(**over), tmp_path / name, progress=False).build(runtime).train()
    (weights,) = (tmp_path / name / "final").glob("*.safetensors")
    return summary, load_file(str(weights))


def _run_locally(tmp_path, name, **over):
    """The undisturbed reference, in this process: a Ray run ends with its weights bit for bit
    (`test_local_and_ray_runs_of_an_llm_config_end_bit_identical`, test_multinode.py), in a
    fraction of a Ray run's time."""
    summary = Trainer(_config("local", **over), tmp_path / name, progress=False).build().train()
    (weights,) = (tmp_path / name / "final").glob("*.safetensors")
    return summary, load_file(str(weights))


def chaos_schedule(seed: int, spot: int, horizon_s: float) -> list[ReplayAction]:
    """Kill a random 30-50% of the spot slots at random moments; the first gets a notice first,
    the others die without one; one slot's capacity comes back later."""
    rng = random.Random(seed)
    victims = rng.sample(range(spot), max(2, round(spot * rng.uniform(0.3, 0.5))))
    actions = []
    for k, slot in enumerate(victims):
        t = rng.uniform(0.05, horizon_s)
        if k == 0:
            actions.append(ReplayAction(t, slot, "notice"))
            t += rng.uniform(0.05, 0.3)
        actions.append(ReplayAction(t, slot, "kill"))
    actions.append(ReplayAction(horizon_s * 1.5, victims[-1], "add"))
    return sorted(actions, key=lambda a: a.at_s)


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory):
    return _run_locally(tmp_path_factory.mktemp("ray"), "undisturbed")


def _assert_same_weights(a, b):
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_chaos_kills_lose_and_duplicate_nothing_and_change_no_weight(tmp_path, undisturbed):
    base_summary, base_weights = undisturbed
    assert base_summary["preemptions"] == base_summary["workers_lost"] == 0
    summary, weights = _run(tmp_path, "chaos", chaos_schedule(seed=7, spot=SPOT, horizon_s=0.6))
    assert summary["preemptions"] >= 1 and summary["workers_lost"] >= 1, summary
    assert summary["requests_lost"] == 0 and summary["requests_duplicated"] == 0
    assert summary["requests_completed"] == 5 * 4
    _assert_same_weights(weights, base_weights)


@pytest.mark.slow
def test_chaos_kills_change_no_adapter_of_a_lora_run(tmp_path):
    """With LoRA the workers load the learner's base once and then adapters only: replacement
    workers started mid-run must rebuild the same model, or the run's adapters would differ."""
    lora = {"lora": {"rank": 4, "alpha": 8}}
    _, base_weights = _run_locally(tmp_path, "lora-undisturbed", policy=lora)
    summary, weights = _run(tmp_path, "lora-chaos", chaos_schedule(seed=7, spot=SPOT, horizon_s=0.6), policy=lora)
    assert summary["preemptions"] >= 1 and summary["workers_lost"] >= 1, summary
    assert summary["requests_lost"] == 0 and summary["requests_duplicated"] == 0
    assert all("lora_" in k for k in weights) and any(float(w.abs().sum()) > 0 for k, w in weights.items()
                                                      if "lora_B" in k)
    _assert_same_weights(weights, base_weights)


@pytest.mark.slow
def test_a_shipped_trace_replayed_fast_changes_no_weight(tmp_path, undisturbed):
    _, base_weights = undisturbed
    trace = load_trace(TRACES / "bamboo-p3.csv")
    # The first hour of the trace (its busiest stretch of preemptions) over ~2 s of rollout.
    actions = replay_schedule(trace, slots=SPOT, speedup=1800.0, notice_s=120.0)
    summary, weights = _run(tmp_path, "trace", actions)
    assert summary["preemptions"] + summary["workers_lost"] >= 1, summary
    assert summary["requests_lost"] == 0 and summary["requests_duplicated"] == 0
    _assert_same_weights(weights, base_weights)


@pytest.mark.slow
def test_workers_killed_from_outside_are_detected_and_their_work_resumed(tmp_path, undisturbed):
    """No schedule at all: a thread SIGKILLs two rollout-worker processes at random moments, the way
    a vanished node looks to Ray. The controller learns it only from Ray reporting the actor dead."""
    import os
    import signal
    import subprocess
    import threading
    import time

    _, base_weights = undisturbed
    rng = random.Random(3)

    def pids(title):
        # This run's workers only: the processes below this one (its Ray cluster). Another test's
        # cluster may run beside it (two pytest-xdist workers), and killing its workers failed both.
        out = subprocess.run(["pgrep", "-f", title], capture_output=True, text=True).stdout
        mine = set(descendants(os.getpid()))
        return sorted(p for p in map(int, out.split()) if p in mine)

    def killer():
        deadline = time.monotonic() + 120
        while not pids("ray::RolloutWorker.serve") and time.monotonic() < deadline:  # training has begun
            time.sleep(0.05)
        killed: set[int] = set()
        while len(killed) < 2 and time.monotonic() < deadline:
            time.sleep(rng.uniform(0.2, 1.5))
            # Chosen at the moment of the kill: a worker process of the module's earlier run may
            # still be exiting when this run starts, and killing it would kill nothing of this run.
            alive = [p for p in pids("ray::RolloutWorker") if p not in killed]
            try:
                victim = rng.choice(alive)
                os.kill(victim, signal.SIGKILL)
                killed.add(victim)
            except (IndexError, ProcessLookupError):
                continue

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    summary, weights = _run(tmp_path, "crash", [])
    thread.join(timeout=1)
    assert summary["workers_lost"] == 2, summary
    assert summary["requests_lost"] == 0 and summary["requests_duplicated"] == 0
    _assert_same_weights(weights, base_weights)


@pytest.mark.slow
def test_a_dead_role_surfaces_as_itself_once_and_the_spending_is_saved(tmp_path):
    """The learner and the queue die mid-run (as on a lost node): the run ends with the learner's
    own error — not the shutdown's call to the dead queue on top of it — and what it spent is kept."""
    import ray

    from cloud.cost import SPENT_FILE

    cfg = small_dit_config(train={"steps": 3, "prompts_per_step": 2, "group_size": 2},
                           runtime={"kind": "ray", "spot_workers": 1, "ondemand_workers": 1})
    runtime = RayRuntime(cfg)
    update = runtime.update

    def dying_update(*args, **kwargs):
        ray.kill(runtime.queue_actor, no_restart=True)
        ray.kill(runtime.learner, no_restart=True)
        return update(*args, **kwargs)

    runtime.update = dying_update
    with pytest.raises(ray.exceptions.RayActorError) as err:
        Trainer(cfg, tmp_path / "run", progress=False).build(runtime).train()
    assert err.value.__context__ is None or not isinstance(err.value.__context__, ray.exceptions.RayActorError)
    assert (tmp_path / "run" / SPENT_FILE).is_file() and not ray.is_initialized()


@pytest.mark.slow
@pytest.mark.parametrize("grpo", [{}, {"drop_zero_advantage_groups": True}], ids=["default", "dropping-groups"])
def test_local_and_ray_runs_of_an_llm_config_end_bit_identical(tmp_path, grpo):
    """By default (runtime.torch_threads: 1 in every role and in the local runtime's process), and
    with zero-advantage groups left out (on Ray their results are then fetched and filtered)."""
    runs = {}
    for kind in ("local", "ray"):
        cfg = small_llm_config(train={"steps": 3}, grpo=grpo,
                               runtime={"kind": kind, "spot_workers": 1, "ondemand_workers": 1})
        Trainer(cfg, tmp_path / kind, progress=False).build().train()
        (weights,) = (tmp_path / kind / "final").glob("*.safetensors")
        runs[kind] = load_file(str(weights))
    _assert_same_weights(runs["local"], runs["ray"])
    if grpo:  # groups were really left out on Ray
        rows = [json.loads(line) for line in (tmp_path / "ray" / "metrics.jsonl").read_text().splitlines()]
        assert sum(r["groups_dropped"] for r in rows) > 0
