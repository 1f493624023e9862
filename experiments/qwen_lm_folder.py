"""A transformers causal LM folder built in code (no download): what a user's local instruct model
folder looks like to `policy.llm.pretrained_path` — tiny (the tests) or Qwen2.5-7B-shaped with
random weights (the GPU check: `python -m experiments.build_check_pipeline --kind llm`).

- The model: a random `Qwen2ForCausalLM` — `tiny`: 2 layers of hidden 64, its initial weights a
  function of `seed`; `real`: Qwen2.5-7B-Instruct's config (`REAL_LM`: 28 layers of hidden 3584,
  7.6B parameters, 15 GB in bfloat16), written shard by shard (`random_shards`) — with a generation
  config that stops at `<|im_end|>` or `<|endoftext|>` as Qwen2.5-Instruct's does.
- The tokenizer: Qwen2's own design made offline — byte-level BPE behind Qwen2's pre-tokenizer
  regex (digits are single tokens), its merges trained here on a few lines of text (~70 merges over
  the 256-byte alphabet); special tokens `<|endoftext|>` (pad), `<|im_start|>`, `<|im_end|>` (eos,
  as in an instruct model), no bos; and a Qwen-style chat template without a default system turn:
  `<|im_start|>user\\n{text}<|im_end|>\\n<|im_start|>assistant\\n`. The real-size model keeps
  Qwen's vocabulary size (152,064 rows); this tokenizer uses its first ~330.

Saved with `save_pretrained`, the folder loads through `AutoModelForCausalLM.from_pretrained(path,
local_files_only=True)` and `AutoTokenizer.from_pretrained(path, local_files_only=True)`
(tests/spotlight/rl/test_llm_folder.py).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Qwen's special tokens, in the released order (ids 0, 1, 2 here)."""
QWEN2_PRETOKENIZE = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                     r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
"""Qwen2's pre-tokenizer regex (transformers' tokenization_qwen2.PRETOKENIZE_REGEX)."""
CHAT_TEMPLATE = ("{%- for message in messages %}"
                 "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
                 "{%- endfor %}"
                 "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
"""Qwen2.5-Instruct's template without its tools and default system turn."""
CORPUS = [
    "user assistant question answer the sum of two numbers is",
    "What is the answer? The answer is a number. Add the numbers and write the result.",
    "Natalia sold clips to her friends, and then she sold half as many clips in May.",
] * 4
"""Text the BPE merges are trained on: a few frequent words become single tokens."""


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The Qwen2-style byte-level BPE tokenizer with its chat template (~330 tokens)."""
    core = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=330, special_tokens=list(SPECIAL), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )


def save_tiny_lm(path: Path | str, seed: int = 0, tie_word_embeddings: bool = False) -> Path:
    """Write the tiny model and its tokenizer to `path` (created); returns it.

    `tie_word_embeddings`: lm_head shares the embedding matrix, as in Qwen2.5-0.5B/1.5B/3B. Off by
    default: the warm-start cache and full-parameter checkpoints save the state dict with
    safetensors, which refuses two names for one storage (tests/spotlight/rl/test_llm_folder.py, the xfail)."""
    path = Path(path)
    tokenizer = build_tokenizer()
    eos, pad = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
                         tie_word_embeddings=tie_word_embeddings, bos_token_id=None, eos_token_id=eos, pad_token_id=pad)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


REAL_LM = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
               num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768, rope_theta=1e6,
               tie_word_embeddings=False)
"""Qwen2.5-7B-Instruct's config.json (the layer shapes verl's and TRL's GSM8K recipes train)."""


def save_real_lm(path: Path | str, seed: int = 0, progress=None) -> Path:
    """The Qwen2.5-7B-shaped model (random, bfloat16) and the tokenizer at `path`; returns it.
    `progress(what, done_bytes, total_bytes)` after each shard."""
    from experiments.random_shards import write_random_weights

    path = Path(path)
    tokenizer = build_tokenizer()
    eos, pad = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = Qwen2Config(**REAL_LM, bos_token_id=None, eos_token_id=eos, pad_token_id=pad)
    config.torch_dtype = "bfloat16"
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    config.save_pretrained(path)
    GenerationConfig(eos_token_id=[eos, pad], pad_token_id=pad).save_pretrained(path)
    write_random_weights(model, path, "model", seed, progress=lambda d, t: progress and progress("model", d, t))
    tokenizer.save_pretrained(path)
    return path
