"""The bill of a launched fleet: what the nodes `spotlight launch` would rent cost per hour, said
before anything is rented.

The fleet is the job group `cloud.sky` writes: one on-demand head with `cloud.gpu` x
`cloud.gpus_per_node` (the on-demand rollout workers run on it: it is the only on-demand node), and
one spot node per `runtime.spot_workers`, each taking `cloud.gpu` or one of `cloud.fallback_gpus`.
A node is priced as the cost meter prices it (`PriceTable.node_price`: `cloud.instance_type`'s row
for `cloud.gpu`, else the cheapest row with that many GPUs, else a share of a larger one) in
`cloud.region` when the table prices it there (else the row's home region, and the bill says so),
x `cloud.price_scale`. The longest the fleet can run under `cloud.budget_usd` is the budget over
the fleet's dollars per hour, with every spot node on `cloud.gpu` at its spot price, and with every
spot node on demand instead (the dearest case a deadline's fall-back leads to).

Invariants (tests/cloud/test_launch_bill.py): every figure is the table's price x the scale x the node
count, recomputed from the table by the test; a GPU the table does not price is one line saying
so, never an exception; nothing here reads the network or SkyPilot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cloud.config import CloudConfig
from cloud.prices import SHIPPED, NodePrice, PriceError, PriceTable


@dataclass(frozen=True)
class Priced:
    """One kind of node of the fleet: `gpus` x `gpu`, priced (dollars per node-hour, scaled) or not."""

    gpu: str
    gpus: int
    price: NodePrice | None
    """Scaled by `cloud.price_scale`; None when the table has no row for `gpu`."""
    why: str = ""
    """Why `price` is None, or where a price comes from when not from `cloud.region` (one line)."""

    @property
    def name(self) -> str:
        return f"{self.gpu}:{self.gpus}"


@dataclass(frozen=True)
class Bill:
    """The fleet's price now (see the module docstring)."""

    head: Priced
    spot: list[Priced]
    """`cloud.gpu` then each fall-back, as the spot tasks list them."""
    spot_nodes: int
    order: str
    """`cloud.accelerator_order`: how SkyPilot picks among `spot`."""
    table: str
    """The price table's file, as the user would name it."""
    scale: float
    budget_usd: float | None

    @property
    def spot_usd_h(self) -> float | None:
        """The fleet's dollars per hour with every spot node on `cloud.gpu` at its spot price."""
        return self._usd_h(spot=True)

    @property
    def ondemand_usd_h(self) -> float | None:
        """... with every spot node on demand instead (the same GPU)."""
        return self._usd_h(spot=False)

    def _usd_h(self, spot: bool) -> float | None:
        """The head on demand plus every spot node on `cloud.gpu`, at its spot or on-demand price."""
        first = self.spot[0].price if self.spot else None
        if self.head.price is None or (self.spot_nodes and first is None):
            return None
        if not self.spot_nodes:
            return self.head.price.ondemand_usd_h
        return self.head.price.ondemand_usd_h + self.spot_nodes * (first.spot_usd_h if spot else first.ondemand_usd_h)

    def hours(self, usd_h: float | None) -> float | None:
        """How long the budget pays for `usd_h` (None: no budget, or no price)."""
        if self.budget_usd is None or not usd_h:
            return None
        return self.budget_usd / usd_h


def _table_name(table: PriceTable) -> str:
    path = table.path
    if path is None:
        return "(in memory)"
    if Path(path).resolve() == SHIPPED.resolve():
        return "cloud/prices.csv"
    return str(path)


def _price(table: PriceTable, gpu: str, gpus: int, instance_type: str | None, region: str | None,
           scale: float) -> Priced:
    """`gpus` x `gpu` priced in `region` (falling back to the home row, said in `why`), scaled."""
    try:
        table.rows(gpu)
    except PriceError:
        return Priced(gpu, gpus, None, f"no price: the price table ({_table_name(table)}) has no {gpu} row "
                                       f"(it prices {', '.join(table.gpus())})")
    price, why = table.node_price_near(gpu, gpus, instance_type, region)
    return Priced(gpu, gpus, NodePrice(price.ondemand_usd_h * scale, price.spot_usd_h * scale, gpus, price.row), why)


def bill(cloud: CloudConfig, spot_nodes: int, gpus: Sequence[str], table: PriceTable | None = None) -> Bill:
    """The bill of a fleet of `cloud` with `spot_nodes` spot nodes; `gpus`: `cloud.gpu` then the
    fall-backs, as SkyPilot spells them (`cloud.sky.accelerators`). `table`: None loads
    `cloud.prices` (else the shipped table); a table that cannot be read is a `PriceError`."""
    table = table if table is not None else PriceTable.load(cloud.prices)
    n = cloud.gpus_per_node
    kinds = [_price(table, g, n, cloud.instance_type if i == 0 else None, cloud.region, cloud.price_scale)
             for i, g in enumerate(gpus)]
    return Bill(kinds[0], kinds, spot_nodes, cloud.accelerator_order, _table_name(table), cloud.price_scale,
                cloud.budget_usd)


