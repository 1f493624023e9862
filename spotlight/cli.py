"""The `spotlight` command line.

    spotlight train [CONFIG] --out DIR [--steps N] [--seed S] [--runtime ray|local] [--address A]
                    [--preemption-trace TRACE] [--trace-speedup F] [--checkpoint-uri URI]
                    [--budget-usd X] [--deadline-h H]
    spotlight prices [--gpu GPU] [--json] [--table CSV] [--refresh aws|sky] [--region R] [--write CSV]
    spotlight bench throughput|scheduler|sp-regroup|sp-train|update|lora [--json] [--agent ray|local]
                    [--executors 1,2,4]
    spotlight launch CONFIG [--checkpoint-uri URI] [--dryrun] [--out DIR] [--strict] [--name NAME]
    spotlight status URI [--json]
    spotlight pull URI --out DIR [--no-progress]
    spotlight simulate --trace TRACE [--policy all|NAME[,NAME]] [--gpus N] [--iterations N] [--resolution 512|1280] [--budget-usd X]
                       [--seed S] [--json] [--plot PNG] [--step-times YAML] [--prices CSV] [--constants all|typical]
                       [--profile qwen-image-lora|qwen-image-full|tiny-cpu] [--objective time|cost|deadline] [--deadline-h H]
                       [--price-rows range|all|home|REGION[,REGION]]
    spotlight simulate --config RUN.yaml --trace TRACE [--step-times YAML] [--json]
    spotlight traces show|synth TRACE [--plot PNG] [--json] [--out FILE]

and `--quiet` / `--verbose` anywhere: the run's log lines (the packages' loggers, `spotlight.logs`;
stdout for `train`, stderr under `--json` and for the other commands) at warnings only or with
debug lines (`_configure_logging`).

Bad input (a config, a trace, a flag value) ends with one `spotlight: error: ...` line and exit
code 2 — never a traceback — and creates nothing: every command checks its inputs and the places
it will write before it writes (tests/spotlight/test_bad_input.py feeds each command malformed inputs).
Every such line is printed by `_say`, which escapes the control characters a key or a file name
quoted in it may hold (`schedulers.input.files.error_line`); an input that is not a regular file
(a FIFO, a device) is refused before it is opened (`schedulers.input.files.open_regular`). A write
that finds no room (stdout or `--plot` on a full disk, /dev/full) ends with one line and exit 1.
Numeric flags are parsed by `_int` / `_float` (finite numbers only; values quoted at most ~200
characters); their ranges are the config's or the simulator's, or, for `bench`, `BENCH_LIMITS`.
Heavy modules (torch, the trainer, the simulator) are imported inside the commands, after the
checks that need none of them.

Long work (the warm start, training, `simulate`, the benchmarks) draws tqdm bars on stderr;
`--json` and `--no-progress` silence every one of them, the Hugging Face libraries' own included.
A reader that goes away (`spotlight traces show T --json | head -c 10`) ends the command quietly
with exit code 141, as SIGPIPE ends `cat`; Ctrl-C ends it with 130 and, for `train`, says which
checkpoint a re-run resumes from.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cloud.store import StoreError, StoreUnavailable
from spotlight.config import ConfigError, RunConfig, default_config, load_config, to_yaml
from spotlight.reward_names import component_field
from schedulers.input.files import InputError, error_line, short
from spotlight.text import plural

BENCH_LIMITS = {"repeats": (1, 1000), "iterations": (1, 1000), "world": (2, 16), "heads": (1, 64),
                "nodes": (1, 8), "devices": (2, 8), "executors": (1, 16)}
"""[low, high] of the bench flags: `--world` member processes run on one machine (each holds a
tiny DiT), `--heads` of the tiny DiT, repetitions and replayed iterations; sp-train's loopback
cluster of `--nodes` nodes of `--devices` member processes each runs on one machine too; so do
update's `--executors` rollout workers, each holding a tiny DiT."""


def _int(low: int | None = None, high: int | None = None):
    """An argparse type: an integer, within [low, high] when they are given."""
    def parse(text: str) -> int:
        try:
            value = int(text) if len(text) <= 40 else None  # int() of a huge string is slow; none is valid
        except ValueError:
            value = None
        if value is None or (low is not None and value < low) or (high is not None and value > high):
            span = "" if low is None else f" in [{low}, {high}]" if high is not None else f" >= {low}"
            raise argparse.ArgumentTypeError(f"expected an integer{span}, got {short(text)}")
        return value
    return parse


def _int_list(low: int, high: int):
    """An argparse type: comma-separated integers, each within [low, high] (at most 16 of them)."""
    one = _int(low, high)

    def parse(text: str) -> tuple[int, ...]:
        items = text.split(",") if len(text) <= 200 else []
        if not 1 <= len(items) <= 16:
            raise argparse.ArgumentTypeError(f"expected 1 to 16 comma-separated integers, got {short(text)}")
        return tuple(one(item.strip()) for item in items)
    return parse


def _float(positive: bool = False):
    """An argparse type: a finite number (> 0 when `positive`); nan and inf are refused here, the
    ranges by the config or simulator field the flag sets."""
    def parse(text: str) -> float:
        try:
            value = float(text) if len(text) <= 100 else float("nan")
        except ValueError:
            value = float("nan")
        if not math.isfinite(value) or (positive and value <= 0):
            raise argparse.ArgumentTypeError(f"expected a finite number{' > 0' if positive else ''}, got {short(text)}")
        return value
    return parse


def _shown(path: Path) -> str:
    """A path for an error line: at most ~200 characters, quoted only when it is not printable."""
    text = str(path) if str(path).isprintable() else repr(str(path))
    return text if len(text) <= 200 else text[:197] + "..."


def _say(message: str, prefix: str = "spotlight: error: ") -> None:
    """Print one line about the command's input or outcome on stderr: `error_line` escapes the
    control characters a key or a file name quoted in it may hold, and caps it at 300 characters.
    Every `spotlight: ...` line of this module is printed here."""
    print(error_line(message, prefix), file=sys.stderr)


class WriteError(Exception):
    """An output the command could not write (a full disk, a read-only file): one line, exit 1 —
    not bad input, but not a traceback either."""


