"""`cloud/sky_catalog.py` and `refresh_from_sky`: prices from SkyPilot's catalog through its API, in
SkyPilot's own virtualenv.

Each test sets up SkyPilot's cache the way SkyPilot keeps it — a catalog CSV in SkyPilot's format
under $HOME/.sky/catalogs/<schema>/<cloud>/vms.csv, with no .meta/ md5 beside it, so SkyPilot takes
it as put there by hand and never downloads over it — then only talks to the API. A catalog that is
not cached (gcp here) SkyPilot tries to download: through a proxy on a closed loopback port, so that
fails at once on any machine, with or without a network. Every refresh is one subprocess of
SkyPilot's Python (~3 s). These tests need SkyPilot's virtualenv (`$SPOTLIGHT_SKY_PYTHON` or
`.venv-sky`, `make sky-venv`): skipped without one, except under CI, where they must run.
"""

import json
import os
import subprocess

import pytest

from cloud import sky
from cloud.prices import PriceTable, refresh_from_sky
from spotlight.cli import main
from test_cloud_cost import HEADER, _table, _today

ROW_H100 = "aws,p5.48xlarge,H100,8,55.04,24.77,aws list,2025-06-05"
ROW_L4 = "gcp,g2-standard-4,L4,1,0.7068,0.2827,gcp page,2025-06-05"
ROW_T4 = "aws,g4dn.xlarge,T4,1,0.526,0.18,aws list,2025-06-05"

# SkyPilot's AWS catalog format (the columns `sky.catalog` reads; its real vms.csv has more).
AWS_CATALOG = (
    "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone\n"
    'p5.48xlarge,H100,8.0,192.0,2048.0,"{\'Gpus\': []}",55.04,20.0,us-east-1,use1-az1\n'
    'p5.48xlarge,H100,8.0,192.0,2048.0,"{\'Gpus\': []}",55.04,30.0,us-east-1,use1-az2\n'
    'p5.48xlarge,H100,8.0,192.0,2048.0,"{\'Gpus\': []}",55.04,22.0,us-east-1,use1-az4\n'
    'p5.48xlarge,H100,8.0,192.0,2048.0,"{\'Gpus\': []}",60.00,5.0,eu-west-1,euw1-az1\n'
    'g6.xlarge,L4,1.0,4.0,16.0,"{\'Gpus\': []}",0.805,,us-east-1,use1-az1\n'
    "m5.large,,,2.0,8.0,,0.096,0.03,us-east-1,use1-az1\n"
)
# SkyPilot's GCP catalog prices an A3 VM and its GPUs on separate lines; us-central1-c has no H100.
GCP_CATALOG = (
    "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone\n"
    "a3-highgpu-8g,,,208.0,1872.0,,9.46,1.70,us-central1,us-central1-a\n"
    "a3-highgpu-8g,,,208.0,1872.0,,9.46,1.80,us-central1,us-central1-b\n"
    "a3-highgpu-8g,,,208.0,1872.0,,9.46,1.60,us-central1,us-central1-c\n"
    ",H100,8.0,,,,78.37,14.11,us-central1,us-central1-a\n"
    ",H100,8.0,,,,78.37,15.00,us-central1,us-central1-b\n"
)


@pytest.fixture(scope="module")
def skypilot(sky_python, tmp_path_factory):
    """(SkyPilot's version, its catalog schema version, e.g. "v8"): where its cache is, asked once."""
    code = "import sky; from sky.skylet import constants; print(sky.__version__, constants.CATALOG_SCHEMA_VERSION)"
    env = {**os.environ, "HOME": str(tmp_path_factory.mktemp("sky-home"))}
    out = subprocess.run([str(sky_python), "-c", code], capture_output=True, text=True, env=env, check=True)
    version, schema = out.stdout.split()[-2:]
    return version, schema


