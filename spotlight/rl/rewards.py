"""Rewards: a rollout in, one float per sample out; a run's reward is a weighted sum of them.

Built in, needing no downloaded weights:
- `colour` — prompt-conditioned: mean over pixels of exp(-|rgb - target|² / width), target named
  by the prompt (see `prompts.COLOURS`); 1 for a perfect solid image of the named colour.
- `jpeg_compressibility` / `jpeg_incompressibility` — as in DDPO: minus / plus the JPEG size in kB.
- `ocr` — Flow-GRPO's text-rendering reward (`spotlight.rl.ocr_reward`): 1 - the normalised edit
  distance between the text an OCR engine reads and the prompt's quoted text.
- `arithmetic` — the LLM's verifiable reward: 1 when the completion is the right sum, else 0.
- `answer_match` — GSM8K style: 1 when the completion's final number equals the number of the
  prompt metadata's `answer` (after its `####` when it has one), else 0.

Model-based rewards plug in by name. `clip_score` (CLIP or PickScore weights, a local folder given
as `reward.model_path`) ships here; other packages register theirs (GenEval, ...) under the
`spotlight.rewards` entry-point group as a factory `f(RewardConfig) -> Reward`. A user's own
function plugs in by `function:` (`spotlight.rl.user_reward`).

`RewardWorker` is the reward role: it scores `reward.terms` — each component on each request's
samples (a prompt's group) separately, so that how requests are split between workers changes no
score (`split_parts`, tests/spotlight/rl/test_rewards.py::test_split_workers_score_what_one_worker_scores) —
and sums them by weight. A component that raises, outlives `reward.timeout_s`, returns the wrong
count or a non-finite value is tried once more, then stops the run with a one-line `RewardError`:
never a silent zero.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import re
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np
import torch

from spotlight.config import ConfigError, RewardComponent, RewardConfig
from spotlight.rl.policy import Rollout, sum_stats
from spotlight.rl.prompts import COLOURS, Prompt, arithmetic_answer, colour_of
from spotlight.rl.reward_inputs import RewardError, pil_images
from spotlight.reward_names import check_name, component, component_field, spec
from spotlight.rl.user_reward import UserReward, load


class Reward(Protocol):
    def __call__(self, rollout: Rollout) -> torch.Tensor:
        """rollout of N samples -> rewards (N,) float32 (a user's function: one float per sample in
        any form `as_scores` takes)."""
        ...


@dataclass
class Scores:
    """What `RewardWorker.score` returns for N samples."""

    total: torch.Tensor
    """(N,) float32: the reward, sum over `reward.terms` of weight x component score."""
    components: dict[str, torch.Tensor]
    """Each component's own (unweighted) scores, (N,) float32, keyed by `RewardComponent.label`, in
    `reward.terms` order."""
    seconds: float
    """Time spent scoring; of several workers (`concat`), the slowest one's (they score in parallel)."""
    rollout_seconds: dict[str, float] = field(default_factory=dict)
    """The scored rollouts' own seconds (`Rollout.seconds`: a DiT's `encode` and `decode`), added
    up: the reward is where an iteration's results meet, on every runtime."""

    @staticmethod
    def concat(shares: Sequence["Scores"]) -> "Scores":
        """The scores of consecutive shares of a batch (one per worker), in order."""
        first = shares[0]
        return Scores(torch.cat([s.total for s in shares]),
                      {k: torch.cat([s.components[k] for s in shares]) for k in first.components},
                      max(s.seconds for s in shares), sum_stats(s.rollout_seconds for s in shares))

    def component_stats(self, prefix: str = "reward_") -> dict[str, float]:
        """`<prefix><label>_mean` and `<prefix><label>_std` (population std, like `reward_std`) of
        each component, for metrics.jsonl."""
        out: dict[str, float] = {}
        for label, v in self.components.items():
            out[f"{prefix}{label}_mean"] = v.float().mean().item() if len(v) else math.nan
            out[f"{prefix}{label}_std"] = v.float().std(unbiased=False).item() if len(v) else math.nan
        return out


def split_parts(parts: Sequence[Any], n: int) -> list[list[Any]]:
    """`parts` in n consecutive shares, sizes differing by at most one, the larger ones first;
    concatenated they are `parts` (how the Ray runtime splits a batch between reward workers)."""
    q, r = divmod(len(parts), n)
    bounds = [0]
    for k in range(n):
        bounds.append(bounds[-1] + q + (k < r))
    return [list(parts[bounds[k]:bounds[k + 1]]) for k in range(n)]


def _images(rollout: Rollout) -> torch.Tensor:
    if rollout.images is None:
        raise ValueError("this reward scores images, and the rollout has none (is the policy an LLM?)")
    return rollout.images


def _completions(rollout: Rollout, name: str) -> list[str]:
    if rollout.completions is None:
        raise ValueError(f"the {name} reward scores completions, and the rollout has none")
    return rollout.completions