def _output_file(path: str, flag: str) -> Path:
    """A file a command will write: refused before anything runs when it names a folder, its folder
    does not exist, or it cannot be written there (so a bad flag costs nothing and leaves nothing;
    issue 41: `traces synth --out` and `prices --write` refused a read-only place only after their
    work). Tried, not asked, as `_check_writable` tries a folder: an existing file is opened for
    writing and left as it was; a new one's folder gets a file made and removed at once."""
    import tempfile

    out = Path(path)
    if out.is_dir():
        raise ConfigError(f"{flag}: {_shown(out)} is a folder (expected a file to write)")
    if not out.parent.is_dir():
        raise ConfigError(f"{flag}: {_shown(out.parent)} is not an existing folder (expected the folder of the "
                          "file to write)")
    try:
        if out.exists():  # O_NONBLOCK: a FIFO without a reader refuses (ENXIO) instead of waiting for one
            os.close(os.open(out, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
        else:
            fd, tried = tempfile.mkstemp(prefix=".spotlight-write-check-", dir=out.parent)
            os.close(fd)
            os.unlink(tried)
    except OSError as err:
        raise ConfigError(f"{flag}: {_shown(out)} cannot be written: {err.strerror or type(err).__name__} "
                          "(expected a file this user can write)") from None
    return out


def _output_folder(path: str | Path, flag: str) -> Path:
    """A folder a command will create or write into: refused when it, or the nearest existing
    path above it, is not a folder, or is one this process cannot create folders in."""
    out = Path(path)
    for there in (out, *out.parents):
        if there.exists() or there.is_symlink():
            if not there.is_dir():
                what = "an existing file" if there == out else f"inside the file {_shown(there)}"
                raise ConfigError(f"{flag}: {_shown(out)} is {what} (expected a folder)")
            _check_writable(there, out, flag)
            break
    return out


def _check_writable(folder: Path, out: Path, flag: str) -> None:
    """ConfigError unless a folder can be made in `folder` (where `out`, or its first missing
    part, will be made). Tried, not asked: `os.access` says yes to root for every folder, yet
    /proc and /sys refuse a new folder even to root, and a read-only mount refuses everyone. The
    folder tried is removed at once."""
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(prefix=".spotlight-write-check-", dir=folder))
    except OSError as err:
        where = "" if folder == out else f" (making a folder in {_shown(folder)})"
        raise ConfigError(f"{flag}: {_shown(out)} cannot be written{where}: {err.strerror or type(err).__name__} "
                          "(expected a folder this user can write)") from None


PLOT_FORMATS = ("png", "pdf", "svg", "svgz", "eps", "ps", "jpg", "jpeg", "tif", "tiff", "webp")
"""What `--plot` writes, by the file name's suffix (PNG without one): matplotlib's Agg formats that
need nothing more installed (its pgf needs LaTeX)."""


def _plot_file(path: str) -> Path:
    """`--plot`'s file: `_output_file`, with a suffix of `PLOT_FORMATS` or none."""
    out = _output_file(path, "--plot")
    if out.suffix and out.suffix[1:].lower() not in PLOT_FORMATS:
        raise ConfigError(f"--plot: {_shown(out)}: expected a file name ending in "
                          f"{', '.join('.' + f for f in PLOT_FORMATS)} (or none, for PNG), got {short(out.suffix)}")
    return out


def _save_plot(draw, data, path: Path) -> None:
    """`draw(data, file)` into `path` itself — matplotlib given a name without a suffix writes
    NAME.png instead (with --plot /dev/full: a new file in /dev) — in the format its suffix names.
    A write that fails (a full disk) removes the file it had begun and is a WriteError line."""
    import matplotlib

    fresh = not path.exists()
    try:
        with matplotlib.rc_context({"savefig.format": path.suffix[1:].lower() or "png"}), open(path, "wb") as f:
            draw(data, f)
    except OSError as err:
        if fresh and path.is_file():
            path.unlink(missing_ok=True)
        raise WriteError(f"--plot: cannot write {_shown(path)}: {err.strerror or type(err).__name__}") from None


def _overrides(args: argparse.Namespace) -> dict:
    over: dict = {}
    if args.steps is not None:
        over.setdefault("train", {})["steps"] = args.steps
    if args.seed is not None:
        over["seed"] = args.seed
    if args.device is not None:
        over["device"] = args.device
    runtime = {k: v for k, v in (("kind", args.runtime), ("address", args.address),
                                 ("trace_speedup", args.trace_speedup)) if v is not None}
    if runtime:
        over["runtime"] = runtime
    if args.checkpoint_uri is not None:
        over.setdefault("cloud", {})["checkpoint_uri"] = args.checkpoint_uri
    for key in ("budget_usd", "deadline_h"):  # finite by their flag type; at most: the config's range
        value = getattr(args, key)
        if value is not None:
            if not value > 0:
                raise ConfigError(f"--{key.replace('_', '-')}: expected a number > 0, got {value:g}")
            over.setdefault("cloud", {})[key] = value
    return over


def _progress(args: argparse.Namespace) -> bool:
    """Whether a command draws progress bars: not with --json or --no-progress."""
    return not (getattr(args, "json", False) or getattr(args, "no_progress", False))


@contextlib.contextmanager
def hub_progress(enabled: bool, diffusers: bool = False) -> Iterator[None]:
    """Within: the Hugging Face libraries draw their own bars on stderr only if `enabled`
    (transformers' `save_pretrained` draws "Writing model shards", the loaders "Loading checkpoint
    shards"). Each library has its own switch: huggingface_hub's reads $HF_HUB_DISABLE_PROGRESS_BARS,
    which transformers also reads once, when it is imported; diffusers has only its function, so it
    is imported here when `diffusers` says the run will use it (3 s of imports otherwise wasted).
    Every switch is set back on exit."""
    if enabled:
        yield
        return
    import importlib

    import huggingface_hub.utils as hub

    names = ("transformers.utils.logging", "diffusers.utils.logging")
    if diffusers:
        importlib.import_module(names[1])
    env, hub_off = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS"), hub.are_progress_bars_disabled()
    was = {n: sys.modules[n].is_progress_bar_enabled() for n in names if n in sys.modules}
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # Ray workers inherit it too
    hub.disable_progress_bars()
    for n in was:
        sys.modules[n].disable_progress_bar()
    try:
        yield
    finally:
        if env is None:
            os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
        else:
            os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = env
        if not hub_off:
            hub.enable_progress_bars()
        for n in (n for n in names if n in sys.modules):  # one imported meanwhile: as its import would have set it
            if was.get(n, not hub_off):
                sys.modules[n].enable_progress_bar()


class _PolicyBars:
    """One tqdm bar per simulated policy on stderr, each closed when the next policy starts."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.bar = None

    def __call__(self, policy: str, done: int) -> None:
        from tqdm import tqdm

        if self.bar is None or self.bar.desc != f"simulate {policy}":
            self.close()
            self.bar = tqdm(total=self.total, desc=f"simulate {policy}", unit="it", file=sys.stderr)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def check_train_inputs(cfg: RunConfig, args: argparse.Namespace, out: Path) -> None:
    """What `train` checks before it builds anything: the --out folder, the policy's model folder
    (a remote one fetched into this machine's model cache first, `cloud.model_cache`, and checked
    there), local weight folders, the device, the trace's runtime. (`launch` does not check folders and devices: it writes configs
    for other machines, where they are.) Each failure is one ConfigError line."""
    _output_folder(out, "--out")
    where = f"{args.config}: " if args.config else ""
    from cloud.model_cache import fetch_model, is_remote

    kind = cfg.policy.kind
    section = getattr(cfg.policy, kind)
    if is_remote(section.pretrained_path):  # s3://, gs://, a Hub id: into this machine's model cache, once
        try:
            fetch_model(section.pretrained_path)  # its lines: with the run's others (spotlight.logs)
        except (InputError, StoreError) as err:
            raise ConfigError(f"{where}policy.{kind}.pretrained_path: {' '.join(str(err).split())}") from None
        try:  # the section's checks again, now that its folder is here (a pipeline's VAE sets resolution's multiple)
            type(section)(**{f: getattr(section, f) for f in section.__dataclass_fields__})
        except ConfigError as err:
            raise ConfigError(f"{where}policy.{kind}.{err}") from None
    for name, path in (("policy.dit.pretrained_path", cfg.policy.dit.pretrained_path),
                       ("policy.llm.pretrained_path", cfg.policy.llm.pretrained_path),
                       ("reward.model_path", cfg.reward.model_path)):
        if path and name != "reward.model_path" and is_remote(path):
            continue  # the policy's own is in this machine's model cache now; the other kind's is unused
        if path and not Path(path).is_dir():
            expected = ("local weights; nothing is downloaded" if name == "reward.model_path" else
                        "a local folder, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or a Hugging Face repo id")
            raise ConfigError(f"{where}{name}: {short(path)} is not an existing folder (expected {expected})")
    problem = cfg.policy.llm.folder_problem() if cfg.policy.kind == "llm" and cfg.policy.llm.pretrained_path else None
    if problem is not None:  # file names and config.json only: no import, no weights read
        raise ConfigError(f"{where}policy.llm.pretrained_path: {problem}")
    if cfg.policy.kind == "dit" and cfg.policy.dit.pretrained_path:  # file names and JSON configs: no weights read
        from spotlight.rl.dit_model import check_pipeline_folder
        check_pipeline_folder(cfg, where)
    if cfg.prompts.path is not None or cfg.prompts.eval_path is not None:
        from spotlight.memory_estimate import check_prompt_memory
        from spotlight.rl.prompt_file import evaluation_prompts, run_prompts

        check_prompt_memory(cfg, where)  # before the parse, where the memory goes

        try:  # read in full now: a bad line costs one error before anything starts
            train = run_prompts(cfg.prompts, cfg.seed)
            held_out = evaluation_prompts(cfg, train)
        except ConfigError as err:
            raise ConfigError(f"{where}{err}") from None
        if cfg.policy.kind == "llm" and not cfg.policy.llm.pretrained_path:
            _tiny_llm_reads(train, held_out, cfg, where)
    for i, term in enumerate(cfg.reward.terms):  # each reward component's weights, or its function's file or module
        if term.model_path and not Path(term.model_path).is_dir():
            field = component_field(cfg.reward, i, "model_path")
            raise ConfigError(f"{where}{field}: {short(term.model_path)} is not an existing folder (expected "
                              "local weights; nothing is downloaded)")
        if term.name == "clip_score" and not (term.model_path or cfg.reward.model_path):
            raise ConfigError(f"{where}reward.model_path: expected a local CLIP/PickScore folder for clip_score, got null")
    if any(term.function is not None for term in cfg.reward.terms):
        from spotlight.rl.user_reward import check_config  # looks only: nothing of the user's is imported yet

        try:
            check_config(cfg.reward)
        except ConfigError as err:
            raise ConfigError(f"{where}{err}") from None
    if cfg.device != "cpu":
        import torch  # only here: a CPU run needs torch for none of these checks

        named = "--device" if args.device is not None else f"{where}device"
        if cfg.device == "mps":
            if not torch.backends.mps.is_available():
                raise ConfigError(f"{named}: mps, but torch finds no Apple GPU here (expected cpu or a device "
                                  "this machine has)")
        else:
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            index = int(cfg.device.partition(":")[2] or 0)
            if index >= count:
                have = f"cpu or cuda:0..{count - 1}" if count else "cpu"
                raise ConfigError(f"{named}: {cfg.device}, but torch {torch.__version__} finds {count or 'no'} "
                                  f"CUDA device{'s' if count != 1 else ''} here (expected {have})")
    if args.preemption_trace and cfg.runtime.kind != "ray":
        raise ConfigError("--preemption-trace: replaying preemptions needs --runtime ray")
    if cfg.runtime.sp_degree > 1:
        if cfg.runtime.kind != "ray":
            raise ConfigError("runtime.sp_degree: SP groups run on the Ray runtime (--runtime ray), not in one process")
        from spotlight.runtime.ray_sp import check_sp

        check_sp(cfg)  # before the run folder and the warm start
    if cfg.runtime.kind == "ray" and cfg.runtime.address:
        from spotlight.runtime import ray_cluster

        ray_cluster.check(cfg.runtime)  # reachable, and auth that matches: before the warm start, not after
    if args.preemption_trace and cfg.runtime.address:
        raise ConfigError("--preemption-trace: a trace replays on the cluster a run starts for itself; joined to a "
                          "cluster (--address), the fleet is that cluster's own nodes")
    from spotlight.memory_estimate import check_memory  # last: a run's own errors come first; arithmetic only

    check_memory(cfg, where)  # the estimate against this machine's (and the GPU's) memory (issue 27)


def cmd_train(args: argparse.Namespace) -> int:
    over = _overrides(args)
    cfg = load_config(args.config, over) if args.config else default_config(over)
    name = Path(args.config).stem if args.config else "tiny_dit"
    out = Path(args.out) if args.out else Path("runs") / name
    from spotlight.train.trainer import Trainer  # no Ray: a finished run is answered without it

    trainer = Trainer(cfg, out, progress=_progress(args))
    finished = trainer.folder.completed()
    if finished is not None:  # nothing to train: no cluster, no meter, no file touched
        if args.json:
            print(json.dumps(finished))
        else:
            print(f"complete: {plural(finished['steps'], 'iteration')}, {_rewards(finished)}; "
                  f"outputs in {out}/ (--steps N for more)")
        return 0
    check_train_inputs(cfg, args, out)
    if cfg.policy.lora.enabled and cfg.policy.lora.target_modules:  # before the warm start (a minute on a CPU)
        from spotlight.rl.lora_targets import check_targets

        try:
            check_targets(cfg)
        except ConfigError as err:
            raise ConfigError(f"{args.config}: {err}" if args.config else str(err)) from None
    trace = None
    if args.preemption_trace:
        from schedulers.traces import load_trace

        trace = load_trace(args.preemption_trace)
    from spotlight.rl.rewards import RewardError
    from spotlight.runtime.learner import NonFiniteUpdate
    from spotlight.train.trainer import make_runtime

    runtime = make_runtime(cfg, trace=trace)
    try:
        with hub_progress(_progress(args), diffusers=cfg.policy.kind == "dit"):
            summary = trainer.build(runtime).train()
    except NonFiniteUpdate as err:  # not bad input: the run itself failed (exit 1), in one line too
        _say(str(err))
        return 1
    except RewardError as err:  # a reward component failed twice (the user's function, often): exit 2
        _say(str(err))
        return 2
    except KeyboardInterrupt:
        _say(_kept(out, cfg), "spotlight: interrupted; ")
        return 130
    if args.json:
        print(json.dumps(summary))
    else:
        stopped = "" if summary["stop_reason"] == "steps" else f", stopped for the {summary['stop_reason']}"
        print(f"{plural(summary['steps'], 'iteration')}: {_rewards(summary)}; {_dollars(summary, cfg)}{stopped}; "
              f"outputs in {out}/")
    return 0


def _rewards(summary: dict[str, Any]) -> str:
    """"reward FIRST -> LAST" of a run's summary; none when no iteration ran (a budget too small)."""
    if "reward_first" not in summary:
        return "no reward yet"
    return f"reward {summary['reward_first']:.3f} -> {summary['reward_last']:.3f}"


