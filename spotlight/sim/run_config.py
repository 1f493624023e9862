"""A run config simulated as `spotlight train` would run it (`spotlight simulate --config RUN.yaml`).

The config is read by the loader `spotlight train` uses (`spotlight.config.load_config`), so a
config training refuses is refused here with the same line. The simulated run then goes through
the controller built from the same settings (`IterationController.from_config`: its phases, when
it evaluates and checkpoints, and `train.update_on` with the measured rule — the simulator's
modelled seconds in place of a live run's measured ones), so that both run the same phases in the
same order and place every update alike
(`tests/spotlight/iteration/test_iteration_controller.py::test_train_and_simulate_run_the_same_iterations`).

How the config maps onto the simulator: one simulated GPU per rollout worker (`runtime.kind:
local`: one on-demand worker; `ray`: `runtime.ondemand_workers` on demand, at least 1, and
`runtime.spot_workers` spot ones at the trace's peak); `train.prompts_per_step` x
`train.group_size` samples for `train.steps` iterations, every one run (no stop at the target), in
requests of one prompt's G samples committed every `runtime.commit_every` steps, as the runtime's;
the trace replayed `runtime.trace_speedup` times faster with `runtime.notice_s` of notice (in trace
seconds), as `train --preemption-trace` replays it, and a tiny node joining in the tiny profile's
`cold_start_s`; the tiny DiT on the `tiny-cpu` step times (or measured ones: `step_times`,
docs/simulator-validation.md), the real Qwen-Image on the default profile (each with
the run's `sampler.num_steps`, trained SDE steps and LoRA rank); the update at the run's grain —
`train.micro_batch` rows a micro-batch, `train.parts_per_request` a request, `train.updates_per_step`
rounds — so its requests, gradients and bytes are the runtime's; exploration's budget as the
config sets it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from schedulers.traces import Trace
from spotlight.config import ConfigError, RunConfig
from spotlight.sim.config import Policy, SimConfig
from spotlight.sim.progress_model import ProgressModel
from spotlight.sim.step_time import StepTimes
from spotlight.iteration.iteration_time import checkpoint_seconds_estimate

POLICY = "config"
"""The name the simulated run config's result goes under in `policies`."""


def simulated_config(run: RunConfig, step_times: StepTimes | None = None) -> tuple[SimConfig, Policy]:
    """The simulator's settings and policy for `run` (module docstring); `step_times`: the step-time
    figures to start from instead of the preset's profile (measured ones: `StepTimes.load`)."""
    if run.policy.kind != "dit":
        raise ConfigError(f"policy.kind: the simulator models DiT runs only, got {run.policy.kind}")
    dit, t, ex, rt = run.policy.dit, run.train, run.exploration, run.runtime
    lora = run.policy.lora
    if lora.enabled and lora.target_modules is not None:
        raise ConfigError("policy.lora.target_modules: the simulator counts adapters on the default targets "
                          "only (expected null)")
    rank = lora.rank if lora.enabled else 0
    tiny = dit.preset == "tiny"
    base = step_times if step_times is not None else StepTimes.profile("tiny-cpu") if tiny else StepTimes()
    steps = replace(base, denoise_steps=run.sampler.num_steps, trained_steps=len(run.sampler.sde_steps),
                    lora_rank=rank)
    resolution = max(16, dit.latent_side * 16 // 2) if tiny else dit.resolution  # tiny: (resolution / 16)^2 tokens
    local = rt.kind == "local"
    spot = 0 if local else rt.spot_workers
    # The update's grain is the run's (`SimConfig.gradient_parts`): its requests and their bytes are
    # the ones the runtime sends (tests/spotlight/sim/test_transfer_bytes.py).
    cfg = SimConfig(gpus=1 if local else max(1, rt.ondemand_workers), spot_gpus=spot, iterations=t.steps,
                    resolution=resolution, prompts=t.prompts_per_step, group_size=t.group_size,
                    candidates_per_prompt=max(ex.candidates_per_prompt, t.group_size),
                    sync_explore_per_prompt=max(1, ex.samples_per_step // max(t.prompts_per_step, 1)),
                    planner="uniform" if ex.planner == "uniform" else "bandit", seed=run.seed,
                    stop_at_target=False, step_times=steps, checkpoint_s=checkpoint_seconds_estimate(run),
                    micro_batch=t.micro_batch, parts_per_request=t.parts_per_request,
                    updates_per_step=t.updates_per_step,
                    # The runtime's requests: one per prompt of G samples (`Trainer.requests`,
                    # `Explorer.plan`), each committed every `runtime.commit_every` steps.
                    samples_per_request=t.group_size, commit_every=rt.commit_every, learner_gpus=t.learner_gpus,
                    # A replayed trace's notice, in the seconds the run replays it at (`simulate_run`;
                    # SimConfig's bound, an hour, where a slowed replay would stretch it further).
                    notice_s=min(rt.notice_s / rt.trace_speedup, 3600.0),
                    # A tiny node joins in the tiny model's cold start, not a cloud VM's 240 s.
                    **({"join_s": steps.cold_start_s} if tiny else {}))
    policy = Policy(POLICY, spot=spot > 0, explore="idle_spot" if ex.enabled else "none",
                    fleet_update=t.update_on != "learner")
    return cfg, policy


def simulate_run(run: RunConfig, trace: Trace, progress: ProgressModel | None = None,
                 step_times: StepTimes | None = None) -> dict[str, Any]:
    """`run` simulated on `trace`, replayed `runtime.trace_speedup` times faster than it was
    recorded, as `spotlight train --preemption-trace` replays it: {"policies": {"config": result
    with `iterations_log`}, "fleet_events": the engine's counters (notices, kills, workers_lost),
    ...}; each log entry is one iteration's {"step", "phases", "update_on_fleet"}, as a training
    run's metrics.jsonl rows give them. `step_times`: as `simulated_config` takes them."""
    from spotlight.sim.simulation import Simulation
    from spotlight.sim.simulator import gpu_prices

    cfg, policy = simulated_config(run, step_times)
    speedup = run.runtime.trace_speedup
    if speedup != 1.0:
        trace = Trace([replace(e, t_s=e.t_s / speedup) for e in trace.events], trace.source,
                      None if trace.end_s is None else trace.end_s / speedup)
    progress = progress or ProgressModel.calibrated(iterations_scale=cfg.iterations_scale)
    od, spot, row = gpu_prices(cfg)
    sim = Simulation(cfg, policy, trace, progress, (od, spot), run=run)
    result = sim.run()
    return {"policies": {POLICY: {**result, "iterations_log": sim.iterations_log}}, "trace": trace.source,
            "fleet_events": dict(sim.engine.counters),
            "config": {"run": run.to_dict(), "gpus": cfg.gpus, "spot_gpus_peak": cfg.peak_spot_gpus,
                       "price_per_gpu_h": {"ondemand": od, "spot": spot, "priced_from": row}}}
