"""Prices as a range (issue 37): the price rows of `cloud.prices.price_scenarios`, every policy's
dollars over them (`result["price_range"]`: re-priced from GPU-hours under `--objective time`,
simulated again otherwise), the price of an hour saved against `near_all_spot` and
`managed_restart`, and `spotlight simulate --price-rows`."""

import json
import re

import pytest

from cloud.prices import CATALOG_ONDEMAND, PriceTable, price_scenarios
from schedulers.traces import Trace, TraceEvent
from spotlight import cli
from spotlight.sim.progress_model import ProgressModel
from spotlight.sim.simulator import (HOUR_BASELINES, POLICIES, SimConfig, compare, make_simulation, reprice, simulate,
                                     usd_per_hour_sooner)

# Two spot nodes, one lost at 40 s and another joining at 90 s: preemptions and a join inside runs
# of three iterations (~20 s each at this size; a restart baseline's run is ~400 s).
TRACE = Trace([TraceEvent(0.0, "add", "a"), TraceEvent(0.0, "add", "b"), TraceEvent(40.0, "remove", "a"),
               TraceEvent(90.0, "add", "c")], "handmade")


def small(**kw) -> SimConfig:
    # tests/spotlight/sim/test_simulator.py's small(): micro-batches of 8 rows, one per request; a target that
    # three iterations reach (iterations_scale 0.1), so every policy has dollars to the target.
    base = dict(gpus=4, spot_gpus=4, prompts=8, group_size=4, samples_per_request=4, iterations=20,
                candidates_per_prompt=8, plan_prompts=4, micro_batch=8, parts_per_request=1, iterations_scale=0.1)
    return SimConfig(**{**base, **kw})


def _run_at(cfg: SimConfig, name: str, per_gpu: tuple[float, float]) -> dict:
    return make_simulation(cfg, POLICIES[name], TRACE, ProgressModel.calibrated(iterations_scale=cfg.iterations_scale),
                           per_gpu).run()


def test_repricing_equals_a_simulation_at_the_other_prices_to_the_cent():
    cfg = small()
    out = simulate(cfg, TRACE, constants="typical", price_rows="range")
    pr = out["price_range"]
    assert pr["how"] == "repriced" and pr["why_simulated"] is None
    assert len(pr["rows"]) == 3
    home = pr["rows"][0]["name"]
    assert sum(r["preemptions"] for r in out["policies"].values()) > 0  # the trace's loss is inside the runs
    for name, r in out["policies"].items():
        assert r["time_to_target_h"] is not None, name  # every policy reaches the target here
        assert pr["policies"][name][home]["cost_usd"] == r["cost_usd"]  # the run's own row is the run
        # the GPU-hours the meter billed price the run at its own prices
        again = reprice(r, out["config"]["price_per_gpu_h"]["ondemand"], out["config"]["price_per_gpu_h"]["spot"])
        assert again["cost_usd"] == pytest.approx(r["cost_usd"], rel=1e-12)
    for row in pr["rows"][1:]:
        per_gpu = (row["per_gpu_h"]["ondemand"], row["per_gpu_h"]["spot"])
        for name in POLICIES:
            direct = _run_at(cfg, name, per_gpu)
            got = pr["policies"][name][row["name"]]
            assert got["time_to_target_h"] == direct["time_to_target_h"], (name, row["name"])
            assert round(got["cost_usd"], 2) == round(direct["cost_usd"], 2), (name, row["name"])
            assert round(got["total_cost_usd"], 2) == round(direct["total_cost_usd"], 2), (name, row["name"])
            assert abs(got["cost_usd"] - direct["cost_usd"]) < 1e-9  # not only to the cent


def test_under_objective_cost_each_price_row_is_simulated_again():
    cfg = small(objective="cost")
    names = ["ondemand", "spotlight_noexplore"]
    out = simulate(cfg, TRACE, names, constants="typical", price_rows="us-east-1@catalog")
    pr = out["price_range"]
    assert pr["how"] == "simulated" and pr["why_simulated"].startswith("--objective cost")
    (row,) = pr["rows"]
    direct = _run_at(cfg, "spotlight_noexplore", (row["per_gpu_h"]["ondemand"], row["per_gpu_h"]["spot"]))
    got = pr["policies"]["spotlight_noexplore"][row["name"]]
    assert (got["time_to_target_h"], got["cost_usd"]) == (direct["time_to_target_h"], direct["cost_usd"])


def test_the_range_spans_the_three_ratios_each_row_sourced_and_dated():
    table = PriceTable.load()
    rows = price_scenarios(table, "H100", "range")
    assert [round(s.ratio, 2) for s in rows] == [0.49, 0.27, 0.23]
    home, catalog, gcp = rows
    assert home.row == table.node_price("H100", 1).row  # the row every default figure is priced from
    # the 0.27 pair: the same spot price against the catalog snapshot's own (pre-cut) on-demand price
    assert catalog.catalog_basis and catalog.row.spot_usd_h == home.row.spot_usd_h
    assert catalog.ondemand_usd_h == CATALOG_ONDEMAND["p5.48xlarge", "us-east-1"].usd_h == 98.32
    assert "commit 001367d" in catalog.source and "pre-June-2025" in catalog.ondemand_basis
    assert gcp.row.provider == "gcp" and gcp.region == "us-central1"
    every = price_scenarios(table, "H100", "all")
    assert {s.row.provider for s in every} == {"aws", "gcp"} and len({s.region for s in every}) >= 10
    for s in every:
        assert s.source and s.ondemand_basis and re.fullmatch(r"\d{4}-\d{2}-\d{2}", s.date), s.name
        assert "estimate" not in s.source, s.name  # every H100 price is a catalog's or a price page's
    assert len({s.name for s in every}) == len(every)


