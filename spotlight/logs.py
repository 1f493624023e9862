"""Where the packages' log lines go: the `spotlight` command's one logging configuration.

Every module that has something to tell the user logs it on its own logger,
`logging.getLogger(__name__)` — the trainer, the run folder, the runtimes, the store syncs, the
fleet records — and knows nothing of where the line ends up. The CLI decides that once, at start
(`configure`): the loggers of our packages (`PACKAGES`) get one handler that writes the bare
message — no level, no logger name, so a line reads exactly as the `print` it replaced — to the
command's stream (stdout for `spotlight train`, stderr where stdout is for the answer: `--json`,
`status`, `bench`...). `--quiet` keeps warnings and errors only; `--verbose` adds debug lines.

Other libraries' loggers are not touched: their warnings still reach stderr through Python's
last-resort handler, as before. The handler resolves `sys.stdout` / `sys.stderr` when it writes,
not when it is installed (as `logging.lastResort` does), so a redirected stream (pytest's capture,
`contextlib.redirect_stdout`) is honoured, and `configure` called again replaces it rather than
adding a second one (tests/spotlight/test_cli_logging.py). Records still propagate to the root logger, which
has no handler in the command, so nothing is printed twice, and pytest's `caplog` sees them.

Levels: what a run is doing (a wait, a checkpoint stored or pulled, a resume) is INFO; what went
wrong and was recovered from (a push that failed, a checkpoint or record refused, state not used)
is a WARNING, so `--quiet` still shows it; a metrics row per iteration is DEBUG. `passed_to(sink)`
also hands the lines to a function (tests/conftest.py's `logged`, a script that keeps a run's
lines); `silenced()` drops them (a benchmark's runs, `spotlight status` reading stored checkpoints).

A line logged inside a Ray actor goes to that worker's own stdout, which the runtimes start Ray
without forwarding (`log_to_driver=False`), as a `print` there did before.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator, Mapping

PACKAGES = ("spotlight", "schedulers", "cloud", "elastic_sp", "planners")
"""The top-level packages whose loggers `configure` sets up; every module logs under one of them."""

LEVELS = {"quiet": logging.WARNING, "default": logging.INFO, "verbose": logging.DEBUG}
"""The verbosity of `--quiet`, neither flag, and `--verbose`."""


class _Bare(logging.Formatter):
    """The message alone, after the prefix of its logger (an exact name) if `prefixes` has one."""

    def __init__(self, prefixes: Mapping[str, str]) -> None:
        super().__init__("%(message)s")
        self.prefixes = dict(prefixes)

    def format(self, record: logging.LogRecord) -> str:
        return self.prefixes.get(record.name, "") + super().format(record)


class _Lines(logging.StreamHandler):
    """The bare message on `sys.<stream>`, looked up at each write (see the module docstring)."""

    def __init__(self, stream: str, prefixes: Mapping[str, str]) -> None:
        self.to = stream
        super().__init__()
        self.setFormatter(_Bare(prefixes))

    @property
    def stream(self):  # type: ignore[override]
        return getattr(sys, self.to)

    @stream.setter
    def stream(self, _value) -> None:  # StreamHandler.__init__ assigns one: the property ignores it
        pass


def configure(stream: str = "stdout", verbosity: str = "default", prefixes: Mapping[str, str] | None = None) -> None:
    """Our packages' lines, bare, on `sys.<stream>` ("stdout" or "stderr"), from `LEVELS[verbosity]`
    up; `prefixes`: logger name -> what goes before its lines (`spotlight.fleet_node`'s
    "spotlight fleet: "). Called again, it replaces what the previous call installed."""
    level = LEVELS[verbosity]
    for name in PACKAGES:
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if isinstance(h, _Lines)]:
            logger.removeHandler(old)
        logger.addHandler(_Lines(stream, prefixes or {}))
        logger.setLevel(level)


@contextlib.contextmanager
def passed_to(sink: Callable[[str], None], level: int = logging.INFO) -> Iterator[None]:
    """Within: each message our packages log at `level` or above is also `sink(message)`, from
    whichever thread logs it (a script that keeps a run's lines, tests/conftest.py's `logged`)."""
    handler = logging.Handler(level)
    handler.emit = lambda record: sink(record.getMessage())  # type: ignore[method-assign]
    loggers = [logging.getLogger(name) for name in PACKAGES]
    before = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        if not logger.level or logger.level > level:  # NOTSET would defer to the root's WARNING
            logger.setLevel(level)
    try:
        yield
    finally:
        for logger, was in zip(loggers, before):
            logger.removeHandler(handler)
            logger.setLevel(was)


@contextlib.contextmanager
def silenced(when: bool = True) -> Iterator[None]:
    """Within: nothing of our packages is logged, warnings included (a benchmark's trainer runs,
    `spotlight status` reading the checkpoints a run stored); `when` False: everything is, as usual."""
    if not when:
        yield
        return
    loggers = [logging.getLogger(name) for name in PACKAGES]
    before = [logger.level for logger in loggers]
    for logger in loggers:  # their modules' loggers (level NOTSET) inherit it
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in zip(loggers, before):
            logger.setLevel(level)
