"""The injected clock (in the manner of SimPy): scheduler, planner, budget and regroup logic read
time only through a `Clock`, so the simulator and the live runtime run the same objects and differ
only in how time passes. Tests drive a `ManualClock` instead of sleeping or patching.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since an arbitrary origin; never goes backwards."""
        ...

    def sleep(self, seconds: float) -> None:
        ...


class WallClock:
    """Real time (time.monotonic)."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ManualClock:
    """Time that moves only when told: `advance(dt)`, or `sleep(dt)`, which advances it at once."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock cannot go backwards ({seconds} s)")
        with self._lock:
            self._now += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
