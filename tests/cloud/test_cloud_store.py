"""S3 storage against a real S3-compatible server on loopback (moto in server mode), with a fault
proxy in front of it for the failures S3 has (tests/s3_server.py): retries under the injected
clock, permanent errors, spot prices, checkpoints pushed and pulled with their manifest, and a
run that resumes from S3 in a fresh folder with the weights of a run that never stopped."""

import json
import os
import random
import subprocess
import sys
import time
from datetime import datetime, timezone

import pytest
import torch
from safetensors.torch import load_file

from cloud.aws import S3Store, spot_price_history
from cloud.retry import Backoff
from cloud.store import MissingKey, StoreError, StoreURIError, parse_store_uri
from cloud.open_store import open_store
from conftest import small_dit_config
from s3_server import fault_proxy, s3, s3_server  # noqa: F401 (fixtures)
from schedulers.clock import ManualClock, WallClock
from spotlight.checkpoints import checkpoint
from spotlight.train.checkpoint_sync import MANIFEST, CheckpointSync
from spotlight.cli import main
from spotlight.config import ConfigError, to_yaml
from spotlight.train.trainer import Trainer

# For tests that wait in real time: 20 ms doubling to 200 ms.
QUICK = Backoff(first_s=0.02, max_wait_s=0.2, give_up_after_s=30.0)


def via(proxy, env, clock=None, backoff=Backoff(), request_attempts=1):
    """An S3Store on `env`'s bucket that talks to the server through the fault proxy. One attempt
    per request by default: the tests of the whole-operation layer (`Backoff`, on the injected
    clock) see every fault; botocore's own per-request retries have tests of their own."""
    return S3Store(env.bucket, "run", endpoint_url=proxy.url, clock=clock or ManualClock(), backoff=backoff,
                   request_attempts=request_attempts)


# ---- the store ------------------------------------------------------------------------------------


def test_the_endpoint_comes_from_AWS_ENDPOINT_URL(s3):
    store = open_store(f"s3://{s3.bucket}/runs/a/")
    assert isinstance(store, S3Store) and store.endpoint_url == s3.endpoint and store.uri == f"s3://{s3.bucket}/runs/a"
    store.put("step-000001/x", b"payload")
    assert s3.client.get_object(Bucket=s3.bucket, Key="runs/a/step-000001/x")["Body"].read() == b"payload"


def test_throttling_and_server_errors_are_retried_with_backoff_on_the_injected_clock(s3, fault_proxy, caplog):
    clock = ManualClock()
    store = via(fault_proxy, s3, clock)
    fault_proxy.fail(3, 503, "SlowDown")
    fault_proxy.fail(1, 500, "InternalError")
    fault_proxy.fail(1, 429, "TooManyRequestsException")
    store.put("a", b"kept")
    assert store.retries == 5 and fault_proxy.faults == 5
    # waits 0.25, 0.5, 1, 2, 4 s before jitter, each at least half of that
    assert 7.75 / 2 <= clock.now() <= 7.75
    assert "SlowDown" in caplog.text and "retry 5" in caplog.text
    for op in (lambda: store.get("a"), lambda: store.list(), lambda: store.delete("nothing")):
        fault_proxy.fail(2)
        op()
    assert store.retries == 11 and store.get("a") == b"kept"


