"""A run's results mirrored to its store (`cloud.checkpoint_uri`), so they outlive the head that
wrote them: the cloud deletes the head's disk when a launched run ends.

Under the store's root, beside the `step-N/` checkpoints (`spotlight.train.checkpoint_sync`):
    results/metrics.jsonl, summary.json, config.yaml, cost.json   (the run's records: `run_files`)
    results/tb/...                      TensorBoard events
    results/eval/...                    evaluation samples (a DiT's grids, an LLM's completions)
    results/final/...                   the trained model (or LoRA adapter), pushed at the end only
    results/MANIFEST.json               {"files": {PATH: {"size", "checksum"}}, "finished": bool,
                                         "stop_reason": str | null, "updated_at": unix time}
    results/status.json                 where the run stands (`status_record`), one small object

Invariants:
- MANIFEST.json is written after every file it names, and each file's "checksum" is the one the
  store returned when it stored the file (nothing is hashed here; `Store.get_file(checksum=...)`
  verifies a download natively). So a reader that finds a file not matching the manifest knows the
  object was replaced (a push under way: read the manifest again) or damaged.
- A push uploads a file only when its (size, mtime_ns) changed since this process last stored it;
  a file that changed while it was being sent is left out of that manifest and sent again by the
  next push, so a manifest never names bytes it did not see stored.
- A resumed run (`keep_stored`) keeps the stored manifest's entries of files its run folder lacks,
  as the store holds those objects now (`ResultsSync._carried`):
  the TensorBoard events and samples an earlier head wrote stay named.
- `finished` is true only in the manifest of the push after final/ and summary.json were written.
The reader is `spotlight.run_results` (`spotlight pull`, `spotlight status`); tests/spotlight/test_results_home.py
checks all of this.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cloud.cost import MAX_SPENT_BYTES, SPENT_FILE, Spent, spent_of
from cloud.store import MissingKey, Store, StoreError, check_key, get_json
from schedulers.input.files import ConfigError
from spotlight.train import run_files

logger = logging.getLogger(__name__)

RESULTS = "results"
"""The store prefix of a run's results."""
MANIFEST = f"{RESULTS}/MANIFEST.json"
STATUS = f"{RESULTS}/status.json"
MAX_MANIFEST_BYTES = 64 << 20
"""Most bytes of results/MANIFEST.json read back (64 MiB): an entry is ~150 bytes, so ~400,000
files — a long run's TensorBoard events and evaluation samples are thousands. A larger object is
refused unread (`cloud.store.get_json`)."""
MAX_STATUS_BYTES = 1 << 20
"""Most bytes of results/status.json read back (1 MiB); it is ~400 bytes."""
FOLDERS = ("tb", "eval")
"""Run-folder folders mirrored during the run; `final` joins them at the end."""
FINAL = "final"
RESERVED = frozenset({"MANIFEST.json", "status.json"})
"""Top-level names the results' own records use: never a run-folder file's key."""


def result_files(out: Path, final: bool) -> list[str]:
    """The run-folder paths (relative, '/'-separated) that are the run's results: its records
    (`spotlight.train.run_files.RUN_FILES`), the files under tb/ and eval/, and under final/ when
    `final` — regular files of this user only, no symlink followed (`run_files`)."""
    files = run_files.top_level(out)
    for folder in (*FOLDERS, FINAL) if final else FOLDERS:
        files += run_files.tree(out, folder)
    return files


def is_result(rel: str) -> bool:
    """Whether run-folder path `rel` is one `result_files` can name: what a pull may write."""
    parts = rel.split("/")
    if len(parts) == 1:
        return rel in run_files.RUN_FILES
    return parts[0] in (*FOLDERS, FINAL) and not any(p.startswith(".") or not p for p in parts)


def name_problem(rel: Any) -> str | None:
    """Why `rel`, a name in results/MANIFEST.json, is not one a run writes (None: it is): the one
    rule for both ends — a pull never writes outside its folder, and a resumed push never carries a
    planted name over (`"tb/../../../../etc/x"` made every resume end in a traceback)."""
    try:
        check_key(rel)
    except (ValueError, TypeError):
        return "not a relative path inside the run folder"
    if rel in RESERVED:
        return "a name of the results' own records"
    if not is_result(rel):  # only what a run writes: its records, tb/, eval/, final/
        return "which is not a file a run writes"
    return None


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


