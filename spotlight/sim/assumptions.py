"""The constants a simulated answer rests on, as three named sets: `pessimistic`, `typical`,
`optimistic`.

Some figures of the step-time model and of the simulated run are not measured for the real model
on real GPUs: how fast a spot GPU computes the update's micro-batches, the links that the weight
publication and the gradient parts cross, the learner's step, how long a new spot node needs
before it serves, a cold start and a restore. They decide the answer, so `simulate()` runs every
policy at each set and reports each answer as a range (`result["ranges"]`,
docs/simulator.md#the-constant-sets).

A set is a mapping of overrides of existing fields, applied with `dataclasses.replace` to the run's
`StepTimes` and `SimConfig` (`apply`). A constant either replaces the figure (`scale=False`) or
multiplies it (`scale=True`: `restore_s`, which is bytes over a read rate and differs between the
LoRA and the full-parameter profiles). `weight_sync_s` and `update_round_s` are not varied
directly: the profiles derive them from bytes over links (`spotlight.sim.transfers`), so the sets
vary the link figures, and `replace` derives the two again (`describe` reports what they became).
Every value says what it assumes and its source (`Choice`), and goes into the result.

Invariants:
- every field named here is a field of `StepTimes` or `SimConfig`, checked at import: a renamed
  field fails loudly rather than silently leaving a figure unvaried
  (`tests/spotlight/sim/test_simulator.py::test_the_constant_sets_vary_shipped_figures_and_keep_given_ones`);
- only a *shipped* figure is varied: the value a shipped profile (`qwen-image-lora`,
  `qwen-image-full`) or SimConfig's default holds. Any other figure was *given* — a `--step-times`
  file, a caller's `StepTimes` — and is the run's own in all three sets (`describe` marks it
  `given`); a file that sets exactly a shipped figure cannot be told from it, and is varied;
- a profile measured end to end (`MEASURED_PROFILES`: `tiny-cpu`) has nothing assumed: its three
  sets are identical, and every range is one value;
- `typical` is the shipped figures (factor 1 for a scaled one), so `result["policies"]` is what a
  run without the sets gives.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from spotlight.config import ConfigError
from spotlight.sim.config import SimConfig
from spotlight.sim.step_time import DERIVED, PROFILES, StepTimes

SETS = ("pessimistic", "typical", "optimistic")
"""The constant sets, in the order they are shown."""

MEASURED_PROFILES = ("tiny-cpu",)
"""Profiles (by name, which is also their `StepTimes.gpu`) whose figures are all measured
(docs/measurements.md): the three sets leave them as they are."""


@dataclass(frozen=True)
class Choice:
    value: float
    """The figure (`scale=False`) or the factor on the run's figure (`scale=True`)."""
    assumes: str
    """What has to be true for this figure, with numbers."""
    source: str
    """Where the numbers come from."""


@dataclass(frozen=True)
class Constant:
    field: str
    """A field of `StepTimes` (`on="step_times"`) or of `SimConfig` (`on="sim"`)."""
    on: str
    what: str
    """What the figure is, in a few words."""
    scale: bool
    """True: each choice multiplies the run's figure (1 for typical); False: replaces it."""
    pessimistic: Choice
    typical: Choice
    optimistic: Choice

    def choice(self, name: str) -> Choice:
        return getattr(self, name)


