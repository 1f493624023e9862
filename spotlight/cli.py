"""The `spotlight` command line.

    spotlight train [CONFIG] --out DIR [--steps N] [--seed S] [--runtime ray|local] [--address A]
                    [--preemption-trace TRACE] [--trace-speedup F]
    spotlight bench throughput|scheduler|sp-regroup [--json]

Bad input (a config, a flag value) ends with one `spotlight: error: ...` line and exit code 2 —
never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from spotlight.config import ConfigError, default_config, load_config
from spotlight.traces import TraceError


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
    return over


def cmd_train(args: argparse.Namespace) -> int:
    over = _overrides(args)
    cfg = load_config(args.config, over) if args.config else default_config(over)
    name = Path(args.config).stem if args.config else "tiny_dit"
    out = Path(args.out) if args.out else Path("runs") / name
    from spotlight.trainer import Trainer, make_runtime

    runtime = make_runtime(cfg)
    if args.preemption_trace:
        if cfg.runtime.kind != "ray":
            raise ConfigError("--preemption-trace: replaying preemptions needs --runtime ray")
        from spotlight.traces import load_trace, replay_schedule

        trace = load_trace(args.preemption_trace)
        runtime.actions = replay_schedule(trace, cfg.runtime.spot_workers, cfg.runtime.trace_speedup,
                                          cfg.runtime.notice_s)
    log = (lambda msg: print(msg, file=sys.stderr)) if args.json else print
    summary = Trainer(cfg, out, progress=not args.no_progress, log=log).build(runtime).train()
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{summary['steps']} iterations: reward {summary.get('reward_first', float('nan')):.3f} -> "
              f"{summary.get('reward_last', float('nan')):.3f}; outputs in {out}/")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.name == "throughput":
        from spotlight.bench_throughput import run_throughput

        result = run_throughput(repeats=5 if args.repeats is None else args.repeats)
    elif args.name == "sp-regroup":
        from spotlight.bench_sp_regroup import run_sp_regroup_bench

        try:
            result = run_sp_regroup_bench(world=args.world, repeats=3 if args.repeats is None else args.repeats,
                                          heads=args.heads)
        except ValueError as err:  # a flag combination the bench cannot run, named by the error
            raise ConfigError(str(err)) from None
    else:
        from spotlight.bench_scheduler import run_scheduler_bench

        result = run_scheduler_bench(iterations=args.iterations)
    if args.json:
        print(json.dumps(result))
    else:
        _print_table(result)
    return 0


def _print_table(result: dict, indent: str = "") -> None:
    for key, value in result.items():
        if isinstance(value, dict):
            print(f"{indent}{key}:")
            _print_table(value, indent + "  ")
        else:
            print(f"{indent}{key:>40}: {value:.4g}" if isinstance(value, float) else f"{indent}{key:>40}: {value}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, as argparse does, but with our prefix
        self.exit(2, f"spotlight: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="spotlight", description="GRPO post-training of DiTs and LLM policies on spot GPUs.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    train = sub.add_parser("train", help="train a policy with GRPO",
                           description="Train a policy with GRPO. Without CONFIG, runs the embedded tiny DiT config. "
                                       "An --out folder with checkpoints of the same config is resumed.")
    train.add_argument("config", nargs="?", help="run config YAML (e.g. experiments/tiny_dit.yaml)")
    train.add_argument("--out", help="output folder (default: runs/<config name>)")
    train.add_argument("--steps", type=int, help="GRPO iterations (overrides train.steps)")
    train.add_argument("--seed", type=int, help="run seed (overrides seed)")
    train.add_argument("--device", help="torch device (overrides device), e.g. cpu or cuda")
    train.add_argument("--runtime", choices=["ray", "local"],
                       help="ray (the default): learner, rollout and reward workers as Ray actors, on a local "
                            "Ray cluster started for the run unless --address is given; local: one process")
    train.add_argument("--address", help="join this Ray cluster (e.g. auto) instead of starting one")
    train.add_argument("--preemption-trace", metavar="TRACE",
                       help="replay this preemption trace on the spot workers (Bamboo CSV or GCP counts; see README)")
    train.add_argument("--trace-speedup", type=float, metavar="F", help="replay the trace F times faster than real time")
    train.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.set_defaults(func=cmd_train)

    bench = sub.add_parser("bench", help="benchmarks that print figures",
                           description="Benchmarks: figures of this machine, with ratios to a baseline run alongside.")
    bench.add_argument("name", choices=["throughput", "scheduler", "sp-regroup"],
                       help="throughput: tiny-DiT denoising steps/s and trained samples/s; scheduler: queue "
                            "operations/s in-process and on Ray, and steps recomputed per preemption when a "
                            "shipped trace is replayed, against restarting requests from step 0; sp-regroup: "
                            "seconds for an SP group to serve again after losing a member (re-formed in place) "
                            "against a restart from the checkpoint, and SP output error per degree")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--repeats", type=int, default=None,
                       help="throughput: timed repetitions (default 5); sp-regroup: losses per recovery path "
                            "(default 3); medians reported")
    bench.add_argument("--iterations", type=int, default=6, help="scheduler: training iterations per replayed run")
    bench.add_argument("--world", type=int, default=4, help="sp-regroup: member processes (the first group's degree)")
    bench.add_argument("--heads", type=int, default=4, help="sp-regroup: attention heads of the tiny DiT")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError, TraceError) as err:
        print(f"spotlight: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("spotlight: interrupted; the newest checkpoint is kept and the run resumes from it", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
