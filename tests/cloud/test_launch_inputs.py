"""What a launch hands SkyPilot is a name of its grammar (`cloud.names`), and the GCS key it ships is
a service-account key by the store's own check (`cloud.gcs.service_account_info`) — issue 27.

Before the fix, `cloud.image_id: docker:img;touch${IFS}/tmp/PWN` reached fleet.yaml (the only check
was "no spaces") and so `docker pull` on every node, and $SPOTLIGHT_GCS_KEY_JSON holding a user's
login or any text was shipped to the head. No network: the store is made without a request.
"""

import json

import pytest
import yaml

from cloud import sky
from cloud.config import CloudConfig
from cloud.credentials import GCS_KEY_ENV, store_credentials
from cloud.gcs import GcsStore
from cloud.store import StoreError
from schedulers.input.files import ConfigError
from spotlight.cli import main
from spotlight.config import to_yaml

from conftest import small_dit_config

DIGEST = "sha256:" + "0123456789abcdef" * 4
PAYLOADS = [
    "docker:img;touch${IFS}/tmp/PWN",  # the issue's: passed "no spaces"
    "docker:img$(touch /tmp/PWN)",
    "docker:img`touch /tmp/PWN`",
    "docker:img|sh",
    "docker:img&&sh",
    "docker:img\ntouch /tmp/PWN",
    "docker:'img'",
    'docker:"img"',
    "docker:img:tag;id",
    "docker:img>/tmp/PWN",
    "ami-0123456789abcdef0;id",
    "projects/p-project/global/images/x$(id)",
    "skypilot:gpu;id",
]
REAL_IMAGES = [
    "docker:nvcr.io/nvidia/pytorch:24.08-py3",
    f"docker:ghcr.io/org/img@{DIGEST}",
    f"docker:ghcr.io/org/img:1.0@{DIGEST}",
    "docker:localhost:5000/a/b:tag",
    "docker:123456789012.dkr.ecr.us-east-1.amazonaws.com/spotlight:latest",
    "docker:us-docker.pkg.dev/my-project/repo/img:v1",
    "docker:ubuntu",
    "docker:spotlight:0.1",
    "docker:library/python__x/a-b.c_d:3.11-slim",
    "ami-0123456789abcdef0",
    "ami-12345678",
    "projects/deeplearning-platform-release/global/images/common-cpu-v20230615-debian-11-py310",
    "projects/my-project/global/machineImages/spotlight-node",
    "skypilot:gpu-ubuntu-2204",
]