@pytest.fixture
def sky_cache(skypilot, tmp_path, monkeypatch):
    """SkyPilot's catalog folder for this schema under a fresh $HOME, holding `AWS_CATALOG`; no network."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SKY_RUNTIME_DIR", raising=False)  # it would move SkyPilot's cache off $HOME
    for name in ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"):  # port 9: refused at once
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    cache = home / ".sky" / "catalogs" / skypilot[1]
    (cache / "aws").mkdir(parents=True)
    (cache / "aws" / "vms.csv").write_text(AWS_CATALOG)
    return cache


def test_refresh_from_skypilots_catalog_takes_the_regions_prices_with_new_source_and_date(
        sky_python, skypilot, sky_cache, tmp_path):
    version, schema = skypilot
    table = PriceTable.load(_table(tmp_path, ROW_H100, ROW_L4, ROW_T4))
    fresh, skipped = refresh_from_sky(table, sky_python)
    p5 = fresh.row("p5.48xlarge")
    assert (p5.ondemand_usd_h, p5.spot_usd_h) == (55.04, 22.0)  # the us-east-1 zones' median spot
    assert p5.source == f"skypilot {version} catalog {schema}/aws us-east-1; spot: median over 3 zones"
    assert p5.ondemand_basis.startswith(f"skypilot catalog {schema} list price us-east-1") and p5.date == _today()
    assert fresh.row("g4dn.xlarge") == table.row("g4dn.xlarge")  # not in the catalog: kept
    assert fresh.row("g2-standard-4") == table.row("g2-standard-4")  # no gcp catalog: kept
    assert f"g4dn.xlarge: not in SkyPilot's catalog {schema}/aws" in skipped
    assert any(s.startswith("gcp: no SkyPilot catalog it could load or download") for s in skipped), skipped
    assert len(skipped) == 2, skipped
    # SkyPilot used its cache as it was and downloaded nothing
    assert (sky_cache / "aws" / "vms.csv").read_text() == AWS_CATALOG
    assert not (sky_cache / "gcp" / "vms.csv").exists()
    # the refreshed table round-trips through its CSV
    fresh.write(tmp_path / "fresh.csv")
    assert PriceTable.load(tmp_path / "fresh.csv").rows() == fresh.rows()


def test_cli_refresh_prices_whole_instances_and_reports_what_the_catalog_lacks(skypilot, sky_cache, tmp_path,
                                                                                capsys):
    schema = skypilot[1]
    (sky_cache / "gcp").mkdir()
    (sky_cache / "gcp" / "vms.csv").write_text(GCP_CATALOG)
    path = _table(tmp_path, ROW_H100 + ",", "gcp,a3-highgpu-8g,H100,8,88.25,20.2,gcp page,2025-06-05,",
                  "aws,g5.48xlarge,A10G,8,16.288,5.5,aws list,2025-06-05,",
                  "aws,g6.xlarge,L4,1,0.8048,0.3,aws list,2025-06-05,",
                  ROW_H100 + ",us-west-2",  # a region the catalog does not price it in
                  header=HEADER + ",region")
    out = tmp_path / "fresh.csv"
    assert main(["prices", "--table", str(path), "--refresh", "sky", "--json", "--write", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines()[:-1] == [
        f"spotlight: not refreshed: g5.48xlarge: not in SkyPilot's catalog {schema}/aws",
        f"spotlight: not refreshed: g6.xlarge: SkyPilot's catalog {schema}/aws has no spot price in us-east-1; "
        "spot price kept",
        f"spotlight: not refreshed: p5.48xlarge: not in SkyPilot's catalog {schema}/aws for region us-west-2",
    ]
    rows = {(r["instance_type"], r["region"]): r for r in json.loads(captured.out)}
    old = PriceTable.load(path)
    assert rows["p5.48xlarge", ""]["spot_usd_h"] == 22.0 and rows["p5.48xlarge", ""]["date"] == _today()
    assert rows["g6.xlarge", ""]["ondemand_usd_h"] == 0.805 and rows["g6.xlarge", ""]["spot_usd_h"] == 0.3
    a3 = rows["a3-highgpu-8g", ""]  # the VM plus its 8 GPUs, as SkyPilot prices a node; spot: zones a and b
    assert a3["ondemand_usd_h"] == pytest.approx(9.46 + 78.37)
    assert a3["spot_usd_h"] == pytest.approx(((1.70 + 14.11) + (1.80 + 15.00)) / 2)
    assert a3["source"].endswith(f"catalog {schema}/gcp us-central1; spot: median over 2 zones")
    for key in (("g5.48xlarge", ""), ("p5.48xlarge", "us-west-2")):  # what the catalog lacks: as it was
        assert rows[key] == old.row(*key).to_dict()
    assert [r.to_dict() for r in PriceTable.load(out).rows()] == json.loads(captured.out)


def test_cli_refresh_without_skypilots_environment_is_one_line_saying_how_to_make_it(tmp_path, monkeypatch,
                                                                                    capsys):
    monkeypatch.setenv(sky.SKY_PYTHON_ENV, str(tmp_path / "no-such-python"))
    assert main(["prices", "--refresh", "sky"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"spotlight: error: --refresh sky: ${sky.SKY_PYTHON_ENV} names {tmp_path}/no-such-python")
    assert "`make sky-venv`" in err and err.count("\n") == 1
    monkeypatch.delenv(sky.SKY_PYTHON_ENV)
    monkeypatch.setattr(sky, "DEFAULT_SKY_PYTHON", tmp_path / ".venv-sky" / "bin" / "python")  # none made
    assert main(["prices", "--refresh", "sky"]) == 2
    err = capsys.readouterr().err
    assert err == ("spotlight: error: --refresh sky: no SkyPilot environment (create it with `make sky-venv`, "
                   f"or set ${sky.SKY_PYTHON_ENV})\n")
