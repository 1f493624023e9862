"""Google Cloud Storage: `GcsStore`, a `cloud.store.Store` over one bucket and object-name prefix
(`gs://BUCKET/PREFIX`), through the official `google-cloud-storage` client (imported only when a
store is made).

Writes: an object is written by one upload (one multipart request up to 8 MiB, a resumable upload
above, sent in `chunk_bytes` chunks, 64 MiB by default), which GCS commits whole or not at all, so
a reader sees the previous object or the new one. The client retries a failed chunk alone (not the
file: tests/cloud/test_cloud_gcs.py counts the bytes the server received).
Every upload carries the client's crc32c of the bytes it sends and GCS refuses an object whose bytes
do not match it; `put_file` returns "crc32c:<base64>" as GCS reports it in the upload's answer
(`blob.crc32c`), never by reading the file again here.

Reads: `get_file(key, path, checksum)` first compares the object's crc32c from its metadata with
`checksum` (a replaced or truncated object is refused before a byte is downloaded), then downloads
that generation with the client's crc32c validation on (the bytes received are checked against the
X-Goog-Hash GCS sends), into a temporary file next to `path` that is renamed over it only when whole
and matching; a mismatch is `ChecksumMismatch` and leaves nothing at `path`. A bounded
`get(key, max_bytes)` reads the object's size from its metadata first and downloads that
generation only when it fits (`cloud.store.ObjectTooLarge` otherwise, nothing downloaded).

Retries, two layers: the client library retries single requests (and resumable-upload chunks) its
own way — HTTP 408/429/5xx and connection errors, for up to 120 s of wall time; `cloud.retry.Backoff`
wraps each whole operation under the injected clock and retries what still fails transiently:
those errors once the library gives up, and bytes damaged in transit (`DataCorruption`, or GCS's
400 "Provided CRC32C ... doesn't match"), which the library does not retry. Anything else fails at
once with one `StoreError` line naming the object's URI: no such bucket, no credentials, access
denied. A missing object is `MissingKey`. The library draws from Python's global `random` (its retry
jitter, a multipart upload's boundary: one draw per upload of up to 8 MiB), which checkpoints save
and a resumed run restores, so every operation puts the global `random`'s state back as it found
it: a push changes no number the run draws later (tests/cloud/test_cloud_gcs.py).

Credentials, first found wins: $SPOTLIGHT_GCS_KEY_JSON (a service-account key's JSON text, how
`spotlight launch` hands credentials to cloud nodes); anonymous when $STORAGE_EMULATOR_HOST points
the client at an emulator; else Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, a
VM's service account). The key is never logged nor put in a message.

Invariants and the tests that check them: the `Store` contract — atomic writes, checksums that
refuse replaced or truncated objects, sorted listing, missing keys, keys — tests/cloud/test_cloud_contract.py
(against gcp-storage-emulator on loopback); retries on the injected clock, one-line failures, a
missing bucket, credentials and a key that never shows in a message — tests/cloud/test_cloud_gcs.py.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cloud.bounded_json import MAX_DEPTH, depth_over
from cloud.retry import Backoff, GaveUp, keeping_global_random, one_line
from cloud.store import (ChecksumMismatch, MissingKey, ObjectStat, StoreError, StoreUnavailable, check_key,
                         opened_to_store, replacing, too_large)
from schedulers.clock import Clock, WallClock

log = logging.getLogger(__name__)

KEY_JSON_ENV = "SPOTLIGHT_GCS_KEY_JSON"
"""The environment variable holding a service-account key's JSON text (not a file name)."""
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
CRC32C = "crc32c"
"""The algorithm of a GCS store's checksums."""
SCOPES = ["https://www.googleapis.com/auth/devstorage.read_write"]
_BOUNDED_GET_TRIES = 3
"""Times a bounded `get` reads an object's size again when the object is replaced in between (a
results manifest is replaced at every push, minutes apart: a second try sees a stable one)."""
CHUNK_BYTES = 64 * 1024 * 1024
"""A resumable upload's chunk (a multiple of GCS's 256 KiB): what a failed request re-sends at
most. As S3's parts (`cloud.aws.MULTIPART_CHUNK_BYTES`); the client's own default is 100 MiB."""
# GCS's answer to an upload whose bytes do not match the checksum sent with them.
_CHECKSUM_REFUSED = re.compile(r"(crc32c|md5).*doesn.t match", re.IGNORECASE)
# The client's message for a damaged download: the X-Goog-Hash checksum, then the received bytes'.
_DOWNLOAD_MISMATCH = re.compile(r"indicated an (\w+) checksum of:\s*(\S+)\s+but the actual \w+ checksum of the "
                                r"downloaded contents was:\s*(\S+)")