def _usd(x: float) -> str:
    return f"${x:,.2f}" if x >= 0.995 or x == 0 else f"${x:.4g}"


def _h(hours: float) -> str:
    if hours < 1:
        return f"{hours * 60:.0f} min"
    return f"{hours:,.1f} h" if hours < 72 else f"{hours:,.0f} h ({hours / 24:,.1f} days)"


def lines(b: Bill) -> list[str]:
    """The bill as aligned lines: the tasks, each kind of node with its $/h, the totals, where the
    prices come from and the budget's cap. (The commands that launch, follow and cancel the fleet
    come after it, once SkyPilot has accepted the tasks: `cloud.sky.next_steps`.)"""
    out: list[str] = []

    def row(label: str, text: str) -> None:
        out.append(f"  {label:<8}{text}")

    def each(p: Priced, count: int, spot: bool) -> str:
        if p.price is None:
            return p.why
        rate = p.price.spot_usd_h if spot else p.price.ondemand_usd_h
        text = f"{count} x {_usd(rate)}/h = {_usd(count * rate)}/h" if count != 1 else f"{_usd(rate)}/h"
        if spot:
            text += f"  (on demand: {_usd(p.price.ondemand_usd_h)}/h each)"
        return text + (f"  [{p.why}]" if p.why else "")

    scale = f" x {b.scale:g} (cloud.price_scale)" if b.scale != 1.0 else ""
    out.append(f"the bill: what the fleet costs while it runs (prices from {b.table}{scale}; nothing is rented "
               "before the launch)")
    tasks = f"head (on demand) + {b.spot_nodes} spot node{'s' * (b.spot_nodes != 1)}, each its own task"
    row("tasks", tasks)
    head = f"1 x {b.head.name} on demand"
    spot = f"{b.spot_nodes} x {b.spot[0].name} spot" if b.spot_nodes else ""
    if b.spot_nodes and len(b.spot) > 1:
        way = "or" if b.order == "any_of" else "else, in order,"
        spot += f" ({way} {', '.join(p.name for p in b.spot[1:])})"
    width = max(len(head), len(spot)) + 2
    row("head", f"{head:<{width}}{each(b.head, 1, False)}")
    if b.spot_nodes:
        row("spot", f"{spot:<{width}}{each(b.spot[0], b.spot_nodes, True)}")
        for p in b.spot[1:]:
            row("", f"{'  or ' + p.name:<{width}}{each(p, b.spot_nodes, True)}")
    now, worst = b.spot_usd_h, b.ondemand_usd_h
    if now is None:
        row("total", f"unknown: {b.head.gpu if b.head.price is None else b.spot[0].gpu} has no price")
    else:
        text = f"{_usd(now)}/h now"
        if b.spot_nodes:
            text += f"; {_usd(worst)}/h if every spot node ran on demand"
            others = [p.price.spot_usd_h for p in b.spot[1:] if p.price is not None]
            if others:
                lo = b.head.price.ondemand_usd_h + b.spot_nodes * min(others + [b.spot[0].price.spot_usd_h])
                hi = b.head.price.ondemand_usd_h + b.spot_nodes * max(others + [b.spot[0].price.spot_usd_h])
                text += f"; {_usd(lo)}-{_usd(hi)}/h over the spot choices"
        row("total", text)
    priced = b.spot if b.spot_nodes else b.spot[:1]  # spot[0] is the head's kind too
    rows = {p.price.row.key: p.price.row for p in priced if p.price is not None}
    for r in rows.values():
        region = r.where or "?"
        share = f"{b.head.gpus}/{r.gpus} of " if r.gpus != b.head.gpus else ""
        row("prices", f"{r.gpu}: {share}{r.instance_type}, {r.provider} {region}, {r.date}: {r.source}")
    if b.budget_usd is None:
        row("budget", "no budget (cloud.budget_usd): the fleet runs until the run ends")
    else:
        text = f"{_usd(b.budget_usd)} (cloud.budget_usd): the head stops the run before its meter passes it"
        if now is not None and now > 0:
            text += f"; at most {_h(b.hours(now))} at these prices"
            if b.spot_nodes and worst and not math.isclose(worst, now):
                text += f", {_h(b.hours(worst))} if every spot node ran on demand"
        row("budget", text)
    return out
