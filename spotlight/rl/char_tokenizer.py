"""A character-level tokenizer for the tiny LLM's arithmetic task, built in code (no download).

Every character is one token: a WordLevel model over single characters behind a pre-tokenizer
that isolates each character, and a `Fuse` decoder so decoding joins characters without spaces.
The vocabulary is fixed (ids below are stable), so a model trained with it keeps meaning across
runs; it round-trips through `save_pretrained` / `AutoTokenizer.from_pretrained(local_dir)`.
Encoding with special tokens (transformers' default: `tok(text)`) puts `<bos>` first, as the
policy's every sample starts, so a saved policy (`final/`) answers through plain `AutoTokenizer`
+ `generate` what it answers in training (tests/spotlight/rl/test_llm_policy.py). The policy itself encodes
with `add_special_tokens=False` and prefixes `<bos>` on its own, so the same code path works for
pretrained tokenizers that have no bos token.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARACTERS = tuple("0123456789") + ("+", "-", "=")
VOCAB: dict[str, int] = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
"""Token -> id: `<pad>` 0, `<bos>` 1, `<eos>` 2, `<unk>` 3, then the characters (17 in all)."""


def first_unreadable(prompts: Iterable[Any]) -> tuple[Any, str] | None:
    """The first prompt (a `prompts.Prompt`) holding a character this tokenizer has no token for,
    and that character; None when it reads them all. Such a character is `<unk>` to the tiny LLM: a
    natural-language prompt trains at reward 0 without a word said (issue 42)."""
    known = set(CHARACTERS)
    for prompt in prompts:
        for char in prompt.text:
            if char not in known:
                return prompt, char
    return None


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer with pad/bos/eos/unk set; `len(tok) == len(VOCAB)`."""
    core = Tokenizer(models.WordLevel(vocab=VOCAB, unk_token="<unk>"))
    # [\s\S] (not ".") so newlines are isolated too; each piece is one vocabulary entry or <unk>.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    bos = ("<bos>", VOCAB["<bos>"])
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos> $B",
                                                        special_tokens=[bos])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
    )
