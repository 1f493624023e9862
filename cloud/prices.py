"""The price table: GPU instance types with their on-demand and spot dollars per hour, by region.

A table is a CSV with the columns of `COLUMNS` (required) and `OPTIONAL_COLUMNS`, one instance type
and region per line; every row names where its prices came from (`source`), when (`date`,
YYYY-MM-DD) and — because a spot/on-demand ratio means nothing without it — what its on-demand price
is (`ondemand_basis`: e.g. "aws list price us-east-1 after the 2025-06 P4/P5 cut" or "catalog
snapshot, pre-June-2025 on-demand"). `region` is where the prices hold; an empty one, or a table
without the column (the format before regions), means the provider's `DEFAULT_REGION`. The shipped
table (`cloud/prices.csv`) is a snapshot to refresh, not a live price: `refresh_from_aws` replaces
spot prices with the median of EC2's spot price history, `refresh_from_sky` takes both prices from
SkyPilot's catalog, asked through SkyPilot's API (`sky.catalog`) in SkyPilot's own virtualenv
(`cloud/sky_catalog.py`; this module never imports `sky`). Refreshed rows carry the new source
and date.

Invariants: every row has a non-empty instance type and GPU name, a positive GPU count (at most
`MAX_GPUS_PER_ROW`) and finite prices >= 0; an (instance type, region) pair is on one line only.
Loading a table that breaks one raises a `PriceError` whose text is one line naming the file, the
line and the column (`tests/cloud/test_cloud_cost.py`, `tests/cloud/test_prices.py`); so does a table larger
than `MAX_TABLE_BYTES`, one that is not UTF-8 text, or one the csv module cannot read. A GPU name the
table does not price is a `PriceError` wherever one comes in (`rows`, `node_price`).

Which row prices a node when an instance type has several regions: the one named by `region=`, else
its *home* row — the one in the provider's `DEFAULT_REGION` (or with no region), else its first
line. So extra regions are there for a sensitivity run and change no default figure.

A price range (`price_scenarios`, `spotlight simulate --price-rows`) is a list of `PriceScenario`s:
rows of the table, and a row's *catalog-basis pair* where its own on-demand price is on another
basis than the catalog snapshot its spot price comes from (`CATALOG_ONDEMAND`: AWS us-east-1
p5.48xlarge, spot $26.79 against the snapshot's pre-cut $98.32, 0.27x, beside the row's 0.49x
against the post-cut list price). A pair is not a second line of the table: an (instance type,
region) pair stays on one line, the one the meter and `spotlight prices --region` resolve.
`tests/spotlight/sim/test_price_range.py` checks that every row of a range names its source and date.

A node of the meter has `cloud.gpus_per_node` GPUs. When no row has exactly that many of the GPU,
a node is priced at the cheapest row's per-GPU price times `gpus_per_node` (for example a 1-GPU
H100 node from p5.48xlarge: 55.04 / 8 = $6.88/h) — what a share of a larger instance costs.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import statistics
import subprocess
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from schedulers.input.files import ConfigError, InputFileError, read_bytes

SHIPPED = Path(__file__).with_name("prices.csv")
COLUMNS = ("provider", "instance_type", "gpu", "gpus", "ondemand_usd_h", "spot_usd_h", "source", "date")
"""The columns every table has."""
OPTIONAL_COLUMNS = ("region", "ondemand_basis")
"""Columns a table may leave out (the format before regions): read as empty."""
WRITE_ORDER = ("provider", "instance_type", "region", "gpu", "gpus", "ondemand_usd_h", "spot_usd_h",
               "ondemand_basis", "source", "date")
"""The order `to_csv` writes the columns in (those of `OPTIONAL_COLUMNS` only when a row fills them)."""
MAX_TABLE_BYTES = 1 << 20
"""Largest price table read (1 MiB; the shipped one is ~2 KB)."""
MAX_GPUS_PER_ROW = 64
"""Most GPUs of one instance type (the largest sold today have 8 or 16)."""
DEFAULT_REGION = {"aws": "us-east-1", "gcp": "us-central1"}
"""The region a refresh reads when none is given: where the shipped prices were taken."""


def region_of(provider: str, region: str | None) -> str | None:
    """Where `provider`'s prices named `region` hold: `region`, or — when it is empty or None (a
    row of a table from before the region column, an unset `cloud.region`) — the provider's
    `DEFAULT_REGION`; None for a provider that has none. The one place that rule is written
    (tests/cloud/test_prices_region.py::test_region_of_is_the_named_region_else_the_default)."""
    return region or DEFAULT_REGION.get(provider)


class PriceError(ConfigError):
    """A bad price table or an unknown GPU / instance type; `str(err)` is the one line a user sees."""


@dataclass(frozen=True)
class PriceRow:
    provider: str
    instance_type: str
    gpu: str
    gpus: int
    ondemand_usd_h: float
    spot_usd_h: float
    source: str
    date: str
    region: str = ""
    """Where these prices hold; "" means the provider's `DEFAULT_REGION`."""
    ondemand_basis: str = ""
    """What the on-demand price is: which list, where, and before or after which price change."""

    @property
    def key(self) -> tuple[str, str]:
        """What is unique in a table: (instance type, region)."""
        return self.instance_type, self.region

    @property
    def where(self) -> str | None:
        """The region these prices hold in (`region_of`: the provider's default for a row naming
        none); None when the row names none and its provider has no default."""
        return region_of(self.provider, self.region)

    @property
    def home(self) -> bool:
        """Priced in the provider's default region (or in no named region)."""
        return self.where == DEFAULT_REGION.get(self.provider)

    def holds_in(self, region: str) -> bool:
        """Whether these prices hold in `region` (a row naming none holds in its provider's default)."""
        return region in (self.region, self.where)

    def to_dict(self) -> dict[str, Any]:
        """Every field, in the CSV's column order (`WRITE_ORDER`: the region beside the instance type)."""
        d = asdict(self)
        return {c: d[c] for c in WRITE_ORDER}


