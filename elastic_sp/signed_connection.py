"""The agent's control connection over TCP: a keyed handshake with a deadline, then messages that
are data (`cloud.codec`, never pickles), each signed with a per-connection key and numbered.

What it guarantees, and what it does not:
- Authentication, both ways: each side proves it holds the shared key (at least `MIN_KEY_BYTES`)
  by an HMAC over both sides' fresh random nonces, under different labels for the two directions
  (so one side's proof cannot be reflected back as the other's).
- Integrity: every message is framed with a sequence number and an HMAC-SHA256 over (direction,
  sequence number, payload) under a session key derived from the shared key and both nonces. A
  tampered, truncated, reordered, replayed (same connection: a stale number; another connection:
  another session key) or reflected (the direction is signed) message is refused.
- Only data: a payload is decoded by `cloud.codec` with an allow-list of dataclasses and enums;
  nothing a peer sends can construct anything else, let alone run code.
- Bounded: a frame's length prefix is checked against `max_message_bytes` before a byte of its
  payload is read, and the payload buffer grows only as bytes actually arrive, so a peer can make
  the reader hold at most what it really sent, and never more than the maximum.
- Not confidential: payloads cross in cleartext (integrity only). Run it on a private network
  (a VPC, a WireGuard/SSH tunnel) when what crosses (prompts, latents) must not be seen.
Any violation is a `ProtocolError` (a `ConnectionError`): the caller drops that connection.

Wire format (all integers big-endian):
    handshake   S->C  MAGIC (15 bytes) | Ns (32 random bytes)
                C->S  Nc (32 random bytes) | HMAC(K, "spotlight-sp/1 client" | Ns | Nc)
                S->C  HMAC(K, "spotlight-sp/1 server" | Ns | Nc)
                session key Ks = HMAC(K, "spotlight-sp/1 session" | Ns | Nc)
    frame       length (8) | seq (8) | HMAC(Ks, direction | seq | payload) (32) | payload (length)
                direction: b"C" client->server, b"S" server->client; seq: 0, 1, 2, ... per direction
    payload     `cloud.codec.encode(message, allowed)`: safetensors bytes, JSON tree in its metadata

Tested in tests/test_elastic_sp_signed_connection.py (round trip; a wrong key either way; a
tampered, replayed, reflected, oversized, stalled or pickled frame is a ProtocolError and nothing
runs; a silent peer fails the handshake at its deadline) and, through the agent server, in
tests/test_elastic_sp_agent_server.py.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import select
import socket
import struct
import time
from collections.abc import Iterable
from typing import Any

from cloud.codec import DecodeError, decode, encode

MAGIC = b"spotlight-sp/1\n"
MIN_KEY_BYTES = 32
"""A shared key shorter than this is refused: 32 hex characters are 128 bits, out of reach of an
offline guess at a recorded handshake; `secrets.token_hex(32)` gives 64."""
MAX_MESSAGE_BYTES = 1 << 30
"""Default largest payload (1 GiB). Most messages are a few hundred bytes, a step's report a few
latents; the largest is a resumed `Run`, which carries the trajectory so far: at Qwen-Image 1024²
a latent is 1 MiB (4096 tokens x 64 channels x fp32), so G=8 x 11 latents is 88 MiB and G=16 x 51
latents 816 MiB. The node's weights never cross this connection. Raise it on both sides together."""
_NONCE = 32
_MAC = 32
_HEADER = struct.Struct(">QQ32s")  # length, seq, mac
_CHUNK = 1 << 20
"""Read at most 1 MiB per recv: the buffer grows with what arrives, never to a promised length."""
_COPY_BELOW = 1 << 16
"""Frames below 64 KiB go out as one write (header + payload copied together): one TCP segment,
not two, for the small reports that make up almost all the traffic."""


class ProtocolError(ConnectionError):
    """The peer broke the protocol (bad key, bad signature, bad sequence number, oversized or
    undecodable message, stalled mid-message): drop the connection. `str(err)` is one line."""


