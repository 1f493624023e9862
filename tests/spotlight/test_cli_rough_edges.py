"""What a new user hits (issue 14, point 6), through the real CLI: long work shows progress on
stderr and `--json` / `--no-progress` silence all of it; a closed stdout ends quietly; Ctrl-C says
which checkpoint is kept; counts are pluralised; asking for fewer iterations than a run folder holds
is one error line that changes nothing; the simulator's table says which way is cheaper; a CPU run
says its dollars are a notional fleet's.

Runs use tests/conftest.py's small configs; each warm start that must be seen training gets a fresh
cache folder (SPOTLIGHT_CACHE), since a cached one is only loaded."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from spotlight import cli
from spotlight.config import load_config, to_yaml
from spotlight.runtime.learner import Learner
from spotlight.runtime.local import LocalRuntime
from spotlight.train.trainer import Trainer

from conftest import small_dit_config, small_llm_config

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "experiments" / "traces" / "bamboo-g4dn.csv"
BAR = re.compile(r"\d+%\|")
"""What every tqdm bar draws: "  0%|", "100%|"."""
HF_BAR = "Writing model shards"
"""transformers' own bar, drawn by the LLM's save_pretrained (final/)."""


def _cli(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "spotlight.cli", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=ROOT, **kw)


def _config(tmp_path, cfg, name="run.yaml"):
    path = tmp_path / name
    path.write_text(to_yaml(cfg))
    return path


def _llm(**over):
    """The small LLM run, 2 iterations with a checkpoint after each."""
    return small_llm_config(train={"steps": 2, "checkpoint_every": 1}, **over)


def _no_traceback(text):
    assert "Traceback" not in text and "Exception ignored" not in text, text[-3000:]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """A new user's first run, as a real process: the warm start is not cached yet."""
    tmp = tmp_path_factory.mktemp("first-run")
    out = tmp / "out"
    proc = _cli("train", _config(tmp, _llm()), "--out", out, env={"SPOTLIGHT_CACHE": str(tmp / "cache")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


# ---- 1. progress on stderr, and none with --json / --no-progress ---------------------------------

def test_the_first_run_shows_the_warm_start_and_the_iterations_on_stderr(first_run):
    out, proc = first_run
    err = proc.stderr
    assert re.search(r"warm start: +100%\|", err), err[-2000:]  # the bar, to its end
    assert re.search(r"train: +100%\|", err), err[-2000:]
    assert HF_BAR in err  # with progress on, Hugging Face's own bars stay as they are
    assert not BAR.search(proc.stdout)  # bars never go to stdout
    _no_traceback(err)


@pytest.mark.parametrize("flag", ["--no-progress", "--json"])
def test_no_progress_and_json_silence_every_bar(tmp_path, monkeypatch, capsys, flag):
    monkeypatch.setenv("SPOTLIGHT_CACHE", str(tmp_path / "cache"))  # the warm start trains
    rc = cli.main(["train", str(_config(tmp_path, _llm())), "--out", str(tmp_path / "out"), flag])
    got = capsys.readouterr()
    assert rc == 0, got.err[-2000:]
    assert not BAR.search(got.err) and HF_BAR not in got.err and "it/s" not in got.err, got.err[-2000:]
    if flag == "--json":
        summary = json.loads(got.out)  # stdout holds exactly the summary
        assert summary["steps"] == 2 and summary["warm_start"]["cached"] is False
    else:
        assert "warm start (20 steps) trained in" in got.out


def test_on_ray_the_controller_trains_the_warm_start_with_a_bar_and_the_learner_loads_it(tmp_path, monkeypatch,
                                                                                          capsys):
    """The Ray learner is an actor whose output never reaches the terminal: the controller trains the
    warm start first (one torch thread, as in the actor). The roles here are a LocalRuntime standing
    in for Ray's, so that the test needs no cluster; test_first_ray_run_shows_its_warm_start runs Ray."""
    monkeypatch.setenv("SPOTLIGHT_CACHE", str(tmp_path / "cache"))
    cfg = small_dit_config(runtime={"kind": "ray"})

    class Roles(LocalRuntime):
        def build(self, checkpoints):
            self.cached_before = list((tmp_path / "cache").glob("warm-start-*.safetensors"))
            return super().build(checkpoints)

    roles = Roles(cfg)
    threads = torch.get_num_threads()
    trainer = Trainer(cfg, tmp_path / "out", progress=True).build(roles)
    err = capsys.readouterr().err
    assert re.search(r"warm start: +100%\|", err), err
    assert len(roles.cached_before) == 1  # trained and cached before the roles started
    assert trainer.warm["cached"] is False and trainer.warm["seconds"] > 0  # summary.json as before
    assert torch.get_num_threads() == threads  # the controller's own setting is back

    # Bit-identical to the learner's own warm start (another cache folder; not part of the key).
    own = Learner(small_dit_config(runtime={"kind": "ray"}, warm_start={"cache_dir": str(tmp_path / "own")}))
    assert own.build()["warm_start"]["cached"] is False
    theirs, mine = own.policy.model.state_dict(), roles.learner.policy.model.state_dict()
    assert theirs.keys() == mine.keys() and all(torch.equal(theirs[k], mine[k]) for k in theirs)


def _in_terminal(*args, env=None, timeout=300):
    """The CLI run as a user sees it, in a pseudo-terminal of 120 columns (tqdm draws its bars to
    the width it is given): its exit status and every line or bar update, stdout and stderr as the
    terminal interleaves them, each with the monotonic seconds it arrived at."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # the child: the CLI, with the terminal as its stdin, stdout and stderr
        os.chdir(ROOT)
        os.execve(sys.executable, [sys.executable, "-m", "spotlight.cli", *map(str, args)], {**os.environ, **(env or {})})
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    lines, pending, end = [], b"", time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            if not select.select([fd], [], [], 1.0)[0]:
                continue
            try:
                data = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            *done, pending = (pending + data).replace(b"\r", b"\n").split(b"\n")
            lines += [(time.monotonic(), line.decode(errors="replace")) for line in done if line.strip()]
        else:
            os.kill(pid, signal.SIGKILL)
    finally:
        os.close(fd)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), lines


@pytest.mark.slow
def test_first_ray_run_shows_its_warm_start_and_is_never_silent_for_15_s(tmp_path):
    """A new user's first run on Ray (issue 29): the warm start trains with a bar before the cluster
    starts, each wait after it (Ray, the learner's actor, the workers) is named when it begins and
    reminded every 10 s, so the terminal is never silent for 15 s (the first run used to sit 18 s
    silent while the actors started)."""
    cfg = small_dit_config(runtime={"kind": "ray", "spot_workers": 1, "ondemand_workers": 1},
                           train={"steps": 1, "checkpoint_every": 1})
    start = time.monotonic()
    code, lines = _in_terminal("train", _config(tmp_path, cfg), "--out", tmp_path / "out",
                               env={"SPOTLIGHT_CACHE": str(tmp_path)})
    text = "\n".join(line for _, line in lines)
    assert code == 0, text[-3000:]
    assert re.search(r"warm start: +100%\|", text) and re.search(r"train: +100%\|", text)
    # The bar comes before the cluster starts: nothing of it is lost in an actor.
    assert text.index("warm start:") < text.index("starting a local Ray cluster ...") < text.index(
        "Started a local Ray instance") < text.index("starting the learner") < text.index("starting the rollout workers")
    times = [start] + [t for t, _ in lines]
    gaps = [(b - a, line) for a, b, (_, line) in zip(times, times[1:], lines)]
    assert max(gaps)[0] < 15, max(gaps)


def test_simulate_draws_a_bar_per_policy_unless_told_not_to(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("0,add,a\n0,add,b\n600000,remove,a\n900000,add,c\n")
    args = ["simulate", "--trace", str(trace), "--gpus", "4", "--spot-gpus", "8", "--prompts", "8",
            "--iterations", "3", "--no-stop"]
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    for name in ("ondemand", "spot_restart", "spotlight_noexplore", "sync_explore", "spotlight", "oracle"):
        assert re.search(rf"simulate {name}: +100%\|\S* 3/3", err), (name, err)
    for flag in ("--no-progress", "--json"):
        assert cli.main(args + [flag]) == 0
        assert capsys.readouterr().err == ""


@pytest.mark.parametrize("bench, module, function, own", [
    ("throughput", "spotlight.bench.throughput", "run_throughput", ["--repeats", "1"]),
    ("scheduler", "spotlight.bench.scheduler", "run_scheduler_bench", ["--iterations", "1"]),
    ("sp-regroup", "spotlight.bench.sp_regroup", "run_sp_regroup_bench", ["--repeats", "1"]),
    ("sp-train", "spotlight.bench.sp_train", "run_sp_train_bench", ["--repeats", "1"]),
])
def test_bench_progress_follows_the_flags(monkeypatch, capsys, bench, module, function, own):
    """The flag reaches the bench (a recording double: a real bench takes minutes here; the bars
    themselves are checked below), with a flag of its own (the scheduler bench has no --repeats:
    it was accepted and ignored before each bench got its own parser)."""
    asked = []
    monkeypatch.setattr(f"{module}.{function}", lambda **kw: asked.append(kw["progress"]) or {"figure": 1.0})
    for flags in ([], ["--no-progress"], ["--json"]):
        assert cli.main(["bench", bench, *own, *flags]) == 0
    assert asked == [True, False, False]
    capsys.readouterr()


def test_bench_throughput_draws_its_bar_on_stderr(capsys):
    from spotlight.bench.throughput import run_throughput

    for progress in (True, False):
        run_throughput(repeats=1, prompts=1, group_size=2, micro_batch=2, progress=progress)
        err = capsys.readouterr().err
        assert bool(re.search(r"bench throughput: +100%\|\S* 8/8", err)) == progress, err


@pytest.mark.slow
def test_bench_sp_regroup_draws_its_bar_on_stderr(capsys):
    from spotlight.bench.sp_regroup import run_sp_regroup_bench

    run_sp_regroup_bench(world=2, repeats=1, heads=2, rendezvous_repeats=1, cold=False, agent="local", progress=True)
    assert re.search(r"bench sp-regroup: +100%\|", capsys.readouterr().err)


@pytest.mark.slow
def test_the_ablation_shows_its_runs_unless_told_not_to(tmp_path):
    def ablation(*flags):
        return subprocess.run([sys.executable, "-m", "experiments.exploration_ablation", "--quick", "--models", "dit",
                               "--arms", "random", "--steps", "3", "--target-dit", "0.5", "--fresh",
                               "--out", str(tmp_path / "out"), *flags], capture_output=True, text=True, cwd=ROOT,
                              env={**os.environ, "SPOTLIGHT_CACHE": str(tmp_path / f"cache{len(flags)}")})

    on, off = ablation(), ablation("--no-progress")
    assert on.returncode == 0 and off.returncode == 0, (on.stderr + off.stderr)[-3000:]
    assert re.search(r"warm start: +100%\|", on.stderr) and re.search(r"train: +100%\|", on.stderr)
    assert not BAR.search(off.stderr) and "training 3 iterations" in off.stderr


# ---- 2. a closed stdout ends quietly ---------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["traces", "show", TRACE, "--json"],
    ["traces", "show", TRACE],
    ["prices", "--json"],
    ["prices"],
    ["simulate", "--trace", TRACE, "--iterations", "3", "--gpus", "4", "--prompts", "8", "--json"],
    ["--help"],
], ids=lambda a: " ".join(map(str, a)).replace(str(TRACE), "TRACE"))
def test_a_closed_stdout_ends_quietly(args):
    """`spotlight ... | head -c 10` where head has already gone: the command's first write meets a
    closed pipe (the reading end is closed before it starts, so the test does not race head)."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "spotlight.cli", *map(str, args)], stdout=write,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT)
    finally:
        os.close(write)
    assert proc.returncode in (0, 141), proc.stderr
    assert proc.stderr == ""


def test_head_on_json_output_reads_what_it_wants():
    proc = subprocess.run(f"set -o pipefail; {sys.executable} -m spotlight.cli traces show {TRACE} --json | head -c 10",
                          shell=True, executable="/bin/bash", capture_output=True, text=True, cwd=ROOT)
    assert proc.stdout == '{"source":'[:10] and proc.returncode in (0, 141) and proc.stderr == ""


# ---- 3. Ctrl-C says what is kept ------------------------------------------------------------------

def test_ctrl_c_before_the_first_checkpoint_says_the_run_starts_over(tmp_path, monkeypatch, capsys):
    def interrupted(self, step):
        raise KeyboardInterrupt  # Ctrl-C during the first iteration

    monkeypatch.setattr(Trainer, "iteration", interrupted)
    out = tmp_path / "out"
    assert cli.main(["train", str(_config(tmp_path, small_dit_config())), "--out", str(out), "--no-progress"]) == 130
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == ("spotlight: interrupted; no checkpoint was written yet (the first comes after iteration 2), "
                    "so the same command starts the run over from iteration 0")
    assert not list((out / "checkpoints").glob("step-*"))


def test_ctrl_c_says_which_checkpoint_a_rerun_resumes_from(tmp_path):
    """A real SIGINT, as Ctrl-C sends, once the first checkpoint is on disk."""
    cfg = small_dit_config(train={"steps": 200, "checkpoint_every": 1})
    out = tmp_path / "out"
    # A shell starts a command with Ctrl-C's default action; this test process may not hold it (a
    # library loaded by an earlier test can ignore or block SIGINT, and a child inherits both —
    # then Python installs no KeyboardInterrupt handler and the run carries on: seen twice in
    # full-suite runs, exit 0). So the child puts Python's own handler back before the CLI runs.
    shell_like = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                  "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
                  "sys.argv = ['spotlight'] + sys.argv[1:]; runpy.run_module('spotlight.cli', run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", shell_like, "train", str(_config(tmp_path, cfg)),
                             "--out", str(out), "--runtime", "local", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    start = time.monotonic()
    try:
        while not list((out / "checkpoints").glob("step-*")) and proc.poll() is None and time.monotonic() < start + 300:
            time.sleep(0.2)
        sent = (time.monotonic() - start, proc.poll(), signal.getsignal(signal.SIGINT))
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, (sent, stdout[-1000:], stderr[-3000:])
    newest = max(int(p.name.removeprefix("step-")) for p in (out / "checkpoints").glob("step-*"))
    last = stderr.strip().splitlines()[-1]
    assert last == (f"spotlight: interrupted; {out / 'checkpoints' / f'step-{newest:06d}'} holds "
                    f"{newest} iteration{'s' if newest != 1 else ''}; the same command resumes from iteration {newest}")
    assert "Traceback" not in stderr


# ---- 4, 5, 7. counts, a folder that holds more than asked, what the dollars are --------------------

def test_the_summary_line_counts_in_words_and_says_its_dollars_are_a_notional_fleet(first_run):
    out, proc = first_run
    last = proc.stdout.strip().splitlines()[-1]
    summary = json.loads((out / "summary.json").read_text())
    assert last.startswith(f"2 iterations: reward {summary['reward_first']:.3f} -> {summary['reward_last']:.3f}; "
                           f"${summary['cost_usd']:.2f} for 2 on-demand H100s at $6.88/h + 2 spot at $3.35/h "
                           "for its iterations' seconds (a notional fleet: this run used the CPU); outputs in ")


def test_one_is_singular(tmp_path, monkeypatch, capsys):
    trace = tmp_path / "one.csv"
    trace.write_text("0,add,a\n60000,remove,a\n")
    assert cli.main(["traces", "show", str(trace)]) == 0
    assert f"{trace}: 2 events, 1 distinct node over 0.0 h; live nodes max 1, mean 1.0; 1 preemption (" \
        in capsys.readouterr().out
    monkeypatch.setenv("SPOTLIGHT_CACHE", str(tmp_path / "cache"))
    cfg = small_dit_config(train={"steps": 1, "checkpoint_every": 1}, warm_start={"steps": 1})
    assert cli.main(["train", str(_config(tmp_path, cfg)), "--out", str(tmp_path / "out"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "warm start (1 step) trained in" in out and "\n1 iteration: reward" in out


def test_fewer_steps_than_the_folder_holds_is_one_error_line_and_changes_nothing(first_run, capsys):
    out, _ = first_run
    def state():
        return {p: (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None) for p in sorted(out.rglob("*"))}

    before = state()
    assert cli.main(["train", str(out / "config.yaml"), "--out", str(out), "--steps", "1"]) == 2
    got = capsys.readouterr()
    assert got.out == "" and got.err.splitlines() == [
        f"spotlight: error: {out}: already holds 2 iterations, more than the 1 asked for (--steps or train.steps), "
        "so nothing was trained: ask for 2 or more to train on from there, or use a new --out folder"]
    assert state() == before


def test_a_finished_run_rerun_says_so_in_one_line_without_ray_or_cost(first_run, tmp_path):
    """Issue 29: the same command on a complete run answers at once, from the run folder alone. The
    re-run asks for the Ray runtime (`runtime` does not change a run's identity) with a `ray`
    package on its path that fails on import: starting Ray, or merely importing it, fails the run."""
    out, _ = first_run
    def state():
        return {p: (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else None) for p in sorted(out.rglob("*"))}

    fake = tmp_path / "no-ray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('a finished run must not import Ray')\n")
    config = tmp_path / "ray.yaml"
    config.write_text((out / "config.yaml").read_text().replace("kind: local", "kind: ray"))
    assert "kind: ray" in config.read_text()
    before, cost = state(), (out / "cost.json").read_bytes()
    start = time.monotonic()
    proc = _cli("train", config, "--out", out, env={"PYTHONPATH": str(fake.parent)})
    seconds = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert proc.stdout.splitlines() == [
        f"complete: 2 iterations, reward {summary['reward_first']:.3f} -> {summary['reward_last']:.3f}; "
        f"outputs in {out}/ (--steps N for more)"]
    assert proc.stderr == "" and seconds < 10, (seconds, proc.stderr[-2000:])
    assert (out / "cost.json").read_bytes() == cost and state() == before
    # Asked for more (--steps 3), the folder is not complete: the run trains on from its checkpoint.
    cfg = load_config(out / "config.yaml")
    assert Trainer(cfg, out).folder.completed() == summary
    assert Trainer(load_config(out / "config.yaml", {"train": {"steps": 3}}), out).folder.completed() is None


# ---- 6. the simulator's table and plot -------------------------------------------------------------

def test_the_simulator_table_says_which_way_is_cheaper(tmp_path, capsys):
    from spotlight.sim.report import table

    trace = tmp_path / "t.csv"
    trace.write_text("0,add,a\n0,add,b\n600000,remove,a\n900000,add,c\n")
    png = tmp_path / "sim.png"
    assert cli.main(["simulate", "--trace", str(trace), "--gpus", "4", "--spot-gpus", "8", "--prompts", "8",
                     "--iterations", "40", "--iterations-scale", "0.1", "--policy", "ondemand,sync_explore",
                     "--plot", str(png), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert png.stat().st_size > 10_000
    lines = table(result).splitlines()
    at = lines[0].index("cost vs ondemand") + len("cost vs ondemand")  # the column's right edge
    assert "cost ratio" not in lines[0]
    od, sync = (result["policies"][n]["cost_usd"] for n in ("ondemand", "sync_explore"))
    ratio = sync / od
    assert ratio > 1.05  # exploring on the critical path costs more than on-demand alone
    assert lines[1][:at].endswith("1.00x (same)")
    assert lines[2][:at].endswith(f"{ratio:.2f}x ({ratio - 1:.0%} more)")
    assert "below 1x is cheaper" in " ".join(" ".join(lines).split())
