"""`experiments.validate_simulator`'s pieces without the live run (which takes minutes and a quiet
machine): the trace window and its mapping onto the cluster, the comparison and its table on
handmade figures, the step-time file it writes; and the live runtime's costs the simulator models
for it (`StepTimes` overheads, `host_cores`, `simulate_run` replaying as `train` does)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from experiments import validate_simulator as vs
from schedulers.clock import ManualClock
from schedulers.fleet import FleetEngine, Node
from schedulers.queue import PullQueue
from schedulers.request import Kind, Request
from schedulers.traces import Trace, TraceEvent, load_trace
from spotlight.config import default_config
from spotlight.sim.modelled_executor import ModelledExecutor
from spotlight.sim.run_config import simulate_run, simulated_config
from spotlight.sim.step_time import StepTimes, image_tokens


def _trace(*events: tuple[float, str, str]) -> Trace:
    return Trace([TraceEvent(t, a, n) for t, a, n in events], "handmade")


# ---- the trace window ---------------------------------------------------------------------------------

RECORDED = _trace((0, "add", "a"), (0, "add", "b"), (0, "add", "c"), (300, "remove", "a"), (400, "add", "d"),
                  (450, "add", "e"), (900, "remove", "d"))


def test_the_window_maps_a_removal_a_join_and_steady_nodes_onto_slots_in_order():
    w = vs.pick_window(RECORDED, 800.0, spot_nodes=3, start_s=20.0)
    assert w.nodes == ("a", "b", "c", "d") and w.start_s == 20.0
    # e is not mapped (one join is enough); d's removal at 900 is past the window's end (820).
    assert [(e.t_s, e.action, e.node) for e in w.trace.events] == [
        (0.0, "add", "a"), (0.0, "add", "b"), (0.0, "add", "c"), (280.0, "remove", "a"), (380.0, "add", "d")]
    assert w.trace.nodes == list(w.nodes) and w.trace.max_live == 3 and w.trace.duration_s == 800.0


def test_pick_window_finds_the_first_fit_and_says_when_there_is_none():
    w = vs.pick_window(RECORDED, 700.0, spot_nodes=3)  # a's removal at 35%: the window starts at 55
    assert w.start_s == pytest.approx(300 - 0.35 * 700) and w.nodes[0] == "a" and w.nodes[-1] == "d"
    with pytest.raises(ValueError, match="no window"):
        vs.pick_window(RECORDED, 700.0, spot_nodes=4)  # only b and c stay live throughout
    with pytest.raises(ValueError, match="not in slot order"):
        vs.trace_window(RECORDED, 20.0, 800.0, ["d", "a", "b", "c"])


def test_a_shipped_trace_has_a_window_for_the_default_run():
    w = vs.pick_window(load_trace(vs.TRACE), 2600.0)
    kinds = [e.action for e in w.trace.events]
    assert kinds.count("remove") == 1 and kinds.count("add") == vs.SPOT_NODES + 1
    removal = next(e for e in w.trace.events if e.action == "remove")
    join = next(e for e in w.trace.events if e.t_s > 0 and e.action == "add")
    assert removal.t_s == pytest.approx(vs.KILL_AT * 2600.0) and join.t_s >= removal.t_s


def test_the_cluster_plays_the_window_as_the_simulator_replays_it():
    w = vs.pick_window(RECORDED, 800.0, spot_nodes=3, start_s=20.0)
    actions = vs.cluster_actions(w.trace, speedup=10.0, notice_s=120.0, initial=3)
    # The starting nodes are the cluster's own: no add for them; a's notice 120 trace-s (12 s
    # here) before its removal; d is a fresh node for slot 3.
    assert [(a.at_s, a.slot, a.action) for a in actions] == [(16.0, 0, "notice"), (28.0, 0, "kill"), (38.0, 3, "add")]


# ---- the comparison ---------------------------------------------------------------------------------


def test_compare_judges_times_within_the_tolerance_and_counts_exactly():
    measured = {"s_per_iteration": 2.0, "rollout_s": 1.0, "reward_s": 0.03, "update_s": 0.9, "time_to_n_s": 60.0,
                "notices": 1, "removals": 1, "requests_given_back": 1, "gradient_bytes": 100}
    predicted = {"s_per_iteration": 2.4, "rollout_s": 1.3, "reward_s": 0.0, "update_s": 0.9, "time_to_n_s": 75.1,
                 "notices": 1, "removals": 1, "requests_given_back": 0, "gradient_bytes": 100}
    rows = {r.figure: r for r in vs.compare(predicted, measured)}
    assert rows["s_per_iteration"].ok and rows["s_per_iteration"].ratio == pytest.approx(1.2)
    assert rows["rollout_s"].ok is False  # 1.3x
    assert rows["time_to_n_s"].ok is False  # 75.1 / 60 = 1.25 + a hair
    assert rows["reward_s"].kind == "shown" and rows["reward_s"].ok is None  # 1.5% of the iteration
    assert rows["update_s"].ok and rows["notices"].ok and rows["gradient_bytes"].ok
    assert rows["requests_given_back"].ok is False and rows["requests_given_back"].ratio == 0.0
    assert vs.Row("steps_recomputed", 0, 0, "count").ratio == 1.0 and vs.Row("x", 1, 0, "count").ratio is None
    table = vs.markdown(list(rows.values()), {"date": "2026-11-28", "machine": "2 cores x86_64, CPU", "load": "0.3"})
    assert "| seconds per iteration (mean) | 2.400 | 2.000 | 1.20 | yes |" in table
    assert "| requests given back (notice) | 0 | 1 | 0.00 | **no** |" in table
    assert "(not judged)" in table and "- load: 0.3" in table and "2 cores x86_64, CPU" in table
    assert [r["figure"] for r in vs.as_json(list(rows.values()))] == list(rows)


def test_live_and_simulated_figures_are_read_alike():
    row = {"wall_s": 3.0, "time_rollout_s": 1.0, "time_reward_s": 0.1, "time_update_s": 1.8, "time_publish_s": 0.1,
           "gradient_parts": 8, "update_gradient_bytes": 80, "publish_bytes": 7}
    live = vs.live_figures({"rows": [{**row, "elapsed_s": 3.0}, {**row, "elapsed_s": 6.1}],
                            "queue": {"requests_given_back": 1, "requests_requeued": 2, "leases_expired": 0,
                                      "steps_recomputed": 3},
                            "fleet_events": {"notices": 1, "kills": 1, "workers_lost": 1, "spot_nodes_gone": 2}})
    sim = vs.sim_figures({"iterations_log": [{**row, "time_checkpoint_s": 5.0}, {**row, "time_checkpoint_s": 5.0}],
                          "requests_given_back": 1, "requests_requeued": 2, "steps_recomputed": 3,
                          "fleet_events": {"notices": 1, "kills": 2, "workers_lost": 1}}, publication_bytes=7)
    assert live["time_to_n_s"] == 6.1 and sim["time_to_n_s"] == 3.0 + 5.0 + 3.0  # the last checkpoint is after
    for key in ("s_per_iteration", "rollout_s", "update_s", *vs.COUNTS):
        assert live[key] == sim[key], key
    assert live["gradient_bytes"] == 160 and live["publish_bytes"] == 14 and live["removals"] == 2


def test_the_measured_figures_make_a_step_time_file(tmp_path):
    m = vs.Measured()
    m.set("denoise_step_s", 0.00105, "per sample")
    m.set("step_overhead_s", 0.0012, "a heartbeat")
    m.set("host_cores", 1.8, "4 / 2.2")
    m.set("update_round_s", 0.02, "the learner's fold and step")
    path = tmp_path / "st.yaml"
    path.write_text(vs.step_times_yaml(m, "2026-11-28", "2 cores x86_64, CPU"))
    st = StepTimes.load(path)
    assert (st.gpu, st.denoise_step_s, st.step_overhead_s, st.host_cores) == ("tiny-cpu", 0.00105, 0.0012, 1.8)
    assert st.update_round_s == 0.02 and not st.is_derived("update_round_s")
    assert "# a heartbeat" in path.read_text()


# ---- what the simulator models for it ----------------------------------------------------------------


def _one_worker(st: StepTimes, commit_every: int = 2, devices: int = 1) -> FleetEngine:
    clock = ManualClock()
    queue = PullQueue(clock, lease_s=1e15)
    executor = ModelledExecutor(clock, queue, st, 16, image_tokens(16), commit_every=commit_every, join_s=0.0,
                                pending_per_iteration=1, ondemand_devices=devices)
    engine = FleetEngine(clock, queue, executor, [Node("ondemand0", spot=False, devices=devices)])
    engine.start()
    return engine


def _rollout_s(engine: FleetEngine, requests: int, seeds: int = 4) -> float:
    start = engine.clock.now()
    engine.rollout([Request(f"r{k}", Kind.ROLLOUT, k, "", tuple(range(seeds)), weight_version=0)
                    for k in range(requests)], 0)
    return engine.clock.now() - start


TINY = replace(StepTimes.profile("tiny-cpu"), heads=1)


def test_a_request_pays_its_heartbeats_commits_and_calls():
    bare = _rollout_s(_one_worker(TINY), 1)
    assert bare == pytest.approx(8 * 4 * TINY.denoise_step_s + 4 * TINY.reward_s_per_sample)
    st = replace(TINY, step_overhead_s=0.001, commit_overhead_s=0.002, request_overhead_s=0.01)
    # 8 steps, a heartbeat each; commits at steps 2, 4 and 6 (every 2, not the last); one pull and completion.
    assert _rollout_s(_one_worker(st), 1) == pytest.approx(bare + 8 * 0.001 + 3 * 0.002 + 0.01)
    assert _rollout_s(_one_worker(st, commit_every=1000), 1) == pytest.approx(bare + 8 * 0.001 + 0.01)


def test_devices_sharing_the_host_cores_slow_down_together():
    alone = _rollout_s(_one_worker(TINY, devices=1), 4)  # 4 requests one after the other
    shared = replace(TINY, host_cores=2.0)
    assert _rollout_s(_one_worker(shared, devices=1), 4) == pytest.approx(alone)  # one device fits the cores
    # 4 devices on 2 cores: the 4 requests at once, each at half speed: half the time of one device alone.
    assert _rollout_s(_one_worker(shared, devices=4), 4) == pytest.approx(alone / 2)
    # 6 requests on 4 devices: a wave of 4 at half speed, then the last 2 alone on their cores.
    one = alone / 4
    assert _rollout_s(_one_worker(shared, devices=4), 6) == pytest.approx(2 * one + one)
    assert TINY.slowdown(8) == 1.0 and shared.slowdown(1) == 1.0 and shared.slowdown(5) == 2.5


def test_a_simulated_run_config_replays_its_trace_and_requests_as_train_does():
    run = default_config({"warm_start": {"steps": 0}, "runtime": {"kind": "ray", "spot_workers": 2, "commit_every": 3,
                                                                  "trace_speedup": 10.0, "notice_s": 60.0}})
    cfg, _ = simulated_config(run)
    assert (cfg.samples_per_request, cfg.commit_every, cfg.notice_s) == (run.train.group_size, 3, 6.0)
    assert cfg.join_s == cfg.step_times.cold_start_s  # a tiny node starts as the tiny model's cold start
    measured = replace(StepTimes.profile("tiny-cpu"), step_overhead_s=0.002)
    assert simulated_config(run, measured)[0].step_times.step_overhead_s == 0.002
    trace = _trace((0, "add", "a"), (0, "add", "b"), (5, "remove", "a"))
    result = simulate_run(replace(run, train=replace(run.train, steps=2)), trace)  # ~1.3 simulated seconds
    # Replayed 10x faster: the removal at 0.5 s, inside the run, its notice 6 s before (at 0: a's join).
    assert result["fleet_events"] == {"notices": 1, "kills": 1, "workers_lost": 0}
    assert result["policies"]["config"]["preemption_times_h"] == [0.5 / 3600]


def test_a_gradient_request_pays_its_own_overhead_not_a_rollout_requests():
    run = default_config({"warm_start": {"steps": 0}, "train": {"steps": 1, "update_on": "fleet"},
                          "runtime": {"kind": "ray", "spot_workers": 2}})
    trace = _trace((0, "add", "a"), (0, "add", "b"))
    base = StepTimes.profile("tiny-cpu")

    def phases(**over) -> dict[str, float]:
        (row,) = simulate_run(run, trace, step_times=replace(base, **over))["policies"]["config"]["iterations_log"]
        return {p: row[f"time_{p}_s"] for p in ("rollout", "reward", "update")}

    bare = phases()
    # 64 samples x 8 SDE steps in micro-batches of 64: 8 a round, one request of 8 a round, 2 rounds.
    assert phases(train_request_overhead_s=0.1)["update"] == pytest.approx(bare["update"] + 2 * 0.1)
    slower = phases(request_overhead_s=0.1, reward_call_s=0.05)
    assert slower["update"] == pytest.approx(bare["update"]) and slower["reward"] == pytest.approx(0.05)
    assert slower["rollout"] > bare["rollout"] + 0.1  # 8 requests of a prompt's 8 samples on 3 workers


def test_the_shipped_measured_figures_load():
    st = StepTimes.load(vs.HERE / "step_times" / "cpu-2core-tiny.yaml")
    assert st.gpu == "tiny-cpu" and st.host_cores > 1 and st.step_overhead_s > 0 and st.request_overhead_s > 0
    assert not st.is_derived("update_round_s") and st.reward_s_per_sample == 0


@pytest.mark.slow
def test_the_script_runs_a_short_validation_end_to_end(tmp_path):
    """4 iterations on the loopback cluster with the shipped figures (no measuring): the trace's
    notice, removal and join are played on the cluster, the run loses the node, and both sides
    count the same gradients and bytes. (The notice's count is left alone: at 60x its 2 s may end
    before the run's once-a-second look at the cluster sees the drain.)"""
    import json

    out = tmp_path / "validation"
    assert vs.main(["--out", str(out), "--iterations", "4", "--speedup", "60",
                    "--step-times", str(vs.HERE / "step_times" / "cpu-2core-tiny.yaml")]) == 0
    result = json.loads((out / "comparison.json").read_text())
    rows = {r["figure"]: r for r in result["rows"]}
    assert [p["action"] for p in result["played"]] == ["notice", "kill", "add"]
    assert rows["removals"]["measured"] == rows["removals"]["predicted"] == 1
    for figure in ("gradients", "gradient_bytes", "publish_bytes"):
        assert rows[figure]["ok"], rows[figure]
    assert rows["gradients"]["measured"] == 4 * 2 * 4  # 4 iterations x 2 rounds x 4 requests
    assert "| seconds per iteration (mean) |" in (out / "comparison.md").read_text()
