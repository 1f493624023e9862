"""Prices and cost-budgeted runs: the price table and its refreshes, the cost meter, the budget and
deadline policies on a ManualClock, and short tiny runs whose budget binds (`cloud.price_scale`)."""

import json
import random
from datetime import datetime, timezone

import pytest
import torch

from cloud.cost import (BudgetPolicy, CostControl, CostMeter, DeadlinePolicy, Fleet, Forecast, PRIOR_FACTOR,
                        STOP_SLACK_S, Spent, load_spent, save_spent)
from spotlight.iteration.iteration_time import iteration_seconds_lower_bound
from cloud.prices import COLUMNS, OPTIONAL_COLUMNS, PriceError, PriceTable, refresh_from_aws
from schedulers.clock import ManualClock
from spotlight.cli import main
from spotlight.train.cost_control import cost_control, fleet_of
from spotlight.config import ConfigError, to_yaml
from spotlight.train.trainer import Trainer

from conftest import small_dit_config
from s3_server import s3, s3_server  # noqa: F401 (fixtures)

HEADER = ",".join(COLUMNS)
ROW_H100 = "aws,p5.48xlarge,H100,8,55.04,24.77,aws list,2025-06-05"
ROW_L4 = "gcp,g2-standard-4,L4,1,0.7068,0.2827,gcp page,2025-06-05"


def _table(tmp_path, *lines, header=HEADER):
    path = tmp_path / "prices.csv"
    path.write_text("\n".join([header, *lines]) + "\n")
    return path


def _today():
    return datetime.now(timezone.utc).strftime("%Y-%m-%d")


# ---- the price table ----------------------------------------------------------------------------


def test_shipped_table_covers_the_common_gpus_with_a_source_and_date_per_row():
    table = PriceTable.load()
    assert {"H100", "A100", "A100-80GB", "A10G", "L4", "V100", "T4"} <= set(table.gpus())
    names = {r.instance_type for r in table.rows()}
    assert {"p5.48xlarge", "p4d.24xlarge", "p4de.24xlarge", "g5.xlarge", "g6.xlarge", "p3.2xlarge", "g4dn.xlarge",
            "a3-highgpu-8g", "a2-highgpu-1g", "g2-standard-4"} <= names
    for r in table.rows():
        assert r.source and datetime.strptime(r.date, "%Y-%m-%d")
        assert 0 < r.spot_usd_h < r.ondemand_usd_h


def test_node_price_takes_the_exact_row_else_scales_the_cheapest_per_gpu(tmp_path):
    table = PriceTable.load(_table(tmp_path, ROW_H100, ROW_L4, "gcp,a3-highgpu-8g,H100,8,88.25,26.47,gcp,2025-06-05"))
    one = table.node_price("h100", 1)  # names match case-insensitively
    assert one.row.instance_type == "p5.48xlarge"
    assert one.ondemand_usd_h == pytest.approx(55.04 / 8) and one.spot_usd_h == pytest.approx(24.77 / 8)
    assert table.node_price("H100", 8).ondemand_usd_h == pytest.approx(55.04)
    pinned = table.node_price("H100", 8, "a3-highgpu-8g")
    assert pinned.row.instance_type == "a3-highgpu-8g" and pinned.spot_usd_h == pytest.approx(26.47)
    with pytest.raises(PriceError, match=r"'g2-standard-4' has L4 GPUs, not H100"):
        table.node_price("H100", 1, "g2-standard-4")
    with pytest.raises(PriceError, match=r"unknown instance type 'p9.huge'"):
        table.node_price("H100", 1, "p9.huge")


def test_an_unknown_gpu_is_one_line_listing_the_known_ones(tmp_path):
    table = PriceTable.load(_table(tmp_path, ROW_H100, ROW_L4))
    with pytest.raises(PriceError) as err:
        table.rows("H800")
    assert str(err.value) == f"unknown GPU 'H800': the price table ({tmp_path / 'prices.csv'}) knows H100, L4"


