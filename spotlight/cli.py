"""The `spotlight` command line.

    spotlight train [CONFIG] --out DIR [--steps N] [--seed S] [--runtime ray|local] [--address A]
                    [--preemption-trace TRACE] [--trace-speedup F] [--checkpoint-uri URI]
                    [--budget-usd X] [--deadline-h H]
    spotlight prices [--gpu GPU] [--json] [--table CSV] [--refresh aws|sky] [--region R] [--write CSV]
    spotlight bench throughput|scheduler|sp-regroup [--json] [--agent process|local]
    spotlight launch CONFIG [--dryrun] [--out DIR] [--strict] [--name NAME]
    spotlight simulate --trace TRACE [--policy all|NAME] [--gpus N] [--iterations N] [--resolution 512|1280] [--budget-usd X]
                       [--seed S] [--json] [--plot PNG] [--step-times YAML]
    spotlight traces show|synth TRACE [--plot PNG] [--json] [--out FILE]

Bad input (a config, a flag value) ends with one `spotlight: error: ...` line and exit code 2 —
never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from cloud.store import StoreError
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
    if args.checkpoint_uri is not None:
        over.setdefault("cloud", {})["checkpoint_uri"] = args.checkpoint_uri
    for flag, key in (("budget_usd", "budget_usd"), ("deadline_h", "deadline_h")):
        value = getattr(args, flag)
        if value is not None:
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"--{flag.replace('_', '-')}: expected a number > 0, got {value:g}")
            over.setdefault("cloud", {})[key] = value
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
        stopped = "" if summary["stop_reason"] == "steps" else f", stopped for the {summary['stop_reason']}"
        print(f"{summary['steps']} iterations: reward {summary.get('reward_first', float('nan')):.3f} -> "
              f"{summary.get('reward_last', float('nan')):.3f}; ${summary['cost_usd']:.2f}{stopped}; outputs in {out}/")
    return 0


def cmd_prices(args: argparse.Namespace) -> int:
    from cloud import prices

    table = prices.PriceTable.load(args.table)
    if args.refresh == "aws":
        table, skipped = prices.refresh_from_aws(table, region=args.region)
    elif args.refresh == "sky":
        table, skipped = prices.refresh_from_sky(table, region=args.region)
    else:
        skipped = []
    for line in skipped:
        print(f"spotlight: not refreshed: {line}", file=sys.stderr)
    if args.write:
        table.write(args.write)
        print(f"wrote {args.write} (use it with cloud.prices: {args.write})", file=sys.stderr)
    rows = table.rows(args.gpu)
    if args.json:
        print(json.dumps([r.to_dict() for r in rows]))
        return 0
    head = ("provider", "instance_type", "gpu", "gpus", "on-demand $/h", "spot $/h", "date", "source")
    cells = [head] + [(r.provider, r.instance_type, r.gpu, str(r.gpus), f"{r.ondemand_usd_h:.4f}",
                       f"{r.spot_usd_h:.4f}", r.date, r.source) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head) - 1)]
    for c in cells:  # numbers right-aligned, the source (long) last and unpadded
        print("  ".join(v.rjust(w) if 3 <= i <= 5 else v.ljust(w) for i, (v, w) in enumerate(zip(c, widths)))
              + "  " + c[-1])
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.name == "throughput":
        from spotlight.bench_throughput import run_throughput

        result = run_throughput(repeats=5 if args.repeats is None else args.repeats)
    elif args.name == "sp-regroup":
        from spotlight.bench_sp_regroup import run_sp_regroup_bench

        try:
            result = run_sp_regroup_bench(world=args.world, repeats=3 if args.repeats is None else args.repeats,
                                          heads=args.heads, agent=args.agent)
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


def cmd_launch(args: argparse.Namespace) -> int:
    from cloud import sky

    cfg = load_config(args.config)
    name = sky.check_name(args.name or sky.run_name(args.config))
    out = Path(args.out) if args.out else Path("sky") / Path(args.config).stem
    try:
        paths = sky.write_tasks(cfg, out, name)
    except ConfigError as err:  # a cloud field that cannot become a task: name the config file
        raise ConfigError(f"{args.config}: {err}") from None
    print(f"wrote {out}/: run.yaml, " + ", ".join(p.name for p in paths))
    python, why = sky.sky_python()
    if python is None:
        if not args.dryrun:
            raise ConfigError(f"cannot launch: {why}")
        if args.strict:
            raise ConfigError(f"SkyPilot validation skipped (--strict): {why}")
        print(f"spotlight: SkyPilot validation skipped: {why}", file=sys.stderr)
        return 0
    try:
        checked = sky.validate(paths, python)
        for path, error in checked.errors.items():
            print(f"spotlight: error: {out / path.name}: SkyPilot rejects this task: {error}", file=sys.stderr)
        if not checked.ok:
            return 2
        print(f"validated with SkyPilot {checked.version} ({python})")
        if args.dryrun:
            return 0
        if cfg.cloud.region is None:
            print("spotlight: note: cloud.region is unset, so SkyPilot may place a spot pool outside the "
                  "head's network, where its nodes cannot join the head's Ray cluster", file=sys.stderr)
        ip = sky.launch_tasks(paths, name, python.parent / "sky")
    except sky.SkyError as err:
        print(f"spotlight: error: {err}", file=sys.stderr)
        return 2
    print(f"head {name}-head is up at {ip}; spot pools submitted as managed jobs "
          f"{', '.join(f'{name}-{p.stem}' for p in paths[1:]) or '(none)'}: follow them with `sky jobs queue`")
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from spotlight.simulator import POLICIES, SimConfig, simulate
    from spotlight.sim_report import plot_simulation, table
    from spotlight.step_time import StepTimes
    from spotlight.trace_synth import open_trace

    trace = open_trace(args.trace)
    steps = StepTimes.profile(args.profile)
    if args.step_times:
        steps = StepTimes.load(args.step_times, base=steps)
    if args.gpu:
        steps = replace(steps, gpu=args.gpu)
    fields = {k: v for k, v in (("gpus", args.gpus), ("spot_gpus", args.spot_gpus), ("iterations", args.iterations),
                                ("resolution", args.resolution), ("seed", args.seed), ("prompts", args.prompts),
                                ("iterations_scale", args.iterations_scale), ("notice_s", args.notice_s),
                                ("budget_usd", args.budget_usd))
              if v is not None}
    cfg = SimConfig(step_times=steps, stop_at_target=not args.no_stop, **fields)
    names = list(POLICIES) if args.policy == "all" else args.policy.split(",")
    result = simulate(cfg, trace, names)
    if args.plot:
        plot_simulation(result, args.plot)
    if args.json:
        print(json.dumps(result))
    else:
        print(table(result))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


def cmd_traces(args: argparse.Namespace) -> int:
    from spotlight.sim_report import plot_trace, trace_table
    from spotlight.trace_synth import open_trace, write_bamboo
    from spotlight.traces import summarize

    trace = open_trace(args.trace)
    if args.action == "synth":
        if not args.out:
            raise ConfigError("traces synth: --out FILE is required (the Bamboo CSV to write)")
        write_bamboo(trace, args.out)
        print(f"wrote {args.out}: {len(trace.events)} events, {trace.preemptions} preemptions over "
              f"{trace.duration_s / 3600:.1f} h")
        return 0
    summary = summarize(trace)
    if args.plot:
        plot_trace(trace, args.plot)
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
    train.add_argument("--checkpoint-uri", metavar="URI",
                       help="also keep checkpoints in s3://BUCKET/PREFIX (endpoint from $AWS_ENDPOINT_URL, for any "
                            "S3-compatible server) or a folder, and resume from the newest complete one there "
                            "(overrides cloud.checkpoint_uri)")
    train.add_argument("--budget-usd", type=float, metavar="X",
                       help="stop cleanly (checkpoint, final/, summary with stop_reason) before the metered cost "
                            "of the run would exceed X dollars; rejected up front if X cannot pay for one "
                            "iteration (overrides cloud.budget_usd)")
    train.add_argument("--deadline-h", type=float, metavar="H",
                       help="finish within H hours: spot workers fall back to on-demand when the run falls behind "
                            "uniform progress, and it stops before an iteration that could not end in time "
                            "(overrides cloud.deadline_h)")
    train.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.set_defaults(func=cmd_train)

    prices = sub.add_parser("prices", help="the GPU price table (on-demand and spot $/hour)",
                            description="Print the price table the cost meter uses: GPU instance types with "
                                        "on-demand and spot dollars per hour, each with its source and date. "
                                        "The shipped table is a snapshot; --refresh updates it from AWS's spot "
                                        "price history or SkyPilot's local catalog.")
    prices.add_argument("--gpu", help="only this GPU's rows (e.g. H100, A100-80GB, L4)")
    prices.add_argument("--json", action="store_true",
                        help="print the rows as a JSON list (instance_type, gpu, gpus, ondemand_usd_h, spot_usd_h, "
                             "provider, source, date)")
    prices.add_argument("--table", metavar="CSV", help="read this price table instead of the shipped one")
    prices.add_argument("--refresh", choices=["aws", "sky"],
                        help="aws: spot prices of the aws rows from EC2's spot price history (boto3 credentials); "
                             "sky: both prices from SkyPilot's catalog under ~/.sky/catalogs/")
    prices.add_argument("--region", help="region to refresh from (default: us-east-1 for aws, us-central1 for gcp)")
    prices.add_argument("--write", metavar="CSV", help="write the (refreshed) table here, for cloud.prices")
    prices.set_defaults(func=cmd_prices)

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
    bench.add_argument("--agent", choices=["process", "local"], default="process",
                       help="sp-regroup: the node agent as its own process, reached over TCP as on a cluster "
                            "(default), or inside the bench's process")
    bench.set_defaults(func=cmd_bench)

    launch = sub.add_parser("launch", help="launch a run on a spot fleet with SkyPilot",
                            description="Turn a run config into SkyPilot tasks - an on-demand head (Ray head, "
                                        "controller, learner) and spot worker pools that join its Ray cluster - "
                                        "check them with SkyPilot, and launch them (`sky launch` for the head, "
                                        "`sky jobs launch` for each pool). SkyPilot runs from its own virtualenv: "
                                        "$SPOTLIGHT_SKY_PYTHON, else .venv-sky (`make sky-venv`).")
    launch.add_argument("config", help="run config YAML with a `cloud:` section (e.g. experiments/tiny_dit.yaml)")
    launch.add_argument("--dryrun", action="store_true",
                        help="write and validate the task YAMLs only (no cloud account needed)")
    launch.add_argument("--out", metavar="DIR", help="folder for the task YAMLs (default: sky/<config name>)")
    launch.add_argument("--strict", action="store_true",
                        help="with --dryrun: fail (exit 2) when no SkyPilot environment is there to validate")
    launch.add_argument("--name", help="run name: clusters and jobs are NAME-head and NAME-workers-<i> "
                                       "(default: the config's file name)")
    launch.set_defaults(func=cmd_launch)

    sim = sub.add_parser("simulate", help="how long and how much a run takes on a spot fleet, per policy",
                         description="Replay a preemption trace against the real pull scheduler, exploration "
                                     "planner, regroup policy and cost meter, with step times from a model, and "
                                     "compare policies: time to the target validation score and its cost.")
    sim.add_argument("--trace", required=True, metavar="TRACE",
                     help="Bamboo CSV, GCP counts, SkyPilot spot-trace JSON, `t_s,nodes` counts CSV, or a synthetic "
                          "spec such as synth:poisson?nodes=32&rate_h=15&burst_rate_h=0.5&burst_size=8&return_s=900")
    sim.add_argument("--policy", default="all",
                     help="all, or comma-separated names: ondemand, spot_restart, spotlight_noexplore, sync_explore, "
                          "spotlight, oracle")
    sim.add_argument("--gpus", type=int, help="on-demand GPUs, the same for every policy (default 16)")
    sim.add_argument("--spot-gpus", type=int, help="spot GPUs at the trace's peak (default 4x --gpus)")
    sim.add_argument("--iterations", type=int, help="most iterations to simulate (default 300)")
    sim.add_argument("--resolution", type=int, choices=[512, 1280], help="image side in pixels (default 512)")
    sim.add_argument("--prompts", type=int, help="prompts per iteration (default 64, 16 samples each)")
    sim.add_argument("--seed", type=int, help="simulation seed (default 0): same seed, same result")
    sim.add_argument("--iterations-scale", type=float,
                     help="progress model: x the tiny DiT's iterations to target (default 10)")
    sim.add_argument("--notice-s", type=float, help="preemption warning in seconds (default 120; GCP: 30)")
    sim.add_argument("--budget-usd", type=float, metavar="X",
                     help="stop each policy (but the oracle) before X dollars would be exceeded, by the live "
                          "trainer's budget policy; its stop_reason says whether the target came first")
    sim.add_argument("--profile", default="qwen-image", choices=["qwen-image", "tiny-cpu"],
                     help="step-time profile (default qwen-image)")
    sim.add_argument("--gpu", help="GPU type for step times and prices (default H100)")
    sim.add_argument("--step-times", metavar="YAML", help="override step-time fields (spotlight/step_time.py)")
    sim.add_argument("--no-stop", action="store_true", help="run every --iterations even after the target")
    sim.add_argument("--json", action="store_true", help="print one JSON object")
    sim.add_argument("--plot", metavar="PNG", help="write live GPUs and progress over time per policy")
    sim.set_defaults(func=cmd_simulate)

    traces = sub.add_parser("traces", help="summarise, plot or generate preemption traces",
                            description="show: nodes over time and preemptions per hour of a trace; synth: write "
                                        "a synthetic trace (a synth:poisson?... spec) as Bamboo CSV.")
    traces.add_argument("action", choices=["show", "synth"])
    traces.add_argument("trace", metavar="TRACE", help="a trace file or a synth:poisson?... spec")
    traces.add_argument("--plot", metavar="PNG", help="show: plot live nodes and preemptions per hour")
    traces.add_argument("--json", action="store_true", help="show: print the summary as JSON")
    traces.add_argument("--out", metavar="FILE", help="synth: where to write the trace")
    traces.set_defaults(func=cmd_traces)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, FileNotFoundError, TraceError, StoreError) as err:
        print(f"spotlight: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("spotlight: interrupted; the newest checkpoint is kept and the run resumes from it", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
