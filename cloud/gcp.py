"""The GCP provider (`GcpProvider`): preemption notices from the GCE metadata server; checkpoints
in Google Cloud Storage (gs://BUCKET/PREFIX, `cloud.gcs.GcsStore`), an S3-compatible endpoint or a
folder.

Preemption notices: `GcpPreemptionWatcher` is a `schedulers.preemption.NoticeSource` over the GCE
metadata server. `GET computeMetadata/v1/instance/preempted` (header `Metadata-Flavor: Google`)
answers "FALSE" until GCE starts preempting the VM, then "TRUE"; the VM is stopped 30 seconds
later -> `Cause.GCP_PREEMPTED` with deadline = clock.now() + 30 at the first poll that sees TRUE.
Only the standard library is used; a failing or slow (1 s) endpoint means no notice this time.
`poll()` is non-blocking, so the metadata server's `?wait_for_change=true` long-poll is not used.

Invariants: `poll()` never raises on a network or HTTP failure; once a notice is seen, every
later poll returns that same notice (its deadline does not slide with each poll).
"""

from __future__ import annotations

import http.client
import os
import urllib.request
from typing import Any

from cloud.store import Store
from cloud.open_store import open_store
from schedulers.clock import Clock
from schedulers.preemption import Cause, NoticeSource, PreemptionNotice

GCE_METADATA_ENDPOINT_ENV = "SPOTLIGHT_GCE_METADATA_ENDPOINT"
DEFAULT_GCE_METADATA_ENDPOINT = "http://metadata.google.internal"
PREEMPTION_NOTICE_S = 30.0  # GCE's ACPI soft-off warning for preemptible and spot VMs

# The metadata server is VM-local: never route it through an HTTP(S)_PROXY from the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class GcpPreemptionWatcher:
    """Preemption notices from the GCE metadata server (see the module docstring).

    `base` defaults to $SPOTLIGHT_GCE_METADATA_ENDPOINT, then http://metadata.google.internal.
    """

    def __init__(self, clock: Clock, base: str | None = None, *, timeout_s: float = 1.0) -> None:
        self.base = (base or os.environ.get(GCE_METADATA_ENDPOINT_ENV) or DEFAULT_GCE_METADATA_ENDPOINT).rstrip("/")
        if not self.base.startswith(("http://", "https://")):
            raise ValueError(
                f"GCE metadata endpoint {self.base!r} (argument or ${GCE_METADATA_ENDPOINT_ENV}): "
                "expected http://HOST[:PORT]"
            )
        self._clock = clock
        self._timeout_s = timeout_s
        self._notice: PreemptionNotice | None = None

    def poll(self) -> PreemptionNotice | None:
        if self._notice is None and self._preempted():
            self._notice = PreemptionNotice(
                Cause.GCP_PREEMPTED, self._clock.now() + PREEMPTION_NOTICE_S, detail="instance/preempted is TRUE"
            )
        return self._notice

    def _preempted(self) -> bool:
        request = urllib.request.Request(
            self.base + "/computeMetadata/v1/instance/preempted", headers={"Metadata-Flavor": "Google"}
        )
        try:
            with _OPENER.open(request, timeout=self._timeout_s) as response:
                # The real server echoes the flavor header; anything else is not the metadata server.
                if response.headers.get("Metadata-Flavor") != "Google":
                    return False
                return response.read().strip().upper() == b"TRUE"
        except (OSError, http.client.HTTPException):
            return False  # transient (HTTPError included): no notice this time


class GcpProvider:
    """The `cloud.provider.Provider` for GCP: GCE metadata notices. Stores: gs://BUCKET/PREFIX
    natively (`cloud.gcs.GcsStore`: credentials from $SPOTLIGHT_GCS_KEY_JSON or the VM's service
    account), s3://BUCKET/PREFIX against an S3-compatible endpoint, or a folder (a mounted disk).
    `metadata_endpoint` overrides $SPOTLIGHT_GCE_METADATA_ENDPOINT; `store_options` go to every
    cloud store (`cloud.open_store.open_store` passes each store only the options it takes)."""

    name = "gcp"

    def __init__(self, metadata_endpoint: str | None = None, **store_options: Any) -> None:
        self.metadata_endpoint = metadata_endpoint
        self.store_options = store_options

    def open_store(self, uri: str) -> Store:
        return open_store(uri, **self.store_options)

    def notice_source(self, clock: Clock) -> NoticeSource:
        return GcpPreemptionWatcher(clock, self.metadata_endpoint)
