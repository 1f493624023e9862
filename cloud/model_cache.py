"""A model cache: a model folder kept in a store (or on the Hugging Face Hub), copied once onto
this node's disk, where every process of the node loads it from.

A *source* is what `policy.pretrained_path` names (`source_kind`):
- a local folder: used where it is, nothing is copied;
- `s3://BUCKET/PREFIX` or `gs://BUCKET/PREFIX`: the objects under the prefix are the folder's
  files (what `aws s3 sync DIR s3://...` or `gcloud storage cp -r DIR gs://...` uploads). The
  store is opened by `cloud.open_store.open_store`, with the credentials every store of the run
  uses (`cloud.credentials` hands them to each node);
- a Hugging Face repo id, `org/name` (one '/', and not an existing local path): fetched by
  `huggingface_hub.snapshot_download` — only where the node reaches the Hub.

`fetch_model(source)` copies a remote source into `cache_folder(source)`: `$SPOTLIGHT_MODEL_CACHE`
(else ~/.cache/spotlight/models) / a name derived from the source. Invariants, and the tests that
check them (tests/cloud/test_model_cache.py):
- verified: each object is fetched with `Store.get_file(key, path, checksum=...)` against the
  checksum the store keeps for it (`Store.stat`: S3's CRC-64/NVME, GCS's crc32c), so a file in the
  cache is the object's bytes or is not there (`get_file` writes atomically);
- once: a record next to the folder (`<name>.fetch.json`, rewritten atomically after every
  verified file) holds each file's size and checksum. A later call asks the store for the objects'
  checksums only (one LIST, one HEAD per object) and fetches what is missing here, of another size
  here, or changed in the store since — nothing else. So an interrupted fetch resumes with the
  files it lacks, and a node recovered on the same disk fetches nothing;
- concurrent fetches of one source on one node (several processes) take turns on a lock file
  (`<name>.lock`, `fcntl.flock`): the second finds the first's files verified;
- a file of the cache is trusted at its recorded size: its bytes are not hashed again (40 GB of
  Qwen-Image would take minutes); delete the folder and its record to fetch it anew.

`model_folder(source)` is what a loader calls: the source itself when local, the cache folder when
its record is complete (no store call: every process of a node loads through it), else
`fetch_model`. `local_folder(source)` is where the source is, or will be, on this node, for the
config's checks (no fetch). Keys and fingerprints keep the source string, the same on every node.

`prefetch(cfg)` is what a fleet node runs before its Ray workers start, as
`python -m cloud.model_cache RUN_YAML` (exit 0; one line `spotlight: error: ...` and exit 2 when
the source is bad or cannot be fetched).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import random
import re
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from cloud.bounded_json import load_file
from cloud.store import (TMP_PREFIX, ObjectStat, Store, StoreError, StoreURIError, check_key, parse_store_uri,
                         replacing)
from schedulers.input.files import InputError, short

logger = logging.getLogger(__name__)

MODEL_CACHE_ENV = "SPOTLIGHT_MODEL_CACHE"
"""The folder model caches are made in; unset or empty: `DEFAULT_CACHE_ROOT`."""
DEFAULT_CACHE_ROOT = Path("~/.cache/spotlight/models")
EXPECTED_SOURCE = "a local folder, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or a Hugging Face repo id (org/name)"
# The Hub's repo names: letters, digits, '-', '_', '.', at most 96 characters each side of the '/'.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_RECORD = ".fetch.json"
_MAX_RECORD_BYTES = 16 << 20
"""A fetch record is read with at most 16 MiB: ~200 bytes a file, and a model folder has tens of
files (Qwen-Image: ~40), a Hub repo at most thousands. A larger or deeper one reads as none."""
_BIG = 64 << 20  # files from 64 MiB up get a line of their own while they arrive (Qwen-Image's shards: ~5 GB)


class ModelSourceError(InputError):
    """A source that names no model folder, or one that cannot be had: one line naming the source."""


def source_kind(source: str) -> Literal["local", "store", "hub"]:
    """What `source` names (module docstring); a string that is none of them is a ModelSourceError."""
    problem = source_problem(source)
    if problem is not None:
        raise ModelSourceError(problem)
    if source.startswith(("s3://", "gs://")):
        return "store"
    return "hub" if _HUB_ID.fullmatch(source) and not Path(source).expanduser().exists() else "local"


def source_problem(source: str) -> str | None:
    """What is wrong with `source` as a model source, in one line naming it; None when nothing is.
    Only its text is read (and, for `org/name`, whether such a local path exists)."""
    if not isinstance(source, str) or not source.strip():
        return f"{short(source)}: expected {EXPECTED_SOURCE}"
    if source.startswith(("s3://", "gs://", "gcs://")):
        try:
            parse_store_uri(source)
        except StoreURIError as err:
            return str(err)
        return None
    if "://" in source or source.startswith(("s3:", "gs:")):
        return f"{short(source)}: expected {EXPECTED_SOURCE}"
    return None


def is_remote(source: str | None) -> bool:
    """Whether `source` must be fetched to be read here (a bucket folder or a Hub repo id)."""
    return bool(source) and source_problem(source) is None and source_kind(source) != "local"


def cache_root(root: Path | str | None = None) -> Path:
    """`root`, else $SPOTLIGHT_MODEL_CACHE, else ~/.cache/spotlight/models."""
    chosen = root if root is not None else (os.environ.get(MODEL_CACHE_ENV, "").strip() or DEFAULT_CACHE_ROOT)
    return Path(chosen).expanduser().absolute()


def cache_folder(source: str, root: Path | str | None = None) -> Path:
    """Where a remote `source` is cached on this node: a readable name and a hash of the source,
    e.g. `s3-my-models-qwen-image-3fa2b1c4d5e6` for s3://my-models/qwen-image (with or without a
    trailing '/')."""
    normal = _normal(source)
    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", normal.replace("://", "-")).strip("-.")[:80]
    return cache_root(root) / f"{readable}-{hashlib.sha256(normal.encode()).hexdigest()[:12]}"


def local_folder(source: str, root: Path | str | None = None) -> Path:
    """Where `source` is read from on this node: itself when local, else its cache folder (which
    holds it only once fetched: `cached_folder`). Nothing is fetched."""
    return cache_folder(source, root) if is_remote(source) else Path(source).expanduser()


def cached_folder(source: str, root: Path | str | None = None) -> Path | None:
    """The cache folder of a remote `source` when a fetch completed there and every file it
    recorded is present at its size; else None. No store is asked."""
    folder = cache_folder(source, root)
    record = _read_record(folder, _normal(source))
    if not record.get("complete") or not folder.is_dir():
        return None
    for key, entry in record["files"].items():
        try:
            if (folder / key).stat().st_size != entry["size"]:
                return None
        except OSError:
            return None
    return folder


def model_folder(source: str, root: Path | str | None = None) -> Path:
    """The local folder a loader reads `source` from: itself when local, its complete cache folder
    without asking the store, else `fetch_model(source)`."""
    if not is_remote(source):
        source_kind(source)  # a bad source is one line
        return Path(source).expanduser()
    return cached_folder(source, root) or fetch_model(source, root)


def fetch_model(source: str, cache_root: Path | str | None = None, workers: int = 8,
                store: Store | None = None) -> Path:
    """The local folder of `source` (module docstring), fetched into its cache folder once: the
    store's files in parallel (`workers` threads), each verified against the store's checksum;
    a Hub repo through `snapshot_download`. A local folder is returned as it is. `store` replaces
    the store `open_store` opens for an s3:// or gs:// source (tests count its calls). It logs a
    line when the fetch starts, for each file of 64 MiB or more and at the end.

    Raises ModelSourceError (a bad source, an empty prefix, a Hub repo that cannot be had) or
    StoreError (the store failed for good), each one line; the files verified so far stay, and
    the next call fetches the rest."""
    if workers < 1:
        raise ValueError(f"fetch_model: workers must be >= 1, got {workers}")
    kind = source_kind(source)
    if kind == "local":
        folder = Path(source).expanduser()
        if not folder.is_dir():
            raise ModelSourceError(f"{short(source)} is not an existing folder (expected {EXPECTED_SOURCE})")
        return folder
    normal = _normal(source)
    folder = cache_folder(normal, cache_root)
    # The stores keep Python's global `random` (a run's checkpointed RNG) as they found it per call
    # (`cloud.retry.keeping_global_random`), but calls on `workers` threads restore each other's
    # saved states out of order: so the fetch as a whole puts it back.
    state = random.getstate()
    try:
        with _locked(folder):
            if kind == "hub":
                return _fetch_hub(normal, folder)
            if store is None:
                from cloud.open_store import open_store

                store = open_store(normal)
            return _fetch_store(normal, store, folder, workers)
    finally:
        random.setstate(state)


def _fetch_store(source: str, store: Store, folder: Path, workers: int) -> Path:
    """Fetch what `folder` lacks of `store`'s objects (the caller holds the folder's lock)."""
    _remove_leftovers(folder)
    keys = [k for k in store.list() if _file_key(k)]
    if not keys:
        raise ModelSourceError(f"{source}: no objects under it (expected a model folder uploaded with "
                               "`aws s3 sync DIR s3://...` or `gcloud storage cp -r DIR gs://...`)")
    with ThreadPoolExecutor(max_workers=workers) as pool:  # one HEAD per object, `workers` at a time
        stats = dict(zip(keys, pool.map(store.stat, keys)))
    record = _read_record(folder, source)
    kept = {k: e for k, e in record.get("files", {}).items()
            if k in stats and ObjectStat(e["size"], e["checksum"]) == stats[k] and _has_size(folder / k, e["size"])}
    for gone in set(record.get("files", {})) - set(stats):  # removed from the store since: not the model's now
        (folder / gone).unlink(missing_ok=True)
    todo = [k for k in keys if k not in kept]
    files = dict(kept)
    _write_record(folder, source, files, complete=not todo)
    if not todo:
        return folder
    total = sum(stats[k].size for k in todo)
    logger.info(f"spotlight: fetching {len(todo)} of {len(keys)} files ({_size(total)}) of {source} into {folder}")
    started, guard, failures = time.monotonic(), threading.Lock(), []

    def fetch(key: str) -> None:
        stat = stats[key]
        store.get_file(key, folder / key, checksum=stat.checksum)
        with guard:  # the record names a file only once it is whole and verified here
            files[key] = {"size": stat.size, "checksum": stat.checksum}
            _write_record(folder, source, files, complete=False)
            if stat.size >= _BIG:
                logger.info(f"spotlight: fetched {key} ({_size(stat.size)}; {len(files)}/{len(keys)} files)")

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(fetch, k): k for k in todo}
        for done in as_completed(futures):
            err = done.exception()
            if err is not None:
                failures.append((futures[done], err))
    if failures:
        key, err = sorted(failures, key=lambda f: f[0])[0]
        first = " ".join(str(err).split())[:300] or type(err).__name__
        raise StoreError(f"{source}: {len(failures)} of {len(keys)} files not fetched ({key}: {first}); the "
                         f"{len(files)} verified stay in {folder}, and the next fetch gets the rest")
    _write_record(folder, source, files, complete=True)
    logger.info(f"spotlight: {source}: {len(keys)} files verified in {folder} ({_size(total)} fetched in "
                f"{time.monotonic() - started:.1f} s)")
    return folder


def _fetch_hub(repo_id: str, folder: Path) -> Path:
    """`snapshot_download` of a Hub repo into `folder` (the Hub's own resumable, verified download;
    it asks the Hub for the current revision every time)."""
    try:
        import huggingface_hub
    except ImportError:
        raise ModelSourceError(f"{repo_id}: a Hugging Face repo id needs huggingface_hub installed "
                               f"(pip install huggingface_hub), or upload the folder to a bucket") from None
    logger.info(f"spotlight: fetching the Hugging Face repo {repo_id} into {folder}")
    try:
        huggingface_hub.snapshot_download(repo_id=repo_id, local_dir=str(folder))
    except Exception as err:  # the Hub's errors have no common base: offline, not found, gated, HTTP
        first = " ".join(str(err).split())[:200] or type(err).__name__
        raise ModelSourceError(f"{repo_id}: no such local folder, and the Hugging Face Hub did not give it as a repo "
                               f"id ({first}); a repo id works only where the node reaches the Hub, else upload "
                               "the folder to a bucket") from None
    _write_record(folder, repo_id, {}, complete=True)
    return folder


# ---- the node's prefetch -------------------------------------------------------------------------


def policy_source(config: dict[str, Any]) -> tuple[str, str | None]:
    """(the field, its value) of a run config's model source, read from the config's YAML mapping
    as `spotlight.config.PolicyConfig` reads it (`policy.pretrained_path` mirrors
    `policy.<kind>.pretrained_path`; `cloud` may not import `spotlight`)."""
    policy = config.get("policy") if isinstance(config, dict) else None
    policy = policy if isinstance(policy, dict) else {}
    kind = policy.get("kind") if policy.get("kind") in ("dit", "llm") else "dit"
    own = policy.get(kind) if isinstance(policy.get(kind), dict) else {}
    if own.get("pretrained_path"):
        return f"policy.{kind}.pretrained_path", own["pretrained_path"]
    return "policy.pretrained_path", policy.get("pretrained_path")


def prefetch(cfg: Any) -> Path | None:
    """Fetch the policy's model folder of run config `cfg` (a `spotlight.config.RunConfig`: its
    `policy.pretrained_path`) into this node's cache when it is remote, before the node's workers
    start; its local folder, or None when there is nothing to fetch. Errors as `fetch_model`'s."""
    source = cfg.policy.pretrained_path
    if not is_remote(source):
        return None
    folder = fetch_model(source)
    logger.info(f"spotlight: model {source} is at {folder}")
    return folder


