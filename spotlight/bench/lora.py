"""`spotlight bench lora`: what a weight publication moves with LoRA (`policy.lora`) against full
training — bytes per iteration, and the ratio against the adapter-to-full parameter ratio.

For each tiny config (experiments/tiny_dit_lora.yaml and tiny_llm_lora.yaml, warm start off: it
changes values, not sizes) a `Learner` is built twice, with `policy.lora.rank` 0 and with the
config's rank. What one iteration publishes is `Learner.weights()` — the state dict every worker
loads (the Ray runtime puts it in the object store once per version) — measured as its
safetensors serialization in bytes, with the seconds `weights()` plus that serialization take.
`bytes_ratio` = LoRA bytes / full bytes; `param_ratio` = adapter parameters / base parameters.
They differ by the base's buffers and headers only, which a test bounds. With LoRA a worker also
receives the base once when it starts, if the run warm-starts it (`Learner.base`; without a warm
start each node loads it itself and only a fingerprint goes): `base_bytes_once`.

The real Qwen-Image transformer (20B) is counted on the meta device (no memory, nothing
published): its parameters, the adapters' at the community recipe's rank 64 / alpha 128 on the
default targets, and the bytes each would publish — the base in bfloat16, the adapters in float32
(they train in float32 over a bfloat16 base: `spotlight.rl.lora.add_lora`), so there the bytes
ratio is twice the parameter ratio.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import save as safetensors_bytes

from spotlight.config import RunConfig, load_config
from spotlight.rl.lora import add_lora, base_state, trainable

CONFIGS = {"dit": "experiments/tiny_dit_lora.yaml", "llm": "experiments/tiny_llm_lora.yaml"}
QWEN_IMAGE_RANK = 64
"""The rank of the community's Flow-GRPO recipes for Qwen-Image (alpha 128)."""
_ROOT = Path(__file__).resolve().parents[2]


def _publication(cfg: RunConfig) -> dict[str, Any]:
    from spotlight.runtime.learner import Learner

    learner = Learner(cfg)
    learner.build()
    start = time.perf_counter()
    published = len(safetensors_bytes(learner.weights()))
    seconds = time.perf_counter() - start
    params = sum(p.numel() for p in trainable(learner.policy.model))
    lora = cfg.policy.lora.enabled
    base = len(safetensors_bytes({k: v.contiguous() for k, v in base_state(learner.policy.model).items()})) if lora else 0
    return {"bytes": published, "publish_s": seconds, "trained_params": params, "base_bytes_once": base}


def _tiny(path: str) -> dict[str, Any]:
    over = {"warm_start": {"steps": 0}, "runtime": {"kind": "local"}}
    lora_cfg = load_config(_ROOT / path, over)
    full_cfg = load_config(_ROOT / path, {**over, "policy": {"lora": {"rank": 0}}})
    full, lora = _publication(full_cfg), _publication(lora_cfg)
    return {"config": path, "rank": lora_cfg.policy.lora.rank, "full_bytes": full["bytes"],
            "lora_bytes": lora["bytes"], "bytes_ratio": lora["bytes"] / full["bytes"],
            "full_params": full["trained_params"], "adapter_params": lora["trained_params"],
            "param_ratio": lora["trained_params"] / full["trained_params"],
            "full_publish_s": full["publish_s"], "lora_publish_s": lora["publish_s"],
            "base_bytes_once": lora["base_bytes_once"]}


def _qwen_image(rank: int) -> dict[str, Any]:
    from diffusers import QwenImageTransformer2DModel

    from spotlight.config import default_config
    from spotlight.rl.dit_model import QWEN_IMAGE_TRANSFORMER

    cfg = default_config({"policy": {"dit": {"preset": "qwen-image"}, "lora": {"rank": rank, "alpha": 2 * rank}}})
    with torch.device("meta"):
        model = QwenImageTransformer2DModel(**QWEN_IMAGE_TRANSFORMER)
        full = sum(p.numel() for p in model.parameters())
        add_lora(model, cfg)
    adapters = trainable(model)
    adapter = sum(p.numel() for p in adapters)
    full_gb = full * (torch.finfo(torch.bfloat16).bits // 8) / 1e9
    lora_gb = sum(p.numel() * p.element_size() for p in adapters) / 1e9
    return {"rank": rank, "full_params": full, "adapter_params": adapter, "param_ratio": adapter / full,
            "full_bf16_gb": full_gb, "lora_float32_gb": lora_gb, "bytes_ratio": lora_gb / full_gb}


def run_lora_bench(qwen_image_rank: int = QWEN_IMAGE_RANK, progress: bool = False) -> dict[str, Any]:
    from tqdm import tqdm

    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        *((kind, lambda p=path: _tiny(p)) for kind, path in CONFIGS.items()),
        ("qwen_image", lambda: _qwen_image(qwen_image_rank))]
    result: dict[str, Any] = {}
    for name, run in tqdm(steps, desc="bench lora", disable=not progress):
        result[name] = run()
    result["machine"] = {"cpus": os.cpu_count(), "torch": torch.__version__}
    return result
