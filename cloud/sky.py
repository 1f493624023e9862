"""SkyPilot tasks of a run: the run config turned into one SkyPilot job group, checked by SkyPilot,
launched.

`write_tasks` writes, for a run named NAME, into one folder:
- `fleet.yaml`: a SkyPilot job group (0.14's `execution: parallel`, several tasks in one managed
  job, placed on one infrastructure — one cloud and region, one network). Its tasks:
  - `head`: one on-demand node (`use_spot: false`) running the Ray head, the controller and the
    learner (`spotlight train run.yaml`); the on-demand rollout workers run there. It is the
    group's primary task: when it ends (the run done, failed or out of budget), SkyPilot
    terminates the others, and the managed job ends — nothing is left billing.
  - `spot-<i>`, one per spot node (`runtime.spot_workers`), a node each (`use_spot: true`;
    `cloud.gpu` and `cloud.fallback_gpus` as `any_of` or `ordered` choices; SkyPilot's
    `job_recovery`): a preempted node is recovered on its own, the others keep serving. Each joins
    the head's Ray cluster and advertises the `spot` custom resource, which is what the spot
    rollout workers are placed by.
  The nodes find each other through the run's store, not by host name: SkyPilot 0.14.1 resolves a
  job group's host names (`head-0.NAME`) only on Kubernetes. The head publishes its address in a
  record signed with the fleet's Ray token (`cloud.rendezvous`); every node runs
  `python -m spotlight.fleet_node head|spot`, which meets there. Every node runs Ray with token
  auth, the token a secret the launch passes (`TOKEN_ENV`), and gets the checkpoint store's
  credentials as secrets (`cloud.credentials`). A task file names secrets, never their values.
- `run.yaml`: the resolved run config, file-mounted onto every node.

SkyPilot pins `click<8.2`, which the Hugging Face stack does not accept, so SkyPilot lives in its
own virtualenv and this module never imports `sky`: it runs that environment's Python
(`sky_python()`) to validate and its `sky` executable to launch.

Validation is SkyPilot's own loader (`dag_utils.load_dag_from_yaml`) on every file, in one
subprocess: duplicate keys, the job group header, the task and resources JSON schemas, env var
names, resource fields — with no cloud account and no network. SkyPilot checks accelerator names
only later (`Resources.validate`, at launch), against catalogs it downloads from GitHub, so GPU
names are checked here, before anything is written, against `KNOWN_GPUS` and the price table's
`gpu` column.

`launch_tasks` submits the job group as one managed job (`sky jobs launch`); `next_steps` says what
a user runs after it (the SkyPilot and spotlight commands that follow, cancel and pull the run).
"""

from __future__ import annotations

import csv
import json
import os
import re
import secrets
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cloud.config import CloudConfig
from cloud.names import ACCELERATOR, CLUSTER_NAME, CLUSTER_NAME_MAX, LOCAL_PATH
from cloud.node_setup import ACTIVATE, SETUP
from schedulers.input.files import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent
"""The project: the tasks' `workdir`, installed on every node by their `setup`."""