_KEY_FIELDS = ("client_email", "private_key", "token_uri")
"""What google-auth needs of a service-account key besides its type (it requires client_email and
token_uri, `service_account.Credentials.from_service_account_info`, and signs with private_key)."""
MAX_KEY_BYTES = 64 * 1024
"""A service-account key's JSON is ~2.3 KB; a larger text is not one."""
# Google's other credential types, which a key file or ADC may hold: none is a key a machine can use.
_OTHER_KINDS = {
    "authorized_user": "a user's own login (gcloud auth application-default login), which cannot be handed to a machine",
    "external_account": "workload identity federation, bound to where it was made",
    "external_account_authorized_user": "a federated user's login, which cannot be handed to a machine",
    "impersonated_service_account": "an impersonation that needs the caller's own credentials",
}


class NotAServiceAccountKey(ValueError):
    """Text that is not a service-account key; `str(err)` says why ("is not JSON (line 1 column 2)",
    "is not a service-account key (no client_email)") and never quotes the text."""


def service_account_info(text: str | bytes) -> dict[str, Any]:
    """The fields of a service-account key's JSON `text`, as Google issues them, else
    `NotAServiceAccountKey`. The one check of a key, wherever it comes from: $SPOTLIGHT_GCS_KEY_JSON
    when a store opens (`_credentials`), and $SPOTLIGHT_GCS_KEY_JSON or the file
    $GOOGLE_APPLICATION_CREDENTIALS names when `spotlight launch` ships it (`cloud.credentials`), so
    that a launch refuses, before anything is written, whatever the head's store would refuse
    (tests/cloud/test_launch_inputs.py, tests/cloud/test_cloud_gcs.py)."""
    if len(text) > MAX_KEY_BYTES:
        raise NotAServiceAccountKey(f"is not a service-account key (longer than {MAX_KEY_BYTES // 1024} KiB; "
                                    "a key is ~2.3 KB)")
    if depth_over(text, MAX_DEPTH):  # json.loads would raise RecursionError, not a ValueError (issue 27)
        raise NotAServiceAccountKey(f"is not a service-account key (nested deeper than {MAX_DEPTH} levels)")
    try:
        info = json.loads(text)
    except ValueError as err:  # JSONDecodeError, or UnicodeDecodeError for bytes
        where = f"line {err.lineno} column {err.colno}" if isinstance(err, json.JSONDecodeError) else "not UTF-8"
        raise NotAServiceAccountKey(f"is not JSON ({where}); expected a service-account key's JSON text") from None
    if not isinstance(info, dict):
        raise NotAServiceAccountKey("is not a service-account key (not a JSON object)")
    kind = info.get("type")
    if kind != "service_account":
        # Only Google's own type names are repeated: anything else in the text stays unshown.
        what = f": it is {kind!r}, {_OTHER_KINDS[kind]}" if isinstance(kind, str) and kind in _OTHER_KINDS else ""
        raise NotAServiceAccountKey(f"is not a service-account key (type is not 'service_account'{what})")
    missing = [f for f in _KEY_FIELDS if not (isinstance(info.get(f), str) and info[f].strip())]
    if missing:
        raise NotAServiceAccountKey(f"is not a service-account key (no {', '.join(missing)})")
    return info


class _NoBucket(Exception):
    """The operation's NotFound was the bucket's, not the object's."""


