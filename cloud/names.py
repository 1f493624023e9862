"""The grammars of the names a launch hands SkyPilot: each one an allow-list of what the name can
be, so that nothing else gets through (issue 27).

Why: SkyPilot 0.14.1 puts several of these values into shell commands or generated YAML without
quoting them. A Docker image goes unquoted into `docker pull {image}` on every node
(`sky/provision/docker_utils.py`, `DockerInitializer.initialize`, near line 356), where the
store's keys and the fleet's Ray token live, so `docker:img;touch${IFS}/tmp/x` ran on each node. A
GCP image goes into the cluster template as `sourceImage: {{image_id}}` (`templates/gcp-ray.yml.j2`),
a newline in it adds YAML keys. A task's local paths (workdir, file mounts) go to the jobs bucket
inside double quotes (`echo "{copy_list}" | gsutil cp`, `sky/data/storage.py`) or Python's repr
(`rsync ... {path!r}`, `sky/utils/command_runner.py`), where `$(...)` or a quote runs.

Each grammar is the real one of what it names, not a list of forbidden characters:
- a Docker image reference (distribution's `reference` grammar, which containerd and the Docker CLI
  parse with): [DOMAIN[:PORT]/]PATH[:TAG][@sha256:HEX64], PATH being lower-case components
  separated by '/', each letters and digits joined by '.', '_', '__' or dashes;
- an AWS AMI id: `ami-` and 8 or 17 lower-case hex digits;
- a GCP image as SkyPilot reads it (`GCP._get_image_size` splits it by '/'):
  projects/PROJECT/global/images/NAME or projects/PROJECT/global/machineImages/NAME;
- a SkyPilot image tag (`skypilot:gpu-ubuntu-2204`), looked up in its catalog;
- regions: AWS's `us-east-1`, `us-gov-west-1`, `ap-southeast-2`; GCP's `us-central1`, `us-east4`,
  `northamerica-northeast1` (every region of SkyPilot's catalogs and cloud/prices.csv);
- a SkyPilot cluster or job name, an accelerator name, a local path SkyPilot uploads.

tests/cloud/test_launch_inputs.py checks each against shell payloads and real-world names.
"""

from __future__ import annotations

import re

# ---- images -------------------------------------------------------------------------------------

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|-+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_DOMAIN = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]{{1,5}})?"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128}"
DOCKER_REFERENCE = re.compile(
    rf"(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*(?::{_TAG})?(?:@(?:{_DIGEST}))?")
"""A Docker image reference (without SkyPilot's `docker:` prefix)."""
DOCKER_REFERENCE_MAX = 255
"""distribution's `NameTotalLengthMax`, applied here to the whole reference."""
AMI_ID = re.compile(r"ami-(?:[0-9a-f]{8}|[0-9a-f]{17})")
_GCP_NAME = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
_GCP_PROJECT = r"(?:[a-z0-9][-a-z0-9.]*[a-z0-9]:)?[a-z][-a-z0-9]{4,28}[a-z0-9]"  # domain-scoped: example.com:proj
GCP_IMAGE = re.compile(rf"projects/{_GCP_PROJECT}/global/(?:images|machineImages)/{_GCP_NAME}")
SKYPILOT_IMAGE_TAG = re.compile(r"skypilot:[a-z0-9]+(?:-[a-z0-9]+)*")

_DOCKER_FORM = "docker:IMAGE ([REGISTRY[:PORT]/]lower-case/path[:TAG][@sha256:HEX64])"
_IMAGE_FORMS = {
    "aws": "an AWS AMI (ami- and 8 or 17 hex digits)",
    "gcp": "a GCP image (projects/PROJECT/global/images/NAME)",
}


def image_problem(image_id: str, provider: str | None) -> str | None:
    """What `image_id` (SkyPilot's `image_id` field) should have been on `provider` (None: either
    cloud), or None when it is one: a `docker:` reference, a SkyPilot tag, or the cloud's image."""
    forms = [_DOCKER_FORM, *(v for k, v in _IMAGE_FORMS.items() if provider in (None, k)),
             "a SkyPilot tag (skypilot:NAME)"]
    expected = ", ".join(forms[:-1]) + " or " + forms[-1]
    if not isinstance(image_id, str):
        return expected
    if image_id.startswith("docker:"):
        ref = image_id.removeprefix("docker:")
        ok = len(ref) <= DOCKER_REFERENCE_MAX and DOCKER_REFERENCE.fullmatch(ref) is not None
    else:
        ok = (SKYPILOT_IMAGE_TAG.fullmatch(image_id) is not None
              or (provider in (None, "aws") and AMI_ID.fullmatch(image_id) is not None)
              or (provider in (None, "gcp") and GCP_IMAGE.fullmatch(image_id) is not None))
    return None if ok else expected


# ---- places -------------------------------------------------------------------------------------

REGIONS = {
    "aws": (re.compile(r"[a-z]{2}(?:-[a-z]+)+-[0-9]{1,2}"), "an AWS region (e.g. us-east-1)"),
    "gcp": (re.compile(r"[a-z]+-[a-z]+[0-9]{1,2}"), "a GCP region (e.g. us-central1)"),
}


def region_problem(region: str, provider: str | None) -> str | None:
    """What `region` should have been on `provider` (None: either cloud), or None when it is one."""
    grammars = [v for k, v in REGIONS.items() if provider in (None, k)]
    if isinstance(region, str) and any(pattern.fullmatch(region) for pattern, _ in grammars):
        return None
    return " or ".join(what for _, what in grammars)


# ---- names --------------------------------------------------------------------------------------

CLUSTER_NAME = re.compile(r"[a-z](?:[-a-z0-9]*[a-z0-9])?")
"""A SkyPilot cluster or managed-job name; lower case because GCP accepts only that."""
CLUSTER_NAME_MAX = 40
ACCELERATOR = re.compile(r"[A-Za-z0-9]+(?:[-_.][A-Za-z0-9]+)*")
"""An accelerator as SkyPilot spells it: H100, A100-80GB, T4g, RTXPRO6000."""
LOCAL_PATH = re.compile(r"[\w .,+@%=:~/-]+")
"""A local path SkyPilot uploads (workdir, file mounts): no quote, '$', '`', '\\' or control
character, so it means the same inside SkyPilot's single or double quotes."""
