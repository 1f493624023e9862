import json
import math

import pytest

from spotlight import cli
from spotlight.sim.progress_model import ProgressModel
from spotlight.sim.simulator import BASELINES, POLICIES, SimConfig, gpu_prices, make_simulation, simulate
from spotlight.sim.step_time import StepTimes
from schedulers.traces import Trace, TraceEvent

FIELDS = ("time_to_target_h", "cost_usd", "gpu_utilization", "preemptions", "steps_recomputed")


def fleet(nodes: int, remove_at: float | None = None) -> Trace:
    events = [TraceEvent(0.0, "add", f"n{k}") for k in range(nodes)]
    if remove_at is not None:
        events += [TraceEvent(remove_at, "remove", f"n{k}") for k in range(nodes)]  # every node at once
    return Trace(events, "handmade", end_s=remove_at)


def small(**kw) -> SimConfig:
    # The update's grain: micro-batches of 8 rows (4 samples x 2 SDE steps), one per request, so 32
    # samples make 8 single-part requests (test_node_crews.py covers requests of several parts).
    base = dict(gpus=4, spot_gpus=4, prompts=8, group_size=4, samples_per_request=4, iterations=3,
                candidates_per_prompt=8, plan_prompts=4, stop_at_target=False, micro_batch=8, parts_per_request=1)
    return SimConfig(**{**base, **kw})


def test_no_preemptions_takes_the_time_the_step_model_gives_by_hand():
    from dataclasses import replace

    st = replace(StepTimes(), update_round_s=0.5)  # short enough that spotlight_noexplore trains on the fleet
    t1 = 0.043227  # degree 1 at 512 px (1024 tokens) on an H100: the measured step the model is fitted to
    request = 4 * st.denoise_steps * st.cfg_factor * t1 + 4 * st.reward_s_per_sample  # 4 samples per request
    train = 8 * 4 * st.trained_steps * st.train_flops_factor * st.cfg_factor * t1 / (4 * st.train_efficiency)
    out = simulate(small(step_times=st), fleet(4), ["ondemand", "spotlight_noexplore"])["policies"]
    # 8 requests: on 4 on-demand GPUs (degree 1) two rounds, with 4 more spot GPUs one round
    assert out["ondemand"]["wall_h"] * 3600 == pytest.approx(3 * (2 * request + train + st.weight_sync_s), rel=1e-9)
    # Its update on the fleet: 8 micro-batches of 4 samples' work, one on each GPU, every one at
    # fleet_update_efficiency (no data-parallel efficiency: no FSDP), then the learner's gather-and-step.
    fleet_train = train * st.train_efficiency * 4 / 8 / st.fleet_update_efficiency + st.update_round_s
    assert out["spotlight_noexplore"]["wall_h"] * 3600 == pytest.approx(3 * (request + fleet_train + st.weight_sync_s),
                                                                        rel=1e-9)
    assert out["spotlight_noexplore"]["preemptions"] == 0 and out["spotlight_noexplore"]["steps_recomputed"] == 0
    # cost: 4 on-demand GPUs for the whole run, plus 4 spot ones for the spot policy
    od, spot, _ = gpu_prices(small())
    assert out["ondemand"]["total_cost_usd"] == pytest.approx(4 * od * out["ondemand"]["wall_h"])
    assert out["spotlight_noexplore"]["total_cost_usd"] == pytest.approx(
        (4 * od + 4 * spot) * out["spotlight_noexplore"]["wall_h"])


