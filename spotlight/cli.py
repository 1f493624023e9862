"""The `spotlight` command line.

    spotlight train [CONFIG] --out DIR [--steps N] [--seed S] [--runtime local]
    spotlight bench throughput [--json]

Bad input (a config, a flag value) ends with one `spotlight: error: ...` line and exit code 2 —
never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from spotlight.config import ConfigError, default_config, load_config


def _overrides(args: argparse.Namespace) -> dict:
    over: dict = {}
    if args.steps is not None:
        over.setdefault("train", {})["steps"] = args.steps
    if args.seed is not None:
        over["seed"] = args.seed
    if args.device is not None:
        over["device"] = args.device
    return over


def cmd_train(args: argparse.Namespace) -> int:
    over = _overrides(args)
    cfg = load_config(args.config, over) if args.config else default_config(over)
    name = Path(args.config).stem if args.config else "tiny_dit"
    out = Path(args.out) if args.out else Path("runs") / name
    from spotlight.trainer import Trainer

    log = (lambda msg: print(msg, file=sys.stderr)) if args.json else print
    summary = Trainer(cfg, out, progress=not args.no_progress, log=log).build().train()
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{summary['steps']} iterations: reward {summary.get('reward_first', float('nan')):.3f} -> "
              f"{summary.get('reward_last', float('nan')):.3f}; outputs in {out}/")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from spotlight.bench_throughput import run_throughput

    result = run_throughput(repeats=args.repeats)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>40}: {value:.4g}" if isinstance(value, float) else f"{key:>40}: {value}")
    return 0


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
    train.add_argument("--runtime", choices=["local"], default="local",
                       help="local: everything in this process (the only runtime so far)")
    train.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.set_defaults(func=cmd_train)

    bench = sub.add_parser("bench", help="benchmarks that print figures",
                           description="Benchmarks: figures of this machine, with ratios to a baseline run alongside.")
    bench.add_argument("name", choices=["throughput"],
                       help="throughput: tiny-DiT denoising steps/s and trained samples/s")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--repeats", type=int, default=5, help="timed repetitions (median reported)")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError) as err:
        print(f"spotlight: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("spotlight: interrupted; the newest checkpoint is kept and the run resumes from it", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