def _kept(out: Path, cfg: RunConfig) -> str:
    """What an interrupted `train` leaves for a re-run with the same --out: its newest checkpoint."""
    from spotlight.checkpoints import checkpoint

    newest = checkpoint.latest(out / "checkpoints")
    if newest is None:
        return (f"no checkpoint was written yet (the first comes after iteration {cfg.train.checkpoint_every}), "
                "so the same command starts the run over from iteration 0")
    return (f"{newest.path} holds {plural(newest.step, 'iteration')}; the same command resumes from "
            f"iteration {newest.step}")


def _dollars(summary: dict, cfg: RunConfig) -> str:
    """The run's cost and what it prices: the cost meter prices the fleet of the config's cloud
    section (`cloud.gpu`), whatever device ran it — on a CPU that fleet is notional, and priced for
    the iterations' seconds alone (`spotlight.train.cost_control.notional_fleet`)."""
    from spotlight.train.cost_control import notional_fleet

    text = f"${summary['cost_usd']:.2f}"
    price, fleet = summary.get("node_price"), summary.get("fleet")
    if price is None or fleet is None:
        return text
    od, spot, gpu = fleet["ondemand_nodes"], fleet["spot_nodes"], price["gpu"]
    unit = (gpu, f"{gpu}s") if price["gpus"] == 1 else (f"node of {price['gpus']} {gpu}s",
                                                       f"nodes of {price['gpus']} {gpu}s")
    text += f" for {od} on-demand {unit[od != 1]} at ${price['ondemand_usd_h']:.2f}/h"
    if spot:
        text += f" + {spot} spot at ${price['spot_usd_h']:.2f}/h"
    if notional_fleet(cfg):
        used = "the CPU" if cfg.device == "cpu" else cfg.device
        text += f" for its iterations' seconds (a notional fleet: this run used {used})"
    return text


