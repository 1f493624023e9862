"""A run's results and standing, read back from its store alone: `spotlight pull URI --out DIR` and
`spotlight status URI [--json]`, from a laptop with no SSH to the head.

What the store holds is written by the head: results/ and results/status.json
(`spotlight.train.results_sync`), the `step-N/` checkpoints (`spotlight.train.checkpoint_sync`),
and a launched fleet's records fleet/head.json and fleet/done.json (read here unverified, for
display only: their HMAC is the fleet's business).

Invariants (tests/spotlight/test_results_home.py):
- A pull writes only below DIR, only files results/MANIFEST.json names (each key checked with
  `cloud.store.check_key`, so a planted manifest cannot write outside DIR), each verified by the
  store against the manifest's checksum and size; it downloads into a hidden folder beside DIR
  and renames it to DIR at the end, so a failed pull leaves no DIR behind and DIR is never half a
  run. A manifest replaced while the pull runs (the head pushed meanwhile) restarts the pull.
- Nothing read here reaches the terminal unchecked: a missing run, an object that is not the JSON
  it should be, a file missing or not matching the manifest is one `ResultsError` line naming the
  object (`spotlight: error: ...`, exit 2).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from cloud.open_store import open_store
from cloud.rendezvous import DONE_KEY, HEAD_KEY, MAX_RECORD_BYTES
from cloud.store import ChecksumMismatch, MissingKey, Store, StoreError, get_json
from schedulers.input.files import ConfigError, printable, short
from spotlight.logs import silenced
from spotlight.text import plural
from spotlight.train.checkpoint_sync import CheckpointSync, step_dir
from spotlight.checkpoints.checkpoint import own_mode
from spotlight.train.results_sync import (MANIFEST, MAX_MANIFEST_BYTES, MAX_STATUS_BYTES, RESULTS, STATUS,
                                         name_problem)

logger = logging.getLogger(__name__)

PULL_ATTEMPTS = 3
"""Times a pull starts over when the head replaces the manifest meanwhile (a push every checkpoint:
minutes apart, so a second attempt sees a stable one)."""


class ResultsError(StoreError):
    """A store whose run cannot be read back: no run there, or an object missing, not the JSON it
    should be, or not matching its manifest. The message is one line naming the object."""


# ---- reading the store's records ------------------------------------------------------------------


def _object(store: Store, key: str, max_bytes: int) -> dict[str, Any] | None:
    """The JSON object stored at `key`, None when there is none; anything else — over `max_bytes`
    (refused unread), nested too deeply, not JSON (`cloud.store.get_json`) — is a ResultsError."""
    try:
        value = get_json(store, key, max_bytes=max_bytes)
    except MissingKey:
        return None
    except ValueError as err:  # ObjectTooLarge or JsonRefused: one line naming the object already
        raise ResultsError(" ".join(str(err).split())[:300]) from None
    if not isinstance(value, dict):
        raise ResultsError(f"{store.uri}/{key}: expected a JSON object, got {type(value).__name__}")
    return value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# What each displayed field must be; a record whose field is not that is damaged (never a traceback).
_CHECKS = {"integer": _integer, "number": _number, "text": lambda v: isinstance(v, str),
           "bool": lambda v: isinstance(v, bool)}
_STATUS_FIELDS = {"run": "text", "iteration": "integer", "steps": "integer", "reward_mean": "number?",
                  "cost_usd": "number?", "budget_usd": "number?", "cost_rate_usd_h": "number?",
                  "checkpoint": "integer?", "updated_at": "number", "finished": "bool", "stop_reason": "text?"}
_HEAD_FIELDS = {"run": "text", "generation": "integer", "address": "text", "port": "integer", "published_at": "number"}
_DONE_FIELDS = {"run": "text", "reason": "text", "exit_code": "integer", "generation": "integer", "at": "number"}


def _check_fields(where: str, record: dict[str, Any], fields: dict[str, str]) -> dict[str, Any]:
    for name, kind in fields.items():
        optional = kind.endswith("?")
        value = record.get(name)
        if not (optional and value is None) and not _CHECKS[kind.rstrip("?")](value):
            raise ResultsError(f"{where}: {name}: expected {'null or ' if optional else ''}{kind.rstrip('?')}, "
                               f"got {json.dumps(value)[:60]}")
    return record


def _status(store: Store) -> dict[str, Any] | None:
    status = _object(store, STATUS, MAX_STATUS_BYTES)
    if status is None:
        return None
    where = f"{store.uri}/{STATUS}"
    _check_fields(where, status, _STATUS_FIELDS)
    for group in ("nodes", "workers"):
        counts = status.get(group)
        if not (isinstance(counts, dict) and all(_integer(counts.get(k)) for k in ("ondemand", "spot"))):
            raise ResultsError(f"{where}: {group}: expected {{\"ondemand\": N, \"spot\": N}}, "
                               f"got {json.dumps(counts)[:60]}")
    return status


def _fleet_record(store: Store, key: str, fields: dict[str, str]) -> dict[str, Any] | None:
    """The record of fleet/head.json or fleet/done.json ({"record": {...}, "hmac": ...}), unverified."""
    signed = _object(store, key, MAX_RECORD_BYTES)
    if signed is None:
        return None
    if not isinstance(signed.get("record"), dict):
        raise ResultsError(f"{store.uri}/{key}: expected {{\"record\": {{...}}, \"hmac\": ...}}")
    return _check_fields(f"{store.uri}/{key}: record", signed["record"], fields)


def read_manifest(store: Store) -> dict[str, Any] | None:
    """results/MANIFEST.json, checked (keys, sizes, checksums), or None when there is none."""
    manifest = _object(store, MANIFEST, MAX_MANIFEST_BYTES)
    if manifest is None:
        return None
    where = f"{store.uri}/{MANIFEST}"
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise ResultsError(f"{where}: expected \"files\": {{PATH: {{\"size\", \"checksum\"}}}} "
                           "naming at least one file")
    for rel, want in files.items():
        why = name_problem(rel)  # a planted manifest never writes outside DIR
        if why is not None:
            raise ResultsError(f"{where}: names {rel[:100]!r}, {why}")
        if not (isinstance(want, dict) and _integer(want.get("size")) and want["size"] >= 0
                and isinstance(want.get("checksum"), str)):
            raise ResultsError(f"{where}: entry {rel[:100]!r} lacks an integer size and a checksum")
    if not isinstance(manifest.get("finished"), bool) or not (manifest.get("stop_reason") is None
                                                              or isinstance(manifest["stop_reason"], str)):
        raise ResultsError(f"{where}: expected \"finished\": true|false and \"stop_reason\": null or text")
    return manifest


def _no_run(store: Store) -> ResultsError:
    root = getattr(store, "root", None)  # a folder store: is it a run folder rather than a run's store?
    if isinstance(root, Path) and all((root / name).is_file() for name in ("config.yaml", "metrics.jsonl")):
        return ResultsError(f"{short(store.uri)}: a run folder, not a run's store (status and pull read the store a "
                            f"run's --checkpoint-uri named); this run's records are here: summary.json, metrics.jsonl, "
                            "cost.json")
    return ResultsError(f"{store.uri}: no run here (no {MANIFEST}, no {STATUS}, no step-*/ checkpoints; "
                        "expected the URI a run's cloud.checkpoint_uri named)")


# ---- spotlight status ---------------------------------------------------------------------------


def run_status(store: Store, now: float) -> dict[str, Any]:
    """Where the run in `store` stands, as one JSON-able object: `status` (results/status.json),
    `results` (the manifest's summary), `checkpoints` (stored, newest first), `last_checkpoint`,
    `finished`, `stop_reason`, `updated_ago_s` (against `now`, unix seconds), and the fleet's
    `head` and `done` records. A store with none of these is a ResultsError."""
    status = _status(store)
    manifest = read_manifest(store)
    with silenced():  # a checkpoint it skips is the run's to report, not `status`'s
        checkpoints = CheckpointSync(store).stored()
    head, done = _fleet_record(store, HEAD_KEY, _HEAD_FIELDS), _fleet_record(store, DONE_KEY, _DONE_FIELDS)
    if status is None and manifest is None and not checkpoints and head is None and done is None:
        raise _no_run(store)
    results = None
    if manifest is not None:
        files = manifest["files"]
        results = {"files": len(files), "bytes": sum(f["size"] for f in files.values()),
                   "final": any(rel.startswith("final/") for rel in files), "finished": manifest["finished"],
                   "updated_at": manifest.get("updated_at") if _number(manifest.get("updated_at")) else None}
    finished = bool((manifest or {}).get("finished") or (status or {}).get("finished"))
    stop_reason = (manifest or {}).get("stop_reason") or (status or {}).get("stop_reason")
    times = [t for t in ((status or {}).get("updated_at"), (results or {}).get("updated_at")) if t is not None]
    return {"uri": store.uri, "run": (status or head or done or {}).get("run"), "finished": finished,
            "stop_reason": stop_reason, "status": status, "results": results, "checkpoints": checkpoints,
            "last_checkpoint": checkpoints[0] if checkpoints else None,
            "updated_ago_s": now - max(times) if times else None, "head": head, "done": done, "now": now}


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)  # a head's clock a little ahead of this one
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} days ago"


def _kinds(counts: dict[str, int]) -> str:
    return f"{counts['ondemand']} on-demand, {counts['spot']} spot"


def format_status(view: dict[str, Any]) -> str:
    """`run_status`'s object as the lines `spotlight status` prints."""
    s, r, now = view["status"], view["results"], view["now"]
    lines = [f"run {view['run'] or '(unnamed)'} in {view['uri']}"]
    reason = f" ({view['stop_reason']})" if view["stop_reason"] else ""
    lines.append(f"  state:       {'finished' + reason if view['finished'] else 'not finished'}")
    if s is not None:
        lines.append(f"  iteration:   {s['iteration']} of {s['steps']} done")
        if s["reward_mean"] is not None:
            lines.append(f"  reward:      {s['reward_mean']:.4g} (mean of the newest iteration)")
        if s["cost_usd"] is not None:
            extra = [f"budget ${s['budget_usd']:.2f}" if s["budget_usd"] is not None else "",
                     f"${s['cost_rate_usd_h']:.2f}/h" if s["cost_rate_usd_h"] is not None else ""]
            more = ", ".join(e for e in extra if e)
            lines.append(f"  cost:        ${s['cost_usd']:.2f} so far" + (f" ({more})" if more else ""))
        lines.append(f"  live nodes:  {_kinds(s['nodes'])} (workers: {_kinds(s['workers'])})")
    else:
        lines.append(f"  iteration:   unknown (no {STATUS} yet)")
    last = view["last_checkpoint"]
    lines.append(f"  checkpoint:  iteration {last} ({step_dir(last)}/)" if last is not None
                 else "  checkpoint:  none stored yet")
    if r is not None:
        final = ", final/ included" if r["final"] else ", no final/ yet"
        lines.append(f"  results:     {plural(r['files'], 'file')}, {r['bytes'] / 1e6:.1f} MB in {RESULTS}/{final}")
    else:
        lines.append("  results:     none stored yet (they follow the first stored checkpoint)")
    if view["updated_ago_s"] is not None:
        lines.append(f"  updated:     {_ago(view['updated_ago_s'])}")
    if view["head"] is not None:
        h = view["head"]
        lines.append(f"  head:        generation {h['generation']} at {h['address']}:{h['port']}, "
                     f"published {_ago(now - h['published_at'])}{_UNVERIFIED}")
    if view["done"] is not None:
        d = view["done"]
        lines.append(f"  done:        {d['reason']} (exit code {d['exit_code']}, generation {d['generation']}, "
                     f"{_ago(now - d['at'])}){_UNVERIFIED}")
    # Everything here was read from the store, which anyone who can write to it may have written:
    # a newline or an escape sequence in a run name, an address or a reason shows as text.
    return "\n".join(printable(line) for line in lines)


_UNVERIFIED = "; unverified (signed with the fleet's token, which status does not hold)"
"""After a fleet record's line: `spotlight status` cannot check its signature (the nodes do)."""


# ---- spotlight pull -----------------------------------------------------------------------------


class _Replaced(Exception):
    """An object of the manifest no longer matches it, and the manifest itself changed: a push ran."""


def pull(store: Store, out: Path, progress: bool = True) -> dict[str, Any]:
    """Fetch the results of the run in `store` into the new folder `out` (module docstring); returns
    {"files", "bytes", "finished", "stop_reason"}. `out` must not exist, or be an empty folder."""
    out = Path(out)
    if out.is_symlink():  # a link's target (or a dangling link) is not the new folder asked for
        raise ConfigError(f"--out: {out} is a symbolic link (expected a new folder for the results)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out: {out} exists and is not an empty folder (expected a new folder for the results)")
    above = next((p for p in out.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise ConfigError(f"--out: {out} is inside the file {above} (expected a folder)")
    for _ in range(PULL_ATTEMPTS):
        manifest = read_manifest(store)
        if manifest is None:
            with silenced():
                stored = CheckpointSync(store).stored()
            if not stored and _object(store, STATUS, MAX_STATUS_BYTES) is None:
                raise _no_run(store)
            raise ResultsError(f"{store.uri}: no {MANIFEST} yet (results follow the first stored checkpoint"
                               f"{f'; the newest is iteration {stored[0]}' if stored else ''})")
        _remove_leftovers(out)
        staging = out.parent / f".{out.name}.pull-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:  # before the first byte: a place this cannot write in is refused now, not after the download
            staging.mkdir(parents=True)
        except OSError as err:
            raise ConfigError(f"--out: {out}: cannot write there ({err.strerror or type(err).__name__}); "
                              "nothing was downloaded") from None
        try:
            _download(store, manifest, staging, progress)
        except _Replaced:
            continue
        try:
            if out.exists():
                out.rmdir()  # empty: checked above
            staging.rename(out)
        except OSError as err:  # something was put into --out meanwhile
            raise ConfigError(f"--out: {out}: cannot put the pulled results there ({err.strerror})") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        files = manifest["files"]
        return {"files": len(files), "bytes": sum(f["size"] for f in files.values()),
                "finished": manifest["finished"], "stop_reason": manifest.get("stop_reason")}
    raise ResultsError(f"{store.uri}/{MANIFEST}: replaced {PULL_ATTEMPTS} times while pulled; try again")


def _remove_leftovers(out: Path) -> None:
    """Remove the staging folders (`.OUT.pull-PID-*`) of earlier pulls into `out` whose process is
    gone, saying how much that freed: a killed pull left 86 MB in 21,712 files that no later pull
    removed. A folder of a pull still running (its process alive) is left alone."""
    if not out.parent.is_dir():
        return
    for staging in out.parent.glob(f".{out.name}.pull-*"):
        pid = staging.name.rpartition(".pull-")[2].split("-")[0]
        if not staging.is_dir() or staging.is_symlink() or (pid.isdigit() and _alive(int(pid))):
            continue
        files = [p for p in staging.rglob("*") if p.is_file() and not p.is_symlink()]
        size = sum(p.stat().st_size for p in files)
        shutil.rmtree(staging, ignore_errors=True)
        logger.info(f"removed {staging.name}, what a pull that was killed left ({plural(len(files), 'file')}, "
                    f"{size / 1e6:.1f} MB)")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


PUSH_WAIT_S = 120.0
"""How long a pull of a run that is not finished waits for the manifest of a push in progress: a push
writes its files first and its manifest last, so a file replaced under an unchanged manifest is
either a push under way (a multi-GB final/ takes minutes) or damage."""
PUSH_POLL_S = 1.0


def _pushed_meanwhile(store: Store, manifest: dict[str, Any]) -> bool:
    """Whether the head pushed since `manifest` was read (its manifest changed): at once, or — for a
    run not finished, whose head may be pushing — within `PUSH_WAIT_S`, said on stderr while it waits."""
    if read_manifest(store) != manifest:
        return True
    if manifest["finished"]:
        return False
    print(f"pull: {store.uri}/{RESULTS}: a file changed under its manifest; waiting up to {PUSH_WAIT_S:g} s for "
          "the push in progress to store its manifest", file=sys.stderr, flush=True)
    deadline = time.monotonic() + PUSH_WAIT_S
    while time.monotonic() < deadline:
        time.sleep(PUSH_POLL_S)
        if read_manifest(store) != manifest:
            return True
    return False


def _download(store: Store, manifest: dict[str, Any], staging: Path, progress: bool) -> None:
    """Every file `manifest` names into `staging` (made already), verified; on any failure `staging`
    is removed."""
    from tqdm import tqdm

    files = manifest["files"]
    bar = tqdm(total=sum(f["size"] for f in files.values()), desc="pull", unit="B", unit_scale=True,
               disable=not progress, file=sys.stderr)
    mode = own_mode()
    try:
        for rel, want in files.items():
            key, path = f"{RESULTS}/{rel}", staging / rel
            bar.set_postfix_str(printable(Path(rel).name[:40]), refresh=False)
            try:
                # The object's size first (one HEAD): a manifest declaring 10 bytes for a 1 GiB object
                # had the whole GiB written before the refusal.
                try:
                    size: int | None = store.stat(key).size
                except MissingKey:
                    raise
                except StoreError:  # a stat the store cannot give (no checksum of ours): get_file verifies
                    size = None
                if size is not None and size != want["size"]:
                    if _pushed_meanwhile(store, manifest):  # start over on the new manifest
                        raise _Replaced from None
                    raise ResultsError(f"{store.uri}/{key}: named by {MANIFEST} but holds {size} bytes, "
                                       f"not {want['size']} (damaged or replaced): nothing of it written")
                store.get_file(key, path, checksum=want["checksum"])
            except (MissingKey, ChecksumMismatch) as err:
                if _pushed_meanwhile(store, manifest):  # start over on the new manifest
                    raise _Replaced from None
                what = ("is missing" if isinstance(err, MissingKey)
                        else "does not match its checksum (damaged or replaced)")
                raise ResultsError(f"{store.uri}/{key}: named by {MANIFEST} but {what}") from None
            except OSError as err:  # "a" and "a/b" both named, a full disk: nothing half-pulled stays
                raise ResultsError(f"{store.uri}/{key}: cannot write {path.relative_to(staging)} "
                                   f"({type(err).__name__}: {str(err)[:80]})") from None
            size = path.stat().st_size
            if size != want["size"]:
                raise ResultsError(f"{store.uri}/{key}: {size} bytes, {MANIFEST} says {want['size']} (truncated?)")
            path.chmod(mode)  # the modes the run gives its files, whatever the object's were
            bar.update(size)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        bar.close()


# ---- the commands -------------------------------------------------------------------------------


def cmd_pull(args: argparse.Namespace) -> int:
    out = Path(args.out)
    store = open_store(args.uri)
    got = pull(store, out, progress=not args.no_progress)
    state = (f"finished ({got['stop_reason']})" if got["finished"] else "not finished: the newest stored results")
    print(printable(f"pulled {plural(got['files'], 'file')} ({got['bytes'] / 1e6:.1f} MB) of {store.uri}/{RESULTS} "
                    f"into {out}/; the run is {state}"))  # the stop reason is the store's text
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    view = run_status(open_store(args.uri), time.time())
    print(json.dumps(view) if args.json else format_status(view))
    return 0
