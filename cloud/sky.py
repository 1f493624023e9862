"""SkyPilot tasks of a run: the run config turned into one SkyPilot job group, checked by SkyPilot,
launched.

`write_tasks` writes, for a run named NAME, into one folder:
- `fleet.yaml`: a SkyPilot job group (0.14's `execution: parallel`, several tasks in one managed
  job, placed on one infrastructure — one cloud and region, one network — where each task's nodes
  reach the others as TASK-NODE.NAME). Its tasks:
  - `head`: one on-demand node (`use_spot: false`) running the Ray head, the controller and the
    learner (`spotlight train run.yaml`); the on-demand rollout workers run there. It is the
    group's primary task: when it ends (the run done, failed or out of budget), SkyPilot
    terminates the others, and the managed job ends — nothing is left billing.
  - `spot-<i>`, one per spot node (`runtime.spot_workers`), a node each (`use_spot: true`;
    `cloud.gpu` and `cloud.fallback_gpus` as `any_of` or `ordered` choices; SkyPilot's
    `job_recovery`): a preempted node is recovered on its own, the others keep serving. Each joins
    the head's Ray cluster at `head-0.NAME` (its internal address) and advertises the `spot`
    custom resource, which is what the spot rollout workers are placed by.
  Every node runs Ray with token auth, the token a secret the launch passes (`TOKEN_ENV`); the
  head also gets its checkpoint store's credentials as secrets (`cloud.credentials`). A task file
  names secrets, never their values.
- `run.yaml`: the resolved run config, file-mounted onto the head.

SkyPilot pins `click<8.2`, which the Hugging Face stack does not accept, so SkyPilot lives in its
own virtualenv and this module never imports `sky`: it runs that environment's Python
(`sky_python()`) to validate and its `sky` executable to launch.

Validation is SkyPilot's own loader (`dag_utils.load_dag_from_yaml`) on every file, in one
subprocess: duplicate keys, the job group header, the task and resources JSON schemas, env var
names, resource fields — with no cloud account and no network. SkyPilot checks accelerator names
only later (`Resources.validate`, at launch), against catalogs it downloads from GitHub, so GPU
names are checked here, before anything is written, against `KNOWN_GPUS` and the price table's
`gpu` column.

`launch_tasks` submits the job group as one managed job (`sky jobs launch`).
"""

from __future__ import annotations

import csv
import json
import os
import re
import secrets
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cloud.config import CloudConfig
from schedulers.input_file import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The project: the tasks' `workdir`, installed on every node by their `setup`."""

SKY_PYTHON_ENV = "SPOTLIGHT_SKY_PYTHON"
DEFAULT_SKY_PYTHON = REPO_ROOT / ".venv-sky" / "bin" / "python"
"""Where `make sky-venv` puts SkyPilot's Python; `$SPOTLIGHT_SKY_PYTHON` overrides it."""

HEAD_IP_ENV = "SPOTLIGHT_HEAD_IP"
"""The head's address, for a spot node started outside a job group (default: its job-group host name)."""
JOBGROUP_ENV = "SKYPILOT_JOBGROUP_NAME"

# SkyPilot's common GPUs (`sky.catalog.get_common_gpus()` in 0.14) and the other GPUs its AWS and
# GCP catalogs list, as SkyPilot spells them. Names are matched without regard to case.
KNOWN_GPUS = (
    "A10", "A10G", "A100", "A100-80GB", "B200", "GH200", "H100", "H100-MEGA", "H200", "K80", "L4",
    "L40S", "M60", "P100", "P4", "RTX5090", "RTXPRO6000", "T4", "T4g", "V100", "V100-32GB",
)