def cmd_prices(args: argparse.Namespace) -> int:
    from cloud import prices

    write = _output_file(args.write, "--write") if args.write else None
    table = prices.PriceTable.load(args.table)
    table.rows(args.gpu)  # an unknown GPU is refused before any refresh
    if args.refresh == "aws":
        table, skipped = prices.refresh_from_aws(table, region=args.region)
    elif args.refresh == "sky":
        from cloud import sky

        python, why = sky.sky_python()
        if python is None:  # one line saying how to make SkyPilot's environment
            if os.environ.get(sky.SKY_PYTHON_ENV):
                why += " (unset it to use the repo's .venv-sky, made by `make sky-venv`)"
            raise ConfigError(f"--refresh sky: {why}")
        table, skipped = prices.refresh_from_sky(table, python, region=args.region)
    else:
        skipped = []
    for line in skipped:
        _say(line, "spotlight: not refreshed: ")
    if write is not None:
        table.write(write)
        print(f"wrote {write} (use it with cloud.prices: {write})", file=sys.stderr)
    rows = table.rows(args.gpu)
    # A row without a region (a table from before the column) holds in its provider's default
    # region (cloud/prices.py): shown in brackets, as assumed rather than read.
    def region(r: prices.PriceRow) -> str:
        return r.where or "unknown"

    def shown_region(r: prices.PriceRow) -> str:
        return r.region or f"({region(r)})"

    if args.region:  # the rows of that region only (refreshed from it with --refresh)
        shown = [r for r in rows if region(r) == args.region]
        if not shown:
            known = sorted({region(r) for r in rows})
            raise ConfigError(f"--region {args.region}: no row{f' of {args.gpu}' if args.gpu else ''} of the table is "
                              f"in it (its regions: {', '.join(known)})")
        rows = shown
    if args.json:
        print(json.dumps([r.to_dict() for r in rows]))
        return 0

    head = ("provider", "instance_type", "region", "gpu", "gpus", "on-demand $/h", "spot $/h", "date", "source")
    cells = [head] + [(r.provider, r.instance_type, shown_region(r), r.gpu, str(r.gpus), f"{r.ondemand_usd_h:.4f}",
                       f"{r.spot_usd_h:.4f}", r.date, r.source) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head) - 1)]
    for c in cells:  # numbers right-aligned, the source (long) last and unpadded
        print("  ".join(v.rjust(w) if 4 <= i <= 6 else v.ljust(w) for i, (v, w) in enumerate(zip(c, widths)))
              + "  " + c[-1])
    if any(not r.region for r in rows):
        unknown = any(r.where is None for r in rows)
        print("(region): the table names no region for the row; its provider's default region is assumed"
              + (" ((unknown): the provider has none)" if unknown else ""))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.name == "throughput":
        from spotlight.bench.throughput import run_throughput

        result = run_throughput(repeats=args.repeats, progress=_progress(args))
    elif args.name == "sp-regroup":
        from spotlight.bench.sp_regroup import run_sp_regroup_bench

        try:
            result = run_sp_regroup_bench(world=args.world, repeats=args.repeats,
                                          heads=args.heads, agent=args.agent, progress=_progress(args))
        except ValueError as err:  # a flag combination the bench cannot run, named by the error
            raise ConfigError(str(err)) from None
    elif args.name == "sp-train":
        from spotlight.bench.sp_train import run_sp_train_bench

        if args.iterations < 2:
            raise ConfigError(f"--iterations: sp-train needs 2 or more (one to time, the last to lose a member "
                              f"in), got {args.iterations}")
        result = run_sp_train_bench(nodes=args.nodes, devices=args.devices, iterations=args.iterations,
                                    repeats=args.repeats, progress=_progress(args))
    elif args.name == "update":
        from spotlight.bench.update import run_update_bench

        if args.iterations < 5:
            raise ConfigError(f"--iterations: update needs 5 or more (a warm-up, an undisturbed update, the "
                              f"killed one, the replacement's two updates later), got {args.iterations}")
        try:
            result = run_update_bench(executors=args.executors, iterations=args.iterations,
                                      repeats=args.repeats, progress=_progress(args))
        except RuntimeError as err:  # the kill missed its update: a run that could not be timed, not bad input
            _say(f"bench update: {err}")
            return 1
    elif args.name == "lora":
        from spotlight.bench.lora import run_lora_bench

        result = run_lora_bench(progress=_progress(args))
    else:
        from spotlight.bench.scheduler import run_scheduler_bench

        result = run_scheduler_bench(iterations=args.iterations, progress=_progress(args))
    if args.json:
        print(json.dumps(result))
    else:
        _print_table(result)
    return 0


def _tiny_llm_reads(train: list, held_out: list, cfg: RunConfig, where: str) -> None:
    """The tiny LLM's tokenizer reads digits and + - = only: a prompt file it cannot read is refused,
    naming the first such character and its prompt's file line."""
    from spotlight.rl.char_tokenizer import CHARACTERS, first_unreadable

    for field, path, prompts in (("prompts.path", cfg.prompts.path, train),
                                 ("prompts.eval_path", cfg.evaluation_file(), held_out)):
        found = first_unreadable(prompts)
        if found is None:
            continue
        prompt, char = found
        at = prompt.where(short(str(path)) if path is not None else None)
        raise ConfigError(f"{where}{field}: {at}: the tiny LLM's tokenizer cannot read {char!r} in "
                          f"{short(prompt.text)} (it reads only {''.join(CHARACTERS)}, for the arithmetic "
                          "task; for other text give policy.pretrained_path a model folder with its tokenizer)")


