"""A real S3-compatible server on loopback for the tests (moto in server mode), and a fault proxy
in front of it that answers errors or cuts connections when told to.

Fixtures (import them into a test module to use them):
- `s3_server`: (session) an `S3Server`: a moto server on 127.0.0.1 (a free port), and a client;
- `s3`: an `S3Env` with a fresh bucket, and the environment a user would set — dummy credentials,
  a region, AWS_ENDPOINT_URL pointing at the server, no profile or config files read;
- `fault_proxy`: a `FaultProxy` forwarding to the moto server.
"""

from __future__ import annotations

import http.client
import itertools
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

_buckets = itertools.count()


@dataclass
class S3Server:
    endpoint: str
    client: object
    """A plain boto3 client on the server (for what the tests do behind the store's back); one per
    session, since making a boto3 client costs about 0.5 s."""


@pytest.fixture(scope="session")
def s3_server():
    with moto_server("127.0.0.1") as server:
        yield server


@contextmanager
def moto_server(ip: str) -> Iterator[S3Server]:
    """A moto S3 server listening on `ip` (a free port), stopped on exit."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address=ip, port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                   region_name="us-east-1").client("s3", endpoint_url=endpoint)
    try:
        yield S3Server(endpoint, client)
    finally:
        server.stop()


@dataclass
class S3Env:
    endpoint: str
    bucket: str
    client: object
    """The session's plain boto3 client on the server."""


@pytest.fixture
def s3(s3_server, monkeypatch, tmp_path):
    return user_bucket(s3_server.endpoint, s3_server.client, monkeypatch, tmp_path)


def user_bucket(endpoint: str, client, monkeypatch, tmp_path) -> S3Env:
    """A fresh bucket on the server at `endpoint`, and the environment a user would set for it."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_REQUEST_CHECKSUM_CALCULATION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    bucket = f"spotlight-test-{next(_buckets)}"
    client.create_bucket(Bucket=bucket)
    return S3Env(endpoint, bucket, client)


class FaultProxy:
    """An HTTP reverse proxy on 127.0.0.1 in front of `target`. `fail(n)` answers the next n
    requests with an S3 error (503 SlowDown by default) instead of forwarding them; `reset(n)`
    reads the next n requests and cuts the connection with a TCP reset, no answer; `damage(n)`
    forwards the next n requests and flips one byte of each answer's body; `down_for(s)` answers
    503 to everything for the next s seconds. With `match`, a fault waits for a request whose
    "METHOD /path?query" contains it. `faults` counts the requests it spoiled, `forwarded` those
    it passed on unharmed, `requests` lists every request received as "METHOD /path?query" and
    `request_bytes` the length of each one's body. `fail(..., after=k)` lets k matching requests
    through before the fault."""

    def __init__(self, target: str) -> None:
        self.target = target.removeprefix("http://")
        self.faults = 0
        self.forwarded = 0
        self.requests: list[str] = []
        self.request_bytes: list[int] = []
        self._lock = threading.Lock()
        # [kind, status, code, match, after]: kind "error", "reset" or "damage"; match "" fits any
        # request; `after` matching requests pass before this fault
        self._queue: list[list] = []
        self._down_until = 0.0
        proxy = self

        class Handler(_Forwarder):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def fail(self, n: int, status: int = 503, code: str = "SlowDown", match: str = "", after: int = 0) -> None:
        with self._lock:
            self._queue += [["error", status, code, match, after] for _ in range(n)]

    def reset(self, n: int, match: str = "") -> None:
        with self._lock:
            self._queue += [["reset", 0, "", match, 0] for _ in range(n)]

    def damage(self, n: int, match: str = "") -> None:
        with self._lock:
            self._queue += [["damage", 0, "", match, 0] for _ in range(n)]

    def down_for(self, seconds: float) -> None:
        self._down_until = time.monotonic() + seconds

    def _next_fault(self, request: str, size: int) -> list | None:
        with self._lock:
            self.requests.append(request)
            self.request_bytes.append(size)
            for i, fault in enumerate(self._queue):
                if fault[3] in request:
                    if fault[4] > 0:  # let this one through, and count it
                        fault[4] -= 1
                        break
                    self.faults += 1
                    return self._queue.pop(i)
            if time.monotonic() < self._down_until:
                self.faults += 1
                return ["error", 503, "ServiceUnavailable", "", 0]
            self.forwarded += 1
            return None

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


class _Forwarder(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"  # keep-alive, as botocore's connection pool expects

    def log_message(self, *args) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                chunk = self.rfile.read(size)
                self.rfile.readline()
                if size == 0:
                    break
                chunks.append(chunk)
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        body = self._body()
        fault = self.owner._next_fault(f"{self.command} {self.path}", len(body))
        if fault is not None and fault[0] == "reset":
            # SO_LINGER 0: close() sends RST, what a crashed load balancer or a cut link looks like.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()
            return
        if fault is not None and fault[0] == "error":
            _, status, code, _, _ = fault
            xml = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                   f"<Message>injected by the test proxy</Message></Error>").encode()
            return self._reply(status, [("Content-Type", "application/xml")], xml)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("transfer-encoding", "connection")}
        headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection(self.owner.target, timeout=30)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            if fault is not None and fault[0] == "damage" and data:
                data = data[:-1] + bytes([data[-1] ^ 0xFF])  # same length, last byte altered
            kept = [(k, v) for k, v in response.getheaders()
                    if k.lower() not in ("transfer-encoding", "connection", "content-length")]
            if self.command == "HEAD":  # keep the object's length; a HEAD answer has no body
                kept.append(("Content-Length", response.getheader("Content-Length", "0")))
                return self._reply(response.status, kept, b"", length=False)
            self._reply(response.status, kept, data)
        finally:
            upstream.close()

    def _reply(self, status: int, headers: list[tuple[str, str]], data: bytes, length: bool = True) -> None:
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        if length:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle


@pytest.fixture
def fault_proxy(s3_server):
    proxy = FaultProxy(s3_server.endpoint)
    yield proxy
    proxy.close()
