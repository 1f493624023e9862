"""The OCR reward: Flow-GRPO's text-rendering reward (flow_grpo/ocr.py), on a real OCR engine that
needs no download.

The score of an image whose prompt asks for the text T:
    score = 1 - min(d, len(t)) / len(t),   d = 0 if t occurs in r, else Levenshtein(r, t),
where t and r are T and the recognised text (every line the engine reads, joined in reading
order) lowercased with the spaces removed — flow_grpo's normalisation. Nothing recognised
scores 0; so does text as far from T as T is long (the clip: unrelated extra text costs no more
than missing text).

The target T is the prompt metadata's `ocr_text` when it has one (a jsonl field of our naming:
no text-rendering prompt set we know of names one, and flow_grpo's OCR set is a txt file), else
the text between the prompt's first pair of double quotes (flow_grpo: `prompt.split('"')[1]`;
'A sign that says "Open 24 hours"' -> "Open 24 hours"). A prompt with neither, or with an empty
target, is a `RewardError` naming its id (flow_grpo would fail on it too).

The engine is rapidocr 3.x on onnxruntime with the PP-OCR detection and recognition models its
wheel carries, given to it by path: rapidocr's download code is never reached, so nothing is
fetched at run time (tests/spotlight/rl/test_ocr_reward.py scores with sockets refused). Set as flow_grpo's
PaddleOCR 2.9.1 is: no angle classifier (`use_angle_cls=False`); detection on the image scaled
down so that its longer side is at most 960 px, never up (PaddleOCR 2.x's `det_limit_side_len`,
`det_limit_type="max"`; rapidocr's own default scales the shorter side *up* to 736 px, ~15x slower
on small images); lines read with confidence under 0.5 dropped (PaddleOCR's `drop_score`). It runs
on onnxruntime's CUDA provider when the installed onnxruntime has one (onnxruntime-gpu, with a
GPU), else on the CPU, with torch's thread count (a Ray role's: 1).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import torch

from spotlight.rl.policy import Rollout
from spotlight.rl.prompts import Prompt, quoted_text
from spotlight.rl.reward_inputs import RewardError, pil_images

logger = logging.getLogger(__name__)

TARGET_FIELD = "ocr_text"
"""The prompt metadata field that, when present, is the text to render (instead of the quoted text)."""
DET_LIMIT_SIDE = 960
"""Detection scales an image down to this longer side, never up (PaddleOCR 2.x's default)."""
MIN_CONFIDENCE = 0.5
"""Recognised lines below this confidence are dropped (PaddleOCR's `drop_score`)."""


def target_text(prompt: Prompt) -> str:
    """The text `prompt` asks to render: its metadata's `ocr_text`, else its first quoted text."""
    if TARGET_FIELD in prompt.metadata:
        text = prompt.metadata[TARGET_FIELD]
        if not isinstance(text, str) or not text.replace(" ", ""):
            raise RewardError(f"{prompt.where()}: its {TARGET_FIELD} is {text!r:.60} (expected the text to render)")
        return text
    try:
        return quoted_text(prompt.text)
    except ValueError:
        raise RewardError(f"{prompt.where()} has no text to render (expected it between double quotes, "
                          f"'a sign that says \"Open\"', or in a jsonl field {TARGET_FIELD!r}): {prompt.text[:60]!r}") from None


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: insertions, deletions and substitutions of one character, each 1."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def text_score(recognised: str, target: str) -> float:
    """flow_grpo's OCR score of `recognised` text for `target` (module docstring); in [0, 1]."""
    r, t = recognised.replace(" ", "").lower(), target.replace(" ", "").lower()
    if not t:
        raise ValueError("the target text is empty")
    d = 0 if t in r else min(edit_distance(r, t), len(t))
    return 1.0 - d / len(t)


def _models() -> Path:
    import rapidocr

    return Path(rapidocr.__file__).resolve().parent / "models"


def build_engine(use_cuda: bool | None = None, threads: int | None = None) -> Any:
    """rapidocr's engine on the wheel's own PP-OCR models (module docstring). `use_cuda`: None
    follows onnxruntime (its CUDA provider when installed); `threads`: None is torch's count."""
    import onnxruntime
    from rapidocr import RapidOCR

    models = _models()
    det, rec = sorted(models.glob("*_det_*.onnx")), sorted(models.glob("*_rec_*.onnx"))
    if not det or not rec:
        raise RuntimeError(f"rapidocr's wheel carries no PP-OCR det/rec models in {models} (reinstall rapidocr>=3)")
    cuda_here = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    use_cuda = cuda_here if use_cuda is None else use_cuda
    threads = threads or torch.get_num_threads()
    # Which one it runs on, said once per engine (issue 39: a GPU run should not find out from its timings).
    logger.info("ocr reward: PP-OCR on onnxruntime's CUDA provider" if use_cuda else
                f"ocr reward: PP-OCR on the CPU, {threads} thread{'s' if threads != 1 else ''}"
                + ("" if cuda_here else " (this onnxruntime has no CUDA provider; onnxruntime-gpu has)"))
    return RapidOCR(params={
        "Global.log_level": "error",  # else a warning for every image in which nothing is found
        "Global.use_cls": False,
        "Global.text_score": MIN_CONFIDENCE,
        "Det.model_path": str(det[-1]),
        "Det.limit_type": "max",
        "Det.limit_side_len": DET_LIMIT_SIDE,
        "Rec.model_path": str(rec[-1]),
        "EngineConfig.onnxruntime.use_cuda": bool(use_cuda),
        "EngineConfig.onnxruntime.intra_op_num_threads": int(threads),
    })


def read_text(engine: Any, image: Any) -> str:
    """Every line `engine` reads in a PIL image, joined in reading order ("" when none)."""
    out = engine(image)
    return "".join(getattr(out, "txts", None) or ())


class OcrReward:
    """Flow-GRPO's OCR reward of a DiT's images (module docstring). The engine is built on the first
    call (onnxruntime sessions load then) and kept."""

    def __init__(self, engine: Any = None) -> None:
        self.engine = engine

    def score(self, images: Sequence[Any], targets: Sequence[str]) -> list[float]:
        """PIL images and the texts they should show -> one score each."""
        if self.engine is None:
            self.engine = build_engine()
        return [text_score(read_text(self.engine, image), target) for image, target in zip(images, targets)]

    def __call__(self, rollout: Rollout) -> torch.Tensor:
        if rollout.images is None:
            raise ValueError("the ocr reward scores images, and the rollout has none (is the policy an LLM?)")
        targets = [target_text(p) for p in rollout.prompts]  # a prompt without one fails before any OCR
        return torch.tensor(self.score(pil_images(rollout.images), targets), dtype=torch.float32)
