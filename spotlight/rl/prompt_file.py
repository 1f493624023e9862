"""A user's prompt file: the prompts a run trains on (`prompts.path`) or evaluates (`prompts.eval_path`).

Three forms, as Flow-GRPO users already have them:
- a `.txt` file: one prompt a line (flow_grpo's `dataset/ocr/train.txt`, `dataset/pickscore/*.txt`);
- a `.jsonl` file: one JSON object a line, `{"prompt": "...", any other fields}` (the prompt's field
  is `prompts.text_field`: GSM8K's files name it `question`); the other fields
  are the prompt's metadata, handed to rewards (GenEval's `*_metadata.jsonl` with `tag` and
  `include`, a GSM8K file with `answer`);
- a flow_grpo dataset folder: its `train_metadata.jsonl` or `train.txt` (metadata first), and for
  evaluation its `test_metadata.jsonl` or `test.txt`.

Invariants (tests/spotlight/rl/test_prompt_file.py feeds each broken form):
- at most `MAX_BYTES` are read, as UTF-8 text without NUL bytes (`schedulers.input.files.read_text`);
- at most `MAX_PROMPTS` prompts of at most `MAX_PROMPT_CHARS` characters each;
- blank lines are skipped; a prompt keeps its text as written, surrounding whitespace removed;
- ids count lines kept, from 0 (training) or `EVAL_PROMPT_ID0` (an evaluation file of its own):
  a prompt's id is part of every random stream of its samples, so a file's order is its identity;
- every error is one `ConfigError` line naming the file, the line and what was expected.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from schedulers.input.files import InputFileError, parse_json, read_text, short
from spotlight.config import TRAIN_FILES, ConfigError, PromptsConfig, RunConfig, dataset_file
from spotlight.rl.prompts import Prompt, draw_prompts, prompt_set

MAX_BYTES = 64 << 20
"""Largest prompt file read (64 MiB; flow_grpo's largest, pickscore's train.txt, is ~2.6 MB)."""
MAX_PROMPTS = 1_000_000
"""Most prompts of one file (the bound of `prompts.count` too)."""
MAX_PROMPT_CHARS = 10_000
"""Longest prompt in characters (GenEval's longest is under 200; a text encoder truncates anyway)."""
EVAL_PROMPT_ID0 = 1 << 32
"""First id of an evaluation file's prompts: far above any training prompt's (at most 1,000,000),
so evaluation never shares a random stream with training."""

def _shown(path: Path) -> str:
    """A path as an error line shows it: as it is, or quoted when it holds control characters (a
    newline in a file name must not forge a second error line)."""
    text = str(path)
    return text if text.isprintable() else short(text)


def read_prompts(path: str | Path, field: str = "prompts.path", first_id: int = 0,
                 text_field: str = "prompt") -> list[Prompt]:
    """The prompts of a `.txt` or `.jsonl` file, or of a dataset folder's training file; ids from
    `first_id`; a jsonl line's prompt is its `text_field`. `field` names the setting in errors."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{field}: {_shown(path)}: no such file or folder (expected a .txt or .jsonl prompt file, "
                          "or a flow_grpo dataset folder)")
    if path.is_dir():
        found = dataset_file(path, TRAIN_FILES)
        if found is None:
            raise ConfigError(f"{field}: {_shown(path)}: a folder without {' or '.join(TRAIN_FILES)} (expected a .txt or "
                              ".jsonl prompt file, or a flow_grpo dataset folder)")
        path = found
    if path.suffix not in (".txt", ".jsonl"):
        raise ConfigError(f"{field}: {_shown(path)}: expected a .txt file (one prompt a line), a .jsonl file "
                          "({\"prompt\": ...} a line) or a dataset folder")
    stat = path.stat()
    return list(_parsed(path, (stat.st_ino, stat.st_size, stat.st_mtime_ns), field, first_id, text_field))


@functools.lru_cache(maxsize=4)
def _parsed(path: Path, stamp: tuple[int, int, int], field: str, first_id: int, text_field: str) -> tuple[Prompt, ...]:
    """File `path`'s prompts, parsed once per process while `stamp` (inode, size, mtime) holds: a run
    asks for them several times before it starts (`spotlight train`'s checks, the rewards' metadata,
    the trainer, the warm start's cache key) and a 64 MiB file takes seconds to parse. An edited
    file has another stamp and is read again; an error is never cached."""
    try:
        text = read_text(path, "prompt", MAX_BYTES)
    except InputFileError as err:
        raise ConfigError(f"{field}: {err}") from None
    prompts: list[Prompt] = []
    # A byte-order mark (Windows editors write one) is not part of prompt 0; a line ends at LF, CRLF or
    # a lone CR (classic Mac). Not str.splitlines: it also splits at U+2028 and other separators a
    # JSON string may hold (a raw CR may not be in one).
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        if len(prompts) == MAX_PROMPTS:
            raise ConfigError(f"{_shown(path)}:{number}: more than {MAX_PROMPTS:,} prompts (expected at most that many)")
        text_, metadata = _jsonl_line(path, number, line, text_field) if path.suffix == ".jsonl" else (line.strip(), {})
        if len(text_) > MAX_PROMPT_CHARS:
            raise ConfigError(f"{_shown(path)}:{number}: a prompt of {len(text_):,} characters (expected at most "
                              f"{MAX_PROMPT_CHARS:,})")
        prompts.append(Prompt(first_id + len(prompts), text_, metadata, line=number))
    if not prompts:
        raise ConfigError(f"{field}: {_shown(path)}: holds no prompts (expected at least one non-empty line)")
    return tuple(prompts)


def _jsonl_line(path: Path, number: int, line: str, text_field: str) -> tuple[str, dict]:
    """A jsonl line's prompt (its `text_field`) and metadata (the object's other fields)."""
    try:
        row = parse_json(line, f"{_shown(path)}:{number}")
    except InputFileError as err:
        # parse_json names `path:number` and then its own line within the text (always 1): drop it.
        raise ConfigError(str(err).replace(f"{_shown(path)}:{number}:1:", f"{_shown(path)}:{number}:")) from None
    if not isinstance(row, dict) or not isinstance(row.get(text_field), str) or not row[text_field].strip():
        raise ConfigError(f"{_shown(path)}:{number}: expected a JSON object with a non-empty {json.dumps(text_field)} "
                          f"string (prompts.text_field), got {short(row)}")
    metadata = {k: v for k, v in row.items() if k != text_field}
    return row[text_field].strip(), metadata


def run_prompts(cfg: PromptsConfig, seed: int) -> list[Prompt]:
    """The run's training prompts: `prompts.path`'s, or the built-in set `prompts.name`."""
    return read_prompts(cfg.path, text_field=cfg.text_field) if cfg.path is not None else prompt_set(cfg, seed)


EVAL_DRAW = -1
"""Evaluation prompts taken from the training set are the draw of this (never trained) iteration index."""


def evaluation_prompts(cfg: RunConfig, train: list[Prompt]) -> list[Prompt]:
    """The fixed prompts every evaluation scores (`train.eval_every`); empty: no evaluation.

    - `prompts.eval_path`: its prompts (ids from `EVAL_PROMPT_ID0`), the first `train.eval_prompts`
      of them when that is > 0;
    - else, with `train.eval_prompts` > 0: that many of a dataset folder's test file when `prompts.path`
      is a folder with one, otherwise that many of the training prompts (`draw_prompts` of the
      never-trained iteration index `EVAL_DRAW`)."""
    limit = cfg.train.eval_prompts
    path = cfg.evaluation_file()
    if path is not None:
        prompts = read_prompts(path, "prompts.eval_path", EVAL_PROMPT_ID0, cfg.prompts.text_field)
        return prompts[:limit] if limit else prompts
    return draw_prompts(train, limit, cfg.seed, EVAL_DRAW) if limit else []


def prompt_metadata(cfg: RunConfig) -> dict[int, dict]:
    """Prompt id -> metadata of every prompt the run scores (training and evaluation) that has any:
    what the reward workers attach to a rollout's prompts (a request carries only id and text)."""
    train = run_prompts(cfg.prompts, cfg.seed)
    return {p.id: p.metadata for p in train + evaluation_prompts(cfg, train) if p.metadata}
