"""GcsStore beyond the Store contract (tests/cloud/test_cloud_contract.py runs that on it): gs:// URIs,
the two retry layers against real faults in front of a GCS emulator, failures as one line, and
credentials — all on loopback (tests/gcs_server.py), with waits on a ManualClock."""

import base64
import json
import os
import random
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cloud.gcs import KEY_JSON_ENV, GcsStore, transient_gcs_error
from cloud.open_store import open_store
from cloud.store import ChecksumMismatch, MissingKey, StoreError, StoreLocation, StoreURIError, parse_store_uri
from gcs_server import gcs, gcs_fault_proxy, gcs_server  # noqa: F401 (fixtures)
from schedulers.clock import ManualClock


def via(proxy, env, monkeypatch, clock=None, **options):
    """A GcsStore on `env`'s bucket that talks to the emulator through the fault proxy."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    return GcsStore(env.bucket, "run", clock=clock or ManualClock(), **options)


def crc32c(data: bytes) -> str:
    import google_crc32c

    return "crc32c:" + base64.b64encode(google_crc32c.Checksum(data).digest()).decode()


# ---- URIs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("uri, bucket, prefix", [
    ("gs://my-bucket/runs/x", "my-bucket", "runs/x"),
    ("gs://ckpt_2.example/runs/x/", "ckpt_2.example", "runs/x"),
    ("gs://abc", "abc", ""),
])
def test_gs_uris_name_a_bucket_and_a_prefix(uri, bucket, prefix):
    assert parse_store_uri(uri) == StoreLocation("gs", bucket=bucket, prefix=prefix)


@pytest.mark.parametrize("uri, expected", [
    ("gs:///runs/x", "gs:///runs/x: no bucket (expected gs://BUCKET/PREFIX)"),
    ("gs://", "gs://: no bucket"),
    ("gs://My_Bucket/x", "'My_Bucket' is not a valid GCS bucket name"),
    ("gs://ab/x", "'ab' is not a valid GCS bucket name"),
    ("gs://-bucket/x", "is not a valid GCS bucket name"),
    ("gs://" + "b" * 64 + "/x", "is not a valid GCS bucket name"),
    ("gs://bücket/x", "is not a valid GCS bucket name"),
    ("gs://user@bucket/x", "is not a valid GCS bucket name"),
    ("gs://bucket/a//b", "unexpected '?', '#' or '//'"),
    ("gs://bucket/x?versions=1", "unexpected '?', '#' or '//'"),
    ("gs:bucket/x", "malformed URI (expected s3://BUCKET/PREFIX, gs://BUCKET/PREFIX"),
    ("gcs://bucket/x", "Google Cloud Storage URIs are gs://BUCKET/PREFIX"),
])
def test_a_bad_gs_uri_is_one_line(uri, expected):
    with pytest.raises(StoreURIError) as err:
        parse_store_uri(uri)
    assert expected in str(err.value) and "\n" not in str(err.value)


# ---- retries --------------------------------------------------------------------------------------


def test_a_download_damaged_in_transit_is_caught_by_the_client_and_retried_on_the_injected_clock(
        gcs, gcs_fault_proxy, monkeypatch, tmp_path):
    clock = ManualClock()
    store = via(gcs_fault_proxy, gcs, monkeypatch, clock)
    data = os.urandom(300_000)
    (tmp_path / "w").write_bytes(data)
    checksum = store.put_file("w", tmp_path / "w")
    assert checksum == crc32c(data)  # GCS's crc32c of what it stored, as the upload's answer gave it
    gcs_fault_proxy.damage(1, match="alt=media")  # one byte of the object flipped on its way
    store.get_file("w", tmp_path / "back", checksum=checksum)
    assert (tmp_path / "back").read_bytes() == data and store.retries == 1 and gcs_fault_proxy.faults == 1
    assert 0.125 <= clock.now() <= 0.25  # Backoff's first wait, on the manual clock
    gcs_fault_proxy.damage(1, match="alt=media")
    assert store.get("w") == data and store.retries == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["back", "w"]  # no partial download left


def test_damage_that_persists_gives_up_with_one_line_and_writes_nothing(gcs, gcs_fault_proxy, monkeypatch, tmp_path):
    clock = ManualClock()
    store = via(gcs_fault_proxy, gcs, monkeypatch, clock)
    store.put("w", b"x" * 10_000)
    gcs_fault_proxy.damage(1000, match="alt=media")
    (tmp_path / "back").mkdir()
    with pytest.raises(StoreError) as err:
        store.get_file("w", tmp_path / "back" / "w")
    message = str(err.value)
    assert message.startswith(f"GET gs://{gcs.bucket}/run/w: gave up after ") and "\n" not in message
    assert "damaged in transit" in message and 250 < clock.now() <= 300  # Backoff's 5 minutes, in no real time
    assert list((tmp_path / "back").iterdir()) == []


def test_a_503_is_retried_by_the_client_library_per_request(gcs, gcs_fault_proxy, monkeypatch):
    store = via(gcs_fault_proxy, gcs, monkeypatch)
    gcs_fault_proxy.fail(1, 503, "ServiceUnavailable", match="uploadType=multipart")
    store.put("k", b"v")  # the library waits up to 1 s (its first wait) and sends the request again
    assert store.get("k") == b"v" and gcs_fault_proxy.faults == 1 and store.retries == 0


def test_the_runs_global_random_is_left_as_it_was_by_every_operation(gcs, gcs_fault_proxy, monkeypatch, tmp_path):
    """The library draws from Python's global `random` (a multipart boundary per small upload, its
    retry jitter); checkpoints save that state, so a push must not move it."""
    store = via(gcs_fault_proxy, gcs, monkeypatch)
    (tmp_path / "w").write_bytes(b"w" * 1000)
    random.seed(7)
    expected = random.getstate()
    gcs_fault_proxy.fail(1, 503, "ServiceUnavailable", match="uploadType=multipart")  # a library retry too
    store.put("k", b"v")
    store.put_file("w", tmp_path / "w")
    store.get("k")
    store.list()
    store.delete("k")
    assert random.getstate() == expected and gcs_fault_proxy.faults == 1


def test_an_upload_gcs_refuses_for_its_checksum_counts_as_damaged_in_transit(gcs):
    from google.api_core.exceptions import BadRequest, NotFound

    blob = gcs.client.bucket(gcs.bucket).blob("k")
    blob.crc32c = base64.b64encode(b"\0\0\0\0").decode()  # sent with the bytes; not theirs
    with pytest.raises(BadRequest) as refused:  # the emulator's answer is GCS's: 400, "Provided CRC32C ..."
        blob.upload_from_string(b"payload", checksum=None)
    assert transient_gcs_error(refused.value)
    with pytest.raises(NotFound) as missing:
        gcs.client.bucket(gcs.bucket).blob("nothing").download_as_bytes()
    assert not transient_gcs_error(missing.value) and not transient_gcs_error(ValueError("x"))


def test_a_replaced_object_is_refused_from_its_metadata_without_downloading(gcs, gcs_fault_proxy, monkeypatch,
                                                                             tmp_path):
    store = via(gcs_fault_proxy, gcs, monkeypatch)
    (tmp_path / "w").write_bytes(b"first version")
    checksum = store.put_file("w", tmp_path / "w")
    store.put("w", b"second version")
    gcs_fault_proxy.requests.clear()
    with pytest.raises(ChecksumMismatch, match=f"gs://{gcs.bucket}/run/w: checksum crc32c:.*, expected {checksum}"):
        store.get_file("w", tmp_path / "back", checksum=checksum)
    assert len(gcs_fault_proxy.requests) == 1 and "alt=media" not in gcs_fault_proxy.requests[0]
    assert not (tmp_path / "back").exists()


def test_a_big_file_goes_up_resumably_and_its_checksum_is_still_gcs_own(gcs, gcs_fault_proxy, monkeypatch, tmp_path):
    store = via(gcs_fault_proxy, gcs, monkeypatch)
    data = os.urandom(9 * 1024 * 1024)  # over the client's 8 MiB single-request limit
    (tmp_path / "big").write_bytes(data)
    checksum = store.put_file("big", tmp_path / "big")
    assert checksum == crc32c(data) and any("uploadType=resumable" in r for r in gcs_fault_proxy.requests)
    store.get_file("big", tmp_path / "back", checksum=checksum)
    assert (tmp_path / "back").read_bytes() == data


def test_a_chunk_that_fails_once_is_sent_again_alone(gcs, gcs_fault_proxy, monkeypatch, tmp_path):
    chunk = 1024 * 1024
    store = via(gcs_fault_proxy, gcs, monkeypatch, chunk_bytes=chunk)
    data = os.urandom(9 * chunk)  # resumable (over 8 MiB): nine chunks
    (tmp_path / "shard").write_bytes(data)
    gcs_fault_proxy.fail(1, 503, "ServiceUnavailable", match="upload_id=", after=3)  # the fourth chunk's PUT
    checksum = store.put_file("shard", tmp_path / "shard")
    sent = sum(n for r, n in zip(gcs_fault_proxy.requests, gcs_fault_proxy.request_bytes) if r.startswith("PUT "))
    assert gcs_fault_proxy.faults == 1 and store.retries == 0  # the client retried, Backoff saw nothing
    assert sent == 10 * chunk  # the file once, and the failed chunk again: not the whole file twice
    assert checksum == crc32c(data)
    store.get_file("shard", tmp_path / "back", checksum=checksum)
    assert (tmp_path / "back").read_bytes() == data


# ---- one-line failures ----------------------------------------------------------------------------


def test_a_missing_bucket_is_one_line_for_every_operation(gcs, tmp_path):
    store = GcsStore("no-such-bucket", "p", clock=ManualClock())
    (tmp_path / "f").write_bytes(b"x")
    for op in (lambda: store.put("k", b"x"), lambda: store.put_file("k", tmp_path / "f"), lambda: store.get("k"),
               lambda: store.get_file("k", tmp_path / "a"), lambda: store.get_file("k", tmp_path / "b", "crc32c:x"),
               lambda: store.list(), lambda: store.delete("k")):
        with pytest.raises(StoreError) as err:
            op()
        assert not isinstance(err.value, MissingKey)
        assert "gs://no-such-bucket/p" in str(err.value) and "\n" not in str(err.value)
        assert str(err.value).endswith(f"bucket 'no-such-bucket' does not exist at {gcs.endpoint}")
    assert store.retries == 0 and not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# ---- credentials ----------------------------------------------------------------------------------


@pytest.fixture
def token_server():
    """An OAuth token endpoint on loopback that refuses every grant, as Google's does for a revoked
    key; `hits` counts the requests."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            server.hits += 1
            body = json.dumps({"error": "invalid_grant", "error_description": "Invalid JWT Signature."}).encode()
            self.send_response(400)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.hits = 0
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}/token"
    yield server
    server.shutdown()
    server.server_close()


