"""The AWS provider: checkpoints in S3, spot prices, and spot interruption notices.

Storage: `S3Store` is a `cloud.store.Store` over one bucket and key prefix (`s3://BUCKET/PREFIX`).
Objects are written with one PUT (or a multipart upload for files over 64 MB, completed in one
call), so a reader sees a whole object or the previous one. The endpoint is `endpoint_url`, else
$AWS_ENDPOINT_URL_S3, else $AWS_ENDPOINT_URL (boto3's own variables, read here so that a custom
endpoint, i.e. an S3-compatible server such as MinIO or moto, also gets path-style addressing).
Retries come in two layers. botocore retries each HTTP request itself ("adaptive" mode,
`request_attempts` attempts: its standard exponential backoff plus a client-side rate limiter that
slows down after throttling answers), so one failed part of a multipart upload is re-sent alone —
not the file (tests/cloud/test_cloud_store.py counts the requests the server received). Around that,
`cloud.retry.Backoff` retries whole operations under the injected clock on what is still transient
— HTTP 5xx and 429, SlowDown/throttling codes, connection errors, timeouts, checksum mismatches in
transit — for outages longer than botocore's few attempts; anything else (no credentials, no such
bucket, access denied) fails at once with one `StoreError` line.

Checksums are S3's own: every upload is sent with a CRC-64/NVME checksum (botocore computes it
while sending; S3 rejects a request whose bytes do not match it), and S3 keeps it as the object's
full-object checksum, multipart uploads included. `put_file` returns it ("crc64nvme:BASE64", read
back with a HEAD: S3's value, not one hashed here). `get`/`get_file` ask for it (`ChecksumMode`)
and botocore validates the body against it as it streams; `get_file(checksum=...)` also compares
S3's value with the expected one before writing anything (a replaced or truncated object is
refused, `ChecksumMismatch`). The price: a download is one validated stream per object, not
s3transfer's parallel ranged GETs, whose ranges carry no checksum.
A bounded `get(key, max_bytes)` reads the GET's Content-Length and closes the body unread when
it is over (`cloud.store.ObjectTooLarge`).

Spot prices: `spot_price_history` reads `describe_spot_price_history`, all pages.

Preemption notices: `ImdsSpotWatcher` is a `schedulers.preemption.NoticeSource` over the EC2
instance metadata service (IMDSv2). It reads
- `meta-data/spot/instance-action`: 404 until EC2 schedules an interruption, then
  `{"action": "terminate"|"stop"|"hibernate", "time": "<UTC ISO 8601>"}` about 2 minutes ahead
  -> `Cause.AWS_INSTANCE_ACTION`, deadline = clock.now() + (time - UTC now);
- `meta-data/events/recommendations/rebalance`: 404, or `{"noticeTime": ...}` when the instance is
  at elevated risk -> `Cause.AWS_REBALANCE`, deadline None (advisory; often earlier, may never
  be followed by an interruption).
Every request carries a session token from `PUT latest/api/token` (TTL 6 h), renewed before it
expires or when IMDS answers 401. Only the standard library is used for IMDS; an endpoint that
fails or times out (1 s) means no notice this time.

`AwsProvider` is the `cloud.provider.Provider` over the S3 store and the IMDS watcher.

Invariants: `poll()` never raises on a network or HTTP failure and never blocks longer than about
three request timeouts. boto3 is imported only when an S3 store or a price query is made.
"""

from __future__ import annotations

import http.client
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from cloud.bounded_json import loads
from cloud.retry import Backoff, GaveUp, keeping_global_random, one_line
from cloud.store import (ChecksumMismatch, LocalStore, MissingKey, ObjectStat, Store, StoreError, StoreUnavailable,
                         StoreURIError, check_key, opened_to_store, parse_store_uri, replacing, too_large)
from schedulers.clock import Clock, WallClock
from schedulers.preemption import Cause, NoticeSource, PreemptionNotice

log = logging.getLogger(__name__)

