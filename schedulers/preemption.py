"""Preemption as a typed event: a `PreemptionNotice` with a `Cause` and a deadline, the small
`NoticeSource` Protocol every provider implements, and the `NoticeWatcher` that turns polled
sources into one callback.

Invariants:
- A notice's `deadline` is in the injected clock's seconds (never wall-clock time), or None when
  the provider gives no deadline (advisory notices).
- `NoticeSource.poll()` never blocks for long and never raises on a transient failure: an
  unreachable metadata endpoint means "no notice this time", never a crash of the worker.
- A `NoticeWatcher` calls `on_notice` at most once, with the first notice any source returns, and
  never after `stop()` has returned.

Providers live in `cloud/aws.py` (`ImdsSpotWatcher`) and `cloud/gcp.py` (`GcpPreemptionWatcher`);
`SigtermSource` below covers any supervisor that announces shutdown with SIGTERM.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from types import FrameType
from typing import Protocol, runtime_checkable

from schedulers.clock import Clock

log = logging.getLogger(__name__)


class Cause(str, Enum):
    """Why a node is going away, and how much warning that usually gives.

    - AWS_INSTANCE_ACTION: EC2 spot interruption notice (IMDS `spot/instance-action`): 2 minutes
      before the instance is stopped, hibernated or terminated.
    - AWS_REBALANCE: EC2 rebalance recommendation: advisory, usually earlier than the 2-minute
      notice and sometimes not followed by one at all; no deadline.
    - GCP_PREEMPTED: GCE preemption (metadata `instance/preempted` turns TRUE): 30 seconds.
    - SIGTERM: the process supervisor (Kubernetes, Slurm, SkyPilot, docker) asks us to exit; the
      warning is whatever grace period it grants before SIGKILL.
    - TRACE: a preemption replayed from a recorded trace (simulation and tests).
    - RAY_DRAIN: the Ray cluster drains the node (`ray drain-node`, or a cloud integration that
      turns the provider's notice into a drain with a deadline).
    """

    AWS_INSTANCE_ACTION = "aws-instance-action"
    AWS_REBALANCE = "aws-rebalance"
    GCP_PREEMPTED = "gcp-preempted"
    SIGTERM = "sigterm"
    TRACE = "trace"
    RAY_DRAIN = "ray-drain"


@dataclass(frozen=True)
class PreemptionNotice:
    cause: Cause
    deadline: float | None
    """When the node goes away, in the injected clock's seconds; None when unknown (advisory)."""
    node: str | None = None
    """The node being preempted, where the source knows it (traces); None means this node."""
    detail: str = ""
    """What the provider said, for logs (e.g. "terminate at 2026-11-22T16:20:00Z")."""

    def seconds_left(self, clock: Clock) -> float | None:
        """Seconds until the deadline by `clock` (0 once it has passed); None when unknown."""
        return None if self.deadline is None else max(0.0, self.deadline - clock.now())


@runtime_checkable
class NoticeSource(Protocol):
    def poll(self) -> PreemptionNotice | None:
        """The pending notice, or None. Non-blocking beyond a short timeout; never raises on a
        transient failure (a failing endpoint means no notice this time)."""
        ...


# Kubernetes' terminationGracePeriodSeconds and Slurm's KillWait both default to 30 s.
DEFAULT_SIGTERM_GRACE_S = 30.0

_Handler = Callable[[int, "FrameType | None"], object] | int | None


class SigtermSource:
    """A `NoticeSource` fed by SIGTERM. Constructing it installs a handler (main thread only)
    that records a notice with `deadline = clock.now() + grace_s`. By default it takes SIGTERM
    over: the previous handler is not called, because the point of catching SIGTERM is to use the
    grace period, and the usual previous handlers exit at once (the default action; Ray's worker
    handler, which calls sys.exit). With `chain=True` a previous Python handler is called after the
    notice is recorded. `uninstall()` (or leaving a `with` block) restores the previous handler.
    The first SIGTERM sets the deadline; later ones keep it.
    """

    def __init__(self, clock: Clock, grace_s: float = DEFAULT_SIGTERM_GRACE_S, chain: bool = False) -> None:
        if grace_s < 0:
            raise ValueError(f"SigtermSource: grace_s must be >= 0, got {grace_s}")
        self._clock = clock
        self._grace_s = grace_s
        self._notice: PreemptionNotice | None = None
        self._chain = chain
        self._handler = self._on_sigterm  # one bound-method object, so uninstall can recognise it
        self._previous: _Handler = signal.signal(signal.SIGTERM, self._handler)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        if self._notice is None:
            self._notice = PreemptionNotice(
                Cause.SIGTERM, self._clock.now() + self._grace_s, detail=f"SIGTERM, {self._grace_s:g} s grace"
            )
        if self._chain and callable(self._previous):
            self._previous(signum, frame)

    def poll(self) -> PreemptionNotice | None:
        return self._notice

    def uninstall(self) -> None:
        """Restore the handler that was there before, unless someone replaced ours since."""
        if signal.getsignal(signal.SIGTERM) == self._handler:
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)

    def __enter__(self) -> SigtermSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


class NoticeWatcher:
    """Polls `sources` in order every `interval_s` (waiting with `clock.sleep`) on a daemon thread
    and calls `on_notice(notice)` once, for the first notice found, then ends. List the sources
    that give the shortest warning first: within one round the first source with a notice wins.

    With a `ManualClock` the watcher is deterministic: a source that answers on its k-th poll is
    reported at `clock.now() == start + (k - 1) * interval_s`.
    """

    def __init__(
        self,
        sources: Sequence[NoticeSource],
        on_notice: Callable[[PreemptionNotice], None],
        clock: Clock,
        interval_s: float = 5.0,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"NoticeWatcher: interval_s must be > 0, got {interval_s}")
        self._sources = list(sources)
        self._on_notice = on_notice
        self._clock = clock
        self._interval_s = interval_s
        self._stopped = threading.Event()
        # Held while deciding to call on_notice and during the call, so stop() cannot return
        # between the check and the call; reentrant so on_notice may itself call stop().
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self.notice: PreemptionNotice | None = None
        """The notice that was delivered, once it has been."""

    def start(self) -> NoticeWatcher:
        if self._thread is not None:
            raise RuntimeError("NoticeWatcher.start() called twice")
        self._thread = threading.Thread(target=self._run, name="notice-watcher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """No `on_notice` call starts after this returns (one in progress is waited for). The
        thread itself ends after its current sleep; `join()` waits for that."""
        with self._lock:
            self._stopped.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stopped.is_set():
            for source in self._sources:
                notice = self._poll(source)
                if notice is not None:
                    with self._lock:
                        if not self._stopped.is_set():
                            self._stopped.set()
                            self.notice = notice
                            self._on_notice(notice)
                    return
            self._clock.sleep(self._interval_s)

    @staticmethod
    def _poll(source: NoticeSource) -> PreemptionNotice | None:
        # A source that breaks its contract must not blind the watcher to the other sources.
        try:
            return source.poll()
        except Exception:
            log.exception("preemption notice source %r failed; treating as no notice", source)
            return None
