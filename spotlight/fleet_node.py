"""A launched fleet's node: what the job group's head task and each spot task run (`cloud/sky.py`).

    python -m spotlight.fleet_node head --config ~/spotlight/run.yaml --name NAME --out DIR
    python -m spotlight.fleet_node spot --config ~/spotlight/run.yaml --name NAME

Both read the run config (its `cloud.checkpoint_uri` is the store the fleet meets in:
`cloud.rendezvous`), the fleet's Ray token ($SPOTLIGHT_RAY_TOKEN) and the store's credentials
from the environment (SkyPilot secrets), fetch the policy's model folder when it is in a bucket
(`cloud.model_cache`), then:

- **head**: starts the Ray head, publishes its address as the next generation of
  `fleet/head.json`, runs `spotlight train` (which resumes from the store after a restart), and,
  when the run has ended for good, writes `fleet/done.json` before it stops its Ray. Its exit code
  is `spotlight train`'s: 0 when the run is done (finished, or stopped at its budget or deadline),
  2 when its input is wrong (done too: a restart would fail the same way); anything else is a
  failure SkyPilot restarts (`max_restarts_on_errors`), and the restarted head publishes the next
  generation.
- **spot**: waits for a head record that verifies, joins that Ray cluster with the `spot` custom
  resource, and follows the record: a new generation (the head restarted, perhaps elsewhere) makes
  it leave and join the new head. It exits 0 only when `fleet/done.json` says the run has ended —
  the only exit SkyPilot does not relaunch. With no head to join for `$SPOTLIGHT_HEAD_WAIT_S`
  (default 900 s) while the run is not done it exits `HEAD_LOST` (75), which the task's
  `recover_on_exit_codes` makes SkyPilot relaunch without counting it as the node's own error.

Ray runs as `ray start --block` in a process group of its own: stopping it is SIGTERM to that
process (it stops what it started), then SIGKILL to the group (what Ray leaves behind, its
dashboard agent lingers a minute). Never `ray stop`: it would also stop the Ray that SkyPilot runs
on the same node.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from cloud.bounded_json import load_file
from cloud.model_cache import ModelSourceError, prefetch
from cloud.open_store import open_store
from cloud.rendezvous import HeadRecord, Rendezvous
from cloud.sky import HEAD_LOST, NODE_IP_ENV, PORT_FLAGS_ENV, RAY_NODE_PORTS, RAY_PORT, RAY_WORKER_PORTS, TOKEN_ENV
from cloud.store import StoreError
from schedulers.clock import Clock, WallClock
from schedulers.input.files import ConfigError, InputError, short
from spotlight.config import RunConfig, load_config
from spotlight.logs import configure

HEAD_WAIT_ENV = "SPOTLIGHT_HEAD_WAIT_S"
HEAD_WAIT_S = 900.0
"""How long a spot node goes without a head before it fails (a head's recovery takes minutes)."""
POLL_ENV = "SPOTLIGHT_FLEET_POLL_S"
POLL_S = 10.0
"""Seconds between a spot node's reads of the fleet records: 8,640 GETs a day, about $0.003 on S3."""
ENV_SECONDS = {HEAD_WAIT_ENV: (HEAD_WAIT_S, 1.0, 7 * 86400.0), POLL_ENV: (POLL_S, 0.1, 3600.0)}
"""The environment's settings in seconds: (default, lowest, highest). A value outside them, or not a
number, is refused in one line naming the variable: `0`, `-1` or `nan` as the poll made a busy
loop (326,710 store reads in 5 s), `inf` an OverflowError, `abc` a traceback."""


def env_seconds(name: str) -> float:
    """`$name` (one of `ENV_SECONDS`) in seconds, its default when unset; a ConfigError otherwise."""
    default, low, high = ENV_SECONDS[name]
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not low <= value <= high:  # nan fails both
        raise ConfigError(f"${name}: expected seconds in [{low:g}, {high:g}], got {short(raw)}")
    return value


HEAD_START_S = 120.0
"""How long the head waits for its Ray to answer before it gives up."""
RAY_STOP_S = 60.0
"""How long a node waits for its Ray to stop (about 15 s) before it kills what is left."""
DONE_EXIT_CODES = {0: None, 2: "failed: the run's input or config (exit 2); a restart would fail the same way"}
"""`spotlight train` exits after which the run has ended for good (0: read its summary's stop_reason)."""


NAME = "spotlight.fleet_node"
logger = logging.getLogger(NAME)
"""By its package name, not `__name__`: a node runs this module as `python -m spotlight.fleet_node`,
where `__name__` is "__main__", whose lines no handler of `configure` would print."""

PREFIX = "spotlight fleet: "
"""Before each line of this module's and the fleet records' (`main` configures it): the node's
output is interleaved with Ray's and `spotlight train`'s in the job's log."""


# ---- the node's Ray -----------------------------------------------------------------------------------


def ray_port_flags() -> list[str]:
    """The Ray ports the task opens, unless $SPOTLIGHT_RAY_PORT_FLAGS replaces them (several nodes
    on one machine, in a test, cannot share them)."""
    named = os.environ.get(PORT_FLAGS_ENV)
    if named:
        return named.split()
    flags = [str(a) for flag, port in RAY_NODE_PORTS.items() for a in (flag, port)]
    return flags + ["--min-worker-port", str(RAY_WORKER_PORTS[0]), "--max-worker-port", str(RAY_WORKER_PORTS[1])]


def node_ip() -> str:
    """This node's internal address: $SPOTLIGHT_RAY_NODE_IP, else the first of SkyPilot's
    $SKYPILOT_NODE_IPS (a task of one node), else the address this host routes from."""
    named = os.environ.get(NODE_IP_ENV)
    if named:
        return named
    skypilot = (os.environ.get("SKYPILOT_NODE_IPS") or "").split()
    if skypilot:
        return skypilot[0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the route
        return probe.getsockname()[0]


def reachable(address: str, port: int, timeout_s: float = 5.0) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _executable(name: str) -> str:
    """`name` from this Python's environment (the node's virtualenv), else from PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.is_file() else name


class RayNode:
    """This node's `ray start ... --block`, in a process group of its own."""

    def __init__(self, args: Sequence[str]) -> None:
        self.args = [_executable("ray"), "start", *args, *ray_port_flags(), "--disable-usage-stats", "--block"]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, process_group=0)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=RAY_STOP_S)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