def cmd_launch(args: argparse.Namespace) -> int:
    from cloud import sky
    from cloud.credentials import store_credentials
    from cloud.bill import bill, lines
    from spotlight.launch_config import for_the_cloud, inputs_warnings, toy_warning

    cfg = load_config(args.config)
    name = sky.check_name(args.name or sky.run_name(args.config))
    out = _output_folder(args.out if args.out else Path("sky") / Path(args.config).stem, "--out")
    try:
        sky.check_fleet(cfg.cloud, cfg.runtime.spot_workers)
        fleet_bill = bill(cfg.cloud, cfg.runtime.spot_workers, sky.accelerators(cfg.cloud))
    except ConfigError as err:  # a cloud field that cannot become a task: name the config file
        raise ConfigError(f"{args.config}: {err}") from None
    toy = toy_warning(cfg, args.config, 1 + cfg.runtime.spot_workers, fleet_bill.spot_usd_h)
    inputs = inputs_warnings(cfg, Path.cwd(), sky.REPO_ROOT, sky.not_uploaded)
    cfg, changes = for_the_cloud(cfg, args.checkpoint_uri)
    assert cfg.cloud.checkpoint_uri is not None  # for_the_cloud requires one
    store = store_credentials(cfg.cloud.checkpoint_uri, cfg.cloud.provider, os.environ)
    python, why = sky.sky_python()
    if python is None and not args.dryrun:  # refused before the task files are written
        raise ConfigError(f"cannot launch: {why}")
    if python is None and args.strict:
        raise ConfigError(f"SkyPilot validation skipped (--strict): {why}")
    paths = sky.write_tasks(cfg.cloud, cfg.runtime.spot_workers, to_yaml(cfg), out, name, list(store.secrets))
    for change in changes:
        print(f"run.yaml for the fleet: {change}")
    for note in store.notes:
        print(note)
    print(f"wrote {out}/: run.yaml, " + ", ".join(p.name for p in paths))
    for line in lines(fleet_bill):
        print(line)
    if toy is not None:
        print(toy)
    for line in inputs:
        print(line)
    launch = ["spotlight", "launch", args.config, "--name", name, "--checkpoint-uri", cfg.cloud.checkpoint_uri,
              *(["--out", args.out] if args.out else [])]
    executable = python.parent / "sky" if python is not None else None
    if python is None:
        _say(why, "spotlight: SkyPilot validation skipped: ")
    else:
        try:
            checked = sky.validate(paths, python)
            for path, error in checked.errors.items():
                _say(f"{out / path.name}: SkyPilot rejects this task: {error}")
            if not checked.ok:
                return 2
            print(f"validated with SkyPilot {checked.version} ({python})")
            if not args.dryrun:
                sky.launch_tasks(paths, name, executable, store_secrets=store.secrets)
        except sky.SkyError as err:
            _say(str(err))
            return 2
    if not args.dryrun:
        spot = cfg.runtime.spot_workers
        print(f"submitted the fleet as the managed job group {name}: the head (on demand) and {spot} spot "
              f"node{'s' * (spot != 1)}, each recovered on its own; it goes down by itself when the run ends "
              f"(done, failed or out of budget)")
    for line in sky.next_steps(name, cfg.cloud.checkpoint_uri, executable, paths[0],
                               launch if args.dryrun else None):
        print(line)
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from dataclasses import replace

    if args.config:
        given = [flag for dest, default, flag in args.fleet_flags if getattr(args, dest) != default]
        if given:
            raise ConfigError(f"simulate --config: {', '.join(given)} does not apply (the run config sets the fleet, "
                              "the policy and the model; with --config only --trace, --step-times and --json do)")
        return _simulate_run(args)
    plot = _plot_file(args.plot) if args.plot else None
    from spotlight.iteration.iteration_time import PEAK_BF16_FLOPS
    from spotlight.sim.simulator import POLICIES, SimConfig, gpu_prices, price_rows_of, simulate
    from spotlight.sim.report import hour_saved_lines, plot_simulation, price_range_table, table
    from spotlight.sim.step_time import StepTimes, notice_s_for, trace_provider
    from schedulers.trace_synth import open_trace

    names = list(POLICIES) if args.policy == "all" else args.policy.split(",")
    for n in names:
        if n not in POLICIES:
            raise ConfigError(f"--policy: unknown policy {short(n)} (expected all or one of {', '.join(POLICIES)})")
    fields = {k: v for k, v in (("gpus", args.gpus), ("spot_gpus", args.spot_gpus), ("iterations", args.iterations),
                                ("resolution", args.resolution), ("seed", args.seed), ("prompts", args.prompts),
                                ("iterations_scale", args.iterations_scale), ("notice_s", args.notice_s),
                                ("budget_usd", args.budget_usd), ("prices", args.prices),
                                ("objective", args.objective), ("deadline_h", args.deadline_h))
              if v is not None}
    if (args.objective == "deadline") != (args.deadline_h is not None):
        raise ConfigError("--deadline-h: required with --objective deadline (the hours to reach the target in)"
                          if args.deadline_h is None else "--deadline-h: only with --objective deadline")
    steps = StepTimes.profile(args.profile)
    if args.step_times:
        steps = StepTimes.load(args.step_times, base=steps)
    gpu_from = "--gpu" if args.gpu else f"{args.step_times}: gpu" if args.step_times else "--profile"
    if args.gpu:
        try:  # spelled as the FLOP table spells it (the price table matches any case)
            steps = replace(steps, gpu={g.lower(): g for g in PEAK_BF16_FLOPS}.get(args.gpu.lower(), args.gpu))
        except ConfigError as err:
            raise ConfigError(f"--gpu: {err}") from None
    try:
        cfg = SimConfig(step_times=steps, stop_at_target=not args.no_stop, **fields)
    except ConfigError as err:  # name the flag that set the field: --notice-s for notice_s
        field = str(err).partition(":")[0]
        raise ConfigError(f"--{field.replace('_', '-')}: {err}" if field in fields else str(err)) from None
    if args.prices:  # a bad table is named by its flag, not blamed on --gpu
        from cloud.prices import PriceTable

        try:
            PriceTable.load(args.prices)
        except ConfigError as err:
            raise ConfigError(f"--prices: {err}") from None
    try:
        gpu_prices(cfg)  # a GPU the price table does not price: refused before the trace is read
    except ConfigError as err:
        raise ConfigError(f"{gpu_from}: {err}") from None
    try:
        price_rows_of(cfg, args.price_rows)  # a row the table lacks: refused before the trace is read
    except ConfigError as err:
        raise ConfigError(f"--price-rows: {err}") from None
    trace = open_trace(args.trace)
    provider = trace_provider(trace)
    if args.notice_s is None and provider is not None:  # the notice the trace's cloud gives (AWS 120 s, GCP 30 s)
        cfg = replace(cfg, notice_s=notice_s_for(provider))
    bars = _PolicyBars(cfg.iterations)
    try:
        result = simulate(cfg, trace, names, on_iteration=bars if _progress(args) else None, constants=args.constants,
                          price_rows=args.price_rows)
    finally:
        bars.close()
    if plot is not None:
        _save_plot(plot_simulation, result, plot)
    if args.json:
        print(json.dumps(result))
    else:
        print(table(result))
        for block in filter(None, [price_range_table(result), *hour_saved_lines(result)]):
            print(block)
        if plot is not None:
            print(f"plot: {plot}")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    # Imported when run: the store's checkpoint code brings torch (~1 s), which no other command's
    # start (or its one-line refusal of a bad flag) should pay.
    from spotlight.run_results import cmd_status

    return cmd_status(args)


def _cmd_pull(args: argparse.Namespace) -> int:
    from spotlight.run_results import cmd_pull

    return cmd_pull(args)


def policy_help() -> str:
    """`simulate --policy`'s help: the names `--policy all` runs (`POLICIES`, in the order it runs
    them) and the baselines (`BASELINES`), from the simulator itself, so the help cannot drift from
    it (tests/test_docs_agree.py runs both)."""
    from spotlight.sim.simulator import BASELINES, POLICIES

    return (f"all (the default: all {len(POLICIES)} policies), or comma-separated names of them: "
            f"{', '.join(POLICIES)} (the baselines every policy is compared with: {', '.join(BASELINES)}; "
            f"docs/simulator.md#policies)")


class _HelpNamingPolicies(argparse.Action):
    """`simulate -h`: fills `--policy`'s help in with `policy_help()`, then prints the help and exits
    as argparse's own -h does. Only then: the simulator's module imports torch (~1.3 s here), which
    parsing any other command line must not pay for (the module docstring)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, default: str = argparse.SUPPRESS,
                 help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)
        self.policy: argparse.Action | None = None
        """`--policy`'s action, set once it is added (after this one: -h comes first in the usage)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        if self.policy is not None:
            self.policy.help = policy_help()
        parser.print_help()
        parser.exit()


