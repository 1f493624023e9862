"""A store: named byte objects under one root, the place checkpoints outlive a spot instance in.

The `Store` Protocol is small on purpose, so that S3 (`cloud.aws.S3Store`), Google Cloud Storage
(`cloud.gcs.GcsStore`) and a folder (`LocalStore`) pass the same contract tests
(tests/cloud/test_cloud_contract.py):
- `put`/`put_file` are atomic: a reader sees the previous object or the whole new one, never a
  part (S3 gives this per object; `LocalStore` writes a hidden temporary file and renames it);
- `put_file` returns the stored object's checksum, "ALGORITHM:VALUE" (S3: "crc64nvme:...",
  computed by S3 from the bytes it received; GCS: "crc32c:..."; a folder: "sha256:...", hashed
  while copying). `get_file(key, path, checksum=that)` verifies the object against it — natively
  where the store can (the stored object's checksum is compared first, the bytes in transit are
  validated by the client library) — and raises `ChecksumMismatch`, leaving nothing at `path`,
  when the object was replaced, truncated or damaged. So a caller never hashes a file itself;
- `get`/`get_file` of a key that does not exist raise `MissingKey`; `get_file` writes its
  destination atomically too;
- `get(key, max_bytes=N)` of an object over N bytes raises `ObjectTooLarge` without reading it
  whole: the size is known first (a folder's stat, S3's Content-Length, GCS's metadata), so a
  planted 400 MB manifest costs a refusal, not 1.2 GB of memory (issue 27). Whatever is read back
  as JSON goes through `get_json`: that bound, then `cloud.bounded_json`'s depth and syntax checks;
- `stat(key)` gives an object's size and the checksum `get_file` verifies against (the same
  "ALGORITHM:VALUE" `put_file` returned for it), without reading the object, so a folder of
  objects can be fetched verified without a manifest (`cloud.model_cache`); a missing key is
  `MissingKey`;
- `list(prefix)` returns every stored key that starts with `prefix`, sorted; temporary files are
  never listed;
- `delete` of a missing key is not an error.
Atomicity is per object: a set of objects that belongs together (a checkpoint) needs a marker
written last — see `spotlight.train.checkpoint_sync`.

Keys are relative '/'-separated paths ("step-000004/MANIFEST.json"): no leading or trailing '/',
no empty, '.' or '..' parts.

`parse_store_uri(uri)` reads `s3://BUCKET/PREFIX`, `gs://BUCKET/PREFIX` (Google Cloud Storage),
`file:///ABS/PATH` or a plain path (`cloud.open_store.open_store` opens it). A URI that names no
store is a `StoreURIError` whose message is one line naming the URI and what was expected.

A folder store is accepted only inside an allowed root: a folder listed in `$SPOTLIGHT_STORE_ROOTS`
(`os.pathsep`-separated), or, when that is unset or empty, the working directory. A run writes and
prunes `step-*` entries in its store, so `file:///etc` must not be one by a typo (issue 13). Paths
are compared after resolving symbolic links, so a link inside a root cannot lead out of it.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol, runtime_checkable
from urllib.parse import urlsplit

from cloud.bounded_json import MAX_DEPTH, loads, size_text
from schedulers.input.files import InputError

EXPECTED_URI = "s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, file:///ABSOLUTE/PATH or a local path"
STORE_ROOTS_ENV = "SPOTLIGHT_STORE_ROOTS"
"""Folders that folder stores may be in, `os.pathsep`-separated; unset or empty: the working directory."""
TMP_PREFIX = ".tmp-"  # LocalStore's in-progress files start with this; never listed
SHA256 = "sha256"
"""The algorithm of a folder store's checksums."""


class StoreError(RuntimeError):
    """A store operation that failed for good (after any retries); the message is one line that
    names the object's URI."""


class StoreUnavailable(StoreError):
    """The store kept failing transiently (throttled, unreachable, server errors) until its retries
    ran out (`cloud.retry.GaveUp`): not bad input, and a later try may succeed — `spotlight train`
    exits 1 on it, which a launched fleet's head restarts from, rather than 2, which ends the run."""


class MissingKey(StoreError):
    """The key does not exist in the store."""


class ChecksumMismatch(StoreError):
    """The stored object is not the one whose checksum the caller holds (replaced, truncated,
    damaged); the message names the object and both checksums."""


class ObjectTooLarge(StoreError, ValueError):
    """`get(key, max_bytes)` of an object larger than `max_bytes`; nothing of it was read. A
    ValueError too, so a reader's `except ValueError` for a bad object takes it as one."""