def test_connection_resets_mid_upload_are_retried_and_lose_nothing(s3, fault_proxy, tmp_path):
    store = via(fault_proxy, s3)
    data = bytes(range(256)) * 8192  # 2 MiB
    (tmp_path / "w").write_bytes(data)
    fault_proxy.reset(2)
    store.put_file("w", tmp_path / "w")
    fault_proxy.reset(2)
    store.get_file("w", tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == data and store.retries == 4


def test_an_outage_delays_a_checkpoint_push_but_loses_nothing(s3, fault_proxy, tmp_path):
    run = tmp_path / "run"
    save_checkpoint(run, 2)
    store = via(fault_proxy, s3, WallClock(), QUICK)  # before the outage: making a client takes time too
    fault_proxy.down_for(0.6)  # every request answered 503 for 0.6 s of real time
    start = time.perf_counter()
    assert CheckpointSync(store).push(run, 2) is not None
    assert time.perf_counter() - start >= 0.6 and store.retries >= 3
    assert CheckpointSync(via(fault_proxy, s3)).pull(tmp_path / "fresh") == 2
    assert_same_files(run / "checkpoints", tmp_path / "fresh" / "checkpoints")


def test_retrying_ends_with_one_clear_error_when_the_budget_is_spent(s3, fault_proxy, monkeypatch, capsys):
    clock = ManualClock()
    store = via(fault_proxy, s3, clock, Backoff(give_up_after_s=30.0))
    fault_proxy.down_for(3600)
    with pytest.raises(StoreError) as err:
        store.put("a", b"x")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"PUT s3://{s3.bucket}/run/a: gave up after ")
    # Not bad input: a later try may pass. `spotlight` exits 1 on it (a launched fleet's head then
    # restarts and resumes); 2 would have told the head the run had ended (issue 41).
    from cloud.store import StoreUnavailable
    from spotlight import cli

    assert isinstance(err.value, StoreUnavailable)

    def fails(args):
        raise err.value

    monkeypatch.setattr(cli, "cmd_prices", fails)
    capsys.readouterr()  # the retries' log lines, where an earlier test's CLI sent them
    assert cli.main(["prices"]) == 1
    assert capsys.readouterr().err.strip() == "spotlight: error: " + message
    assert "ServiceUnavailable" in message and clock.now() <= 30.0


def test_permanent_errors_fail_at_once(s3, fault_proxy, monkeypatch):
    store = via(fault_proxy, s3)
    fault_proxy.fail(1, 403, "AccessDenied")
    with pytest.raises(StoreError, match="AccessDenied"):
        store.put("a", b"x")
    with pytest.raises(MissingKey, match=f"s3://{s3.bucket}/run/nothing: no such object"):
        store.get("nothing")
    with pytest.raises(StoreError, match="bucket 'no-such-bucket' does not exist"):
        S3Store("no-such-bucket", clock=ManualClock()).put("a", b"x")
    assert store.retries == 0
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-role lookup on a dev machine
    with pytest.raises(StoreError, match="no AWS credentials"):
        S3Store(s3.bucket, clock=ManualClock()).put("a", b"x")


def test_a_part_that_fails_once_is_retried_by_botocore_alone_and_the_other_parts_are_sent_once(
        s3, fault_proxy, tmp_path):
    part = 5 * 1024 * 1024  # S3's smallest part
    store = S3Store(s3.bucket, "run", endpoint_url=fault_proxy.url, clock=ManualClock(),
                    multipart_chunk_bytes=part)  # botocore's own retries: the default attempts
    data = os.urandom(3 * part)
    (tmp_path / "shard").write_bytes(data)
    fault_proxy.fail(1, 503, "SlowDown", match="partNumber=2")
    checksum = store.put_file("shard", tmp_path / "shard")
    sent = [r.split("?")[1] for r in fault_proxy.requests if r.startswith("PUT ") and "partNumber=" in r]
    parts = sorted(q.split("partNumber=")[1].split("&")[0] for q in sent)
    assert parts == ["1", "2", "2", "3"]  # part 2 twice, the others once: 20 MiB sent for 15, not 30
    assert fault_proxy.faults == 1 and store.retries == 0  # botocore retried; Backoff saw nothing
    assert sum(r.startswith("POST ") and "uploads" in r for r in fault_proxy.requests) == 1  # one upload begun
    # S3's full-object CRC-64/NVME of the three parts: the checksum of the whole file
    from awscrt.checksums import crc64nvme
    import base64
    assert checksum == "crc64nvme:" + base64.b64encode(crc64nvme(data).to_bytes(8, "big")).decode()
    store.get_file("shard", tmp_path / "back", checksum=checksum)
    assert (tmp_path / "back").read_bytes() == data


def test_botocores_retries_leave_the_runs_global_random_as_it_was(s3, fault_proxy):
    """botocore's retry jitter draws from Python's global `random`, which checkpoints save: a push
    must not move it (a resumed run restores it, an uninterrupted one would go on from the moved state)."""
    store = S3Store(s3.bucket, "run", endpoint_url=fault_proxy.url, clock=ManualClock())
    random.seed(7)
    expected = random.getstate()
    fault_proxy.fail(1, 503, "SlowDown")
    store.put("a", b"x")
    assert fault_proxy.faults == 1 and store.retries == 0  # retried by botocore, which drew its jitter
    assert random.getstate() == expected