def check_key(key: bytes, where: str) -> bytes:
    """`key` if it is long enough, else ValueError with one line saying how to make a good one."""
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"{where} has {len(key)} characters; it needs at least {MIN_KEY_BYTES} "
                         "(make one with: python -c \"import secrets; print(secrets.token_hex(32))\")")
    return key


def _mac(key: bytes, *parts: bytes) -> bytes:
    h = hmac.new(key, digestmod=hashlib.sha256)
    for p in parts:
        h.update(p)
    return h.digest()


def _no_delay(sock: socket.socket) -> None:
    """Send small messages at once: with Nagle's algorithm a step's report can wait ~40 ms for the
    peer's delayed ACK, which doubled the time a regroup takes to serve again (bench sp-regroup:
    regroup_s 0.154 s with it, 0.078 s without)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _read_exact(sock: socket.socket, n: int, deadline: float | None, stall_s: float | None) -> bytearray:
    """Exactly `n` bytes. `deadline` (monotonic): all of them by then; `stall_s`: at most this long
    without a byte. EOFError when the peer closes first."""
    buf = bytearray()
    while len(buf) < n:
        wait, why = stall_s, f"no data for {stall_s} s"
        if deadline is not None and (wait is None or deadline - time.monotonic() < wait):
            wait, why = deadline - time.monotonic(), "handshake deadline passed"
        if wait is not None and (wait <= 0 or not select.select([sock], [], [], wait)[0]):
            raise ProtocolError(f"peer stalled after {len(buf)} of {n} bytes ({why})")
        chunk = sock.recv(min(n - len(buf), _CHUNK))
        if not chunk:
            raise EOFError(f"peer closed the connection after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


class SignedConnection:
    """One end of an authenticated connection (made by `accept` or `connect`); see the module
    docstring. Used by one thread at a time."""

    def __init__(self, sock: socket.socket, session_key: bytes, side: str, allowed: Iterable[type],
                 max_message_bytes: int = MAX_MESSAGE_BYTES, stall_s: float | None = None) -> None:
        self.sock = sock
        self.allowed = tuple(allowed)
        self.max_message_bytes = max_message_bytes
        self.stall_s = stall_s
        """Drop a peer that says nothing for this long in the middle of a message (None: wait)."""
        self._key = session_key
        self._out_dir, self._in_dir = (b"S", b"C") if side == "server" else (b"C", b"S")
        self._out_seq = 0
        self._in_seq = 0
        try:
            self.peer = "%s:%s" % sock.getpeername()[:2]
        except OSError:
            self.peer = "?"

    # -- sending --

    def frame(self, payload: bytes) -> bytes:
        """`payload` framed and signed as the next message (uses up a sequence number)."""
        return self._header(payload) + payload

    def send_bytes(self, payload: bytes) -> None:
        if len(payload) < _COPY_BELOW:
            self.sock.sendall(self.frame(payload))
        else:  # no copy of a large payload
            self.sock.sendall(self._header(payload))
            self.sock.sendall(payload)

    def _header(self, payload: bytes) -> bytes:
        if len(payload) > self.max_message_bytes:
            raise ValueError(f"message of {len(payload)} bytes exceeds the maximum of {self.max_message_bytes}")
        seq = self._out_seq
        self._out_seq += 1
        return _HEADER.pack(len(payload), seq, _mac(self._key, self._out_dir, seq.to_bytes(8, "big"), payload))

    def send(self, msg: Any) -> None:
        self.send_bytes(encode(msg, self.allowed))

    # -- receiving --

    def poll(self, timeout_s: float | None = 0.0) -> bool:
        """Whether a message (or the peer's EOF) is waiting; waits up to `timeout_s` (None: forever)."""
        return bool(select.select([self.sock], [], [], timeout_s)[0])

    def recv_bytes(self) -> bytes:
        """The next message's payload, signature and sequence number checked."""
        length, seq, mac = _HEADER.unpack(_read_exact(self.sock, _HEADER.size, None, self.stall_s))
        if length > self.max_message_bytes:
            raise ProtocolError(f"message of {length} bytes announced, the maximum is {self.max_message_bytes}")
        payload = bytes(_read_exact(self.sock, length, None, self.stall_s)) if length else b""
        if not hmac.compare_digest(mac, _mac(self._key, self._in_dir, seq.to_bytes(8, "big"), payload)):
            raise ProtocolError(f"message {self._in_seq}: bad signature (tampered, or not from this connection)")
        if seq != self._in_seq:
            raise ProtocolError(f"message numbered {seq}, expected {self._in_seq} (replayed or reordered)")
        self._in_seq += 1
        return payload

    def recv(self) -> Any:
        payload = self.recv_bytes()
        try:
            return decode(payload, self.allowed)
        except DecodeError as err:
            raise ProtocolError(f"message {self._in_seq - 1} is not an allowed value: {err}") from None

    # -- plumbing --

    def fileno(self) -> int:
        """For `multiprocessing.connection.wait` (and select)."""
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> SignedConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def accept(sock: socket.socket, key: bytes, timeout_s: float, allowed: Iterable[type],
           max_message_bytes: int = MAX_MESSAGE_BYTES) -> SignedConnection:
    """The server's side of the handshake on an accepted socket; all of it within `timeout_s`, or
    ProtocolError. The connection then drops a peer that stalls `timeout_s` mid-message."""
    deadline = time.monotonic() + timeout_s
    check_key(key, "the agent server's key")
    _no_delay(sock)
    ns = secrets.token_bytes(_NONCE)
    sock.settimeout(timeout_s)  # sends too: a peer that does not read cannot hold this thread
    sock.sendall(MAGIC + ns)
    got = bytes(_read_exact(sock, _NONCE + _MAC, deadline, None))
    nc, proof = got[:_NONCE], got[_NONCE:]
    if not hmac.compare_digest(proof, _mac(key, b"spotlight-sp/1 client", ns, nc)):
        raise ProtocolError("the client does not hold the key")
    sock.sendall(_mac(key, b"spotlight-sp/1 server", ns, nc))
    sock.settimeout(None)
    return SignedConnection(sock, _mac(key, b"spotlight-sp/1 session", ns, nc), "server", allowed,
                            max_message_bytes, stall_s=timeout_s)


def connect(address: tuple[str, int], key: bytes, timeout_s: float, allowed: Iterable[type],
            max_message_bytes: int = MAX_MESSAGE_BYTES) -> SignedConnection:
    """The client's side: connect and handshake within `timeout_s`, or ProtocolError (a wrong key
    either side, or not an agent server) / OSError (nothing listening)."""
    deadline = time.monotonic() + timeout_s
    where = f"{address[0]}:{address[1]}"
    check_key(key, "the coordinator's key")
    sock = socket.create_connection(address, timeout=timeout_s)
    try:
        _no_delay(sock)
        try:
            hello = bytes(_read_exact(sock, len(MAGIC) + _NONCE, deadline, None))
        except EOFError:
            raise ProtocolError(f"{where} closed the connection before its handshake (busy with too many, "
                                "or not an agent server)") from None
        if not hello.startswith(MAGIC):
            raise ProtocolError(f"{where} is not a Spotlight SP agent server (greeting {hello[:16]!r})")
        ns, nc = hello[len(MAGIC):], secrets.token_bytes(_NONCE)
        sock.sendall(nc + _mac(key, b"spotlight-sp/1 client", ns, nc))
        try:
            proof = bytes(_read_exact(sock, _MAC, deadline, None))
        except EOFError:
            raise ProtocolError(f"{where} refused our key (the agent server and the coordinator "
                                "must share the same key)") from None
        if not hmac.compare_digest(proof, _mac(key, b"spotlight-sp/1 server", ns, nc)):
            raise ProtocolError(f"{where} does not hold our key: not our agent server")
        sock.settimeout(None)
        return SignedConnection(sock, _mac(key, b"spotlight-sp/1 session", ns, nc), "client", allowed,
                                max_message_bytes)
    except BaseException:
        sock.close()
        raise
