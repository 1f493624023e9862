"""elastic_sp.signed_connection: the agent's control connection, over real localhost TCP.

Every message that crosses it is checked: a wrong key either way, a tampered, replayed, reflected,
oversized, stalled or pickled frame is a ProtocolError, and nothing a peer sends ever runs.
"""

from __future__ import annotations

import pickle
import secrets
import socket
import struct
import threading
import time

import pytest
import torch

from elastic_sp import protocol as P
from planted_pickle import Payload, pickled
from elastic_sp.agent_server import WIRE_TYPES, Relay, Setup
from elastic_sp.signed_connection import MAGIC, ProtocolError, SignedConnection, accept, connect
from schedulers.request import Kind, Request
from schedulers.sample_state import SampleState
from tests.test_elastic_sp_agent import SPEC

KEY = secrets.token_hex(32).encode()


class Server:
    """A listening socket whose one accepted connection runs the server's handshake in a thread."""

    def __init__(self, key: bytes = KEY, timeout_s: float = 5.0, max_message_bytes: int = 1 << 20) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = self.sock.getsockname()[:2]
        self.result: SignedConnection | BaseException | None = None
        self.took_s = 0.0

        def run() -> None:
            s, _ = self.sock.accept()
            t0 = time.monotonic()
            try:
                self.result = accept(s, key, timeout_s, WIRE_TYPES, max_message_bytes)
            except BaseException as err:
                s.close()
                self.result = err
            self.took_s = time.monotonic() - t0

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def conn(self) -> SignedConnection:
        self.thread.join(10)
        assert isinstance(self.result, SignedConnection), self.result
        return self.result

    def error(self) -> BaseException:
        self.thread.join(10)
        assert isinstance(self.result, BaseException), self.result
        return self.result


@pytest.fixture
def pair():
    server = Server()
    client = connect(server.address, KEY, 5.0, WIRE_TYPES, 1 << 20)
    theirs = server.conn()
    theirs.sock.settimeout(5.0)  # a failing test must not hang
    yield theirs, client
    client.close()
    theirs.close()
    server.sock.close()


def test_messages_round_trip_both_ways_with_tensors_bit_identical(pair):
    server, client = pair
    state = SampleState((1, 1), (3, 4), 2, torch.randn(2, 3, 4, 16), torch.randn(2, 2))
    run = P.Run(7, Request("it0/p1", Kind.ROLLOUT, 1, "a red image", (3, 4), 0, state=state, step=2))
    client.send(Setup(SPEC, "/ckpt/model.safetensors", True))
    client.send(run)
    assert server.recv() == Setup(SPEC, "/ckpt/model.safetensors", True)
    got = server.recv()
    assert got.request.kind is Kind.ROLLOUT and got.request.seeds == (3, 4)
    assert torch.equal(got.request.state.trajectory, state.trajectory)
    assert torch.equal(got.request.state.log_probs, state.log_probs)
    report = Relay("m0", P.Committed("m0", 7, "it0/p1", 3, torch.randn(2, 1, 4, 16), torch.randn(2, 1)))
    server.send(report)
    assert client.poll(5.0)
    back = client.recv()
    assert torch.equal(back.msg.latents, report.msg.latents) and back.msg.step == 3


def test_a_wrong_key_is_refused_either_way():
    server = Server()
    with pytest.raises(ProtocolError, match="refused our key"):
        connect(server.address, secrets.token_hex(32).encode(), 5.0, WIRE_TYPES)
    assert "does not hold the key" in str(server.error())


def test_a_short_key_is_refused():
    with pytest.raises(ValueError, match="at least 32.*secrets.token_hex"):
        connect(("127.0.0.1", 9), b"x" * 31, 1.0, WIRE_TYPES)


def test_a_silent_peer_fails_the_handshake_at_its_deadline():
    server = Server(timeout_s=0.5)
    with socket.create_connection(server.address) as sock:  # connects, then says nothing
        err = server.error()
        assert sock.recv(len(MAGIC)) == MAGIC
    assert isinstance(err, ProtocolError) and "handshake deadline" in str(err)
    assert 0.4 < server.took_s < 2.0


def test_a_server_that_is_not_an_agent_is_refused():
    sock = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=lambda: sock.accept()[0].sendall(b"HTTP/1.1 400 Bad Request\r\n" + b"x" * 64),
                     daemon=True).start()
    with pytest.raises(ProtocolError, match="not a Spotlight SP agent server"):
        connect(sock.getsockname()[:2], KEY, 5.0, WIRE_TYPES)
    sock.close()


def test_a_tampered_frame_is_refused(pair):
    server, client = pair
    frame = bytearray(client.frame(b"\x00" * 32))
    frame[-1] ^= 1  # one bit of the payload
    client.sock.sendall(frame)
    with pytest.raises(ProtocolError, match="bad signature"):
        server.recv()


def test_a_replayed_frame_is_refused(pair):
    server, client = pair
    frame = client.frame(pickle.dumps(None))  # what the payload is does not matter: it is not decoded
    client.sock.sendall(frame)
    assert server.recv_bytes() == pickle.dumps(None)
    client.sock.sendall(frame)
    with pytest.raises(ProtocolError, match="numbered 0, expected 1"):
        server.recv_bytes()


def test_a_frame_reflected_back_to_its_sender_is_refused(pair):
    server, client = pair
    frame = server.frame(b"hello")  # signed server -> client
    client.sock.sendall(frame)  # ... and sent back by the client
    with pytest.raises(ProtocolError, match="bad signature"):
        server.recv_bytes()


def test_a_well_signed_pickle_is_never_unpickled(pair, tmp_path):
    server, client = pair
    marker = tmp_path / "PWNED"
    client.send_bytes(pickled(Payload(marker)))
    with pytest.raises(ProtocolError, match="not an allowed value"):
        server.recv()
    assert not marker.exists()
    with pytest.raises(TypeError, match="cannot encode"):  # nor can our side send it
        client.send(Payload(marker))


def test_an_oversized_length_is_refused_before_its_payload_is_read(pair):
    server, client = pair
    client.sock.sendall(struct.pack(">QQ32s", 1 << 62, 0, b"\x00" * 32))  # 4 EiB announced, nothing follows
    t0 = time.monotonic()
    with pytest.raises(ProtocolError, match="maximum is 1048576"):
        server.recv_bytes()
    assert time.monotonic() - t0 < 1.0  # refused at once, not after waiting for (or allocating) the payload
    with pytest.raises(ValueError, match="exceeds the maximum"):
        client.send_bytes(b"\x00" * ((1 << 20) + 1))


def test_a_peer_that_stalls_mid_message_is_dropped():
    server = Server(timeout_s=0.5)
    client = connect(server.address, KEY, 5.0, WIRE_TYPES)
    theirs = server.conn()
    client.sock.sendall(client.frame(b"\x00" * 1000)[:500])  # half a message, then silence
    t0 = time.monotonic()
    with pytest.raises(ProtocolError, match="stalled after"):
        theirs.recv_bytes()
    assert 0.4 < time.monotonic() - t0 < 2.0
    client.close()
    theirs.close()