@pytest.mark.parametrize("notice_s", [120.0, 0.0])
def test_every_spot_node_dying_at_once_still_finishes_on_ondemand(notice_s):
    cfg = small(iterations=20, spot_gpus=8, notice_s=notice_s)
    out = simulate(cfg, fleet(4, remove_at=150.0))["policies"]  # mid-run (an iteration takes ~8-30 s)
    for name, r in out.items():
        assert r["requests_duplicated"] == 0, name
        if POLICIES[name].spot:
            assert r["preemptions"] == 4, name
        if POLICIES[name].ondemand_gpus == 0:  # all spot (managed_restart): nothing left to finish on
            assert r["stop_reason"] == "no_capacity" and 0 < r["iterations"] < 20, name
            continue
        assert r["iterations"] == 20, name
    assert out["spotlight"]["wall_h"] < out["ondemand"]["wall_h"] * 1.01
    if notice_s > 0:  # work in flight at the notice is given back at a step boundary: nothing redone
        assert out["spotlight_noexplore"]["steps_recomputed"] == 0


def test_same_seed_same_result_and_fields():
    from schedulers.trace_synth import open_trace

    trace = open_trace("synth:poisson?nodes=4&rate_h=30&burst_rate_h=4&burst_size=2&return_s=120&hours=2&seed=3")
    cfg = small(iterations=8, spot_gpus=8, seed=5)
    a, b = simulate(cfg, trace), simulate(cfg, trace)
    assert json.dumps(a) == json.dumps(b)
    assert set(a["policies"]) == set(POLICIES)
    for r in a["policies"].values():
        assert set(FIELDS) <= set(r)
    assert a["policies"]["oracle"]["wall_h"] <= a["policies"]["spotlight"]["wall_h"]


