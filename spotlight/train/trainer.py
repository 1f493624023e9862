"""The single controller's iteration loop, in-process (`--runtime local`).

One iteration: rollout -> reward -> advantage -> update -> checkpoint, each phase timed. Every
random draw derives from (run seed, iteration, prompt, sample seed), and a checkpoint holds weights,
optimiser and RNG states, so a run resumed from its newest checkpoint ends with the same weights as
one that never stopped.

With `cloud.checkpoint_uri` (`--checkpoint-uri`), every checkpoint is also pushed to that store
once its metrics row is written, and a run folder without a newer checkpoint first pulls the
newest complete one from it (`spotlight.train.checkpoint_sync`): a run restarted on a fresh machine
resumes where the store left it. The running rollout's committed state goes to the store too
(`spotlight.train.inflight`, every `cloud.inflight_every_s`), and a controller restarted mid-rollout
resumes that iteration from it. The run's results — metrics, summary, TensorBoard events, samples,
and final/ at the end — go to the store's results/ after every stored checkpoint and when the run
ends, and results/status.json says where the run stands after every iteration
(`spotlight.train.results_sync`; read back by `spotlight status` and `spotlight pull`).

With `exploration.enabled`, an `Explorer` picks each iteration's prompts and seeds from what idle
workers explored with the previous weights during the previous train phase (`spotlight.iteration.exploration`).

Outputs under DIR: metrics.jsonl (one row per iteration), summary.json, config.yaml, tb/
(TensorBoard scalars), checkpoints/, explorer/ (the planner state each checkpoint resumes with),
cost.json (the dollars the run has spent, across resumes: `cloud.cost`) and final/ (the model in
safetensors, loadable by the library that built it).

The cost control (`cloud.cost.CostControl`) is asked before every iteration: with a budget, the run
stops cleanly (checkpoint, final/, summary with `stop_reason`) before it would be exceeded; with a
deadline, spot workers fall back to on-demand when the run falls behind, and it stops before an
iteration that could not end in time.
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from cloud.bounded_json import loads
from cloud.cost import CostControl, Decision, Spent, load_spent, save_spent
from cloud.open_store import open_store
from cloud.store import Store, StoreError
from schedulers.clock import WallClock
from schedulers.request import Kind, Request
from schedulers.traces import Trace, replay_schedule
from spotlight.checkpoints import checkpoint
from spotlight.config import ConfigError, RunConfig, to_yaml
from spotlight.iteration.exploration import Explorer, explores_first
from spotlight.iteration.iteration_controller import IterationController
from spotlight.iteration.run_loop import Completed, run_loop
from spotlight.rl.policy import Rollout
from spotlight.rl.prompt_file import evaluation_prompts, prompt_metadata, run_prompts
from spotlight.rl.prompts import draw_prompts
from spotlight.rl.rewards import RewardError
from spotlight.rl.warm_start import apply_warm_start, cache_path
from spotlight.runtime.learner import NonFiniteUpdate
from spotlight.runtime.local import LocalRuntime
from spotlight.runtime.protocol import Runtime
from spotlight.text import plural
from spotlight.train.cost_control import COUNTS, cost_control, notional_fleet
from spotlight.train.eval_samples import write_evaluation
from spotlight.train.run_folder import ROW_BYTES, RunFolder
from spotlight.train.results_sync import stored_spent
from spotlight.train.training_iteration import TrainingIteration

logger = logging.getLogger(__name__)


REWARD_TRACEBACK = "reward-error.txt"
"""In the run folder: the traceback of the reward failure that stopped the run (the newest one)."""
EVAL_SEED0 = 10**9
"""Evaluation seeds start here: no training iteration's seeds come near."""


