"""A Qwen-Image diffusers pipeline folder built in code: the real architecture with random weights,
at toy size (CI) or at the released size (the GPU check: nothing can be downloaded on the machines
Spotlight is checked on). `python -m experiments.build_check_pipeline` writes one.

What `policy.dit.pretrained_path` reads when a user brings Qwen-Image: the released pipeline's five
components, each of its real class:
- `transformer`: `QwenImageTransformer2DModel` — `tiny`: the shape of `dit_presets.TINY_TRANSFORMER`
  (2 blocks, 2 heads of 16; 4 latent channels packed 2x2 = 16 in), its joint_attention_dim the text
  encoder's hidden size (32); `real`: `dit_presets.QWEN_IMAGE_TRANSFORMER` (60 blocks, 20B, 41 GB
  in bfloat16), written shard by shard (`random_shards`) so host memory stays near one shard;
- `text_encoder`: `Qwen2_5_VLForConditionalGeneration` with the special-token ids of the tokenizer
  below — `tiny`: 1 text layer of hidden size 32, a 1-block vision tower; `real`: Qwen2.5-VL-7B's
  text model (hidden 3584, its vocabulary of 152,064) with `REAL_TEXT_LAYERS` of its 28 layers and
  one block of its vision tower (prompt encoding is timed at the real width, not the real depth);
- `vae`: `AutoencoderKLQwenImage` — `tiny`: z_dim 4 and the released 3 spatial downsamplings (8x);
  `real`: diffusers' defaults, which are the released config (z_dim 16, 127M parameters);
- `scheduler`: `FlowMatchEulerDiscreteScheduler` with Qwen-Image's released config;
- `tokenizer`: `Qwen2Tokenizer` (transformers 5's tokenizers-backed class) over a byte-level BPE
  made here (no package ships Qwen's vocabulary files): the 256 byte symbols, merges that make
  every word of diffusers' chat-template prefix one token — so the prefix is exactly the 34 tokens
  `encode_prompt` drops (`prompt_template_encode_start_idx`), as with the released tokenizer — then
  Qwen2.5-VL's 22 added tokens in their released order (`<|endoftext|>`, `<|im_start|>`,
  `<|im_end|>`, ..., vision tokens, ...). Any other text still tokenizes (into bytes and the
  template's words); prompts are therefore longer in tokens than the released tokenizer makes them.

`save_tiny_qwen_pipeline(path)` builds and saves the tiny one in a few seconds, most of them
importing diffusers and transformers (tests/conftest.py's `tiny_qwen_pipeline` fixture does it once
per session); `save_real_qwen_pipeline(path)` writes the released size (~43 GB).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from spotlight.dit_presets import QWEN_IMAGE_TRANSFORMER, TINY_TRANSFORMER

_TEMPLATE = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
             "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
             "<|im_start|>assistant\n")
"""diffusers 0.42's `QwenImagePipeline.prompt_template_encode` (an instance attribute there)."""
TEMPLATE_PREFIX_TOKENS = 34
"""What diffusers 0.42's `QwenImagePipeline.encode_prompt` drops (`prompt_template_encode_start_idx`)."""

ADDED_TOKENS = [  # Qwen2.5-VL's tokenizer, ids 151643.. in this order; the first 14 are special
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
]

HIDDEN = TINY_TRANSFORMER["joint_attention_dim"]
"""The text encoder's hidden size = the transformer's joint_attention_dim (32)."""
Z_DIM = TINY_TRANSFORMER["out_channels"]
"""The VAE's latent channels = the transformer's out_channels (4; in_channels: 4x, packed 2x2)."""
VAE = dict(base_dim=8, z_dim=Z_DIM, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
           temperal_downsample=[False, True, True], latents_mean=[0.1, -0.2, 0.3, 0.0],
           latents_std=[1.5, 2.0, 1.0, 2.5])


def _byte_symbols() -> dict[int, str]:
    """GPT-2's byte-to-unicode table (what tokenizers' ByteLevel pre-tokenizer maps bytes to)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _template_words() -> list[str]:
    """The words of diffusers' chat template, as the Qwen2 pre-tokenizer splits them (a leading
    space kept with its word), in byte-level symbols."""
    symbols = _byte_symbols()
    words = re.findall(r" ?[A-Za-z]+", _TEMPLATE.replace("<|im_start|>", "\n").replace("<|im_end|>", "\n"))
    return list(dict.fromkeys("".join(symbols[b] for b in w.encode()) for w in words))



def build_tokenizer():
    """The offline `Qwen2Tokenizer` described in the module docstring."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    vocab = {s: i for i, s in enumerate(_byte_symbols().values())}
    merges: list[tuple[str, str]] = []
    for word in _template_words():  # left to right: "Ġthe" = ((Ġ t) h) e
        for i in range(1, len(word)):
            left, right = word[:i], word[i]
            if left + right not in vocab:
                vocab[left + right] = len(vocab)
                merges.append((left, right))
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, errors="replace", model_max_length=32768)
    tok.add_tokens([AddedToken(t, special=special, normalized=False) for t, special in ADDED_TOKENS],
                   special_tokens=False)
    tok.add_special_tokens({"additional_special_tokens": [t for t, special in ADDED_TOKENS[1:] if special]})
    tok.eos_token = "<|im_end|>"  # as Qwen2.5-VL-Instruct's tokenizer_config (pad and unk stay <|endoftext|>)
    prefix = _TEMPLATE.split("{}")[0]
    n = len(tok(prefix)["input_ids"])
    if n != TEMPLATE_PREFIX_TOKENS:  # a merge of one word split another: fix the vocabulary above
        raise AssertionError(f"the chat-template prefix is {n} tokens, not {TEMPLATE_PREFIX_TOKENS}")
    return tok


