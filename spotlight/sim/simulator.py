"""The trace-replay simulator: how long and how much a GRPO run takes on a spot fleet.

The simulator is the live fleet engine (`schedulers.fleet.FleetEngine`) with a modelled executor
(`spotlight.sim.modelled_executor`) on a `ManualClock`: who serves when, what a notice, a death or a
join does, the train phase's exploration and its cancel-on-publish are the code the live runtimes
run. Also live: the pull queue (leases, give-back, re-queue from the last commit, exactly-once,
its `steps_recomputed` counter), the trace mapping (`schedulers.traces.replay_schedule`), the
regroup policy (`elastic_sp.regroup_policy`), the exploration planner (`planners.allocation` over
a `SeedPool`), and the cost meter and budget policy (`cloud.cost`) priced from `cloud.prices`.
What is *modelled*: how long a request takes (`spotlight.sim.step_time.StepTimes`), and what the
learning signal of a chosen group is (`spotlight.sim.progress_model`).

Policies that differ only in configuration run here: `ondemand` (no spot nodes), `ondemand_total`
(no spot nodes, the spot fleet's peak rented on demand instead), `spotlight_noexplore` (spot nodes), `sync_explore` (exploration on the critical path before each
rollout), `spotlight` (spot nodes, exploring on idle spot workers while the learner trains),
`near_all_spot` (`spotlight` with one on-demand GPU, the learner's). Three behave differently and
live in files of their own: `spot_restart` (any preemption restarts the job from the iteration's
checkpoint: `spotlight.sim.restart`), `managed_restart` (the same, all spot, as a SkyPilot managed
job: it waits for capacity, and a loss throws away the iterations since its last checkpoint:
`spotlight.sim.managed_restart`) and the clairvoyant `oracle` (`spotlight.sim.oracle`).

One iteration: [explore on the critical path] -> rollout (every worker) -> train (on the
on-demand GPUs; meanwhile, with exploration on idle spot, spot workers explore the next
iteration's seeds, cancelled when the weights are published) -> weight sync. Spot nodes come and go
by the trace (it runs through every phase here); a trace node stands for a block of
`spot_gpus / max_live` GPUs; a removed node gets its notice `notice_s` before and a joining node
serves after `join_s`. After the trace ends the fleet stays as it was at its end.

Every policy is compared with the four baselines simulated in the same run (`BASELINES`,
`compare`), and with the two former ones (`ALSO_COMPARED`): `speedup_vs_<baseline>` and
`cost_ratio_vs_<baseline>` in its result.

Determinism: no wall clock; every draw comes from generators seeded by (seed, iteration, prompt);
ties in the event heap break by insertion order. Same config and trace -> same result.
"""

from __future__ import annotations

from typing import Any, Callable

from cloud.prices import NodePrice, PriceTable
from schedulers.traces import Trace
from spotlight.config import ConfigError
from spotlight.sim.config import POLICIES, Policy, SimConfig
from spotlight.sim.managed_restart import ManagedRestartSimulation
from spotlight.sim.oracle import OracleSimulation
from spotlight.sim.progress_model import ProgressModel
from spotlight.sim.restart import RestartSimulation
from spotlight.sim.simulation import Simulation, spot_peak_gpus

__all__ = ["ALSO_COMPARED", "BASELINES", "POLICIES", "Policy", "SimConfig", "Simulation", "compare", "gpu_prices", "make_simulation",
           "simulate"]

BASELINES = ("ondemand", "ondemand_total", "near_all_spot", "managed_restart")
"""What every policy is compared with (docs/simulator.md#baselines): on-demand GRPO on the same
on-demand GPUs, on-demand GRPO on as many GPUs in all (on-demand + the spot fleet's peak),
`spotlight` on the same spot fleet with one on-demand GPU (the learner's) instead of `gpus`, and
a SkyPilot-style all-spot managed job restarting from its checkpoint on the same spot fleet."""
ALSO_COMPARED = ("spot_restart", "sync_explore")
"""The former baselines, still compared with where simulated (their fields are in `--json`):
restart-from-checkpoint beside the on-demand GPUs, and exploration on the critical path."""


def make_simulation(cfg: SimConfig, policy: Policy, trace: Trace, progress: ProgressModel,
                    prices: tuple[float, float], on_iteration: Callable[[int], None] | None = None) -> Simulation:
    """The simulation of `policy`: the engine's, or one of the three that behave differently (a
    restart-from-checkpoint job with no on-demand GPU is the all-spot managed job)."""
    if policy.oracle:
        return OracleSimulation(cfg, policy, trace, progress, prices, on_iteration)
    if not policy.elastic:
        managed = policy.ondemand_gpus == 0
        return (ManagedRestartSimulation if managed else RestartSimulation)(cfg, policy, trace, progress, prices,
                                                                            on_iteration)
    return Simulation(cfg, policy, trace, progress, prices, on_iteration)


