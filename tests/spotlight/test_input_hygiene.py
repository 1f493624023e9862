"""Issue 27's hostile inputs that do not fit tests/spotlight/test_bad_input.py's table: error lines escape the
control characters quoted in them (`error_line`); inputs that are not regular files are refused
before they are opened (`open_regular`); a full stdout or `--plot` on a full device ends with one
line and exit 1; `--address 127.0.0.1:PORT` of a cluster on loopback only is one line within
seconds, not a minute of ray.init retries; a read-only `--out` is refused before anything runs; a
LoRA target that names no layer is one line naming `policy.lora.target_modules`, before the run
folder is made."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import pytest

from schedulers.input.files import InputFileError, error_line, open_regular, read_text
from spotlight.config import ConfigError, RuntimeConfig, default_config

ROOT = Path(__file__).resolve().parents[2]
TRACE = str(ROOT / "experiments" / "traces" / "bamboo-g4dn.csv")


def _cli(argv: list[str], cwd: Path, timeout_s: float = 60.0, stdout=subprocess.PIPE, env=None):
    """(exit code, stdout, stderr, seconds) of the CLI in `cwd`; a run past `timeout_s` is killed
    with everything it started (its own session) and counts as a failure, not a hang."""
    full_env = {**os.environ, "CI": "true", **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full_env.get("PYTHONPATH")]))
    full_env.pop("RAY_ADDRESS", None)
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "spotlight.cli", *argv], cwd=cwd, env=full_env,
                            stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"spotlight {' '.join(argv)} ran past {timeout_s:.0f} s")
    return (proc.returncode, (out or b"").decode(errors="replace"), err.decode(errors="replace"),
            time.monotonic() - start)


def _one_line(stderr: str, start: str = "spotlight: error: ") -> str:
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr[-3000:]
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(start) and len(lines[0]) <= 300, stderr[-2000:]
    return lines[0]


# ---- error lines --------------------------------------------------------------------------------


def test_error_line_escapes_every_control_character_and_caps_the_line():
    hostile = "a\nb\r\t\x1b[2J\x00\x7f\x85\x9b\u2028\u2029\u202e\u2066\u200b\ufeff"
    line = error_line(f"{hostile}: unknown field")
    assert line == ("spotlight: error: a\\nb\\r\\t\\x1b[2J\\x00\\x7f\\x85\\x9b\\u2028\\u2029\\u202e\\u2066\\u200b"
                    "\\ufeff: unknown field")
    assert line.isprintable() and len(line.splitlines()) == 1
    assert error_line("café 価格 'x'") == "spotlight: error: café 価格 'x'"  # printable text is left as it is
    assert error_line("\\n is two characters") == "spotlight: error: \\n is two characters"
    long = error_line("\n" * 1000)
    assert len(long) == 300 and " ... " in long
    # a long line loses its middle: the start says where, the end what was given
    cut = error_line("f.yaml: cloud.gpu: expected one of " + "A, " * 200 + "got 'X1'")
    assert len(cut) == 300 and cut.startswith("spotlight: error: f.yaml: cloud.gpu: expected") and cut.endswith("got 'X1'")
    assert error_line("x", prefix="spotlight: not refreshed: ") == "spotlight: not refreshed: x"


# ---- inputs that are not regular files ----------------------------------------------------------


def test_a_fifo_or_a_device_is_refused_before_it_is_opened(tmp_path):
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    start = time.monotonic()
    with pytest.raises(InputFileError, match=r"c\.yaml: a FIFO \(named pipe\), not a regular file \(expected a "
                                             r"config file\)"):
        read_text(fifo, "config", 100)
    with pytest.raises(InputFileError, match=r"/dev/null: a character device, not a regular file"):
        open_regular("/dev/null", "trace")
    with pytest.raises(InputFileError, match=r": is a folder \(expected a trace file\)"):
        open_regular(tmp_path, "trace")
    with pytest.raises(FileNotFoundError):  # the caller words a missing file
        open_regular(tmp_path / "nope", "trace")
    assert time.monotonic() - start < 1.0
    link = tmp_path / "link.yaml"
    link.symlink_to(fifo)
    with pytest.raises(InputFileError, match="a FIFO"):  # a symlink is followed
        read_text(link, "config", 100)
    regular = tmp_path / "r.yaml"
    regular.write_text("seed: 1\n")
    with open_regular(regular, "config") as f:
        assert f.read() == b"seed: 1\n"


def test_a_fifo_prompt_file_and_price_table_are_refused(tmp_path):
    from cloud.prices import PriceError, PriceTable
    from spotlight.rl.prompt_file import read_prompts

    os.mkfifo(tmp_path / "p.txt")
    os.mkfifo(tmp_path / "p.csv")
    with pytest.raises(ConfigError, match=r"prompts\.path: .*p\.txt: a FIFO"):
        read_prompts(tmp_path / "p.txt")
    with pytest.raises(PriceError, match=r"p\.csv: a FIFO"):
        PriceTable.load(tmp_path / "p.csv")


# ---- writes that find no room -------------------------------------------------------------------


@pytest.mark.parametrize("unbuffered", [False, True], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("argv", [["prices"], ["prices", "--json"], ["traces", "show", TRACE, "--json"]],
                         ids=["prices", "prices --json", "traces show --json"])
def test_stdout_on_a_full_device_is_one_line_and_exit_1(argv, unbuffered, tmp_path):
    with open("/dev/full", "wb") as full:
        code, _, stderr, _ = _cli(argv, tmp_path, stdout=full, env={"PYTHONUNBUFFERED": "1" if unbuffered else ""})
    assert code == 1, stderr[-2000:]
    assert "No space left on device" in _one_line(stderr)


@pytest.fixture
def no_dev_full_png():
    """Before the fix, matplotlib wrote `--plot /dev/full` to a new /dev/full.png: remove one this made."""
    existed = os.path.exists("/dev/full.png")
    yield
    if not existed and os.path.isfile("/dev/full.png"):
        os.unlink("/dev/full.png")
        pytest.fail("--plot /dev/full wrote /dev/full.png")


@pytest.mark.parametrize("argv", [["traces", "show", TRACE], ["simulate", "--trace", TRACE, "--policy", "ondemand",
                                                               "--iterations", "3", "--no-progress"]],
                         ids=["traces show", "simulate"])
def test_plot_to_a_full_device_is_one_line_and_not_exit_0(argv, tmp_path, no_dev_full_png):
    code, _, stderr, _ = _cli([*argv, "--plot", "/dev/full"], tmp_path)
    assert code == 1, stderr[-2000:]
    assert "--plot: cannot write /dev/full: No space left on device" in _one_line(stderr)


def test_plot_writes_the_file_it_is_given(tmp_path):
    """Not NAME.png for a NAME without a suffix; an SVG for .svg."""
    code, stdout, stderr, _ = _cli(["traces", "show", TRACE, "--plot", "p", "--json"], tmp_path)
    assert code == 0, stderr[-2000:]
    assert sorted(os.listdir(tmp_path)) == ["p"] and (tmp_path / "p").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, _, stderr, _ = _cli(["traces", "show", TRACE, "--plot", "p.svg", "--json"], tmp_path)
    assert code == 0 and b"<svg" in (tmp_path / "p.svg").read_bytes()[:1000], stderr[-2000:]


# ---- --out that cannot be written ---------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a chmod 555 folder (test_bad_input's /proc case "
                                                "covers root)")
def test_a_read_only_out_is_refused_before_anything(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        code, _, stderr, seconds = _cli(["train", "--out", "ro/run", "--runtime", "local"], tmp_path)
        assert code == 2 and "--out: ro/run cannot be written (making a folder in ro): Permission denied" in \
            _one_line(stderr), stderr[-2000:]
        assert os.listdir(ro) == [] and seconds < 10
    finally:
        ro.chmod(0o755)


def test_the_writability_check_leaves_nothing(tmp_path):
    from spotlight.cli import _output_file, _output_folder

    assert _output_folder(tmp_path / "a" / "b", "--out") == tmp_path / "a" / "b"
    assert os.listdir(tmp_path) == []
    assert _output_file(str(tmp_path / "new.csv"), "--out") == tmp_path / "new.csv"
    assert os.listdir(tmp_path) == []
    kept = tmp_path / "kept.csv"
    kept.write_text("a,b\n")
    os.utime(kept, (1_000_000, 1_000_000))
    _output_file(str(kept), "--write")
    assert kept.read_text() == "a,b\n" and kept.stat().st_mtime == 1_000_000
    os.mkfifo(tmp_path / "fifo")  # no reader: refused at once instead of waiting for one
    with pytest.raises(ConfigError, match=r"--out: .*fifo cannot be written: No such device or address"):
        _output_file(str(tmp_path / "fifo"), "--out")
    with pytest.raises(ConfigError, match=r"--out: /proc/x/y cannot be written \(making a folder in /proc\)"):
        _output_folder("/proc/x/y", "--out")


# ---- --address of a cluster on loopback only ----------------------------------------------------


@pytest.fixture
def loopback_listener():
    """A TCP port open on 127.0.0.1 only, as the GCS of `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ray
    start --head --node-ip-address 127.0.0.1` is (`ray_cluster._check_reachable`: measured with a
    real one, which takes ~10 s to start here); skipped where Ray would keep 127.0.0.1."""
    from ray._private.services import canonicalize_bootstrap_address

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        dial = canonicalize_bootstrap_address(f"127.0.0.1:{port}")
        if dial.startswith("127."):
            pytest.skip(f"Ray keeps 127.0.0.1 on this machine (it dials {dial})")
        yield port, dial


def test_check_refuses_a_loopback_only_cluster_in_seconds(loopback_listener):
    from spotlight.runtime import ray_cluster

    port, dial = loopback_listener
    start = time.monotonic()
    with pytest.raises(ConfigError) as err:
        ray_cluster.check(RuntimeConfig(kind="ray", address=f"127.0.0.1:{port}"))
    assert time.monotonic() - start < 5
    assert f"127.0.0.1:{port} listens on loopback only; Ray dials it at this machine's address, {dial}" in str(err.value)
    assert "--node-ip-address 127.0.0.2" in str(err.value)


def test_train_with_a_loopback_only_address_is_one_line(loopback_listener, tmp_path):
    port, _ = loopback_listener
    code, _, stderr, seconds = _cli(["train", "--address", f"127.0.0.1:{port}", "--out", "o"], tmp_path, timeout_s=45)
    line = _one_line(stderr)
    assert code == 2 and "listens on loopback only" in line and seconds < 15, (seconds, line)
    assert os.listdir(tmp_path) == []


# ---- LoRA targets -------------------------------------------------------------------------------


def test_add_lora_names_a_missing_target():
    import torch

    from spotlight.rl.lora import add_lora

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
    cfg = default_config({"policy": {"lora": {"rank": 2, "target_modules": ["0", "to_qq"]}}})
    with pytest.raises(ConfigError, match=r"^policy\.lora\.target_modules: no layer of the dit model is named 'to_qq' "
                                          r"\(expected names of its linear layers, e\.g\. 0\)$"):
        add_lora(model, cfg)
    assert all(p.requires_grad for p in model.parameters())  # refused before anything changed
    cfg = default_config({"policy": {"lora": {"rank": 2, "target_modules": ["1"]}}})  # a LayerNorm
    with pytest.raises(ConfigError, match=r"^policy\.lora\.target_modules: peft cannot adapt these layers: "):
        add_lora(model, cfg)


def test_train_with_a_missing_lora_target_is_one_line_before_the_run_folder(tmp_path):
    (tmp_path / "c.yaml").write_text("policy:\n  lora:\n    rank: 4\n    target_modules: [to_q, nope]\n")
    code, _, stderr, _ = _cli(["train", "c.yaml", "--runtime", "local", "--steps", "1", "--out", "o"], tmp_path)
    line = _one_line(stderr)
    assert code == 2 and "c.yaml: policy.lora.target_modules: no layer of the dit model is named 'nope'" in line, line
    assert not [c for c in line if unicodedata.category(c) == "Cc"]
    assert sorted(os.listdir(tmp_path)) == ["c.yaml"]  # no run folder, no warm-start cache
