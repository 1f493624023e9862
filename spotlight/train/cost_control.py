"""A run config's fleet and cost control: what `cloud.cost` meters and decides, composed from the
run config's `runtime` and `cloud` sections and the a-priori iteration time of its workload
(`spotlight.iteration.iteration_time`). `cloud/` takes these as values; this module reads the run config."""

from __future__ import annotations

import logging
from typing import Any

from cloud.cost import BudgetPolicy, CostControl, CostMeter, DeadlinePolicy, Fleet, Forecast, Spent, scaled
from cloud.prices import PriceTable
from schedulers.clock import Clock
from schedulers.input.files import ConfigError
from spotlight.config import RunConfig
from spotlight.iteration.iteration_time import checkpoint_seconds_estimate, iteration_seconds_lower_bound

logger = logging.getLogger(__name__)


def fleet_of(cfg: RunConfig, ondemand_workers: bool = False) -> Fleet:
    """The run's fleet, in nodes of `cloud.gpus_per_node` GPUs: an on-demand head (controller and
    learner; a learner group's `train.learner_gpus` GPUs need as many nodes as hold them, one
    where the config is launchable: the group spans one node), `runtime.ondemand_workers`
    on-demand and `runtime.spot_workers` spot rollout nodes — or, after the fall-back, every
    worker on-demand. Joined to a cluster (`runtime.address`: a launched fleet's head), the
    on-demand rollout workers run on the head, the one on-demand node `spotlight launch` rents
    (`cloud.sky`), so the head is the only on-demand node counted; once the cluster's node table is
    read, the meter pays for the nodes it lists instead (`Runtime.watch_fleet`)."""
    rt = cfg.runtime
    head = -(-cfg.train.learner_gpus // cfg.cloud.gpus_per_node)
    ondemand = 0 if rt.address else rt.ondemand_workers
    if ondemand_workers:
        return Fleet(head + ondemand + rt.spot_workers, 0)
    return Fleet(head + ondemand, rt.spot_workers)


def notional_fleet(cfg: RunConfig) -> bool:
    """Whether the fleet the meter prices (`cloud.gpu`) is notional: the run computes on a CPU or
    another non-CUDA device, so its dollars are what the same seconds would cost on that fleet.
    Such a run is priced for its iterations' seconds alone (`COUNTS`): its start-up — Ray, the
    actors, a warm start trained here — is this machine's, and varied from run to run (a re-run of
    the same config was priced $0.81 and $1.18)."""
    return not cfg.device.startswith("cuda")


COUNTS = {
    True: "the seconds from the first iteration on, on the notional fleet of cloud.gpu (this run used no GPU: "
          "its start-up and warm start are not counted; saving final/ at the end is)",
    False: "every second since this session started its fleet, start-up included (instances are paid from launch)",
}
"""summary.json's `cost_counts`, by `notional_fleet`: what `cost_usd` counts."""


def cost_control(cfg: RunConfig, clock: Clock, spent: Spent | None = None, table: Any = None) -> CostControl:
    """The meter for `cfg`'s fleet (`fleet_of`), priced from `table` (None: the table at
    `cloud.prices`, else the shipped one) x `cloud.price_scale`, with a budget and a deadline when
    `cfg.cloud` sets them. The meter starts now, with what earlier sessions spent on it. A budget
    whose remainder cannot pay for their last start-up plus one iteration at the a-priori lower
    bound (`spotlight.iteration.iteration_time`) is a ConfigError."""
    c, spent = cfg.cloud, spent if spent is not None else Spent()
    table = table if table is not None else PriceTable.load(c.prices)
    try:
        price, elsewhere = table.node_price_near(c.gpu, c.gpus_per_node, c.instance_type, c.region)
    except ConfigError as err:
        field = "cloud.gpu" if str(err).startswith("unknown GPU") else "cloud.instance_type"
        raise type(err)(f"{field}: {err}") from None
    if elsewhere:
        logger.warning(f"cloud.region: {elsewhere} (the price table's home row)")
    fleet = fleet_of(cfg)
    meter = CostMeter(clock, price.ondemand_usd_h * c.price_scale, price.spot_usd_h * c.price_scale,
                      fleet, spent.cost_usd)
    lower_s = iteration_seconds_lower_bound(cfg)
    forecast = Forecast(lower_s, checkpoint_seconds_estimate(cfg))
    budget = BudgetPolicy(c.budget_usd, forecast) if c.budget_usd is not None else None
    if budget is not None and not budget.affordable(spent.cost_usd, meter.rate_usd_h, spent.startup_s + lower_s):
        rate = meter.rate_usd_h / 3600.0
        before = (f"after the ${spent.cost_usd:.4g} this run already spent and a start-up like its last "
                  f"({spent.startup_s:.3g} s, ${spent.startup_s * rate:.4g}), " if spent.cost_usd > 0 else "")
        raise ConfigError(
            f"cloud.budget_usd (--budget-usd): ${c.budget_usd:.4g} is too small: {before}one iteration costs at "
            f"least ${lower_s * rate:.4g} ({lower_s:.3g} s at ${meter.rate_usd_h:.4g}/h for "
            f"{fleet.ondemand} on-demand + {fleet.spot} spot nodes of {c.gpus_per_node} x {price.row.gpu} priced "
            f"from {price.row.instance_type}{scaled(c.price_scale)})")
    deadline = DeadlinePolicy(c.deadline_h * 3600.0) if c.deadline_h is not None else None
    return CostControl(clock, meter, fleet_of(cfg, ondemand_workers=True), forecast, budget, deadline, price)
