"""`cloud.sky` and `spotlight launch`: the SkyPilot tasks of a run, checked by SkyPilot itself.

The real check runs SkyPilot's Python (`$SPOTLIGHT_SKY_PYTHON` or `.venv-sky`, `make sky-venv`); it
is skipped without one, except under CI, where it must run. Launching is tested against a fake `sky`
executable that records its arguments.
"""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from cloud import node_setup, sky
from cloud.credentials import AWS_KEYS, AWS_PLACE, GCS_KEY_ENV
from spotlight.cli import main
from spotlight.config import ConfigError, load_config, to_yaml

from conftest import small_dit_config


def _fleet(**cloud):
    """The tiny DiT with 3 spot nodes and two fall-back GPUs (spelled in odd cases)."""
    base = {"gpu": "h100", "fallback_gpus": ["A100-80GB", "l4"], "job_recovery": "EAGER_NEXT_REGION",
            "max_restarts_on_errors": 5}
    return small_dit_config(runtime={"kind": "ray", "spot_workers": 3}, cloud={**base, **cloud})


def write_tasks(cfg, out, name):
    """The tasks of run config `cfg`, as `spotlight launch` writes them."""
    return sky.write_tasks(cfg.cloud, cfg.runtime.spot_workers, to_yaml(cfg), out, name)


def _config_file(tmp_path, cfg, name="fleet_run.yaml"):
    path = tmp_path / name
    path.write_text(to_yaml(cfg))
    return path


def _load(path):
    return yaml.safe_load(Path(path).read_text())


def _group(path):
    """A job group file's documents: header, head, spot tasks."""
    return list(yaml.safe_load_all(Path(path).read_text()))


@pytest.fixture
def no_sky(monkeypatch, tmp_path):
    monkeypatch.setenv(sky.SKY_PYTHON_ENV, str(tmp_path / "no-such-python"))


