"""A Google Cloud Storage emulator on loopback for the tests (gcp-storage-emulator, in this process,
in memory), and the environment a user would set to reach it.

Fixtures (import them into a test module to use them):
- `gcs_server`: (session) a `GcsServer`: the emulator on 127.0.0.1 (a free port), and a client;
- `gcs`: a `GcsEnv` with a fresh bucket, and STORAGE_EMULATOR_HOST pointing at the server,
  GOOGLE_CLOUD_PROJECT=test, no $SPOTLIGHT_GCS_KEY_JSON nor GOOGLE_APPLICATION_CREDENTIALS;
- `gcs_fault_proxy`: a `s3_server.FaultProxy` (plain HTTP, whatever the API) forwarding to the
  emulator; point STORAGE_EMULATOR_HOST at `proxy.url` to use it.

What the emulator does as GCS does, relied on here: it computes crc32c and MD5 of every object it
stores and returns them in the object's metadata and, for a whole-object download, in X-Goog-Hash;
it refuses a multipart upload whose crc32c in the metadata does not match the bytes (400, GCS's
message). What it does not: it ignores `ifGenerationMatch` (GCS answers 412 when the object was
replaced), and does not check the X-Goog-Hash header of a resumable upload's last chunk (the client
library still compares its own crc32c with the one the emulator answers, and raises on a mismatch).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from s3_server import FaultProxy

_buckets = itertools.count()


@dataclass
class GcsServer:
    endpoint: str
    client: object
    """A plain anonymous `google.cloud.storage.Client` on the server (for what the tests do behind
    the store's back)."""


@pytest.fixture(scope="session")
def gcs_server():
    from gcp_storage_emulator.server import create_server
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    server = create_server("127.0.0.1", 0, in_memory=True)  # port 0: the OS picks a free one
    server.start()
    # The emulator has no accessor for the port it bound (its Server keeps the HTTPServer private).
    host, port = server._api._httpd.server_address
    endpoint = f"http://{host}:{port}"
    client = storage.Client(project="test", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": endpoint})
    assert client._connection.API_BASE_URL == endpoint  # never the real GCS
    yield GcsServer(endpoint, client)
    server.stop()


@dataclass
class GcsEnv:
    endpoint: str
    bucket: str
    client: object
    """The session's plain client on the server."""


@pytest.fixture
def gcs(gcs_server, monkeypatch):
    for name in ("SPOTLIGHT_GCS_KEY_JSON", "GOOGLE_APPLICATION_CREDENTIALS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_server.endpoint)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "test")
    bucket = f"spotlight-test-{next(_buckets)}"
    gcs_server.client.create_bucket(bucket)
    return GcsEnv(gcs_server.endpoint, bucket, gcs_server.client)


@pytest.fixture
def gcs_fault_proxy(gcs_server):
    proxy = FaultProxy(gcs_server.endpoint)
    yield proxy
    proxy.close()
