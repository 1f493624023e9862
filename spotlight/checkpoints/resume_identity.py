"""The resume identity: what a checkpoint must share with a run for the run to resume from it.

Every checkpoint's state.json holds {"identity": {"config", "seed", "shapes"}}:
- "config": the SHA-256 of the config's result-determining settings (`resume_key`): everything but
  the settings in `NEUTRAL`;
- "seed": the run seed (also inside "config"; kept in the clear so an error can name it);
- "shapes": the SHA-256 of the trained tensors' names, shapes and dtypes (`shapes_fingerprint`).

Invariants:
- A run folder's checkpoints are checked against the run's identity before anything is loaded
  or moved (`spotlight.train.trainer.Trainer`): a checkpoint of another run is refused with one
  line and left where it is, never renamed away, whether or not the folder's config.yaml is there
  (tests/spotlight/checkpoints/test_resume_identity.py).
- A change to a `NEUTRAL` setting resumes: those settings decide where a run runs, how long, and
  how much memory a step takes — not what the weights are meant to be.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

NEUTRAL = ("train.steps", "train.micro_batch", "train.parts_per_request", "train.learner_gpus", "warm_start.cache_dir",
           "runtime", "cloud")
"""Settings that may change on resume (a section name covers the whole section):
- train.steps: how many iterations (a run is extended or shortened by it);
- train.micro_batch: samples per forward pass, i.e. memory (the sum of the micro-batches' gradients
  is the full batch's; only float rounding differs: 6e-6 at most in the tiny LLM's weights after
  2 iterations, micro_batch 64 vs 3, measured on this project's CI machine) — so a run that ran
  out of memory resumes with a smaller one;
- train.parts_per_request: how many micro-batches' gradients are summed before they travel (the
  same sum in another fixed tree: only float rounding differs, as with micro_batch); being neutral,
  it also leaves the identity of checkpoints written before the setting existed unchanged;
- warm_start.cache_dir: where the warm start is cached (its key is what it holds);
- runtime: where the roles run and with how many threads (local and Ray runs end bit-identical);
- cloud: which cloud, what it may cost, where checkpoints are mirrored."""


def _result_determining(config: dict[str, Any]) -> dict[str, Any]:
    """Config dict `config` (a `to_dict()`, or a config.yaml read back) without the `NEUTRAL` settings."""
    kept = dict(config)
    for dotted in NEUTRAL:
        section, _, name = dotted.partition(".")
        if not name:
            kept.pop(section, None)
        elif isinstance(kept.get(section), dict):
            kept[section] = {k: v for k, v in kept[section].items() if k != name}
    return kept


def resume_key(cfg: Any) -> dict[str, Any]:
    """`cfg.to_dict()` without the `NEUTRAL` settings."""
    return _result_determining(cfg.to_dict())


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def shapes_fingerprint(state: dict[str, Any]) -> str:
    """SHA-256 of the names, shapes and dtypes of `state` (tensors; nothing of their values)."""
    return _digest(sorted((name, list(t.shape), str(t.dtype)) for name, t in state.items()))


def identity(cfg: Any, trained: dict[str, Any]) -> dict[str, Any]:
    """The resume identity of run config `cfg` whose trained tensors are `trained` (`trained_state`)."""
    return {"config": _digest(resume_key(cfg)), "seed": cfg.seed, "shapes": shapes_fingerprint(trained)}


def differences(stored: dict[str, Any], cfg: Any, limit: int = 3) -> list[str]:
    """Dotted names of the result-determining settings in which config dict `stored` (a
    `to_dict()`, e.g. a run folder's config.yaml) differs from `cfg` (at most `limit`)."""
    mine, theirs = resume_key(cfg), _result_determining(stored)
    found: list[str] = []

    def walk(a: Any, b: Any, at: str) -> None:
        if len(found) >= limit:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b), key=str):
                walk(a.get(key), b.get(key), f"{at}.{key}" if at else str(key))
        elif a != b:
            found.append(at or "(the whole config)")

    walk(theirs, mine, "")
    return found


def mismatch(stored: Any, cfg: Any, trained_shapes: str | None = None) -> str | None:
    """Why a checkpoint whose state.json identity is `stored` is not this run's (one clause), or
    None when it is. `trained_shapes`: the run's `shapes_fingerprint`, when the model is built."""
    if not isinstance(stored, dict):
        return "it records no resume identity (written by an older Spotlight)"
    mine = identity(cfg, {})
    if stored.get("seed") != cfg.seed:
        return f"it is of seed {str(stored.get('seed'))[:20]}, this run's is {cfg.seed}"
    if stored.get("config") != mine["config"]:
        return "it was written with a different config"
    if trained_shapes is not None and stored.get("shapes") != trained_shapes:
        return "its tensors' names, shapes or dtypes differ from the model's"
    return None