def gpu_prices(cfg: SimConfig) -> tuple[float, float, str]:
    """(on-demand, spot) dollars per GPU-hour from the price table, and the row used."""
    price = _gpu_price(cfg)
    return price.ondemand_usd_h, price.spot_usd_h, price.row.instance_type


def _gpu_price(cfg: SimConfig) -> NodePrice:
    """One GPU's prices and the table row they come from (its `source` and `date` go into the result)."""
    table = PriceTable.load(cfg.prices)
    gpu = cfg.price_gpu or cfg.step_times.gpu
    if cfg.price_gpu is None and gpu == "tiny-cpu":  # the measured CPU profile: no table prices a CPU
        gpu = "H100"
    return table.node_price(gpu, 1)  # an unknown GPU: a PriceError naming the GPUs the table prices


def compare(policies: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each result with `speedup_vs_<b>` (b's hours to target / the policy's: above 1, sooner) and
    `cost_ratio_vs_<b>` (the policy's dollars to target / b's: below 1, cheaper) for every baseline
    b in `BASELINES` and `ALSO_COMPARED` among `policies`; None where either did not reach the
    target. The fields go before the long `timeline` and `progress` lists, so that a reader of the
    JSON sees them."""
    out = {}
    for name, r in policies.items():
        ratios: dict[str, float | None] = {}
        for b in BASELINES + ALSO_COMPARED:
            base = policies.get(b)
            if base is None:
                continue  # not simulated in this run: no field rather than a made-up one
            hours, base_hours = r["time_to_target_h"], base["time_to_target_h"]
            reached = hours is not None and base_hours is not None and hours > 0
            ratios[f"speedup_vs_{b}"] = base_hours / hours if reached else None
            ratios[f"cost_ratio_vs_{b}"] = r["cost_usd"] / base["cost_usd"] if reached and base["cost_usd"] > 0 else None
        lists = {k: r[k] for k in ("timeline", "progress") if k in r}
        out[name] = {**{k: v for k, v in r.items() if k not in lists}, **ratios, **lists}
    return out


def simulate(cfg: SimConfig, trace: Trace, policies: list[str] | None = None,
             progress: ProgressModel | None = None,
             on_iteration: Callable[[str, int], None] | None = None, constants: str = "all") -> dict[str, Any]:
    """Every policy in `policies` (default all) on `trace`: {"policies": {name: result}, ...}.
    `on_iteration(policy, iterations done)` is called after each simulated iteration (a progress bar;
    "NAME (pessimistic)" for a set other than typical).

    `constants` "all" runs every policy at each constant set of `spotlight.sim.assumptions`
    (pessimistic, typical, optimistic; "typical": that one, 3x sooner): "policies" holds the typical
    results, "ranges" {policy: {field: {set: value}}} the hours and dollars to target and every
    baseline comparison at each set, and "assumptions" each set's figures with what they assume."""
    names = list(POLICIES) if policies is None else policies
    for n in names:
        if n not in POLICIES:
            raise ConfigError(f"--policy: unknown policy {n!r} (expected all or one of {', '.join(POLICIES)})")
    progress = progress or ProgressModel.calibrated(iterations_scale=cfg.iterations_scale)
    price = _gpu_price(cfg)
    od, spot, row = price.ondemand_usd_h, price.spot_usd_h, price.row
    from spotlight.sim import assumptions

    runs = {}
    for constant_set in sorted(assumptions.sets(constants), key=lambda s: s != "typical"):  # typical first
        at = assumptions.apply(constant_set, cfg)
        label = "" if constant_set == "typical" else f" ({constant_set})"
        runs[constant_set] = compare({
            name: make_simulation(at, POLICIES[name], trace, progress, (od, spot), None if on_iteration is None else
                                  lambda it, name=name, label=label: on_iteration(name + label, it)).run()
            for name in names})
    return {
        "policies": runs["typical"],
        "trace": trace.source,
        "config": {"gpus": cfg.gpus, "spot_gpus_peak": spot_peak_gpus(cfg, trace),
                   "ondemand_total_gpus": cfg.gpus + spot_peak_gpus(cfg, trace),
                   "iterations": cfg.iterations, "resolution": cfg.resolution, "prompts": cfg.prompts,
                   "group_size": cfg.group_size, "seed": cfg.seed, "gpu": cfg.step_times.gpu,
                   "notice_s": cfg.notice_s, "join_s": cfg.join_s, "objective": cfg.objective,
                   "price_per_gpu_h": {"ondemand": od, "spot": spot, "priced_from": row.instance_type},
                   "price_source": row.source, "price_row": row.to_dict(), "baselines": list(BASELINES)},
        "progress_model": progress.to_dict(),
        "ranges": assumptions.ranges(runs),
        "assumptions": assumptions.describe(cfg, tuple(s for s in assumptions.SETS if s in runs)),
    }
