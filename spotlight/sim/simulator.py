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

Prices as a range (`price_rows`, `--price-rows`; docs/simulator.md#prices-as-a-range): besides the
row the run is priced from, every policy's dollars at each price row of `cloud.prices.price_scenarios`
(`result["price_range"]`). Under `--objective time` without a budget no decision reads a price, so a
result is re-priced from the GPU-hours its meter billed (`reprice`); otherwise each row is simulated
again at the typical constants (`prices_decide` says why). `usd_per_hour_sooner_vs_<b>` prices an
hour saved against `near_all_spot` and `managed_restart` (`usd_per_hour_sooner`), in every result,
and for one policy over the constant sets and the price rows in `result["price_of_an_hour_saved"]`.

Determinism: no wall clock; every draw comes from generators seeded by (seed, iteration, prompt);
ties in the event heap break by insertion order. Same config and trace -> same result.
"""

from __future__ import annotations

from typing import Any, Callable

from cloud.prices import NodePrice, PriceRow, PriceScenario, PriceTable, price_scenarios
from schedulers.traces import Trace
from spotlight.config import ConfigError
from spotlight.sim.config import POLICIES, Policy, SimConfig
from spotlight.sim.managed_restart import ManagedRestartSimulation
from spotlight.sim.oracle import OracleSimulation
from spotlight.sim.progress_model import ProgressModel
from spotlight.sim.restart import RestartSimulation
from spotlight.sim.simulation import Simulation, spot_peak_gpus

__all__ = ["ALSO_COMPARED", "BASELINES", "HOUR_BASELINES", "POLICIES", "Policy", "SimConfig", "Simulation", "compare",
           "gpu_prices", "make_simulation", "price_rows_of", "prices_decide", "reprice", "simulate",
           "usd_per_hour_sooner"]

BASELINES = ("ondemand", "ondemand_total", "near_all_spot", "managed_restart")
"""What every policy is compared with (docs/simulator.md#baselines): on-demand GRPO on the same
on-demand GPUs, on-demand GRPO on as many GPUs in all (on-demand + the spot fleet's peak),
`spotlight` on the same spot fleet with one on-demand GPU (the learner's) instead of `gpus`, and
a SkyPilot-style all-spot managed job restarting from its checkpoint on the same spot fleet."""
ALSO_COMPARED = ("spot_restart", "sync_explore")
"""The former baselines, still compared with where simulated (their fields are in `--json`):
restart-from-checkpoint beside the on-demand GPUs, and exploration on the critical path."""
HOUR_BASELINES = ("near_all_spot", "managed_restart")
"""The baselines an hour saved is priced against (`usd_per_hour_sooner_vs_<b>`): the two that pay
almost only spot prices, so what a policy's on-demand GPUs buy is time, at a price."""
HOUR_SAVED_POLICY = "spotlight"
"""The policy `result["price_of_an_hour_saved"]` speaks of when simulated (else the first of
`--policy` that is not one of `HOUR_BASELINES`)."""


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


def _price_gpu(cfg: SimConfig) -> str:
    """The GPU the table prices the run at: `price_gpu`, else the step times' (the measured CPU
    profile, which no table prices, as an H100)."""
    gpu = cfg.price_gpu or cfg.step_times.gpu
    return "H100" if cfg.price_gpu is None and gpu == "tiny-cpu" else gpu


def _gpu_price(cfg: SimConfig) -> NodePrice:
    """One GPU's prices and the table row they come from (its `source` and `date` go into the result)."""
    return PriceTable.load(cfg.prices).node_price(_price_gpu(cfg), 1)  # an unknown GPU: a PriceError naming the known


def price_rows_of(cfg: SimConfig, price_rows: str) -> list[PriceScenario]:
    """The price rows `price_rows` names for the run's GPU (`cloud.prices.price_scenarios`); a bad
    value is one PriceError line."""
    return price_scenarios(PriceTable.load(cfg.prices), _price_gpu(cfg), price_rows)


def prices_decide(cfg: SimConfig) -> str | None:
    """Why a price changes what a run does (so another price row needs its own simulation), or None:
    under `--objective time` without a budget no decision reads a price."""
    if cfg.objective != "time":
        return f"--objective {cfg.objective}: the GPUs each policy rents depend on the prices"
    if cfg.budget_usd is not None:
        return "--budget-usd: when the budget stops a run depends on the prices"
    return None


def reprice(r: dict[str, Any], ondemand_usd_gpu_h: float, spot_usd_gpu_h: float) -> dict[str, float | None]:
    """A result's dollars at other per-GPU-hour prices, from the GPU-hours its meter billed by kind
    (`ondemand_gpu_h`, `spot_gpu_h` and those to the target): exact where `prices_decide` is None."""
    def usd(ondemand_h: float | None, spot_h: float | None) -> float | None:
        return None if ondemand_h is None else ondemand_usd_gpu_h * ondemand_h + spot_usd_gpu_h * spot_h

    return {"cost_usd": usd(r["ondemand_gpu_h_to_target"], r["spot_gpu_h_to_target"]),
            "total_cost_usd": usd(r["ondemand_gpu_h"], r["spot_gpu_h"])}


def usd_per_hour_sooner(r: dict[str, Any], base: dict[str, Any]) -> tuple[float | None, str | None]:
    """The price of an hour saved against `base`: (r's dollars to the target - base's) / (base's
    hours to the target - r's), in dollars per hour sooner (negative: sooner *and* cheaper); or
    (None, why) where either did not reach the target or r is not sooner."""
    hours, base_hours = r["time_to_target_h"], base["time_to_target_h"]
    if hours is None or base_hours is None:
        return None, f"the {'policy' if hours is None else 'baseline'} did not reach the target"
    if hours >= base_hours:
        return None, f"not sooner ({hours:.2f} h against {base_hours:.2f} h)"
    return (r["cost_usd"] - base["cost_usd"]) / (base_hours - hours), None


def compare(policies: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each result with `speedup_vs_<b>` (b's hours to target / the policy's: above 1, sooner) and
    `cost_ratio_vs_<b>` (the policy's dollars to target / b's: below 1, cheaper) for every baseline
    b in `BASELINES` and `ALSO_COMPARED` among `policies`; None where either did not reach the
    target; and `usd_per_hour_sooner_vs_<b>` for b in `HOUR_BASELINES` (`usd_per_hour_sooner`). The
    fields go before the long `timeline` and `progress` lists, so that a reader of the JSON sees them."""
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
        for b in HOUR_BASELINES:
            if b in policies:
                ratios[f"usd_per_hour_sooner_vs_{b}"] = usd_per_hour_sooner(r, policies[b])[0]
        lists = {k: r[k] for k in ("timeline", "progress") if k in r}
        out[name] = {**{k: v for k, v in r.items() if k not in lists}, **ratios, **lists}
    return out


def simulate(cfg: SimConfig, trace: Trace, policies: list[str] | None = None,
             progress: ProgressModel | None = None,
             on_iteration: Callable[[str, int], None] | None = None, constants: str = "all",
             price_rows: str = "home") -> dict[str, Any]:
    """Every policy in `policies` (default all) on `trace`: {"policies": {name: result}, ...}.
    `on_iteration(policy, iterations done)` is called after each simulated iteration (a progress bar;
    "NAME (pessimistic)" for a set other than typical).

    `constants` "all" runs every policy at each constant set of `spotlight.sim.assumptions`
    (pessimistic, typical, optimistic; "typical": that one, 3x sooner): "policies" holds the typical
    results, "ranges" {policy: {field: {set: value}}} the hours and dollars to target and every
    baseline comparison at each set, and "assumptions" each set's figures with what they assume.

    `price_rows` (`price_rows_of`: "home", the default, "range", "all" or regions) adds
    "price_range", every policy's dollars at each of those price rows (`_price_range`), and
    "price_of_an_hour_saved" (`_hour_saved`)."""
    names = list(POLICIES) if policies is None else policies
    for n in names:
        if n not in POLICIES:
            raise ConfigError(f"--policy: unknown policy {n!r} (expected all or one of {', '.join(POLICIES)})")
    progress = progress or ProgressModel.calibrated(iterations_scale=cfg.iterations_scale)
    price = _gpu_price(cfg)
    od, spot, row = price.ondemand_usd_h, price.spot_usd_h, price.row
    scenarios = price_rows_of(cfg, price_rows)  # a bad value is refused before anything is simulated
    from spotlight.sim import assumptions

    runs = {}
    for constant_set in sorted(assumptions.sets(constants), key=lambda s: s != "typical"):  # typical first
        at = assumptions.apply(constant_set, cfg)
        label = "" if constant_set == "typical" else f" ({constant_set})"
        runs[constant_set] = _run_policies(at, names, trace, progress, (od, spot), on_iteration, label)
    price_range = _price_range(cfg, trace, progress, names, runs["typical"], scenarios, row, price_rows, on_iteration)
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
        "price_range": {k: v for k, v in price_range.items() if k != "runs"},
        "price_of_an_hour_saved": _hour_saved(names, {s: runs[s] for s in assumptions.SETS if s in runs},
                                              price_range["runs"]),
    }


def _run_policies(cfg: SimConfig, names: list[str], trace: Trace, progress: ProgressModel,
                  prices: tuple[float, float], on_iteration: Callable[[str, int], None] | None,
                  label: str) -> dict[str, dict[str, Any]]:
    """Every policy of `names` simulated at `cfg` and `prices`, compared (`compare`); the progress
    callback hears each as "NAME" + `label`."""
    return compare({
        name: make_simulation(cfg, POLICIES[name], trace, progress, prices, None if on_iteration is None else
                              lambda it, name=name: on_iteration(name + label, it)).run()
        for name in names})


PRICE_RANGE_FIELDS = ("time_to_target_h", "cost_usd", "total_cost_usd", "cost_ratio_vs_ondemand") + tuple(
    f"usd_per_hour_sooner_vs_{b}" for b in HOUR_BASELINES)
"""What `result["price_range"]["policies"]` holds per policy and price row (those compared in the run)."""


def _price_range(cfg: SimConfig, trace: Trace, progress: ProgressModel, names: list[str],
                 typical: dict[str, dict[str, Any]], scenarios: list[PriceScenario], home: PriceRow,
                 spec: str, on_iteration: Callable[[str, int], None] | None) -> dict[str, Any]:
    """`result["price_range"]`: the price rows (each with its ratio, basis, source and date, and
    `runs_own_row` for the run's own, `home`) and every policy's figures at each, at the typical
    constants: `typical` itself at the run's own row, else re-priced (`reprice`) where `prices_decide` allows, else simulated again (the
    runs' cost: one more simulation of every policy per row). "runs" holds the compared results of
    each row, for `_hour_saved` (not printed)."""
    from spotlight.sim import assumptions

    why = prices_decide(cfg)
    at = assumptions.apply("typical", cfg)
    runs: dict[str, dict[str, dict[str, Any]]] = {}
    own = {sc.name: sc.row == home and not sc.catalog_basis for sc in scenarios}
    for sc in scenarios:
        od, spot = sc.per_gpu()
        if own[sc.name]:
            runs[sc.name] = typical
        elif why is None:
            runs[sc.name] = compare({n: {**r, **reprice(r, od, spot)} for n, r in typical.items()})
        else:
            runs[sc.name] = _run_policies(at, names, trace, progress, (od, spot), on_iteration, f" [{sc.name}]")
    return {"spec": spec, "constants": "typical", "how": "repriced" if why is None else "simulated",
            "why_simulated": why, "rows": [{**sc.to_dict(), "runs_own_row": own[sc.name]} for sc in scenarios],
            "policies": {n: {row: {k: res[n][k] for k in PRICE_RANGE_FIELDS if k in res[n]}
                             for row, res in runs.items()} for n in names},
            "runs": runs}


def _hour_saved(names: list[str], by_set: dict[str, dict[str, dict[str, Any]]],
                by_row: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """`result["price_of_an_hour_saved"]`: for `HOUR_SAVED_POLICY` (else the first policy run that
    is not an hour baseline), `usd_per_hour_sooner_vs_<b>` at each constant set and each price row,
    and `why_null_vs_<b>` the reason of each null (or why the baseline has none: not simulated)."""
    policy = HOUR_SAVED_POLICY if HOUR_SAVED_POLICY in names else next(
        (n for n in names if n not in HOUR_BASELINES), None)
    if policy is None:
        return {"policy": None, "why_null": "no policy other than the baselines was simulated"}
    out: dict[str, Any] = {"policy": policy, "unit": "dollars per hour sooner to the target"}
    for b in HOUR_BASELINES:
        if b not in names:
            out[f"usd_per_hour_sooner_vs_{b}"] = None
            out[f"why_null_vs_{b}"] = f"{b} was not simulated in this run (--policy)"
            continue
        values: dict[str, dict[str, float | None]] = {}
        why: dict[str, dict[str, str]] = {}
        for axis, runs in (("by_constant_set", by_set), ("by_price_row", by_row)):
            values[axis], why[axis] = {}, {}
            for key, res in runs.items():
                value, reason = usd_per_hour_sooner(res[policy], res[b])
                values[axis][key] = value
                if reason is not None:
                    why[axis][key] = (reason.replace("the policy", policy).replace("the baseline", b)
                                      .replace("not sooner", f"{policy} is not sooner than {b}"))
        out[f"usd_per_hour_sooner_vs_{b}"] = values
        out[f"why_null_vs_{b}"] = why
    return out
