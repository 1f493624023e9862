"""Opening the store a URI names: S3 (`cloud.aws.S3Store`, boto3 imported only then), Google Cloud
Storage (`cloud.gcs.GcsStore`, google-cloud-storage imported only then) or a folder
(`cloud.store.LocalStore`). Its own module so that the store Protocol and each cloud's store import
only what is below them."""

from __future__ import annotations

from cloud.store import LocalStore, Store, parse_store_uri

S3_ONLY_OPTIONS = frozenset({"endpoint_url", "region", "client", "request_attempts", "multipart_chunk_bytes"})
"""Options only an S3Store takes (`client` is a boto3 client); a gs:// store ignores them."""
GCS_ONLY_OPTIONS = frozenset({"project", "chunk_bytes"})
"""Options only a GcsStore takes; an s3:// store ignores them."""


def open_store(uri: str, **options: object) -> Store:
    """The store a URI names. `options` go to the cloud store's constructor (clock and backoff to
    both; endpoint_url, region, client, request_attempts and multipart_chunk_bytes to an S3Store
    only; project and chunk_bytes to a GcsStore only) and are ignored for a folder; a cloud SDK is
    imported only for its own URIs."""
    where = parse_store_uri(uri)
    if where.scheme == "s3":
        from cloud.aws import S3Store

        s3_options = {k: v for k, v in options.items() if k not in GCS_ONLY_OPTIONS}
        return S3Store(where.bucket, where.prefix, **s3_options)  # type: ignore[arg-type]
    if where.scheme == "gs":
        from cloud.gcs import GcsStore

        gcs_options = {k: v for k, v in options.items() if k not in S3_ONLY_OPTIONS}
        return GcsStore(where.bucket, where.prefix, **gcs_options)  # type: ignore[arg-type]
    assert where.path is not None
    return LocalStore(where.path)