def make_runtime(cfg: RunConfig,
                 metadata: dict[int, dict] | None = None, trace: Trace | None = None) -> Runtime:
    """`metadata`: prompt id -> metadata of the run's prompts (training and evaluation), for the
    rewards; None: read from the config's prompt files (`prompt_metadata`). `trace`: a preemption
    trace the Ray runtime's spot workers replay (`--preemption-trace`), during the rollout — and the
    update too when the fleet computes it (a preemption then costs there as well)."""
    if metadata is None:
        metadata = prompt_metadata(cfg)
    if cfg.runtime.kind == "local":
        return LocalRuntime(cfg, metadata=metadata)
    from spotlight.runtime.ray_runtime import RayRuntime

    if trace is None:
        return RayRuntime(cfg, metadata=metadata)
    rt = cfg.runtime
    return RayRuntime(cfg, metadata=metadata,
                      actions=replay_schedule(trace, rt.spot_workers, rt.trace_speedup, rt.notice_s),
                      replay_phases=("rollout",) if cfg.train.update_on == "learner" else ("rollout", "train"))


def sample_seeds(step: int, group_size: int) -> list[int]:
    """The G sample seeds every prompt of iteration `step` uses (fresh each iteration)."""
    return [step * group_size + j for j in range(group_size)]