def test_simulate_cli_json(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("0,add,a\n0,add,b\n600000,remove,a\n900000,add,c\n")
    png = tmp_path / "sim.png"
    rc = cli.main(["simulate", "--trace", str(trace), "--gpus", "4", "--spot-gpus", "8", "--prompts", "8",
                   "--iterations", "40", "--iterations-scale", "0.1", "--json", "--plot", str(png)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["policies"]) == {"ondemand", "ondemand_total", "spot_restart", "managed_restart",
                                    "spotlight_noexplore", "sync_explore", "spotlight_learner_update",
                                    "near_all_spot", "spotlight", "oracle"}
    assert BASELINES == ("ondemand", "ondemand_total", "near_all_spot", "managed_restart")
    assert out["config"]["price_source"] and out["config"]["ondemand_total_gpus"] == 4 + 8
    for name, r in out["policies"].items():
        assert set(FIELDS) <= set(r), name
        assert r["time_to_target_h"] > 0 and r["cost_usd"] > 0, name  # the target is reached within 40
        assert 0 < r["gpu_utilization"] <= 1
        for b in BASELINES:  # every policy against every baseline, all reached the target here
            assert r[f"speedup_vs_{b}"] > 0 and r[f"cost_ratio_vs_{b}"] > 0, (name, b)
            assert r[f"speedup_vs_{b}"] == pytest.approx(
                out["policies"][b]["time_to_target_h"] / r["time_to_target_h"], rel=1e-12)
            assert r[f"cost_ratio_vs_{b}"] == pytest.approx(r["cost_usd"] / out["policies"][b]["cost_usd"], rel=1e-12)
    assert out["policies"]["ondemand"]["speedup_vs_ondemand"] == 1.0
    assert out["policies"]["ondemand"]["cost_ratio_vs_ondemand"] == 1.0
    assert png.stat().st_size > 10_000
    rc = cli.main(["simulate", "--trace", str(trace), "--gpus", "4", "--spot-gpus", "8", "--prompts", "8",
                   "--iterations", "40", "--iterations-scale", "0.1", "--policy", "ondemand,spotlight"])
    text = capsys.readouterr().out
    assert rc == 0 and "spotlight" in text and "cost vs ondemand" in text
    assert "vs ondemand_total" not in text  # not simulated in this run: no column


def test_bad_trace_is_one_error_line_with_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("0,add,a\n5000,explode,a\n")
    assert cli.main(["simulate", "--trace", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"spotlight: error: {bad}:2: unknown event 'explode' (expected add or remove)"
    assert cli.main(["simulate", "--trace", "synth:poisson?nodes=zero"]) == 2
    assert "nodes" in capsys.readouterr().err


def test_progress_model_is_calibrated_on_the_ablation():
    m = ProgressModel.calibrated(iterations_scale=1.0)
    def iterations(signal):
        gain, k = 0.0, 0
        while not m.reached(gain):
            gain, k = gain + m.gain(signal), k + 1
        return k
    assert iterations(m.s_ref) == math.ceil(17.667 - 1e-9)  # the random arm's 17.7 iterations
    assert m.iterations_at(0.14050) == pytest.approx(13.333, abs=1e-3)  # the bandit arm's, which it is fit on
    assert 0.45 < m.alpha < 0.55
    # the held-out uniform arm: 13.7 iterations measured, within 5% predicted
    v = m.validation()
    assert v["arm"] == "uniform" and v["iterations_measured"] == pytest.approx(41 / 3)
    assert abs(v["error"]) < 0.05 and v["iterations_predicted"] == pytest.approx(m.iterations_at(v["group_std"]))


def test_scale_smoke():
    from experiments.simulate_scale import TRACE, looped, run_scale
    from schedulers.traces import load_trace

    r = run_scale(gpus=64, iterations=70)  # ~0.7 simulated hours: past the trace's first removals (2,040 s)
    assert r["iterations"] == 70 and r["seconds"] > 0 and r["requests_per_iteration"] == 16
    assert r["preemptions"] > 0 and 0 < r["last_preemption_h"] <= r["simulated_hours"] <= r["churn_until_h"]
    assert r["regroups"] > 0 and r["explored_samples"] > 0 and r["requests_requeued"] >= 0
    assert 0 <= r["fleet_update_iterations"] <= 70
    # The loop keeps the trace's churn and its peak (which sizes the spot blocks): bamboo-p3 ends
    # with 10 of its 18 starting nodes live, so each wrap is 8 joins and no removal.
    trace = load_trace(TRACE)
    loop = looped(trace, 3 * trace.duration_s)
    assert loop.max_live == trace.max_live and loop.preemptions == 3 * trace.preemptions
    live = dict(loop.live_over_time())
    assert live[trace.duration_s] == live[2 * trace.duration_s] == live[0.0] == 18


def test_a_budget_stops_every_policy_but_the_oracle_before_it_is_exceeded():
    from schedulers.trace_synth import open_trace

    trace = open_trace("synth:poisson?nodes=4&rate_h=30&burst_rate_h=4&burst_size=2&return_s=120&hours=2&seed=3")
    free = simulate(small(iterations=40, spot_gpus=8), trace)["policies"]
    budget = 0.5 * free["ondemand"]["total_cost_usd"]  # half of what 40 iterations on-demand cost
    capped = simulate(small(iterations=40, spot_gpus=8, budget_usd=budget), trace)["policies"]
    for name, r in capped.items():
        if name == "oracle":  # a bound: it ignores the budget
            assert r == free[name]
            continue
        assert r["stop_reason"] == "budget" and r["total_cost_usd"] <= budget, name
        # the restart baselines keep a cold start + restore in reserve (Simulation._cost_control): on
        # this churn (30 preemptions an hour) a relaunch costs more than the budget leaves them
        restarts = name in ("spot_restart", "managed_restart")
        assert 0 <= r["iterations"] < 40 and (r["iterations"] > 0 or restarts), name
    # a budget that does not bind changes nothing
    roomy = simulate(small(iterations=40, spot_gpus=8, budget_usd=1e9), trace)["policies"]
    assert json.dumps(roomy) == json.dumps(free)
    assert {r["stop_reason"] for r in free.values()} == {"iterations"}
    with pytest.raises(Exception, match="budget_usd: expected a number > 0"):
        small(budget_usd=-1.0)


def test_baseline_fields_only_for_baselines_simulated_and_null_without_the_target():
    out = simulate(small(iterations=2, stop_at_target=True), fleet(4), ["spotlight", "ondemand"])["policies"]
    for r in out.values():  # two iterations reach no target: the ratios are there, and null
        assert r["time_to_target_h"] is None
        assert {k for k in r if k.startswith(("speedup_vs_", "cost_ratio_vs_"))} == {
            "speedup_vs_ondemand", "cost_ratio_vs_ondemand"}
        assert r["speedup_vs_ondemand"] is None and r["cost_ratio_vs_ondemand"] is None


def test_ondemand_total_rents_the_spot_peak_on_demand():
    # 3 trace nodes at the peak, 8 spot GPUs: blocks of 2, so the spot fleet peaks at 6 GPUs
    trace = Trace([TraceEvent(0.0, "add", f"n{k}") for k in range(3)] + [TraceEvent(50.0, "remove", "n0")], "handmade")
    res = simulate(small(spot_gpus=8), trace, ["ondemand", "ondemand_total"])
    out, od = res["policies"], gpu_prices(small())[0]
    assert res["config"]["ondemand_total_gpus"] == 4 + 6
    total = out["ondemand_total"]
    assert total["preemptions"] == 0 and {n for _, n in total["timeline"]} == {10}  # never preempted
    assert total["total_cost_usd"] == pytest.approx(10 * od * total["wall_h"], rel=1e-9)  # every GPU on-demand
    # every GPU rolls out (8 requests on 10 GPUs at degree 1: one round, not ondemand's two) and trains
    from dataclasses import replace

    st = replace(StepTimes(), update_round_s=0.5)  # short enough that spotlight_noexplore trains on the fleet
    t1 = 0.043227  # as in the first test: degree 1 at 512 px on an H100, measured
    request = 4 * st.denoise_steps * st.cfg_factor * t1 + 4 * st.reward_s_per_sample
    train = 8 * 4 * st.trained_steps * st.train_flops_factor * st.cfg_factor * t1 / (10 * st.train_efficiency)
    assert total["wall_h"] * 3600 == pytest.approx(3 * (request + train + st.weight_sync_s), rel=1e-9)


def test_spot_restart_pays_only_for_the_nodes_its_job_holds():
    st, (od, spot, _) = StepTimes(), gpu_prices(small())
    # n0 and n1 from the start; n2 joins at 40 s and, with no preemption, is never the job's
    joins_late = Trace([TraceEvent(0.0, "add", "n0"), TraceEvent(0.0, "add", "n1"), TraceEvent(40.0, "add", "n2")],
                       "handmade")
    r = simulate(small(spot_gpus=6, iterations=6), joins_late, ["spot_restart"])["policies"]["spot_restart"]
    assert r["restarts"] == 0 and r["wall_h"] * 3600 > 40
    assert r["total_cost_usd"] == pytest.approx((4 * od + 2 * 2 * spot) * r["wall_h"], rel=1e-9)
    # n0 dies at 80 s: the job restarts (cold start + restore) on n1 and n2, from then on paying for both
    restart = Trace(joins_late.events + [TraceEvent(80.0, "remove", "n0")], "handmade")
    r = simulate(small(spot_gpus=6, iterations=12), restart, ["spot_restart"])["policies"]["spot_restart"]
    assert r["restarts"] == 1
    back = 80.0 + st.cold_start_s + st.restore_s
    end = r["wall_h"] * 3600
    assert end > back
    spot_gpu_s = 2 * 2 * 80.0 + 1 * 2 * (back - 80.0) + 2 * 2 * (end - back)
    assert r["total_cost_usd"] == pytest.approx((4 * od * end + spot * spot_gpu_s) / 3600, rel=1e-9)
    # the paid GPUs it reports (the timeline) are the same ones
    points = [(t * 3600, n) for t, n in r["timeline"]] + [(end, 0)]
    paid_gpu_s = sum(n * (t1 - t0) for (t0, n), (t1, _) in zip(points, points[1:]))
    assert paid_gpu_s == pytest.approx(4 * end + spot_gpu_s, rel=1e-9)


def test_spot_gpus_computing_the_update_shorten_every_iteration_and_the_oracle_bounds_it():
    from dataclasses import replace

    cfg = small(iterations=6, spot_gpus=12, prompts=16, step_times=replace(StepTimes(), update_round_s=0.5))
    out = simulate(cfg, fleet(4, remove_at=140.0), ["spotlight_learner_update", "spotlight", "oracle"])["policies"]
    alone, fleet_update, oracle = (out[p] for p in ("spotlight_learner_update", "spotlight", "oracle"))
    assert fleet_update["wall_h"] < alone["wall_h"]
    assert oracle["wall_h"] <= fleet_update["wall_h"]
    # Nodes removed mid-run (during updates too): every micro-batch counted once, none lost.
    assert fleet_update["preemptions"] == 4 and fleet_update["requests_duplicated"] == 0
    assert fleet_update["iterations"] == 6


def test_the_fleet_computes_the_update_only_where_that_is_sooner():
    from dataclasses import replace

    # A short update next to the learner's gather-and-step (given: 10 s after a round's compute): the
    # on-demand GPUs alone are sooner, so every iteration trains as spotlight_learner_update does.
    slow = small(iterations=4, spot_gpus=12, step_times=replace(StepTimes(), update_round_s=10.0))
    out = simulate(slow, fleet(4), ["spotlight_learner_update", "spotlight"])
    alone, fleet_update = out["policies"]["spotlight_learner_update"], out["policies"]["spotlight"]
    assert fleet_update["wall_h"] == pytest.approx(alone["wall_h"], rel=1e-9)


def test_the_spot_gpus_compute_the_update_only_where_that_pays_more_than_exploring():
    """`spotlight` prices the two uses of the spot GPUs during an update in seconds per unit of
    progress: a fleet update barely sooner than the on-demand GPUs' loses to exploring through
    their whole update; a policy that does not explore only asks which is sooner."""
    sims = {name: make_simulation(small(), POLICIES[name], fleet(4), ProgressModel.calibrated(), (1.0, 0.5))
            for name in ("spotlight", "spotlight_noexplore")}
    st = sims["spotlight"].st
    train_s, rollout_s, spot = 60.0, 30.0, 4
    barely = train_s - 1.0  # one second sooner, and the spot GPUs explore only for update_round_s
    assert sims["spotlight_noexplore"].fleet_update_pays(barely, train_s, rollout_s, spot)
    assert not sims["spotlight"].fleet_update_pays(barely, train_s, rollout_s, spot)
    assert sims["spotlight"].fleet_update_pays(st.update_round_s + 5.0, train_s, rollout_s, spot)
    # no spot GPU to explore with: only the seconds count
    assert sims["spotlight"].fleet_update_pays(barely, train_s, rollout_s, 0)
    # exploring more raises the expected signal, and never lowers it
    rewards = sims["spotlight"].rewards
    signals = [rewards.expected_std(e, 8) for e in (0, 2, 4, 6, 8, 8.5)]
    assert signals == sorted(signals) and signals[-1] > 1.05 * signals[0] and signals[-1] == signals[-2]


def test_a_run_reports_how_many_updates_the_fleet_computed():
    from dataclasses import replace

    names = ["spotlight_noexplore", "ondemand", "oracle"]
    # this small update takes ~6 s on the on-demand GPUs: a 10 s gather-and-step makes the fleet's
    # slower, half a second makes it sooner
    slow = simulate(small(step_times=replace(StepTimes(), update_round_s=10.0)), fleet(4), names)["policies"]
    fast = simulate(small(step_times=replace(StepTimes(), update_round_s=0.5)), fleet(4), names)["policies"]
    assert [slow[n]["fleet_update_iterations"] for n in names] == [0, 0, 0]
    assert [fast[n]["fleet_update_iterations"] for n in names] == [3, 0, 3]


def test_the_constant_sets_vary_shipped_figures_and_keep_given_ones(monkeypatch):
    from dataclasses import replace

    from spotlight.sim import assumptions
    from spotlight.sim.assumptions import SETS, apply, describe

    cfg = SimConfig()
    pes, typ, opt = (apply(s, cfg) for s in SETS)
    assert typ == cfg  # typical is the shipped figures
    assert (pes.step_times.fleet_update_efficiency, opt.step_times.fleet_update_efficiency) == (0.5, 0.95)
    assert pes.join_s > typ.join_s > opt.join_s and pes.step_times.cold_start_s > opt.step_times.cold_start_s
    # the transfers are derived again from the links each set assumes
    for field in ("weight_sync_s", "update_round_s"):
        assert pes.step_times.is_derived(field) and opt.step_times.is_derived(field)
        assert getattr(pes.step_times, field) > getattr(typ.step_times, field) > getattr(opt.step_times, field)
    full = SimConfig(step_times=StepTimes.profile("qwen-image-full"))  # its own restore (120 s), scaled
    assert [apply(s, full).step_times.restore_s for s in SETS] == pytest.approx([480.0, 120.0, 48.0])
    # a figure given by a file or a caller is the run's own in every set, and said to be
    given = small(step_times=replace(StepTimes(), fleet_update_efficiency=0.6, update_round_s=0.5))
    assert {apply(s, given).step_times.fleet_update_efficiency for s in SETS} == {0.6}
    assert {apply(s, given).step_times.update_round_s for s in SETS} == {0.5}
    told = describe(given)
    assert told["pessimistic"]["fleet_update_efficiency"]["given"] and told["pessimistic"]["update_round_s"]["given"]
    assert told["pessimistic"]["join_s"]["value"] == 540.0 and told["pessimistic"]["join_s"]["source"]
    assert told["optimistic"]["weight_sync_s"]["derived"]
    # the measured profile assumes nothing: three identical sets
    tiny = SimConfig(step_times=StepTimes.profile("tiny-cpu"))
    assert all(apply(s, tiny) == tiny for s in SETS)
    # a constant naming a field that is gone fails loudly
    gone = replace(assumptions.CONSTANTS[0], field="fleet_efficiency")
    monkeypatch.setattr(assumptions, "CONSTANTS", (gone,))
    with pytest.raises(ImportError, match="fleet_efficiency is not a field of StepTimes"):
        assumptions._shipped()


def test_every_answer_is_a_range_over_the_constant_sets_and_the_plot_shows_the_runs(tmp_path, capsys):
    from spotlight.sim.assumptions import SETS
    from spotlight.sim.report import cumulative_cost, plot_simulation, table, verdict

    # n0 is preempted at 100 s and n4 joins at 200 s; the trace goes on to 10 h, far past the runs
    trace = Trace([TraceEvent(0.0, "add", f"n{k}") for k in range(4)]
                  + [TraceEvent(100.0, "remove", "n0"), TraceEvent(200.0, "add", "n4"),
                     TraceEvent(36_000.0, "remove", "n1")], "handmade")
    cfg = small(iterations=40, spot_gpus=8, iterations_scale=1.0, stop_at_target=True)
    names = ["ondemand", "spotlight", "oracle"]
    full = simulate(cfg, trace, names)
    one = simulate(cfg, trace, names, constants="typical")
    assert json.dumps(one["policies"]) == json.dumps(full["policies"])  # typical stays in "policies"
    spot = full["ranges"]["spotlight"]
    assert set(spot) == {"time_to_target_h", "cost_usd", "speedup_vs_ondemand", "cost_ratio_vs_ondemand"}
    for field, by_set in spot.items():
        assert list(by_set) == list(SETS) and by_set["typical"] == full["policies"]["spotlight"][field], field
    hours = spot["time_to_target_h"]
    assert hours["pessimistic"] > hours["typical"] > hours["optimistic"]
    assert list(full["assumptions"]) == list(SETS) and list(one["assumptions"]) == ["typical"]
    assert {len(v) for r in one["ranges"].values() for v in r.values()} == {1}
    # the line under the table, with the range
    printed = table(full).splitlines()
    start = next(i for i, l in enumerate(printed) if l.startswith("spotlight: "))
    line = " ".join([printed[start]] + [l.strip() for l in printed[start + 1:] if l.startswith("  ")][:1])
    s = spot["speedup_vs_ondemand"]
    assert line.startswith(f"spotlight: {s['typical']:.2f}x sooner than ondemand ({min(s.values()):.2f}-"
                           f"{max(s.values()):.2f}x over the pessimistic-to-optimistic constants), ")
    # the plot: score, dollars, live GPUs; the verdict under it; hours to the longest run's end
    fig = plot_simulation(full, tmp_path / "sim.png")
    assert (tmp_path / "sim.png").stat().st_size > 10_000
    assert [ax.get_ylabel() for ax in fig.axes] == ["dollars to target", "validation score (model)", "dollars spent",
                                                    "live GPUs (paid)"]
    said = verdict(full)
    assert said.startswith("spotlight reaches the target") and "over the constant sets" in said
    assert [t.get_text().replace("\n", " ").replace(r"\$", "$") for t in fig.texts] == [said]  # the headline
    longest = max(r["wall_h"] for r in full["policies"].values())
    assert fig.axes[3].get_xlim() == pytest.approx((0.0, 1.02 * longest)) and longest < 1.0
    assert [t.get_text() for t in fig.axes[3].get_legend().get_texts()] == ["1 preemption in the longest spot run"]
    for name, r in full["policies"].items():  # each dollar curve ends where its run does, at what it spent
        assert cumulative_cost(r, full["config"])[-1] == pytest.approx((r["wall_h"], r["total_cost_usd"]), rel=1e-9)
    assert full["policies"]["spotlight"]["preemption_times_h"] == [100.0 / 3600]
    assert full["policies"]["ondemand"]["preemption_times_h"] == []
    # the docs' table row (experiments/simulator_table.py): typical (range), a column per baseline compared with
    from experiments.simulator_table import header, row

    assert header(full, "spotlight")[0] == ("| trace | spot GPUs at peak | available | `spotlight` to target | "
                                            "its cost | vs `ondemand` | oracle gap |")
    cells = row("handmade", full, "spotlight").strip("| ").split(" | ")
    c = spot["cost_ratio_vs_ondemand"]
    r = full["policies"]["spotlight"]  # the spot GPUs live on average over its run, over the peak
    points = [(t, n) for t, n in r["timeline"] if t <= r["time_to_target_h"]] + [(r["time_to_target_h"], 0)]
    live = sum(n * (t1 - t0) for (t0, n), (t1, _) in zip(points, points[1:])) / r["time_to_target_h"]
    assert cells[2] == f"{(live - full['config']['gpus']) / full['config']['spot_gpus_peak']:.0%}"
    assert cells[5] == (f"{s['typical']:.2f}x ({min(s.values()):.2f}-{max(s.values()):.2f}) / "
                        f"{c['typical']:.2f} ({min(c.values()):.2f}-{max(c.values()):.2f})")
    # --constants typical from the command line
    path = tmp_path / "t.csv"
    path.write_text("0,add,a\n0,add,b\n")
    assert cli.main(["simulate", "--trace", str(path), "--gpus", "4", "--prompts", "8", "--iterations", "2",
                     "--policy", "ondemand", "--constants", "typical", "--json"]) == 0
    assert list(json.loads(capsys.readouterr().out)["assumptions"]) == ["typical"]
