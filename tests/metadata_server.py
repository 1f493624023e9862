"""A fake metadata server on 127.0.0.1 that speaks both IMDSv2 (token PUT with the TTL header,
401 without a valid token, 404 when nothing is scheduled) and the GCE metadata format (the
Metadata-Flavor header required and echoed). Tests change what it says between polls.

Fixtures (import them into a test module to use them): `metadata` -> (base URL, FakeMetadata);
`closed_port_url` -> a URL nothing listens on.
"""

import json
import socket
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class FakeMetadata:
    """What the fake metadata server currently says; tests change it between polls."""

    def __init__(self) -> None:
        self.instance_action: dict | None = None
        self.rebalance: dict | None = None
        self.preempted = False
        self.tokens: set[str] = set()
        self.token_puts = 0
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        self.lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    state: FakeMetadata  # set per server

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def _send(self, status: int, body: str = "", headers: dict | None = None) -> None:
        self.state.requests.append((self.command, self.path, status))  # before the client can read it
        data = body.encode()
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        if self.path != "/latest/api/token":
            return self._send(404)
        if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "").isdigit():
            return self._send(400, "missing or invalid X-aws-ec2-metadata-token-ttl-seconds")
        with self.state.lock:
            self.state.token_puts += 1
            token = f"token-{self.state.token_puts}"
            self.state.tokens.add(token)
        self._send(200, token)

    def do_GET(self) -> None:
        s = self.state
        if self.path.startswith("/computeMetadata/"):
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._send(403, "Missing Metadata-Flavor:Google header.")
            if self.path != "/computeMetadata/v1/instance/preempted":
                return self._send(404)
            return self._send(200, "TRUE" if s.preempted else "FALSE", {"Metadata-Flavor": "Google"})
        if self.headers.get("X-aws-ec2-metadata-token") not in s.tokens:
            return self._send(401)
        body = {
            "/latest/meta-data/spot/instance-action": s.instance_action,
            "/latest/meta-data/events/recommendations/rebalance": s.rebalance,
        }.get(self.path)
        if body is None:
            return self._send(404)
        self._send(200, json.dumps(body), {"Content-Type": "text/plain"})


@pytest.fixture
def metadata():
    """(base URL, FakeMetadata) of a metadata server running on 127.0.0.1 for one test."""
    state = FakeMetadata()
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("BoundHandler", (Handler,), {"state": state}))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()
    server.server_close()
    thread.join(10)


@pytest.fixture
def closed_port_url():
    """A URL on 127.0.0.1 whose port nothing listens on (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)