class Trainer:
    """The single controller. Construction is cheap; `build()` starts the runtime's roles (the learner
    warm-starts and resumes if it can); `train()` runs the loop and shuts the runtime down."""

    def __init__(self, cfg: RunConfig, out: Path, progress: bool = True) -> None:
        self.cfg = cfg
        # Absolute once, here: a reward (or anything the run loads) that calls os.chdir must not send
        # the checkpoints, metrics and cost.json to another folder, outside the run's lock. Lines
        # shown to the user keep the folder as it was given (`given`).
        self.out = Path(out).absolute()
        self.given = Path(out)
        self.progress = progress
        self.start_step = 0
        self.warm: dict[str, Any] = {}
        self.explorer: Explorer | None = None
        self.cost: CostControl | None = None
        self.folder = RunFolder(cfg, self.out)
        """The run folder's jobs: its lock, identity, store copies, metrics and TensorBoard."""
        self.eval_written: Path | None = None
        """The newest evaluation's samples (eval/step-N.png or .jsonl), for TensorBoard."""
        self.stop_reason = "steps"
        """Why the loop ended: "steps" (all ran), "budget" or "deadline" (`cloud.cost.CostControl`)."""
        self.controller: IterationController | None = None
        """Orders every iteration's phases and places its update (`iteration_controller`)."""
        self.started = time.perf_counter()
        """When this session's iterations started (a metrics row's `elapsed_s`)."""
        self.saved = 0
        """Iterations the newest checkpoint holds."""
        self.checkpoint_s: float | None = None
        self.checkpoint_seconds: list[float] = []
        """What each checkpoint of this session took (summary.json's `checkpoint_s`)."""
        """The last iteration's checkpoint seconds (None: it wrote none)."""
        self.bar: Any = None
        """The iterations' progress bar on stderr, while the loop runs."""

    def build(self, runtime: Runtime | None = None) -> "Trainer":
        cfg = self.cfg
        # Every check that can refuse the run comes before the run folder is made: bad input
        # leaves nothing behind.
        self.folder.check()
        store = open_store(cfg.cloud.checkpoint_uri) if cfg.cloud.checkpoint_uri else None
        # Prices, the fleet and a too-small budget are checked before anything starts; from here on
        # the fleet is paid for (instances are paid from launch), on top of what earlier sessions spent.
        self.cost = cost_control(cfg, WallClock(), self._spent_before(store))
        made = self.folder.acquire()  # before anything in the folder changes
        try:
            return self._build(store, runtime)
        except BaseException:
            self.folder.release(made)
            raise

    def _spent_before(self, store: Store | None) -> Spent:
        """What the run's earlier sessions spent: the run folder's cost.json or, when larger, what the
        store's results record (a run resumed from its store in a fresh folder, on another machine)."""
        spent = load_spent(self.out)
        stored = stored_spent(store) if store is not None else Spent()
        if stored.cost_usd > spent.cost_usd:
            logger.info(f"this run spent ${stored.cost_usd:.4g} before (its results in {store.uri}): "
                        "the budget counts it")
            return stored
        return spent

    def _build(self, store: Store | None, runtime: Runtime | None) -> "Trainer":
        cfg = self.cfg
        # A damaged newest checkpoint (a crash mid-write on a disk that lied, a truncated copy) is
        # set aside now, so that the store's copy of that iteration can replace it.
        checkpoint.newest_usable(self.out / "checkpoints", logger.warning, hashes=False)
        if store is not None:
            self.folder.connect(store)
        self.prompts = run_prompts(cfg.prompts, cfg.seed)
        self.eval_prompts = evaluation_prompts(cfg, self.prompts)
        self.runtime = runtime if runtime is not None else make_runtime(cfg)
        trained = self._warm_start()
        roles = time.perf_counter()
        try:  # each runtime names its own waits (the model, the cluster, the actors)
            info = self.runtime.build(self.out / "checkpoints")
        except checkpoint.CheckpointMismatch as err:  # on Ray, raised in the learner: its cause is the line
            self.runtime.shutdown()
            raise ConfigError(f"{getattr(err, 'cause', None) or err}; use a new --out folder") from None
        self.runtime.watch_fleet(self.cost.meter.set_fleet)
        self.warm, self.start_step = trained or info["warm_start"], info["step"]
        # Starting the roles, warm-start training aside: what replacing the workers would take.
        self._restart_s = time.perf_counter() - roles - info["warm_start"].get("seconds", 0.0)
        if self.start_step > cfg.train.steps:  # a newer checkpoint came from --checkpoint-uri's store
            self.runtime.shutdown()
            raise ConfigError(self.folder.more_than_asked(self.start_step))
        if self.warm.get("steps"):
            how = "loaded from cache" if self.warm["cached"] else f"trained in {self.warm['seconds']:.0f} s"
            logger.info(f"warm start ({plural(self.warm['steps'], 'step')}) {how}: {self.warm['path']}")
        for line in info.get("skipped", []):
            logger.warning(line)
        for line in info.get("notes", []):
            logger.info(line)
        if info["checkpoint"]:
            logger.info(f"resuming from {info['checkpoint']} (iteration {self.start_step})")
        elif any((self.out / "checkpoints").glob(checkpoint.SKIPPED + "*")):
            logger.info("no usable checkpoint: the run starts from iteration 0 (set-aside ones are in "
                        "checkpoints/.skipped-*)")
        if cfg.exploration.enabled:
            self.explorer = self._explorer()
        ex = self.explorer
        self.controller = IterationController.from_config(
            cfg, WallClock(), self.start_step, evaluation=bool(self.eval_prompts),
            explores_first=lambda step: explores_first(cfg.exploration, step, self.start_step,
                                                       ex.pool_step if ex is not None else None))
        self.saved = self.start_step
        self.folder.truncate_metrics(self.start_step)
        (self.out / "config.yaml").write_text(to_yaml(cfg))  # after the check: it is the resume key
        if store is not None:
            self.folder.keep_results(store, resumed=self.start_step > 0)
        return self

    def _warm_start(self) -> dict[str, Any] | None:
        """Train the warm start into its cache here, with a bar on stderr, when the cache misses; the
        learner then loads it. Returns what `apply_warm_start` returns when it trained, else None.

        Why here and not in the learner: on the Ray runtime the learner is an actor started with
        `log_to_driver=False`, so a bar drawn there never reaches the terminal, and the first run
        sat silent for minutes (2400 steps of experiments/tiny_dit.yaml: ~3.5 min). The weights are
        the learner's own, bit for bit: the same seed before the same `build_policy`, the same cache
        key, and the learner loads the file it would have written (tests/spotlight/test_cli_rough_edges.py).
        On a cluster joined with --address too: the learner runs on this controller's node
        (`spotlight.runtime.ray_fleet`), so its cache folder is this one's."""
        cfg = self.cfg
        if cfg.warm_start.steps == 0 or cache_path(cfg).is_file():
            return None
        import torch

        from spotlight.runtime.learner import build_policy

        threads = torch.get_num_threads()
        with torch.random.fork_rng(devices=[]):  # this process's RNG is left as it was
            torch.manual_seed(cfg.seed)  # as Learner.build seeds before it builds the policy
            policy = build_policy(cfg)
            # The learner's threads, as in the actor it stands in for (measured here, 2 cores
            # shared with other work: 60 tiny-DiT steps took 51 s with two OpenMP threads, 2.9 s
            # with one).
            torch.set_num_threads(cfg.runtime.torch_threads)
            try:
                return apply_warm_start(policy, cfg, self.prompts, progress=self.progress)
            finally:
                torch.set_num_threads(threads)

    def _explorer(self) -> Explorer:
        """The explorer, with the planner state saved for the resumed iteration when there is a usable one."""
        explorer = Explorer(self.cfg, self.prompts)
        if self.start_step == 0:
            return explorer
        try:
            if explorer.load(self.out / "explorer", self.start_step):
                return explorer
            why = "none saved"
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:
            why = f"unreadable ({type(err).__name__})"
            explorer = Explorer(self.cfg, self.prompts)  # nothing half-loaded
        first = explores_first(self.cfg.exploration, self.start_step, self.start_step)
        then = "explored first, on the critical path" if first else "on random seeds"
        logger.warning(f"explorer state for iteration {self.start_step}: {why}; it starts {then}")
        return explorer

    # ---- the loop -------------------------------------------------------------------------------

    def requests(self, step: int) -> list[Request]:
        """Iteration `step`'s rollout requests: one per prompt, G seeds each, at weight version `step`."""
        cfg = self.cfg
        prompts = draw_prompts(self.prompts, cfg.train.prompts_per_step, cfg.seed, step)
        seeds = tuple(sample_seeds(step, cfg.train.group_size))
        return [Request(f"it{step}/p{p.id}", Kind.ROLLOUT, p.id, p.text, seeds, weight_version=step, order=i)
                for i, p in enumerate(prompts)]

    def evaluation_requests(self, step: int) -> list[Request]:
        """Scoring the weights of iteration `step` on the fixed evaluation prompts and seeds (seeds
        far above any training seed, so evaluation never shares noise with training)."""
        seeds = tuple(range(EVAL_SEED0, EVAL_SEED0 + self.cfg.train.eval_seeds))
        return [Request(f"eval{step}/p{p.id}", Kind.ROLLOUT, p.id, p.text, seeds, weight_version=step, order=i)
                for i, p in enumerate(self.eval_prompts)]

    def evaluate(self, step: int) -> dict[str, Any]:
        """Score the weights of iteration `step` (the EMA with `train.ema_decay`) on the evaluation
        prompts and seeds; write their samples under eval/ (a DiT's image grid, an LLM's completions)
        and return the metrics: `eval_reward` and each component's `eval_reward_<label>`."""
        rt, requests = self.runtime, self.evaluation_requests(step)
        parts = rt.evaluate(requests)
        scores = rt.rewards(parts)
        rollout = Rollout.concat(rt.fetch(parts))
        rt.release(requests)
        self.eval_written = write_evaluation(self.out / "eval", step, rollout, self.cfg.train.eval_seeds, scores.total)
        return {"eval_reward": scores.total.float().mean().item(),
                **{f"eval_reward_{label}": v.float().mean().item() for label, v in scores.components.items()}}

    def iteration(self, step: int) -> dict[str, Any]:
        """Run iteration `step` (`iteration_controller` orders its phases and places its update;
        `training_iteration` does them here) and return its metrics row, which it has written."""
        work = TrainingIteration(self, step)
        self.controller.run(step, work)
        self.checkpoint_s = work.checkpoint_s
        if work.checkpoint_s is not None:
            self.checkpoint_seconds.append(work.checkpoint_s)
        return work.row

    def rollout(self, step: int, requests: list[Request]) -> list[Any]:
        """The iteration's rollout; with an in-flight store, resumed from what it holds of this
        iteration (a controller restarted mid-rollout), and snapshotted to it while it runs."""
        inflight = self.folder.inflight
        if inflight is None:
            return self.runtime.rollout(requests)
        seeds = {r.id: tuple(r.seeds) for r in requests}
        done, partial = inflight.load(step, seeds) if step == self.start_step else ({}, {})
        if done or partial:
            logger.info(f"iteration {step} resumes its rollout from {inflight.store.uri}: {len(done)} results, "
                        f"{len(partial)} requests at their committed steps")
        todo = [replace(r, step=partial[r.id][0], state=partial[r.id][1]) if r.id in partial else r
                for r in requests if r.id not in done]

        def snapshot(results: dict[str, Any], committed: dict[str, tuple[int, Any]]) -> None:
            try:
                inflight.save(step, seeds, {**done, **results}, committed)
            except StoreError as err:  # a lost snapshot is work that may be redone, not a failure
                logger.warning(f"in-flight state of iteration {step} not stored: {err}")

        got = self.runtime.rollout(todo, snapshot, self.cfg.cloud.inflight_every_s) if todo else []
        if not done:
            return got  # as the runtime holds them (by reference on Ray)
        by_id = {**done, **dict(zip([r.id for r in todo], self.runtime.fetch(got)))}
        return [by_id[r.id] for r in requests]

    def train(self) -> dict[str, Any]:
        """Run the remaining iterations, write final/ and summary.json; always shuts the runtime down
        and lets the run folder go."""
        try:
            return self._train()
        finally:
            self.folder.release()

    def _train(self) -> dict[str, Any]:
        try:
            self._loop()
            final = self.out / "final"
            self.runtime.save_final(final)
            self.cost.stop()  # the run's dollars from here on: summary.json, cost.json and status.json say one figure
            summary = summarize(self.out / "metrics.jsonl", self.cfg.train.steps)
            summary.update({"final_dir": str(final), "warm_start": self.warm, "policy": self.cfg.policy.kind,
                            "runtime": self.cfg.runtime.kind, "resumed_from": self.start_step,
                            **self.runtime.stats(), **self.cost.summary(), "cost_counts": COUNTS[notional_fleet(self.cfg)],
                            "checkpoint_s": self.checkpoint_seconds, **self._device_memory(),
                            "stop_reason": self.stop_reason})
        finally:
            save_spent(self.out, self._spent())  # a crashed session's dollars count too, saved first
            self.runtime.shutdown()
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        self.folder.store_final(summary["steps"], summary.get("reward_last"), self.stop_reason, self.cost.summary(),
                                self.runtime.engine)
        return summary

    def _loop(self) -> None:
        from tqdm import tqdm

        steps = self.cfg.train.steps
        self.folder.open_tensorboard()
        self.bar = tqdm(initial=self.start_step, total=steps, desc="train", unit="it", disable=not self.progress,
                        file=sys.stderr)
        self.started = time.perf_counter()
        self.cost.start(self.start_step, self._restart_s)
        if notional_fleet(self.cfg):  # priced for the iterations alone (`cost_control.COUNTS`)
            self.cost.meter.restart()
        self.folder.report(self.start_step, None, self.cost.summary(), self.runtime.engine)
        try:
            _, stopped = run_loop(self.runtime.engine, self.cost, self.start_step, steps, self)
        finally:
            self.bar.close()
        self.stop_reason = stopped or "steps"
        self.folder.close_tensorboard()

    # ---- the run loop's steps (`spotlight.iteration.run_loop.Run`) ----------------------------------

    def before(self, step: int) -> None:
        pass  # the cost control's question comes first: nothing to prepare

    def stopped(self, step: int, decision: Decision) -> None:
        """A budget or deadline stop: checkpoint the iterations done unless the newest checkpoint holds them."""
        logger.info(decision.message)
        if self.saved != step:
            self.checkpoint(step)

    def switched(self, step: int, decision: Decision) -> None:
        logger.info(decision.message)

    def run_iteration(self, step: int) -> Completed:
        try:
            row = self.iteration(step)
        except NonFiniteUpdate as err:
            raise NonFiniteUpdate(f"{getattr(err, 'cause', None) or err}; {self._kept()}") from None
        except RewardError as err:  # a reward failed twice: stop as cleanly (`rewards.RewardWorker`)
            written = self._write_traceback(err)
            also = f"; its traceback: {written}" if written is not None else ""
            raise RewardError(f"{err}; iteration {step} stopped, {self._kept()}{also}") from None
        return Completed(row, self.checkpoint_s)

    def _kept(self) -> str:
        """What a run stopped by an error keeps, in words for its last line."""
        if self.saved == 0 and checkpoint.latest(self.out / "checkpoints") is None:
            return "no checkpoint was written yet (a re-run starts at iteration 0)"
        return f"nothing after the checkpoint of iteration {self.saved} is kept"

    def _write_traceback(self, err: RewardError) -> Path | None:
        """The full traceback of what a reward raised (`RewardError.traceback`), in the run folder's
        reward-error.txt under the error's line; returns where, as the folder was given; None when it
        raised nothing (a timeout, bad scores)."""
        if not err.traceback:
            return None
        (self.out / REWARD_TRACEBACK).write_text(f"{err}\n\n{err.traceback}")
        return self.given / REWARD_TRACEBACK

    def after(self, step: int, done: Completed) -> str | None:
        """The dollars saved, the row in TensorBoard, the store's copy and the status (`_publish`)."""
        row = done.value
        save_spent(self.out, self._spent())
        self.folder.add_row(row, step, self.eval_written)
        logger.debug(f"iteration {step}: {json.dumps(row, default=str)}")  # metrics.jsonl's row, under --verbose
        self.eval_written = None
        # after the row: the store's metrics reach it
        self.folder.publish(step + 1, row["reward_mean"], self.cost.summary(), self.runtime.engine)
        self.bar.update(1)
        self.bar.set_postfix(reward=f"{row['reward_mean']:.3f}", std=f"{row['group_reward_std']:.3f}")
        return None

    def _device_memory(self) -> dict[str, int | None]:
        """The GPU memory of a run whose learner computes in this process on CUDA (the local
        runtime with one learner process; None each otherwise): `device_peak_bytes`, the most
        torch's allocator reserved (its slack counts: what the memory estimate must cover);
        `device_peak_allocated_bytes`, the most its tensors held (the two give the allocator's
        slack); `device_outside_bytes`, what the process holds on the GPU outside the allocator at
        the end (the CUDA context, kernels, cuBLAS workspaces, an in-process reward's own GPU
        memory: `make gpu-check` records it as the estimate's context, the process alone on its GPU)."""
        keys = ("device_peak_bytes", "device_peak_allocated_bytes", "device_outside_bytes")
        cfg = self.cfg
        if cfg.runtime.kind != "local" or cfg.train.learner_gpus > 1 or not cfg.device.startswith("cuda"):
            return dict.fromkeys(keys)
        import torch

        device = torch.device(cfg.device)
        free, total = torch.cuda.mem_get_info(device)
        reserved = torch.cuda.memory_reserved(device)
        return dict(zip(keys, (int(torch.cuda.max_memory_reserved(device)),
                               int(torch.cuda.max_memory_allocated(device)), int(total - free - reserved))))

    def _spent(self) -> Spent:
        return Spent(self.cost.spent_usd(), max(0.0, self._restart_s))

    def checkpoint(self, done: int) -> None:
        """Checkpoint the weights after `done` iterations."""
        if self.explorer is not None:  # before the checkpoint that names it as resumable
            self.explorer.save(self.out / "explorer", done)
        self.runtime.save_checkpoint(self.out / "checkpoints")
        self.saved = done