@dataclass(frozen=True)
class NodePrice:
    """Dollars per hour of one node (`gpus` GPUs) priced from `row`."""

    ondemand_usd_h: float
    spot_usd_h: float
    gpus: int
    row: PriceRow


def today() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d")


def _clip(text: str, limit: int = 160) -> str:
    """`text`'s first line, at most `limit` characters: what a one-line message quotes of another's."""
    line = (text.strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[:limit] + "..."


def _quote(text: str) -> str:
    """`text` quoted for an error line: one line (repr escapes newlines), at most ~100 characters."""
    return repr(text[:100] + ("..." if len(text) > 100 else ""))


def read_table_text(path: Path, what: str) -> str:
    """The text of a CSV table: a regular file of at most MAX_TABLE_BYTES (`schedulers.input.files.read_bytes`:
    a FIFO or a device is refused before it is opened), UTF-8; anything else is one PriceError line."""
    try:
        data = read_bytes(path, what, MAX_TABLE_BYTES)
    except InputFileError as err:
        raise PriceError(str(err)) from None
    except OSError as err:
        raise PriceError(f"{path}: cannot read {what} ({err.strerror or type(err).__name__})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise PriceError(f"{path}: not a UTF-8 text file (expected a {what} CSV)") from None


def _number(text: str, where: str, column: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise PriceError(f"{where}: {column}: expected dollars per hour (a number >= 0), got {_quote(text)}")
    return value


def _parse_row(raw: dict[str, str], where: str) -> PriceRow:
    for column in ("provider", "instance_type", "gpu", "source"):
        if not raw[column].strip():
            what = "where the prices come from" if column == "source" else "a name"
            raise PriceError(f"{where}: {column}: expected {what}, got an empty field")
    try:
        datetime.strptime(raw["date"].strip(), "%Y-%m-%d")
    except ValueError:
        raise PriceError(f"{where}: date: expected the day the prices were taken (YYYY-MM-DD), "
                         f"got {_quote(raw['date'])}") from None
    try:
        gpus = int(raw["gpus"]) if len(raw["gpus"]) <= 20 else 0
    except ValueError:
        gpus = 0
    if not 0 < gpus <= MAX_GPUS_PER_ROW:
        raise PriceError(f"{where}: gpus: expected a positive integer (at most {MAX_GPUS_PER_ROW}), got {_quote(raw['gpus'])}")
    return PriceRow(raw["provider"].strip(), raw["instance_type"].strip(), raw["gpu"].strip(), gpus,
                    _number(raw["ondemand_usd_h"], where, "ondemand_usd_h"),
                    _number(raw["spot_usd_h"], where, "spot_usd_h"),
                    raw["source"].strip(), raw["date"].strip(),
                    raw.get("region", "").strip(), raw.get("ondemand_basis", "").strip())


def _parse_table(reader: Any, path: Path) -> list[PriceRow]:
    """The checked rows of a price table read by `reader` (module docstring: the invariants)."""
    header = [h.strip() for h in next(reader, [])]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise PriceError(f"{path}: line 1: missing column {missing[0]!r} (expected columns {', '.join(COLUMNS)}; "
                         f"optional: {', '.join(OPTIONAL_COLUMNS)})")
    rows: list[PriceRow] = []
    seen: dict[tuple[str, str], int] = {}
    for fields in reader:
        if not fields:
            continue  # a blank line
        where = f"{path}: line {reader.line_num}"
        if len(fields) != len(header):
            raise PriceError(f"{where}: expected {len(header)} comma-separated fields ({', '.join(header)}), "
                             f"got {len(fields)}")
        row = _parse_row(dict(zip(header, fields)), where)
        if row.key in seen:
            in_region = f" in region {_quote(row.region)}" if row.region else ""
            raise PriceError(f"{where}: instance_type: {_quote(row.instance_type)}{in_region} is already on line "
                             f"{seen[row.key]}")
        seen[row.key] = reader.line_num
        rows.append(row)
    if not rows:
        raise PriceError(f"{path}: no price rows (expected one line per instance type after the header)")
    return rows


class PriceTable:
    """Rows of a price table, in file order. `load` reads and checks one; construction does not."""

    def __init__(self, rows: Iterable[PriceRow], path: Path | None = None) -> None:
        self._rows = list(rows)
        self.path = path

    @classmethod
    def load(cls, path: str | Path | None = None) -> "PriceTable":
        """Read a table (None: the shipped one); any defect is one `PriceError` line."""
        path = Path(path) if path is not None else SHIPPED
        text = read_table_text(path, "price table")
        reader = csv.reader(text.splitlines())
        try:
            return cls(_parse_table(reader, path), path)
        except csv.Error as err:  # a NUL byte, a field over csv's 128 KiB limit, ...
            raise PriceError(f"{path}: line {reader.line_num}: not a CSV table ({err})") from None

    def __len__(self) -> int:
        return len(self._rows)

    def gpus(self) -> list[str]:
        """The GPU names the table knows, sorted."""
        return sorted({r.gpu for r in self._rows})

    def _gpu_name(self, gpu: str) -> str:
        """`gpu` as the table spells it (names match case-insensitively); unknown: a PriceError."""
        for known in self.gpus():
            if known.lower() == gpu.lower():
                return known
        raise PriceError(f"unknown GPU {_quote(gpu)}: the price table{self._named()} knows {', '.join(self.gpus())}")

    def _named(self) -> str:
        return f" ({self.path})" if self.path is not None else ""

    def rows(self, gpu: str | None = None) -> list[PriceRow]:
        """Every row, or those of one GPU (an unknown GPU is a PriceError)."""
        if gpu is None:
            return list(self._rows)
        name = self._gpu_name(gpu)
        return [r for r in self._rows if r.gpu == name]

    def row(self, instance_type: str, region: str | None = None) -> PriceRow:
        """The row of `instance_type` in `region`; None: its home row (module docstring)."""
        mine = [r for r in self._rows if r.instance_type == instance_type]
        if not mine:
            raise PriceError(f"unknown instance type {_quote(instance_type)}: not in the price table{self._named()}")
        if region is None:
            return next((r for r in mine if r.home), mine[0])
        for r in mine:
            if r.holds_in(region):
                return r
        raise PriceError(f"instance type {_quote(instance_type)} has no price in region {_quote(region)}: the price "
                         f"table{self._named()} prices it in {', '.join(r.region or '(default)' for r in mine)}")

    def regions(self) -> list[str]:
        """The named regions of the table, sorted."""
        return sorted({r.region for r in self._rows if r.region})

    def node_price(self, gpu: str, gpus_per_node: int, instance_type: str | None = None,
                   region: str | None = None) -> NodePrice:
        """The price of a node of `gpus_per_node` x `gpu` in `region` (None: each instance type's home
        row): from `instance_type`'s row when given, else from the row with exactly that many GPUs and
        the lowest on-demand price, else from the row with the lowest on-demand price per GPU, scaled
        (module docstring). Ties: lower spot price."""
        if gpus_per_node <= 0:
            raise PriceError(f"gpus_per_node: expected a positive integer, got {gpus_per_node!r}")
        candidates = self.rows(gpu)
        if instance_type is not None:
            row = self.row(instance_type, region)
            if row.gpu != candidates[0].gpu:
                raise PriceError(f"instance type {instance_type!r} has {row.gpu} GPUs, not {gpu}")
        else:
            if region is None:
                pool = [self.row(name) for name in dict.fromkeys(r.instance_type for r in candidates)]
            else:
                pool = [r for r in candidates if r.holds_in(region)]
                if not pool:
                    raise PriceError(f"no {candidates[0].gpu} price in region {_quote(region)} in the price "
                                     f"table{self._named()}")
            exact = [r for r in pool if r.gpus == gpus_per_node]
            row = min(exact or pool, key=lambda r: (r.ondemand_usd_h / r.gpus, r.spot_usd_h / r.gpus))
        share = gpus_per_node / row.gpus
        return NodePrice(row.ondemand_usd_h * share, row.spot_usd_h * share, gpus_per_node, row)

    def node_price_near(self, gpu: str, gpus_per_node: int, instance_type: str | None,
                        region: str | None) -> tuple[NodePrice, str]:
        """`node_price` in `region` when the table prices it there, else from the home row; and, in
        that case, a few words saying so ("" when priced where asked). The one rule the launch's
        bill and the run's cost meter both price by (issue 41: the meter priced the home region
        whatever `cloud.region` said, the bill that region)."""
        try:
            return self.node_price(gpu, gpus_per_node, instance_type, region), ""
        except PriceError:
            if region is None:
                raise
        price = self.node_price(gpu, gpus_per_node, instance_type)
        return price, f"no {price.row.gpu} price in {region}: priced in {price.row.where}"

    def replaced(self, new: dict[tuple[str, str], PriceRow]) -> "PriceTable":
        """This table with the rows named in `new` (by `PriceRow.key`) replaced, order kept."""
        return PriceTable([new.get(r.key, r) for r in self._rows], self.path)

    def to_csv(self) -> str:
        """The table as `load` reads it: `WRITE_ORDER`, leaving out an optional column no row fills
        (a table read without regions is written without them)."""
        columns = [c for c in WRITE_ORDER
                   if c not in OPTIONAL_COLUMNS or any(getattr(r, c) for r in self._rows)]
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        for r in self._rows:
            d = r.to_dict()
            # 10 significant digits: a catalog's 123.19496 stays itself (6 would write 123.195), while
            # SkyPilot's float noise (9.46006 + 78.37241 = 87.83247000000001) is still cut.
            writer.writerow([f"{d[c]:.10g}" if isinstance(d[c], float) else d[c] for c in columns])
        return out.getvalue()

    def write(self, path: str | Path) -> None:
        Path(path).write_text(self.to_csv())


# ---- a price range -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CatalogOndemand:
    """The on-demand price a catalog snapshot lists beside a row's spot price, where the row's own
    on-demand price is on another basis: what makes a row's catalog-basis pair (`PriceScenario`)."""

    usd_h: float
    basis: str
    source: str
    date: str


CATALOG_ONDEMAND: dict[tuple[str, str], CatalogOndemand] = {
    ("p5.48xlarge", "us-east-1"): CatalogOndemand(
        98.32, "catalog snapshot: pre-June-2025 on-demand (the row's own is AWS's list price after the cut, 55.04)",
        "skypilot-catalog catalogs/v7/aws/vms.csv (commit 001367d) us-east-1: Price 98.32 in each of its 6 AZs",
        "2026-11-23"),
}
"""{(instance type, region): the on-demand price of the catalog snapshot the row's spot price comes
from}, for rows whose own on-demand price is on another basis. One pair today: AWS us-east-1
p5.48xlarge, whose spot $26.79 is 0.49x of AWS's post-cut list price and 0.27x of the $98.32 the
same snapshot lists."""

CATALOG_SUFFIX = "@catalog"
"""Names a row's catalog-basis pair in a price-row list: `us-east-1@catalog`."""

PRICE_RANGE: dict[str, tuple[str, ...]] = {"H100": ("us-east-1", "us-east-1" + CATALOG_SUFFIX, "us-central1")}
"""The named price range (`PriceTable.scenarios(gpu, "range")`), per GPU: for H100 the shipped row
(AWS us-east-1: spot 0.49x of the post-cut list price), the same spot price against the catalog
snapshot's pre-cut on-demand (0.27x) and GCP us-central1 (0.23x). A GPU not named: all its rows;
an item the table has no row for (another `--prices` table) is left out."""


@dataclass(frozen=True)
class PriceScenario:
    """One row of a price range: a table row's spot price against an on-demand price, the row's own
    or (`catalog_basis`) the one its catalog snapshot lists (`CATALOG_ONDEMAND`)."""

    row: PriceRow
    ondemand_usd_h: float
    ondemand_basis: str
    source: str
    date: str
    catalog_basis: bool = False

    @property
    def region(self) -> str:
        """The row's region, or its provider's default where the table names none."""
        return self.row.where or ""

    @property
    def name(self) -> str:
        """"aws p5.48xlarge us-east-1", "aws p5.48xlarge us-east-1@catalog": unique in a range."""
        suffix = CATALOG_SUFFIX if self.catalog_basis else ""
        return f"{self.row.provider} {self.row.instance_type} {self.region}{suffix}"

    @property
    def ratio(self) -> float | None:
        """Spot over on-demand (None for an on-demand price of 0)."""
        return self.row.spot_usd_h / self.ondemand_usd_h if self.ondemand_usd_h > 0 else None

    def per_gpu(self) -> tuple[float, float]:
        """(on-demand, spot) dollars per GPU-hour: a share of the instance, as `node_price` prices one GPU."""
        return self.ondemand_usd_h / self.row.gpus, self.row.spot_usd_h / self.row.gpus

    def to_dict(self) -> dict[str, Any]:
        od, spot = self.per_gpu()
        return {"name": self.name, "provider": self.row.provider, "instance_type": self.row.instance_type,
                "region": self.region, "gpu": self.row.gpu, "gpus": self.row.gpus,
                "ondemand_usd_h": self.ondemand_usd_h, "spot_usd_h": self.row.spot_usd_h, "ratio": self.ratio,
                "per_gpu_h": {"ondemand": od, "spot": spot}, "ondemand_basis": self.ondemand_basis,
                "source": self.source, "date": self.date}


def _own(row: PriceRow) -> PriceScenario:
    return PriceScenario(row, row.ondemand_usd_h, row.ondemand_basis, row.source, row.date)


def _catalog_pair(row: PriceRow) -> PriceScenario | None:
    cat = CATALOG_ONDEMAND.get((row.instance_type, _own(row).region))
    if cat is None:
        return None
    spot = row.source.split("spot:", 1)[1].strip() if "spot:" in row.source else row.source
    return PriceScenario(row, cat.usd_h, cat.basis, f"on-demand: {cat.source}; spot: {spot}", cat.date, True)


def price_scenarios(table: PriceTable, gpu: str, spec: str = "range") -> list[PriceScenario]:
    """The price rows `spec` names for `gpu` (an unknown GPU: a PriceError): `range` (`PRICE_RANGE`),
    `all` (every row of the GPU, each followed by its catalog-basis pair where it has one), `home`
    (the row a 1-GPU node is priced from, `node_price`), or a comma-separated list of regions, each
    every row of the GPU there, `REGION@catalog` its catalog-basis pair. A bad item is one
    PriceError line naming it and what the table offers."""
    rows = table.rows(gpu)
    if spec == "home":
        return [_own(table.node_price(gpu, 1).row)]
    if spec == "all" or (spec == "range" and rows[0].gpu not in PRICE_RANGE):
        out = []
        for r in rows:
            out += [s for s in (_own(r), _catalog_pair(r)) if s is not None]
        return out
    offered = [_own(r) for r in rows] + [s for s in map(_catalog_pair, rows) if s is not None]

    def item_name(s: PriceScenario) -> str:
        return s.region + (CATALOG_SUFFIX if s.catalog_basis else "")

    known = list(dict.fromkeys(item_name(s) for s in offered))
    chosen: dict[str, PriceScenario] = {}
    for item in PRICE_RANGE[rows[0].gpu] if spec == "range" else spec.split(","):
        item = item.strip()
        if not item:
            raise PriceError(f"expected range, all, home or comma-separated regions (REGION or "
                             f"REGION{CATALOG_SUFFIX}), got {_quote(spec)}")
        found = [s for s in offered if item_name(s) == item]
        if not found and spec != "range":  # the named range leaves out what another table lacks
            raise PriceError(f"{_quote(item)}: no {rows[0].gpu} price row for it in the price table{table._named()} "
                             f"(expected range, all, home or regions of: {', '.join(known)})")
        chosen.update((s.name, s) for s in found)
    return list(chosen.values()) or [_own(table.node_price(gpu, 1).row)]


# ---- refreshing ---------------------------------------------------------------------------------


def refresh_from_aws(table: PriceTable, region: str | None = None, days: float = 1.0,
                     client: Any = None) -> tuple[PriceTable, list[str]]:
    """Spot prices of the table's AWS rows from EC2's spot price history in `region` over the last
    `days`: the median over every price point of every availability zone (robust to one AZ's spike;
    the meter wants a typical price, not the luckiest). On-demand prices stay (EC2 has no on-demand
    price API; the Pricing API is another service). Returns the new table and what was not refreshed.
    """
    from cloud import aws

    region = region_of("aws", region)
    mine = [r for r in table.rows() if r.provider == "aws" and r.region in ("", region)]
    wanted = list(dict.fromkeys(r.instance_type for r in mine))
    if not wanted:
        return table, ["the table has no aws rows"]
    try:
        history = aws.spot_price_history(wanted, region=region, days=days, client=client)
    except Exception as err:  # botocore's errors (no credentials, no network, a refused call) — one line
        raise PriceError(f"--refresh aws: cannot read the spot price history in {region} "
                         f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None
    points: dict[str, list[float]] = {}
    for point in history:
        points.setdefault(point["instance_type"], []).append(float(point["spot_usd_h"]))
    new, skipped = {}, []
    for old in mine:
        name = old.instance_type
        if not points.get(name):
            skipped.append(f"{name}: no spot price in {region} over the last {days:g} d")
            continue
        new[old.key] = replace(old, spot_usd_h=statistics.median(points[name]),
                            source=f"on-demand: {_ondemand_part(old.source)}; spot: aws spot price history "
                                   f"{region} median over {days:g} d ({len(points[name])} points)",
                            date=today())
    return table.replaced(new), skipped


def _ondemand_part(source: str) -> str:
    """Where a row's on-demand price came from, out of its source text."""
    head = source.split(";")[0].strip()
    return head[len("on-demand:"):].strip() if head.startswith("on-demand:") else head


SKY_CATALOG_SCRIPT = Path(__file__).with_name("sky_catalog.py")
"""What SkyPilot's Python runs to answer a refresh's queries (its module docstring: the protocol)."""
SKY_CATALOG_TIMEOUT_S = 300.0
"""How long a refresh waits for SkyPilot: ~3 s with its catalogs cached; downloading one (SkyPilot
does when none is cached, or the cached one is older than 7 h) has no timeout of its own."""


def refresh_from_sky(table: PriceTable, python: Path, region: str | None = None,
                     timeout_s: float = SKY_CATALOG_TIMEOUT_S) -> tuple[PriceTable, list[str]]:
    """Both prices of every row whose instance type SkyPilot's catalog lists in the row's region (a row
    without one: `region`, else the provider's `DEFAULT_REGION`; with `region` given, only rows in it
    or without one are refreshed): on-demand as listed, spot as the median over the region's zones.
    The catalog is asked through SkyPilot's API (`sky.catalog`), all rows in one subprocess of
    SkyPilot's Python (`python`, e.g. `cloud.sky.sky_python()`'s) running `cloud/sky_catalog.py`; no
    `import sky` here. The on-demand basis becomes the catalog's, which may predate a provider's
    price change. Returns the new table and what was not refreshed."""
    rows = [r for r in table.rows() if region is None or r.region in ("", region)]
    wanted: dict[tuple[str, str, str], list[PriceRow]] = {}
    skipped: list[str] = []
    for r in rows:
        where = region_of(r.provider, r.region or region)
        if where is None:
            skipped.append(f"{r.instance_type}: no region to ask SkyPilot's catalog for (the row names none "
                           f"and {r.provider} has no default region)")
            continue
        wanted.setdefault((r.provider, r.instance_type, where), []).append(r)
    if not wanted:
        return table, skipped
    answer = _ask_sky_catalog([{"provider": p, "instance_type": i, "region": w} for p, i, w in wanted],
                              python, timeout_s)
    catalog = answer["catalog"]
    for provider, error in answer["providers"].items():
        if error is not None:
            skipped.append(f"{provider}: no SkyPilot catalog it could load or download ({_clip(error)})")
    new: dict[tuple[str, str], PriceRow] = {}
    for found in answer["prices"]:
        name, provider, where = found["instance_type"], found["provider"], found["region"]
        named = f"SkyPilot's catalog {catalog}/{provider}"
        if found["missing"] == "instance_type":
            skipped.append(f"{name}: not in {named}")
            continue
        if found["missing"] == "region":
            skipped.append(f"{name}: not in {named} for region {where}")
            continue
        if found["ondemand"] is None:
            skipped.append(f"{name}: {named} has no on-demand price in {where} ({_clip(found['error'])})")
            continue
        # Rounded to a millionth of a dollar: SkyPilot's sum of VM and GPU prices carries float noise
        # (9.46 + 78.37 = 87.83000000000001).
        ondemand = round(found["ondemand"], 6)
        spot = round(statistics.median(found["spot"].values()), 6) if found["spot"] else None
        if spot is None:
            skipped.append(f"{name}: {named} has no spot price in {where}; spot price kept")
        for old in wanted[provider, name, where]:
            new[old.key] = replace(
                old, ondemand_usd_h=ondemand, spot_usd_h=old.spot_usd_h if spot is None else spot,
                source=f"skypilot {answer['skypilot']} catalog {catalog}/{provider} {where}"
                       + ("" if spot is None else f"; spot: median over {len(found['spot'])} zones"),
                ondemand_basis=f"skypilot catalog {catalog} list price {where} (as of the catalog's snapshot)",
                date=today())
    return table.replaced(new), skipped


def _ask_sky_catalog(queries: list[dict[str, str]], python: Path, timeout_s: float) -> dict[str, Any]:
    """`cloud/sky_catalog.py`'s answer to `queries`, from one run of SkyPilot's Python `python`; a
    PriceError line when it cannot answer."""
    from cloud.sky_catalog import MARK

    env = {**os.environ, "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"}
    try:
        proc = subprocess.run([str(python), str(SKY_CATALOG_SCRIPT)], input=json.dumps({"queries": queries}),
                              capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        raise PriceError(f"--refresh sky: SkyPilot's catalog did not answer in {timeout_s:g} s (downloading a "
                         f"catalog over a network that drops the connection?)") from None
    except OSError as err:
        raise PriceError(f"--refresh sky: {python}: cannot run SkyPilot's Python ({err.strerror or err})") from None
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise PriceError(f"--refresh sky: {python}: SkyPilot could not be asked for prices ({_clip(tail)})")
    return json.loads(lines[-1].removeprefix(MARK))
