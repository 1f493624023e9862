"""Seconds a policy spends in the parts of a rollout that are not denoising (the prompt encoding,
the VAE decode), kept beside the samples they were spent on: a finished `Rollout` carries its own
(`Rollout.seconds`), the reward adds up an iteration's (`Scores.rollout_seconds`), and
metrics.jsonl shows them as `time_encode_s` / `time_decode_s` (what `make gpu-check` splits the
rollout phase by).

On CUDA a phase's clock starts and stops at a `torch.cuda.synchronize()`: kernels run after the
call that queued them, so without the waits the encode's seconds would be its launches and the
decode would pay for the last denoising step. Two waits a phase, a phase once per request (the
encoding is cached for the request's steps): the only sync points the rollout adds.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import torch


class PhaseSeconds:
    """Seconds per phase since they were last taken (`take`)."""

    def __init__(self) -> None:
        self._held: dict[str, float] = {}

    @contextmanager
    def timed(self, phase: str, device: str) -> Iterator[None]:
        """Add the block's seconds to `phase`; on a CUDA `device`, the GPU's work included."""
        cuda = device.startswith("cuda")
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        try:
            yield
        finally:
            if cuda:
                torch.cuda.synchronize(device)
            self._held[phase] = self._held.get(phase, 0.0) + time.perf_counter() - start

    def take(self) -> dict[str, float]:
        """The seconds held, emptied: each second is reported with one rollout only."""
        held, self._held = self._held, {}
        return held

