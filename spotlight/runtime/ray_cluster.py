"""Joining a Ray cluster, or starting a local one for the run (the controller's side).

`connect(runtime)` returns whether this process started Ray (then `shutdown` stops it); `check(runtime)`
says, without joining, why this process could not join `runtime.address` (for checks before heavy work).

Auth (Ray 2.60's token auth: RAY_AUTH_MODE=disabled|token; the token from RAY_AUTH_TOKEN, else the
file at RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token):
- joining `runtime.address`: the controller asks the cluster's GCS first (one gRPC call, ~5 ms) whether
  it wants a token and whether it takes ours, then runs in the cluster's mode. Every mismatch is one
  ConfigError line naming the fix, in about a second — ray.init itself retries an unauthenticated
  GCS for 20 s, prints a warning a second and ends in "Failed to connect", never naming auth
  (measured); and a token driver on a cluster with auth off connects, then its actors die unstarted.
  RAY_AUTH_MODE unset here follows the cluster; set, it must match it.
- a local cluster: token auth with a token made for this run, handed to Ray's processes in their
  environment only (never written to ~/.ray/auth_token: a token there makes every later `ray start
  --head` with RAY_AUTH_MODE unset turn token auth on), on 127.0.0.1 only: its GCS, raylet, agents
  and workers listen on loopback (tests/spotlight/runtime/test_ray_auth.py checks both).
"""

from __future__ import annotations

import os
import secrets
import socket
from contextlib import contextmanager
from typing import Iterator

import ray

from spotlight.config import ConfigError, RuntimeConfig

SPOT_RESOURCE = "spot"
"""Ray custom resource that spot nodes advertise: one unit per rollout executor the node can run
(a GPU node advertises one per GPU)."""
LOCAL_SPOT_UNITS = 1000.0
"""What a local cluster (one node, the fleet replayed on it) advertises: each spot worker there takes
a sliver (`SPOT_SLIVER`), as many as a trace ever has."""
SPOT_SLIVER = 0.001

_AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
_saved_env: dict[str, str | None] | None = None
"""This process's RAY_AUTH_* before `connect` set them, put back by `shutdown`."""
_FIX_TOKEN = ("set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the cluster's token "
              "(`ray get-auth-token` on the head prints it)")


def _dialled(address: str) -> tuple[str, str] | None:
    """(the cluster's address as given, or as "auto" finds it; the address ray.init will dial), or
    None when Ray resolves `address` itself and fails fast (a `ray://` client address, an "auto"
    that finds no cluster, one Ray cannot parse). Resolved by Ray's own functions: ray.init
    rewrites 127.0.0.1, localhost and ::1 to this machine's address (`resolve_ip_for_localhost`),
    and reads "auto" from RAY_ADDRESS or the last `ray start --head` of this machine."""
    if "://" in address:
        return None
    from ray._private.services import (canonicalize_bootstrap_address, get_ray_address_from_environment,
                                       parse_address)

    try:
        given = get_ray_address_from_environment(address, None) if address == "auto" else address
    except Exception:  # noqa: BLE001 - "auto" without a cluster: ray.init says so, at once
        return None
    if not given or given in ("auto", "local"):
        return None
    try:  # ray.init raises a ValueError for these (and logs a traceback for an empty host first)
        host, port = parse_address(given) or ("", "")
    except ValueError:
        host, port = "", ""
    if not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"runtime.address: {given!r} is not an address Ray can join (expected HOST:PORT, with a "
                          "port in 1..65535, auto, or ray://HOST:PORT)")
    try:
        dial = canonicalize_bootstrap_address(given)
    except Exception:  # noqa: BLE001 - an address Ray cannot resolve: ray.init says why, at once
        return None
    return (given, dial) if dial else None


