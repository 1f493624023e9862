"""`spotlight launch --dryrun` prints the bill (`cloud.bill`): every figure recomputed here from the
price table and the config; the toy-config warning; a GPU without a price is one line."""

import re
from pathlib import Path

import pytest

from cloud import sky
from cloud.prices import PriceTable
from spotlight.cli import main
from spotlight.config import to_yaml

from conftest import small_dit_config

REPO = Path(__file__).resolve().parents[2]
STORE = ["--checkpoint-uri", "s3://fleet-bucket/runs/bill"]


@pytest.fixture(autouse=True)
def no_sky(monkeypatch, tmp_path):
    """No SkyPilot: the bill is printed without it (and SkyPilot's validation takes seconds)."""
    monkeypatch.setenv(sky.SKY_PYTHON_ENV, str(tmp_path / "no-such-python"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def _launch(tmp_path, capsys, config: Path, *flags: str) -> dict[str, list[str]]:
    assert main(["launch", str(config), "--dryrun", "--out", str(tmp_path / "tasks"), *STORE, *flags]) == 0
    printed = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(printed) if line.startswith("the bill:"))
    rows: dict[str, list[str]] = {}
    label = ""
    for line in printed[start + 1:]:
        if not line.startswith("  "):
            rows.setdefault("after", []).append(line)
            continue
        label = line[2:10].strip() or label
        rows.setdefault(label, []).append(line[10:])
    return {"title": [printed[start]], **rows}


def _usd(x: float) -> str:
    return f"${x:,.2f}" if x >= 0.995 else f"${x:.4g}"


def test_the_dry_run_prints_the_bill_of_the_fleet_from_the_price_table(tmp_path, capsys):
    scale = 0.5
    cfg = small_dit_config(runtime={"kind": "ray", "spot_workers": 3},
                           cloud={"gpu": "H100", "gpus_per_node": 8, "fallback_gpus": ["a100-80gb"],
                                  "budget_usd": 500.0, "price_scale": scale, "provider": "aws", "region": "us-east-1"})
    config = tmp_path / "fleet.yaml"
    config.write_text(to_yaml(cfg))
    rows = _launch(tmp_path, capsys, config, "--name", "bill-run")
    table = PriceTable.load()
    h100, a100 = table.row("p5.48xlarge", "us-east-1"), table.row("p4de.24xlarge", "us-east-1")
    od, spot = h100.ondemand_usd_h * scale, h100.spot_usd_h * scale
    assert "cloud/prices.csv x 0.5 (cloud.price_scale)" in rows["title"][0]
    assert rows["tasks"] == ["head (on demand) + 3 spot nodes, each its own task"]
    (head,) = rows["head"]
    assert re.fullmatch(rf"1 x H100:8 on demand\s+\{_usd(od)}/h", head), head
    first, other = rows["spot"]
    assert re.fullmatch(rf"3 x H100:8 spot \(or A100-80GB:8\)\s+3 x \{_usd(spot)}/h = \{_usd(3 * spot)}/h  "
                        rf"\(on demand: \{_usd(od)}/h each\)", first), first
    assert re.fullmatch(rf"\s+or A100-80GB:8\s+3 x \{_usd(a100.spot_usd_h * scale)}/h = "
                        rf"\{_usd(3 * a100.spot_usd_h * scale)}/h  \(on demand: \{_usd(a100.ondemand_usd_h * scale)}/h each\)",
                        other), other
    now, worst = od + 3 * spot, 4 * od
    (total,) = rows["total"]
    assert total.startswith(f"{_usd(now)}/h now; {_usd(worst)}/h if every spot node ran on demand; "
                            f"{_usd(od + 3 * a100.spot_usd_h * scale)}-{_usd(now)}/h over the spot choices"), total
    assert [p.split(":")[0] for p in rows["prices"]] == ["H100", "A100-80GB"]
    assert f"p5.48xlarge, aws us-east-1, {h100.date}: {h100.source}" in rows["prices"][0]
    assert f"p4de.24xlarge, aws us-east-1, {a100.date}: {a100.source}" in rows["prices"][1]
    (budget,) = rows["budget"]
    assert budget.startswith("$500.00 (cloud.budget_usd)")
    assert f"at most {500 / now:.1f} h at these prices, {500 / worst:.1f} h if every spot node ran on demand" in budget
    # after the bill, the next steps (tests/cloud/test_launch_next_steps.py): the launch and cancel commands among them
    assert rows["launch"][0] == (f"spotlight launch {config} --name bill-run --checkpoint-uri s3://fleet-bucket/runs/bill "
                                 f"--out {tmp_path / 'tasks'}")
    assert rows["cancel"][0].partition("  # ")[0].rstrip() == "sky jobs cancel -y -n bill-run"


def test_a_toy_config_headed_for_h100s_is_warned_about_and_a_gpu_config_is_not(tmp_path, capsys):
    rows = _launch(tmp_path, capsys, REPO / "experiments" / "tiny_dit.yaml")
    (warning,) = [line for line in rows["after"] if line.startswith("warning:")]
    assert "experiments/tiny_dit.yaml is a toy run (device: cpu; the tiny DiT, no pretrained_path)" in warning
    assert "would rent 3 nodes of 1 x H100" in warning
    assert rows["budget"] == ["no budget (cloud.budget_usd): the fleet runs until the run ends"]
    rows = _launch(tmp_path, capsys, REPO / "experiments" / "qwen_image_ocr_lora.yaml")
    assert not [line for line in rows.get("after", []) if "toy run" in line]
    # ... though its model folder and prompts are paths on a machine of the user's (issue 42)
    assert [line.partition(":")[2].partition(" will")[0] for line in rows["after"] if line.startswith("warning:")] \
        == [" policy.pretrained_path: '/data/Qwen-Image'", " prompts.path: 'dataset/ocr'"]
    assert rows["tasks"] == ["head (on demand) + 8 spot nodes, each its own task"]


def test_a_gpu_without_a_price_is_one_line_not_a_crash(tmp_path, capsys):
    cfg = small_dit_config(runtime={"kind": "ray", "spot_workers": 2}, cloud={"gpu": "T4", "fallback_gpus": ["B200"]})
    config = tmp_path / "b200.yaml"
    config.write_text(to_yaml(cfg))
    rows = _launch(tmp_path, capsys, config)
    (_, b200) = rows["spot"]
    assert "no price: the price table (cloud/prices.csv) has no B200 row" in b200
    assert rows["total"][0].startswith("$")  # the fleet's own GPU is priced


def test_local_inputs_a_rented_node_will_not_have_are_warned_about(tmp_path, monkeypatch):
    from spotlight.launch_config import inputs_warnings

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "data").mkdir(parents=True)
    elsewhere.mkdir()
    for path in (project / "data" / "p.txt", project / "data" / "ignored.txt", elsewhere / "q.txt", project / "r.py"):
        path.write_text("a red square\n" if path.suffix == ".txt" else "def score(o, p, m): return [0.0] * len(o)\n")

    def warned(cwd, **parts):
        lines = inputs_warnings(small_dit_config(**parts), cwd, project, lambda p: p.name == "ignored.txt")
        assert all(line.startswith("warning: ") and "\n" not in line for line in lines)
        return lines

    monkeypatch.chdir(project)  # the config's paths are read from the working directory
    assert warned(project, prompts={"path": "data/p.txt"},
                  reward={"components": [{"function": "r.py:score"}]}) == []  # uploaded, same path on the node
    (outside,) = warned(project, prompts={"path": str(elsewhere / "q.txt")})
    assert outside.startswith(f"warning: prompts.path: '{elsewhere / 'q.txt'}' will not exist on a rented node "
                              f"(SkyPilot uploads the project folder {project.resolve()} only)")
    (absolute,) = warned(project, prompts={"eval_path": str(project / "data" / "p.txt")})
    assert "(the nodes read it from the project folder: write it as 'data/p.txt')" in absolute
    (ignored,) = warned(project, prompts={"path": "data/ignored.txt"})
    assert "(git ignores it, so SkyPilot does not upload it)" in ignored
    monkeypatch.chdir(project / "data")
    (moved,) = warned(project / "data", prompts={"path": "p.txt"})
    assert "write it as 'data/p.txt'" in moved
    # a model folder in a bucket is fetched by each node: nothing to warn about
    assert warned(project, policy={"pretrained_path": "s3://bucket/models/qwen"}) == []


def test_the_dry_run_is_also_spelled_dry_run_and_warns_of_local_inputs(tmp_path, capsys):
    prompts = tmp_path / "mine.txt"
    prompts.write_text("a red square\n")
    config = tmp_path / "fleet.yaml"
    config.write_text(to_yaml(small_dit_config(runtime={"kind": "ray", "spot_workers": 1},
                                               prompts={"path": str(prompts)})))
    assert main(["launch", str(config), "--dry-run", "--out", str(tmp_path / "tasks"), *STORE]) == 0
    out = capsys.readouterr().out
    assert f"warning: prompts.path: '{prompts}' will not exist on a rented node" in out
    assert sky.not_uploaded(sky.REPO_ROOT / "runs" / "x.txt") and not sky.not_uploaded(REPO / "experiments" / "tiny_dit.yaml")