def _causes(err: BaseException | None) -> Iterator[BaseException]:
    """`err`, then what it wraps (the library's RetryError holds the last error in `cause`), each once."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = getattr(err, "cause", None) or err.__cause__ or (None if err.__suppress_context__ else err.__context__)


def transient_gcs_error(err: BaseException) -> bool:
    """Whether `err` (or what it wraps) is worth retrying: HTTP 408/429/5xx, a connection or read
    failure, bytes damaged in transit (the client's checksum check, or GCS refusing an upload's)."""
    import http.client

    import requests
    import urllib3
    from google.api_core.exceptions import GoogleAPICallError
    from google.auth.exceptions import RefreshError, TransportError
    from google.cloud.storage.exceptions import DataCorruption, InvalidResponse

    for e in _causes(err):
        if isinstance(e, DataCorruption):
            return True
        if isinstance(e, GoogleAPICallError):
            code = e.code or 0
            return code in (408, 429) or code >= 500 or (code == 400 and bool(_CHECKSUM_REFUSED.search(str(e))))
        if isinstance(e, InvalidResponse):
            code = getattr(getattr(e, "response", None), "status_code", 0) or 0
            return code in (408, 429) or code >= 500
        if isinstance(e, RefreshError):
            return bool(getattr(e, "retryable", False))
        if isinstance(e, (TransportError, requests.ConnectionError, requests.Timeout,
                          requests.exceptions.ChunkedEncodingError, urllib3.exceptions.ProtocolError,
                          urllib3.exceptions.TimeoutError, urllib3.exceptions.PoolError,
                          http.client.HTTPException, ConnectionError, TimeoutError)):
            return True
    return False


def describe_gcs_error(err: BaseException) -> str:
    """A short name for a failure: "HTTP 503: GET https://...: Service Unavailable" for a GCS error
    answer (however wrapped), the checksum message for damaged bytes, the token endpoint's answer
    for refused credentials, else the first line."""
    from google.api_core.exceptions import GoogleAPICallError
    from google.auth.exceptions import RefreshError
    from google.cloud.storage.exceptions import DataCorruption

    def flat(text: object) -> str:  # the library's messages span lines: one line, at most 200 characters
        return " ".join(str(text).split())[:200]

    for e in _causes(err):
        if isinstance(e, GoogleAPICallError):
            return f"HTTP {e.code}: {flat(e.message)}"
        if isinstance(e, DataCorruption):  # args: (response, message)
            sums = _DOWNLOAD_MISMATCH.search(str(e.args[-1]))
            return ("damaged in transit: " + (f"{sums[1]} {sums[2]} sent, {sums[3]} received" if sums
                                               else flat(e.args[-1])))
        if isinstance(e, RefreshError):  # args: (message, the token endpoint's JSON answer)
            return f"credentials refused: {flat(e.args[0] if e.args else e)}"
    return one_line(err)[:300]


def _credentials(uri: str) -> tuple[Any, str | None]:
    """(credentials, project or None) from the environment (module docstring), or one StoreError line.
    Nothing from the key itself goes into a message."""
    text = os.environ.get(KEY_JSON_ENV, "")
    if text.strip():
        from google.oauth2 import service_account

        try:
            info = service_account_info(text)
        except NotAServiceAccountKey as err:
            raise StoreError(f"{uri}: ${KEY_JSON_ENV} {err}") from None
        try:
            credentials = service_account.Credentials.from_service_account_info(info, scopes=SCOPES)
        except (ValueError, TypeError):  # the message may quote the key: never shown
            raise StoreError(f"{uri}: ${KEY_JSON_ENV}: its private_key could not be read "
                             "(expected a PEM RSA key, as Google issues them)") from None
        return credentials, info.get("project_id")
    if os.environ.get(EMULATOR_ENV):
        from google.auth.credentials import AnonymousCredentials

        return AnonymousCredentials(), None
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        return google.auth.default(scopes=SCOPES)
    except DefaultCredentialsError as err:
        raise StoreError(f"{uri}: no Google Cloud credentials ({one_line(err)[:160]}); set ${KEY_JSON_ENV} to a "
                         "service-account key's JSON, or GOOGLE_APPLICATION_CREDENTIALS to a key file, or run "
                         "on a VM with a service account") from None


class GcsStore:
    """A `cloud.store.Store` in a Google Cloud Storage bucket (see the module docstring).

    `prefix` is the object-name prefix inside `bucket` ('' for the whole bucket). `clock` and
    `backoff` decide how transient failures are waited out (a `ManualClock` in tests); `retries`
    counts the retries taken so far; `chunk_bytes` is a resumable upload's chunk. `client` replaces
    the `google.cloud.storage.Client` made here from the environment's credentials; `project` is
    the client's project (else the key's, else $GOOGLE_CLOUD_PROJECT; object operations need none).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        clock: Clock | None = None,
        backoff: Backoff = Backoff(),
        client: Any = None,
        project: str | None = None,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        if chunk_bytes <= 0 or chunk_bytes % (256 * 1024):
            raise ValueError(f"GcsStore: chunk_bytes must be a positive multiple of 256 KiB, got {chunk_bytes}")
        self.chunk_bytes = chunk_bytes
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.uri = f"gs://{bucket}/{self.prefix}" if self.prefix else f"gs://{bucket}"
        self.clock: Clock = clock if clock is not None else WallClock()
        self.backoff = backoff
        self.retries = 0
        if client is None:
            from google.cloud import storage

            credentials, key_project = _credentials(self.uri)
            # An explicit project (None included) keeps the client from looking one up on the network.
            client = storage.Client(project=project or key_project or os.environ.get("GOOGLE_CLOUD_PROJECT") or None,
                                    credentials=credentials)
        self.client = client
        self._bucket = client.bucket(bucket)

    def __repr__(self) -> str:
        return f"GcsStore({self.uri!r})"

    def _name(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, op: str, key: str, fn: Callable[[], Any]) -> Any:
        """`fn()` with retries; every failure that is not retried away becomes one StoreError line."""
        import requests
        from google.api_core.exceptions import GoogleAPIError, NotFound
        from google.auth.exceptions import GoogleAuthError
        from google.cloud.storage.exceptions import InvalidResponse

        where = f"{self.uri}/{key}" if key else self.uri

        @keeping_global_random  # the library draws from it (module docstring)
        def attempt() -> Any:
            try:
                return fn()
            except NotFound:
                # Inside the retried call, so that a transient failure of this check is retried too.
                if not self._bucket_exists():
                    raise _NoBucket from None
                raise

        try:
            return self.backoff.call(attempt, transient=transient_gcs_error, clock=self.clock, what=f"{op} {where}",
                                     on_retry=lambda err, n, wait: self._on_retry(f"{op} {where}", err, n, wait),
                                     describe=describe_gcs_error)
        except GaveUp as err:
            raise StoreUnavailable(str(err)) from err
        except _NoBucket:
            endpoint = os.environ.get(EMULATOR_ENV)
            raise StoreError(f"{op} {where}: bucket {self.bucket!r} does not exist"
                             + (f" at {endpoint}" if endpoint else "")) from None
        except NotFound:
            raise MissingKey(f"{where}: no such object") from None
        except (GoogleAPIError, GoogleAuthError, InvalidResponse, requests.RequestException,
                ConnectionError, TimeoutError) as err:
            raise StoreError(f"{op} {where}: {describe_gcs_error(err)}") from err

    def _bucket_exists(self) -> bool:
        from google.api_core.exceptions import Forbidden

        try:
            return self._bucket.exists()
        except Forbidden:  # an object-only role may not read bucket metadata: the bucket is there
            return True

    def _on_retry(self, what: str, err: BaseException, retry: int, wait_s: float) -> None:
        self.retries += 1
        log.warning("%s: %s; retry %d in %.2f s", what, describe_gcs_error(err), retry, wait_s)

    def put(self, key: str, data: bytes) -> None:
        name = self._name(key)
        self._call("PUT", key, lambda: self._bucket.blob(name).upload_from_string(
            data, content_type="application/octet-stream", checksum=CRC32C))

    def put_file(self, key: str, path: Path) -> str:
        name = self._name(key)

        with opened_to_store(path) as f:
            size = os.fstat(f.fileno()).st_size

            def upload() -> str:
                # A fresh blob per attempt, from the file's start: nothing carries over from a failed one.
                f.seek(0)
                blob = self._bucket.blob(name, chunk_size=self.chunk_bytes)
                blob.upload_from_file(f, size=size, content_type="application/octet-stream", checksum=CRC32C)
                if not blob.crc32c:
                    raise StoreError(f"PUT {self.uri}/{key}: GCS answered the upload without a crc32c")
                return f"{CRC32C}:{blob.crc32c}"

            return self._call("PUT", key, upload)

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        name = self._name(key)
        if max_bytes is None:
            # The body is read inside the retried call: a connection cut or damaged body is retried too.
            return self._call("GET", key, lambda: self._bucket.blob(name).download_as_bytes(checksum=CRC32C))

        def bounded() -> bytes:
            """The object's size from its metadata first (one more request, for a bounded read only),
            then that generation's bytes: an object over `max_bytes` is never downloaded."""
            from google.api_core.exceptions import PreconditionFailed

            for _ in range(_BOUNDED_GET_TRIES):
                stored = self._metadata(name)
                if int(stored.size) > max_bytes:
                    raise too_large(self.uri, key, int(stored.size), max_bytes)
                try:
                    return self._bucket.blob(name).download_as_bytes(checksum=CRC32C,
                                                                     if_generation_match=stored.generation)
                except PreconditionFailed:  # replaced since its size was read: read its size again
                    continue
            raise StoreError(f"GET {self.uri}/{key}: replaced {_BOUNDED_GET_TRIES} times while it was read")

        return self._call("GET", key, bounded)

    def get_file(self, key: str, path: Path, checksum: str | None = None) -> None:
        name = self._name(key)
        with replacing(path) as tmp:
            generation = None
            if checksum is not None:
                stored = self._call("GET", key, lambda: self._metadata(name))
                got = f"{CRC32C}:{stored.crc32c}"
                if got != checksum:
                    raise ChecksumMismatch(f"{self.uri}/{key}: checksum {got}, expected {str(checksum)[:80]}")
                generation = stored.generation
            got = self._call("GET", key, lambda: self._download(name, tmp, generation))
            if checksum is not None and got != checksum:
                raise ChecksumMismatch(f"{self.uri}/{key}: downloaded {got or 'without a crc32c to check'}, "
                                       f"expected {str(checksum)[:80]}")

    def stat(self, key: str) -> ObjectStat:
        """The object's size and crc32c from its metadata (one GET of the object resource)."""
        name = self._name(key)
        blob = self._call("HEAD", key, lambda: self._metadata(name))
        if not blob.crc32c:
            raise StoreError(f"{self.uri}/{key}: GCS keeps no crc32c for it")
        return ObjectStat(int(blob.size), f"{CRC32C}:{blob.crc32c}")

    def _metadata(self, name: str) -> Any:
        """The object's blob with its metadata (crc32c, generation); NotFound when there is none."""
        from google.api_core.exceptions import NotFound

        blob = self._bucket.get_blob(name)
        if blob is None:
            raise NotFound(f"no such object: {name}")
        return blob

    def _download(self, name: str, tmp: Path, generation: int | None) -> str | None:
        """Download the object (that `generation` when given) to `tmp` with the client's crc32c check;
        returns "crc32c:..." of what was received, None when GCS sent no checksum to check against."""
        from google.api_core.exceptions import PreconditionFailed

        blob = self._bucket.blob(name)  # fresh: its crc32c can only come from this download's answer
        try:
            blob.download_to_filename(str(tmp), checksum=CRC32C, if_generation_match=generation)
        except PreconditionFailed:  # replaced since its metadata was read
            return f"{CRC32C}:(replaced while being read)"
        return f"{CRC32C}:{blob.crc32c}" if blob.crc32c else None

    def list(self, prefix: str = "") -> list[str]:
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        cut = len(self.prefix) + 1 if self.prefix else 0

        def fetch() -> list[str]:
            # Names only: a page of 1,000 full object resources is ~1 MB of JSON, of names ~50 kB.
            blobs = self.client.list_blobs(self._bucket, prefix=full, fields="items(name),nextPageToken")
            return [blob.name[cut:] for blob in blobs]

        return sorted(self._call("LIST", prefix, fetch))

    def delete(self, key: str) -> None:
        name = self._name(key)
        try:
            self._call("DELETE", key, lambda: self._bucket.blob(name).delete())
        except MissingKey:
            pass  # deleting a missing object is not an error (a missing bucket is: StoreError)