class ColourReward:
    def __init__(self, width: float) -> None:
        self.width = width

    def __call__(self, rollout: Rollout) -> torch.Tensor:
        images = _images(rollout).float()
        target = torch.tensor([_colour(p) for p in rollout.prompts], device=images.device)
        dist2 = ((images - target[:, :, None, None]) ** 2).sum(dim=1)
        return torch.exp(-dist2 / self.width).mean(dim=(1, 2)).cpu()


def _colour(prompt: Prompt) -> tuple[float, float, float]:
    try:
        return colour_of(prompt.text)
    except ValueError:  # data it cannot score: a RewardError, its line whole (the colours are the help)
        raise RewardError(f"{prompt.where()} ({prompt.text[:80]!r}) names none of the colours the colour reward "
                          f"scores: {', '.join(COLOURS)}") from None


def jpeg_kilobytes(images: torch.Tensor, quality: int = 95) -> torch.Tensor:
    """(N, 3, H, W) in [0, 1] -> (N,) JPEG sizes in kB at `quality` (DDPO's setting: 95)."""
    sizes = []
    for image in pil_images(images):
        buf = io.BytesIO()
        image.save(buf, format="JPEG", quality=quality)
        sizes.append(buf.tell() / 1000)
    return torch.tensor(sizes, dtype=torch.float32)


class JpegReward:
    def __init__(self, sign: float) -> None:
        self.sign = sign

    def __call__(self, rollout: Rollout) -> torch.Tensor:
        return self.sign * jpeg_kilobytes(_images(rollout))


class ArithmeticReward:
    def __call__(self, rollout: Rollout) -> torch.Tensor:
        completions = _completions(rollout, "arithmetic")
        return torch.tensor(
            [float(c.strip() == str(arithmetic_answer(p.text))) for p, c in zip(rollout.prompts, completions)]
        )


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
"""A number as GSM8K writes one: digits with thousands commas (removed before comparing), an
optional sign and decimals ("$1,234.50" -> 1234.50; the sentence's full stop is not a decimal)."""


def final_number(text: str) -> Fraction | None:
    """The final answer of a GSM8K-style text: the first number after its last `####` when it has
    one (GSM8K's own answers), else its last number; None when there is none."""
    if "####" in text:
        found = _NUMBER.search(text.rsplit("####", 1)[1])
    else:
        found = None
        for found in _NUMBER.finditer(text):
            pass
    if found is None:
        return None
    return Fraction(found.group().replace(",", ""))


class AnswerMatchReward:
    """1.0 when a completion's final number (`final_number`) equals that of its prompt's metadata
    `answer` (a GSM8K answer "... #### 72", or just "72" or 72), else 0. Numbers compare exactly
    as fractions: "72.0" equals "72". A prompt without a numeric `answer` is a `RewardError`."""

    def __call__(self, rollout: Rollout) -> torch.Tensor:
        scores = []
        for prompt, completion in zip(rollout.prompts, _completions(rollout, "answer_match")):
            answer = prompt.metadata.get("answer")
            if answer is None or isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
                raise RewardError(f"{prompt.where()} has no answer (expected an \"answer\" field in its jsonl line, "
                                  "e.g. \"... #### 72\")" if answer is None else
                                  f"{prompt.where()}: its answer is {type(answer).__name__} (expected text or a number)")
            target = final_number(str(answer))
            if target is None:
                raise RewardError(f"{prompt.where()}: its answer {str(answer)[:60]!r} has no number (answer_match "
                                  "compares numbers, GSM8K style)")
            scores.append(float(final_number(completion) == target))
        return torch.tensor(scores, dtype=torch.float32)


class ClipScoreReward:
    """PickScore-style preference: logit_scale · cos(text, image) from a local CLIP checkpoint."""

    def __init__(self, path: str | Path, device: str = "cpu") -> None:
        from transformers import AutoModel, AutoProcessor

        self.processor = AutoProcessor.from_pretrained(str(path), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(path), local_files_only=True).to(device).eval()
        self.device = device

    @torch.no_grad()
    def __call__(self, rollout: Rollout) -> torch.Tensor:
        images = list((_images(rollout).clamp(0, 1) * 255).round().to(torch.uint8).cpu())
        inputs = self.processor(text=[p.text for p in rollout.prompts], images=images, return_tensors="pt",
                                padding=True, truncation=True).to(self.device)
        out = self.model(**inputs)
        img = torch.nn.functional.normalize(out.image_embeds, dim=-1)
        txt = torch.nn.functional.normalize(out.text_embeds, dim=-1)
        return (self.model.logit_scale.exp() * (img * txt).sum(dim=-1)).float().cpu()


