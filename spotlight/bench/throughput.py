"""`spotlight bench throughput`: tiny-DiT rollout and training speed on this machine.

Figures: denoising steps per second (one step of one sample = 1) during rollout, and trained
samples per second during the GRPO update (one sample = all its SDE steps, forward + backward).
Each is measured at the configured micro-batch and, as the baseline in the same run, one sample
at a time; the ratio is the batching speedup. Medians over `repeats` timed runs after a warm-up.
With `progress`, a bar on stderr counts the timed calls.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from typing import Any, Callable

import torch

from spotlight.config import default_config
from spotlight.rl.grpo import group_advantages


def _median_seconds(fn: Callable[[], Any], repeats: int, tick: Callable[[], Any] = lambda: None) -> float:
    fn()  # warm-up: first calls pay for allocator growth and lazy init
    tick()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        tick()
    return statistics.median(times)


def run_throughput(repeats: int = 5, prompts: int = 8, group_size: int = 8, micro_batch: int = 64,
                   progress: bool = False) -> dict[str, Any]:
    from tqdm import tqdm

    from spotlight.rl.dit_policy import DiTPolicy
    from spotlight.rl.prompts import prompt_set

    # 2 micro-batch sizes x (rollout, update) x (warm-up + repeats) calls
    bar = tqdm(total=2 * 2 * (repeats + 1), desc="bench throughput", unit="call", disable=not progress,
               file=sys.stderr)

    def measure(mb: int) -> tuple[float, float]:
        cfg = default_config({"train": {"micro_batch": mb, "group_size": group_size, "prompts_per_step": prompts}})
        policy = DiTPolicy.from_config(cfg)
        ps = [p for p in prompt_set(cfg.prompts, cfg.seed)[:prompts] for _ in range(group_size)]
        seeds = list(range(group_size)) * prompts
        rollout = policy.rollout(ps, seeds)
        adv = group_advantages(torch.randn(len(ps)), group_size)

        def update() -> None:
            policy.model.zero_grad(set_to_none=True)
            policy.backward(rollout, adv)

        t_roll = _median_seconds(lambda: policy.rollout(ps, seeds), repeats, bar.update)
        t_upd = _median_seconds(update, repeats, bar.update)
        return len(ps) * cfg.sampler.num_steps / t_roll, len(ps) / t_upd

    with bar:
        steps_s, train_s = measure(micro_batch)
        base_steps_s, base_train_s = measure(1)
    return {
        "machine": f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} threads",
        "samples": prompts * group_size,
        "micro_batch": micro_batch,
        "denoise_steps_per_s": steps_s,
        "trained_samples_per_s": train_s,
        "baseline_denoise_steps_per_s_batch1": base_steps_s,
        "baseline_trained_samples_per_s_batch1": base_train_s,
        "rollout_speedup_vs_batch1": steps_s / base_steps_s,
        "train_speedup_vs_batch1": train_s / base_train_s,
    }
