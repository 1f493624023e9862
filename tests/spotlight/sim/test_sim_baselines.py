"""The simulator's baselines (`spotlight.sim.simulator.BASELINES`): `near_all_spot` (spotlight with
one on-demand GPU) and `managed_restart` (an all-spot SkyPilot-style managed job,
`spotlight.sim.managed_restart`), on handmade traces small enough to check by hand."""

import pytest

from schedulers.traces import Trace, TraceEvent
from spotlight.config import ConfigError
from spotlight.sim.config import Policy
from spotlight.sim.simulator import ALSO_COMPARED, BASELINES, POLICIES, SimConfig, gpu_prices, simulate
from spotlight.sim.step_time import StepTimes

ST = StepTimes()
LAUNCH_S = ST.cold_start_s          # a launch with nothing to restore (no checkpoint yet)
RELAUNCH_S = ST.cold_start_s + ST.restore_s


def small(**kw) -> SimConfig:
    """4 on-demand GPUs, 8 prompts x 4 samples: an iteration takes ~25-45 s at 512 px."""
    base = dict(gpus=4, spot_gpus=4, prompts=8, group_size=4, samples_per_request=4, iterations=6,
                candidates_per_prompt=8, plan_prompts=4, stop_at_target=False)
    return SimConfig(**{**base, **kw})


def trace(*events: tuple[float, str, str]) -> Trace:
    return Trace([TraceEvent(t, a, n) for t, a, n in events], "handmade")


def spot_gpu_s(result: dict, end_s: float | None = None) -> float:
    """The paid GPU-seconds of a result's timeline (hours in, seconds out), up to `end_s`."""
    end = result["wall_h"] * 3600 if end_s is None else end_s
    points = [(t * 3600, n) for t, n in result["timeline"]] + [(end, 0)]
    return sum(n * (min(t1, end) - min(t0, end)) for (t0, n), (t1, _) in zip(points, points[1:]))


def paid_at(result: dict, t_s: float) -> int:
    """GPUs paid for at `t_s` (the last timeline point at or before it)."""
    return [n for t, n in result["timeline"] if t * 3600 <= t_s + 1e-9][-1]


def test_near_all_spot_bills_one_ondemand_gpu_and_the_live_spot_nodes():
    # 3 nodes of 2 GPUs (6 spot GPUs at the peak); n0 dies at 50 s, n3 joins at 100 s
    tr = trace((0, "add", "n0"), (0, "add", "n1"), (0, "add", "n2"), (50, "remove", "n0"), (100, "add", "n3"))
    cfg = small(spot_gpus=6)
    r = simulate(cfg, tr, ["near_all_spot"])["policies"]["near_all_spot"]
    od, spot, _ = gpu_prices(cfg)
    end = r["wall_h"] * 3600
    assert end > 100 and r["iterations"] == 6 and r["preemptions"] == 1
    live_spot_gpu_s = 6 * 50 + 4 * 50 + 6 * (end - 100)
    assert r["total_cost_usd"] == pytest.approx((od * 1 * end + spot * live_spot_gpu_s) / 3600, rel=1e-9)
    assert spot_gpu_s(r) == pytest.approx(1 * end + live_spot_gpu_s, rel=1e-9)


def test_managed_restart_bills_no_ondemand_gpu_and_waits_for_capacity_paying_nothing():
    # No node for the first 1,000 s; then two of 2 GPUs. All die 40 s after the first launch ends
    # (a few iterations in); one comes back at 3,000 s.
    come, back = 1000.0, 3000.0
    die = come + LAUNCH_S + 40.0
    tr = trace((come, "add", "n0"), (come, "add", "n1"), (die, "remove", "n0"), (die, "remove", "n1"),
               (back, "add", "n0"))
    cfg = small(spot_gpus=4, iterations=8)
    res = simulate(cfg, tr, ["ondemand", "managed_restart"])["policies"]
    r, od_run = res["managed_restart"], res["ondemand"]
    _, spot, _ = gpu_prices(cfg)
    serving = come + LAUNCH_S                       # the first launch: nothing to restore
    again = back + RELAUNCH_S                       # after the loss: restore the checkpoint too
    end = r["wall_h"] * 3600
    assert r["restarts"] == 1 and r["iterations"] == 8 and end > again
    # paid: nothing before the first launch ends, 2 nodes until the loss, nothing until n0's relaunch ends
    assert [paid_at(r, t) for t in (0, come, serving - 1, serving, die - 1, die, back, again - 1, again)] == [
        0, 0, 0, 4, 4, 0, 0, 0, 2]
    assert r["total_cost_usd"] == pytest.approx(spot * (4 * (die - serving) + 2 * (end - again)) / 3600, rel=1e-9)
    # no iteration completes while the job has no cluster
    done = [t * 3600 for t, _ in r["progress"][1:]]
    assert done[0] > serving and not any(die <= t <= again for t in done)
    assert r["iterations_lost"] == 0  # a checkpoint after every iteration: only the one in flight is lost
    # a trace that starts empty is not on-demand GRPO under another name
    assert r["wall_h"] != pytest.approx(od_run["wall_h"]) and r["total_cost_usd"] < od_run["total_cost_usd"]


def loss_halfway_through_the_6th_iteration(cfg: SimConfig) -> tuple[float, list[float], dict]:
    """(when, the calm run's iteration ends, the run with one of 4 nodes lost then)."""
    nodes = [(0, "add", f"n{k}") for k in range(4)]
    calm = simulate(cfg, trace(*nodes), ["managed_restart"])["policies"]["managed_restart"]
    assert calm["restarts"] == 0 and calm["iterations_lost"] == 0
    ends = [t * 3600 for t, _ in calm["progress"][1:]]
    loss = (ends[4] + ends[5]) / 2
    return loss, ends, simulate(cfg, trace(*nodes, (loss, "remove", "n0")), ["managed_restart"])["policies"]["managed_restart"]


