"""The cached warm start: run a policy's supervised warm start once, reuse it afterwards.

The cache key covers everything that determines the result (policy and prompt config, warm-start
settings, run seed, and WARM_START_VERSION — bump it when the synthetic data or the procedure
changes). Files are written atomically, so concurrent or killed runs never leave half a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Sequence

from safetensors.torch import load_file, save_file

from spotlight.config import RunConfig
from spotlight.policy import Policy
from spotlight.prompts import Prompt

WARM_START_VERSION = 1


def cache_dir(cfg: RunConfig) -> Path:
    if cfg.warm_start.cache_dir:
        return Path(cfg.warm_start.cache_dir)
    return Path(os.environ.get("SPOTLIGHT_CACHE", Path.home() / ".cache" / "spotlight"))


def cache_path(cfg: RunConfig) -> Path:
    d = cfg.to_dict()
    ws = {k: v for k, v in d["warm_start"].items() if k != "cache_dir"}
    key = {"v": WARM_START_VERSION, "seed": cfg.seed, "policy": d["policy"], "prompts": d["prompts"], "warm_start": ws}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir(cfg) / f"warm-start-{cfg.policy.kind}-{digest}.safetensors"


def apply_warm_start(policy: Policy, cfg: RunConfig, prompts: Sequence[Prompt]) -> dict[str, Any]:
    """Bring `policy.model` to its warm-started weights, from the cache when present."""
    ws = cfg.warm_start
    if ws.steps == 0:
        return {"steps": 0, "cached": False}
    path = cache_path(cfg)
    if path.is_file():
        policy.model.load_state_dict(load_file(str(path)))
        return {"steps": ws.steps, "cached": True, "path": str(path)}
    start = time.perf_counter()
    stats = policy.warm_start(prompts, ws.steps, ws.batch_size, ws.lr, cfg.seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    save_file({k: v.detach().contiguous().cpu() for k, v in policy.model.state_dict().items()}, str(tmp))
    tmp.replace(path)
    return {"steps": ws.steps, "cached": False, "path": str(path), "seconds": time.perf_counter() - start, **stats}