@pytest.fixture(autouse=True)
def no_store_credentials(monkeypatch):
    """No credentials or emulator from the machine running the tests: each test sets what it needs."""
    for name in (GCS_KEY_ENV, "GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "AWS_ACCESS_KEY_ID",
                 "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(sky.SKY_PYTHON_ENV, "/nonexistent/sky-python")  # the dry run skips SkyPilot's check


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


# ---- images ------------------------------------------------------------------------------------


@pytest.mark.parametrize("image_id", PAYLOADS)
def test_an_image_id_that_carries_shell_is_refused(image_id):
    with pytest.raises(ConfigError) as err:
        CloudConfig(image_id=image_id)
    message = _one_line(err)
    assert message.startswith("image_id: expected docker:IMAGE ([REGISTRY[:PORT]/]lower-case/path")
    assert "ami-" in message and "projects/PROJECT/global/images/NAME" in message


@pytest.mark.parametrize("image_id", ["docker:Upper/Case", "docker:", "docker:img@sha256:abc", "docker:-img",
                                      "ami-xyz", "ami-0123", " docker:img", "docker:img ", "img",
                                      "docker:" + "a" * 256])
def test_an_image_id_that_is_no_image_reference_is_refused(image_id):
    with pytest.raises(ConfigError, match="^image_id: expected docker:IMAGE"):
        CloudConfig(image_id=image_id)


def test_the_issues_payload_never_reaches_a_task_file(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("runtime:\n  spot_workers: 1\ncloud:\n  gpu: H100\n  image_id: docker:img;touch${IFS}/tmp/PWN\n")
    assert main(["launch", str(config), "--dryrun", "--out", str(tmp_path / "t"),
                 "--checkpoint-uri", "s3://fleet-bucket/r"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "cloud.image_id: expected docker:IMAGE" in line
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("image_id", REAL_IMAGES)
def test_real_image_references_are_accepted_and_reach_every_task_as_written(image_id, tmp_path):
    cfg = small_dit_config(runtime={"kind": "ray", "spot_workers": 1}, cloud={"image_id": image_id})
    (fleet,) = sky.write_tasks(cfg.cloud, 1, to_yaml(cfg), tmp_path, "r")
    _, head, spot = yaml.safe_load_all(fleet.read_text())
    assert head["resources"]["image_id"] == spot["resources"]["image_id"] == image_id


@pytest.mark.parametrize("provider, image_id, says", [
    ("gcp", "ami-0123456789abcdef0", "a GCP image"),
    ("aws", "projects/my-project/global/images/node", "an AWS AMI"),
])
def test_an_image_of_the_other_cloud_is_refused(provider, image_id, says):
    with pytest.raises(ConfigError) as err:
        CloudConfig(provider=provider, image_id=image_id)
    message = _one_line(err)
    assert message.startswith("image_id: expected docker:IMAGE") and says in message


# ---- regions -----------------------------------------------------------------------------------


@pytest.mark.parametrize("provider, region", [
    (None, "us-east-1"), ("aws", "us-gov-west-1"), ("aws", "ap-southeast-2"), (None, "us-central1"),
    ("gcp", "us-east4"), ("gcp", "northamerica-northeast1"), ("gcp", "europe-west10"),
])
def test_real_regions_are_accepted(provider, region):
    assert CloudConfig(provider=provider, region=region).region == region


@pytest.mark.parametrize("provider, region, says", [
    (None, "us-east-1;id", "an AWS region (e.g. us-east-1) or a GCP region (e.g. us-central1)"),
    (None, "us-east-1$(id)", "an AWS region"),
    (None, "us-east-1\n", "an AWS region"),
    (None, "US-EAST-1", "an AWS region"),
    (None, "us-east-1a", "an AWS region"),  # a zone, not a region
    (None, "aws/us-east-1", "an AWS region"),  # would become infra aws/aws/us-east-1
    (None, "", "an AWS region"),
    ("aws", "us-central1", "expected an AWS region (e.g. us-east-1) or null"),
    ("gcp", "us-east-1", "expected a GCP region (e.g. us-central1) or null"),
])
def test_a_region_that_is_no_region_of_the_cloud_is_refused(provider, region, says):
    with pytest.raises(ConfigError) as err:
        CloudConfig(provider=provider, region=region)
    message = _one_line(err)
    assert message.startswith("region: expected ") and says in message


# ---- names and paths SkyPilot gets -------------------------------------------------------------


def test_a_price_tables_gpu_that_is_no_accelerator_name_is_not_offered(tmp_path):
    table = tmp_path / "prices.csv"
    table.write_text("provider,instance_type,region,gpu,gpus,ondemand_usd_h,spot_usd_h,source,date\n"
                     "aws,x1.big,us-east-1,H100;id,1,1.0,0.5,test,2026-01-01\n"
                     "aws,x2.big,us-east-1,MI300X,1,1.0,0.5,test,2026-01-01\n")
    assert sky.accelerators(CloudConfig(gpu="mi300x", prices=str(table))) == ["MI300X"]
    with pytest.raises(ConfigError, match=r"^cloud.gpu: expected an accelerator SkyPilot knows"):
        sky.accelerators(CloudConfig(gpu="H100;id", prices=str(table)))


@pytest.mark.parametrize("folder", ["a$(touch PWN)", "a`id`", "it's", 'say "hi"', "a\\b"])
def test_a_task_folder_whose_path_would_run_in_a_shell_is_refused_before_writing(tmp_path, folder):
    cfg = small_dit_config(runtime={"kind": "ray", "spot_workers": 1})
    with pytest.raises(ConfigError) as err:
        sky.write_tasks(cfg.cloud, 1, to_yaml(cfg), tmp_path / folder, "r")
    assert _one_line(err).startswith("--out: expected a folder whose path has only letters")
    assert not (tmp_path / folder).exists()


# ---- the GCS key -------------------------------------------------------------------------------


def _service_account_key() -> dict:
    """A service-account key as Google issues them, with a fresh RSA key (the store parses it)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    return {"type": "service_account", "project_id": "key-project", "private_key_id": "f" * 40,
            "private_key": pem, "client_email": "ckpt@key-project.iam.gserviceaccount.com",
            "client_id": "1234567890", "token_uri": "https://oauth2.googleapis.com/token"}


SECRET = "never-shown-1/x"
BAD_KEYS = [
    ("a user's login", json.dumps({"type": "authorized_user", "client_id": "c", "client_secret": SECRET,
                                   "refresh_token": SECRET}),
     "is not a service-account key (type is not 'service_account': it is 'authorized_user', a user's own login"),
    ("not JSON", f"key: {SECRET}", "is not JSON (line 1 column 1)"),
    ("a JSON list", json.dumps([SECRET]), "is not a service-account key (not a JSON object)"),
    ("no type", json.dumps({"private_key": SECRET}), "is not a service-account key (type is not 'service_account')"),
    ("an unknown type", json.dumps({"type": SECRET}), "is not a service-account key (type is not 'service_account')"),
    ("no private_key", json.dumps({"type": "service_account", "client_email": "a@b", "token_uri": "https://t",
                                   "private_key_id": SECRET}), "is not a service-account key (no private_key)"),
    ("no client_email", json.dumps({"type": "service_account", "private_key": SECRET, "token_uri": "https://t"}),
     "is not a service-account key (no client_email)"),
]


@pytest.mark.parametrize("what, text, says", BAD_KEYS, ids=[k[0] for k in BAD_KEYS])
def test_a_gcs_key_that_is_no_service_account_key_is_refused_at_launch_and_by_the_store(what, text, says,
                                                                                         monkeypatch):
    with pytest.raises(ConfigError) as launch:
        store_credentials("gs://fleet-bucket/r", "gcp", {GCS_KEY_ENV: text})
    monkeypatch.setenv(GCS_KEY_ENV, text)
    with pytest.raises(StoreError) as store:
        GcsStore("fleet-bucket", "r")
    for message in (_one_line(launch), _one_line(store)):
        assert f"${GCS_KEY_ENV} {says}" in message and SECRET not in message
    # one check, two callers: the launch refuses exactly what the head's store would
    assert str(launch.value).split(f"${GCS_KEY_ENV} ")[1].startswith(str(store.value).split(f"${GCS_KEY_ENV} ")[1])


def test_a_key_file_is_refused_by_the_same_check(tmp_path):
    path = tmp_path / "adc.json"
    path.write_text(BAD_KEYS[0][1])
    with pytest.raises(ConfigError) as err:
        store_credentials("gs://fleet-bucket/r", None, {"GOOGLE_APPLICATION_CREDENTIALS": str(path)})
    message = _one_line(err)
    assert f"names {path}, which {BAD_KEYS[0][2]}" in message and SECRET not in message


def test_a_service_account_key_is_accepted_on_both_paths(tmp_path, monkeypatch):
    key = json.dumps(_service_account_key())
    found = store_credentials("gs://fleet-bucket/r", "aws", {GCS_KEY_ENV: key})
    assert found.secrets == {GCS_KEY_ENV: key}
    (tmp_path / "key.json").write_text(key)
    found = store_credentials("gs://fleet-bucket/r", "aws", {"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "key.json")})
    assert found.secrets == {GCS_KEY_ENV: key}
    monkeypatch.setenv(GCS_KEY_ENV, key)
    store = GcsStore("fleet-bucket", "r")  # makes the client; sends nothing until an operation
    assert store.client._credentials.service_account_email == "ckpt@key-project.iam.gserviceaccount.com"


def test_a_users_login_is_refused_by_spotlight_launch_before_anything_is_written(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(GCS_KEY_ENV, BAD_KEYS[0][1])
    config = tmp_path / "c.yaml"
    config.write_text(to_yaml(small_dit_config(runtime={"kind": "ray", "spot_workers": 1}, cloud={"provider": "gcp"})))
    assert main(["launch", str(config), "--dryrun", "--out", str(tmp_path / "t"),
                 "--checkpoint-uri", "gs://fleet-bucket/r"]) == 2
    printed = capsys.readouterr()
    (line,) = printed.err.strip().splitlines()
    assert line.startswith("spotlight: error: ") and f"${GCS_KEY_ENV} is not a service-account key" in line
    assert SECRET not in printed.out + printed.err
    assert not (tmp_path / "t").exists()
