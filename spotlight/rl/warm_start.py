"""The cached warm start: run a policy's supervised warm start once, reuse it afterwards.

The cache key covers everything that determines the result (policy and prompt config, warm-start
settings, run seed, and WARM_START_VERSION — bump it when the synthetic data or the procedure
changes). Files are written atomically, so concurrent or killed runs never leave half a file.

With `progress`, training draws a tqdm bar ("warm start") on stderr, as the trainer's own bar does.
The controller trains a missing warm start into the cache itself, before the roles start
(`Trainer._warm_start`), and the learner then loads it: on the Ray runtime the learner is an
actor whose output never reaches the terminal.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from safetensors.torch import load_file, save_file

from spotlight.config import ConfigError, RunConfig
from spotlight.rl.policy import Policy
from spotlight.rl.lora import storable
from spotlight.rl.prompt_file import run_prompts
from spotlight.rl.prompts import COLOURS, Prompt, colour_of, quoted_text

WARM_START_VERSION = 1


def cache_dir(cfg: RunConfig) -> Path:
    if cfg.warm_start.cache_dir:
        return Path(cfg.warm_start.cache_dir)
    return Path(os.environ.get("SPOTLIGHT_CACHE", Path.home() / ".cache" / "spotlight"))


def cache_path(cfg: RunConfig) -> Path:
    d = cfg.to_dict()
    # `data` joins the key only when it is not the default, so colour caches made before it existed still hit.
    ws = {k: v for k, v in d["warm_start"].items() if k != "cache_dir" and not (k == "data" and v == "colours")}
    # LoRA adapters go on after the warm start: a run with them shares the run's without them.
    # `policy.pretrained_path` repeats the kind's own folder, which the key holds already.
    policy = {k: v for k, v in d["policy"].items() if k not in ("lora", "pretrained_path")}
    # A prompt file is keyed by its prompts, not by where it lies; an unset one adds nothing to the
    # key, so caches made before `prompts.path` existed still hit.
    prompts = {k: v for k, v in d["prompts"].items() if v is not None and k not in ("path", "eval_path")}
    if cfg.prompts.path is not None:
        texts = "\n".join(p.text for p in run_prompts(cfg.prompts, cfg.seed))
        prompts["texts_sha256"] = hashlib.sha256(texts.encode()).hexdigest()
    key = {"v": WARM_START_VERSION, "seed": cfg.seed, "policy": policy, "prompts": prompts, "warm_start": ws}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir(cfg) / f"warm-start-{cfg.policy.kind}-{digest}.safetensors"


def apply_warm_start(policy: Policy, cfg: RunConfig, prompts: Sequence[Prompt],
                     progress: bool = False) -> dict[str, Any]:
    """Bring `policy.model` to its warm-started weights, from the cache when present; when it trains,
    with a bar on stderr if `progress`."""
    ws = cfg.warm_start
    if ws.steps == 0:
        return {"steps": 0, "cached": False}
    path = cache_path(cfg)
    if path.is_file():
        policy.model.load_state_dict(load_file(str(path)))
        return {"steps": ws.steps, "cached": True, "path": str(path)}
    if cfg.policy.kind == "dit":
        _check_prompts_draw(prompts, cfg)
    from tqdm import tqdm

    start = time.perf_counter()
    with tqdm(total=ws.steps, desc="warm start", unit="step", disable=not progress, file=sys.stderr) as bar:
        stats = policy.warm_start(prompts, ws.steps, ws.batch_size, ws.lr, cfg.seed, on_step=bar.update)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    save_file(storable(policy.model.state_dict()), str(tmp))
    tmp.replace(path)
    return {"steps": ws.steps, "cached": False, "path": str(path), "seconds": time.perf_counter() - start, **stats}


def _check_prompts_draw(prompts: Sequence[Prompt], cfg: RunConfig) -> None:
    """The tiny DiT's synthetic warm start draws each prompt's image in the colour it names
    (`synthetic_images`) or its quoted text (`synthetic_text_images`, `warm_start.data: text`): a
    prompt of the user's that has none has no image to learn."""
    if cfg.warm_start.data == "text":
        for p in prompts:
            try:
                quoted_text(p.text)
            except ValueError:
                raise ConfigError(f"warm_start.data: the text warm start draws the text between a prompt's double "
                                  f"quotes, and {p.where(cfg.prompts.path)} ({p.text[:60]!r}) has none") from None
        return
    for p in prompts:
        try:
            colour_of(p.text)
        except ValueError:
            raise ConfigError(f"warm_start.steps: the synthetic warm start draws the colour a prompt names, and "
                              f"{p.where(cfg.prompts.path)} ({p.text[:60]!r}) names none of "
                              f"{', '.join(COLOURS)}; set warm_start.steps: 0 (a pretrained model needs none)") from None