@pytest.mark.parametrize("lines, header, expected", [
    ([ROW_H100], HEADER.replace(",spot_usd_h", ""), r"line 1: missing column 'spot_usd_h' \(expected columns "),
    (["aws,p5.48xlarge,H100,8,cheap,24.77,aws list,2025-06-05"], HEADER,
     r"line 2: ondemand_usd_h: expected dollars per hour \(a number >= 0\), got 'cheap'"),
    ([ROW_L4, "aws,p5.48xlarge,H100,8,55.04,-1,aws list,2025-06-05"], HEADER,
     r"line 3: spot_usd_h: expected dollars per hour \(a number >= 0\), got '-1'"),
    (["aws,p5.48xlarge,H100,0,55.04,24.77,aws list,2025-06-05"], HEADER, r"line 2: gpus: expected a positive integer"),
    (["aws,p5.48xlarge,H100,8,55.04,24.77"], HEADER, r"line 2: expected 8 comma-separated fields .*got 6"),
    ([ROW_H100, ROW_H100], HEADER, r"line 3: instance_type: 'p5.48xlarge' is already on line 2"),
    (["aws,p5.48xlarge,H100,8,55.04,24.77,,2025-06-05"], HEADER,
     r"line 2: source: expected where the prices come from"),
    (["aws,p5.48xlarge,H100,8,55.04,24.77,aws list,June"], HEADER,
     r"line 2: date: expected .* \(YYYY-MM-DD\), got 'June'"),
    ([], HEADER, r"no price rows"),
])
def test_a_bad_price_table_is_one_line_naming_file_line_and_column(tmp_path, lines, header, expected):
    path = _table(tmp_path, *lines, header=header)
    with pytest.raises(PriceError, match=expected) as err:
        PriceTable.load(path)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value)


def test_refresh_from_aws_spot_price_history_on_a_real_ec2_api(s3, tmp_path):
    import boto3

    table = PriceTable.load()
    ec2 = boto3.session.Session().client("ec2", region_name="us-east-1")  # moto on loopback ($AWS_ENDPOINT_URL)
    fresh, skipped = refresh_from_aws(table, region="us-east-1", client=ec2)
    refreshed = [r for r in fresh.rows() if r.date == _today() and "spot price history us-east-1 median" in r.source]
    assert refreshed, skipped
    for r in refreshed:  # moto's spot prices are placeholders (1e-05); the on-demand price is the table's
        assert r.spot_usd_h == pytest.approx(1e-05) and r.ondemand_usd_h == table.row(r.instance_type).ondemand_usd_h
    untouched = {r.instance_type for r in fresh.rows()} - {r.instance_type for r in refreshed}
    assert all(fresh.row(n) == table.row(n) for n in untouched)
    assert all(r.provider == "gcp" or any(s.startswith(r.instance_type) for s in skipped)
               for r in fresh.rows() if r.instance_type in untouched)