# Arithmetic used below, Qwen-Image at 512² on H100s (spotlight/sim/step_time.py, transfers.py): the
# rank-64 adapters are 1.70 GB in float32, every weight 40.9 GB in bf16; a round of the fleet
# update sends the learner 32 gradient parts, each as large as the trained parameters (54 GB at
# rank 64, 1.3 TB full); 100 Gbit/s = 12.5 GB/s.
CONSTANTS: tuple[Constant, ...] = (
    Constant(
        "fleet_update_efficiency", "step_times",
        "a fleet executor's rate on the update's micro-batches (on-demand or spot), over one GPU's measured rate",
        scale=False,
        pessimistic=Choice(0.5, "half: each micro-batch pulled as a Ray task pays its dispatch and its gradient "
                                "part's serialisation into the object store (1.7 GB at ~10 GB/s of host memory, "
                                "0.2 s; 41 GB full, 4 s) next to a few seconds of compute, and workers that lack "
                                "the round's weights reload them",
                           "arithmetic on the step-time model's micro-batch and transfers.py's byte counts"),
        typical=Choice(0.8, "the shipped figure: a fifth lost to dispatch, serialisation and reloads",
                       "`spotlight bench update` measured 0.77 on the tiny DiT over Ray on CPU, its "
                       "transfers included (docs/measurements.md); not measured on GPUs"),
        optimistic=Choice(0.95, "the measured compute but for the dispatch: the parts leave through the "
                                "object store while the next micro-batch computes",
                          "arithmetic: the GPU is the one the step times were measured on")),
    Constant(
        "node_gbps", "step_times", "a GPU node's link for Ray's transfers, Gbit/s (weight sync)",
        scale=False,
        pessimistic=Choice(50.0, "the primary interface shared with the node's other traffic (the rollout's "
                                 "trajectories, object-storage reads, checkpoint uploads): half of 100",
                           "transfers.NODE_GBPS's data sheets (AWS p5.48xlarge: 100 Gbit/s per network card)"),
        typical=Choice(100.0, "one 100 Gbit/s network card, the primary interface Ray's TCP uses",
                       "transfers.NODE_GBPS (AWS p5.48xlarge data sheet)"),
        optimistic=Choice(200.0, "a 200 Gbit/s host NIC", "transfers.NODE_GBPS: GCP a3-highgpu-8g's host NIC")),
    Constant(
        "learner_gbps", "step_times", "the learner's ingress, Gbit/s (the gradient parts; the weight sync)",
        scale=False,
        pessimistic=Choice(50.0, "as node_gbps: the learner node's interface shared with its publication and the "
                                 "checkpoint uploads", "as node_gbps"),
        typical=Choice(100.0, "as node_gbps: an on-demand node of the same kind", "transfers.LEARNER_GBPS"),
        optimistic=Choice(200.0, "as node_gbps", "as node_gbps")),
    Constant(
        "cross_zone_factor", "step_times", "the share of a link a learner <-> spot node transfer gets",
        scale=False,
        pessimistic=Choice(0.25, "a transfer over ~5 TCP flows capped at 5 Gbit/s each outside a placement group: "
                                 "25 of 100 Gbit/s",
                           "EC2 User Guide, 'Amazon EC2 instance network bandwidth' (5 Gbit/s per flow outside a "
                           "placement group)"),
        typical=Choice(0.5, "half of what the transfer gets inside a placement group", "transfers.CROSS_ZONE_FACTOR"),
        optimistic=Choice(1.0, "spot nodes in the learner's zone with enough flows to fill the link",
                          "EC2 User Guide: flows inside a cluster placement group reach 10 Gbit/s each")),
    Constant(
        "learner_step_s", "step_times", "the learner's sum, clip and step per update round, besides the ingress",
        scale=False,
        pessimistic=Choice(3.0, "32 parts taken one Ray call at a time (~50 ms each with deserialisation) plus the "
                                "sum and step: ~3 s", "arithmetic"),
        typical=Choice(1.0, "Ray's calls per round; an Adam step over 0.42B adapters is milliseconds",
                       "transfers.LEARNER_STEP_S"),
        optimistic=Choice(0.3, "the parts fetched concurrently, one call's latency per round", "arithmetic")),
    Constant(
        "join_s", "sim", "seconds from a trace node's arrival to its GPUs serving",
        scale=False,
        pessimistic=Choice(540.0, "cold_start_s's pessimistic 600 s less its object-storage read (82 s), plus the "
                                  "pipeline's weights from a peer and their load (~20 s)",
                           "as cold_start_s, pessimistic"),
        typical=Choice(240.0, "the shipped figure: provisioning and container start (180 s of the cold start's "
                              "2-3 min), agent and members (~10 s), ~58 GB of weights from a peer (~9 s) and their "
                              "load and warm-up (~20 s), with a margin",
                       "SimConfig.join_s (spotlight/sim/config.py)"),
        optimistic=Choice(120.0, "an image with the container baked in: EC2 launch to SSH ~25-30 s, GPU driver and "
                                 "agent start ~60 s, the weights from a peer and loaded ~30 s",
                          "EC2 launch to SSH measured at 25.8 s (brevdev/ec2-coldboot-research) and ~29 s "
                          "(ec2-boot-bench, daemonology.net, 2021) on small instances; the rest arithmetic")),
    Constant(
        "cold_start_s", "step_times", "a restarted job's fresh node serving again (the restart baselines)",
        scale=False,
        pessimistic=Choice(600.0, "spot capacity found after failing over across zones (each failed attempt "
                                  "~1-2 min), an unbaked image pulled, and 41 GB at 0.5 GB/s (82 s)",
                           "arithmetic; SkyPilot managed jobs retry zones and regions on a failed launch"),
        typical=Choice(300.0, "the shipped figure: provisioning and container start (~2-3 min on managed spot), "
                              "then 41 GB from object storage at ~1 GB/s", "StepTimes.cold_start_s"),
        optimistic=Choice(150.0, "a baked image (launch to SSH ~25-30 s, driver and agent ~60 s) and 41 GB at "
                                 "~2 GB/s (20 s)", "EC2 launch to SSH as for join_s' optimistic figure")),
    Constant(
        "restore_s", "step_times", "reading the trainer's checkpoint back (the restart baselines)",
        scale=True,
        pessimistic=Choice(4.0, "x4: the checkpoint read at 0.5 GB/s, a few object-storage streams (LoRA: the base "
                                "and the adapters' Adam state, 46 GB, 92 s; full: 204 GB, 408 s)",
                           "arithmetic; one S3 GET stream gives ~0.1 GB/s"),
        typical=Choice(1.0, "the profile's figure: ~2 GB/s (LoRA 25 s, full 120 s)", "StepTimes.restore_s"),
        optimistic=Choice(0.4, "x0.4: 5 GB/s, many parallel ranged reads on a 100 Gbit/s node",
                          "AWS S3 performance guidelines (parallel byte-range GETs)")),
)
"""Every constant varied, with its three choices (docs/simulator.md has them as a table)."""


