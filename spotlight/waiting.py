"""A wait the user sees: its step named when it starts, and a line every few seconds while it lasts.

Starting Ray, its actors, pulling a checkpoint from a store: each is seconds to minutes in which the
program prints nothing of its own, and a silent terminal for half a minute reads as a hang (a new
user's first `make train` sat 18 s silent while the actors started). `waiting(what)` names the
step when it begins and, from a background thread, says it is still waiting every `every_s`
seconds, so no gap in the output is longer than that; it prints nothing when the step ends (the
next line comes from the step's result). The lines are logged on this module's logger, which the
CLI sends where the command's other lines go (`spotlight.logs`); logging is thread-safe.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

logger = logging.getLogger(__name__)

EVERY_S = 10.0
"""Seconds between "still waiting" lines: under the 15 s a user waits before suspecting a hang."""


@contextlib.contextmanager
def waiting(what: str, every_s: float = EVERY_S) -> Iterator[None]:
    """Within: `what` has been announced, and "`what`: still waiting (N s)" follows every `every_s`."""
    logger.info(f"{what} ...")
    start = time.monotonic()
    done = threading.Event()

    def remind() -> None:
        while not done.wait(every_s):
            logger.info(f"{what}: still waiting ({time.monotonic() - start:.0f} s)")

    reminder = threading.Thread(target=remind, name=f"waiting: {what}", daemon=True)
    reminder.start()
    try:
        yield
    finally:
        done.set()
        reminder.join()