def test_cli_prices_json_rows_and_refresh(s3, capsys):
    assert main(["prices", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len(PriceTable.load())
    for row in rows:
        assert {"instance_type", "gpu", "gpus", "ondemand_usd_h", "spot_usd_h", "source"} <= row.keys()
    assert main(["prices", "--gpu", "H100", "--json"]) == 0
    assert {r["gpu"] for r in json.loads(capsys.readouterr().out)} == {"H100"}
    assert main(["prices", "--gpu", "L4"]) == 0  # the readable table
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:5] == ["provider", "instance_type", "region", "gpu", "gpus"] and "g2-standard-4" in out[-1]
    assert main(["prices", "--refresh", "aws", "--gpu", "T4", "--json"]) == 0
    assert all(r["spot_usd_h"] == pytest.approx(1e-05) or r["provider"] == "gcp"
               for r in json.loads(capsys.readouterr().out))


def test_cli_prices_bad_input_is_one_error_line(tmp_path, capsys):
    assert main(["prices", "--gpu", "H800"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spotlight: error: unknown GPU 'H800'") and err.count("\n") == 1
    bad = _table(tmp_path, ROW_H100, header=HEADER.replace(",gpus", ""))
    assert main(["prices", "--table", str(bad)]) == 2
    assert capsys.readouterr().err == (f"spotlight: error: {bad}: line 1: missing column 'gpus' (expected columns "
                                       f"{', '.join(COLUMNS)}; optional: {', '.join(OPTIONAL_COLUMNS)})\n")


# ---- the meter and the policies -----------------------------------------------------------------


def test_meter_pays_each_node_kind_at_its_price_over_clock_time():
    clock = ManualClock(100.0)
    meter = CostMeter(clock, ondemand_usd_h=10.0, spot_usd_h=4.0, fleet=Fleet(ondemand=2, spot=3), spent_usd=1.5)
    assert meter.rate_usd_h == 32.0 and meter.spent_usd() == 1.5
    clock.advance(1800)
    assert meter.spent_usd() == pytest.approx(1.5 + 16.0)
    meter.set_fleet(Fleet(ondemand=5, spot=0))  # the spot workers moved to on-demand
    clock.advance(360)
    assert meter.rate_usd_h == 50.0 and meter.spent_usd() == pytest.approx(1.5 + 16.0 + 5.0)


def test_fleet_is_an_ondemand_head_plus_the_workers_of_the_runtime():
    cfg = small_dit_config(runtime={"spot_workers": 3, "ondemand_workers": 2})
    assert fleet_of(cfg) == Fleet(ondemand=3, spot=3)
    assert fleet_of(cfg, ondemand_workers=True) == Fleet(ondemand=6, spot=0)


def test_a_launched_fleets_meter_counts_its_head_as_the_one_ondemand_node_and_prices_its_region(logged):
    """Issue 41 (from issue 26's note): on a launched fleet (`spotlight train --address` on the head)
    the meter billed 1 + ondemand_workers on-demand nodes, though the on-demand workers run on the
    head, the one on-demand node `spotlight launch` rents; and it priced the table's home row
    whatever cloud.region said, while the launch's bill priced that region."""
    from cloud.prices import PriceTable

    table = PriceTable.load()
    joined = small_dit_config(runtime={"kind": "ray", "address": "10.0.0.1:6379", "spot_workers": 3,
                                       "ondemand_workers": 2})
    assert fleet_of(joined) == Fleet(ondemand=1, spot=3)
    assert fleet_of(joined, ondemand_workers=True) == Fleet(ondemand=4, spot=0)
    west = {"gpu": "H100", "gpus_per_node": 8, "provider": "aws", "region": "us-west-2"}
    cfg = small_dit_config(cloud=west)
    row = next(r for r in table.rows("H100") if r.region == "us-west-2" and r.gpus == 8)
    home = table.node_price("H100", 8)
    assert row.ondemand_usd_h != home.row.ondemand_usd_h  # else this test could not tell them apart
    meter = cost_control(cfg, ManualClock(0.0), table=table).meter
    fleet = fleet_of(cfg)
    assert meter.rate_usd_h == pytest.approx(fleet.ondemand * row.ondemand_usd_h + fleet.spot * row.spot_usd_h)
    assert not [line for line in logged if "cloud.region" in line]
    # A region the table does not price: the home row, and one line saying so.
    cost_control(small_dit_config(cloud={**west, "region": "ap-south-2"}), ManualClock(0.0), table=table)
    assert [line for line in logged if line.startswith("cloud.region: no H100 price in ap-south-2: priced in ")]


def test_forecast_is_the_prior_until_measured_then_the_slowest_recent_with_margin():
    f = Forecast(prior_iteration_s=2.0, prior_checkpoint_s=1.0, margin=0.5, window=3)
    assert f.iteration_s() == 2.0 * PRIOR_FACTOR and f.stop_s() == 2 * 1.0 * PRIOR_FACTOR + STOP_SLACK_S
    for seconds in (10.0, 30.0, 20.0):
        f.observe(seconds)
    assert f.iteration_s() == pytest.approx(45.0) and f.pace_s() == 30.0
    f.observe(12.0, checkpoint_s=4.0)  # 10 s drops out of the window of 3; 30 s is still in it
    f.observe(11.0)
    f.observe(13.0)  # now the window is 12, 11, 13
    assert f.iteration_s() == pytest.approx(19.5) and f.stop_s() == pytest.approx(12.0 + STOP_SLACK_S)


def test_budget_policy_stops_when_the_next_iteration_and_a_clean_stop_would_not_fit():
    f = Forecast(1.0, 1.0, margin=0.0)
    f.observe(100.0, checkpoint_s=10.0)
    budget = BudgetPolicy(10.0, f)
    forecast = budget.forecast_usd(rate_usd_h=36.0)  # 120.5 s at 1 cent per second
    assert forecast == pytest.approx(1.205)
    assert not budget.should_stop(8.795, forecast) and budget.should_stop(8.805, forecast)
    assert budget.affordable(9.0, 36.0, 100.0) and not budget.affordable(9.01, 36.0, 100.0)
    with pytest.raises(ValueError):
        BudgetPolicy(-1.0, f)


def _control(clock, budget=None, deadline=None, fleet=Fleet(2, 2), prior_s=1.0, checkpoint_s=0.5):
    meter = CostMeter(clock, 3600.0, 1800.0, fleet)  # $1/s per on-demand node, $0.5/s per spot node
    forecast = Forecast(prior_s, checkpoint_s)
    return CostControl(clock, meter, Fleet(fleet.ondemand + fleet.spot, 0), forecast,
                       BudgetPolicy(budget, forecast) if budget else None, deadline)


def _simulate(control, clock, total, durations, checkpoint_every=3, checkpoint_s=0.5, after_switch=None):
    """Drive `control` as the trainer does: iteration i takes durations[i % len] seconds (after a
    switch to on-demand, `after_switch` seconds if given). Returns (iterations run, stop reason,
    switch messages)."""
    control.start(0)
    saved, messages = 0, []
    for step in range(total):
        decision = control.before_iteration(step, total)
        if decision.switch:
            messages.append(decision.message)
            control.switched(step)
            durations = [after_switch] if after_switch is not None else durations
        if decision.stop:
            clock.advance(checkpoint_s * (saved != step) + checkpoint_s)  # checkpoint if needed, final/
            return step, decision.stop, messages
        clock.advance(durations[step % len(durations)])
        written = None
        if (step + 1) % checkpoint_every == 0:
            clock.advance(checkpoint_s)
            written, saved = checkpoint_s, step + 1
        control.after_iteration(written)
    clock.advance(checkpoint_s)  # final/
    return total, "steps", messages


@pytest.mark.parametrize("seed", range(5))
def test_a_budgeted_run_never_spends_more_than_its_budget(seed):
    rng = random.Random(seed)
    clock = ManualClock()
    control = _control(clock, budget=rng.uniform(60, 200))  # $3/s: 2 on-demand nodes at $1/s, 2 spot at $0.5/s
    clock.advance(rng.uniform(0, 5))  # start-up, paid
    # iteration times jitter by up to 30%: inside the 50% margin
    durations = [rng.uniform(1.0, 1.3) for _ in range(7)]
    done, reason, _ = _simulate(control, clock, total=1000, durations=durations)
    assert reason == "budget" and 0 < done < 1000
    assert control.spent_usd() <= control.budget.budget_usd
    # and it used most of it: what is left is less than the last forecast (iteration + clean stop, +50%)
    assert control.budget.budget_usd - control.spent_usd() < 3.0 * (1.3 + 2 * 0.5) * 1.5


def test_a_budget_that_suffices_runs_every_iteration():
    clock = ManualClock()
    control = _control(clock, budget=1000.0)
    assert _simulate(control, clock, total=10, durations=[1.0])[:2] == (10, "steps")
    assert control.summary()["cost_usd"] == pytest.approx(control.spent_usd())


def test_deadline_policy_switches_when_behind_uniform_progress_and_never_back():
    policy = DeadlinePolicy(deadline_s=1000.0, restart_s=10.0)
    policy.start(now_s=0.0, done=0)
    assert policy.switch_reason(100.0, 10, 100, iteration_s=8.0) is None  # on the line
    assert policy.switch_reason(300.0, 29, 100, iteration_s=8.0) is None  # within one iteration of it
    reason = policy.switch_reason(300.0, 25, 100, iteration_s=8.0)
    assert reason.startswith("behind uniform progress: 25 of 100 iterations done at 30% of the time to the deadline")
    policy.switched_at = 25
    assert policy.switch_reason(900.0, 30, 100, iteration_s=8.0) is None  # one-way


def test_deadline_safety_net_switches_when_the_slack_is_less_than_the_restart_overhead():
    policy = DeadlinePolicy(deadline_s=1000.0, restart_s=100.0)
    policy.start(now_s=0.0, done=0)
    # ahead of the line (55 > 50), but 45 iterations x 10 s leave 50 s of slack < 100 s restart
    reason = policy.switch_reason(500.0, 55, 100, iteration_s=10.0)
    assert reason == ("the 45 iterations left need 450.0 s at 10.00 s each, and 500.0 s remain before the deadline: "
                      "less than that plus the restart overhead (100.0 s)")
    assert policy.switch_reason(500.0, 55, 100, iteration_s=8.0) is None  # 140 s of slack
    assert policy.late(990.0, 8.0, 3.0) and not policy.late(980.0, 8.0, 2.0)


def test_uniform_progress_line_starts_where_the_iterations_start():
    policy = DeadlinePolicy(deadline_s=1100.0)
    policy.start(now_s=100.0, done=40)  # a resumed run: 40 done, 100 s of start-up
    assert policy.expected_done(100.0, 140) == 40 and policy.expected_done(600.0, 140) == pytest.approx(90)


def test_cost_control_switches_once_when_preemptions_slow_the_run_and_pays_on_demand_after():
    clock = ManualClock()
    control = _control(clock, deadline=DeadlinePolicy(deadline_s=200.0))
    # 100 iterations in 200 s: 1.5 s per iteration keeps up at first, then lost spot workers make it
    # 4 s; on-demand workers (never preempted) bring it back to 1.5 s
    durations = [1.5] * 20 + [4.0] * 80
    done, reason, messages = _simulate(control, clock, 100, durations, after_switch=1.5)
    assert len(messages) == 1
    # here the safety net sees it first: 4 s iterations no longer fit before the deadline
    assert messages[0].startswith(f"switching spot workers to on-demand at iteration {control.switched_at}: "
                                  f"the {100 - control.switched_at} iterations left need ")
    assert 20 < control.switched_at < 40 and control.meter.fleet == Fleet(4, 0)
    assert control.summary()["ondemand_switch_step"] == control.switched_at
    assert (done, reason) == (100, "steps") and clock.now() <= 200.0


def test_cost_control_stops_for_the_deadline_before_a_late_iteration():
    clock = ManualClock()
    control = _control(clock, deadline=DeadlinePolicy(deadline_s=30.0), fleet=Fleet(2, 0))
    done, reason, messages = _simulate(control, clock, 100, [2.0])
    assert reason == "deadline" and messages == [] and clock.now() <= 30.0 and done >= 8


def test_a_budget_below_one_iteration_is_rejected_before_anything_starts():
    cfg = small_dit_config(cloud={"budget_usd": 0.01, "price_scale": 100.0})
    lower = iteration_seconds_lower_bound(cfg)
    with pytest.raises(ConfigError, match=r"cloud.budget_usd \(--budget-usd\): \$0.01 is too small: one iteration "
                                          r"costs at least \$0.01\d+ .* priced from p5.48xlarge, x 100"):
        cost_control(cfg, ManualClock())
    rate = cost_control(small_dit_config(), ManualClock()).meter.rate_usd_h * 100.0
    cost_control(small_dit_config(cloud={"budget_usd": rate * lower / 3600 * 1.01, "price_scale": 100.0}),
                            ManualClock())  # just enough: accepted
    with pytest.raises(ConfigError, match=r"after the \$2 this run already spent and a start-up like its last"):
        cost_control(small_dit_config(cloud={"budget_usd": 2.01, "price_scale": 100.0}), ManualClock(),
                                Spent(2.0, 1.0))
    with pytest.raises(ConfigError, match=r"^cloud.gpu: unknown GPU 'H800': the price table .* knows A100"):
        cost_control(small_dit_config(cloud={"gpu": "H800"}), ManualClock())


def test_lower_bound_is_below_the_tiny_runs_measured_here():
    # measured on this project's 2-core machine (spotlight/iteration/iteration_time.py): tiny DiT 1.1 s, small DiT
    # 0.09 s, tiny LLM 0.25 s per iteration
    from spotlight.config import load_config

    assert iteration_seconds_lower_bound(load_config("experiments/tiny_dit.yaml")) < 1.1 / 2
    assert iteration_seconds_lower_bound(small_dit_config()) < 0.09 / 2
    assert iteration_seconds_lower_bound(load_config("experiments/tiny_llm.yaml")) < 0.25 / 2
    qwen = small_dit_config(policy={"dit": {"preset": "qwen-image", "resolution": 1024}})
    assert 1.0 < iteration_seconds_lower_bound(qwen) < 60.0  # FLOPs at the H100's peak


def test_spent_file_round_trips_and_a_bad_one_is_one_line(tmp_path):
    assert load_spent(tmp_path) == Spent()
    save_spent(tmp_path, Spent(1.25, 3.0))
    assert load_spent(tmp_path) == Spent(1.25, 3.0)
    (tmp_path / "cost.json").write_text('{"cost_usd": -3}')
    with pytest.raises(ConfigError, match=r"cost.json: cost_usd: expected a number >= 0, got -3.0"):
        load_spent(tmp_path)


# ---- tiny runs ----------------------------------------------------------------------------------


def _rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_budgeted_tiny_run_stops_cleanly_under_its_budget_and_a_resume_carries_the_cost(tmp_path, logged):
    # H100 nodes at x100 prices: 2 on-demand + 2 spot nodes cost ~$0.55/s, a tiny iteration ~$0.05
    cfg = small_dit_config(train={"steps": 200, "checkpoint_every": 7}, cloud={"budget_usd": 3.0, "price_scale": 100.0})
    logs = logged
    summary = Trainer(cfg, tmp_path, progress=False).build().train()
    assert summary["stop_reason"] == "budget" and 0 < summary["steps"] < 200
    assert summary["cost_usd"] <= 3.0 and summary["budget_usd"] == 3.0
    rows = _rows(tmp_path)
    costs = [r["cost_usd"] for r in rows]
    assert costs == sorted(costs) and costs[-1] <= summary["cost_usd"]
    assert any(m.startswith(f"stopping before iteration {summary['steps']} for the budget: $") for m in logs)
    assert (tmp_path / "checkpoints" / f"step-{summary['steps']:06d}").is_dir()  # the iterations done
    assert (tmp_path / "final").is_dir()
    assert json.loads((tmp_path / "summary.json").read_text())["stop_reason"] == "budget"
    spent = load_spent(tmp_path)
    assert spent.cost_usd >= summary["cost_usd"] and spent.startup_s > 0

    # a cent more than what is spent cannot pay for another start-up and iteration (the same budget
    # again might: how much the stop's margin leaves depends on the machine's load)
    tight = small_dit_config(train={"steps": 200, "checkpoint_every": 7},
                             cloud={"budget_usd": spent.cost_usd + 0.01, "price_scale": 100.0})
    with pytest.raises(ConfigError, match=r"already spent"):
        Trainer(tight, tmp_path, progress=False).build()
    # a larger budget resumes from the checkpoint with the dollars already spent on the meter
    more = small_dit_config(train={"steps": 200, "checkpoint_every": 7},
                            cloud={"budget_usd": 8.0, "price_scale": 100.0})
    again = Trainer(more, tmp_path, progress=False).build()
    assert again.start_step == summary["steps"]
    resumed = again.train()
    assert resumed["stop_reason"] == "budget" and resumed["steps"] > summary["steps"]
    assert spent.cost_usd < _rows(tmp_path)[summary["steps"]]["cost_usd"] and resumed["cost_usd"] <= 8.0


def test_a_deadline_run_switches_to_ondemand_and_stops_in_time(tmp_path, logged):
    # 1000 tiny iterations (~0.1 s each) cannot end in 6 s (of which start-up takes ~3): the safety
    # net sees it at the first iteration boundary
    cfg = small_dit_config(train={"steps": 1000, "checkpoint_every": 50}, cloud={"deadline_h": 6.0 / 3600})
    logs = logged
    trainer = Trainer(cfg, tmp_path, progress=False).build()
    summary = trainer.train()
    switch = [m for m in logs if m.startswith("switching spot workers to on-demand at iteration ")]
    assert len(switch) == 1 and summary["ondemand_switch_step"] is not None
    assert summary["fleet"] == {"ondemand_nodes": 4, "spot_nodes": 0}
    assert summary["stop_reason"] == "deadline" and summary["steps"] < 1000
    assert trainer.cost.now_s() < 6.0 + 1.0  # stopped in time (the summary's own write aside)


def test_cli_train_budget_flags(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text(to_yaml(small_dit_config(cloud={"price_scale": 100.0})))
    assert main(["train", str(path), "--out", str(tmp_path / "a"), "--budget-usd", "-1"]) == 2
    assert capsys.readouterr().err == "spotlight: error: --budget-usd: expected a number > 0, got -1\n"
    assert main(["train", str(path), "--out", str(tmp_path / "a"), "--deadline-h", "0"]) == 2
    assert capsys.readouterr().err == "spotlight: error: --deadline-h: expected a number > 0, got 0\n"
    assert main(["train", str(path), "--out", str(tmp_path / "b"), "--budget-usd", "0.001", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spotlight: error: cloud.budget_usd (--budget-usd): $0.001 is too small")
    assert err.count("\n") == 1
    assert not (tmp_path / "b" / "metrics.jsonl").exists()  # rejected before training started


@pytest.mark.slow
def test_ray_fall_back_to_ondemand_restarts_spot_slots_and_stops_the_trace(tmp_path):
    from safetensors.torch import load_file

    from spotlight.runtime.ray_runtime import RayRuntime
    from schedulers.traces import ReplayAction

    cfg = small_dit_config(train={"steps": 3}, runtime={"kind": "ray", "spot_workers": 2, "ondemand_workers": 1})
    # slot 0 dies without notice in the first rollout, slot 1 gets a notice; its kill comes too late
    runtime = RayRuntime(cfg, actions=[ReplayAction(0.0, 0, "kill"), ReplayAction(1e-3, 1, "notice"),
                                       ReplayAction(1e9, 1, "kill")])
    trainer = Trainer(cfg, tmp_path / "ray", progress=False).build(runtime)
    try:
        for step in range(3):
            if step == 1:  # what the trainer does when the deadline policy says so
                runtime.use_ondemand()
                engine = runtime.engine
                assert sorted((w.spot, w.name) for w in engine.workers.values()) == [
                    (False, "ondemand0.1"), (False, "ondemand1.1"), (False, "ondemand2.1")]
                assert all(not n.spot and n.alive for n in engine.nodes.values()) and len(engine.nodes) == 3
                assert engine.actions == engine.actions[:engine._next_action]  # nothing more is replayed
            trainer.iteration(step)
        runtime.save_final(tmp_path / "ray" / "final")
        stats = runtime.stats()
    finally:
        runtime.shutdown()
    assert stats["workers_lost"] == 1 and stats["preemptions"] == 1  # retired spot actors are not deaths
    assert stats["requests_lost"] == stats["requests_duplicated"] == 0

    Trainer(small_dit_config(train={"steps": 3}), tmp_path / "local", progress=False).build().train()
    (a,), (b,) = [list((tmp_path / name / "final").glob("*.safetensors")) for name in ("ray", "local")]
    wa, wb = load_file(str(a)), load_file(str(b))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)  # the switch changed no weight


def test_cli_train_with_a_budget_that_binds_on_the_tiny_llm(tmp_path, capsys):
    from conftest import small_llm_config

    path = tmp_path / "llm.yaml"  # x100 prices: ~$0.55/s for the fleet, ~$0.02 a tiny-LLM iteration
    path.write_text(to_yaml(small_llm_config(train={"steps": 500, "checkpoint_every": 1000},
                                             cloud={"price_scale": 100.0})))
    out = tmp_path / "out"
    assert main(["train", str(path), "--out", str(out), "--budget-usd", "3", "--json", "--no-progress"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert summary["stop_reason"] == "budget" and 0 < summary["steps"] < 500, captured.err
    assert summary["cost_usd"] <= 3.0
    assert "for the budget" in captured.err
    assert (out / "checkpoints" / f"step-{summary['steps']:06d}").is_dir()  # checkpoint_every never came


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_a_run_resumed_from_its_store_in_a_fresh_folder_carries_what_it_spent(kind, tmp_path, monkeypatch, request):
    # Issue 42: the second folder's meter started at $0 and a budget was overspent by what the first
    # session had spent. The dollars travel with the store's results (cost.json, status.json).
    if kind == "s3":
        uri = f"s3://{request.getfixturevalue('s3').bucket}/runs/carried"
    else:
        monkeypatch.setenv("SPOTLIGHT_STORE_ROOTS", str(tmp_path))
        uri = (tmp_path / "store").as_uri()

    def cfg(steps, **cloud):
        return small_dit_config(train={"steps": steps, "checkpoint_every": 1},
                                cloud={"checkpoint_uri": uri, "price_scale": 100.0, **cloud})

    Trainer(cfg(2), tmp_path / "first", progress=False).build().train()
    spent = load_spent(tmp_path / "first")
    assert spent.cost_usd > 0
    # a cent more than the first session spent cannot pay for another start-up and iteration
    with pytest.raises(ConfigError, match=r"after the \$[0-9.]+ this run already spent"):
        Trainer(cfg(4, budget_usd=spent.cost_usd + 0.01), tmp_path / "fresh", progress=False).build()
    assert not (tmp_path / "fresh").exists()  # refused before the folder was made
    again = Trainer(cfg(3, budget_usd=spent.cost_usd + 100.0), tmp_path / "fresh", progress=False).build()
    assert again.start_step == 2 and again.cost.spent_usd() >= spent.cost_usd
    summary = again.train()
    assert [r["step"] for r in _rows(tmp_path / "fresh")][-1] == 2
    assert _rows(tmp_path / "fresh")[-1]["cost_usd"] > spent.cost_usd
    assert load_spent(tmp_path / "fresh").cost_usd >= summary["cost_usd"] > spent.cost_usd


def test_what_a_store_records_as_spent_is_the_larger_of_its_records_and_a_bad_one_is_one_line(tmp_path, monkeypatch):
    from cloud.open_store import open_store
    from spotlight.train.results_sync import stored_spent

    monkeypatch.setenv("SPOTLIGHT_STORE_ROOTS", str(tmp_path))
    store = open_store(tmp_path.as_uri())
    assert stored_spent(store) == Spent()  # nothing stored: a new run
    store.put("results/cost.json", json.dumps({"cost_usd": 1.5, "startup_s": 4.0}).encode())
    assert stored_spent(store) == Spent(1.5, 4.0)
    store.put("results/status.json", json.dumps({"cost_usd": 2.25, "iteration": 9}).encode())  # put later
    assert stored_spent(store) == Spent(2.25, 4.0)
    store.put("results/status.json", b"{not json")  # a progress note: the checkpointed record counts
    assert stored_spent(store) == Spent(1.5, 4.0)
    for body in (b"[1, 2]", json.dumps({"cost_usd": -1}).encode(), b"x" * 100_000):
        store.put("results/cost.json", body)
        with pytest.raises(ConfigError, match=r"results/cost\.json") as err:
            stored_spent(store)
        assert "\n" not in str(err.value)