def _simulate_run(args: argparse.Namespace) -> int:
    """`simulate --config RUN.yaml`: the run as `spotlight train` would run it (`spotlight.sim.run_config`),
    read by train's loader, so refused with train's line; its iterations' phases and update placement."""
    from schedulers.trace_synth import open_trace
    from spotlight.sim.run_config import POLICY, simulate_run

    cfg = load_config(args.config, {})
    trace = open_trace(args.trace)
    step_times = None
    if args.step_times:
        from spotlight.sim.step_time import StepTimes

        step_times = StepTimes.load(args.step_times)
    result = simulate_run(cfg, trace, step_times=step_times)
    if args.json:
        print(json.dumps(result))
        return 0
    r = result["policies"][POLICY]
    fleet = sum(bool(i["update_on_fleet"]) for i in r["iterations_log"])
    print(f"{args.config}: {r['iterations']} iterations in {r['wall_h']:.3f} simulated hours, "
          f"${r['total_cost_usd']:,.2f}; {fleet} updates on the fleet, {r['iterations'] - fleet} on the learner; "
          f"{r['preemptions']} preemptions (trace {result['trace']})")
    return 0


def cmd_traces(args: argparse.Namespace) -> int:
    from spotlight.sim.report import plot_trace, trace_table
    from schedulers.trace_synth import open_trace, write_bamboo
    from schedulers.traces import summarize

    if args.action == "synth" and not args.out:
        raise ConfigError("traces synth: --out FILE is required (the Bamboo CSV to write)")
    out = _output_file(args.out, "--out") if args.action == "synth" else None
    plot = _plot_file(args.plot) if args.action == "show" and args.plot else None
    trace = open_trace(args.trace)
    if out is not None:
        write_bamboo(trace, out)
        print(f"wrote {args.out}: {plural(len(trace.events), 'event')}, {plural(trace.preemptions, 'preemption')} "
              f"over {trace.duration_s / 3600:.1f} h")
        return 0
    summary = summarize(trace)
    if plot is not None:
        _save_plot(plot_trace, trace, plot)
    print(json.dumps(summary) if args.json else trace_table(summary))
    return 0


