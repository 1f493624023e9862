"""The OCR reward through the real engine (rapidocr's PP-OCR models from its wheel) on the CPU, with
every socket refused: rendered text scores high, a one-letter-wrong rendering in between, noise ~0."""

import socket

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFont

from spotlight.config import RewardComponent, RewardConfig
from spotlight.rl.ocr_reward import OcrReward, build_engine, edit_distance, target_text, text_score
from spotlight.rl.policy import Rollout
from spotlight.rl.prompts import Prompt
from spotlight.rl.rewards import RewardError, RewardWorker

DEJAVU = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"


def _font(size=24):
    try:
        return ImageFont.truetype(DEJAVU, size)
    except OSError:  # no Debian fonts: Pillow's own (scalable since Pillow 10.1)
        return ImageFont.load_default(size=size)


def _render(text, w=192, h=64):
    image = Image.new("RGB", (w, h), "white")
    ImageDraw.Draw(image).text((8, 18), text, fill="black", font=_font())
    return image


def _noise(seed, w=192, h=64):
    return Image.fromarray((np.random.default_rng(seed).random((h, w, 3)) * 255).astype(np.uint8))


def _tensor(images):
    return torch.stack([torch.from_numpy(np.array(i)).permute(2, 0, 1).float() / 255 for i in images])


@pytest.fixture(scope="module")
def offline():
    """No network for the whole module: building the engine and scoring must not try it."""
    def refuse(*args, **kwargs):
        raise AssertionError("the OCR reward tried the network")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", refuse)
        mp.setattr(socket, "create_connection", refuse)
        yield


@pytest.fixture(scope="module")
def ocr(offline):
    return OcrReward(build_engine())


def test_rendered_text_scores_high_one_wrong_letter_between_and_noise_zero(ocr):
    targets = ["Spotlight", "Hello World"]
    clean = ocr.score([_render(t) for t in targets], targets)
    wrong = ocr.score([_render("Spotlighx"), _render("Hellp World")], targets)
    noise = ocr.score([_noise(0), _noise(1)], targets)
    assert min(clean) >= 0.9, clean
    assert all(0.0 < w < c for w, c in zip(wrong, clean)), (wrong, clean)
    assert max(noise) < 0.1, noise


def test_ocr_reads_the_prompts_quoted_text_or_its_metadata_through_the_worker(offline):
    """The worker attaches metadata by prompt id (the rollout's prompts come without it)."""
    prompts = [Prompt(0, 'a sign that says "Spotlight"'), Prompt(7, "a shop sign")]
    rollout = Rollout(prompts, [0, 0], images=_tensor([_render("Spotlight"), _render("Hello World")]))
    worker = RewardWorker(RewardConfig(components=[RewardComponent(name="ocr")]), metadata={7: {"ocr_text": "hello world"}})
    scores = worker.score([rollout])
    assert scores.total.tolist() == scores.components["ocr"].tolist()
    assert min(scores.total.tolist()) >= 0.9, scores


def test_text_score_is_flow_grpos_normalised_edit_distance():
    assert edit_distance("kitten", "sitting") == 3 and edit_distance("", "abc") == 3
    assert text_score("Hello World", "hello world") == 1.0  # case and spaces ignored
    assert text_score("xx HELLO yy", "hello") == 1.0  # contained: distance 0
    assert text_score("hellp", "hello") == pytest.approx(0.8)
    assert text_score("", "hello") == 0.0  # nothing recognised
    assert text_score("a very long unrelated sentence", "hi") == 0.0  # clipped at the target's length


def test_a_prompt_without_text_to_render_is_a_reward_error_naming_it():
    assert target_text(Prompt(0, 'a "neon" sign saying "open"')) == "neon"
    assert target_text(Prompt(1, "plain", {"ocr_text": "Open"})) == "Open"
    for prompt in (Prompt(3, "a sign"), Prompt(3, 'a "" sign'), Prompt(3, 'an "unclosed sign')):
        with pytest.raises(RewardError, match="prompt 3 has no text to render"):
            target_text(prompt)


def test_the_engine_says_which_provider_it_runs_on(offline, logged):
    """Issue 39: a GPU run should learn where its OCR runs from one line, not from its timings."""
    build_engine(use_cuda=False, threads=1)
    import onnxruntime

    cuda_here = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    assert logged[-1] == "ocr reward: PP-OCR on the CPU, 1 thread" + (
        "" if cuda_here else " (this onnxruntime has no CUDA provider; onnxruntime-gpu has)")