IMDS_ENDPOINT_ENV = "SPOTLIGHT_IMDS_ENDPOINT"
DEFAULT_IMDS_ENDPOINT = "http://169.254.169.254"
TOKEN_TTL_S = 21600  # the IMDSv2 maximum (6 h)
# Renew a minute before the token expires, so a poll never sends a token that dies in flight.
TOKEN_RENEW_MARGIN_S = 60.0

MAX_IMDS_BYTES = 64 * 1024
"""Most bytes of an IMDS answer read: an instance-action is ~60 bytes, a token 56 characters."""
# IMDS is link-local: never route it through an HTTP(S)_PROXY from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ImdsSpotWatcher:
    """Spot interruption and rebalance notices from EC2 IMDSv2 (see the module docstring).

    `base` defaults to $SPOTLIGHT_IMDS_ENDPOINT, then http://169.254.169.254. `utcnow` returns the
    current UTC wall time (aware datetime); it is injected so tests control the notice deadline.
    `rebalance=False` ignores rebalance recommendations and reports only interruptions.
    """

    def __init__(
        self,
        clock: Clock,
        base: str | None = None,
        *,
        utcnow: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
        timeout_s: float = 1.0,
        rebalance: bool = True,
    ) -> None:
        self.base = (base or os.environ.get(IMDS_ENDPOINT_ENV) or DEFAULT_IMDS_ENDPOINT).rstrip("/")
        if not self.base.startswith(("http://", "https://")):
            raise ValueError(
                f"IMDS endpoint {self.base!r} (argument or ${IMDS_ENDPOINT_ENV}): expected http://HOST[:PORT]"
            )
        self._clock = clock
        self._utcnow = utcnow
        self._timeout_s = timeout_s
        self._rebalance = rebalance
        self._token: str | None = None
        self._token_expires = 0.0

    def poll(self) -> PreemptionNotice | None:
        try:
            action = self._get_json("/latest/meta-data/spot/instance-action")
            if action is not None:
                return self._instance_action(action)
            if self._rebalance:
                advice = self._get_json("/latest/meta-data/events/recommendations/rebalance")
                if advice is not None:
                    when = advice.get("noticeTime", "?") if isinstance(advice, dict) else "?"
                    return PreemptionNotice(Cause.AWS_REBALANCE, None, detail=f"rebalance recommended at {when}")
        except (OSError, http.client.HTTPException, ValueError):
            pass  # transient (ValueError: an undecodable token): no notice this time
        return None

    def _instance_action(self, body: object) -> PreemptionNotice:
        """The notice for a 200 from spot/instance-action; an unreadable time gives deadline None."""
        info = body if isinstance(body, dict) else {}
        when = info.get("time")
        try:
            at = _as_utc(datetime.fromisoformat(str(when).replace("Z", "+00:00")))
            deadline: float | None = self._clock.now() + (at - _as_utc(self._utcnow())).total_seconds()
        except ValueError:
            deadline = None
        detail = f"{info.get('action', '?')} at {when}" if info else f"unreadable instance-action {body!r}"
        return PreemptionNotice(Cause.AWS_INSTANCE_ACTION, deadline, detail=detail)

    def _get_json(self, path: str) -> object | None:
        """The JSON body at `path` (text if it is not JSON), None on 404. Renews the token once on 401."""
        for _ in range(2):
            status, body = self._request("GET", path, {"X-aws-ec2-metadata-token": self._session_token()})
            if status == 401:
                self._token = None
                continue
            if status == 404:
                return None
            if status != 200:
                raise ConnectionError(f"IMDS GET {path} answered {status}")
            try:
                return loads(body, max_bytes=MAX_IMDS_BYTES, what=f"IMDS {path}")  # bounded depth: poll never raises
            except ValueError:
                return body.decode(errors="replace")[:200]  # 200 with an unexpected body: still a notice
        raise ConnectionError(f"IMDS GET {path} answered 401 with a fresh token")

    def _session_token(self) -> str:
        if self._token is None or self._clock.now() >= self._token_expires:
            headers = {"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)}
            status, body = self._request("PUT", "/latest/api/token", headers)
            if status != 200:
                raise ConnectionError(f"IMDS token PUT answered {status}")
            self._token = body.decode().strip()
            self._token_expires = self._clock.now() + TOKEN_TTL_S - TOKEN_RENEW_MARGIN_S
        return self._token

    def _request(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        """(status, body); network failures raise OSError or http.client.HTTPException."""
        request = urllib.request.Request(self.base + path, method=method, headers=headers)
        try:
            with _OPENER.open(request, timeout=self._timeout_s) as response:
                return response.status, response.read(MAX_IMDS_BYTES + 1)
        except urllib.error.HTTPError as e:
            with e:
                return e.code, b""


def _as_utc(moment: datetime) -> datetime:
    """Naive datetimes from IMDS or `utcnow` are UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


# ---- S3 ------------------------------------------------------------------------------------------

# S3 error codes that mean "try again later" whatever the HTTP status says.
TRANSIENT_S3_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "RequestThrottled", "RequestLimitExceeded",
    "TooManyRequestsException", "RequestTimeout", "RequestTimeoutException", "InternalError",
    "ServiceUnavailable", "BadDigest", "IncompleteBody", "PriorRequestNotComplete",
})
# One PUT up to 64 MB; bigger files go in 64 MB parts, 8 at a time (s3transfer's defaults are 8 MB
# parts, which would make a 40 GB Qwen-Image checkpoint 5000 requests instead of 640).
MULTIPART_CHUNK_BYTES = 64 * 1024 * 1024
REQUEST_ATTEMPTS = 5
"""botocore's attempts per HTTP request (adaptive mode); its waits grow to ~8 s by the fifth, after
which `Backoff` waits out what is left of an outage, operation by operation."""
CHECKSUM_ALGORITHM = "CRC64NVME"
"""S3's default full-object checksum (multipart uploads too): what every object is sent and verified with."""
_CHECKSUM_FIELD = f"Checksum{CHECKSUM_ALGORITHM}"
_CHECKSUM_PREFIX = f"{CHECKSUM_ALGORITHM.lower()}:"
_STREAM_BLOCK = 1 << 20


def endpoint_from_env() -> str | None:
    """The S3 endpoint boto3 would use from the environment ($AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL)."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def _causes(err: BaseException | None) -> Iterator[BaseException]:
    """`err`, then what it wraps (s3transfer re-raises client errors as its own), each once."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def transient_s3_error(err: BaseException) -> bool:
    """Whether `err` (or what it wraps) is worth retrying: HTTP 5xx/429, a throttling code, a
    connection or read failure, a checksum mismatch in transit."""
    from botocore.exceptions import (
        ChecksumError, ClientError, ConnectionError, FlexibleChecksumError, HTTPClientError, IncompleteReadError,
    )
    from s3transfer.exceptions import RetriesExceededError

    for e in _causes(err):
        if isinstance(e, ClientError):
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            return status >= 500 or status == 429 or e.response.get("Error", {}).get("Code") in TRANSIENT_S3_CODES
        if isinstance(e, ChecksumMismatch):
            return False  # the stored object is another one: waiting does not change it
        if isinstance(e, (HTTPClientError, ConnectionError, IncompleteReadError, ChecksumError,
                          FlexibleChecksumError, RetriesExceededError)):
            return True
    return False


def _client_error(err: BaseException | None) -> Any:
    """The botocore ClientError `err` is or wraps, or None."""
    from botocore.exceptions import ClientError

    return next((e for e in _causes(err) if isinstance(e, ClientError)), None)


def describe_s3_error(err: BaseException) -> str:
    """A short name for a failure: "SlowDown (HTTP 503): Please reduce your request rate." for an
    S3 error answer (however wrapped), else the error's first line."""
    client = _client_error(err)
    if client is None:
        return one_line(err)
    error = client.response.get("Error", {})
    status = client.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    message = str(error.get("Message") or "").strip()
    return f"{error.get('Code', '?')} (HTTP {status})" + (f": {message}" if message else "")


class S3Store:
    """A `cloud.store.Store` in S3 or any S3-compatible server (see the module docstring).

    `prefix` is the key prefix inside `bucket` ('' for the whole bucket). `request_attempts` is
    botocore's attempts per HTTP request; `clock` and `backoff` decide how what is still failing
    after them is waited out, operation by operation (a `ManualClock` in tests); `retries` counts
    those whole-operation retries. `client` replaces the boto3 client made here (one with other
    settings). `multipart_chunk_bytes` is the size of a multipart upload's parts (S3: >= 5 MiB).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        clock: Clock | None = None,
        backoff: Backoff = Backoff(),
        client: Any = None,
        request_attempts: int = REQUEST_ATTEMPTS,
        multipart_chunk_bytes: int = MULTIPART_CHUNK_BYTES,
    ) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.endpoint_url = endpoint_url or endpoint_from_env()
        self.clock: Clock = clock if clock is not None else WallClock()
        self.backoff = backoff
        self.retries = 0
        if client is None:
            if request_attempts < 1:
                raise ValueError(f"S3Store: request_attempts must be >= 1, got {request_attempts}")
            config = Config(
                retries={"mode": "adaptive", "total_max_attempts": request_attempts},
                connect_timeout=10, read_timeout=60,
                # Checksums on every request that takes one, and on every response that has one.
                request_checksum_calculation="when_supported", response_checksum_validation="when_supported",
                # S3-compatible servers (MinIO, Ceph, moto) rarely resolve BUCKET.host names.
                s3={"addressing_style": "path"} if self.endpoint_url else None,
            )
            # A session of its own: boto3's default session is not thread-safe to create clients from.
            client = boto3.session.Session().client("s3", endpoint_url=self.endpoint_url, region_name=region,
                                                    config=config)
        self.client = client
        # "classic": s3transfer on every machine. With awscrt installed boto3 would pick its CRT
        # transfer client on some instance types (p4d, p5), whose retries and checksums differ.
        self._transfer = TransferConfig(multipart_threshold=multipart_chunk_bytes,
                                        multipart_chunksize=multipart_chunk_bytes, max_concurrency=8,
                                        preferred_transfer_client="classic")

    def __repr__(self) -> str:
        return f"S3Store({self.uri!r}, endpoint_url={self.endpoint_url!r})"

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, op: str, key: str, fn: Callable[[], Any]) -> Any:
        """`fn()` with retries; every failure that is not retried away becomes one StoreError line."""
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        where = f"{self.uri}/{key}" if key else self.uri
        try:
            # botocore's retry jitter draws from the global `random`, a run's checkpointed RNG: kept.
            return self.backoff.call(keeping_global_random(fn), transient=transient_s3_error, clock=self.clock,
                                     what=f"{op} {where}",
                                     on_retry=lambda err, n, wait: self._on_retry(f"{op} {where}", err, n, wait),
                                     describe=describe_s3_error)
        except GaveUp as err:
            raise StoreUnavailable(str(err)) from err
        except NoCredentialsError:
            raise StoreError(f"{op} {where}: no AWS credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                             "or AWS_PROFILE)") from None
        except (ClientError, BotoCoreError, Boto3Error) as err:
            client = _client_error(err)
            code = client.response.get("Error", {}).get("Code") if client is not None else None
            if code in ("NoSuchKey", "404", "NotFound"):
                raise MissingKey(f"{where}: no such object") from None
            if code == "NoSuchBucket":
                raise StoreError(f"{op} {where}: bucket {self.bucket!r} does not exist"
                                 + (f" at {self.endpoint_url}" if self.endpoint_url else "")) from None
            raise StoreError(f"{op} {where}: {describe_s3_error(err)}") from err

    def _on_retry(self, what: str, err: BaseException, retry: int, wait_s: float) -> None:
        self.retries += 1
        log.warning("%s: %s; retry %d in %.2f s", what, describe_s3_error(err), retry, wait_s)

    def put(self, key: str, data: bytes) -> None:
        k = self._key(key)
        self._call("PUT", key, lambda: self.client.put_object(Bucket=self.bucket, Key=k, Body=data,
                                                              ChecksumAlgorithm=CHECKSUM_ALGORITHM))

    def put_file(self, key: str, path: Path) -> str:
        k = self._key(key)
        extra = {"ChecksumAlgorithm": CHECKSUM_ALGORITHM}
        with opened_to_store(path) as f:
            # By name, so that s3transfer reads the parts from the file in parallel rather than into
            # memory (upload_fileobj): the name of the file already open, /proc/self/fd/N, which
            # nothing can swap. Without /proc (macOS), from the open file itself.
            fd_name = f"/proc/self/fd/{f.fileno()}"
            if os.path.exists(fd_name):
                self._call("PUT", key, lambda: self.client.upload_file(
                    fd_name, self.bucket, k, Config=self._transfer, ExtraArgs=extra))
            else:
                def upload() -> None:
                    f.seek(0)  # each retry from the start
                    self.client.upload_fileobj(f, self.bucket, k, Config=self._transfer, ExtraArgs=extra)

                self._call("PUT", key, upload)
        return self._call("HEAD", key, lambda: self._stored_checksum(key, k))

    def _stored_checksum(self, key: str, k: str) -> str:
        """The object's checksum as S3 keeps it, "crc64nvme:BASE64"."""
        return self._checksum_of(key, self.client.head_object(Bucket=self.bucket, Key=k, ChecksumMode="ENABLED"))

    def stat(self, key: str) -> ObjectStat:
        """One HEAD: the object's size and S3's CRC-64/NVME checksum ("crc64nvme:BASE64"). An object
        S3 keeps with another checksum only (uploaded with `--checksum-algorithm CRC32`, say) is a
        StoreError: `get_file` verifies CRC-64/NVME alone."""
        k = self._key(key)

        def head() -> ObjectStat:
            answer = self.client.head_object(Bucket=self.bucket, Key=k, ChecksumMode="ENABLED")
            return ObjectStat(int(answer["ContentLength"]), self._checksum_of(key, answer))

        return self._call("HEAD", key, head)

    def _checksum_of(self, key: str, head: dict[str, Any]) -> str:
        """The checksum, "crc64nvme:BASE64", in a HEAD's answer; a StoreError line when S3 keeps none."""
        value = head.get(_CHECKSUM_FIELD)
        if not value:  # an S3-compatible server that keeps no CRC-64/NVME: no native check possible
            kept = sorted(x for x in head if x.startswith("Checksum")) or "none"
            raise StoreError(f"{self.uri}/{key}: the server keeps no {CHECKSUM_ALGORITHM} checksum (it keeps {kept})")
        return _CHECKSUM_PREFIX + value

    def get(self, key: str, max_bytes: int | None = None) -> bytes:
        k = self._key(key)

        def fetch() -> bytes:
            answer = self.client.get_object(Bucket=self.bucket, Key=k, ChecksumMode="ENABLED")
            body = answer["Body"]
            with body:  # not `as`: StreamingBody.__enter__ gives the raw stream, whose reads skip the checksum
                size = int(answer.get("ContentLength", -1))
                if max_bytes is not None and size > max_bytes:
                    # Closed unread: the headers said enough (issue 27: a 400 MB manifest cost 1.17 GB).
                    raise too_large(self.uri, key, size, max_bytes)
                data = body.read()
            if max_bytes is not None and len(data) > max_bytes:  # a server that sent no Content-Length
                raise too_large(self.uri, key, len(data), max_bytes)
            return data

        # The body is read inside the retried call: a connection cut mid-body is retried too.
        return self._call("GET", key, fetch)

    def get_file(self, key: str, path: Path, checksum: str | None = None) -> None:
        k = self._key(key)
        with replacing(path) as tmp:
            self._call("GET", key, lambda: self._download(key, k, tmp, checksum))

    def _download(self, key: str, k: str, tmp: Path, checksum: str | None) -> None:
        """One GET streamed into `tmp`; botocore validates the body against S3's checksum as it
        streams (a mismatch raises at the end of the body: transient, the call is retried)."""
        answer = self.client.get_object(Bucket=self.bucket, Key=k, ChecksumMode="ENABLED")
        body = answer["Body"]
        with body:
            stored = answer.get(_CHECKSUM_FIELD)
            if checksum is not None and _CHECKSUM_PREFIX + str(stored) != checksum:
                raise ChecksumMismatch(f"{self.uri}/{key}: stored checksum {_CHECKSUM_PREFIX}{stored}, "
                                       f"expected {str(checksum)[:80]} (replaced or truncated since it was stored)")
            with open(tmp, "wb") as f:
                for block in body.iter_chunks(_STREAM_BLOCK):
                    f.write(block)

    def list(self, prefix: str = "") -> list[str]:
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        cut = len(self.prefix) + 1 if self.prefix else 0

        def fetch() -> list[str]:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full)
            return [obj["Key"][cut:] for page in pages for obj in page.get("Contents", [])]

        return sorted(self._call("LIST", prefix, fetch))

    def delete(self, key: str) -> None:
        k = self._key(key)
        self._call("DELETE", key, lambda: self.client.delete_object(Bucket=self.bucket, Key=k))


# ---- spot prices ---------------------------------------------------------------------------------


def spot_price_history(
    instance_types: Iterable[str],
    region: str | None = None,
    days: float = 1.0,
    product: str = "Linux/UNIX",
    client: Any = None,
) -> list[dict[str, Any]]:
    """Spot prices of `instance_types` over the last `days`, every page of EC2's
    `describe_spot_price_history`, in the order EC2 returns them (newest first per zone).

    Rows: {"instance_type", "availability_zone", "spot_usd_h" (float, USD per instance-hour),
    "timestamp" (ISO 8601, UTC)}. `client` is an EC2 client to use instead of one made for `region`
    (else $AWS_DEFAULT_REGION). A missing region is a ValueError with one line."""
    types = list(instance_types)
    if not types:
        return []
    if not days > 0:
        raise ValueError(f"spot_price_history: days must be > 0, got {days}")
    if client is None:
        import boto3
        from botocore.exceptions import NoRegionError

        try:
            client = boto3.session.Session().client("ec2", region_name=region)
        except NoRegionError:
            raise ValueError("spot_price_history: no AWS region (pass region= or set AWS_DEFAULT_REGION)") from None
    start = datetime.now(timezone.utc) - timedelta(days=days)
    pages = client.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=types, ProductDescriptions=[product], StartTime=start)
    rows = []
    for page in pages:
        for item in page.get("SpotPriceHistory", []):
            rows.append({
                "instance_type": item["InstanceType"],
                "availability_zone": item.get("AvailabilityZone"),
                "spot_usd_h": float(item["SpotPrice"]),
                "timestamp": _as_utc(item["Timestamp"]).astimezone(timezone.utc).isoformat(),
            })
    return rows


# ---- the provider --------------------------------------------------------------------------------


class AwsProvider:
    """The `cloud.provider.Provider` for AWS: S3 stores (and local paths) and IMDSv2 notices.
    `imds_endpoint` overrides $SPOTLIGHT_IMDS_ENDPOINT; `store_options` go to every S3Store."""

    name = "aws"

    def __init__(self, imds_endpoint: str | None = None, **store_options: Any) -> None:
        self.imds_endpoint = imds_endpoint
        self.store_options = store_options

    def open_store(self, uri: str) -> Store:
        where = parse_store_uri(uri)
        if where.scheme == "s3":
            return S3Store(where.bucket, where.prefix, **self.store_options)
        if where.path is None:  # pragma: no cover - parse_store_uri gives s3 or file only
            raise StoreURIError(f"{uri}: not a store the AWS provider opens (expected s3://BUCKET/PREFIX or a path)")
        return LocalStore(where.path)

    def notice_source(self, clock: Clock) -> NoticeSource:
        return ImdsSpotWatcher(clock, self.imds_endpoint)