def _refused(address: str, timeout_s: float) -> str | None:
    """Why a TCP connection to `address` (host:port) fails within `timeout_s`, or None when it opens."""
    from ray._private.services import parse_address

    parsed = parse_address(address)
    if parsed is None or not str(parsed[1]).isdigit():
        return None
    try:
        socket.create_connection((parsed[0].strip("[]"), int(parsed[1])), timeout=timeout_s).close()
    except OSError as err:
        return err.strerror or str(err) or type(err).__name__
    return None


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast, at the address ray.init will dial (`_dialled`), on a cluster it cannot reach:
    ray.init retries such an address for a minute or more. A cluster whose GCS listens on
    loopback only is reachable at 127.0.0.1 but never dialled there (Ray dials this machine's
    address instead): that is said in one line, with what to start the cluster with. Measured
    with Ray 2.60: `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ray start --head --node-ip-address
    127.0.0.1` binds its GCS on 127.0.0.1 alone (ray.init hung past a minute; this says so in 2 s),
    while without that switch the same command binds every interface and is joined as usual."""
    resolved = _dialled(address)
    if resolved is None:
        return
    given, dial = resolved
    why = _refused(dial, timeout_s)
    if why is None:
        return
    if dial != given and _refused(given, timeout_s) is None:
        host = dial.rpartition(":")[0]
        raise ConfigError(f"runtime.address: the Ray cluster at {given} listens on loopback only; Ray dials it at "
                          f"this machine's address, {dial} ({why}): start it with --node-ip-address 127.0.0.2 "
                          f"(Ray keeps that one) or {host}, and pass that address")
    seen = f" (Ray dials {dial})" if dial != address else ""
    raise ConfigError(f"runtime.address: cannot join the Ray cluster at {address!r}{seen} ({why})")


def _set_auth_env(values: dict[str, str]) -> None:
    """Set RAY_AUTH_* for this process and the Ray processes it starts (the first call saves what was
    there for `shutdown`)."""
    global _saved_env
    from ray._raylet import AuthenticationTokenLoader, Config

    if _saved_env is None:
        _saved_env = {k: os.environ.get(k) for k in _AUTH_ENV}
    os.environ.update(values)
    # Ray reads RAY_AUTH_MODE once into its cached RayConfig: without a re-read, a mode set after
    # `import ray` is ignored (measured: the driver stays "disabled" and its join fails after 20 s).
    # Ray's own `_enable_token_auth` does the same.
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def _restore_auth_env() -> None:
    global _saved_env
    if _saved_env is None:
        return
    for key, value in _saved_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _saved_env = None
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def _token_source() -> str:
    """Where Ray takes this process's token from (its loader's order)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return f"RAY_AUTH_TOKEN_PATH ({os.environ['RAY_AUTH_TOKEN_PATH']})"
    return "~/.ray/auth_token"


def _token_header() -> dict[str, str]:
    """The gRPC metadata Ray would send with this process's token ({} when there is none)."""
    from ray._raylet import AuthenticationTokenLoader
    from ray.exceptions import AuthenticationError

    loader = AuthenticationTokenLoader.instance()
    loader.reset_cache()  # Ray keeps the first token it read; this process's environment may have changed
    try:
        return loader.get_token_for_http_header(ignore_auth_mode=True)
    except AuthenticationError:  # RAY_AUTH_TOKEN_PATH names a missing or empty file
        raise ConfigError(f"RAY_AUTH_TOKEN_PATH: {os.environ.get('RAY_AUTH_TOKEN_PATH')!r} cannot be "
                          "read or is empty (expected the file holding the Ray cluster's token)") from None


