"""Renting only what pays (`spotlight.sim.rental`): the rule against its closed forms, and the
simulator holding what it chooses (`Simulation._rent`, the oracle's own choice, `--objective`)."""

import json
import math

import pytest

from schedulers.traces import Trace, TraceEvent
from spotlight import cli
from spotlight.config import ConfigError
from spotlight.sim.progress_model import ProgressModel
from spotlight.sim.rental import IterationModel, RentalRule, choose
from spotlight.sim.simulator import POLICIES, SimConfig, make_simulation

# A learner-only update (no fleet update): T(s) = R / (G + s) + K with K = W / G + F.
G, R, W, F = 4, 1000.0, 400.0, 10.0
K = W / G + F  # 110 s
LEARNER = IterationModel(G, R, W, F)
P_OD = 4.0  # $ per on-demand GPU-hour


def rule(objective="cost", spot=1.0, join_s=0.0, model=LEARNER, block=1, tolerance=0.0):
    return RentalRule(objective, model, block, P_OD, spot, join_s, tolerance)


def usd(s, spot=1.0):
    """C(s) by hand: (G p_od + s p_spot) (R / (G + s) + K), per hour -> per second."""
    return (G * P_OD + s * spot) * (R / (G + s) + K) / 3600.0


def test_the_model_is_the_closed_form():
    assert LEARNER.seconds(6) == pytest.approx(R / 10 + K)
    fleet = IterationModel(G, R, W, F, fleet_efficiency=0.5, update_round_s=5.0, fleet_update=True)
    assert fleet.seconds(8) == pytest.approx(R / 12 + W / (0.5 * (G + 8)) + 5.0 + F)  # 66.7 + 5 < 100: on the fleet
    slow_round = IterationModel(G, R, W, F, 0.5, update_round_s=40.0, fleet_update=True)
    assert slow_round.seconds(8) == pytest.approx(R / 12 + W / G + F)  # 66.7 + 40 > 100: the learner alone
    assert rule().iteration_usd(6) == pytest.approx(usd(6))


def test_time_holds_every_node_on_offer():
    assert rule("time", spot=1e6).nodes(held=0, available=7) == 7


def test_cost_holds_the_closed_form_optimum():
    # C is convex in x = G + s with dC/dx = 0 at x* = sqrt(G (p_od - p_spot) R / (p_spot K)) = 10.44.
    x = math.sqrt(G * (P_OD - 1.0) * R / (1.0 * K))
    lo, hi = math.floor(x - G), math.ceil(x - G)  # 6, 7
    best = lo if usd(lo) <= usd(hi) else hi
    assert rule().nodes(held=0, available=40) == best
    assert rule().nodes(held=40, available=40) == best  # no join cost: nothing keeps a node that does not pay
    assert rule().nodes(held=0, available=3) == 3  # short of the optimum, every node offered pays
    # nodes of 2 GPUs: the best even count
    assert rule(block=2).nodes(held=0, available=20) == min(range(21), key=lambda n: (usd(2 * n), -n))


def test_spot_pays_only_below_the_break_even_price():
    # C(1) < C(0)  <=>  p_spot < p_od R / (R + (G + 1) K) = 2.58; C convex: no first GPU, none at all.
    even = P_OD * R / (R + (G + 1) * K)
    assert rule(spot=even * 1.01).nodes(held=3, available=10) == 0
    assert rule(spot=even * 0.99).nodes(held=0, available=10) >= 1


def test_a_held_node_is_kept_unless_releasing_saves_more_than_a_join():
    best, held, horizon = 6, 9, 10.0  # 9 held, 3 beyond the optimum
    assert rule().nodes(held=held, available=20) == best
    # Releasing k nodes saves H (C(9) - C(9 - k)) and is charged k joins; the best release saves
    # the most per join: with J just above that, nothing is released, just below, it is.
    per_join = max(horizon * (usd(held) - usd(held - k)) / k for k in range(1, held + 1))
    join_s = lambda usd_: usd_ * 3600.0 / 1.0  # J = block x p_spot x join_s / 3600, block 1, p_spot 1
    assert rule(join_s=join_s(per_join * 1.01)).nodes(held=held, available=20, horizon=horizon) == held
    assert rule(join_s=join_s(per_join * 0.99)).nodes(held=held, available=20, horizon=horizon) < held
    # and renting: from 0 held, a join that costs more than the whole horizon's saving rents none
    gain = max(horizon * (usd(0) - usd(n)) / n for n in range(1, 21))
    assert rule(join_s=join_s(gain * 1.01)).nodes(held=0, available=20, horizon=horizon) == 0