def _shipped() -> dict[str, tuple[Any, ...]]:
    """Each constant's shipped figures: what the shipped profiles that are not measured hold, or
    SimConfig's default. A field named here that does not exist fails the import: a rename must
    not silently end its range."""
    names = {"step_times": {f.name for f in fields(StepTimes)}, "sim": {f.name for f in fields(SimConfig)}}
    profiles = [StepTimes.profile(p) for p in PROFILES if p not in MEASURED_PROFILES]
    out: dict[str, tuple[Any, ...]] = {}
    for c in CONSTANTS:
        if c.field not in names.get(c.on, ()):
            raise ImportError(f"spotlight/sim/assumptions.py: {c.field} is not a field of "
                              f"{'StepTimes' if c.on == 'step_times' else 'SimConfig'}: rename it here")
        if c.field in DERIVED:
            raise ImportError(f"spotlight/sim/assumptions.py: {c.field} is derived from bytes over links: "
                              "vary the figures it is derived from")
        out[c.field] = (tuple(dict.fromkeys(getattr(p, c.field) for p in profiles)) if c.on == "step_times"
                        else (SimConfig.__dataclass_fields__[c.field].default,))
    return out


SHIPPED = _shipped()
"""{field: its shipped figures} (`_shipped`)."""


def sets(constants: str) -> tuple[str, ...]:
    """The sets a `--constants` value runs: `all` the three, `typical` one."""
    if constants == "all":
        return SETS
    if constants == "typical":
        return ("typical",)
    raise ConfigError(f"--constants: expected all or typical, got {constants!r}")


