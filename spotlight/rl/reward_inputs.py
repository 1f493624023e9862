"""What every reward shares: the samples as it reads them, and the error that stops a run.

`pil_images` turns a DiT rollout's images into what image rewards and users' functions read
(RGB `PIL.Image`s, quantised as flow_grpo does). `RewardError` is a reward that cannot go on: a
component that failed twice (`rewards.RewardWorker`), or a prompt a component cannot score (no
`answer` for `answer_match`, no text to render for `ocr`), which a retry would not change. Its
text is one line naming the component and what went wrong; the trainer stops the run on it, and
`spotlight train` prints it and exits with code 2.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class RewardError(RuntimeError):
    """A reward component failed on a batch, twice (or on data it cannot score, once): the run
    stops. `str(err)` is one line naming the component (`reward.components[1] (my_reward.py:score):
    returned 3 values for 8 samples, tried twice`); `traceback`, where the component raised, is the
    full traceback of what it raised (set as an attribute, so it crosses Ray's pickling with the
    error), which `spotlight train` writes to the run folder and names in that line."""

    traceback: str | None = None


def pil_images(images: torch.Tensor) -> list[Any]:
    """(N, 3, H, W) in [0, 1] -> N RGB `PIL.Image`s, quantised as flow_grpo does (x255, rounded)."""
    from PIL import Image

    arrays = (images.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    return [Image.fromarray(np.ascontiguousarray(a)) for a in arrays]
