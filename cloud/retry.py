"""Retrying a call that fails transiently: exponential backoff with jitter, under an injected clock.

`Backoff.call(fn, transient=..., clock=...)` runs `fn` until it returns, raises an error that
`transient` does not accept, or the next wait would end more than `give_up_after_s` after the first
attempt began; then the last error is raised as `GaveUp` (its `__cause__`), with the attempt count.

Invariants: waits are taken only with `clock.sleep` (a `ManualClock` makes a test with a hundred
retries instant); the i-th wait (i = 0, 1, ...) lies in [w/2, w] for w = min(max_wait_s,
first_s * factor**i) ("equal jitter": never zero, so a throttled server really is given time, and
spread, so many workers that failed together do not retry in lockstep); the jitter never draws
from the global `random` (a checkpointed RNG: drawing from it would change the run's samples).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from schedulers.clock import Clock

T = TypeVar("T")


class GaveUp(Exception):
    """Every attempt failed transiently until the time budget ran out; `__cause__` is the last error."""

    def __init__(self, message: str, attempts: int, seconds: float) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.seconds = seconds


@dataclass(frozen=True)
class Backoff:
    first_s: float = 0.25
    """The first wait (before jitter)."""
    factor: float = 2.0
    max_wait_s: float = 15.0
    """No single wait is longer (before jitter): 0.25 s doubling reaches it at the 7th retry."""
    give_up_after_s: float = 300.0
    """Stop retrying when the next wait would end this long after the first attempt. Five minutes
    outlasts S3's throttling bursts and brief endpoint outages, and is short against a checkpoint
    interval; the work is never lost meanwhile (the checkpoint stays in the run folder)."""

    def __post_init__(self) -> None:
        if not (self.first_s > 0 and self.factor >= 1 and self.max_wait_s >= self.first_s and self.give_up_after_s >= 0):
            raise ValueError(f"Backoff: expected first_s > 0, factor >= 1, max_wait_s >= first_s, "
                             f"give_up_after_s >= 0; got {self}")

    def wait_s(self, retry: int, rng: random.Random) -> float:
        """The wait before retry number `retry` (0-based): in [w/2, w] for w = min(max_wait_s, first_s * factor**retry)."""
        w = min(self.max_wait_s, self.first_s * self.factor ** min(retry, 64))
        return w / 2 + rng.random() * w / 2

    def call(
        self,
        fn: Callable[[], T],
        *,
        transient: Callable[[BaseException], bool],
        clock: Clock,
        what: str = "call",
        on_retry: Callable[[BaseException, int, float], None] | None = None,
        describe: Callable[[BaseException], str] = lambda err: one_line(err),
        rng: random.Random | None = None,
    ) -> T:
        """`fn()`, retried on errors `transient` accepts. `on_retry(error, retry_number, wait_s)` is
        called before each wait (for logs and counters). Raises `GaveUp` from the last error, whose
        message names it with `describe`."""
        rng = rng if rng is not None else random.Random()
        start = clock.now()
        retry = 0
        while True:
            try:
                return fn()
            except Exception as err:
                if not transient(err):
                    raise
                wait = self.wait_s(retry, rng)
                spent = clock.now() - start
                if spent + wait > self.give_up_after_s:
                    raise GaveUp(f"{what}: gave up after {retry + 1} attempts in {spent:.0f} s "
                                 f"(last error: {describe(err)})", retry + 1, spent) from err
                if on_retry is not None:
                    on_retry(err, retry + 1, wait)
                clock.sleep(wait)
                retry += 1


def one_line(err: BaseException) -> str:
    """The first line of an error's message, or its type name when it has none."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def keeping_global_random(fn: Callable[[], T]) -> Callable[[], T]:
    """`fn`, wrapped so that Python's global `random` is left in the state it was found in, whatever
    `fn` drew from it. Cloud client libraries draw from it (botocore's and google-api-core's retry
    jitter, a GCS multipart boundary), and it is a run's checkpointed RNG: a push must change no
    number the run draws later, or a resumed run would differ from an uninterrupted one."""

    def call() -> T:
        state = random.getstate()
        try:
            return fn()
        finally:
            random.setstate(state)

    return call
