"""The AWS provider.

Preemption notices: `ImdsSpotWatcher` is a `schedulers.preemption.NoticeSource` over the EC2
instance metadata service (IMDSv2). It reads
- `meta-data/spot/instance-action`: 404 until EC2 schedules an interruption, then
  `{"action": "terminate"|"stop"|"hibernate", "time": "<UTC ISO 8601>"}` about 2 minutes ahead
  -> `Cause.AWS_INSTANCE_ACTION`, deadline = clock.now() + (time - UTC now);
- `meta-data/events/recommendations/rebalance`: 404, or `{"noticeTime": ...}` when the instance is
  at elevated risk -> `Cause.AWS_REBALANCE`, deadline None (advisory; often earlier, may never
  be followed by an interruption).
Every request carries a session token from `PUT latest/api/token` (TTL 6 h), renewed before it
expires or when IMDS answers 401. Only the standard library is used here; an endpoint that fails
or times out (1 s) means no notice this time.

Invariant: `poll()` never raises on a network or HTTP failure and never blocks longer than about
three request timeouts.

(S3 storage and spot prices, which use boto3 imported lazily, are added to this module separately.)
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import datetime, timezone

from schedulers.clock import Clock
from schedulers.preemption import Cause, PreemptionNotice

IMDS_ENDPOINT_ENV = "SPOTLIGHT_IMDS_ENDPOINT"
DEFAULT_IMDS_ENDPOINT = "http://169.254.169.254"
TOKEN_TTL_S = 21600  # the IMDSv2 maximum (6 h)
# Renew a minute before the token expires, so a poll never sends a token that dies in flight.
TOKEN_RENEW_MARGIN_S = 60.0

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
                return json.loads(body)
            except ValueError:
                return body.decode(errors="replace")  # 200 with an unexpected body: still a notice
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
                return response.status, response.read()
        except urllib.error.HTTPError as e:
            with e:
                return e.code, b""


def _as_utc(moment: datetime) -> datetime:
    """Naive datetimes from IMDS or `utcnow` are UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)