def test_deadline_holds_the_cheapest_count_that_meets_it():
    # H T(s) <= L  <=>  s >= R / (L / H - K) - G; past the cost optimum (6) the cheapest such s is its ceiling.
    horizon, s_min = 10.0, 12.3
    left = horizon * (R / (G + s_min) + K)
    deadline = rule("deadline")
    assert deadline.nodes(held=0, available=40, horizon=horizon, seconds_left=left) == 13
    # with the run so far 10% slower than modelled, the forecast needs s >= R / (L / (1.1 H) - K) - G
    need = R / (left / (1.1 * horizon) - K) - G
    assert deadline.nodes(held=0, available=40, horizon=horizon, seconds_left=left, pace=1.1) == math.ceil(need)
    # a loose deadline is the cost optimum; one out of reach holds every node
    assert deadline.nodes(held=0, available=40, horizon=horizon, seconds_left=1e9) == 6
    assert deadline.nodes(held=0, available=40, horizon=horizon, seconds_left=horizon * K) == 40


def test_choose_refuses_what_it_cannot_decide():
    with pytest.raises(ValueError, match="objective"):
        choose("fastest", 0, [(1.0, 1.0)])
    with pytest.raises(ValueError, match="seconds_left"):
        choose("deadline", 0, [(1.0, 1.0)])
    with pytest.raises(ValueError, match="block"):
        RentalRule("cost", LEARNER, 0, 1.0, 1.0)


# ---- in the simulator ---------------------------------------------------------------------------


def fleet(nodes: int) -> Trace:
    return Trace([TraceEvent(0.0, "add", f"n{k}") for k in range(nodes)], "handmade")


def small(**kw) -> SimConfig:
    """A tiny run whose joins cost next to nothing: the rule's hysteresis (a release is charged a
    join: 4 nodes x 240 s at $8/h = $2.13, more than the ~18 iterations left at iterations_scale 1
    save) stays out of these tests, which check the rest."""
    base = dict(gpus=4, spot_gpus=4, prompts=8, group_size=4, samples_per_request=4, iterations=3,
                candidates_per_prompt=8, plan_prompts=4, stop_at_target=False, join_s=1.0)
    return SimConfig(**{**base, **kw})


def run(cfg, name, prices, trace=None):
    return make_simulation(cfg, POLICIES[name], trace or fleet(4), ProgressModel.calibrated(), prices).run()


def test_cost_releases_spot_nodes_that_do_not_pay_and_pays_only_for_those_held():
    # Spot at the on-demand price never pays (C(x) = p (R + K x) rises with x). Fewer on-demand GPUs
    # are cheaper here, by little: C(G) = p (R + W + G F) on them alone, so the oracle and the live
    # rule (exact on the on-demand count) both hold 1 of the 4. The oracle releases every spot
    # node at t = 0, planned (no preemption): its run is the on-demand one, to the cent.
    from spotlight.sim.rental import MODEL_TOLERANCE

    alone = run(small(gpus=1), "ondemand", (8.0, 8.0))
    oracle = run(small(objective="cost"), "oracle", (8.0, 8.0))
    assert oracle["objective"] == "cost" and oracle["ondemand_gpus_held"] == 1
    assert oracle["spot_gpus_held_mean"] == 0.0 and oracle["preemptions"] == 0
    assert oracle["total_cost_usd"] == pytest.approx(alone["total_cost_usd"], rel=1e-9)
    # The live rule keeps the one spot node whose iteration costs within its tolerance of the
    # cheapest (4% dearer: one spot GPU halves a one-GPU rollout for twice the rate) and releases
    # the other 3: a run about 2x sooner for at most the tolerance more.
    live = run(small(objective="cost"), "spotlight_noexplore", (8.0, 8.0))
    assert live["objective"] == "cost" and live["ondemand_gpus_held"] == 1 and live["preemptions"] == 0
    assert live["spot_gpus_held_mean"] == 1.0 and live["spot_releases"] == 3
    assert alone["total_cost_usd"] < live["total_cost_usd"] < (1 + MODEL_TOLERANCE) * alone["total_cost_usd"]
    assert live["wall_h"] < 0.6 * alone["wall_h"]
    assert run(small(), "spotlight_noexplore", (8.0, 8.0))["ondemand_gpus_held"] == 4  # `time` keeps --gpus
    # Nearly free spot pays for every node: `cost` holds all of them, as `time` does, and of the
    # on-demand GPUs the fewest (they cost 800x a spot one here), so it is cheaper and later.
    time = run(small(), "spotlight_noexplore", (8.0, 0.01))
    cost = run(small(objective="cost"), "spotlight_noexplore", (8.0, 0.01))
    assert time["objective"] == "time" and time["spot_releases"] == 0 and time["spot_gpus_held_mean"] == 4.0
    assert cost["spot_releases"] == 0 and cost["spot_gpus_held_mean"] == pytest.approx(4.0)
    assert cost["ondemand_gpus_held"] == 1 and cost["total_cost_usd"] < time["total_cost_usd"] < 4 * cost["total_cost_usd"]
    assert cost["wall_h"] > time["wall_h"]
    assert run(small(), "ondemand", (8.0, 8.0))["objective"] is None