class LocalFileRefused(StoreError):
    """A local file `put_file` was to store is not, once opened, a regular file of this user: a
    symlink, FIFO, device or another user's file put in its place after it was listed."""


class StoreURIError(InputError):
    """A URI that names no store; the message is one line: the URI, what is wrong, what was expected."""


@runtime_checkable
class Store(Protocol):
    uri: str
    """Where the store's root is, for messages (e.g. s3://bucket/run1, /data/run1)."""

    def put(self, key: str, data: bytes) -> None: ...

    def put_file(self, key: str, path: Path) -> str:
        """Store the contents of the local file `path` under `key`; returns the stored object's
        checksum, "ALGORITHM:VALUE" (module docstring). `path` is opened by `opened_to_store`: a
        symlink, FIFO or another user's file there is `LocalFileRefused`."""
        ...

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        """The object's bytes; with `max_bytes`, `ObjectTooLarge` for an object larger than that,
        found out before it is read (module docstring)."""
        ...

    def get_file(self, key: str, path: Path, checksum: str | None = None) -> None:
        """Write the object to the local file `path` (atomically; parent folders are made). With
        `checksum` (a value `put_file` returned), an object that does not match it raises
        `ChecksumMismatch` and nothing is written."""
        ...

    def stat(self, key: str) -> "ObjectStat":
        """The object's size and checksum as the store keeps them (the checksum `put_file` returned
        for it, the one `get_file` verifies against); `MissingKey` when there is none."""
        ...

    def list(self, prefix: str = "") -> list[str]:
        """Every key that starts with `prefix`, sorted."""
        ...

    def delete(self, key: str) -> None: ...


@dataclass(frozen=True)
class ObjectStat:
    """What a store says of one object without reading it: `size` in bytes and `checksum`,
    "ALGORITHM:VALUE" (module docstring)."""

    size: int
    checksum: str


@dataclass(frozen=True)
class StoreLocation:
    """A parsed store URI: `scheme` "s3" or "gs" with `bucket` and `prefix` (no outer '/'), or "file"
    with `path`."""

    scheme: str
    bucket: str = ""
    prefix: str = ""
    path: Path | None = None


def parse_store_uri(uri: str) -> StoreLocation:
    """Parse a store URI (see the module docstring); a bad one raises StoreURIError."""
    if not isinstance(uri, str) or not uri.strip():
        raise StoreURIError(f"{uri!r}: empty store URI (expected {EXPECTED_URI})")
    if len(uri) > 1024 or not uri.isprintable():  # so that every message below stays one short line
        raise StoreURIError(f"{uri[:100]!r}: expected a URI of at most 1024 printable characters "
                            f"({EXPECTED_URI})")
    shown = _shown(uri)
    if "://" not in uri:
        if uri.startswith(("s3:", "gs:", "file:")):  # s3:/bucket, s3:bucket: a mistyped URI, not a folder name
            raise StoreURIError(f"{shown}: malformed URI (expected {EXPECTED_URI})")
        return _allowed(uri, StoreLocation("file", path=Path(uri).expanduser().absolute()))
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "s3":
        return _bucket_location(parts, shown, "S3", _valid_bucket, "'.' or '-'")
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise StoreURIError(f"{shown}: expected file:///ABSOLUTE/PATH (three slashes)")
        return _allowed(uri, StoreLocation("file", path=Path(parts.path)))
    if scheme == "gs":
        return _bucket_location(parts, shown, "GCS", _valid_gcs_bucket, "'-', '_' or '.'")
    if scheme == "gcs":
        raise StoreURIError(f"{shown}: unknown scheme 'gcs' (Google Cloud Storage URIs are gs://BUCKET/PREFIX)")
    raise StoreURIError(f"{shown}: unknown scheme {parts.scheme[:40]!r} (expected {EXPECTED_URI})")


def _bucket_location(parts, shown: str, service: str, valid, allowed: str) -> StoreLocation:
    """The bucket and prefix of an s3:// or gs:// URI (split by `urlsplit`), or a StoreURIError."""
    scheme = parts.scheme.lower()
    form = f"{scheme}://BUCKET/PREFIX"
    bucket, prefix = parts.netloc, parts.path.strip("/")
    if not bucket:
        raise StoreURIError(f"{shown}: no bucket (expected {form})")
    if not valid(bucket):
        raise StoreURIError(f"{shown}: {bucket[:70]!r} is not a valid {service} bucket name (expected 3-63 lowercase "
                            f"letters, digits, {allowed}, starting and ending with a letter or digit)")
    if parts.query or parts.fragment or "//" in prefix:
        raise StoreURIError(f"{shown}: unexpected '?', '#' or '//' (expected {form})")
    return StoreLocation(scheme, bucket=bucket, prefix=prefix)