def _own(c: Constant, cfg: SimConfig) -> Any:
    return getattr(cfg.step_times if c.on == "step_times" else cfg, c.field)


def varied(c: Constant, cfg: SimConfig) -> bool:
    """Whether `c` is an assumption in this run (module docstring: a given figure is not)."""
    return cfg.step_times.gpu not in MEASURED_PROFILES and _own(c, cfg) in SHIPPED[c.field]


def _value(c: Constant, name: str, cfg: SimConfig) -> Any:
    own = _own(c, cfg)
    if not varied(c, cfg):
        return own
    choice = c.choice(name).value
    return own * choice if c.scale else choice


def apply(name: str, cfg: SimConfig) -> SimConfig:
    """`cfg` with the constant set `name`: every varied constant's figure replaced or scaled; the
    derived transfers (`weight_sync_s`, `update_round_s`) derived again from the new links."""
    if name not in SETS:
        raise ConfigError(f"constant set: expected one of {', '.join(SETS)}, got {name!r}")
    st = {c.field: _value(c, name, cfg) for c in CONSTANTS if c.on == "step_times"}
    sim = {c.field: _value(c, name, cfg) for c in CONSTANTS if c.on == "sim"}
    return replace(cfg, step_times=replace(cfg.step_times, **st), **sim)


def describe(cfg: SimConfig, names: tuple[str, ...] = SETS) -> dict[str, dict[str, dict[str, Any]]]:
    """`result["assumptions"]`: per set, per constant, the figure used, what it assumes and its
    source — or `given: true` where the run's own figure was kept (module docstring) — and the
    derived transfers' seconds at that set (`derived: true`, or `given: true` for a given number)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name in names:
        at = apply(name, cfg).step_times
        out[name] = {}
        for c in CONSTANTS:
            entry: dict[str, Any] = {"value": _value(c, name, cfg), "what": c.what}
            if varied(c, cfg):
                choice = c.choice(name)
                entry.update(assumes=choice.assumes, source=choice.source)
                if c.scale:
                    entry["factor"] = choice.value
            else:
                entry.update(given=True, assumes="the run's own figure (a measured profile, a --step-times file "
                                                 "or a caller's StepTimes): not varied")
            out[name][c.field] = entry
        for field in DERIVED:
            derived = at.is_derived(field)
            out[name][field] = {"value": float(getattr(at, field)), **({"derived": True} if derived else {"given": True}),
                                "what": "seconds, from bytes over the links above (spotlight/sim/transfers.py)"
                                        if derived else "seconds, as given: not varied"}
    return out


RANGED = ("time_to_target_h", "cost_usd")
"""The result fields `ranges` carries, besides every `speedup_vs_*` and `cost_ratio_vs_*`."""


def ranges(runs: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, dict[str, float | None]]]:
    """`result["ranges"]`: {policy: {field: {set: value}}} from each set's compared policies
    (`runs[set][policy]`), for `RANGED` and every baseline comparison the typical result has."""
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for policy, r in runs["typical"].items():
        keys = list(RANGED) + [k for k in r if k.startswith(("speedup_vs_", "cost_ratio_vs_"))]
        out[policy] = {k: {name: runs[name][policy].get(k) for name in SETS if name in runs} for k in keys}
    return out


def span(by_set: dict[str, float | None]) -> tuple[float, float] | None:
    """The lowest and highest value over the sets; None with fewer than two sets or when a set
    has none (a target not reached)."""
    values = list(by_set.values())
    if len(values) < 2 or any(v is None for v in values):
        return None
    return min(values), max(values)