@contextmanager
def _lines_on_stdout() -> Iterator[None]:
    """Within: this module's lines, bare, on stdout — `main` is a process of its own (a node's
    setup), and nothing else configures logging there; out of it, the handler is gone again."""
    lines = logging.StreamHandler(sys.stdout)
    lines.setFormatter(logging.Formatter("%(message)s"))
    level = logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m cloud.model_cache RUN_YAML`: prefetch the run's model folder (exit 0), or one
    line `spotlight: error: ...` on stderr and exit 2."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m cloud.model_cache RUN_YAML  (fetches the run's policy.pretrained_path into this "
              f"node's model cache, ${MODEL_CACHE_ENV} or {DEFAULT_CACHE_ROOT})", file=sys.stderr)
        return 2
    from schedulers.input.files import load_yaml

    try:
        name, source = policy_source(load_yaml(args[0], "config", 1 << 20))
        if not source:
            print("spotlight: the run's policy has no pretrained_path: nothing to fetch")
            return 0
        try:
            if not is_remote(source):
                source_kind(source)  # a malformed one is refused here, one line
                print(f"spotlight: {name} {source} is a local folder: nothing to fetch")
                return 0
            with _lines_on_stdout():
                fetch_model(source)
            print(f"spotlight: model {source} is at {cache_folder(source)}")
        except (InputError, StoreError) as err:
            raise ModelSourceError(f"{args[0]}: {name}: {err}") from None
    except (InputError, StoreError, OSError) as err:
        print(f"spotlight: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    return 0


# ---- the record and the lock ---------------------------------------------------------------------


def _normal(source: str) -> str:
    """One spelling per source: a store URI without a trailing '/'."""
    return source.rstrip("/") if source.startswith(("s3://", "gs://")) else source


def _file_key(key: str) -> bool:
    """Whether a listed key is a file of the folder (a console's "folder" marker ends with '/')."""
    try:
        check_key(key)
    except ValueError:
        return False
    return True


def _has_size(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except OSError:
        return False


def _read_record(folder: Path, source: str) -> dict[str, Any]:
    """The fetch record of `folder` when it is `source`'s and readable; else an empty one."""
    try:
        record = load_file(folder.with_name(folder.name + _RECORD), max_bytes=_MAX_RECORD_BYTES)
    except (OSError, ValueError):
        return {}
    # Every key passes the store's key check, as listed keys do: a tampered record's "../../x" would
    # otherwise name a file outside the folder, which a fetch unlinks when the store no longer has it.
    ok = (isinstance(record, dict) and record.get("source") == source and isinstance(record.get("files"), dict)
          and all(_file_key(k) and isinstance(e, dict) and isinstance(e.get("size"), int)
                  and isinstance(e.get("checksum"), str) for k, e in record["files"].items()))
    return record if ok else {}


def _write_record(folder: Path, source: str, files: dict[str, dict[str, Any]], complete: bool) -> None:
    """Replace `folder`'s record atomically: a reader sees the previous one or this one."""
    text = json.dumps({"source": source, "complete": complete, "files": dict(sorted(files.items()))}, indent=1)
    with replacing(folder.with_name(folder.name + _RECORD)) as tmp:
        tmp.write_text(text)


def _remove_leftovers(folder: Path) -> None:
    """Remove the partial files (`.tmp-*`, `cloud.store.replacing`'s) a killed fetch left in
    `folder`, saying how much that freed: with the folder's lock held no fetch is writing them (six
    killed fetches had left 84 MiB; with 5 GB shards and 8 workers one kill could leave 40 GB)."""
    if not folder.is_dir():
        return
    count = freed = 0
    for path in folder.rglob(f"{TMP_PREFIX}*"):
        if path.is_file() and not path.is_symlink():
            freed += path.stat().st_size
            path.unlink()
            count += 1
    if count:
        logger.info(f"spotlight: removed {count} partial file{'s' if count != 1 else ''} ({_size(freed)}) a killed "
                    f"fetch left in {folder}")


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold `folder`'s lock file (`<name>.lock`, an exclusive flock: released by the kernel when the
    process dies, so a killed fetch never leaves it held)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(folder.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


if __name__ == "__main__":
    sys.exit(main())
