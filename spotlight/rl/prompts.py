"""Prompt sets that need no downloaded data, and the per-iteration prompt draw.

`colours`: "a red image", ... — the tiny DiT's task; the colour reward reads the colour back from
the prompt. `arithmetic`: "12+07=" — the tiny LLM's task; the answer is computed from the text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from spotlight.config import ConfigError, PromptsConfig
from spotlight.rl.seeding import generator

# Target RGB in [0, 1] for each colour word; far enough apart that the reward tells them apart.
COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.9, 0.1, 0.1),
    "green": (0.1, 0.8, 0.2),
    "blue": (0.1, 0.2, 0.9),
    "yellow": (0.95, 0.9, 0.1),
    "cyan": (0.1, 0.85, 0.9),
    "magenta": (0.9, 0.1, 0.85),
    "orange": (1.0, 0.55, 0.0),
    "purple": (0.5, 0.1, 0.7),
    "white": (0.95, 0.95, 0.95),
    "black": (0.05, 0.05, 0.05),
    "grey": (0.5, 0.5, 0.5),
    "brown": (0.55, 0.3, 0.1),
}

ARITHMETIC_OPERAND_MAX = 20
"""Operands are drawn from [0, ARITHMETIC_OPERAND_MAX); sums have at most 2 digits."""


@dataclass(frozen=True)
class Prompt:
    id: int
    """Stable index in the prompt set; part of every random stream of its samples. Evaluation
    prompts of their own file (`prompts.eval_path`) count from `EVAL_PROMPT_ID0`."""
    text: str
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """A jsonl prompt's other fields (flow_grpo's GenEval `tag`/`include`, GSM8K's `answer`, ...),
    handed to rewards; empty for a txt line and the built-in sets."""
    line: int | None = field(default=None, compare=False, hash=False)
    """The line of its file it was read from (1-based, as an editor counts; ids skip blank lines),
    for error lines; None for the built-in sets."""

    def where(self, path: object = None) -> str:
        """The prompt as an error line names it: by its file line where it has one (ids count from 0
        and skip blank lines; an editor counts lines from 1), `path` being its file when known."""
        if self.line is None:
            return f"prompt {self.id}"
        return f"{path} line {self.line}" if path is not None else f"prompt {self.id} (file line {self.line})"


def colour_of(text: str) -> tuple[float, float, float]:
    """The target colour named in a prompt (the first colour word)."""
    for word in text.lower().replace(",", " ").split():
        if word in COLOURS:
            return COLOURS[word]
    raise ValueError(f"prompt {text!r} names none of the colours {', '.join(COLOURS)}")


def quoted_text(text: str) -> str:
    """The text between a prompt's first pair of double quotes: what it asks to render (the OCR
    reward's target, the text warm start's drawing). ValueError when there is none, or only blanks."""
    pieces = text.split('"')
    if len(pieces) < 3 or not pieces[1].strip():
        raise ValueError(f"no text between double quotes in {text[:60]!r}")
    return pieces[1]


def arithmetic_answer(text: str) -> int:
    """The answer to an 'a+b=' prompt."""
    lhs = text.rstrip("=")
    a, b = lhs.split("+")
    return int(a) + int(b)


def prompt_set(cfg: PromptsConfig, seed: int) -> list[Prompt]:
    """The run's prompts; arithmetic problems are drawn from the run seed."""
    if cfg.name == "colours":
        if cfg.count > len(COLOURS):
            raise ConfigError(f"prompts.count: expected at most {len(COLOURS)} colour prompts, got {cfg.count}")
        return [Prompt(i, f"a {name} image") for i, name in enumerate(list(COLOURS)[: cfg.count])]
    pairs = [(a, b) for a in range(ARITHMETIC_OPERAND_MAX) for b in range(ARITHMETIC_OPERAND_MAX)]
    if cfg.count > len(pairs):
        raise ConfigError(f"prompts.count: expected at most {len(pairs)} arithmetic prompts, got {cfg.count}")
    order = torch.randperm(len(pairs), generator=generator(seed, 0x5EED)).tolist()
    return [Prompt(i, f"{pairs[j][0]:02d}+{pairs[j][1]:02d}=") for i, j in enumerate(order[: cfg.count])]


def draw_prompts(prompts: list[Prompt], k: int, seed: int, step: int) -> list[Prompt]:
    """The k prompts of iteration `step`: a deterministic function of (seed, step).

    When k covers the whole set every prompt is used every iteration (in set order)."""
    if k >= len(prompts):
        return list(prompts)
    idx = torch.randperm(len(prompts), generator=generator(seed, step, 0xD4A3))[:k].sort().values
    return [prompts[i] for i in idx.tolist()]
