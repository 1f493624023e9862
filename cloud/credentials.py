"""The checkpoint store's credentials on a launched fleet: which environment variables `spotlight
launch` hands every node as SkyPilot secrets, taken from the launcher's own environment.

A SkyPilot secret is an environment variable of a task whose value is in no task file, no
SkyPilot log and no `sky jobs queue` output: the task file declares only its name, and `sky jobs
launch --secret NAME` takes the value from `sky`'s environment. Every node gets them: the head
writes checkpoints, results and the fleet's records (`cloud.rendezvous`), and each spot node reads
the head's address there and, when the model is in a bucket, its weights (`cloud.model_cache`).

Per store:
- `s3://`: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, and where the store is not
  AWS's own, AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 (e.g. GCS's or R2's S3 endpoint) and
  AWS_DEFAULT_REGION — whichever of them are set here. With no key set, a node uses its
  own identity, which on AWS is the instance role SkyPilot gives its nodes (it can read and write
  S3); on another cloud there is none, so that is refused.
- `gs://`: SPOTLIGHT_GCS_KEY_JSON, a service-account key's JSON text (`cloud.gcs.KEY_JSON_ENV`):
  from the environment, else read from the key file $GOOGLE_APPLICATION_CREDENTIALS names. With
  none, a node uses its VM's service account on GCP; elsewhere refused.
- a folder: none (`spotlight.launch_config` refuses folders for a launch anyway).

Invariant: a value returned here is only ever put into a subprocess's environment; messages name
variables, never values (tests/test_cloud_sky.py checks the launch's files and output hold none).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cloud.gcs import KEY_JSON_ENV
from cloud.store import parse_store_uri
from schedulers.input_file import ConfigError

AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
AWS_PLACE = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION")
"""Not secret, but the store's address: passed the same way, so the task files carry no endpoint."""
GCS_KEY_ENV = KEY_JSON_ENV
"""What a GCS store reads its service-account key from."""
MAX_KEY_FILE_BYTES = 64 * 1024
"""A service-account key file is ~2.3 KB; a larger file is not one."""


@dataclass
class StoreCredentials:
    """What every node gets for the store: `secrets` (name -> value) and one `notes` line per
    choice made (for the launch's output; names only)."""

    secrets: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def store_credentials(checkpoint_uri: str, provider: str | None, environ: Mapping[str, str]) -> StoreCredentials:
    """The secrets for the store `checkpoint_uri` on a fleet on `provider` (None: SkyPilot's
    choice), from `environ`. A store the fleet could not reach is a `ConfigError`, one line."""
    scheme = parse_store_uri(checkpoint_uri).scheme
    found = StoreCredentials()
    if scheme == "s3":
        keys = {k: environ[k] for k in AWS_KEYS if environ.get(k)}
        if keys and not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(keys):
            raise ConfigError("AWS credentials for the store: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY go "
                              f"together; this environment sets only {', '.join(sorted(keys))}")
        found.secrets.update(keys)
        found.secrets.update({k: environ[k] for k in AWS_PLACE if environ.get(k)})
        if keys:
            found.notes.append(f"store credentials for every node (SkyPilot secrets): {', '.join(sorted(keys))}")
        elif provider == "gcp":
            raise ConfigError(f"{checkpoint_uri}: no AWS credentials in this environment (AWS_ACCESS_KEY_ID, "
                              "AWS_SECRET_ACCESS_KEY) and a GCP node has no AWS role to fall back on")
        else:
            found.notes.append("no AWS keys in this environment: the nodes reach S3 with their instance "
                               "role (SkyPilot's on AWS)")
    elif scheme == "gs":
        key = environ.get(GCS_KEY_ENV) or _key_file(environ.get("GOOGLE_APPLICATION_CREDENTIALS"))
        if key:
            found.secrets[GCS_KEY_ENV] = key
            found.notes.append(f"store credentials for every node (SkyPilot secret): {GCS_KEY_ENV}")
        elif provider == "aws":
            raise ConfigError(f"{checkpoint_uri}: no GCS service-account key in this environment "
                              f"(${GCS_KEY_ENV}, or $GOOGLE_APPLICATION_CREDENTIALS naming a key file) and an "
                              "AWS node has no GCP service account to fall back on")
        else:
            found.notes.append("no GCS key in this environment: the nodes reach GCS with their VMs' service "
                               "account (GCP)")
    return found


def _key_file(path: str | None) -> str | None:
    """The text of the service-account key file at `path`, None when there is none to use (no
    path, or ADC of another kind: a user's own login cannot be handed to a machine)."""
    if not path:
        return None
    try:
        with open(Path(path).expanduser(), "rb") as f:
            raw = f.read(MAX_KEY_FILE_BYTES + 1)
        info = json.loads(raw) if len(raw) <= MAX_KEY_FILE_BYTES else None
    except (OSError, ValueError):
        raise ConfigError(f"$GOOGLE_APPLICATION_CREDENTIALS names {path[:200]}, which is not a readable JSON "
                          "key file") from None
    if not (isinstance(info, dict) and info.get("type") == "service_account"):
        raise ConfigError(f"$GOOGLE_APPLICATION_CREDENTIALS names {path[:200]}, which is not a service-account "
                          f"key (a launched head needs one: set ${GCS_KEY_ENV} or point it at a key file)")
    return raw.decode()