def test_the_text_output_prints_each_rows_ratio_source_and_date_and_the_json_carries_them(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("0,add,a\n0,add,b\n600000,remove,a\n900000,add,c\n")
    args = ["simulate", "--trace", str(trace), "--gpus", "4", "--spot-gpus", "8", "--prompts", "8", "--iterations", "40",
            "--iterations-scale", "0.1", "--constants", "typical", "--no-progress",
            "--policy", "ondemand,near_all_spot,managed_restart,spotlight"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 100
    text = " ".join(out.split())  # the prose is wrapped to 100 columns: read it as one line
    assert "dollars to the target over the price rows (--price-rows range" in text
    assert "[2] aws p5.48xlarge us-east-1@catalog: spot 0.27x on-demand" in text
    assert "[3] gcp a3-highgpu-8g us-central1: spot 0.23x on-demand" in text and "commit 017e250" in text
    assert text.count("; 2026-11-23") >= 3  # each row's date
    assert re.search(r"spotlight: -?\$[\d,.]+ per hour sooner than near_all_spot", text) or \
        "spotlight vs near_all_spot: no price of an hour saved" in text
    assert cli.main(args + ["--price-rows", "home"]) == 0  # the run's own row alone: the table above says it
    text = " ".join(capsys.readouterr().out.split())
    assert "over the price rows" not in text and "per hour sooner than managed_restart" in text
    assert cli.main(args + ["--json", "--price-rows", "us-west-2,europe-west4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["runs_own_row"]) for r in out["price_range"]["rows"]] == [
        ("aws p5.48xlarge us-west-2", False), ("gcp a3-highgpu-8g europe-west4", False)]
    assert set(out["price_range"]["policies"]) == {"ondemand", "near_all_spot", "managed_restart", "spotlight"}
    hour = out["price_of_an_hour_saved"]
    assert hour["policy"] == "spotlight"
    for b in HOUR_BASELINES:
        by_row = hour[f"usd_per_hour_sooner_vs_{b}"]["by_price_row"]
        assert set(by_row) == {r["name"] for r in out["price_range"]["rows"]}
        assert set(hour[f"usd_per_hour_sooner_vs_{b}"]["by_constant_set"]) == {"typical"}


def test_usd_per_hour_sooner_is_the_closed_form_or_null_with_a_reason():
    fast = {"time_to_target_h": 2.0, "cost_usd": 700.0}
    slow = {"time_to_target_h": 3.5, "cost_usd": 550.0}
    assert usd_per_hour_sooner(fast, slow) == (pytest.approx((700.0 - 550.0) / (3.5 - 2.0)), None)  # $100/h
    cheap = {"time_to_target_h": 2.0, "cost_usd": 475.0}
    assert usd_per_hour_sooner(cheap, slow)[0] == pytest.approx(-50.0)  # sooner and cheaper: negative
    assert usd_per_hour_sooner(slow, fast) == (None, "not sooner (3.50 h against 2.00 h)")
    assert usd_per_hour_sooner({"time_to_target_h": None, "cost_usd": None}, slow) == (
        None, "the policy did not reach the target")
    assert usd_per_hour_sooner(fast, {"time_to_target_h": None, "cost_usd": None}) == (
        None, "the baseline did not reach the target")
    # `compare` puts it in every result beside the ratios, against each hour baseline simulated
    results = {"spotlight": fast, "near_all_spot": slow, "managed_restart": {"time_to_target_h": None, "cost_usd": None}}
    compared = compare(results)
    assert compared["spotlight"]["usd_per_hour_sooner_vs_near_all_spot"] == pytest.approx(100.0)
    assert compared["spotlight"]["usd_per_hour_sooner_vs_managed_restart"] is None


@pytest.mark.parametrize("value, expected", [
    ("mars-1", "--price-rows: 'mars-1': no H100 price row for it in the price table"),
    ("us-west-2@catalog", "--price-rows: 'us-west-2@catalog': no H100 price row for it in the price table"),
    ("us-west-2,,us-east-1", "--price-rows: expected range, all, home or comma-separated regions (REGION or "
                             "REGION@catalog), got 'us-west-2,,us-east-1'"),
])
def test_a_bad_price_rows_value_is_one_line_exit_2_before_the_trace_is_read(tmp_path, capsys, value, expected):
    missing = tmp_path / "no-trace.csv"  # never opened: the flag is refused first
    assert cli.main(["simulate", "--trace", str(missing), "--price-rows", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"spotlight: error: {expected}") and err.count("\n") == 1
    assert "us-east-1@catalog" in err or "got" in err  # the rows it could have named