# Ray's ports, fixed so that exactly these are opened. SkyPilot runs its own Ray on every node on
# 6380 (dashboard 8266, object manager 8076): ours stays clear of them. Head and pools are separate
# SkyPilot clusters, each in its own security group, so Ray traffic between them needs `ports`.
RAY_PORT = 6379
RAY_NODE_PORTS = {
    "--node-manager-port": 6385,
    "--object-manager-port": 6386,
    "--runtime-env-agent-port": 6387,
    "--dashboard-agent-grpc-port": 6388,
    "--dashboard-agent-listen-port": 6389,
    "--metrics-export-port": 6390,
}
RAY_WORKER_PORTS = (10002, 10999)
"""Ports of Ray's worker processes: at most 998 actors and tasks per node."""
RAY_OPEN_PORTS = [RAY_PORT, "6385-6390", f"{RAY_WORKER_PORTS[0]}-{RAY_WORKER_PORTS[1]}"]

INSTALLED_LOCK = "~/.spotlight-fleet.lock"
"""The lock a node's environment was installed from (an image built from the lock carries it)."""
REMOTE_DIR = "~/spotlight"
"""Where the head keeps run.yaml and the run folder."""

TOKEN_ENV = "SPOTLIGHT_RAY_TOKEN"
"""The fleet's Ray token: `spotlight launch` makes one per launch and passes it as a SkyPilot secret."""
NODE_IP_ENV = "SPOTLIGHT_RAY_NODE_IP"
PORT_FLAGS_ENV = "SPOTLIGHT_RAY_PORT_FLAGS"

HEAD_WAIT_S = 900
"""How long a spot node waits for the head's Ray to answer before its job fails (and is restarted)."""

# SkyPilot cluster and job names; lower case because GCP accepts only that.
_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


class SkyError(RuntimeError):
    """SkyPilot is missing, rejects a task, or a launch step failed; `str(err)` is one line."""


@dataclass(frozen=True)
class Validation:
    """What SkyPilot made of each task file: `errors` maps a file to SkyPilot's first line."""

    python: Path
    version: str
    errors: dict[Path, str]

    @property
    def ok(self) -> bool:
        return not self.errors


# ---- names and GPUs --------------------------------------------------------------------------------


def run_name(config_path: str | Path) -> str:
    """The default run name: the config's file name, made a valid cluster name (tiny_dit -> tiny-dit)."""
    name = re.sub(r"[^a-z0-9]+", "-", Path(config_path).stem.lower()).strip("-")
    return name if name[:1].isalpha() else f"run-{name}".rstrip("-")


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name) or len(name) > 40:
        raise ConfigError(f"--name: expected lower-case letters, digits and '-', starting with a letter, "
                          f"at most 40 characters (a SkyPilot cluster name), got {name!r}")
    return name


def known_gpus(prices: Path | None = None) -> dict[str, str]:
    """Accelerator names SkyPilot knows, lower-cased -> as spelled: `KNOWN_GPUS` plus the `gpu`
    column of the price table, when one is there (a table that cannot be read adds nothing: the
    price meter reports what is wrong with it)."""
    names = {g.lower(): g for g in KNOWN_GPUS}
    path = prices if prices is not None else REPO_ROOT / "cloud" / "prices.csv"
    from cloud.prices import PriceError, read_table_text

    try:  # bounded: a `cloud.prices` naming a huge file or /dev/zero reads at most 1 MiB
        for row in csv.DictReader(read_table_text(path, "price table").splitlines()):
            gpu = (row.get("gpu") or "").strip()
            if gpu:
                names.setdefault(gpu.lower(), gpu)
    except (PriceError, csv.Error):
        pass
    return names


def accelerators(cloud: CloudConfig) -> list[str]:
    """`cloud.gpu` then `cloud.fallback_gpus`, spelled as SkyPilot spells them, without repeats.
    An unknown name is a `ConfigError` naming its field."""
    known = known_gpus(Path(cloud.prices) if cloud.prices else None)
    out: list[str] = []
    for field_name, gpu in [("cloud.gpu", cloud.gpu)] + [(f"cloud.fallback_gpus[{i}]", g)
                                                          for i, g in enumerate(cloud.fallback_gpus)]:
        canonical = known.get(gpu.strip().lower())
        if canonical is None:
            raise ConfigError(f"{field_name}: expected an accelerator SkyPilot knows "
                              f"({', '.join(sorted(known.values(), key=str.lower))}), got {gpu!r}")
        if canonical not in out:
            out.append(canonical)
    return out


