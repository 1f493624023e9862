"""A run config simulated as `spotlight train` would run it (`spotlight simulate --config RUN.yaml`).

The config is read by the loader `spotlight train` uses (`spotlight.config.load_config`), so a
config training refuses is refused here with the same line. The simulated run then goes through
the controller built from the same settings (`IterationController.from_config`: its phases, when
it evaluates and checkpoints, and `train.update_on` with the measured rule — the simulator's
modelled seconds in place of a live run's measured ones), so that both run the same phases in the
same order and place every update alike
(`tests/test_iteration_controller.py::test_train_and_simulate_run_the_same_iterations`).

How the config maps onto the simulator: one simulated GPU per rollout worker (`runtime.kind:
local`: one on-demand worker; `ray`: `runtime.ondemand_workers` on demand, at least 1, and
`runtime.spot_workers` spot ones at the trace's peak); `train.prompts_per_step` x
`train.group_size` samples for `train.steps` iterations, every one run (no stop at the target);
the tiny DiT on the `tiny-cpu` step times, the real Qwen-Image on the default profile (each with
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
from spotlight.train.iteration_controller import IterationController
from spotlight.train.iteration_time import checkpoint_seconds_estimate

POLICY = "config"
"""The name the simulated run config's result goes under in `policies`."""


def simulated_config(run: RunConfig) -> tuple[SimConfig, Policy]:
    """The simulator's settings and policy for `run` (module docstring)."""
    if run.policy.kind != "dit":
        raise ConfigError(f"policy.kind: the simulator models DiT runs only, got {run.policy.kind}")
    dit, t, ex, rt = run.policy.dit, run.train, run.exploration, run.runtime
    lora = run.policy.lora
    if lora.enabled and lora.target_modules is not None:
        raise ConfigError("policy.lora.target_modules: the simulator counts adapters on the default targets "
                          "only (expected null)")
    rank = lora.rank if lora.enabled else 0
    if dit.preset == "tiny":
        steps = replace(StepTimes.profile("tiny-cpu"), denoise_steps=run.sampler.num_steps,
                        trained_steps=len(run.sampler.sde_steps), lora_rank=rank)
        resolution = max(16, dit.latent_side * 16 // 2)  # the simulator's tokens: (resolution / 16)^2
    else:
        steps, resolution = replace(StepTimes(), lora_rank=rank, trained_steps=len(run.sampler.sde_steps),
                                    denoise_steps=run.sampler.num_steps), dit.resolution
    local = rt.kind == "local"
    spot = 0 if local else rt.spot_workers
    # The update's grain is the run's (`SimConfig.gradient_parts`): its requests and their bytes are
    # the ones the runtime sends (tests/test_grain_contract.py).
    cfg = SimConfig(gpus=1 if local else max(1, rt.ondemand_workers), spot_gpus=spot, iterations=t.steps,
                    resolution=resolution, prompts=t.prompts_per_step, group_size=t.group_size,
                    candidates_per_prompt=max(ex.candidates_per_prompt, t.group_size),
                    sync_explore_per_prompt=max(1, ex.samples_per_step // max(t.prompts_per_step, 1)),
                    planner="uniform" if ex.planner == "uniform" else "bandit", seed=run.seed,
                    stop_at_target=False, step_times=steps, checkpoint_s=checkpoint_seconds_estimate(run),
                    micro_batch=t.micro_batch, parts_per_request=t.parts_per_request,
                    updates_per_step=t.updates_per_step)
    policy = Policy(POLICY, spot=spot > 0, explore="idle_spot" if ex.enabled else "none",
                    fleet_update=t.update_on != "learner")
    return cfg, policy


def simulate_run(run: RunConfig, trace: Trace, progress: ProgressModel | None = None) -> dict[str, Any]:
    """`run` simulated on `trace`: {"policies": {"config": result with `iterations_log`}, ...}; each
    log entry is one iteration's {"step", "phases", "update_on_fleet"}, as a training run's
    metrics.jsonl rows give them."""
    from spotlight.sim.simulation import Simulation
    from spotlight.sim.simulator import gpu_prices

    cfg, policy = simulated_config(run)
    progress = progress or ProgressModel.calibrated(iterations_scale=cfg.iterations_scale)
    od, spot, row = gpu_prices(cfg)
    sim = Simulation(cfg, policy, trace, progress, (od, spot))
    sim.eval_samples = run.train.eval_prompts * run.train.eval_seeds
    sim.controller = IterationController.from_config(run, sim.clock, 0, evaluation=run.evaluates)
    sim.iterations_log = []
    result = sim.run()
    return {"policies": {POLICY: {**result, "iterations_log": sim.iterations_log}}, "trace": trace.source,
            "config": {"run": run.to_dict(), "gpus": cfg.gpus, "spot_gpus_peak": cfg.peak_spot_gpus,
                       "price_per_gpu_h": {"ondemand": od, "spot": spot, "priced_from": row}}}