def test_a_download_damaged_in_transit_is_caught_by_the_native_checksum_and_fetched_again(s3, fault_proxy, tmp_path):
    store = via(fault_proxy, s3)
    data = os.urandom(300_000)
    (tmp_path / "w").write_bytes(data)
    checksum = store.put_file("w", tmp_path / "w")
    fault_proxy.damage(1, match="GET ")  # one byte of the body flipped on its way
    store.get_file("w", tmp_path / "back", checksum=checksum)
    assert (tmp_path / "back").read_bytes() == data and store.retries == 1 and fault_proxy.faults == 1
    fault_proxy.damage(1, match="GET ")
    assert store.get("w") == data and store.retries == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["back", "w"]  # no partial download left


# ---- spot prices ----------------------------------------------------------------------------------


def test_spot_price_history_reads_every_page():
    import boto3
    from botocore.stub import ANY, Stubber

    client = boto3.session.Session(aws_access_key_id="k", aws_secret_access_key="s").client("ec2", region_name="us-east-1")
    at = datetime(2026, 11, 22, 16, 0, tzinfo=timezone.utc)
    with Stubber(client) as stub:
        expected = {"InstanceTypes": ["p4d.24xlarge", "g5.xlarge"], "ProductDescriptions": ["Linux/UNIX"], "StartTime": ANY}
        stub.add_response("describe_spot_price_history", {"NextToken": "page2", "SpotPriceHistory": [
            {"InstanceType": "p4d.24xlarge", "AvailabilityZone": "us-east-1a", "SpotPrice": "9.8304",
             "ProductDescription": "Linux/UNIX", "Timestamp": at}]}, expected)
        stub.add_response("describe_spot_price_history", {"NextToken": "", "SpotPriceHistory": [
            {"InstanceType": "g5.xlarge", "AvailabilityZone": "us-east-1b", "SpotPrice": "0.4021",
             "ProductDescription": "Linux/UNIX", "Timestamp": at}]}, {**expected, "NextToken": "page2"})
        rows = spot_price_history(["p4d.24xlarge", "g5.xlarge"], days=2, client=client)
    assert rows == [
        {"instance_type": "p4d.24xlarge", "availability_zone": "us-east-1a", "spot_usd_h": 9.8304,
         "timestamp": "2026-11-22T16:00:00+00:00"},
        {"instance_type": "g5.xlarge", "availability_zone": "us-east-1b", "spot_usd_h": 0.4021,
         "timestamp": "2026-11-22T16:00:00+00:00"},
    ]


def test_spot_price_history_against_the_server(s3):
    rows = spot_price_history(["g4dn.xlarge"])  # region and endpoint from the environment
    assert rows and all(r["instance_type"] == "g4dn.xlarge" and r["spot_usd_h"] > 0 for r in rows)
    assert datetime.fromisoformat(rows[0]["timestamp"]).tzinfo is not None


# ---- checkpoints in a store -----------------------------------------------------------------------


def save_checkpoint(run, step):
    """A real checkpoint of a small model after `step` iterations, plus the run files that go with it."""
    torch.manual_seed(step)
    model = torch.nn.Linear(16, 8)
    checkpoint.save(run / "checkpoints", step, model, torch.optim.Adam(model.parameters()))
    (run / "config.yaml").write_text("seed: 0\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(step)))


def assert_same_files(a, b):
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()) and files
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)