@pytest.fixture(autouse=True)
def no_store_credentials(monkeypatch):
    """No store credentials from the machine running the tests: each test sets what it needs."""
    for name in (*AWS_KEYS, *AWS_PLACE, GCS_KEY_ENV, "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(name, raising=False)


# ---- the tasks ----------------------------------------------------------------------------------


def test_a_run_becomes_one_job_group_of_an_on_demand_head_and_a_task_per_spot_node(tmp_path):
    cfg = _fleet()
    paths = write_tasks(cfg, tmp_path / "tasks", "fleet")
    assert [p.name for p in paths] == ["fleet.yaml"]
    assert sorted(p.name for p in (tmp_path / "tasks").iterdir()) == ["fleet.yaml", "run.yaml"]

    header, head, *spots = _group(paths[0])
    # one managed job; the head is primary: when it ends, SkyPilot ends the rest
    assert header == {"name": "fleet", "execution": "parallel", "primary_tasks": ["head"], "termination_delay": "30s"}
    assert head["name"] == "head" and head["num_nodes"] == 1
    assert head["resources"]["use_spot"] is False
    assert head["resources"]["accelerators"] == "H100:1"
    assert head["resources"]["job_recovery"] == {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 5}
    assert sky.RAY_PORT in head["resources"]["ports"]
    assert head["workdir"] == str(sky.REPO_ROOT)
    assert head["setup"] == node_setup.SETUP and "image_id" not in head["resources"]
    # The head mounts the resolved config and trains it on the Ray cluster it starts.
    (remote, local), = head["file_mounts"].items()
    assert local == str((tmp_path / "tasks" / "run.yaml").resolve())
    assert load_config(local).to_dict() == cfg.to_dict()
    assert head["secrets"] == {sky.TOKEN_ENV: ""}
    # the node meets the others through the store (spotlight/fleet_node.py, tests/spotlight/test_launched_fleet.py)
    assert head["run"].rstrip().endswith(f"exec python -m spotlight.fleet_node head --config {remote} --name fleet "
                                         "--out ~/spotlight/runs/fleet")

    # runtime.spot_workers = 3: a task of one node each, so that a preemption recovers one node
    assert [(t["name"], t["num_nodes"]) for t in spots] == [("spot-0", 1), ("spot-1", 1), ("spot-2", 1)]
    for t in spots:
        res = t["resources"]
        assert res["use_spot"] is True
        assert res["any_of"] == [{"accelerators": "H100:1"}, {"accelerators": "A100-80GB:1"},
                                 {"accelerators": "L4:1"}]
        assert res["job_recovery"]["strategy"] == "EAGER_NEXT_REGION"
        assert res["job_recovery"]["max_restarts_on_errors"] == 5
        assert "envs" not in t and t["secrets"] == {sky.TOKEN_ENV: ""}
        # no host name: it reads the head's address from the store, so it has the run config too
        assert t["file_mounts"] == head["file_mounts"]
        assert t["run"].rstrip().endswith(f"exec python -m spotlight.fleet_node spot --config {remote} --name fleet")
        assert res["job_recovery"]["recover_on_exit_codes"] == [sky.HEAD_LOST]
    assert all(t["setup"] == head["setup"] for t in spots)  # one pinned environment on every node
    for task in [head, *spots]:  # the scripts are bash that parses
        for script in (task["setup"], task["run"]):
            subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_ordered_fallbacks_a_single_gpu_and_the_infra(tmp_path):
    ordered = _group(write_tasks(_fleet(accelerator_order="ordered", gpus_per_node=8), tmp_path / "a", "a")[0])
    assert ordered[2]["resources"]["ordered"][0] == {"accelerators": "H100:8"}
    assert "any_of" not in ordered[2]["resources"]

    single = _group(write_tasks(_fleet(fallback_gpus=[], provider="gcp", region="us-central1"), tmp_path / "b", "b")[0])
    worker = single[2]["resources"]
    assert worker["accelerators"] == "H100:1" and "any_of" not in worker
    assert {t["resources"]["infra"] for t in single[1:]} == {"gcp/us-central1"}
    region_only = _group(write_tasks(_fleet(region="eu-west-1"), tmp_path / "c", "c")[0])
    assert region_only[1]["resources"]["infra"] == "*/eu-west-1"
    # a recovered node stays in the head's region by default
    assert _fleet(job_recovery="FAILOVER").cloud.job_recovery == small_dit_config().cloud.job_recovery == "FAILOVER"


def test_a_rewrite_drops_old_task_files_and_a_head_alone_is_a_group_of_one(tmp_path):
    out = tmp_path / "tasks"
    out.mkdir()
    for old in ("head.yaml", "workers-0.yaml", "workers-1.yaml"):  # an earlier version's files
        (out / old).write_text("name: x\n")
    write_tasks(_fleet(), out, "r")
    assert sorted(p.name for p in out.iterdir()) == ["fleet.yaml", "run.yaml"]
    head_only = small_dit_config(runtime={"kind": "ray", "spot_workers": 0, "ondemand_workers": 1})
    assert [d["name"] for d in _group(write_tasks(head_only, out, "r")[0])] == ["r", "head"]
    with pytest.raises(ConfigError, match=r"runtime.spot_workers: a launched fleet has at most 1024 spot nodes"):
        write_tasks(small_dit_config(runtime={"kind": "ray", "spot_workers": 1025}), tmp_path / "x", "r")


def test_a_node_refuses_to_start_without_the_token(tmp_path):
    _, head, spot, *_ = _group(write_tasks(_fleet(), tmp_path, "r")[0])
    for task in (spot, head):
        proc = subprocess.run(["bash", "-c", task["run"]], capture_output=True, text=True, timeout=10,
                              env={**os.environ, sky.TOKEN_ENV: ""})
        assert proc.returncode != 0 and "the Ray token of this fleet" in proc.stderr


def test_the_price_tables_gpus_are_known_too(tmp_path):
    prices = tmp_path / "prices.csv"
    prices.write_text("instance_type,gpu,gpus,ondemand_usd_h,spot_usd_h,source,date\n"
                      "x9.large,MI300X,1,6.0,2.0,test,2025-01-01\n")
    assert sky.known_gpus(prices)["mi300x"] == "MI300X"
    assert sky.accelerators(_fleet(gpu="mi300x", fallback_gpus=["H100"], prices=str(prices)).cloud) == ["MI300X", "H100"]
    assert "mi300x" not in sky.known_gpus(tmp_path / "missing.csv")


def test_run_names_are_cluster_names():
    assert sky.run_name("experiments/tiny_dit.yaml") == "tiny-dit"
    assert sky.run_name("runs/2024_Q1.yaml") == "run-2024-q1"
    with pytest.raises(ConfigError, match="--name"):
        sky.check_name("Has_Underscore")


# ---- the CLI ------------------------------------------------------------------------------------

STORE = ["--checkpoint-uri", "s3://fleet-bucket/runs/tiny"]


@pytest.mark.parametrize("cloud, field, bad", [
    ({"gpu": "H900"}, "cloud.gpu", "'H900'"),
    ({"fallback_gpus": ["A100", "X1"]}, "cloud.fallback_gpus[1]", "'X1'"),
])
def test_an_unknown_gpu_is_one_line_and_writes_nothing(tmp_path, capsys, cloud, field, bad):
    config = _config_file(tmp_path, _fleet(**cloud))
    assert main(["launch", str(config), "--dryrun", "--out", str(tmp_path / "tasks")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"spotlight: error: {config}: {field}: expected an accelerator SkyPilot knows")
    assert line.endswith(f"got {bad}") and "H100" in line
    assert not (tmp_path / "tasks").exists()


def test_without_skypilot_the_dryrun_writes_the_tasks_and_says_validation_was_skipped(tmp_path, capsys, no_sky):
    config = _config_file(tmp_path, _fleet())
    out = tmp_path / "tasks"
    assert main(["launch", str(config), "--dryrun", "--out", str(out), *STORE]) == 0
    err = capsys.readouterr().err
    assert "SkyPilot validation skipped" in err and sky.SKY_PYTHON_ENV in err
    assert sorted(p.name for p in out.glob("*.yaml")) == ["fleet.yaml", "run.yaml"]
    assert _group(out / "fleet.yaml")[2]["resources"]["use_spot"] is True

    assert main(["launch", str(config), "--dryrun", "--strict", "--out", str(out), *STORE]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("spotlight: error: SkyPilot validation skipped (--strict)")
    assert main(["launch", str(config), "--out", str(out), *STORE]) == 2  # launching needs SkyPilot
    assert capsys.readouterr().err.startswith("spotlight: error: cannot launch:")


def test_launch_runs_a_cloud_version_of_the_config_and_says_what_it_changed(tmp_path, capsys, no_sky):
    cfg = _fleet(provider="aws")
    assert (cfg.device, cfg.runtime.notice_sources, cfg.cloud.checkpoint_uri) == ("cpu", [], None)
    config = _config_file(tmp_path, cfg)
    out = tmp_path / "tasks"
    assert main(["launch", str(config), "--dryrun", "--out", str(out), *STORE]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("run.yaml for the fleet:")]
    assert said == ["run.yaml for the fleet: cloud.checkpoint_uri: null -> s3://fleet-bucket/runs/tiny",
                    "run.yaml for the fleet: device: cpu -> cuda",
                    "run.yaml for the fleet: runtime.notice_sources: [] -> [aws, sigterm]"]
    launched = load_config(out / "run.yaml")
    assert launched.device == "cuda" and launched.runtime.notice_sources == ["aws", "sigterm"]
    assert launched.cloud.checkpoint_uri == "s3://fleet-bucket/runs/tiny"
    assert launched.train == cfg.train and launched.policy == cfg.policy  # what it computes is unchanged
    # SkyPilot picks the cloud: both metadata endpoints are watched
    out2 = tmp_path / "tasks2"
    assert main(["launch", str(_config_file(tmp_path, _fleet(), "any.yaml")), "--dryrun", "--out", str(out2), *STORE]) == 0
    assert load_config(out2 / "run.yaml").runtime.notice_sources == ["aws", "gcp", "sigterm"]


@pytest.mark.parametrize("flags, says", [
    ([], "spotlight launch needs --checkpoint-uri s3://BUCKET/PREFIX"),
    (["--checkpoint-uri", "file:///tmp/ckpt"], "a folder is on the head's disk"),
    # outside $SPOTLIGHT_STORE_ROOTS too: what a launch needs is said first (issue 42)
    (["--checkpoint-uri", "/srv/ckpt"], "--checkpoint-uri '/srv/ckpt': a folder is on the head's disk"),
    (["--checkpoint-uri", "s3://"], "--checkpoint-uri: "),
])
def test_launch_refuses_a_fleet_without_an_object_store_in_one_line(tmp_path, capsys, no_sky, monkeypatch, flags, says):
    monkeypatch.setenv("SPOTLIGHT_STORE_ROOTS", "/tmp")
    config = _config_file(tmp_path, _fleet())
    assert main(["launch", str(config), "--dryrun", "--out", str(tmp_path / "tasks"), *flags]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("spotlight: error: ") and says in line, line
    assert not (tmp_path / "tasks").exists()


def test_skypilot_accepts_the_generated_tasks(tmp_path, capsys, monkeypatch, sky_python):
    monkeypatch.setenv(sky.SKY_PYTHON_ENV, str(sky_python))
    config = _config_file(tmp_path, _fleet(provider="aws", region="us-east-1"))
    out = tmp_path / "tasks"
    assert main(["launch", str(config), "--dryrun", "--strict", "--out", str(out), *STORE]) == 0
    printed = capsys.readouterr()
    assert "validated with SkyPilot 0.14" in printed.out, printed.err
    assert [t["resources"]["use_spot"] for t in _group(out / "fleet.yaml")[1:]] == [False, True, True, True]


def test_a_task_skypilot_rejects_is_named_with_skypilots_reason(tmp_path, sky_python):
    (fleet,) = write_tasks(_fleet(), tmp_path, "r")
    broken = tmp_path / "broken.yaml"
    docs = _group(fleet)
    docs[2]["resources"]["use_spot"] = "yes"
    broken.write_text(yaml.safe_dump_all(docs))
    checked = sky.validate([fleet, broken], sky_python)  # one subprocess for both
    assert checked.version.startswith("0.14")
    assert list(checked.errors) == [broken]
    assert "use_spot" in checked.errors[broken] and "\n" not in checked.errors[broken]


# ---- launching ----------------------------------------------------------------------------------


def _fake_sky(tmp_path, fail_on=None, record=()):
    """A `sky` executable that records its argv and the token in its environment (and the
    variables named in `record`, in sky-env.json), and fails on `fail_on`."""
    log = tmp_path / "sky-calls.jsonl"
    env_log = tmp_path / "sky-env.json"
    exe = tmp_path / "bin" / "sky"
    exe.parent.mkdir()
    exe.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import json, sys
        import os
        args = sys.argv[1:]
        with open({str(log)!r}, "a") as f:
            f.write(json.dumps(args + ["token=" + os.environ.get("SPOTLIGHT_RAY_TOKEN", "")]) + "\\n")
        with open({str(env_log)!r}, "w") as f:
            json.dump({{name: os.environ.get(name) for name in {list(record)!r}}}, f)
        if {fail_on!r} is not None and args[:2] == {fail_on!r}:
            print("sky: no spot capacity anywhere", file=sys.stderr)
            sys.exit(3)
        """))
    exe.chmod(0o755)
    return exe, log


def test_launch_submits_the_fleet_as_one_managed_job_with_a_fresh_token_as_a_secret(tmp_path):
    paths = write_tasks(_fleet(), tmp_path / "tasks", "fleet")
    exe, log = _fake_sky(tmp_path)
    sky.launch_tasks(paths, "fleet", exe)
    sky.launch_tasks(paths, "fleet", exe)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    # Every node gets the token as a secret taken from sky's environment, in no command line;
    # another launch makes another token.
    tokens = [call.pop() for call in calls]
    assert all(re.fullmatch(r"token=[0-9a-f]{64}", t) for t in tokens) and tokens[0] != tokens[1]
    assert calls == [["jobs", "launch", str(paths[0]), "--secret", "SPOTLIGHT_RAY_TOKEN", "-y", "-d"]] * 2


def test_a_failed_launch_is_one_line_naming_the_command(tmp_path):
    paths = write_tasks(_fleet(), tmp_path / "tasks", "fleet")
    exe, log = _fake_sky(tmp_path, fail_on=["jobs", "launch"])
    with pytest.raises(sky.SkyError, match=r"^`sky jobs launch .*fleet.yaml --secret SPOTLIGHT_RAY_TOKEN -y -d` exited with 3"):
        sky.launch_tasks(paths, "fleet", exe)


def _sky_beside_python(tmp_path, monkeypatch, sky_python, record=()):
    """A fake `sky` beside a Python that is SkyPilot's (what launch validates with, then runs)."""
    exe, log = _fake_sky(tmp_path, record=record)
    python = exe.parent / "python"
    python.write_text(f"#!/bin/sh\nexec {sky_python} \"$@\"\n")
    python.chmod(0o755)
    monkeypatch.setenv(sky.SKY_PYTHON_ENV, str(python))
    return exe, log


def test_launch_says_the_fleet_stops_by_itself_and_how_to_stop_it_now(tmp_path, capsys, monkeypatch, sky_python):
    exe, log = _sky_beside_python(tmp_path, monkeypatch, sky_python)
    config = _config_file(tmp_path, _fleet(provider="aws", region="us-east-1"))
    assert main(["launch", str(config), "--out", str(tmp_path / "tasks"), "--name", "fleet", *STORE]) == 0
    out = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(out) if line.startswith("submitted the fleet"))
    assert out[at] == ("submitted the fleet as the managed job group fleet: the head (on demand) and 3 spot nodes, "
                       "each recovered on its own; it goes down by itself when the run ends (done, failed or out of "
                       "budget)")
    assert out[at + 1] == "next steps (the walkthrough: docs/launch-on-aws-gcp.md):"
    commands = {line[2:10].strip(): line[10:].partition("  # ")[0].rstrip() for line in out[at + 2:]}
    exe = sky.shown(exe)  # the `sky` launch ran, beside SkyPilot's Python
    assert commands == {"status": f"spotlight status {STORE[1]}", "queue": f"{exe} jobs queue",
                        "logs": f"{exe} jobs logs -n fleet", "cancel": f"{exe} jobs cancel -y -n fleet",
                        "pull": f"spotlight pull {STORE[1]} --out runs/fleet"}  # no launch line: it is launched
    assert [json.loads(line)[:2] for line in log.read_text().splitlines()] == [["jobs", "launch"]]


_LOADED = r"""
import json, sys
from sky.utils import dag_utils
dag = dag_utils.load_dag_from_yaml(sys.argv[1])
print("SPOTLIGHT-SKY " + json.dumps({
    "job_group": dag.is_job_group(), "primary": dag.primary_tasks,
    "termination_delay_s": dag.get_termination_delay_secs("spot-0"),
    "tasks": [{"name": t.name, "nodes": t.num_nodes, "secrets": sorted(t.secrets), "run": t.run, "setup": t.setup,
               "resources": [{"spot": r.use_spot, "cloud": str(r.cloud), "region": r.region, "ports": r.ports,
                              "recovery": r.job_recovery} for r in t.resources]} for t in dag.tasks]}))
"""


def test_skypilot_loads_a_fleet_that_bills_only_what_it_should(tmp_path, sky_python):
    """Read back by SkyPilot itself (its loader, offline): spot only on the spot nodes, one cloud and
    region for all, one node per recoverable task, Ray's open ports only with token auth, the head
    primary (the group ends with it), the pinned environment on every node."""
    (fleet,) = write_tasks(_fleet(provider="aws", region="us-east-1", job_recovery="FAILOVER"), tmp_path, "f")
    proc = subprocess.run([str(sky_python), "-c", _LOADED, str(fleet)], capture_output=True, text=True, timeout=300)
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("SPOTLIGHT-SKY ")] or [proc.stderr]
    dag = json.loads(line.removeprefix("SPOTLIGHT-SKY "))
    assert dag["job_group"] and dag["primary"] == ["head"] and dag["termination_delay_s"] == 30
    tasks = {t["name"]: t for t in dag["tasks"]}
    assert list(tasks) == ["head", "spot-0", "spot-1", "spot-2"]
    for name, task in tasks.items():
        spot = name != "head"
        assert task["nodes"] == 1, name
        for r in task["resources"]:
            assert r["spot"] is spot and (r["cloud"], r["region"]) == ("AWS", "us-east-1"), (name, r)
            lost = {} if name == "head" else {"recover_on_exit_codes": [sky.HEAD_LOST]}  # a spot node without a head
            assert r["recovery"] == {"strategy": "FAILOVER", "max_restarts_on_errors": 5, **lost}, (name, r)
            if r["ports"]:  # opened to any address by SkyPilot: Ray must ask for the token
                assert "export RAY_AUTH_MODE=token" in task["run"] and task["secrets"] == ["SPOTLIGHT_RAY_TOKEN"]
        assert "uv pip install --quiet" in task["setup"] and "-r cloud/fleet.lock" in task["setup"], name
    assert "python -m spotlight.fleet_node head" in tasks["head"]["run"]  # it publishes itself in the store


# ---- the store's credentials ---------------------------------------------------------------------


def _files_text(folder):
    return "".join(p.read_text(errors="replace") for p in Path(folder).rglob("*") if p.is_file())


def test_the_stores_credentials_reach_the_head_as_secrets_and_no_file_or_output(tmp_path, capsys, monkeypatch,
                                                                                sky_python):
    keys = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEYID0001", "AWS_SECRET_ACCESS_KEY": "s3cr3t-value-never-shown",
            "AWS_ENDPOINT_URL": "https://storage.example.test"}
    for name, value in keys.items():
        monkeypatch.setenv(name, value)
    exe, log = _sky_beside_python(tmp_path, monkeypatch, sky_python, record=list(keys))
    config = _config_file(tmp_path, _fleet(provider="aws", region="us-east-1"))
    out = tmp_path / "tasks"
    assert main(["launch", str(config), "--out", str(out), "--name", "fleet", *STORE]) == 0  # validated, submitted
    printed = capsys.readouterr()
    (call,) = [json.loads(line) for line in log.read_text().splitlines()]
    secrets_passed = [call[i + 1] for i, a in enumerate(call) if a == "--secret"]
    assert sorted(secrets_passed) == sorted(["SPOTLIGHT_RAY_TOKEN", *keys])
    assert json.loads((tmp_path / "sky-env.json").read_text()) == keys  # the values: in sky's environment only
    docs = _group(out / "fleet.yaml")
    assert docs[1]["secrets"] == {"SPOTLIGHT_RAY_TOKEN": "", **{k: "" for k in keys}}  # names, no values
    assert all(task["secrets"] == docs[1]["secrets"] for task in docs[2:])  # the spot nodes read the store too
    for value in keys.values():
        assert value not in _files_text(out) and value not in printed.out + printed.err and value not in json.dumps(call)
    assert "store credentials for every node (SkyPilot secrets): AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY" in printed.out


def test_a_gcs_key_file_goes_to_the_head_as_one_secret(tmp_path, capsys, no_sky, monkeypatch):
    key = {"type": "service_account", "project_id": "p", "private_key": "-----BEGIN PRIVATE KEY-----never-shown",
           "client_email": "run@p.iam.gserviceaccount.com", "token_uri": "https://oauth2.googleapis.com/token"}
    (tmp_path / "key.json").write_text(json.dumps(key))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "key.json"))
    config = _config_file(tmp_path, _fleet(provider="gcp"))
    out = tmp_path / "tasks"
    assert main(["launch", str(config), "--dryrun", "--out", str(out), "--checkpoint-uri", "gs://fleet-bucket/r"]) == 0
    printed = capsys.readouterr()
    assert _group(out / "fleet.yaml")[1]["secrets"] == {"SPOTLIGHT_RAY_TOKEN": "", GCS_KEY_ENV: ""}
    assert "never-shown" not in _files_text(out) + printed.out + printed.err
    # a user's own login (not a service-account key) cannot be handed to a machine: one line
    (tmp_path / "key.json").write_text(json.dumps({"type": "authorized_user", "refresh_token": "never-shown"}))
    assert main(["launch", str(config), "--dryrun", "--out", str(out), "--checkpoint-uri", "gs://fleet-bucket/r"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "is not a service-account key" in line and "never-shown" not in line


@pytest.mark.parametrize("provider, uri, says", [
    ("gcp", "s3://fleet-bucket/r", "no AWS credentials in this environment"),
    ("aws", "gs://fleet-bucket/r", "no GCS service-account key in this environment"),
])
def test_a_store_the_fleet_could_not_reach_is_refused_in_one_line(tmp_path, capsys, no_sky, provider, uri, says):
    config = _config_file(tmp_path, _fleet(provider=provider))
    assert main(["launch", str(config), "--dryrun", "--out", str(tmp_path / "t"), "--checkpoint-uri", uri]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("spotlight: error: ") and says in line
    assert not (tmp_path / "t").exists()


def test_without_keys_an_aws_head_uses_its_instance_role_and_says_so(tmp_path, capsys, no_sky):
    config = _config_file(tmp_path, _fleet(provider="aws"))
    assert main(["launch", str(config), "--dryrun", "--out", str(tmp_path / "t"), *STORE]) == 0
    assert "the nodes reach S3 with their instance role" in capsys.readouterr().out
    assert _group(tmp_path / "t" / "fleet.yaml")[1]["secrets"] == {"SPOTLIGHT_RAY_TOKEN": ""}


def test_half_a_key_pair_is_refused(tmp_path, capsys, no_sky, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    config = _config_file(tmp_path, _fleet(provider="aws"))
    assert main(["launch", str(config), "--dryrun", "--out", str(tmp_path / "t"), *STORE]) == 2
    assert "AWS_SECRET_ACCESS_KEY go together" in capsys.readouterr().err


def test_the_smoke_run_of_the_aws_gcp_page_launches_as_the_page_says(tmp_path, capsys, monkeypatch, sky_python):
    """docs/launch-on-aws-gcp.md, step 4: its config, its command, the lines it shows."""
    monkeypatch.setenv(sky.SKY_PYTHON_ENV, str(sky_python))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "example")
    out = tmp_path / "cloud_smoke"
    smoke = sky.REPO_ROOT / "experiments" / "cloud_smoke.yaml"
    assert main(["launch", str(smoke), "--checkpoint-uri=s3://my-spotlight-bucket/smoke", "--dryrun", "--strict",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    page = (sky.REPO_ROOT / "docs" / "launch-on-aws-gcp.md").read_text()
    for line in printed[:4]:
        assert line in page, line
    steps = printed.index("next steps (the walkthrough: docs/launch-on-aws-gcp.md):")
    assert printed[steps - 1].startswith("validated with SkyPilot 0.14.1")
    for line in printed[steps:]:  # the page shows them too (`sky` where .venv-sky is, --out the default)
        if line.startswith(("  status", "  pull")) or line == printed[steps]:
            assert line in page, line
    docs = _group(out / "fleet.yaml")
    assert [d["name"] for d in docs[1:]] == ["head", "spot-0", "spot-1"]
    assert docs[1]["resources"]["accelerators"] == "T4:1" and docs[1]["resources"]["infra"] == "aws/us-east-1"
    launched = load_config(out / "run.yaml")
    assert launched.device == "cuda" and launched.cloud.budget_usd == 2.0