def _asks_gcs(gcs: str, header: dict[str, str], timeout_s: float) -> bool | None:
    """One GetClusterId call to the GCS at `gcs` with `header`: True if it answers, False if it
    refuses it as unauthenticated, None for anything else (ray.init then says what is wrong)."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with grpc.insecure_channel(gcs, options=[("grpc.enable_http_proxy", 0)]) as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s, metadata=list(header.items()))
        except grpc.RpcError as err:
            return False if err.code() == grpc.StatusCode.UNAUTHENTICATED else None
    return True


def _auth_mode(address: str, timeout_s: float = 5.0) -> str | None:
    """The RAY_AUTH_MODE to join `address` in ("disabled" or "token"; None: the probe could not tell,
    ray.init will), or a ConfigError line saying why this process cannot join."""
    mode = os.environ.get("RAY_AUTH_MODE", "").strip().lower() or None
    if mode not in (None, "disabled", "token"):
        raise ConfigError(f"RAY_AUTH_MODE: expected disabled or token (or unset), got {os.environ['RAY_AUTH_MODE']!r}")
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return None  # the probe speaks plain gRPC; ray.init knows the TLS settings
    try:
        from ray._private.services import canonicalize_bootstrap_address

        gcs = canonicalize_bootstrap_address(address)  # what ray.init will dial ("auto" resolved)
    except Exception:  # noqa: BLE001 - an address Ray cannot parse: ray.init says why
        return None
    if gcs is None:
        return None
    where = f"runtime.address: the Ray cluster at {address}"
    open_ = _asks_gcs(gcs, {}, timeout_s)
    if open_ is None:
        return None
    if open_:
        if mode == "token":  # measured: it connects, then its actors die before they start
            raise ConfigError(f"{where} has token auth off but RAY_AUTH_MODE=token here: start every node "
                              "with RAY_AUTH_MODE=token and the token, or unset RAY_AUTH_MODE here")
        return "disabled"
    if mode == "disabled":
        raise ConfigError(f"{where} requires token auth but RAY_AUTH_MODE=disabled here: unset "
                          f"RAY_AUTH_MODE and {_FIX_TOKEN}")
    header = _token_header()
    if not header:
        raise ConfigError(f"{where} requires token auth and no token was given: {_FIX_TOKEN}")
    if _asks_gcs(gcs, header, timeout_s) is False:
        raise ConfigError(f"{where} rejects the token from {_token_source()}: {_FIX_TOKEN}")
    return "token"


def check(rt: RuntimeConfig) -> None:
    """Say in one line, within seconds, why this process cannot join `rt.address` (nobody listens
    where Ray will dial it, or auth does not match), without joining: for a CLI's checks before
    any heavy work (tests/spotlight/test_input_hygiene.py: a loopback-only cluster at 127.0.0.1)."""
    if rt.kind == "ray" and rt.address and not ray.is_initialized():
        _check_reachable(rt.address)
        _auth_mode(rt.address)


@contextmanager
def _loopback_only() -> Iterator[None]:
    """Let ray.init keep node IP 127.0.0.1, on which Ray 2.60's GCS, raylet, agents and workers bind
    127.0.0.1 only (with any other node IP, 127.0.0.2 included, they bind every interface; measured
    with `ss -ltnp`). On Linux Ray rewrites 127.0.0.1 to the interface's address unless this switch,
    its own for single-machine Windows/macOS (ray-project/ray#18730), is off; it reads it at import,
    before this module can set RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER, so the constant is set instead."""
    from ray._private import ray_constants

    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def connect(rt: RuntimeConfig) -> bool:
    """Join `rt.address`, or start a local cluster when it is None. True when this started Ray."""
    if ray.is_initialized():
        return False
    if rt.address:
        _check_reachable(rt.address)
        mode = _auth_mode(rt.address)
        if mode is not None:  # unset here means "follow the cluster"; Ray itself would not
            _set_auth_env({"RAY_AUTH_MODE": mode})
        try:
            ray.init(address=rt.address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ray.exceptions.RayError) as err:
            _restore_auth_env()
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ConfigError(f"runtime.address: cannot join the Ray cluster at {rt.address!r} ({first})") from None
    else:
        # Explicit, so the run does not depend on the user's environment: Ray 2.60 with RAY_AUTH_MODE
        # unset turns token auth on and writes ~/.ray/auth_token. A per-run token keeps other users of
        # this machine, who can reach loopback too, out of the cluster; it lives in the environment
        # of this run's processes only (readable by this user alone).
        _set_auth_env({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)})
        # Every torch process gets one thread: several 2-thread processes on 2 cores spin
        # in OpenMP (measured here: a tiny-DiT update went from 0.9 s to 21 s).
        # address="local": always a new cluster, never one a `ray start` on this machine left behind.
        try:
            with _loopback_only():
                ray.init(address="local", _node_ip_address="127.0.0.1", num_cpus=os.cpu_count(),
                         resources={SPOT_RESOURCE: LOCAL_SPOT_UNITS}, include_dashboard=False,
                         log_to_driver=False, runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}})
        except BaseException:
            _restore_auth_env()
            raise
    return True


def shutdown() -> None:
    ray.shutdown()
    _restore_auth_env()
