"""SkyPilot's catalog, asked through its API (`sky.catalog`): a script that SkyPilot's own Python runs.

SkyPilot lives in its own virtualenv (it pins click<8.2; `cloud/sky.py`), so the project does not
run this code: `cloud.prices.refresh_from_sky` runs `SKY_PYTHON cloud/sky_catalog.py` with a JSON
request on stdin and reads one JSON answer from stdout (it imports the module only for `MARK`:
`sky` is imported inside `main`). Only the standard library and `sky` are imported. Every query of
a refresh is answered in one process: starting one costs ~3 s, most of it `import sky`.

Request: `{"queries": [{"provider": "aws", "instance_type": "p5.48xlarge", "region": "us-east-1"}]}`.
Answer, the one stdout line that starts with `MARK` (SkyPilot prints to stdout too):
`{"skypilot": "0.14.1", "catalog": "v8", "providers": {provider: null or why its catalog could not
be loaded}, "prices": [{"provider", "instance_type", "region", "ondemand", "spot", "missing",
"error"}]}`, one price per query of a provider whose catalog loaded, in the order of the queries.

A price is dollars per hour of the whole instance as SkyPilot prices a node
(`sky.Resources._get_hourly_cost`): the instance type's (`catalog.get_hourly_cost`) plus its
accelerators' (`Cloud.accelerators_to_hourly_cost`: 0 on AWS, whose instance price includes the
GPUs; the GPUs' own catalog price on GCP). `ondemand` is the region's; `spot` maps each zone of the
region that sells the instance as spot (`catalog.get_region_zones_for_instance_type`) to its price.
When there is no on-demand price, `missing` says what the catalog lacks: "instance_type", "region",
or "price" (with SkyPilot's `error`).

What SkyPilot does offline (`sky/catalog/common.py`, `read_catalog`): a catalog file in its cache
(`~/.sky/catalogs/<schema>/<cloud>/vms.csv`; `$SKY_RUNTIME_DIR` replaces `~`) is used as it is when
there is no `.meta/<cloud>/vms.csv.md5` beside it (the file was put there by hand, not downloaded)
or when it is younger than the cloud's pull period (7 h for AWS and GCP). Otherwise SkyPilot
downloads the catalog from GitHub (`requests.get`, without a timeout); when that fails it logs
"Using cached catalog files", keeps the cached file and touches it, so the next 7 h do not try
again. Only a catalog that is neither cached nor downloadable is an error. No setting or
environment variable turns the download off (the pull period is a module constant), so the caller
bounds the process with a timeout.
"""

import json
import math
import os
import sys

MARK = "SPOTLIGHT-SKY-CATALOG "


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def _hourly(catalog, cloud, instance_type, accelerators, use_spot, region, zone) -> float:
    """The instance's price plus its accelerators', as `sky.Resources._get_hourly_cost` adds them.
    A ValueError when the catalog has no such price (GCP answers NaN for an accelerator it does
    not sell there)."""
    price = catalog.get_hourly_cost(instance_type, use_spot, region, zone, clouds=cloud.canonical_name())
    if accelerators:
        price += cloud.accelerators_to_hourly_cost(accelerators, use_spot, region, zone)
    if not math.isfinite(price):
        raise ValueError(f"no {'spot' if use_spot else 'on-demand'} price of {accelerators} in {zone or region}")
    return float(price)


def _price(catalog, cloud, instance_type: str, region: str) -> dict:
    """One query's answer (module docstring)."""
    name = cloud.canonical_name()
    out = {"provider": name, "instance_type": instance_type, "region": region, "ondemand": None, "spot": {},
           "missing": None, "error": None}
    if not catalog.instance_type_exists(instance_type, clouds=name):
        out["missing"] = "instance_type"
        return out
    sold_in = {r.name for r in catalog.get_region_zones_for_instance_type(instance_type, False, clouds=name)}
    if region not in sold_in:
        out["missing"] = "region"
        return out
    accelerators = catalog.get_accelerators_from_instance_type(instance_type, clouds=name)
    try:
        out["ondemand"] = _hourly(catalog, cloud, instance_type, accelerators, False, region, None)
    except (ValueError, AssertionError) as err:  # SkyPilot asserts one on-demand price per region
        out["missing"], out["error"] = "price", _first_line(err)
        return out
    for where in catalog.get_region_zones_for_instance_type(instance_type, True, clouds=name):
        if where.name != region:
            continue
        for zone in where.zones or []:
            try:
                out["spot"][zone.name] = _hourly(catalog, cloud, instance_type, accelerators, True, region, zone.name)
            except (ValueError, AssertionError):  # e.g. a GCP zone without the accelerator's spot price
                continue
    return out


def main() -> None:
    request = json.load(sys.stdin)
    import sky
    from sky import catalog
    from sky.skylet import constants
    from sky.utils import registry

    answer = {"skypilot": sky.__version__, "catalog": constants.CATALOG_SCHEMA_VERSION, "providers": {},
              "prices": []}
    clouds = {}
    for query in request["queries"]:
        provider = query["provider"]
        if provider not in answer["providers"]:
            try:
                clouds[provider] = registry.CLOUD_REGISTRY.from_str(provider)
                # The first catalog call loads the catalog, or fetches it (module docstring).
                catalog.instance_type_exists(query["instance_type"], clouds=clouds[provider].canonical_name())
                answer["providers"][provider] = None
            except Exception as err:  # requests' errors when there is no catalog to fetch, a bad name, ...
                answer["providers"][provider] = _first_line(err)
        if answer["providers"][provider] is None:
            answer["prices"].append(_price(catalog, clouds[provider], query["instance_type"], query["region"]))
    print(MARK + json.dumps(answer), flush=True)


if __name__ == "__main__":
    # Python puts this script's folder first on sys.path, and it holds cloud/sky.py, which would be
    # imported as `sky` in place of SkyPilot.
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    main()