def service_account_key(token_uri: str) -> dict:
    """A service-account key JSON as Google issues them, with a fresh RSA key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    return {"type": "service_account", "project_id": "key-project", "private_key_id": "0123456789abcdef" * 2,
            "private_key": pem, "client_email": "ckpt@key-project.iam.gserviceaccount.com",
            "client_id": "1234567890", "token_uri": token_uri}


def secrets_of(key: dict) -> list[str]:
    body = key["private_key"].splitlines()[1:-1]
    return [key["private_key_id"], *body[::5]]


def test_a_service_account_key_in_the_environment_is_used_and_never_shown(gcs, token_server, monkeypatch, caplog):
    from google.oauth2 import service_account

    key = service_account_key(token_server.url)
    monkeypatch.setenv(KEY_JSON_ENV, json.dumps(key))  # with the emulator still the endpoint: all on loopback
    store = open_store(f"gs://{gcs.bucket}/p", clock=ManualClock())
    credentials = store.client._credentials
    assert isinstance(credentials, service_account.Credentials)
    assert credentials.service_account_email == key["client_email"] and store.client.project == "key-project"
    assert token_server.hits == 0  # nothing sent while opening the store
    with pytest.raises(StoreError) as err:
        store.put("k", b"v")
    message = str(err.value)
    assert message.startswith(f"PUT gs://{gcs.bucket}/p/k: ") and "invalid_grant" in message and "\n" not in message
    assert token_server.hits >= 1 and store.retries == 0  # the key was used; a refused grant is not retried
    for secret in secrets_of(key):
        assert secret not in message and secret not in caplog.text


@pytest.mark.parametrize("mangle, expected", [
    (lambda key: json.dumps(key)[:-1], "is not JSON (line 1 column"),
    (lambda key: json.dumps({**key, "client_email": ""}), "is not a service-account key (no client_email)"),
    (lambda key: json.dumps({**key, "type": "authorized_user"}), "type is not 'service_account'"),
    (lambda key: json.dumps({**key, "private_key": key["private_key"][:400]}), "its private_key could not be read"),
])
def test_a_bad_key_in_the_environment_is_one_line_without_the_key(gcs, mangle, expected, monkeypatch):
    key = service_account_key("http://127.0.0.1:9/token")
    monkeypatch.setenv(KEY_JSON_ENV, mangle(key))
    with pytest.raises(StoreError) as err:
        GcsStore(gcs.bucket)
    message = str(err.value)
    assert message.startswith(f"gs://{gcs.bucket}: ${KEY_JSON_ENV}") and expected in message and "\n" not in message
    assert not any(secret in message for secret in secrets_of(key))


def test_no_credentials_is_one_line_saying_what_to_set(monkeypatch, tmp_path):
    for name in (KEY_JSON_ENV, "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(name, raising=False)
    # A key file that is not there: Application Default Credentials stop at it, before any network.
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(StoreError) as err:
        open_store("gs://some-bucket/p")
    message = str(err.value)
    assert message.startswith("gs://some-bucket/p: no Google Cloud credentials") and "\n" not in message
    assert f"set ${KEY_JSON_ENV}" in message and "GOOGLE_APPLICATION_CREDENTIALS" in message
