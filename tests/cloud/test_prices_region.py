"""`spotlight prices` shows each row's region: in the table (a column beside the instance type) and
in `--json`. Rows of one instance type in several regions are told apart by it, and a table from
before the `region` column shows the region its rows are assumed to hold in, marked as assumed."""

import json

from cloud.prices import DEFAULT_REGION, PriceTable
from spotlight.cli import main


def _columns(line: str) -> list[str]:
    return line.split()


def test_the_table_has_a_region_column_that_tells_an_instance_types_rows_apart(capsys):
    assert main(["prices", "--gpu", "H100"]) == 0
    head, *lines = capsys.readouterr().out.splitlines()
    assert _columns(head)[:5] == ["provider", "instance_type", "region", "gpu", "gpus"]
    shipped = PriceTable.load().rows("H100")
    assert len(lines) == len(shipped)
    shown = [tuple(_columns(line)[:3]) for line in lines]
    assert shown == [(r.provider, r.instance_type, r.region) for r in shipped]
    p5 = [region for _, instance_type, region in shown if instance_type == "p5.48xlarge"]
    assert len(p5) >= 4 and len(set(p5)) == len(p5)  # one row per region, each named


def test_json_rows_carry_the_region(capsys):
    assert main(["prices", "--gpu", "H100", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["instance_type"], r["region"]) for r in rows] == [(r.instance_type, r.region)
                                                                 for r in PriceTable.load().rows("H100")]
    assert list(rows[0])[:3] == ["provider", "instance_type", "region"]  # the CSV's column order


def test_a_table_without_regions_shows_the_assumed_region_as_assumed(tmp_path, capsys):
    old = tmp_path / "old.csv"  # the format before regions
    old.write_text("provider,instance_type,gpu,gpus,ondemand_usd_h,spot_usd_h,source,date\n"
                   "aws,p5.48xlarge,H100,8,55.04,26.78,a page,2025-06-05\n"
                   "lambda,gpu_8x_h100,H100,8,23.92,23.92,another page,2025-06-05\n")
    assert main(["prices", "--table", str(old)]) == 0
    head, aws, other, note = capsys.readouterr().out.splitlines()
    assert _columns(aws)[:3] == ["aws", "p5.48xlarge", f"({DEFAULT_REGION['aws']})"]
    assert _columns(other)[:3] == ["lambda", "gpu_8x_h100", "(unknown)"]
    assert note.startswith("(region): the table names no region for the row") and "(unknown)" in note
    assert main(["prices", "--table", str(old), "--json"]) == 0
    assert [r["region"] for r in json.loads(capsys.readouterr().out)] == ["", ""]  # as read: none


def test_a_table_with_regions_has_no_note(capsys):
    assert main(["prices"]) == 0
    assert "(region)" not in capsys.readouterr().out


def test_region_shows_that_regions_rows_and_an_unknown_one_names_the_known(capsys):
    assert main(["prices", "--gpu", "H100", "--region", "us-west-2"]) == 0
    head, *lines = capsys.readouterr().out.splitlines()
    wanted = [r for r in PriceTable.load().rows("H100") if r.region == "us-west-2"]
    assert wanted and [tuple(_columns(line)[:3]) for line in lines] == [
        (r.provider, r.instance_type, "us-west-2") for r in wanted]
    assert main(["prices", "--gpu", "H100", "--region", "mars-1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("spotlight: error: --region mars-1: no row of H100 of the table is in it (its regions: ")
    assert "us-west-2" in err and "\n" not in err


def test_region_of_is_the_named_region_else_the_default():
    """The one rule behind every region shown, matched and refreshed: an empty region is the
    provider's default, and a provider without one has none (None)."""
    from cloud.prices import PriceRow, region_of

    assert region_of("aws", "eu-west-1") == "eu-west-1"
    assert region_of("aws", "") == region_of("aws", None) == DEFAULT_REGION["aws"] == "us-east-1"
    assert region_of("gcp", "") == "us-central1"
    assert region_of("lambda", "") is None and region_of("lambda", "us-south-1") == "us-south-1"
    row = PriceRow("aws", "p5.48xlarge", "H100", 8, 55.04, 26.78, "a page", "2025-06-05")
    assert row.where == "us-east-1" and row.home and row.holds_in("us-east-1") and row.holds_in("")
    assert not row.holds_in("us-west-2")
    there = PriceRow("aws", "p5.48xlarge", "H100", 8, 55.04, 26.78, "a page", "2025-06-05", region="us-west-2")
    assert there.where == "us-west-2" and not there.home and there.holds_in("us-west-2")
    assert not there.holds_in("us-east-1") and not there.holds_in("")
    nowhere = PriceRow("lambda", "gpu_8x_h100", "H100", 8, 23.92, 23.92, "a page", "2025-06-05")
    assert nowhere.where is None and nowhere.home and not nowhere.holds_in("us-east-1")
