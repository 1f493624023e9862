"""The price table's regions and on-demand basis, and `spotlight simulate --prices` (a sensitivity
run): the table-format tests are in tests/cloud/test_cloud_cost.py."""

import json

import pytest

from cloud.prices import PriceError, PriceTable
from spotlight import cli

HEADER = "provider,instance_type,region,gpu,gpus,ondemand_usd_h,spot_usd_h,ondemand_basis,source,date"


def _table(tmp_path, *rows, name="prices.csv", header=HEADER):
    path = tmp_path / name
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def test_every_shipped_row_names_its_region_source_and_on_demand_basis():
    table = PriceTable.load()
    for r in table.rows():
        assert r.region and r.source and r.ondemand_basis, r
    p5 = [r for r in table.rows() if r.instance_type == "p5.48xlarge"]
    assert {r.region for r in p5} >= {"us-east-1", "us-east-2", "us-west-2"}
    assert all("catalog" in r.source and "estimate" not in r.source for r in p5)  # no 0.45x guess left
    # the default H100 price is the us-east-1 row, whatever other regions the table holds
    assert PriceTable.load().node_price("H100", 1).row.region == "us-east-1"


def test_region_rows_resolve_by_region_and_default_to_the_home_region(tmp_path):
    table = PriceTable.load(_table(
        tmp_path,
        "aws,p5.48xlarge,us-west-2,H100,8,98.32,31.36,catalog pre-cut,cat,2026-11-23",
        "aws,p5.48xlarge,us-east-1,H100,8,55.04,26.79,list after cut,cat,2026-11-23",
        "aws,p5.48xlarge,us-east-2,H100,8,98.32,15.65,catalog pre-cut,cat,2026-11-23"))
    assert table.row("p5.48xlarge").region == "us-east-1"  # home, not the first line
    assert table.row("p5.48xlarge", "us-east-2").spot_usd_h == 15.65
    assert table.node_price("H100", 8, region="us-west-2").spot_usd_h == 31.36
    assert table.node_price("H100", 1, "p5.48xlarge", region="us-east-2").spot_usd_h == pytest.approx(15.65 / 8)
    with pytest.raises(PriceError, match=r"'p5.48xlarge' has no price in region 'eu-west-1'.*us-west-2, us-east-1"):
        table.row("p5.48xlarge", "eu-west-1")
    with pytest.raises(PriceError, match=r"no H100 price in region 'eu-west-1'"):
        table.node_price("H100", 1, region="eu-west-1")
    assert PriceTable.load(tmp_path / "prices.csv").regions() == ["us-east-1", "us-east-2", "us-west-2"]


def test_a_table_without_region_or_basis_still_loads_and_round_trips(tmp_path):
    legacy = _table(tmp_path, "aws,p5.48xlarge,H100,8,55.04,24.77,aws list,2025-06-05",
                    header="provider,instance_type,gpu,gpus,ondemand_usd_h,spot_usd_h,source,date")
    table = PriceTable.load(legacy)
    row = table.row("p5.48xlarge", "us-east-1")  # no region: the provider's default
    assert (row.region, row.ondemand_basis) == ("", "") and table.node_price("H100", 8).spot_usd_h == 24.77
    assert table.to_csv().splitlines()[0] == "provider,instance_type,gpu,gpus,ondemand_usd_h,spot_usd_h,source,date"
    shipped = PriceTable.load()
    (tmp_path / "again.csv").write_text(shipped.to_csv())
    assert PriceTable.load(tmp_path / "again.csv").rows() == shipped.rows()


def test_the_same_instance_type_twice_in_one_region_is_one_line(tmp_path):
    path = _table(tmp_path, "aws,p5.48xlarge,us-east-1,H100,8,55.04,26.79,b,s,2026-11-23",
                  "aws,p5.48xlarge,us-east-2,H100,8,98.32,15.65,b,s,2026-11-23",
                  "aws,p5.48xlarge,us-east-1,H100,8,55.04,20.00,b,s,2026-11-23")
    with pytest.raises(PriceError) as err:
        PriceTable.load(path)
    assert str(err.value) == f"{path}: line 4: instance_type: 'p5.48xlarge' in region 'us-east-1' is already on line 2"


def _simulate(tmp_path, capsys, prices):
    trace = tmp_path / "t.csv"
    trace.write_text("0,add,a\n0,add,b\n600000,remove,a\n900000,add,c\n")
    rc = cli.main(["simulate", "--trace", str(trace), "--gpus", "4", "--spot-gpus", "8", "--prompts", "8",
                   "--iterations", "40", "--iterations-scale", "0.1", "--policy", "ondemand,spotlight_noexplore",
                   "--json", "--prices", str(prices)])
    assert rc == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_with_a_table_that_halves_the_spot_price_halves_the_spot_cost(tmp_path, capsys):
    # spot dollars = cost(spot price S) - cost(spot price 0): the schedule does not depend on prices
    runs = {}
    for spot in (20.0, 10.0, 0.0):
        table = _table(tmp_path, f"aws,p5.48xlarge,us-east-1,H100,8,40.0,{spot},test,test,2026-11-23",
                       name=f"p{spot:g}.csv")
        runs[spot] = _simulate(tmp_path, capsys, table)
    assert runs[10.0]["config"]["price_per_gpu_h"]["spot"] == pytest.approx(10.0 / 8)
    cost = {s: r["policies"]["spotlight_noexplore"]["cost_usd"] for s, r in runs.items()}
    spot_full, spot_half = cost[20.0] - cost[0.0], cost[10.0] - cost[0.0]
    assert spot_full > 0 and spot_half == pytest.approx(spot_full / 2, rel=1e-9)
    assert len({r["policies"]["ondemand"]["cost_usd"] for r in runs.values()}) == 1  # no spot GPUs: unchanged


def test_simulate_with_a_bad_price_table_is_one_line_exit_2(tmp_path, capsys):
    bad = _table(tmp_path, "aws,p5.48xlarge,us-east-1,H100,8,55.04,-3,test,test,2026-11-23")
    assert cli.main(["simulate", "--trace", "synth:poisson?hours=1", "--prices", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == (f"spotlight: error: --prices: {bad}: line 2: spot_usd_h: expected dollars per hour "
                   "(a number >= 0), got '-3'\n")
    assert cli.main(["simulate", "--trace", "synth:poisson?hours=1", "--prices", str(tmp_path / "no.csv")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"spotlight: error: --prices: {tmp_path / 'no.csv'}: cannot read") and err.count("\n") == 1