def _clip_score(cfg: RewardConfig) -> Reward:
    if not cfg.model_path or not Path(cfg.model_path).is_dir():
        raise ConfigError(f"reward.model_path: expected a local CLIP/PickScore folder for clip_score, got {cfg.model_path!r}")
    return ClipScoreReward(cfg.model_path)


def _ocr(cfg: RewardConfig) -> Reward:
    from spotlight.rl.ocr_reward import OcrReward  # rapidocr and onnxruntime only when used

    return OcrReward()


BUILTIN: dict[str, Callable[[RewardConfig], Reward]] = {
    "colour": lambda cfg: ColourReward(cfg.colour_width),
    "jpeg_compressibility": lambda cfg: JpegReward(-1.0),
    "jpeg_incompressibility": lambda cfg: JpegReward(1.0),
    "arithmetic": lambda cfg: ArithmeticReward(),
    "clip_score": _clip_score,
    "ocr": _ocr,
    "answer_match": lambda cfg: AnswerMatchReward(),
}


def available() -> dict[str, Callable[[RewardConfig], Reward]]:
    """Built-in rewards plus those registered under the `spotlight.rewards` entry-point group."""
    found = dict(BUILTIN)
    for ep in entry_points(group="spotlight.rewards"):
        found.setdefault(ep.name, ep.load())
    return found


def build_reward(cfg: RewardConfig) -> Reward:
    """The reward named `cfg.name` (the one-component shorthand); an unknown name (one uninstalled
    since the config was read) is a `ConfigError` (`reward_names.check_name`)."""
    check_name(cfg.name, "reward.name")
    return available()[cfg.name](cfg)


def build_component(cfg: RewardConfig, i: int, cwd: str | Path | None = None) -> Reward:
    """Term i of `cfg.terms` as a `Reward`: a named reward (with the component's `model_path`, else
    `reward.model_path`), or the user's function (`user_reward.load`; a file path relative to `cwd`)."""
    term: RewardComponent = cfg.terms[i]
    if term.function is not None:
        return UserReward(load(term.function, component_field(cfg, i, "function"), cwd))
    check_name(term.name, component_field(cfg, i, "name"))  # before `named` checks it as its own `name`
    named = dataclasses.replace(cfg, name=term.name, components=[], model_path=term.model_path or cfg.model_path)
    return build_reward(named)


class _Timeout(Exception):
    pass


class BadScores(ValueError):
    """What a component returned is not one finite float per sample; `str(err)` says how."""


class RewardExited(RuntimeError):
    """A reward called `os._exit`: it may not end the process that scores it."""


_REWARD_THREADS: set[int] = set()
"""Idents of the threads that run a reward now, in `_GUARD_PID` (`call_with_timeout`)."""
_GUARD_PID: int | None = None
_REAL_EXIT = os._exit


def _exit_unless_a_reward(status: int) -> None:
    """`os._exit` while rewards are scored in this process: called from a reward's thread it raises
    `RewardExited` instead (issue 41: a reward's `os._exit(0)` ended `spotlight train` with exit 0
    after checkpoint 1 of 6, as if the run had finished); from anywhere else — a child a reward
    forked included (another pid) — it exits as always."""
    if os.getpid() == _GUARD_PID and threading.get_ident() in _REWARD_THREADS:
        raise RewardExited(f"the reward called os._exit({status}) (a reward may not end the process that scores it)")
    _REAL_EXIT(status)


