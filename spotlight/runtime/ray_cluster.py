"""Joining a Ray cluster, or starting a local one for the run (the controller's side).

`connect(runtime)` returns whether this process started Ray (then `shutdown` stops it).
"""

from __future__ import annotations

import os
import socket

import ray

from spotlight.config import ConfigError, RuntimeConfig

SPOT_RESOURCE = "spot"
"""Ray custom resource that spot nodes advertise: one unit per rollout executor the node can run
(a GPU node advertises one per GPU)."""
LOCAL_SPOT_UNITS = 1000.0
"""What a local cluster (one node, the fleet replayed on it) advertises: each spot worker there takes
a sliver (`SPOT_SLIVER`), as many as a trace ever has."""
SPOT_SLIVER = 0.001


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on a `host:port` nobody listens on: ray.init retries such an address for minutes."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # "auto", "ray://...": Ray resolves these itself and fails fast
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise ConfigError(f"runtime.address: cannot join the Ray cluster at {address!r} "
                          f"({err.strerror or err})") from None


def connect(rt: RuntimeConfig) -> bool:
    """Join `rt.address`, or start a local cluster when it is None. True when this started Ray."""
    if ray.is_initialized():
        return False
    if rt.address:
        _check_reachable(rt.address)
        try:
            ray.init(address=rt.address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ray.exceptions.RayError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(f"runtime.address: cannot join the Ray cluster at {rt.address!r} ({first})") from None
    else:
        # Every torch process gets one thread: several 2-thread processes on 2 cores spin
        # in OpenMP (measured here: a tiny-DiT update went from 0.9 s to 21 s).
        # address="local": always a new cluster, never one a `ray start` on this machine left behind.
        ray.init(address="local", num_cpus=os.cpu_count(), resources={SPOT_RESOURCE: LOCAL_SPOT_UNITS},
                 include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
    return True


def shutdown() -> None:
    ray.shutdown()