class Recording:
    """A Store that records the order of writes to the store it wraps."""

    def __init__(self, store):
        self.store, self.uri, self.writes = store, store.uri, []

    def put(self, key, data):
        self.writes.append(key)
        self.store.put(key, data)

    def put_file(self, key, path):
        self.writes.append(key)
        return self.store.put_file(key, path)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_push_writes_the_manifest_last_and_keeps_the_newest_two(s3, tmp_path):
    store = Recording(open_store(f"s3://{s3.bucket}/run"))
    sync = CheckpointSync(store)
    run = tmp_path / "run"
    for step in (2, 4, 6):
        save_checkpoint(run, step)
        pushed = sync.push(run, step)
        assert pushed["files"] == 6 and pushed["bytes"] > 0
    files = {"checkpoints/step-000002/model.safetensors", "checkpoints/step-000002/optimizer.safetensors",
             "checkpoints/step-000002/state.json", "checkpoints/step-000002/MANIFEST.json", "config.yaml",
             "metrics.jsonl"}
    assert set(store.writes[:6]) == {f"step-000002/{f}" for f in files}
    assert store.writes[6] == f"step-000002/{MANIFEST}" and len(store.writes) == 21
    assert sync.stored() == [6, 4] and not store.list("step-000002/")
    manifest = json.loads(store.get(f"step-000006/{MANIFEST}"))
    assert manifest["step"] == 6 and set(manifest["files"]) == {
        "checkpoints/step-000006/model.safetensors", "checkpoints/step-000006/optimizer.safetensors",
        "checkpoints/step-000006/state.json", "checkpoints/step-000006/MANIFEST.json", "config.yaml",
        "metrics.jsonl"}