def call_with_timeout(fn: Callable[[Any], Any], arg: Any, timeout_s: float) -> Any:
    """`fn(arg)` in a daemon thread, waited on for `timeout_s`: its value, or its exception raised
    here, or `_Timeout`. A thread cannot be killed: one that hangs runs on, and being a daemon it
    never keeps the process from ending (the run stops: `RewardWorker.score`). An `os._exit` in
    that thread raises `RewardExited` there (`_exit_unless_a_reward`); `sys.exit` raises anyway."""
    global _GUARD_PID
    box: dict[str, Any] = {}
    if _GUARD_PID != os.getpid():  # installed once per process (a forked worker installs its own)
        _REWARD_THREADS.clear()  # a forked child's copy holds its parent's threads, none of them its own
        _GUARD_PID, os._exit = os.getpid(), _exit_unless_a_reward

    def run() -> None:
        _REWARD_THREADS.add(threading.get_ident())
        try:
            box["value"] = fn(arg)
        except BaseException as err:  # noqa: BLE001 — whatever it raised is reported by the caller
            box["error"] = err
        finally:
            _REWARD_THREADS.discard(threading.get_ident())

    thread = threading.Thread(target=run, name="spotlight-reward", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise _Timeout()
    if "error" in box:
        raise box["error"]
    return box["value"]


def as_scores(value: Any, rollout: Rollout) -> torch.Tensor:
    """A component's answer for `rollout` as (N,) float32; `BadScores` saying what is wrong with it
    (not numbers, not one per sample, not finite)."""
    n = len(rollout)
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().double().numpy()
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise BadScores(f"returned {type(value).__name__} (expected one float per sample: a list, tuple, "
                         "numpy array or tensor)") from None
    if arr.ndim != 1:
        got = "a single value" if arr.ndim == 0 else f"an array of shape {tuple(arr.shape)}"
        raise BadScores(f"returned {got} for {n} samples (expected one float per sample)")
    if len(arr) != n:
        raise BadScores(f"returned {len(arr)} values for {n} samples")
    scores = torch.from_numpy(arr).float()
    bad = (~torch.isfinite(scores)).nonzero().flatten().tolist()
    if bad:
        i = bad[0]
        raise BadScores(f"returned {arr[i]} for sample {i} (prompt {rollout.prompts[i].id}); "
                         f"{len(bad)} of {n} values are not finite (in float32)")
    return scores


class RewardWorker:
    """The stateless reward role: scores per-request rollouts by `reward.terms` (a Ray actor in the
    ray runtime, several with `reward.workers`; one in-process worker in the local runtime).

    `metadata` maps a prompt id to its metadata (a jsonl prompt's other fields): the rollouts the
    rollout workers return carry prompts rebuilt from requests, without it, and the worker attaches
    it by id before a component sees them. `cwd` is the folder a user function's relative file path
    starts from (the controller's working directory; default: this process's)."""

    def __init__(self, cfg: RewardConfig, metadata: Mapping[int, dict] | None = None,
                 cwd: str | Path | None = None) -> None:
        self.cfg = cfg
        self.metadata = dict(metadata or {})
        self.cwd = Path(cwd) if cwd is not None else Path.cwd()
        self.terms = cfg.terms
        self.rewards: list[Reward] | None = None

    def build(self) -> None:
        """Build every component (loads models, imports user functions): a bad one is a one-line
        `ConfigError` naming it. `score` builds them when this was not called."""
        if self.rewards is None:
            self.rewards = [build_component(self.cfg, i, self.cwd) for i in range(len(self.terms))]

    def _with_metadata(self, part: Rollout) -> Rollout:
        if not self.metadata:
            return part
        prompts = [dataclasses.replace(p, metadata=self.metadata.get(p.id, p.metadata)) for p in part.prompts]
        return dataclasses.replace(part, prompts=prompts)

    def _term(self, i: int, part: Rollout) -> torch.Tensor:
        """Component i's scores of `part`: tried twice, then a `RewardError` naming it."""
        term, reward = self.terms[i], self.rewards[i]
        name = f"{component(self.cfg, i)} ({spec(term)})"
        timeout = self.cfg.timeout_s
        problems, tracebacks = [], []
        for _ in range(2):
            try:
                return as_scores(call_with_timeout(reward, part, timeout), part)
            except RewardError as err:  # data it cannot score: the same again on a retry
                error = RewardError(f"{name}: {err}")
                error.traceback = _traceback(err)
                raise error from None
            except _Timeout:
                problems.append(f"took longer than reward.timeout_s ({timeout:g} s; its thread is left running "
                                "and the run stops)")
            except BadScores as err:
                problems.append(str(err))
            except KeyboardInterrupt:  # the user stopping the run (`spotlight train` exits 130), not a failure
                raise
            except BaseException as err:  # noqa: BLE001 — a user's function may raise anything
                problems.append(_raised(err))
                tracebacks.append(_traceback(err))
        again = "" if problems[0] == problems[1] else f" (first try: {problems[0]})"
        error = RewardError(f"{name}: {problems[1]}, tried twice{again}")
        if tracebacks:  # the last try's; the first one's too when it raised something else
            error.traceback = "\n".join(dict.fromkeys(reversed(tracebacks)))
        raise error

    def score(self, parts: list[Rollout]) -> Scores:
        """Scores of all samples of `parts`, in order: each component on each part, summed by weight."""
        start = time.perf_counter()
        self.build()
        parts = [self._with_metadata(p) for p in parts]
        n = sum(len(p) for p in parts)
        components: dict[str, torch.Tensor] = {}
        total = torch.zeros(n, dtype=torch.float32)
        for i, term in enumerate(self.terms):
            got = [self._term(i, p) for p in parts]
            scores = torch.cat(got) if got else torch.zeros(0)
            components[term.label] = scores
            total = total + term.weight * scores  # one term of weight 1: the component, bit for bit
        return Scores(total, components, time.perf_counter() - start, sum_stats(p.seconds for p in parts))


def _traceback(err: BaseException) -> str:
    return "".join(traceback.format_exception(err))


def _raised(err: BaseException) -> str:
    text = " ".join(str(err).split())
    text = text if len(text) <= 200 else text[:197] + "..."
    return f"raised {type(err).__name__}" + (f": {text}" if text else "")