# ---- the two kinds of node ----------------------------------------------------------------------------


def _rendezvous(config: Path, name: str) -> tuple[Rendezvous, RunConfig]:
    """The fleet records of this run, and its config."""
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        raise InputError(f"${TOKEN_ENV} is not set (spotlight launch passes it as a secret)")
    cfg = load_config(config)
    if cfg.cloud.checkpoint_uri is None:
        raise InputError(f"{config}: no cloud.checkpoint_uri, where the fleet meets")
    return Rendezvous(open_store(cfg.cloud.checkpoint_uri), token, name), cfg


def _stop_reason(out: Path, since: float = 0.0) -> str | None:
    """The run's own record of its end: "finished: REASON" from summary.json's `stop_reason`, or
    None when there is no such record (missing, unreadable, not an object, no reason in it, or
    written before `since`, a wall time: an earlier session's)."""
    try:
        if (out / "summary.json").stat().st_mtime < since:
            return None
        # summary.json is ~1 KB: 1 MiB is read at most, and a deeper or larger file is a ValueError.
        summary = load_file(out / "summary.json", max_bytes=1 << 20)
        reason = summary.get("stop_reason")
    except (OSError, ValueError, AttributeError):  # AttributeError: JSON that is not an object
        return None
    return f"finished: {reason}" if isinstance(reason, str) and reason else None