def test_a_truncated_or_unfinished_checkpoint_is_never_resumed(s3, tmp_path, logged):
    store = open_store(f"s3://{s3.bucket}/run")
    lines = logged
    sync = CheckpointSync(store, keep=5)
    run = tmp_path / "run"
    for step in (2, 4, 6, 8):
        save_checkpoint(run, step)
        sync.push(run, step)
    key = "run/step-000008/checkpoints/step-000008/model.safetensors"
    body = s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=body[: len(body) // 2])  # a truncated object
    key = "run/step-000006/checkpoints/step-000006/optimizer.safetensors"
    body = bytearray(s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    body[-1] ^= 0xFF  # same size, one byte altered
    s3.client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(body))
    s3.client.put_object(Bucket=s3.bucket, Key=f"run/step-000004/{MANIFEST}", Body=b'{"step": 4, "fi')
    # a push cut short before its manifest: files of step 10, no manifest
    s3.client.put_object(Bucket=s3.bucket, Key="run/step-000010/checkpoints/step-000010/state.json", Body=b"{}")

    fresh = tmp_path / "fresh"
    assert sync.pull(fresh) == 2
    assert [c.step for c in checkpoint.list_checkpoints(fresh / "checkpoints")] == [2]
    assert sorted(p.name for p in fresh.iterdir()) == ["checkpoints", "config.yaml", "metrics.jsonl"]  # no staging left
    skipped = "\n".join(lines[-3:])
    # S3's own checksum of each replaced object differs from the one the manifest holds
    assert "step-000008 skipped: checkpoints/step-000008/model.safetensors does not match its checksum" in skipped
    assert "step-000006 skipped: checkpoints/step-000006/optimizer.safetensors does not match its checksum" in skipped
    assert "step-000004 skipped: unreadable MANIFEST.json" in skipped
    assert sync.pull(fresh, newer_than=2) is None  # nothing complete is newer than what the folder holds


def test_a_failed_push_is_logged_and_the_checkpoint_kept_unless_it_must_succeed(s3, fault_proxy, tmp_path, logged):
    run = tmp_path / "run"
    save_checkpoint(run, 2)
    lines = logged
    sync = CheckpointSync(via(fault_proxy, s3, ManualClock(), Backoff(give_up_after_s=5.0)))
    fault_proxy.down_for(3600)
    assert sync.push(run, 2) is None
    assert "checkpoint 2 not stored" in lines[-1] and "gave up after" in lines[-1]
    assert checkpoint.latest(run / "checkpoints").step == 2
    with pytest.raises(StoreError, match="gave up after"):
        sync.push(run, 2, must=True)


# ---- the trainer and the CLI ----------------------------------------------------------------------


def final_weights(out):
    (weights,) = (out / "final").glob("*.safetensors")
    return load_file(str(weights))


def test_a_run_resumed_from_s3_in_a_fresh_folder_ends_with_the_weights_of_an_uninterrupted_one(s3, tmp_path, logged):
    cfg = small_dit_config()  # 4 iterations, a checkpoint every 2
    straight = Trainer(cfg, tmp_path / "straight", progress=False).build().train()
    uri = f"s3://{s3.bucket}/runs/tiny"

    # The first machine: 2 iterations through the CLI, the endpoint only in $AWS_ENDPOINT_URL.
    (tmp_path / "run.yaml").write_text(to_yaml(cfg))
    proc = subprocess.run([sys.executable, "-m", "spotlight.cli", "train", str(tmp_path / "run.yaml"),
                           "--out", str(tmp_path / "first"), "--steps", "2", "--checkpoint-uri", uri, "--no-progress"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"checkpoint 2 stored in {uri}/step-000002" in proc.stdout
    sync = CheckpointSync(open_store(uri))
    assert sync.stored() == [2]

    # A fresh machine: an empty run folder, the same URI.
    lines = logged
    cfg.cloud.checkpoint_uri = uri
    resumed = Trainer(cfg, tmp_path / "second", progress=False).build()
    assert resumed.start_step == 2 and f"checkpoint 2 pulled from {uri}" in lines
    summary = resumed.train()
    a, b = final_weights(tmp_path / "straight"), final_weights(tmp_path / "second")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = [json.loads(line) for line in (tmp_path / "second" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # the first machine's rows came with the checkpoint
    assert summary["steps"] == 4 and summary["reward_first"] == straight["reward_first"]
    assert sync.stored() == [4, 2]

    # The store holds another config's run: refused with one line, before anything is written.
    other = small_dit_config(train={"lr": 3e-4}, cloud={"checkpoint_uri": uri})
    with pytest.raises(ConfigError, match=f"{uri}: holds checkpoints of another run \\(it was written with a different config \\(train.lr"):
        Trainer(other, tmp_path / "third", progress=False).build()
    assert not (tmp_path / "third" / "checkpoints").exists()


@pytest.mark.parametrize("uri, expected", [
    ("s3:///prefix", "s3:///prefix: no bucket (expected s3://BUCKET/PREFIX)"),
    ("s3://", "s3://: no bucket"),
    ("gs://My_Bucket/run", "is not a valid GCS bucket name"),  # gs:// itself is a store (tests/cloud/test_cloud_gcs.py)
    ("gcs://bucket/run", "Google Cloud Storage URIs are gs://BUCKET/PREFIX"),
    ("s3://My_Bucket/run", "is not a valid S3 bucket name"),
    ("file:///etc", "file:///etc: a folder store outside the allowed folders"),
])
def test_a_bad_checkpoint_uri_is_one_error_line(uri, expected, tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path), "--checkpoint-uri", uri, "--runtime", "local"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("spotlight: error: ") and expected in err
    assert "cloud.checkpoint_uri" in err and not list(tmp_path.iterdir())


def test_folder_stores_are_only_accepted_inside_the_allowed_folders(tmp_path, monkeypatch):
    inside, outside = tmp_path / "allowed", tmp_path / "other"
    inside.mkdir()
    outside.mkdir()
    monkeypatch.chdir(inside)
    monkeypatch.delenv("SPOTLIGHT_STORE_ROOTS", raising=False)
    # Unset: the working directory (and below) only.
    assert parse_store_uri("ckpt").path == inside / "ckpt"
    assert parse_store_uri(f"file://{inside}").path == inside
    for bad in (f"file://{outside}/ckpt", str(outside), "../other", "file:///etc", f"file://{inside}/../other"):
        with pytest.raises(StoreURIError, match="outside the allowed folders") as err:
            parse_store_uri(bad)
        assert "SPOTLIGHT_STORE_ROOTS" in str(err.value) and "\n" not in str(err.value)
    (inside / "link").symlink_to(outside)  # a link inside a root that leads out of it
    with pytest.raises(StoreURIError, match="outside the allowed folders"):
        parse_store_uri("link/ckpt")
    # Named roots replace the working directory.
    monkeypatch.setenv("SPOTLIGHT_STORE_ROOTS", f"{outside}{os.pathsep}{tmp_path / 'third'}")
    assert parse_store_uri(f"file://{outside}/ckpt").path == outside / "ckpt"
    open_store(str(tmp_path / "third" / "x")).put("a", b"b")
    with pytest.raises(StoreURIError, match="outside the allowed folders"):
        parse_store_uri(str(inside / "ckpt"))