MAX_SPOT_NODES = 1024
"""Spot nodes in one job group (a task each)."""


# ---- the tasks --------------------------------------------------------------------------------------


def _infra(cloud: CloudConfig) -> str | None:
    provider, region = cloud.provider, cloud.region
    if region:
        return f"{provider or '*'}/{region}"
    return provider


def _placed(cloud: CloudConfig, resources: dict[str, Any]) -> dict[str, Any]:
    """`resources` with the fleet's infrastructure (first, as SkyPilot writes it) and node image."""
    infra = _infra(cloud)
    placed = {"infra": infra, **resources} if infra else dict(resources)
    if cloud.image_id:
        placed["image_id"] = cloud.image_id
    return placed


def _ray_ports() -> str:
    """The node's Ray ports as `ray start` flags: the ones the task opens, unless
    $SPOTLIGHT_RAY_PORT_FLAGS replaces them (several nodes on one machine cannot share them)."""
    fixed = " ".join(f"{flag} {port}" for flag, port in RAY_NODE_PORTS.items())
    ports = f"{fixed} --min-worker-port {RAY_WORKER_PORTS[0]} --max-worker-port {RAY_WORKER_PORTS[1]}"
    return f"${{{PORT_FLAGS_ENV}:-{ports}}}"


_AUTH = (
    # Ray's token auth on every node: its ports are open to the internet (`RAY_OPEN_PORTS`), so
    # nothing joins or calls the cluster without the run's token.
    f": \"${{{TOKEN_ENV}:?is set by spotlight launch: the Ray token of this fleet}}\"\n"
    f"export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=\"${TOKEN_ENV}\"\n"
)
_NODE_IP = f"${{{NODE_IP_ENV}:+ --node-ip-address ${NODE_IP_ENV}}}"
"""The address a node's Ray advertises: Ray's own choice, unless $SPOTLIGHT_RAY_NODE_IP says
(a test's fleet of local processes keeps to loopback with it)."""
HEAD_START_S = 120
"""How long the head waits for its Ray to answer before it gives up."""
HEAD_STOP_S = 60
"""How long the head's job waits, once the run is over, for its Ray to stop (about 15 s)."""

_SETUP = (
    "set -euo pipefail\n"
    # The tested environment, pinned (cloud/fleet.lock): every node runs the head's Ray version and
    # nothing is resolved at launch. Skipped where it is installed already: a node image built
    # from the lock (`cloud.image_id`), or setup run again on the same node.
    f"if ! cmp -s cloud/fleet.lock {INSTALLED_LOCK}; then\n"
    # On a GPU node PyPI's torch of the pinned version is the CUDA build, which is what it needs.
    "  pip install --quiet -r cloud/fleet.lock\n"
    "  pip install --quiet --no-deps -e .\n"
    f"  cp cloud/fleet.lock {INSTALLED_LOCK}\n"
    "fi\n"
)
"""A node's setup (its working directory is this repository)."""


HEAD_TASK = "head"
TERMINATION_DELAY = "30s"
"""How long the spot tasks get, once the head's task has ended, before SkyPilot terminates them
(their own scripts end sooner: their Ray goes with the head's)."""


def _recovery(cloud: CloudConfig) -> dict[str, Any]:
    return {"strategy": cloud.job_recovery, "max_restarts_on_errors": cloud.max_restarts_on_errors}


