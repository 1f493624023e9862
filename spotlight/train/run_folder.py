"""A run's folder (--out) and everything `spotlight train` keeps there besides what the learner
writes: the lock (`run_lock`), whether its checkpoints are this run's (`resume_identity`), the
store's copies of its checkpoints (`checkpoint_sync`), results and status (`results_sync`) and the
running rollout's committed state (`inflight`), the metrics rows kept up to a resumed checkpoint
(metrics.jsonl) and TensorBoard's events (tb/). The trainer (`spotlight.train.trainer`) sequences;
this holds the folder's jobs.

Invariants: bad input leaves nothing behind (`check` creates nothing; a folder `acquire` made and
left empty goes with `release`); a metrics row is written before the checkpoint that covers it, so a
resumed run keeps exactly the rows before its checkpoint (`truncate_metrics`; tests/spotlight/train/test_trainer.py).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

from cloud.bounded_json import load_file, loads
from cloud.store import Store
from schedulers.fleet import FleetEngine
from spotlight.checkpoints import checkpoint
from spotlight.checkpoints.resume_identity import differences, mismatch
from spotlight.config import ConfigError, RunConfig, load_config
from spotlight.text import plural
from spotlight.train.checkpoint_sync import CheckpointSync
from spotlight.train.inflight import InflightStore
from spotlight.train.results_sync import ResultsSync, fleet_counts, status_record
from spotlight.train.run_lock import LOCK, RunLock
from spotlight.waiting import waiting

logger = logging.getLogger(__name__)

ROW_BYTES = 1 << 20
"""The longest metrics or evaluation row read back (a row is ~1 KB; a planted one is refused, not parsed)."""
SUMMARY_BYTES = 1 << 20
"""The largest summary.json read back (`RunFolder.completed`; one is ~2 KB)."""


class RunFolder:
    """Construction is cheap and touches nothing; `check` and `completed` only read."""

    def __init__(self, cfg: RunConfig, path: Path) -> None:
        self.cfg, self.out = cfg, Path(path)
        self.lock: RunLock | None = None
        """This process's hold on the folder, from `acquire` until `release`."""
        self.sync: CheckpointSync | None = None
        """The --checkpoint-uri mirror of checkpoints/, when there is one."""
        self._pushed = 0  # the newest iteration the mirror holds
        self.results: ResultsSync | None = None
        """The --checkpoint-uri mirror of the run's results and status, when there is a store."""
        self.inflight: InflightStore | None = None
        """Where a running rollout's committed state goes (with --checkpoint-uri and inflight_every_s > 0)."""
        self.writer: Any = None
        """TensorBoard's writer of tb/, between `open_tensorboard` and `close_tensorboard`."""

    # ---- whose folder ----------------------------------------------------------------------------

    def check(self) -> None:
        """Refuse an --out that is not a folder, whose newest sound checkpoint is another run's
        (`resume_identity`: a changed step count or micro-batch is fine), or that holds more
        iterations than train.steps asks for (the run cannot shrink: nothing would be trained).
        Creates, moves and renames nothing; a folder merely named step-N is not a checkpoint."""
        if self.out.exists() and not self.out.is_dir():
            raise ConfigError(f"--out {self.out}: exists and is not a folder")
        found = checkpoint.newest_sound(self.out / "checkpoints")
        if found is None:
            return
        newest, state = found
        why = self.not_this_run(state, self.out / "config.yaml")
        if why is not None:
            raise ConfigError(f"{self.out}: holds checkpoints of another run ({newest.path.name}: {why}); "
                              "use a new --out folder, or delete its checkpoints/ to start over")
        if newest.step > self.cfg.train.steps:
            raise ConfigError(self.more_than_asked(newest.step))

    def not_this_run(self, state: dict[str, Any], saved: Path) -> str | None:
        """Why a checkpoint whose state.json is `state`, beside config file `saved` (a run folder's,
        or a stored checkpoint's), is not this run's; None when it is. A checkpoint written before
        resume identities is judged by `saved` alone, and refused without it."""
        stored = state.get("identity")
        if stored is None and not saved.is_file():
            return "it records no resume identity and there is no config.yaml to compare"
        why = None if stored is None else mismatch(stored, self.cfg)
        if stored is not None and why is None:
            return None
        try:
            changed = differences(load_config(saved).to_dict(), self.cfg) if saved.is_file() else []
        except ConfigError:
            if stored is None:  # the only evidence there is: an unreadable one refuses the folder
                raise
            changed = []  # the identity has decided; config.yaml only names the fields
        named = ", ".join(changed)
        if stored is None:
            return f"config.yaml differs in {named}" if changed else None
        return f"{why} ({named})" if changed else why

    def truncate_metrics(self, step: int) -> None:
        """Keep the rows of iterations before the resumed checkpoint: later ones are about to be
        redone. A row is written before the checkpoint that covers its iteration, so every kept
        iteration has its row; a line cut short by a kill is dropped with it."""
        path = self.out / "metrics.jsonl"
        if not path.is_file():
            return
        rows = []
        for line in path.read_text(errors="replace").splitlines():
            try:
                row = loads(line, max_bytes=ROW_BYTES, what="metrics.jsonl row")
                keep = isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] < step
            except ValueError:
                keep = False
            if keep:
                rows.append(line)
        path.write_text("".join(r + "\n" for r in rows))

    def completed(self) -> dict[str, Any] | None:
        """The stored summary when --out already holds this whole run: its newest sound checkpoint
        is this run's (`not_this_run`) at exactly `train.steps`, summary.json says every iteration
        ran (not a budget or deadline stop), and final/ is there. Then there is nothing to train, and
        `spotlight train` says so without starting Ray or the meter (a re-run used to start the
        cluster and its actors, do nothing, and bill their seconds). None otherwise: a new run, a
        resumable one, one asked for more iterations (`--steps`), or another run's folder, which
        `check` refuses with its reason. Reads only: no lock, no folder made."""
        steps = self.cfg.train.steps
        found = checkpoint.newest_sound(self.out / "checkpoints") if self.out.is_dir() else None
        if found is None or found[0].step != steps or not (self.out / "final").is_dir():
            return None
        try:
            if self.not_this_run(found[1], self.out / "config.yaml") is not None:
                return None
            summary = load_file(self.out / "summary.json", max_bytes=SUMMARY_BYTES)
        except (OSError, ValueError, ConfigError):
            return None  # unreadable or damaged: the full path says what is wrong, or redoes the end
        done = isinstance(summary, dict) and summary.get("steps") == steps and summary.get("stop_reason") == "steps"
        return summary if done else None

    def more_than_asked(self, done: int) -> str:
        """The error of a run folder that already holds more iterations than train.steps asks for."""
        steps = self.cfg.train.steps
        return (f"{self.out}: already holds {plural(done, 'iteration')}, more than the {steps} asked for "
                f"(--steps or train.steps), so nothing was trained: ask for {done} or more to train on from "
                "there, or use a new --out folder")

    def acquire(self) -> bool:
        """Make the folder if need be and hold it (before anything in it changes); True when it was made here."""
        made = not self.out.exists()
        self.out.mkdir(parents=True, exist_ok=True)
        self.lock = RunLock.acquire(self.out)
        return made

    def release(self, made: bool = False) -> None:
        """Let the run folder go; one this process `made` and left empty goes too (a run refused
        while it built leaves nothing behind)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None
            if made:
                (self.out / LOCK).unlink(missing_ok=True)
                with contextlib.suppress(OSError):  # not empty: what was written stays
                    self.out.rmdir()

    # ---- the store's copies ------------------------------------------------------------------------

    def connect(self, store: Store) -> None:
        """With --checkpoint-uri's `store`: pull its newest checkpoint when the folder holds none as
        new, and keep the running rollout's state there (`cloud.inflight_every_s` > 0)."""
        self._pull(store)
        if self.cfg.cloud.inflight_every_s > 0:
            self.inflight = InflightStore(store)

    def keep_results(self, store: Store, resumed: bool) -> None:
        """Mirror the results and status to `store` from now on; a `resumed` run keeps the stored
        results of the heads before it."""
        self.results = ResultsSync(store, self.out, keep_stored=resumed)

    def _pull(self, store: Store) -> None:
        """Bring the newest complete checkpoint of --checkpoint-uri's `store` into the run folder when
        the folder holds none as new (a run restarted on a fresh machine resumes from the store)."""
        self.sync = CheckpointSync(store)
        local = checkpoint.latest(self.out / "checkpoints")
        with waiting(f"looking for a newer checkpoint in {store.uri}"):
            pulled = self.sync.pull(self.out, local.step if local else 0, accept=self._check_stored_config)
        if pulled is not None:
            logger.info(f"checkpoint {pulled} pulled from {self.sync.store.uri}")
        newest = checkpoint.latest(self.out / "checkpoints")
        self._pushed = newest.step if newest is not None and newest.step in self.sync.stored() else 0

    def _check_stored_config(self, folder: Path) -> None:
        """Refuse a stored checkpoint (verified, in run-folder layout under `folder`) of another run."""
        found = checkpoint.newest_sound(folder / "checkpoints")
        why = "no checkpoint" if found is None else self.not_this_run(found[1], folder / "config.yaml")
        if why is not None:
            raise ConfigError(f"{self.cfg.cloud.checkpoint_uri}: holds checkpoints of another run ({why}); "
                              "use another --checkpoint-uri or delete them")

    def push(self, must: bool = False) -> bool:
        """Mirror the newest checkpoint to --checkpoint-uri unless it is there already; True when it
        stored one now. A failed push is logged and tried again later; with `must` it raises StoreError."""
        if self.sync is None:  # no store: nothing to look for after every iteration
            return False
        newest = checkpoint.latest(self.out / "checkpoints")
        if (newest is not None and newest.step > self._pushed
                and self.sync.push(self.out, newest.step, must=must) is not None):
            self._pushed = newest.step
            if self.inflight is not None:  # resuming now starts at or after this checkpoint
                self.inflight.prune(newest.step)
            return True
        return False

    def publish(self, done: int, reward_mean: float, cost: dict[str, Any], engine: FleetEngine) -> None:
        """The store's copy of the run after `done` iterations: the newest checkpoint, the results
        with each checkpoint stored (TensorBoard's events flushed first), and the status."""
        if self.push() and self.results is not None:
            self.writer.flush()
            self.results.push()
        self.report(done, reward_mean, cost, engine)

    def report(self, done: int, reward_mean: float | None, cost: dict[str, Any], engine: FleetEngine,
               stop_reason: str | None = None) -> None:
        """results/status.json after `done` iterations (one small put), when there is a store;
        `cost`: the cost control's summary; `stop_reason`: the run has finished, for that reason."""
        if self.results is None:
            return
        self.results.write_status(status_record(
            self.out.name, self.out, done, self.cfg.train.steps, reward_mean, cost,
            fleet_counts(engine), self._pushed or None, finished=stop_reason is not None,
            stop_reason=stop_reason))

    def store_final(self, done: int, reward_last: float | None, stop_reason: str, cost: dict[str, Any],
                    engine: FleetEngine) -> None:
        """At the run's end, with the folder complete: the store must now hold the newest checkpoint
        and the results (a stop's checkpoint, or a push that failed in the loop), or this raises
        `StoreError` saying so."""
        if self.sync is None:
            return
        with waiting(f"storing the newest checkpoint and the results in {self.sync.store.uri}"):
            self.push(must=True)
            if self.results is not None:
                self.results.push(final=True, stop_reason=stop_reason, must=True)
                self.report(done, reward_last, cost, engine, stop_reason=stop_reason)

    # ---- metrics and TensorBoard --------------------------------------------------------------------

    def open_tensorboard(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(self.out / "tb"))

    def close_tensorboard(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def add_row(self, row: dict[str, Any], step: int, evaluation: Path | None = None) -> None:
        """Iteration `step`'s metrics row in TensorBoard (its numbers as scalars), with the samples
        of an `evaluation` written at that step."""
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, step)
        if evaluation is not None:
            _add_evaluation(self.writer, evaluation, step)

def _add_evaluation(writer, written: Path, step: int) -> None:
    """An evaluation's samples in TensorBoard: the DiT's grid as the image `eval/samples`, the LLM's
    completions as the text `eval/completions` (a markdown table)."""
    if written.suffix == ".png":
        import numpy as np
        from PIL import Image

        writer.add_image("eval/samples", np.asarray(Image.open(written).convert("RGB")), step, dataformats="HWC")
        return
    rows = [loads(line, max_bytes=ROW_BYTES, what="evaluation row") for line in written.read_text().splitlines()]
    table = "| prompt | seed | completion | reward |\n|---|---|---|---|\n" + "\n".join(
        f"| {r['prompt']!r} | {r['seed']} | {r['completion']!r} | {r['reward']:.3f} |" for r in rows)
    writer.add_text("eval/completions", table, step)