def test_a_deadline_holds_more_nodes_the_closer_it_is():
    # Spot at 0.9x: cost holds few nodes of 1 GPU; a deadline it cannot meet with them rents more.
    cfg = dict(spot_gpus=8, iterations=6)
    cost = run(small(objective="cost", **cfg), "spotlight_noexplore", (8.0, 7.2), fleet(8))
    fast = run(small(**cfg), "spotlight_noexplore", (8.0, 7.2), fleet(8))
    assert cost["spot_gpus_held_mean"] < fast["spot_gpus_held_mean"] and cost["wall_h"] > fast["wall_h"]
    assert cost["total_cost_usd"] < fast["total_cost_usd"]
    # the iterations left are the progress model's (177 at random seeds): the deadline is for them
    sim = make_simulation(small(objective="cost", **cfg), POLICIES["spotlight_noexplore"], fleet(8),
                          ProgressModel.calibrated(), (8.0, 7.2))
    per_iteration_h = fast["wall_h"] / 6 * sim.iterations_left(0) / 0.95  # a little slower than `time`'s pace
    late = run(small(objective="deadline", deadline_h=per_iteration_h, **cfg), "spotlight_noexplore", (8.0, 7.2),
               fleet(8))
    assert cost["spot_gpus_held_mean"] < late["spot_gpus_held_mean"]


def test_simulate_cli_objective(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("0,add,a\n0,add,b\n")
    args = ["simulate", "--trace", str(trace), "--gpus", "4", "--spot-gpus", "8", "--prompts", "8",
            "--iterations", "4", "--no-stop", "--policy", "ondemand,spotlight_noexplore,oracle"]
    assert cli.main(args + ["--objective", "cost", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)["policies"]
    assert out["ondemand"]["objective"] is None and out["oracle"]["objective"] == "cost"
    for r in out.values():
        assert r["spot_gpus_held_mean"] >= 0 and r["spot_releases"] >= 0
    assert cli.main(args + ["--objective", "deadline"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("spotlight: error: --deadline-h: required with --objective deadline "
                   "(the hours to reach the target in)")
    assert cli.main(args + ["--deadline-h", "3"]) == 2
    assert "--deadline-h: only with --objective deadline" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="objective: expected time, cost or deadline"):
        SimConfig(objective="fast")


def test_the_ondemand_gpus_are_chosen_by_the_closed_form():
    from spotlight.sim.rental import choose_ondemand, ondemand_candidates

    assert ondemand_candidates(16) == [1, 2, 4, 8, 16] and ondemand_candidates(12) == [1, 2, 4, 8, 12]
    assert ondemand_candidates(1) == [1]

    def rules(fixed_s, objective="cost", spot=P_OD):
        return {g: RentalRule(objective, IterationModel(g, R, W, fixed_s), 1, P_OD, spot) for g in (1, 2, 4, 8)}

    # Spot at the on-demand price holds no spot node; on the on-demand GPUs alone C(G) = p (R + W + G F):
    # the fewest GPUs, unless nothing is fixed (F = 0), when every count costs the same and the
    # tie goes to the most (sooner).
    assert choose_ondemand("cost", rules(F), offered=4) == 1
    assert choose_ondemand("cost", rules(0.0), offered=4) == 8
    assert choose_ondemand("time", rules(F), offered=4) == 8
    # A live rule's tolerance picks its spot nodes, not the on-demand count: with no spot on offer
    # the counts cost nearly alike, and holding all of them would be no cost choice.
    tolerant = {g: RentalRule("cost", IterationModel(g, R, W, F), 1, P_OD, P_OD, 0.0, 0.05) for g in (1, 2, 4, 8)}
    assert choose_ondemand("cost", tolerant, offered=0) == 1
    # A deadline: the cheapest count whose forecast fits — T(G) = (R + W) / G + F over 10 iterations.
    fits = {g: 10 * ((R + W) / g + F) for g in (1, 2, 4, 8)}
    assert choose_ondemand("deadline", rules(F, "deadline"), 4, horizon=10, seconds_left=fits[4]) == 4
    assert choose_ondemand("deadline", rules(F, "deadline"), 4, horizon=10, seconds_left=1.0) == 8  # none fits


def test_a_live_rule_holds_the_most_nodes_within_its_tolerance_of_the_cheapest():
    # The closed-form optimum is 6 nodes; a 5% tolerance takes the most within 5% of C(6).
    within = [n for n in range(41) if usd(n) <= 1.05 * usd(6)]
    assert rule(tolerance=0.05).nodes(held=0, available=40) == max(within) > 6
    assert rule(tolerance=0.0).nodes(held=0, available=40) == 6