def head_task(cloud: CloudConfig, name: str, run_yaml: Path, store_secrets: Sequence[str] = ()) -> dict[str, Any]:
    gpu = accelerators(cloud)[0]
    resources: dict[str, Any] = {"accelerators": f"{gpu}:{cloud.gpus_per_node}", "use_spot": False,
                                 "ports": RAY_OPEN_PORTS,
                                 # a failed head is relaunched too; its run resumes from the store
                                 "job_recovery": _recovery(cloud)}
    resources = _placed(cloud, resources)
    remote_config = f"{REMOTE_DIR}/run.yaml"
    run = (
        "set -uo pipefail\n"
        + _AUTH
        + f"pidfile={REMOTE_DIR}/ray-head.pid\n"
        # Ray's head lives exactly as long as the run: started with --block, it is one process that
        # stops every Ray process it started when it is terminated, which this script does when
        # training ends, fails, hits its budget or is cancelled. Then the spot nodes' Ray ends and
        # with it their tasks; this task is the job group's primary, so SkyPilot then ends the
        # group and takes every node down: nothing bills on.
        # (Never `ray stop`: it would also stop the Ray SkyPilot itself runs on this node.)
        "stop_ray() {\n"
        "  [ -s \"$pidfile\" ] || return 0\n"
        "  pid=$(cat \"$pidfile\"); kill \"$pid\" 2>/dev/null\n"
        f"  for _ in $(seq {HEAD_STOP_S}); do kill -0 \"$pid\" 2>/dev/null || break; sleep 1; done\n"
        "  kill -- -\"$pid\" 2>/dev/null\n"  # what Ray left behind in its process group
        "  rm -f \"$pidfile\"\n"
        "}\n"
        "trap stop_ray EXIT\n"
        "trap 'exit 143' TERM INT\n"
        # A second `sky launch` of the same head re-runs this: the Ray head still up is reused.
        f"here=${{{NODE_IP_ENV}:-127.0.0.1}}:{RAY_PORT}\n"
        "if ! ray status --address \"$here\" >/dev/null 2>&1; then\n"
        f"  mkdir -p {REMOTE_DIR}\n"
        f"  setsid ray start --head --port {RAY_PORT} {_ray_ports()}{_NODE_IP} --disable-usage-stats --block &\n"
        "  echo $! > \"$pidfile\"\n"
        f"  for _ in $(seq {HEAD_START_S}); do\n"
        "    ray status --address \"$here\" >/dev/null 2>&1 && break\n"
        "    kill -0 \"$(cat \"$pidfile\")\" 2>/dev/null || { echo \"spotlight: the Ray head did not start\" >&2; exit 1; }\n"
        "    sleep 1\n"
        "  done\n"
        "fi\n"
        # An explicit address: `auto` could find SkyPilot's own Ray cluster on this node.
        # The run folder is resumed from its newest checkpoint when this runs again.
        f"spotlight train {remote_config} --address \"$here\" --out {REMOTE_DIR}/runs/{name} --no-progress\n"
    )
    return {
        "name": HEAD_TASK,
        "workdir": str(REPO_ROOT),
        "num_nodes": 1,
        "resources": resources,
        "file_mounts": {remote_config: str(run_yaml)},
        # Set by `spotlight launch` (`--secret`, from its own environment): never in a file or a log.
        "secrets": {TOKEN_ENV: "", **{secret: "" for secret in store_secrets}},
        "setup": _SETUP,
        "run": run,
    }