class ResultsSync:
    """Pushes run folder `out`'s results to `store` (module docstring). `keep_stored`: carry the
    stored manifest's entries over (a resumed run). It logs one line per final push and a warning
    per failure; `now` is the wall clock (unix seconds) of `updated_at`."""

    def __init__(self, store: Store, out: Path, keep_stored: bool = False,
                 now: Callable[[], float] = time.time) -> None:
        self.store = store
        self.out = Path(out)
        self.keep_stored = keep_stored
        self.now = now
        self.entries: dict[str, dict[str, Any]] | None = None
        """What the store holds, by run-folder path (None until the first push reads it)."""
        self._sent: dict[str, tuple[int, int]] = {}
        """(size, mtime_ns) of each file when this process stored it."""
        self._status_failed = False

    def push(self, final: bool = False, stop_reason: str | None = None, must: bool = False) -> dict[str, Any] | None:
        """Store the results that changed, then the manifest; with `final`, final/ too and the
        manifest says `finished` (with `stop_reason`). Returns {"files", "sent", "bytes", "seconds"}.
        A store failure (after the store's retries) raises StoreError when `must`, else is logged
        and returns None: the next push sends what this one did not."""
        start = time.perf_counter()
        try:
            sent, size = self._upload(final)
            manifest = {"files": dict(sorted(self.entries.items())), "finished": final, "stop_reason": stop_reason,
                        "updated_at": self.now()}
            self.store.put(MANIFEST, json.dumps(manifest, indent=1).encode())  # last: names only stored files
        except StoreError as err:
            if must:
                raise
            logger.warning(f"results not stored ({err}); they stay in {self.out}, the next push retries")
            return None
        assert self.entries is not None
        seconds = time.perf_counter() - start
        if final:
            logger.info(f"results stored in {self.store.uri}/{RESULTS} ({len(self.entries)} files, "
                        f"{sent} sent, {size / 1e6:.1f} MB, {seconds:.2f} s)")
        return {"files": len(self.entries), "sent": sent, "bytes": size, "seconds": seconds}

    def _upload(self, final: bool) -> tuple[int, int]:
        """Send the files that changed; returns (files sent, their bytes)."""
        files = result_files(self.out, final)
        if self.entries is None:
            self.entries = self._carried(set(files)) if self.keep_stored else {}
        sent = size = 0
        for rel in files:
            path = self.out / rel
            before = _stamp(path)
            if self._sent.get(rel) == before:
                continue
            checksum = self.store.put_file(f"{RESULTS}/{rel}", path)
            if _stamp(path) != before:  # written to while sent: the next push sends it whole
                self.entries.pop(rel, None)
                self._sent.pop(rel, None)
                continue
            self.entries[rel] = {"size": before[0], "checksum": checksum}
            self._sent[rel] = before
            sent, size = sent + 1, size + before[0]
        return sent, size

    def _carried(self, here: set[str]) -> dict[str, dict[str, Any]]:
        """The stored manifest's entries, those of files this run folder lacks as the store holds
        them now: an earlier head killed between sending a file and its manifest left an object
        newer than its entry (a whole one: a put is atomic), so each is looked up again (one stat
        each) and one that is gone is dropped. Seen in a launched-fleet test whose head was killed
        mid-push: the pull then refused the earlier head's TensorBoard events as replaced."""
        carried = {}
        for rel, entry in self._stored().items():
            if rel in here:  # sent again by this push
                carried[rel] = entry
                continue
            try:
                now = self.store.stat(f"{RESULTS}/{rel}")
            except MissingKey:
                continue
            carried[rel] = {"size": now.size, "checksum": now.checksum}
        return carried

    def _stored(self) -> dict[str, dict[str, Any]]:
        """The stored manifest's entries, or none when it is missing or unreadable (logged)."""
        try:
            files = get_json(self.store, MANIFEST, max_bytes=MAX_MANIFEST_BYTES)["files"]
            if not (isinstance(files, dict) and all(isinstance(v, dict) for v in files.values())):
                why = "its files are not a mapping"
            elif (bad := next(((rel, p) for rel in files if (p := name_problem(rel))), None)) is not None:
                why = f"it names {str(bad[0])[:100]!r}, {bad[1]}"
            else:
                return files
        except MissingKey:
            return {}
        except (ValueError, KeyError, TypeError) as err:
            why = f"{type(err).__name__}: {err}"
        logger.warning(f"{self.store.uri}/{MANIFEST} unreadable ({why}); the results are stored anew")
        return {}

    def write_status(self, status: dict[str, Any]) -> bool:
        """Store `status` (a `status_record`) with `updated_at` (now) as results/status.json: one
        small put. A failure is logged once per run of failures and returns False; the next call
        tries anyway."""
        try:
            self.store.put(STATUS, json.dumps({**status, "updated_at": self.now()}).encode())
        except StoreError as err:
            if not self._status_failed:
                logger.warning(f"run status not stored ({err}); it is tried again every iteration")
            self._status_failed = True
            return False
        self._status_failed = False
        return True