def run_head(config: Path, name: str, out: Path, clock: Clock | None = None) -> int:
    clock = clock or WallClock()
    rendezvous, cfg = _rendezvous(config, name)
    try:
        prefetch(cfg)  # a model folder in a bucket: once per node, verified, resumable
    except ModelSourceError as err:  # no restart can fetch it: the run has ended
        rendezvous.publish_done(f"failed: {err}", 2, 0)
        raise
    ip = node_ip()
    ray = RayNode(["--head", "--port", str(RAY_PORT), "--node-ip-address", ip])
    train: subprocess.Popen | None = None

    def terminated(signum, frame):  # SkyPilot's cancel: the run checkpoints and stops, not done
        if train is not None and train.poll() is None:
            train.send_signal(signal.SIGTERM)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    try:
        ray.start()
        deadline = clock.now() + HEAD_START_S
        while not reachable(ip, RAY_PORT, 1.0):
            if not ray.alive() or clock.now() > deadline:
                logger.error("error: the Ray head did not start")
                return 1
            clock.sleep(1.0)
        head = rendezvous.publish_head(ip, RAY_PORT)
        logger.info(f"head generation {head.generation} at {ip}:{RAY_PORT} published in "
                    f"{rendezvous.store.uri}/fleet/head.json")
        started = time.time()
        train = subprocess.Popen([_executable("spotlight"), "train", str(config), "--address", f"{ip}:{RAY_PORT}",
                                  "--out", str(out), "--no-progress"], stdin=subprocess.DEVNULL)
        code = train.wait()
        reason = (DONE_EXIT_CODES[code] or _stop_reason(out, started)) if code in DONE_EXIT_CODES else None
        if code == 0 and reason is None:
            # An exit 0 is not an end without the run's record of it: a reward's os._exit(0) ended
            # `spotlight train` after one checkpoint of six, and "done" would have ended every node.
            logger.info("spotlight train exited 0 without summary.json's stop_reason (the run's record of its "
                        "end): not done; exit 1, so that SkyPilot restarts this head, which resumes")
            return 1
        if code in DONE_EXIT_CODES:
            rendezvous.publish_done(reason, code, head.generation)  # before Ray stops: nodes read it, then exit 0
            logger.info(f"the run has ended ({reason}): fleet/done.json written")
        else:
            logger.info(f"spotlight train exited with {code}: not done; SkyPilot restarts this head, which resumes")
        return code
    finally:
        if train is not None and train.poll() is None:
            try:
                train.wait(timeout=RAY_STOP_S)
            except subprocess.TimeoutExpired:
                train.kill()
        ray.stop()


def _exit_on_signal(signum, frame):
    raise SystemExit(128 + signum)  # through the `finally` that stops this node's Ray


def run_spot(config: Path, name: str, clock: Clock | None = None, resources: str | None = None) -> int:
    clock = clock or WallClock()
    poll_s, wait_s = env_seconds(POLL_ENV), env_seconds(HEAD_WAIT_ENV)  # before anything: a bad one is one line
    rendezvous, cfg = _rendezvous(config, name)
    prefetch(cfg)  # before this node's workers start: they load the model from the cache
    # The `spot` amount only marks the node: each spot rollout worker needs a sliver of it, so the
    # node's CPUs and GPUs bound how many land here, not this number.
    marks = resources or json.dumps({"spot": cfg.cloud.gpus_per_node})
    ip = node_ip()
    ray: RayNode | None = None
    joined: HeadRecord | None = None
    alone_since = clock.now()
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        while True:
            try:
                done, head = rendezvous.records()
            except StoreError as err:  # after the store's own retries: read again next round
                logger.info(f"cannot read the fleet records ({err}); trying again")
                done, head = None, None
            if done is not None:
                logger.info(f"the run has ended ({done.reason}): this node is done")
                return 0
            if ray is not None and not ray.alive():
                logger.info(f"this node's Ray ended (exit {ray.proc.returncode if ray.proc else '?'}); "
                            "waiting for the head")
                ray.stop()
                ray = None
            if ray is not None and head is not None and joined is not None and head.generation != joined.generation:
                logger.info(f"the head moved: generation {head.generation} at {head.address}:{head.port}; re-joining")
                ray.stop()
                ray = None
            if ray is not None:
                alone_since = clock.now()
            elif head is not None and reachable(head.address, head.port):
                ray = RayNode(["--address", f"{head.address}:{head.port}", "--node-ip-address", ip,
                               "--resources", marks])
                ray.start()
                joined = head
                alone_since = clock.now()
                logger.info(f"joined head generation {head.generation} at {head.address}:{head.port}")
            elif clock.now() - alone_since > wait_s:
                logger.info(f"no head for {wait_s:.0f} s and the run is not done: exit {HEAD_LOST}, "
                            "so that SkyPilot relaunches this node")
                return HEAD_LOST
            clock.sleep(poll_s)
    finally:
        if ray is not None:
            ray.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spotlight.fleet_node", description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=["head", "spot"])
    parser.add_argument("--config", required=True, type=Path, help="the run config (run.yaml)")
    parser.add_argument("--name", required=True, help="the run name (the job group's)")
    parser.add_argument("--out", type=Path, help="head: the run folder")
    args = parser.parse_args(argv)
    if args.role == "head" and args.out is None:
        parser.error("head needs --out")
    configure("stdout", prefixes={NAME: PREFIX, "cloud.rendezvous": PREFIX})
    try:
        return run_head(args.config, args.name, args.out) if args.role == "head" else run_spot(args.config, args.name)
    except InputError as err:  # a config, token or model source no restart can mend
        print(f"spotlight fleet: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