def spot_task(cloud: CloudConfig, index: int) -> dict[str, Any]:
    """Spot node `index`: a task of one node, so that its preemption recovers it alone."""
    choices = [f"{g}:{cloud.gpus_per_node}" for g in accelerators(cloud)]
    resources = _placed(cloud, {"use_spot": True, "ports": RAY_OPEN_PORTS})
    if len(choices) == 1:
        resources["accelerators"] = choices[0]
    else:
        resources[cloud.accelerator_order] = [{"accelerators": c} for c in choices]
    resources["job_recovery"] = _recovery(cloud)
    head = "$head"
    run = (
        "set -uo pipefail\n"
        + _AUTH
        # The head's internal address: its job-group host name (SkyPilot maps it in /etc/hosts),
        # unless $SPOTLIGHT_HEAD_IP says otherwise. No apostrophe in the message: bash pairs quotes
        # inside "${VAR:?...}".
        + f"head=${{{HEAD_IP_ENV}:-{HEAD_TASK}-0.${{{JOBGROUP_ENV}:?is set by SkyPilot in a job group, "
        f"else set {HEAD_IP_ENV} to the address of the head}}}}\n"
        f"head_up() {{ timeout 5 bash -c \"exec 3<>/dev/tcp/{head}/{RAY_PORT}\" 2>/dev/null; }}\n"
        f"for _ in $(seq {HEAD_WAIT_S // 5}); do head_up && break; sleep 5; done\n"
        # The `spot` amount only marks the node: each spot rollout worker needs a sliver of it, so
        # the node's CPUs and GPUs bound how many land here, not this number.
        # In a session of its own, so that what Ray leaves behind when it ends (its dashboard agent
        # lingers a minute) goes with its process group.
        f"setsid ray start --address {head}:{RAY_PORT} --resources '{{\"spot\": {cloud.gpus_per_node}}}' "
        f"{_ray_ports()}{_NODE_IP} --disable-usage-stats --block &\n"
        "ray_pid=$!\n"
        "trap 'kill -- -$ray_pid 2>/dev/null' EXIT\n"
        "wait $ray_pid\n"
        "code=$?\n"
        # The head's Ray gone means the run has ended: finish this job so SkyPilot does not
        # restart it. Anything else is a failure that `max_restarts_on_errors` may cure.
        "if ! head_up; then echo \"spotlight: the head's Ray cluster is gone: the run has ended\"; exit 0; fi\n"
        "exit $code\n"
    )
    return {
        "name": f"spot-{index}",
        "workdir": str(REPO_ROOT),
        "num_nodes": 1,
        "resources": resources,
        "secrets": {TOKEN_ENV: ""},
        "setup": _SETUP,
        "run": run,
    }


class _TaskDumper(yaml.SafeDumper):
    """Writes multi-line strings (setup, run) as `|` blocks, so a task reads like a shell script."""