def fleet_counts(engine: Any) -> dict[str, dict[str, int]]:
    """Live nodes and workers by kind of a `schedulers.fleet.FleetEngine`: {"nodes": {"ondemand",
    "spot"}, "workers": {"ondemand", "spot"}}. Reads the engine's own tables, asks no one."""
    nodes = [n for n in engine.nodes.values() if n.alive]
    workers = list(engine.workers.values())
    return {"nodes": {"ondemand": sum(not n.spot for n in nodes), "spot": sum(n.spot for n in nodes)},
            "workers": {"ondemand": sum(not w.spot for w in workers), "spot": sum(w.spot for w in workers)}}


def stored_spent(store: Store) -> Spent:
    """What the run whose results `store` holds has spent, as its heads stored it: results/cost.json
    (pushed with each stored checkpoint) or, when larger, results/status.json's `cost_usd` (put after
    every iteration). Nothing stored: `Spent()`. A run resumed in a fresh folder starts its meter from
    this, so a budget is the whole run's wherever it resumes (issue 42). A record that cannot be read
    is a ConfigError naming it: counting nothing would let the budget be overspent."""
    key = f"{RESULTS}/{SPENT_FILE}"
    try:
        data = get_json(store, key, max_bytes=MAX_SPENT_BYTES)
    except MissingKey:
        data = {"cost_usd": 0.0}
    except ValueError as err:  # too large, too deep, not JSON: the error's line names the object
        raise ConfigError(f"{err}; fix or delete it") from None
    spent = spent_of(data, f"{store.uri}/{key}")
    try:
        status = get_json(store, STATUS, max_bytes=MAX_STATUS_BYTES)
    except (MissingKey, ValueError):  # the status is a progress note: the checkpointed cost.json counts
        return spent
    cost = status.get("cost_usd") if isinstance(status, dict) else None
    if isinstance(cost, (int, float)) and not isinstance(cost, bool) and math.isfinite(cost) and cost > spent.cost_usd:
        return Spent(float(cost), spent.startup_s)
    return spent


def status_record(run: str, out: Path, done: int, steps: int, reward_mean: float | None, cost: dict[str, Any],
                  fleet: dict[str, dict[str, int]], checkpoint: int | None, finished: bool = False,
                  stop_reason: str | None = None) -> dict[str, Any]:
    """results/status.json: run name and run folder (on the head), iterations `done` of `steps`,
    the newest iteration's reward mean, the cost meter's figures (`CostControl.summary`: cost_usd,
    budget_usd, cost_rate_usd_h, ...), live nodes and workers by kind (`fleet_counts`), the newest
    stored checkpoint's iteration (None: none yet), and whether the run has finished and why.
    `ResultsSync.write_status` adds `updated_at` (unix seconds). A non-finite reward is null (strict
    JSON has no NaN)."""
    finite = reward_mean if reward_mean is not None and math.isfinite(reward_mean) else None
    return {"run": run, "out": str(out), "iteration": done, "steps": steps, "reward_mean": finite,
            "cost_usd": cost.get("cost_usd"), "budget_usd": cost.get("budget_usd"),
            "cost_rate_usd_h": cost.get("cost_rate_usd_h"), **fleet, "checkpoint": checkpoint,
            "finished": finished, "stop_reason": stop_reason}