def get_json(store: Store, key: str, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value stored at `key`, at most `max_bytes` of it and `max_depth` levels deep:
    `MissingKey` when there is none, a ValueError (`ObjectTooLarge`, `cloud.bounded_json.JsonRefused`)
    with one line naming the object when it is not JSON within those bounds."""
    return loads(store.get(key, max_bytes=max_bytes), max_bytes=max_bytes, max_depth=max_depth,
                 what=f"{store.uri}/{key}")


def too_large(uri: str, key: str, size: int | None, max_bytes: int) -> ObjectTooLarge:
    """The error of an object of `size` bytes (None: not known) read with at most `max_bytes`."""
    of = f"{size} bytes, more" if size is not None else "more"
    return ObjectTooLarge(f"{uri}/{key}: {of} than the {size_text(max_bytes)} expected of it (not read)")


def store_roots() -> list[Path]:
    """The folders folder stores may be in (module docstring), resolved."""
    named = [p for p in os.environ.get(STORE_ROOTS_ENV, "").split(os.pathsep) if p.strip()]
    return [Path(os.path.realpath(Path(p).expanduser())) for p in named] or [Path(os.path.realpath(os.getcwd()))]


def _allowed(uri: str, where: StoreLocation) -> StoreLocation:
    assert where.path is not None
    real = Path(os.path.realpath(where.path))
    roots = store_roots()
    if not any(real == root or root in real.parents for root in roots):
        allowed = os.pathsep.join(str(r) for r in roots)
        raise StoreURIError(f"{_shown(uri)}: a folder store outside the allowed folders ({allowed[:150]}); "
                            f"to allow it, add its folder to ${STORE_ROOTS_ENV} ({os.pathsep}-separated)")
    return where


def _shown(uri: str) -> str:
    """A URI for an error line: at most ~120 characters (S3 keys may be 1,024 long)."""
    return uri if len(uri) <= 120 else uri[:117] + "..."


def _valid_bucket(name: str) -> bool:
    # S3's rules for new buckets (what S3-compatible servers accept too), minus the IP-address rule.
    return (3 <= len(name) <= 63 and name[0].isalnum() and name[-1].isalnum() and ".." not in name
            and all(c.islower() or c.isdigit() or c in ".-" for c in name))


def _valid_gcs_bucket(name: str) -> bool:
    # GCS's rules for bucket names without dots (dotted names may be longer, up to 222, but need a
    # verified domain; checkpoint buckets do not use them).
    ends = "abcdefghijklmnopqrstuvwxyz0123456789"
    return 3 <= len(name) <= 63 and name[0] in ends and name[-1] in ends and all(c in ends or c in "-_." for c in name)


def _copy_hashing(src, dst, digest) -> None:
    """Copy file object `src` to `dst` in 1 MiB blocks, feeding `digest` on the way."""
    while block := src.read(1 << 20):
        digest.update(block)
        dst.write(block)


def own_regular(info: os.stat_result) -> bool:
    """Whether a file's stat (an lstat, or an fstat of the file open) is a regular file owned by
    this user: the one rule for what a run pushes (`spotlight.train.run_files.regular` on the
    listing, `opened_to_store` on the file opened)."""
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()


@contextmanager
def opened_to_store(path: Path) -> Iterator[BinaryIO]:
    """Local file `path` opened for `put_file`, refused (`LocalFileRefused`) unless it is a regular
    file of this user as opened — not as looked at before: O_NOFOLLOW refuses a symlink in its place
    (issue 41: the run folder's files were checked with lstat, then opened by name, so a file swapped
    for a link in between was followed), O_NONBLOCK a FIFO that would wait for a writer, and fstat
    judges the file actually open. The check is of the last component; the folders above are the
    run's own (`spotlight.train.run_files` walks them without following links)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        what = "a symbolic link" if err.errno == errno.ELOOP else err.strerror or type(err).__name__
        raise LocalFileRefused(f"{path}: {what} (expected a regular file of this user; not stored)") from None
    with open(fd, "rb") as f:
        info = os.fstat(fd)
        if not own_regular(info):
            what = "another user's file" if stat.S_ISREG(info.st_mode) else "not a regular file"
            raise LocalFileRefused(f"{path}: {what} (expected a regular file of this user; not stored)")
        yield f


@contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary file next to `path` (named `.tmp-...`: a folder store never lists it) for the
    block to write; renamed over `path` when the block ends, removed when it raises, so `path` is
    the previous file or the whole new one. Parent folders are made. Every store's `get_file` and
    `LocalStore`'s writes go through it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f"{TMP_PREFIX}{path.name}-{uuid.uuid4().hex[:8]}"
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def check_key(key: str) -> str:
    """`key` if it is a valid store key (see the module docstring), else ValueError."""
    parts = key.split("/") if isinstance(key, str) else [""]
    if not key or any(p in ("", ".", "..") or p.startswith(TMP_PREFIX) for p in parts) or "\\" in key:
        raise ValueError(f"invalid store key {key!r} (expected a relative path like 'step-000004/state.json')")
    return key


class LocalStore:
    """A store in a local folder (a mounted network disk, or the local provider in tests and
    simulation). Objects are files under `root`; writes go to a hidden temporary file in the same
    folder, are flushed to disk and renamed over the target, so a crash leaves the old file or the
    new one."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.uri = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _write_atomically(self, key: str, write) -> None:
        with replacing(self._path(key)) as tmp, open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())

    def put(self, key: str, data: bytes) -> None:
        self._write_atomically(key, lambda f: f.write(data))

    def put_file(self, key: str, path: Path) -> str:
        digest = hashlib.sha256()
        with opened_to_store(path) as src:
            self._write_atomically(key, lambda f: _copy_hashing(src, f, digest))
        return f"{SHA256}:{digest.hexdigest()}"

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        try:
            # O_NONBLOCK: a FIFO in an object's place must not wait for a writer (regular files ignore it).
            fd = os.open(self._path(key), os.O_RDONLY | os.O_NONBLOCK)
        except (FileNotFoundError, NotADirectoryError):
            raise MissingKey(f"{self.uri}/{key}: no such object") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):  # a folder, a FIFO, a device: no object, as for get_file
                raise MissingKey(f"{self.uri}/{key}: no such object")
            if max_bytes is not None and info.st_size > max_bytes:  # found out before a byte is read
                raise too_large(self.uri, key, info.st_size, max_bytes)
            with open(fd, "rb", closefd=False) as f:
                data = f.read() if max_bytes is None else f.read(max_bytes + 1)  # + 1: one that grew since
        finally:
            os.close(fd)
        if max_bytes is not None and len(data) > max_bytes:
            raise too_large(self.uri, key, None, max_bytes)
        return data

    def get_file(self, key: str, path: Path, checksum: str | None = None) -> None:
        source = self._path(key)
        if not source.is_file():
            raise MissingKey(f"{self.uri}/{key}: no such object")
        with replacing(path) as tmp:
            digest = hashlib.sha256()
            with open(source, "rb") as src, open(tmp, "wb") as dst:
                _copy_hashing(src, dst, digest)  # one read: the copy is the hash's pass
            got = f"{SHA256}:{digest.hexdigest()}"
            if checksum is not None and got != checksum:
                raise ChecksumMismatch(f"{self.uri}/{key}: checksum {got[:80]}, expected {str(checksum)[:80]}")

    def stat(self, key: str) -> ObjectStat:
        source = self._path(key)
        if not source.is_file():
            raise MissingKey(f"{self.uri}/{key}: no such object")
        # A folder keeps no checksum: it is hashed here (one read of the file, as get_file's).
        digest = hashlib.sha256()
        with open(source, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
        return ObjectStat(source.stat().st_size, f"{SHA256}:{digest.hexdigest()}")

    def list(self, prefix: str = "") -> list[str]:
        if not self.root.is_dir():
            return []
        keys = []
        for folder, dirs, files in os.walk(self.root):
            rel = Path(folder).relative_to(self.root).as_posix()
            for name in files:
                if not name.startswith(TMP_PREFIX):
                    key = name if rel == "." else f"{rel}/{name}"
                    if key.startswith(prefix):
                        keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        # Drop folders the delete emptied, so a store of rotated checkpoints does not fill with them.
        for parent in path.parents:
            if parent == self.root or self.root not in parent.parents:
                break
            try:
                parent.rmdir()
            except OSError:
                break
