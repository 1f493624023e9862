"""What `spotlight launch` runs on the fleet: the user's run config turned into a cloud one.

A config written for this machine (`experiments/tiny_dit.yaml`: `device: cpu`, no notice
sources, no checkpoint store) would, copied unchanged onto H100 nodes, train on their CPUs, ignore
every interruption notice and lose all its checkpoints with the head. So `launch` sets what a
cloud run needs and says each change in one line:

- `device: cuda` (a `cuda:N` stays as it is): every launched node has `cloud.gpu`;
- `runtime.notice_sources`: the provider's metadata endpoint and SIGTERM (SkyPilot's and the
  OS's shutdown signal); both providers' endpoints when `cloud.provider` leaves the choice to
  SkyPilot (a watcher whose endpoint is not there reads nothing, after a one-second timeout).
  Rollout workers watch them in their own processes, SP groups in each node's agent
  (`spotlight.runtime.ray_sp`);
- `cloud.checkpoint_uri`: `--checkpoint-uri`, else the config's; required, and an object store
  (`s3://` or `gs://`) — a folder would be on the head's disk, and go with it. Its credentials
  reach the head as SkyPilot secrets (`cloud.credentials`).

Anything it cannot turn into a cloud run is refused in one line (`ConfigError`, exit 2).

`toy_warning` is the one line `launch` prints when the user's config is a toy — written for this
machine's CPU, or the tiny model without pretrained weights — headed for data-centre GPUs
(`experiments/tiny_dit.yaml` as it is would rent three H100 nodes).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from cloud.store import StoreURIError, parse_store_uri
from schedulers.input.files import short
from spotlight.config import ConfigError, RunConfig, from_dict

OBJECT_STORES = ("s3", "gs")
"""The store schemes a launched run may use: stores that outlive every node."""


def for_the_cloud(cfg: RunConfig, checkpoint_uri: str | None) -> tuple[RunConfig, list[str]]:
    """The cloud version of `cfg`, and one line per setting changed."""
    data: dict[str, Any] = cfg.to_dict()
    changes: list[str] = []

    def set_(section: str | None, key: str, value: Any) -> None:
        where = data if section is None else data[section]
        if where[key] != value:
            name = key if section is None else f"{section}.{key}"
            changes.append(f"{name}: {_shown(where[key])} -> {_shown(value)}")
            where[key] = value

    uri = checkpoint_uri or cfg.cloud.checkpoint_uri
    if uri is None:
        raise ConfigError("spotlight launch needs --checkpoint-uri s3://BUCKET/PREFIX or gs://BUCKET/PREFIX "
                          "(or cloud.checkpoint_uri): a fleet's checkpoints must outlive its head")
    # The kind of store first: a folder's own faults (outside $SPOTLIGHT_STORE_ROOTS) would send the
    # user to fix what a launched run refuses anyway.
    scheme, sep, _ = uri.partition("://")
    if not sep or scheme.lower() not in OBJECT_STORES:
        raise ConfigError(f"--checkpoint-uri {short(uri)}: a folder is on the head's disk and is lost with it; "
                          "a launched run needs an object store (s3://BUCKET/PREFIX or gs://BUCKET/PREFIX)")
    try:
        parse_store_uri(uri)
    except StoreURIError as err:
        raise ConfigError(f"--checkpoint-uri: {err}") from None
    set_("cloud", "checkpoint_uri", uri)
    if not cfg.device.startswith("cuda"):
        set_(None, "device", "cuda")
    provider = cfg.cloud.provider
    set_("runtime", "notice_sources", [provider, "sigterm"] if provider else ["aws", "gcp", "sigterm"])
    try:
        return from_dict(RunConfig, data), changes
    except ConfigError as err:  # a setting above that the rest of the config refuses
        raise ConfigError(f"the launched config: {err}") from None


DATACENTRE_GPUS = frozenset({"A100", "A100-80GB", "B200", "GH200", "H100", "H100-MEGA", "H200"})
"""GPUs a toy run has no use for: 40-192 GB training accelerators at $1.3-$12 per GPU-hour on
demand in cloud/prices.csv, where the tiny DiT needs ~1 GB (a T4 node is $0.53/h)."""


def toy_warning(cfg: RunConfig, config: str, nodes: int, usd_h: float | None) -> str | None:
    """One line when `cfg` (the user's config, before `for_the_cloud`) is a toy run — `device: cpu`,
    or the tiny model (no pretrained_path) — headed for `nodes` nodes of a GPU in `DATACENTRE_GPUS`
    costing `usd_h` dollars an hour in all (None: unpriced); else None."""
    c = cfg.cloud
    if c.gpu.upper() not in DATACENTRE_GPUS:
        return None
    tiny = cfg.policy.pretrained_path is None and (cfg.policy.kind == "llm" or cfg.policy.dit.preset == "tiny")
    why = [what for what, yes in ((f"device: {cfg.device}", cfg.device == "cpu"),
                                  (f"the tiny {'LLM' if cfg.policy.kind == 'llm' else 'DiT'}, no pretrained_path",
                                   tiny)) if yes]
    if not why:
        return None
    cost = f" at ${usd_h:,.2f}/h" if usd_h is not None else ""
    return (f"warning: {config} is a toy run ({'; '.join(why)}) and would rent {nodes} node{'s' * (nodes != 1)} of "
            f"{c.gpus_per_node} x {c.gpu}{cost}: set cloud.gpu (T4 is the cheapest spot GPU) if that is not meant")


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def local_inputs(cfg: RunConfig) -> list[tuple[str, str]]:
    """(field, path) of every input of `cfg` read from this machine's disk: the model folder (unless a
    bucket or Hub source), the prompt files, a reward model's weights and a reward function's file."""
    from cloud.model_cache import is_remote

    found = [("policy.pretrained_path", cfg.policy.pretrained_path), ("prompts.path", cfg.prompts.path),
             ("prompts.eval_path", cfg.prompts.eval_path), ("reward.model_path", cfg.reward.model_path)]
    for i, term in enumerate(cfg.reward.terms):
        found.append((f"reward.components[{i}].model_path", term.model_path))
        if term.function is not None and term.function.rpartition(":")[0].endswith(".py"):
            found.append((f"reward.components[{i}].function", term.function.rpartition(":")[0]))
    return [(f, p) for f, p in found if p and not (f == "policy.pretrained_path" and is_remote(p))]


def inputs_warnings(cfg: RunConfig, cwd: Path, project: Path, ignored: Callable[[Path], bool]) -> list[str]:
    """One line per local input of `cfg` (`local_inputs`) a rented node will not find: SkyPilot uploads
    the `project` folder (the tasks' workdir, less what git ignores: `ignored`) and the nodes run in it,
    so only a relative path that names the same file from `cwd` and from `project`, and is uploaded,
    is there."""
    lines = []
    root = project.resolve()
    for field, value in local_inputs(cfg):
        here = (cwd / value).resolve()
        if not here.exists():
            why = "it is not on this machine either"
        elif not here.is_relative_to(root):
            why = f"SkyPilot uploads the project folder {root} only"
        elif Path(value).is_absolute() or here != (root / value).resolve():
            why = f"the nodes read it from the project folder: write it as {short(str(here.relative_to(root)))}"
        elif ignored(here):
            why = "git ignores it, so SkyPilot does not upload it"
        else:
            continue
        lines.append(f"warning: {field}: {short(value)} will not exist on a rented node ({why}); put it under "
                     "the project folder, or a model folder in the store (s3://..., gs://...)")
    return lines
