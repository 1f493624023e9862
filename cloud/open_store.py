"""Opening the store a URI names: S3 (`cloud.aws.S3Store`, boto3 imported only then) or a folder
(`cloud.store.LocalStore`). Its own module so that the store Protocol and the S3 store each import
only what is below them."""

from __future__ import annotations

from cloud.store import LocalStore, Store, parse_store_uri


def open_store(uri: str, **options: object) -> Store:
    """The store a URI names. `options` go to an S3Store's constructor (endpoint_url, clock,
    backoff, ...) and are ignored for a folder; boto3 is imported only for s3:// URIs."""
    where = parse_store_uri(uri)
    if where.scheme == "s3":
        from cloud.aws import S3Store

        return S3Store(where.bucket, where.prefix, **options)  # type: ignore[arg-type]
    assert where.path is not None
    return LocalStore(where.path)