def test_managed_restart_loses_exactly_the_iterations_since_its_last_checkpoint():
    cfg = small(iterations=9, checkpoint_every=3, spot_gpus=8)
    loss, ends, hit = loss_halfway_through_the_6th_iteration(cfg)
    # checkpoints after iterations 3, 6, 9: the loss throws away iterations 4 and 5 (and the 6th in flight)
    assert hit["restarts"] == 1 and hit["iterations"] == 9
    assert hit["iterations_lost"] == 2
    assert [t * 3600 for t, _ in hit["progress"][1:6]] == pytest.approx(ends[:5])  # the same until the loss
    # after the relaunch (on 3 nodes), iterations 4, 5 and 6 run before the 6th is counted
    shortest = min(b - a for a, b in zip(ends, ends[1:]))
    assert hit["progress"][6][0] * 3600 > loss + RELAUNCH_S + 3 * shortest
    per_iteration = (cfg.prompts * cfg.group_size // cfg.samples_per_request) * ST.denoise_steps
    assert hit["steps_recomputed"] >= 2 * per_iteration
    # checkpointing after every iteration: only the iteration in flight is lost
    _, _, every = loss_halfway_through_the_6th_iteration(small(iterations=9, spot_gpus=8))
    assert every["restarts"] == 1 and every["iterations_lost"] == 0 and every["iterations"] == 9


def test_managed_restart_uses_capacity_that_comes_back_at_its_next_launch():
    # starts empty; n0, n1 at 600 s; n2, n3 join at 2,000 s while it runs; n0 dies at 3,000 s
    tr = trace((600, "add", "n0"), (600, "add", "n1"), (2000, "add", "n2"), (2000, "add", "n3"),
               (3000, "remove", "n0"))
    cfg = small(iterations=200, spot_gpus=8)  # 2 GPUs a node
    r = simulate(cfg, tr, ["managed_restart"])["policies"]["managed_restart"]
    _, spot, _ = gpu_prices(cfg)
    serving, again = 600 + LAUNCH_S, 3000 + RELAUNCH_S
    end = r["wall_h"] * 3600
    assert r["restarts"] == 1 and end > again
    # n2 and n3 are not the job's (nor paid) until the relaunch; n1 is held through it
    assert [paid_at(r, t) for t in (serving - 1, serving, 2500, 3000, again - 1, again)] == [0, 4, 4, 2, 2, 6]
    assert r["total_cost_usd"] == pytest.approx(
        spot * (4 * (3000 - serving) + 2 * RELAUNCH_S + 6 * (end - again)) / 3600, rel=1e-9)
    # on its 3 nodes an iteration is faster than it was on 2
    done = [t * 3600 for t, _ in r["progress"][1:]]
    before = [b - a for a, b in zip(done, done[1:]) if b < 3000]
    after = [b - a for a, b in zip(done, done[1:]) if a > again]
    assert max(after) < min(before)


def test_managed_restart_with_no_node_left_to_come_stops_and_pays_nothing_more():
    tr = trace((0, "add", "n0"), (0, "add", "n1"), (200, "remove", "n0"), (200, "remove", "n1"))
    cfg = small(iterations=50, spot_gpus=4)
    r = simulate(cfg, tr, ["managed_restart"])["policies"]["managed_restart"]
    _, spot, _ = gpu_prices(cfg)
    assert r["stop_reason"] == "no_capacity" and 0 < r["iterations"] < 50 and r["time_to_target_h"] is None
    assert r["total_cost_usd"] == pytest.approx(spot * 4 * 200 / 3600, rel=1e-9)


def test_every_policy_is_compared_with_the_four_baselines():
    assert BASELINES == ("ondemand", "ondemand_total", "near_all_spot", "managed_restart")
    tr = trace((0, "add", "a"), (0, "add", "b"), (1500, "remove", "a"), (2400, "add", "c"))
    cfg = small(iterations=40, spot_gpus=8, iterations_scale=0.1, stop_at_target=True)
    res = simulate(cfg, tr)
    assert res["config"]["baselines"] == list(BASELINES)
    out = res["policies"]
    assert set(out) == set(POLICIES)
    for name, r in out.items():
        assert r["time_to_target_h"] > 0, name  # everyone reaches the target: every ratio is a number
        for b in BASELINES + ALSO_COMPARED:
            assert r[f"speedup_vs_{b}"] == pytest.approx(out[b]["time_to_target_h"] / r["time_to_target_h"]), (name, b)
            assert r[f"cost_ratio_vs_{b}"] == pytest.approx(r["cost_usd"] / out[b]["cost_usd"]), (name, b)
        keys = list(r)
        assert keys.index("cost_ratio_vs_managed_restart") < keys.index("timeline")  # before the long lists


def test_a_policy_with_no_ondemand_gpu_must_be_a_restart_job():
    assert POLICIES["near_all_spot"].ondemand_gpus == 1 and POLICIES["managed_restart"].ondemand_gpus == 0
    with pytest.raises(ConfigError, match="ondemand_gpus: 0"):
        Policy("x", spot=True, ondemand_gpus=0)  # elastic: the engine's learner needs a GPU
    with pytest.raises(ConfigError, match="ondemand_gpus: expected None or an integer >= 0"):
        Policy("x", spot=True, ondemand_gpus=-1)
    with pytest.raises(ConfigError, match="checkpoint_every"):
        small(checkpoint_every=0)
