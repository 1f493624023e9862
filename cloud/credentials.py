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
  from the environment, else read from the key file $GOOGLE_APPLICATION_CREDENTIALS names; either
  way checked by the store's own check (`cloud.gcs.service_account_info`) before anything is
  written, so a user's login or a stray text is refused here, not on every node. With none, a node
  uses its VM's service account on GCP; elsewhere refused.
- a folder: none (`spotlight.launch_config` refuses folders for a launch anyway).

Invariant: a value returned here is only ever put into a subprocess's environment; messages name
variables, never values (tests/cloud/test_cloud_sky.py checks the launch's files and output hold none).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cloud.gcs import KEY_JSON_ENV, MAX_KEY_BYTES, NotAServiceAccountKey, service_account_info
from cloud.store import parse_store_uri
from schedulers.input.files import ConfigError

AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
AWS_PLACE = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION")
"""Not secret, but the store's address: passed the same way, so the task files carry no endpoint."""
GCS_KEY_ENV = KEY_JSON_ENV
"""What a GCS store reads its service-account key from."""


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
        key = _key_text(environ.get(GCS_KEY_ENV)) or _key_file(environ.get("GOOGLE_APPLICATION_CREDENTIALS"))
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


def _key_text(text: str | None) -> str | None:
    """$SPOTLIGHT_GCS_KEY_JSON's text when it is a service-account key, None when blank (the store
    ignores a blank one too); anything else is refused here, before it is shipped to every node
    that would refuse it only once running (`cloud.gcs.service_account_info`, the store's check)."""
    if not text or not text.strip():
        return None
    try:
        service_account_info(text)
    except NotAServiceAccountKey as err:
        raise ConfigError(f"${GCS_KEY_ENV} {err} (a launched fleet needs one to reach a gs:// store)") from None
    return text


def _key_file(path: str | None) -> str | None:
    """The text of the service-account key file at `path`, None when there is none to use (no
    path); a file that is not a service-account key (e.g. a user's own login, ADC of another kind)
    is refused by the same check as $SPOTLIGHT_GCS_KEY_JSON."""
    if not path:
        return None
    try:
        with open(Path(path).expanduser(), "rb") as f:
            raw = f.read(MAX_KEY_BYTES + 1)  # bounded: a key is ~2.3 KB, /dev/zero is not one
    except OSError as err:
        raise ConfigError(f"$GOOGLE_APPLICATION_CREDENTIALS names {path[:200]}, which cannot be read "
                          f"({err.strerror or type(err).__name__})") from None
    try:
        service_account_info(raw)
    except NotAServiceAccountKey as err:
        raise ConfigError(f"$GOOGLE_APPLICATION_CREDENTIALS names {path[:200]}, which {err} (a launched head "
                          f"needs one: set ${GCS_KEY_ENV} or point it at a key file)") from None
    return raw.decode()
