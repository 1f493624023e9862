"""A cloud provider behind one small Protocol: where checkpoints are stored, and how this node
learns it is about to be preempted.

Implementations: `cloud.aws.AwsProvider` (S3, IMDSv2 notices), `cloud.gcp.GcpProvider` (GCE
metadata notices; GCS, a folder or any S3-compatible endpoint) and `cloud.local.LocalProvider`
(a folder, and notices replayed from a preemption trace under the injected clock — simulation and
tests). All three pass the same contract suite (tests/cloud/test_cloud_contract.py): the store keeps the
`cloud.store.Store` invariants and the notice source keeps `schedulers.preemption.NoticeSource`'s.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from cloud.store import Store
from schedulers.clock import Clock
from schedulers.preemption import NoticeSource


@runtime_checkable
class Provider(Protocol):
    name: str
    """"aws", "gcp" or "local" (the names `cloud.provider` in a run config uses)."""

    def open_store(self, uri: str) -> Store:
        """The store `uri` names; a URI this provider cannot open raises `cloud.store.StoreURIError`."""
        ...

    def notice_source(self, clock: Clock) -> NoticeSource:
        """This node's preemption notices, with deadlines in `clock`'s seconds."""
        ...


def get_provider(name: str, **options: object) -> Provider:
    """The provider called `name`; `options` go to its constructor."""
    if name == "aws":
        from cloud.aws import AwsProvider

        return AwsProvider(**options)  # type: ignore[arg-type]
    if name == "gcp":
        from cloud.gcp import GcpProvider

        return GcpProvider(**options)  # type: ignore[arg-type]
    if name == "local":
        from cloud.local import LocalProvider

        return LocalProvider(**options)  # type: ignore[arg-type]
    raise ValueError(f"unknown cloud provider {name!r} (expected aws, gcp or local)")