REAL_TEXT = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=128000,
                 rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]})
"""Qwen2.5-VL-7B-Instruct's text model, Qwen-Image's text encoder (its released config.json)."""
REAL_VISION = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                   fullatt_block_indexes=[7, 15, 23, 31], window_size=112, patch_size=14, spatial_merge_size=2)
"""Its vision tower (unused by a text-to-image pipeline: only its weights are loaded)."""
REAL_TEXT_LAYERS = 4
"""Text layers the real-size check keeps of 28: the encoder runs once per prompt, and its cost is not
what the check is for; the full width keeps the transformer's conditioning input real."""

TINY_TEXT = dict(hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, max_position_embeddings=2048,
                 rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]})
TINY_VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=HIDDEN,
                   fullatt_block_indexes=[0], window_size=112, patch_size=14, spatial_merge_size=2)


def text_encoder_config(tokenizer, real: bool = False):
    """The `Qwen2_5_VLConfig` of the text encoder — tiny, or the real width with `REAL_TEXT_LAYERS`
    and one vision block — whose special-token ids are the tokenizer's."""
    from transformers import Qwen2_5_VLConfig

    ids = tokenizer.convert_tokens_to_ids
    if real:
        text = {**REAL_TEXT, "num_hidden_layers": REAL_TEXT_LAYERS}
        vision = {**REAL_VISION, "depth": 1, "fullatt_block_indexes": [0]}
    else:
        text, vision = {**TINY_TEXT, "vocab_size": len(tokenizer)}, TINY_VISION
    text.update(bos_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"))
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
                            video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
                            vision_end_token_id=ids("<|vision_end|>"))


def build_text_encoder(tokenizer):
    """A tiny random `Qwen2_5_VLForConditionalGeneration` whose token ids are the tokenizer's."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    return Qwen2_5_VLForConditionalGeneration(text_encoder_config(tokenizer)).eval()


def build_tiny_qwen_pipeline(seed: int = 0):
    """The pipeline (random weights, deterministic from `seed`), not saved."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline, \
        QwenImageTransformer2DModel

    from spotlight.rl.flow_sde import QWEN_IMAGE_SCHEDULER

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tokenizer = build_tokenizer()
        text_encoder = build_text_encoder(tokenizer)
        transformer = QwenImageTransformer2DModel(**TINY_TRANSFORMER)
        vae = AutoencoderKLQwenImage(**VAE)
    pipe = QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER), vae=vae,
                             text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer)
    if (pipe.prompt_template_encode, pipe.prompt_template_encode_start_idx) != (_TEMPLATE, TEMPLATE_PREFIX_TOKENS):
        raise AssertionError("diffusers' chat template changed: update _TEMPLATE and TEMPLATE_PREFIX_TOKENS")
    return pipe


def save_tiny_qwen_pipeline(path: str | Path, seed: int = 0) -> Path:
    """Build the tiny pipeline and save it at `path` (`QwenImagePipeline.save_pretrained`); returns `path`."""
    path = Path(path)
    build_tiny_qwen_pipeline(seed).save_pretrained(str(path), safe_serialization=True)
    return path


def save_real_qwen_pipeline(path: str | Path, seed: int = 0, progress=None) -> Path:
    """The released-size pipeline (module docstring) written at `path` in bfloat16, its two large
    models shard by shard; `progress(what, done_bytes, total_bytes)` after each shard. Returns `path`."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLForConditionalGeneration

    from experiments.random_shards import write_random_weights
    from spotlight.rl.flow_sde import QWEN_IMAGE_SCHEDULER

    path = Path(path)
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(str(path / "tokenizer"))
    FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER).save_pretrained(str(path / "scheduler"))
    with torch.device("meta"):
        transformer = QwenImageTransformer2DModel(**QWEN_IMAGE_TRANSFORMER)
        encoder = Qwen2_5_VLForConditionalGeneration(text_encoder_config(tokenizer, real=True))
    transformer.register_to_config(_name_or_path=str(path / "transformer"))
    transformer.save_config(str(path / "transformer"))
    write_random_weights(transformer, path / "transformer", "diffusion_pytorch_model", seed,
                         progress=lambda d, t: progress and progress("transformer", d, t))
    encoder.config.torch_dtype = "bfloat16"
    encoder.config.save_pretrained(str(path / "text_encoder"))
    write_random_weights(encoder, path / "text_encoder", "model", seed + 1,
                         progress=lambda d, t: progress and progress("text_encoder", d, t))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 2)
        AutoencoderKLQwenImage().to(torch.bfloat16).save_pretrained(str(path / "vae"), safe_serialization=True)
    _write_model_index(path)
    return path


def _write_model_index(path: Path) -> None:
    """model_index.json as `QwenImagePipeline.save_pretrained` writes it (which needs the models built)."""
    import json

    import diffusers

    index = {"_class_name": "QwenImagePipeline", "_diffusers_version": diffusers.__version__,
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "text_encoder": ["transformers", "Qwen2_5_VLForConditionalGeneration"],
             "tokenizer": ["transformers", "Qwen2Tokenizer"],
             "transformer": ["diffusers", "QwenImageTransformer2DModel"],
             "vae": ["diffusers", "AutoencoderKLQwenImage"]}
    (path / "model_index.json").write_text(json.dumps(index, indent=2))