_TaskDumper.add_representer(str, lambda dumper, s: dumper.represent_scalar(
    "tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))


def check_fleet(cloud: CloudConfig, spot_workers: int) -> None:
    """A `ConfigError` for a fleet that cannot become a job group (an unknown GPU, too many spot
    nodes), before any file is touched."""
    accelerators(cloud)
    if spot_workers > MAX_SPOT_NODES:
        raise ConfigError(f"runtime.spot_workers: a launched fleet has at most {MAX_SPOT_NODES} spot nodes "
                          f"(a task each), got {spot_workers}")


def fleet_tasks(cloud: CloudConfig, spot_workers: int, name: str, run_yaml: Path,
                store_secrets: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The job group's documents: its header, the head, then one task per spot node."""
    header = {"name": name, "execution": "parallel", "primary_tasks": [HEAD_TASK],
              "termination_delay": TERMINATION_DELAY}
    return [header, head_task(cloud, name, run_yaml, store_secrets),
            *(spot_task(cloud, i) for i in range(spot_workers))]


def write_tasks(cloud: CloudConfig, spot_workers: int, run_config: str, out: str | Path, name: str,
                store_secrets: Sequence[str] = ()) -> list[Path]:
    """Write run.yaml (the run config's text, `run_config`) and fleet.yaml (the job group) into
    `out` for a run with that `cloud` section and `spot_workers` spot nodes, the head declaring
    the secrets named `store_secrets` (`cloud.credentials`); returns [fleet.yaml]. Nothing is
    written when the config cannot become tasks (a `ConfigError`)."""
    name = check_name(name)
    check_fleet(cloud, spot_workers)
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    run_yaml = out / "run.yaml"
    run_yaml.write_text(run_config)
    for stale in [*out.glob("workers-*.yaml"), out / "head.yaml"]:  # an earlier version's task files
        stale.unlink(missing_ok=True)
    path = out / "fleet.yaml"
    path.write_text(yaml.dump_all(fleet_tasks(cloud, spot_workers, name, run_yaml, store_secrets), Dumper=_TaskDumper,
                                  sort_keys=False, width=120))
    return [path]


# ---- SkyPilot's environment -------------------------------------------------------------------------


def sky_python() -> tuple[Path | None, str]:
    """SkyPilot's Python: `$SPOTLIGHT_SKY_PYTHON` when set, else the repo's `.venv-sky`. Returns
    (path, "") or (None, why there is none)."""
    named = os.environ.get(SKY_PYTHON_ENV)
    if named:
        path = Path(named)
        if path.is_file() and os.access(path, os.X_OK):
            return path, ""
        return None, f"${SKY_PYTHON_ENV} names {named}, which is not an executable file"
    if DEFAULT_SKY_PYTHON.is_file():
        return DEFAULT_SKY_PYTHON, ""
    return None, f"no SkyPilot environment (create it with `make sky-venv`, or set ${SKY_PYTHON_ENV})"


# Runs in SkyPilot's Python: one JSON line per file, marked, since SkyPilot may print to stdout too.
_VALIDATE = r"""
import json, sys
import sky
print("SPOTLIGHT-SKY " + json.dumps({"version": sky.__version__}), flush=True)
from sky.utils import dag_utils
for path in sys.argv[1:]:
    try:
        dag_utils.load_dag_from_yaml(path)
        error = None
    except Exception as err:  # SkyPilot raises ValueError and its own errors here
        text = str(err).strip()
        error = (text.splitlines() or [type(err).__name__])[0]
    print("SPOTLIGHT-SKY " + json.dumps({"file": path, "error": error}), flush=True)
"""


def validate(paths: Sequence[Path], python: Path, timeout_s: float = 300.0) -> Validation:
    """Load every file with SkyPilot's own loader, in one subprocess of SkyPilot's Python."""
    env = {**os.environ, "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"}
    try:
        proc = subprocess.run([str(python), "-c", _VALIDATE, *map(str, paths)], capture_output=True,
                              text=True, timeout=timeout_s, env=env)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise SkyError(f"{python}: cannot run SkyPilot's Python ({err})") from None
    records = [json.loads(line.removeprefix("SPOTLIGHT-SKY ")) for line in proc.stdout.splitlines()
               if line.startswith("SPOTLIGHT-SKY ")]
    if not records or proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise SkyError(f"{python}: SkyPilot could not be run to validate the tasks ({tail})")
    errors = {Path(r["file"]): r["error"] for r in records[1:] if r["error"] is not None}
    return Validation(python=python, version=records[0]["version"], errors=errors)


# ---- launching --------------------------------------------------------------------------------------


Runner = Callable[..., subprocess.CompletedProcess]


def launch_tasks(paths: Sequence[Path], name: str, sky: Path, run: Runner = subprocess.run,
                 store_secrets: Mapping[str, str] | None = None) -> None:
    """Submit the job group (`write_tasks`' file) as one managed job named NAME (`sky jobs launch`).
    Every node gets the fleet's Ray token, made here, as the secret $SPOTLIGHT_RAY_TOKEN, and the
    head its store's `store_secrets`: passed through `sky`'s environment (`--secret NAME`), so no
    value is in a command line, file or log. The output of `sky` goes to the user."""
    (fleet,) = paths
    given = {TOKEN_ENV: secrets.token_hex(32), **(store_secrets or {})}
    env = {**os.environ, **given}
    args = ["jobs", "launch", str(fleet), *(a for secret in given for a in ("--secret", secret)), "-y", "-d"]
    proc = run([str(sky), *args], capture_output=False, text=True, env=env)
    if proc.returncode != 0:
        raise SkyError(f"`sky {' '.join(args)}` exited with {proc.returncode} (its output is above)")
