"""`spotlight --quiet` / `--verbose`: the run's lines (the packages' loggers, `spotlight.logs`) at
the three verbosities, either flag before or after the command's name; what the command prints as
its answer (the summary line, the JSON object) is not a log line and is never silenced."""

from __future__ import annotations

import json
import logging

import pytest

from conftest import small_llm_config
from spotlight import cli
from spotlight.config import to_yaml
from spotlight.logs import PACKAGES, configure

LOADING = "loading the model for the learner and the workers (in this process) ..."
"""An info line every local run logs (`spotlight.waiting`)."""


@pytest.fixture(autouse=True)
def _logging_restored():
    """`main` configures the packages' loggers for the process: put them back for the next test."""
    loggers = [logging.getLogger(name) for name in PACKAGES]
    before = [(logger.level, list(logger.handlers)) for logger in loggers]
    yield
    for logger, (level, handlers) in zip(loggers, before):
        logger.setLevel(level)
        logger.handlers[:] = handlers


def _train(tmp_path, *flags):
    """A one-iteration tiny-LLM local run (no warm start, nothing to load): its stdout and stderr."""
    config = tmp_path / "run.yaml"
    config.write_text(to_yaml(small_llm_config(warm_start={"steps": 0}, train={"steps": 1, "checkpoint_every": 1})))
    return ["train", str(config), "--out", str(tmp_path / "out"), "--no-progress", *flags]


@pytest.mark.parametrize("argv, shown, debug", [
    (lambda a: a, True, False),  # default: info lines on stdout, as `print` had them
    (lambda a: ["--quiet", *a], False, False),  # before the command's name
    (lambda a: [*a, "-q"], False, False),  # after it
    (lambda a: ["-v", *a], True, True),
    (lambda a: [*a, "--verbose"], True, True),
])
def test_quiet_and_verbose_choose_which_of_the_runs_lines_are_printed(tmp_path, capsys, argv, shown, debug):
    assert cli.main(argv(_train(tmp_path))) == 0
    got = capsys.readouterr()
    assert (LOADING in got.out.splitlines()) is shown, got.out
    rows = [line for line in got.out.splitlines() if line.startswith("iteration 0: {")]  # the debug line
    assert len(rows) == int(debug) and (not debug or json.loads(rows[0].partition(": ")[2])["step"] == 0), got.out
    assert LOADING not in got.err
    assert got.out.splitlines()[-1].startswith("1 iteration: reward ")  # the answer, whatever the verbosity


def test_json_keeps_stdout_to_the_summary_and_the_lines_go_to_stderr(tmp_path, capsys):
    assert cli.main(_train(tmp_path, "--json")) == 0
    got = capsys.readouterr()
    assert json.loads(got.out)["steps"] == 1 and LOADING in got.err.splitlines()


def test_verbose_lets_debug_lines_through_and_the_handler_is_not_doubled(capsys):
    configure("stdout", "verbose")
    configure("stdout", "verbose")  # a second call replaces the first handler
    logging.getLogger("spotlight.some.module").debug("a debug line")
    logging.getLogger("cloud.other").info("an info line")
    assert capsys.readouterr().out == "a debug line\nan info line\n"  # bare, once each
    configure("stderr", "quiet")
    logging.getLogger("schedulers.x").info("not shown")
    logging.getLogger("schedulers.x").warning("a warning")
    assert capsys.readouterr() == ("", "a warning\n")


def test_the_flags_are_exclusive_and_documented():
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--quiet", "--verbose", "prices"])
    help_text = cli.build_parser().format_help()
    assert "--quiet" in help_text and "--verbose" in help_text