def not_uploaded(path: Path) -> bool:
    """Whether SkyPilot leaves `path` (under REPO_ROOT) out of the workdir it uploads: it skips what
    git ignores (`git check-ignore`); False where git cannot tell (no git, not a checkout)."""
    try:
        done = subprocess.run(["git", "-C", str(REPO_ROOT), "check-ignore", "-q", str(path)],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0

SKY_PYTHON_ENV = "SPOTLIGHT_SKY_PYTHON"
DEFAULT_SKY_PYTHON = REPO_ROOT / ".venv-sky" / "bin" / "python"
"""Where `make sky-venv` puts SkyPilot's Python; `$SPOTLIGHT_SKY_PYTHON` overrides it."""


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

REMOTE_DIR = "~/spotlight"
"""Where the head keeps run.yaml and the run folder."""

TOKEN_ENV = "SPOTLIGHT_RAY_TOKEN"
"""The fleet's Ray token: `spotlight launch` makes one per launch and passes it as a SkyPilot secret."""
NODE_IP_ENV = "SPOTLIGHT_RAY_NODE_IP"
PORT_FLAGS_ENV = "SPOTLIGHT_RAY_PORT_FLAGS"


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
    if not CLUSTER_NAME.fullmatch(name) or len(name) > CLUSTER_NAME_MAX:
        raise ConfigError(f"--name: expected lower-case letters, digits and '-', starting with a letter, "
                          f"at most {CLUSTER_NAME_MAX} characters (a SkyPilot cluster name), got {name!r}")
    return name


def known_gpus(prices: Path | None = None) -> dict[str, str]:
    """Accelerator names SkyPilot knows, lower-cased -> as spelled: `KNOWN_GPUS` plus the `gpu`
    column of the price table, when one is there (a table that cannot be read adds nothing: the
    price meter reports what is wrong with it). A table's name that is not an accelerator name
    (`cloud.names.ACCELERATOR`) adds nothing either: the spelling here is what a task file carries."""
    names = {g.lower(): g for g in KNOWN_GPUS}
    path = prices if prices is not None else REPO_ROOT / "cloud" / "prices.csv"
    from cloud.prices import PriceError, read_table_text

    try:  # bounded: a `cloud.prices` naming a huge file or /dev/zero reads at most 1 MiB
        for row in csv.DictReader(read_table_text(path, "price table").splitlines()):
            gpu = (row.get("gpu") or "").strip()
            if ACCELERATOR.fullmatch(gpu):
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


_AUTH = (
    # Ray's token auth on every node: its ports are open to the internet (`RAY_OPEN_PORTS`), so
    # nothing joins or calls the cluster without the run's token.
    f": \"${{{TOKEN_ENV}:?is set by spotlight launch: the Ray token of this fleet}}\"\n"
    f"export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=\"${TOKEN_ENV}\"\n"
)

HEAD_TASK = "head"
TERMINATION_DELAY = "30s"
"""How long the spot tasks get, once the head's task has ended, before SkyPilot terminates them
(their own scripts end sooner: they read `fleet/done.json` and stop)."""
HEAD_LOST = 75
"""A spot node's exit when it lost its head and the run is not done (`spotlight.fleet_node`): SkyPilot
relaunches it (`recover_on_exit_codes`) without counting it against `max_restarts_on_errors`."""
REMOTE_CONFIG = f"{REMOTE_DIR}/run.yaml"


def _recovery(cloud: CloudConfig, **more: Any) -> dict[str, Any]:
    return {"strategy": cloud.job_recovery, "max_restarts_on_errors": cloud.max_restarts_on_errors, **more}


def _node_run(role: str, name: str, *more: str) -> str:
    """A node's run script: its environment, the fleet's token, then `spotlight.fleet_node` (which
    meets the others through the store, `cloud.rendezvous`)."""
    args = " ".join((role, "--config", REMOTE_CONFIG, "--name", name, *more))
    return "set -euo pipefail\n" + ACTIVATE + _AUTH + f"exec python -m spotlight.fleet_node {args}\n"


def head_task(cloud: CloudConfig, name: str, run_yaml: Path, store_secrets: Sequence[str] = ()) -> dict[str, Any]:
    gpu = accelerators(cloud)[0]
    resources: dict[str, Any] = {"accelerators": f"{gpu}:{cloud.gpus_per_node}", "use_spot": False,
                                 "ports": RAY_OPEN_PORTS,
                                 # a failed head is relaunched too; its run resumes from the store
                                 "job_recovery": _recovery(cloud)}
    return {
        "name": HEAD_TASK,
        "workdir": str(REPO_ROOT),
        "num_nodes": 1,
        "resources": _placed(cloud, resources),
        "file_mounts": {REMOTE_CONFIG: str(run_yaml)},
        # Set by `spotlight launch` (`--secret`, from its own environment): never in a file or a log.
        "secrets": {TOKEN_ENV: "", **{secret: "" for secret in store_secrets}},
        "setup": SETUP,
        # The run folder is resumed from the store's newest checkpoint when this runs again.
        "run": _node_run("head", name, "--out", f"{REMOTE_DIR}/runs/{name}"),
    }


def spot_task(cloud: CloudConfig, index: int, name: str, run_yaml: Path,
              store_secrets: Sequence[str] = ()) -> dict[str, Any]:
    """Spot node `index`: a task of one node, so that its preemption recovers it alone. It reads
    the head's address from the store, so it gets the run config and the store's credentials too."""
    choices = [f"{g}:{cloud.gpus_per_node}" for g in accelerators(cloud)]
    resources = _placed(cloud, {"use_spot": True, "ports": RAY_OPEN_PORTS})
    if len(choices) == 1:
        resources["accelerators"] = choices[0]
    else:
        resources[cloud.accelerator_order] = [{"accelerators": c} for c in choices]
    resources["job_recovery"] = _recovery(cloud, recover_on_exit_codes=[HEAD_LOST])
    return {
        "name": f"spot-{index}",
        "workdir": str(REPO_ROOT),
        "num_nodes": 1,
        "resources": resources,
        "file_mounts": {REMOTE_CONFIG: str(run_yaml)},
        "secrets": {TOKEN_ENV: "", **{secret: "" for secret in store_secrets}},
        "setup": SETUP,
        "run": _node_run("spot", name),
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
            *(spot_task(cloud, i, name, run_yaml, store_secrets) for i in range(spot_workers))]


def write_tasks(cloud: CloudConfig, spot_workers: int, run_config: str, out: str | Path, name: str,
                store_secrets: Sequence[str] = ()) -> list[Path]:
    """Write run.yaml (the run config's text, `run_config`) and fleet.yaml (the job group) into
    `out` for a run with that `cloud` section and `spot_workers` spot nodes, the head declaring
    the secrets named `store_secrets` (`cloud.credentials`); returns [fleet.yaml]. Nothing is
    written when the config cannot become tasks (a `ConfigError`)."""
    name = check_name(name)
    check_fleet(cloud, spot_workers)
    out = Path(out).resolve()
    # SkyPilot uploads the workdir and run.yaml inside double quotes or Python's repr in a shell
    # command (cloud/names.py): a quote or '$' in either folder's path would run there.
    for what, folder in (("--out", out), ("the project's folder", REPO_ROOT)):
        if not LOCAL_PATH.fullmatch(str(folder)):
            raise ConfigError(f"{what}: expected a folder whose path has only letters, digits, spaces and "
                              f"._+-@%=,:~/ (SkyPilot puts it into shell commands), got {str(folder)[:200]!r}")
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


def shown(path: Path | None, default: str = "sky") -> str:
    """A path as a user would type it: relative to the current folder when under it (the repo's
    `.venv-sky/bin/sky`, which `make sky-venv` does not put on PATH), else in full; `default` for
    None (no SkyPilot environment yet: "sky")."""
    if path is None:
        return default
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def next_steps(name: str, uri: str, sky: Path | None, fleet: Path | None = None,
               launch: Sequence[str] | None = None) -> list[str]:
    """The commands a user runs after `spotlight launch`, as aligned lines. With `launch` (after a
    dry run): that command first, and why `sky jobs launch FLEET` alone is not it — `launch_tasks`
    makes the fleet's Ray token and passes it and the store's credentials as secrets, without which
    every task's run stops at its first line (`_AUTH`). Then where the run stands (`spotlight status`,
    from the store), the job group and its tasks' states (`sky jobs queue`), the tasks' logs (`sky
    jobs logs -n NAME`), how to stop every node now (`sky jobs cancel -y -n NAME`: a managed job's
    nodes are the jobs controller's to take down), the results (`spotlight pull`) and the
    walkthrough. SkyPilot 0.14.1's managed-jobs CLI, each command parsed by it in
    tests/cloud/test_launch_next_steps.py. One task's log is `sky jobs logs JOB_ID TASK` only: the
    `sky jobs logs -n my-job train` of its own help does not parse in 0.14.1 (JOB_ID, an integer,
    is the first positional argument, so `train` is taken for it)."""
    exe = shlex.quote(shown(sky))

    def command(*args: str) -> str:
        return " ".join(shlex.quote(a) for a in args)

    rows = [("status", command("spotlight", "status", uri), "where the run stands, read from the store"),
            ("queue", f"{exe} jobs queue", "the job group and each task's state (RUNNING, RECOVERING, ...)"),
            ("logs", f"{exe} jobs logs -n {name}",
             f"every task's output; the head's alone: {exe} jobs logs JOB_ID {HEAD_TASK} (JOB_ID: see the queue)"),
            ("cancel", f"{exe} jobs cancel -y -n {name}",
             "every node, now (the fleet goes down by itself when the run ends)"),
            ("pull", command("spotlight", "pull", uri, "--out", f"runs/{name}"),
             "its results: metrics, TensorBoard, final/ once done")]
    width = max(len(c) for _, c, _ in rows) + 2
    out = ["next steps (the walkthrough: docs/launch-on-aws-gcp.md):"]
    if launch is not None:
        out.append(f"  {'launch':<8}{command(*launch)}")
        out.append(f"  {'':<8}# not `sky jobs launch {shown(fleet, 'fleet.yaml')}` alone: spotlight launch gives "
                   f"the nodes the fleet's Ray token and the store's credentials as SkyPilot secrets "
                   f"(docs/launching.md#what-spotlight-launch-adds-to-fleetyaml)")
    out += [f"  {label:<8}{c:<{width}}# {why}" for label, c, why in rows]
    return out