def _print_table(result: dict, indent: str = "") -> None:
    for key, value in result.items():
        if isinstance(value, dict):
            print(f"{indent}{key}:")
            _print_table(value, indent + "  ")
        else:
            print(f"{indent}{key:>40}: {value:.4g}" if isinstance(value, float) else f"{indent}{key:>40}: {value}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one short line, exit 2, as argparse does, but with our prefix
        self.exit(2, error_line(message) + "\n")


def _verbosity_flags(parser: argparse.ArgumentParser) -> None:
    """--quiet / --verbose, on `spotlight` and on each command, so either goes before or after the
    command's name; SUPPRESS: a command's parser leaves the value `spotlight --quiet` set alone."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quiet", "-q", dest="verbosity", action="store_const", const="quiet",
                       default=argparse.SUPPRESS, help="print only warnings and errors of the run's lines")
    group.add_argument("--verbose", "-v", dest="verbosity", action="store_const", const="verbose",
                       default=argparse.SUPPRESS, help="print debug lines too")


def _configure_logging(args: argparse.Namespace) -> None:
    """The packages' log lines (`spotlight.logs`) go where a command's own lines go: stdout for
    `train` (its lines are its output), stderr where stdout holds the answer (`--json`, and every
    other command, whose lines, if any, accompany a table or a JSON object)."""
    from spotlight.logs import configure

    to_stdout = args.command == "train" and not args.json
    configure("stdout" if to_stdout else "stderr", getattr(args, "verbosity", "default"))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="spotlight", description="GRPO post-training of DiTs and LLM policies on spot GPUs.")
    _verbosity_flags(parser)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    train = sub.add_parser("train", help="train a policy with GRPO",
                           description="Train a policy with GRPO. Without CONFIG, runs the embedded tiny DiT config. "
                                       "An --out folder with checkpoints of the same config is resumed; one that holds "
                                       "the whole run says so in one line (nothing starts, nothing is billed), and "
                                       "a larger --steps trains on from its last checkpoint.")
    train.add_argument("config", nargs="?", help="run config YAML (e.g. experiments/tiny_dit.yaml)")
    train.add_argument("--out", help="output folder (default: runs/<config name>)")
    train.add_argument("--steps", type=_int(), help="GRPO iterations (overrides train.steps)")
    train.add_argument("--seed", type=_int(), help="run seed (overrides seed)")
    train.add_argument("--device", help="torch device (overrides device), e.g. cpu or cuda")
    train.add_argument("--runtime", choices=["ray", "local"],
                       help="ray (the default): learner, rollout and reward workers as Ray actors, on a local "
                            "Ray cluster started for the run unless --address is given; local: one process")
    train.add_argument("--address", help="join this Ray cluster (e.g. auto) instead of starting one")
    train.add_argument("--preemption-trace", metavar="TRACE",
                       help="replay this preemption trace on the spot workers (Bamboo CSV or GCP counts; see docs/ray-runtime.md)")
    train.add_argument("--trace-speedup", type=_float(positive=True), metavar="F",
                       help="replay the trace F times faster than real time")
    train.add_argument("--checkpoint-uri", metavar="URI",
                       help="also keep checkpoints in s3://BUCKET/PREFIX (endpoint from $AWS_ENDPOINT_URL, for any "
                            "S3-compatible server) or a folder, and resume from the newest complete one there "
                            "(overrides cloud.checkpoint_uri)")
    train.add_argument("--budget-usd", type=_float(), metavar="X",
                       help="stop cleanly (checkpoint, final/, summary with stop_reason) before the metered cost "
                            "of the run would exceed X dollars; rejected up front if X cannot pay for one "
                            "iteration (overrides cloud.budget_usd)")
    train.add_argument("--deadline-h", type=_float(), metavar="H",
                       help="finish within H hours: spot workers fall back to on-demand when the run falls behind "
                            "uniform progress, and it stops before an iteration that could not end in time "
                            "(overrides cloud.deadline_h)")
    train.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    train.add_argument("--no-progress", action="store_true",
                       help="no progress bars on stderr (the warm start's, the iterations', Hugging Face's); "
                            "--json implies it")
    train.set_defaults(func=cmd_train)

    prices = sub.add_parser("prices", help="the GPU price table (on-demand and spot $/hour)",
                            description="Print the price table the cost meter uses: GPU instance types with "
                                        "on-demand and spot dollars per hour in a region, each with its source "
                                        "and date. "
                                        "The shipped table is a snapshot; --refresh updates it from AWS's spot "
                                        "price history or SkyPilot's catalog.")
    prices.add_argument("--gpu", help="only this GPU's rows (e.g. H100, A100-80GB, L4)")
    prices.add_argument("--json", action="store_true",
                        help="print the rows as a JSON list (provider, instance_type, region, gpu, gpus, "
                             "ondemand_usd_h, spot_usd_h, ondemand_basis, source, date; region \"\" where the "
                             "table names none: the provider's default region)")
    prices.add_argument("--table", metavar="CSV", help="read this price table instead of the shipped one")
    prices.add_argument("--refresh", choices=["aws", "sky"],
                        help="aws: spot prices of the aws rows from EC2's spot price history (boto3 credentials); "
                             "sky: both prices from SkyPilot's catalog, asked through its API in its own "
                             "virtualenv ($SPOTLIGHT_SKY_PYTHON, else .venv-sky: `make sky-venv`)")
    prices.add_argument("--region", help="show this region's rows only; with --refresh, the region refreshed from "
                                         "(default: us-east-1 for aws, us-central1 for gcp)")
    prices.add_argument("--write", metavar="CSV", help="write the (refreshed) table here, for cloud.prices")
    prices.set_defaults(func=cmd_prices)

    bench = sub.add_parser("bench", help="benchmarks that print figures",
                           description="Benchmarks: figures of this machine, with ratios to a baseline run alongside.")
    benches = bench.add_subparsers(dest="name", required=True, metavar="NAME")

    def a_bench(name: str, what: str, *flags: tuple[str, dict[str, Any]]) -> None:
        """Bench `name`, doing `what`, with --json, --no-progress and its own `flags` only."""
        one = benches.add_parser(name, help=what.split(";")[0], description=what[0].upper() + what[1:] + ".")
        one.add_argument("--json", action="store_true", help="print one JSON object (and no progress on stderr)")
        one.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
        for flag, options in flags:
            one.add_argument(flag, **options)
        one.set_defaults(func=cmd_bench)

    def repeats(what: str, default: int) -> tuple[str, dict[str, Any]]:
        return "--repeats", {"type": _int(*BENCH_LIMITS["repeats"]), "default": default,
                             "help": f"{what} (default {default}; medians reported), 1..1000"}

    def iterations(what: str) -> tuple[str, dict[str, Any]]:
        return "--iterations", {"type": _int(*BENCH_LIMITS["iterations"]), "default": 6,
                                "help": f"{what} (default 6; 1..1000)"}

    a_bench("throughput", "tiny-DiT denoising steps/s and trained samples/s", repeats("timed repetitions", 5))
    a_bench("scheduler", "queue operations/s in-process and on Ray, and steps recomputed per preemption when a "
                         "shipped trace is replayed, against restarting requests from step 0",
            iterations("training iterations per replayed run"))
    a_bench("sp-regroup", "seconds for an SP group to serve again after losing a member (re-formed in place) "
                          "against a restart from the checkpoint, and SP output error per degree",
            repeats("losses per recovery path", 3),
            ("--world", {"type": _int(*BENCH_LIMITS["world"]), "default": 4,
                         "help": "member processes (the first group's degree), 2..16"}),
            ("--heads", {"type": _int(*BENCH_LIMITS["heads"]), "default": 4,
                         "help": "attention heads of the tiny DiT, 1..64"}),
            ("--agent", {"choices": ["ray", "local"], "default": "ray",
                         "help": "the node agent as a Ray actor on a local Ray cluster, as `spotlight train` "
                                 "deploys it (default), or inside the bench's process"}))
    a_bench("sp-train", "on a multi-node loopback Ray cluster, an SP group's in-place regroup inside a training "
                        "run against a cold restart of the group, and rollout requests/s at SP degree 1 against 2",
            repeats("cold restarts", 3), iterations("iterations per training run, 2 or more"),
            ("--nodes", {"type": _int(*BENCH_LIMITS["nodes"]), "default": 2,
                         "help": "nodes of the loopback cluster besides its head (1..8)"}),
            ("--devices", {"type": _int(*BENCH_LIMITS["devices"]), "default": 2,
                           "help": "member processes per node (its `spot` units), 2..8"}))
    a_bench("update", "seconds of the tiny DiT's update with its gradient computed by 1, 2, 4 rollout workers "
                      "(train.update_on: fleet) against the learner alone, the per-executor efficiency, and the "
                      "cost of a worker killed mid-update",
            repeats("runs per setting", 1), iterations("iterations per training run, 5 or more"),
            ("--executors", {"type": _int_list(*BENCH_LIMITS["executors"]), "default": (1, 2, 4),
                             "help": "comma-separated numbers of gradient executors (rollout workers), each 1..16 "
                                     "(default 1,2,4)"}))
    a_bench("lora", "bytes one weight publication moves with LoRA adapters against full weights (tiny DiT and "
                    "LLM), with the adapter-to-full parameter ratio, and the real Qwen-Image transformer's counts "
                    "at rank 64")

    launch = sub.add_parser("launch", help="launch a run on a spot fleet with SkyPilot",
                            description="Turn a run config into a cloud one (device cuda, notice sources, a "
                                        "checkpoint store) and into one SkyPilot job group - an on-demand head "
                                        "(Ray head, controller, learner) and one spot task per spot node, joining "
                                        "its Ray cluster with a token - check it with SkyPilot, and submit it "
                                        "(`sky jobs launch`); the store's credentials go to every node as SkyPilot "
                                        "secrets. SkyPilot runs from its own virtualenv: $SPOTLIGHT_SKY_PYTHON, "
                                        "else .venv-sky (`make sky-venv`). Ends with the next steps: the "
                                        "commands that follow the run (status, queue, logs), cancel it and pull "
                                        "its results. See docs/launch-on-aws-gcp.md.")
    launch.add_argument("config", help="run config YAML with a `cloud:` section (e.g. experiments/tiny_dit.yaml)")
    launch.add_argument("--dryrun", "--dry-run", dest="dryrun", action="store_true",
                        help="write and validate the task YAMLs, print the bill (nodes, $/h, the budget's cap) "
                             "and the next steps (the command that launches them, then how to follow, cancel and "
                             "pull the run) only (no cloud account needed)")
    launch.add_argument("--out", metavar="DIR", help="folder for the task YAMLs (default: sky/<config name>)")
    launch.add_argument("--strict", action="store_true",
                        help="with --dryrun: fail (exit 2) when no SkyPilot environment is there to validate")
    launch.add_argument("--name", help="run name: the managed job group NAME, its tasks head and spot-<i> "
                                       "(default: the config's file name)")
    launch.add_argument("--checkpoint-uri", metavar="URI",
                        help="where the fleet's checkpoints live, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX "
                             "(required unless the config sets cloud.checkpoint_uri to one): they must outlive the head")
    launch.set_defaults(func=cmd_launch)

    status = sub.add_parser("status", help="where a run stands, read from its store alone",
                            description="Print where a run stands from its checkpoint store alone (no SSH to the "
                                        "head): iterations done, the newest reward, the cost so far, live nodes by "
                                        "kind (spot, on-demand), the newest stored checkpoint, how long ago the "
                                        "head last reported, whether the run finished and why, and a launched "
                                        "fleet's head address and end record. See docs/launch-on-aws-gcp.md.")
    status.add_argument("uri", metavar="URI",
                        help="the run's store: cloud.checkpoint_uri, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or a folder")
    status.add_argument("--json", action="store_true", help="print one JSON object")
    status.set_defaults(func=_cmd_status)

    pull = sub.add_parser("pull", help="fetch a run's results (final/, metrics, TensorBoard, samples) from its store",
                          description="Fetch the results a run stored under URI/results/ - metrics.jsonl, "
                                      "summary.json, config.yaml, cost.json, tb/, eval/ and, once the run has "
                                      "finished, final/ (the trained model or LoRA adapter) - into a new folder, "
                                      "every file verified against the checksum and size in results/MANIFEST.json. "
                                      "A failed pull leaves no folder behind.")
    pull.add_argument("uri", metavar="URI",
                      help="the run's store: cloud.checkpoint_uri, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or a folder")
    pull.add_argument("--out", required=True, metavar="DIR", help="a new (or empty) folder for the results")
    pull.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    pull.set_defaults(func=_cmd_pull)

    sim = sub.add_parser("simulate", help="how long and how much a run takes on a spot fleet, per policy",
                         description="Replay a preemption trace against the real pull scheduler, exploration "
                                     "planner, regroup policy and cost meter, with step times from a model, and "
                                     "compare policies: time to the target validation score and its cost.",
                         add_help=False)
    sim_help = sim.add_argument("-h", "--help", action=_HelpNamingPolicies, help="show this help message and exit")
    sim.add_argument("--trace", required=True, metavar="TRACE",
                     help="Bamboo CSV, GCP counts, SkyPilot spot-trace JSON, `t_s,nodes` counts CSV, or a synthetic "
                          "spec such as synth:poisson?nodes=32&rate_h=15&burst_rate_h=0.5&burst_size=8&return_s=900")
    policy = sim.add_argument("--policy", default="all", metavar="all|NAME[,NAME]",
                              help="all (the default: every policy), or comma-separated policy names "
                                   "(`spotlight simulate --help` lists them)")
    sim_help.policy = policy
    sim.add_argument("--config", metavar="RUN.yaml",
                     help="simulate this run config as `spotlight train` would run it (its phases, update "
                          "placement, workers and steps); with it, only --trace, --step-times and --json apply "
                          "(any other flag is refused)")
    sim.add_argument("--gpus", type=_int(), help="on-demand GPUs, the same for every policy (default 16)")
    sim.add_argument("--spot-gpus", type=_int(), help="spot GPUs at the trace's peak (default 4x --gpus)")
    sim.add_argument("--iterations", type=_int(), help="most iterations to simulate (default 300)")
    sim.add_argument("--resolution", type=_int(), choices=[512, 1280], help="image side in pixels (default 512)")
    sim.add_argument("--prompts", type=_int(), help="prompts per iteration (default 64, 16 samples each)")
    sim.add_argument("--seed", type=_int(), help="simulation seed (default 0): same seed, same result")
    sim.add_argument("--iterations-scale", type=_float(positive=True),
                     help="progress model: x the tiny DiT's iterations to target (default 10)")
    sim.add_argument("--notice-s", type=_float(), help="preemption warning in seconds (default: the trace's cloud, AWS 120, "
                                                        "GCP 30; 120 when the trace does not say)")
    sim.add_argument("--budget-usd", type=_float(positive=True), metavar="X",
                     help="stop each policy (but the oracle) before X dollars would be exceeded, by the live "
                          "trainer's budget policy; its stop_reason says whether the target came first")
    sim.add_argument("--objective", choices=["time", "cost", "deadline"],
                     help="how many of the spot nodes on offer the spot policies and the oracle hold: time "
                          "(default: all of them), cost (the count whose iteration is cheapest), deadline (the "
                          "cheapest count that reaches the target within --deadline-h); docs/simulator.md")
    sim.add_argument("--deadline-h", type=_float(positive=True), metavar="H",
                     help="with --objective deadline: hours from the start to reach the target in")
    sim.add_argument("--profile", default="qwen-image-lora",
                     choices=["qwen-image-lora", "qwen-image-full", "qwen-image", "tiny-cpu"],
                     help="step-time profile (default qwen-image-lora: Flow-GRPO's Qwen-Image LoRA recipe; "
                          "qwen-image-full: full fine-tune, also named qwen-image; tiny-cpu: measured on a CPU)")
    sim.add_argument("--gpu", help="GPU type for step times and prices (default H100)")
    sim.add_argument("--step-times", metavar="YAML", help="override step-time fields (spotlight/sim/step_time.py)")
    sim.add_argument("--prices", metavar="CSV",
                     help="price table to run with (default cloud/prices.csv): a sensitivity run, e.g. with "
                          "another region's or basis' spot price (docs/cost.md)")
    sim.add_argument("--price-rows", default="range", metavar="range|all|home|REGION[,REGION]",
                     help="price rows every policy's dollars are also given at (default range: the shipped "
                          "row, its spot against the catalog's pre-cut on-demand, GCP us-central1; all: every row "
                          "of the GPU; home: the run's own; or regions, REGION@catalog for a catalog-basis "
                          "pair): re-priced under --objective time, simulated again otherwise; docs/simulator.md")
    sim.add_argument("--no-stop", action="store_true", help="run every --iterations even after the target")
    sim.add_argument("--constants", default="all", choices=["all", "typical"],
                     help="all (default): every policy at the pessimistic, typical and optimistic constants "
                          "(spotlight/sim/assumptions.py), each answer a range; typical: that set alone, 3x sooner")
    sim.add_argument("--json", action="store_true", help="print one JSON object (and no progress on stderr)")
    sim.add_argument("--no-progress", action="store_true", help="no progress bars on stderr (one per policy)")
    sim.add_argument("--plot", metavar="PNG", help="write progress, dollars spent and live GPUs over time per "
                                                   "policy, the preemptions marked and the verdict under it")
    with_config = {"help", "trace", "config", "step_times", "json", "no_progress", "quiet", "verbose"}
    sim.set_defaults(func=cmd_simulate, fleet_flags=[(a.dest, a.default, a.option_strings[-1]) for a in sim._actions
                                                     if a.option_strings and a.dest not in with_config])

    traces = sub.add_parser("traces", help="summarise, plot or generate preemption traces",
                            description="show: nodes over time and preemptions per hour of a trace; synth: write "
                                        "a synthetic trace (a synth:poisson?... spec) as Bamboo CSV.")
    actions = traces.add_subparsers(dest="action", required=True, metavar="show|synth")
    show = actions.add_parser("show", help="nodes over time and preemptions per hour of a trace",
                              description="Summarise a trace: nodes over time and preemptions per hour.")
    show.add_argument("trace", metavar="TRACE", help="a trace file or a synth:poisson?... spec")
    show.add_argument("--plot", metavar="PNG", help="plot live nodes and preemptions per hour")
    show.add_argument("--json", action="store_true", help="print the summary as JSON")
    synth = actions.add_parser("synth", help="write a synthetic trace as Bamboo CSV",
                               description="Write a synthetic trace (a synth:poisson?... spec) as Bamboo CSV.")
    synth.add_argument("trace", metavar="SPEC", help="a synth:poisson?... spec (or a trace file, rewritten)")
    synth.add_argument("--out", metavar="FILE", help="where to write the trace (required)")
    for command in (show, synth):
        command.set_defaults(func=cmd_traces)
    for command in [*sub.choices.values(), *benches.choices.values(), *actions.choices.values()]:
        _verbosity_flags(command)
    return parser


_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO})
"""The errors of a write that found no room (a full disk or quota, /dev/full, a file over its size
limit) or a failing device: `main` ends them with one line and exit 1 wherever they arise (stdout,
a file a command writes), since no input and no bug of ours causes them."""


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _run(argv)
        finally:
            # A reader gone away shows here, where it can be handled, rather than in the interpreter's
            # last flush ("Exception ignored ... BrokenPipeError"); so does a full stdout.
            sys.stdout.flush()
    except BrokenPipeError:
        return _closed_pipe()
    except OSError as err:
        if err.errno not in _NO_ROOM:
            raise
        with contextlib.suppress(OSError, ValueError):  # stderr may be the full one
            _say(f"cannot write {_shown(Path(err.filename)) if err.filename else 'the output'}: {err.strerror}")
        _drop_unwritten()
        return 1


def _run(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(args)
    try:
        return args.func(args)
    except StoreUnavailable as err:  # the store's retries ran out: not the input's fault; a later try may pass
        _say(str(err))
        return 1
    except (InputError, FileNotFoundError, StoreError) as err:  # every package's bad-input errors
        _say(str(err))
        return 2
    except WriteError as err:  # an output the command could not write: not bad input
        _say(str(err))
        return 1
    except KeyboardInterrupt:  # `train` says what its run keeps itself (cmd_train)
        _say("", "spotlight: interrupted")
        return 130


def _closed_pipe() -> int:
    """The reader of stdout (or stderr) went away, as `| head` does: end quietly with 141, what a
    shell reports for a process that SIGPIPE ended (`cat big | head` too). What is left to write
    goes to /dev/null, so that the interpreter's last flush does not fail again (the recipe of
    Python's signal docs, "Note on SIGPIPE"). SIGPIPE itself stays ignored: its default action would
    also end the process on a write to a closed socket (Ray, S3, the SP agents)."""
    _drop_unwritten()
    return 141


def _drop_unwritten() -> None:
    """What stdout and stderr cannot write goes to /dev/null, so that the interpreter's last flush
    does not fail again ("Exception ignored ...", exit 120)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                os.dup2(devnull, stream.fileno())


if __name__ == "__main__":
    sys.exit(main())
