"""What `spotlight launch` runs on the fleet: the user's run config turned into a cloud one.

A config written for this machine (`experiments/tiny_dit.yaml`: `device: cpu`, no notice
sources, no checkpoint store) would, copied unchanged onto H100 nodes, train on their CPUs, ignore
every interruption notice and lose all its checkpoints with the head. So `launch` sets what a
cloud run needs and says each change in one line:

- `device: cuda` (a `cuda:N` stays as it is): every launched node has `cloud.gpu`;
- `runtime.notice_sources`: the provider's metadata endpoint and SIGTERM (SkyPilot's and the
  OS's shutdown signal); both providers' endpoints when `cloud.provider` leaves the choice to
  SkyPilot (a watcher whose endpoint is not there reads nothing, after a one-second timeout). Not
  for SP groups (`runtime.sp_degree > 1`), which take notices through Ray's drain instead;
- `cloud.checkpoint_uri`: `--checkpoint-uri`, else the config's; required, and an object store
  (`s3://` or `gs://`) — a folder would be on the head's disk, and go with it. Its credentials
  reach the head as SkyPilot secrets (`cloud.credentials`).

Anything it cannot turn into a cloud run is refused in one line (`ConfigError`, exit 2).
"""

from __future__ import annotations

from typing import Any

from cloud.store import StoreURIError, parse_store_uri
from spotlight.config import ConfigError, RunConfig, from_dict

OBJECT_STORES = ("s3", "gs")
"""The store schemes a launched run may use: stores that outlive every node."""


def for_the_cloud(cfg: RunConfig, checkpoint_uri: str | None) -> tuple[RunConfig, list[str]]:
    """The cloud version of `cfg`, and one line per setting changed."""
    data: dict[str, Any] = cfg.to_dict()
    changes: list[str] = []

    def set_(section: str | None, key: str, value: Any) -> None:
        where = data if section is None else data[section]
        if where[key] != value:
            name = key if section is None else f"{section}.{key}"
            changes.append(f"{name}: {_shown(where[key])} -> {_shown(value)}")
            where[key] = value

    uri = checkpoint_uri or cfg.cloud.checkpoint_uri
    if uri is None:
        raise ConfigError("spotlight launch needs --checkpoint-uri s3://BUCKET/PREFIX or gs://BUCKET/PREFIX "
                          "(or cloud.checkpoint_uri): a fleet's checkpoints must outlive its head")
    try:
        location = parse_store_uri(uri)
    except StoreURIError as err:
        raise ConfigError(f"--checkpoint-uri: {err}") from None
    if location.scheme not in OBJECT_STORES:
        raise ConfigError(f"--checkpoint-uri {uri}: a folder is on the head's disk and is lost with it; "
                          "a launched run needs an object store (s3://BUCKET/PREFIX or gs://BUCKET/PREFIX)")
    set_("cloud", "checkpoint_uri", uri)
    if not cfg.device.startswith("cuda"):
        set_(None, "device", "cuda")
    if cfg.runtime.sp_degree == 1:
        provider = cfg.cloud.provider
        set_("runtime", "notice_sources", [provider, "sigterm"] if provider else ["aws", "gcp", "sigterm"])
    try:
        return from_dict(RunConfig, data), changes
    except ConfigError as err:  # a setting above that the rest of the config refuses
        raise ConfigError(f"the launched config: {err}") from None


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)