def summarize(metrics_path: Path, steps: int, window: int = 5) -> dict[str, Any]:
    """Summary of a run's metrics: first/last reward and the first-vs-last-window comparison.

    `improvement_se` is (mean of the last `window` iterations - mean of the first) divided by the
    standard error of that difference; > 3 is the bar for "clearly learned"."""
    text = metrics_path.read_text() if metrics_path.exists() else ""  # none: no iteration ran (a budget too small)
    rows = [loads(line, max_bytes=ROW_BYTES, what="metrics.jsonl row") for line in text.splitlines() if line.strip()]
    rewards = [r["reward_mean"] for r in rows]
    out: dict[str, Any] = {"steps": len(rows), "steps_requested": steps,
                           "wall_s": sum(r["wall_s"] for r in rows)}
    if not rows:
        return out
    out["reward_first"], out["reward_last"] = rewards[0], rewards[-1]
    w = min(window, len(rows) // 2)
    if w >= 2:
        first, last = rewards[:w], rewards[-w:]
        m1, m2 = sum(first) / w, sum(last) / w
        v1 = sum((x - m1) ** 2 for x in first) / (w - 1)
        v2 = sum((x - m2) ** 2 for x in last) / (w - 1)
        se = math.sqrt(v1 / w + v2 / w)
        out.update({f"reward_first{w}": m1, f"reward_last{w}": m2, "improvement_stderr": se,
                    "improvement_se": (m2 - m1) / se if se > 0 else (math.inf if m2 > m1 else 0.0)})
    return out
