"""The memory a training run needs, estimated from its config before anything is built, and the
check `spotlight train` makes with it: a run this machine (or its GPU) cannot hold is refused with
one line that gives the estimate. Issue 27, item 11: configs whose every field was in range still
exhausted the machine — a 7B-shaped tiny-LLM config reached 22.8 GB and was OOM-killed, the tiny
DiT at `resolution: 4096` passed 3 GB in 10 s.

Invariants:
- Arithmetic on the config, config.json files and safetensors headers only: no model is built, no
  weight read, and torch is not imported (for a CUDA device it already is, to ask the GPU's free
  memory): the check decides in milliseconds and a few MB
  (tests/spotlight/test_memory_estimate.py::test_refusals_are_one_line_fast_and_small).
- Parameter counts are exact: `param_shapes` names each parameter with the shape the built model
  gives it (tests/spotlight/test_memory_estimate.py::test_param_shapes_are_the_models).
- The estimate covers the measured peak of the tiny configs and is within 1.5x of it
  (tests/spotlight/test_memory_estimate.py::test_estimate_covers_measured_peaks).

What the peak holds (`Estimate`, bytes):
- parameters: every model the policy loads (a pipeline's text encoder and VAE too), in its compute
  dtype: the tiny DiT float32, qwen-image bfloat16 (its VAE float32), an LLM float32 always
  (`LLMPolicy.from_config`).
- optimiser: gradients and Adam's two moments of the trained parameters (all of them, or the LoRA
  adapters in float32), a float32 EMA with `train.ema_decay`, a frozen copy of the model as the KL
  reference with `grpo.kl_beta` > 0 and no LoRA (`lora.frozen_reference`).
- rollout: one iteration's rollout (n = prompts_per_step x group_size samples), held until its
  update ends: a DiT's trajectories n x (num_steps + 1) x S x 4C and images n x 3 x res², float32;
  an LLM's n x L token rows.
- activations: the largest working set of one pass: an update micro-batch's forward and backward,
  a rollout batch (a request is one prompt's group, which a worker advances in one batch) or a
  warm-start batch.
- workers: on a local Ray cluster (`runtime.kind: ray`, no address) each rollout worker's own copy
  of the weights and its rollout batch, on this machine (on a GPU run, on their own GPUs).
- processes: each process's measured baseline (the interpreter, torch, the model libraries), a
  local Ray cluster's own processes, and on Ray the rollout's copy in the object store.
- prompts: a prompt file of the user's (`prompts.path`, and the evaluation file) as parsed
  prompts and metadata, in the controller and, for a `.jsonl`'s metadata, in each reward actor on
  Ray (issue 41: a 63 MiB `.jsonl` with wide metadata held 1.0 GB that nothing counted).

Not modelled: a pipeline's VAE decoding and text encoding passes, reward models, exploration and
evaluation batches (each at most a rollout batch), the allocator's fragmentation beyond what the
measured constants hold. The constants below were measured with torch 2.13 (CPU), diffusers 0.42,
transformers 5, Ray 2.60 on a 2-core, 24 GiB machine; each says how.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cloud.bounded_json import loads
from spotlight.config import TRAIN_FILES, ConfigError, RunConfig, dataset_file, model_config
from spotlight.device_constants import device_constants
from spotlight.dit_presets import QWEN_IMAGE_TRANSFORMER, TINY_TRANSFORMER

MIB, GIB = 1 << 20, 1 << 30

OVERRIDE = "SPOTLIGHT_MEMORY_CHECK"
"""Set to `off` to skip the check (the estimate's GPU constants are counted on a CPU, not measured
on a GPU: a run it refuses wrongly must still be possible)."""
_OFF = ("off", "0", "false", "no")
PROMPTS_HINT = "a smaller prompt file, or fewer metadata fields in its lines"
"""What to change when the prompt files are what the machine cannot hold."""


def _turned_off() -> bool:
    """Whether the user turned the check off (`OVERRIDE`)."""
    return os.environ.get(OVERRIDE, "").lower() in _OFF

# ---- measured constants ------------------------------------------------------------------------

PROCESS_BASELINE = 600 * MIB
"""One `spotlight train` process before its model counts (measured: VmHWM of `spotlight train
experiments/tiny_llm.yaml --steps 1 --runtime local`, 463 MB, and of the tiny DiT at micro_batch 16,
474 MB, where the model's own terms are under 10 MB: the interpreter, torch, transformers,
diffusers, tensorboard and the allocator's arenas). The first run after a fresh install peaks
~90 MB higher (the tiny DiT: 595 MiB in a clean clone's CI run against 504-513 warm: Python
compiles every module it imports to bytecode then), so the constant covers that run."""
RAY_PROCESS = 350 * MIB
"""One process of a local Ray cluster that imports torch and the model libraries: the controller,
the learner, each rollout worker (measured: PSS 339 MB each during `spotlight train
experiments/tiny_llm.yaml --steps 1` on Ray; the libraries' pages are shared between them, so PSS,
not RSS, is what each adds)."""
RAY_SYSTEM = 900 * MIB
"""A local Ray cluster's own processes (raylet, GCS, dashboard, the reward worker and the request
queue actors). Measured: the same run's PSS summed over every process, 2,459 MB, less the
controller 270 MB and the learner and 3 workers 339 MB each = 833 MB."""
PROMPT_FILE_HELD = {".jsonl": 12, ".txt": 7}
"""Bytes of host memory per byte of a prompt file, by its kind: the parsed prompts and metadata
(`spotlight.rl.prompt_file.read_prompts`) plus the file's text while it is parsed. Measured
2026-11-29 on this 2-core machine (Python 3.11), 32 MiB files: a jsonl with 40 metadata fields a
line held 8.3x its size after the parse, GenEval-shaped lines (tag, include) 9.6x, a txt 5.1x;
the peak during the parse adds about the text itself."""


@dataclass(frozen=True)
class Activations:
    """Elements per token that one forward and backward holds at its peak, in units of the layer's
    width (a DiT: D = heads x head_dim; an LLM: W = 10h + 4kv + 5I, what one decoder layer
    computes per token), except `checkpoint_layer` of an LLM, in units of h."""

    layer: float
    """Kept for the backward, per layer."""
    extra: float
    """Besides the layers': embeddings, the output layer, the backward's transients."""
    checkpoint_layer: float
    """Kept per layer with `train.gradient_checkpointing`."""
    checkpoint_extra: float
    """The layer recomputed in the backward, with the transients, with gradient checkpointing."""


DIT_ON_CPU = Activations(layer=34, extra=16, checkpoint_layer=12, checkpoint_extra=45)
"""Measured: the VmHWM of one forward and backward of the transformer at 2 and at 6 blocks (the
difference is the blocks'), less its gradients: 31.6 D per block and 13.4 besides at D 32-128;
19.9 and 11.1 at D 1536 (head_dim 128); with checkpointing 10.7 / 36.3 at D 32, 5.9 / 41.7 at
D 1536. glibc's heap holds what a block frees between the tensors a later one keeps, so the
resident memory exceeds the tensors (below)."""
DIT_ON_GPU = Activations(layer=26, extra=30, checkpoint_layer=1, checkpoint_extra=30)
"""The tensors themselves, as a caching allocator reuses the blocks freed (not measured on a GPU:
counted on the CPU with `torch.autograd.graph.saved_tensors_hooks`, D 1536): 25.1 D per block
saved for the backward (1.0 with checkpointing: its input), 3.6 besides; `extra` adds one
block's backward (or recompute) transients."""
LLM_ON_CPU = Activations(layer=1.1, extra=1.0, checkpoint_layer=10, checkpoint_extra=1.5)
"""Measured as `DIT_ON_CPU`, on `token_logprobs` and its backward over Qwen2 shapes with I = h, 4h
and 16h: 0.87-1.07 W per layer and 0.42-0.85 W besides; with checkpointing 6.9-9.7 h per layer and
1.28-1.35 W besides."""
LLM_ON_GPU = Activations(layer=0.8, extra=1.0, checkpoint_layer=1, checkpoint_extra=1.0)
"""The tensors themselves, counted as `DIT_ON_GPU` (h 512, I 2048): 0.78 W per layer saved, 0.08
besides; with checkpointing 0.96 h per layer (its input)."""
DIT_FORWARD = 10
"""D-wide elements per token of a forward without gradients (one block's at a time; measured 5.3,
the MLP's 4D hidden twice bounds it)."""
LLM_LOGIT_COPIES = 4
"""Copies of the kept logits (B, T + 1, V), float32, at the update's peak: the forward makes three
(the logits, divided by the temperature, their log_softmax, kept for the backward), the backward
two gradients beside the kept one, and the KL reference's forward three more beside it."""
LLM_FILE_PROMPT_TOKENS = 256
"""Prompt tokens assumed for a prompt file, chat template included (assumption: GSM8K questions are
~60 words, ~100 tokens with Qwen's template; the file is not tokenized here)."""
LLM_CHAT_PROMPT_TOKENS = 32
"""Prompt tokens of a built-in arithmetic prompt under a pretrained tokenizer's chat template
(assumption: Qwen's template is ~20 tokens around "07+13=")."""
PIPELINE_TEXT_TOKENS = 512
"""A pipeline's prompt length at most (`QwenPromptEncoder.max_tokens`)."""

# The vocabulary is a copy, so that nothing here imports torch: a test checks that it is the
# policy's own (`char_tokenizer.VOCAB`); the DiT shapes are the policies' own (`spotlight.dit_presets`).
TINY_VOCAB = 17
"""The tiny LLM's character vocabulary (`char_tokenizer.VOCAB`)."""
ARITHMETIC_PROMPT_TOKENS = 7
"""`<bos>07+13=` under the character tokenizer."""
MAX_HEADER_BYTES = 16 * MIB
"""Largest safetensors header read (a 60-block Qwen-Image shard's is ~100 KB; the format allows
100 MB): a larger one is not parsed, and the config's shapes count instead."""


Shapes = dict[str, tuple[int, ...]]


# ---- parameter shapes, exact ------------------------------------------------------------------


def dit_shapes(arch: dict) -> Shapes:
    """Every parameter of diffusers' `QwenImageTransformer2DModel(**arch)` with its shape."""
    d = arch["num_attention_heads"] * arch["attention_head_dim"]
    hd, joint = arch["attention_head_dim"], arch["joint_attention_dim"]
    patch_out = arch["patch_size"] ** 2 * arch["out_channels"]
    out: Shapes = {}

    def linear(name: str, n_in: int, n_out: int, bias: bool = True) -> None:
        out[f"{name}.weight"] = (n_out, n_in)
        if bias:
            out[f"{name}.bias"] = (n_out,)

    linear("time_text_embed.timestep_embedder.linear_1", 256, d)
    linear("time_text_embed.timestep_embedder.linear_2", d, d)
    out["txt_norm.weight"] = (joint,)
    linear("img_in", arch["in_channels"], d)
    linear("txt_in", joint, d)
    for i in range(arch["num_layers"]):
        b = f"transformer_blocks.{i}"
        for stream in ("img", "txt"):
            linear(f"{b}.{stream}_mod.1", d, 6 * d)
            linear(f"{b}.{stream}_mlp.net.0.proj", d, 4 * d)
            linear(f"{b}.{stream}_mlp.net.2", 4 * d, d)
        for name in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"):
            linear(f"{b}.attn.{name}", d, d)
        for name in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            out[f"{b}.attn.{name}.weight"] = (hd,)
    linear("norm_out.linear", d, 2 * d)
    linear("proj_out", d, patch_out)
    return out


def llm_shapes(vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int,
               head_dim: int | None = None, qkv_bias: bool = True, qk_norm: bool = False,
               tied: bool = False) -> Shapes:
    """Every parameter of a Qwen2-style causal LM (Qwen2: qkv biases; Qwen3: q/k norms instead;
    Llama: neither) with its shape, as transformers names them (a tied lm_head is not listed)."""
    hd = head_dim or hidden // heads
    out: Shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        b = f"model.layers.{i}"
        for name, rows in (("q_proj", heads * hd), ("k_proj", kv_heads * hd), ("v_proj", kv_heads * hd)):
            out[f"{b}.self_attn.{name}.weight"] = (rows, hidden)
            if qkv_bias:
                out[f"{b}.self_attn.{name}.bias"] = (rows,)
        out[f"{b}.self_attn.o_proj.weight"] = (hidden, heads * hd)
        if qk_norm:
            out[f"{b}.self_attn.q_norm.weight"] = (hd,)
            out[f"{b}.self_attn.k_norm.weight"] = (hd,)
        out[f"{b}.mlp.gate_proj.weight"] = (intermediate, hidden)
        out[f"{b}.mlp.up_proj.weight"] = (intermediate, hidden)
        out[f"{b}.mlp.down_proj.weight"] = (hidden, intermediate)
        out[f"{b}.input_layernorm.weight"] = (hidden,)
        out[f"{b}.post_attention_layernorm.weight"] = (hidden,)
    out["model.norm.weight"] = (hidden,)
    if not tied:
        out["lm_head.weight"] = (vocab, hidden)
    return out


def safetensors_shapes(folder: Path) -> Shapes:
    """The tensors of every *.safetensors file directly in `folder`, from their headers alone (the
    first 8 bytes give the header's length); {} when there are none or one cannot be read."""
    out: Shapes = {}
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with file.open("rb") as f:
                size = int.from_bytes(f.read(8), "little")
                if size > MAX_HEADER_BYTES:
                    return {}
                header = loads(f.read(size), max_bytes=MAX_HEADER_BYTES, what=file.name)
            out.update({k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"})
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return {}
    return out


def numel(shapes: Shapes) -> int:
    total = 0
    for shape in shapes.values():
        n = 1
        for s in shape:
            n *= s
        total += n
    return total


def lora_numel(shapes: Shapes, targets: list[str], rank: int) -> int:
    """Adapter parameters peft injects at `rank`: r x (in + out) for each 2-D weight whose module
    name is a target or ends with "." + a target (peft's rule for a list of names)."""
    total = 0
    for name, shape in shapes.items():
        module = name.removesuffix(".weight")
        if len(shape) == 2 and name.endswith(".weight") and any(
                module == t or module.endswith("." + t) for t in targets):
            total += rank * (shape[0] + shape[1])
    return total


def param_shapes(cfg: RunConfig) -> Shapes:
    """The trained model's parameters (the DiT's transformer, or the LLM) with their shapes:
    from the pretrained folder's safetensors headers when it has them, else from its config.json
    or the in-code config."""
    if cfg.policy.kind == "dit":
        folder = _dit_transformer_folder(cfg)
        return (safetensors_shapes(folder) if folder is not None else {}) or dit_shapes(_dit_arch(cfg))
    folder = cfg.policy.llm.folder
    return (safetensors_shapes(folder) if folder is not None else {}) or llm_shapes(**_llm_arch(cfg))


def _dit_transformer_folder(cfg: RunConfig) -> Path | None:
    folder = cfg.policy.dit.folder
    if folder is None:
        return None
    return folder / "transformer" if (folder / "transformer").is_dir() else folder


def _dit_arch(cfg: RunConfig) -> dict:
    """The transformer's architecture: the folder's config.json over the preset's (diffusers'
    defaults are Qwen-Image's)."""
    dit = cfg.policy.dit
    preset = TINY_TRANSFORMER if dit.preset == "tiny" and not dit.pretrained_path else QWEN_IMAGE_TRANSFORMER
    folder = _dit_transformer_folder(cfg)
    data = model_config(folder / "config.json", "config.json") if folder is not None else {}
    data = data if isinstance(data, dict) else {}
    return {k: data[k] if isinstance(data.get(k), int) else v for k, v in preset.items()}


def _llm_arch(cfg: RunConfig) -> dict:
    """`llm_shapes`' arguments: the in-code tiny config, or the folder's config.json (a nested
    text_config where there is one)."""
    llm = cfg.policy.llm
    if llm.folder is None:
        return dict(vocab=TINY_VOCAB, hidden=llm.hidden_size, layers=llm.num_layers, heads=llm.num_heads,
                    kv_heads=llm.num_kv_heads, intermediate=llm.intermediate_size)
    data = model_config(llm.folder / "config.json", "config.json")
    data = data if isinstance(data, dict) else {}
    data = data.get("text_config") if isinstance(data.get("text_config"), dict) else data

    def get(key: str, default: int) -> int:
        value = data.get(key)
        return value if isinstance(value, int) and value > 0 else default

    heads = get("num_attention_heads", 1)
    qwen3 = data.get("model_type") == "qwen3"
    return dict(vocab=get("vocab_size", 1), hidden=get("hidden_size", heads), layers=get("num_hidden_layers", 0),
                heads=heads, kv_heads=get("num_key_value_heads", heads), intermediate=get("intermediate_size", 0),
                head_dim=data.get("head_dim") if isinstance(data.get("head_dim"), int) else None,
                qkv_bias=bool(data.get("attention_bias", data.get("model_type") == "qwen2")), qk_norm=qwen3,
                tied=bool(data.get("tie_word_embeddings", False)))


# ---- the estimate --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """Bytes a run holds at its peak, by what holds them (the module docstring says what each is)."""

    parameters: int
    optimiser: int
    rollout: int
    activations: int
    workers: int
    processes: int
    on_gpu: bool = False
    """The learner's terms (parameters .. activations) are on its GPU; workers on theirs."""
    prompts: int = 0
    """The user's prompt files as the run holds them (host memory, GPU run or not)."""

    @property
    def host(self) -> int:
        """Bytes of this machine's memory."""
        if self.on_gpu:
            return self.processes + self.prompts
        return (self.parameters + self.optimiser + self.rollout + self.activations + self.workers + self.processes
                + self.prompts)

    @property
    def device(self) -> int:
        """Bytes of the learner's GPU (0 off the GPU)."""
        if not self.on_gpu:
            return 0
        # measured by `make gpu-check` when it ran, else assumed
        return device_constants().device_bytes(self.device_tensors)

    @property
    def device_tensors(self) -> int:
        """Bytes of the learner's tensors on its GPU at the peak (`device` adds the constants)."""
        return self.parameters + self.optimiser + self.rollout + self.activations if self.on_gpu else 0


@dataclass(frozen=True)
class _Footprint:
    """One policy's terms: bytes of every model's weights, trained elements and their bytes each,
    and the working sets of one pass."""

    weights: int
    trained: int
    trained_bytes: int
    rollout: int
    update: int
    sample: int
    warm: int


def _dit(cfg: RunConfig) -> _Footprint:
    dit, train = cfg.policy.dit, cfg.train
    arch = _dit_arch(cfg)
    b = 4 if dit.preset == "tiny" else 2  # `dit_model.model_dtype`
    shapes = param_shapes(cfg)
    weights = numel(shapes)
    vae = 0
    if dit.pipeline and dit.folder is not None:  # the text encoder and VAE load beside the transformer
        weights += numel(safetensors_shapes(dit.folder / "text_encoder"))
        vae = numel(safetensors_shapes(dit.folder / "vae")) * 4  # float32 (`dit_policy.conditioning`)
    d = arch["num_attention_heads"] * arch["attention_head_dim"]
    layers, c = arch["num_layers"], arch["out_channels"]
    image = (dit.latent_side // 2) ** 2  # 2x2 patches
    tokens = image + (PIPELINE_TEXT_TOKENS if dit.pipeline else dit.text_tokens)
    n = train.prompts_per_step * train.group_size
    passes = 2 if cfg.sampler.guidance > 1 else 1  # true CFG: the negative prompt's pass too
    # 64 samples x 9 latents x 64 tokens x 16 channels x 4 B = 2.4 MB for the tiny config at 16 px.
    rollout = n * (cfg.sampler.num_steps + 1) * image * 4 * c * 4 + n * 3 * dit.resolution ** 2 * 4
    act = DIT_ON_GPU if cfg.device.startswith("cuda") else DIT_ON_CPU
    per_token = _per_token(act, train.gradient_checkpointing, layers) * d * b
    rows = min(train.micro_batch, n * len(cfg.sampler.sde_steps))  # (sample, SDE step) pairs per micro-batch
    update = passes * rows * tokens * per_token + 2 * rows * image * 4 * c * 4  # + x and x_next
    # A rollout worker advances a request's group in one batch (`RolloutWorker.compute`).
    sample = passes * train.group_size * tokens * DIT_FORWARD * d * b
    warm = 0
    if cfg.warm_start.steps and dit.preset == "tiny" and not dit.pipeline:
        warm = int(cfg.warm_start.batch_size * tokens * per_token)
    trained, trained_bytes = numel(shapes), b
    if cfg.policy.lora.enabled:
        trained, trained_bytes = lora_numel(shapes, cfg.policy.lora_targets, cfg.policy.lora.rank), 4
    return _Footprint(weights * b + vae + trained * 4 * cfg.policy.lora.enabled, trained, trained_bytes, rollout,
                      int(update), sample, warm)


def _per_token(act: Activations, checkpointing: bool, layers: int, h_per_width: float = 1.0) -> float:
    """`act`'s elements per token, in layer widths, for a model of `layers` layers (an LLM's
    checkpointed layers count in h: `h_per_width` = h / W)."""
    if checkpointing:
        return layers * act.checkpoint_layer * h_per_width + act.checkpoint_extra
    return layers * act.layer + act.extra


def _llm(cfg: RunConfig) -> _Footprint:
    llm, train = cfg.policy.llm, cfg.train
    a = _llm_arch(cfg)
    shapes = param_shapes(cfg)
    h, layers, inter, vocab = a["hidden"], a["layers"], a["intermediate"], a["vocab"]
    kv = a["kv_heads"] * (a.get("head_dim") or h // a["heads"])
    width = 10 * h + 4 * kv + 5 * inter  # W: what one decoder layer computes per token
    if cfg.prompts.path is not None:
        prompt = LLM_FILE_PROMPT_TOKENS
    else:
        prompt = ARITHMETIC_PROMPT_TOKENS if llm.pretrained_path is None else LLM_CHAT_PROMPT_TOKENS
    new = llm.max_new_tokens
    seq = prompt + new
    n = train.prompts_per_step * train.group_size
    rollout = n * seq * 8 * 3  # input_ids, attention_mask (int64), completion mask and log-probs

    act = LLM_ON_GPU if cfg.device.startswith("cuda") else LLM_ON_CPU
    per_token = _per_token(act, train.gradient_checkpointing, layers, h / width) * width * 4

    def backward(batch: int, length: int, kept: int) -> int:
        logits = LLM_LOGIT_COPIES * batch * kept * vocab * 4
        return int(batch * length * per_token) + logits + batch * length ** 2  # + the boolean mask

    update = backward(min(train.micro_batch, n), seq, new + 1)
    batch = min(train.micro_batch, train.group_size)
    # The KV cache of a rollout batch, one layer's forward of its prompts, and each step's logits.
    sample = 2 * layers * batch * seq * kv * 4 + batch * prompt * width * 4 + batch * vocab * 20
    warm = backward(cfg.warm_start.batch_size, prompt + 4, 4) if cfg.warm_start.steps else 0
    trained, trained_bytes = numel(shapes), 4
    if cfg.policy.lora.enabled:
        trained = lora_numel(shapes, cfg.policy.lora_targets, cfg.policy.lora.rank)
    weights = numel(shapes) + trained * cfg.policy.lora.enabled
    return _Footprint(weights * 4, trained, trained_bytes, rollout, update, sample, warm)


def largest_block(shapes: Shapes) -> int:
    """Elements of the largest repeated block (a DiT's transformer block, an LLM's decoder layer):
    what a learner group's rank gathers whole while it computes (`spotlight.rl.sharding`)."""
    sizes: dict[str, int] = {}
    for name, shape in shapes.items():
        parts = name.split(".")
        for i, part in enumerate(parts[:-1]):
            if part in ("transformer_blocks", "layers") and parts[i + 1].isdigit():
                key = ".".join(parts[:i + 2])
                sizes[key] = sizes.get(key, 0) + numel({name: shape})
                break
    return max(sizes.values(), default=0)


def _group(cfg: RunConfig, f: _Footprint, n: int, block: int) -> Estimate:
    """A learner group of `n` processes (`train.learner_gpus`, `spotlight.runtime.learner_group`):
    each rank holds 1/n of the float32 master weights (and of the KL reference's), of their float32
    gradients and of Adam's two moments, plus two blocks gathered whole in the compute dtype (the
    one computed and the next, prefetched), one iteration's rollout (sent to it) and its
    micro-batch's working set; the controller keeps the whole model for the rollout worker and
    `final/`. On a GPU, `device` is rank 0's GPU, which the controller's copy shares on the local
    runtime (on Ray the copy stays in host memory: the workers sample elsewhere); on the CPU every
    process is counted on this machine. `block`: `largest_block` of the model. A group trains
    every parameter (no LoRA), so `f.trained` is the model's size and `f.trained_bytes` its dtype's."""
    reference = f.trained if cfg.grpo.kl_beta > 0 else 0
    shard = -(-(f.trained + reference) * 4 // n) + 2 * block * f.trained_bytes
    optimiser = -(-f.trained * 4 * 3 // n)
    activations = max(f.update, f.sample)
    prompts = prompt_bytes(cfg)
    if cfg.device.startswith("cuda"):
        copy = f.weights if cfg.runtime.kind == "local" else 0
        return Estimate(shard + copy, optimiser, f.rollout, activations, 0, PROCESS_BASELINE * (n + 1), True, prompts)
    return Estimate(n * shard + f.weights, n * optimiser, (n + 1) * f.rollout, n * f.update + f.sample, 0,
                    PROCESS_BASELINE * (n + 1), False, prompts)


def learners_that_fit(cfg: RunConfig, free: int) -> int | None:
    """The fewest learner processes (2..64) whose rank 0 fits `free` bytes of its GPU, for a full
    fine-tune on a GPU (None: none does, or the run trains adapters)."""
    if cfg.policy.lora.enabled or not cfg.device.startswith("cuda"):
        return None
    f, block = _footprint(cfg), largest_block(param_shapes(cfg))
    return next((n for n in range(2, 65) if _group(cfg, f, n, block).device <= free), None)


def _footprint(cfg: RunConfig) -> _Footprint:
    """The policy's footprint (`_dit` or `_llm`), what `estimate` and `learners_that_fit` start from."""
    return _dit(cfg) if cfg.policy.kind == "dit" else _llm(cfg)


def estimate(cfg: RunConfig) -> Estimate:
    """What run `cfg` holds at its peak: the learner's weights, optimiser state and one iteration's
    rollout, plus the largest working set of one pass, plus the processes it starts here (a
    learner group's: `_group`)."""
    f = _footprint(cfg)
    if cfg.train.learner_gpus > 1:
        return _group(cfg, f, cfg.train.learner_gpus, largest_block(param_shapes(cfg)))
    lora = cfg.policy.lora.enabled
    optimiser = f.trained * f.trained_bytes * 3  # the gradient and Adam's two moments
    if cfg.train.ema_decay > 0:
        optimiser += f.trained * 4  # float32 (`ema.ema_init`)
    if cfg.grpo.kl_beta > 0 and not lora:
        optimiser += f.trained * f.trained_bytes  # the frozen reference copy
    activations = max(f.update, f.sample, f.warm)
    on_gpu = cfg.device.startswith("cuda")
    rt = cfg.runtime
    prompts = prompt_bytes(cfg)
    if rt.kind == "local":
        return Estimate(f.weights, optimiser, f.rollout, activations, 0, PROCESS_BASELINE, on_gpu, prompts)
    here = 0 if rt.address else rt.spot_workers + rt.ondemand_workers  # joined: the workers run on its nodes
    workers = 0 if on_gpu else here * (f.weights + f.sample)
    # The controller, the learner and the workers; the rollout's copy in the object store (host memory).
    processes = (2 + here) * RAY_PROCESS + RAY_SYSTEM + f.rollout
    return Estimate(f.weights, optimiser, f.rollout, activations, workers, processes, on_gpu, prompts)


def prompt_bytes(cfg: RunConfig) -> int:
    """Host bytes the run's prompt files take once parsed (`PROMPT_FILE_HELD`): in the controller,
    and a `.jsonl`'s (its metadata) again in each reward actor on Ray. A file that is not there
    counts nothing: reading it refuses the run anyway."""
    path = Path(cfg.prompts.path) if cfg.prompts.path is not None else None
    if path is not None and path.is_dir():
        path = dataset_file(path, TRAIN_FILES)
    held = cfg.evaluation_file()
    total = 0
    for file in (path, Path(held) if held is not None else None):
        if file is None or not file.is_file():
            continue
        copies = 1 + (cfg.reward.workers if cfg.runtime.kind == "ray" and file.suffix == ".jsonl" else 0)
        total += file.stat().st_size * PROMPT_FILE_HELD.get(file.suffix, 0) * copies
    return total


# ---- what this machine has -----------------------------------------------------------------------


def available_host() -> int | None:
    """Bytes this process may still take: /proc/meminfo's MemAvailable, less where a cgroup limit
    (v2 memory.max, v1 memory.limit_in_bytes) leaves less; None where there is no /proc/meminfo."""
    try:
        line = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemAvailable:"))
        free = int(line.split()[1]) * 1024
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    for limit, usage in (("memory.max", "memory.current"),
                         ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes")):
        try:
            cap = int(Path("/sys/fs/cgroup", limit).read_text().strip())  # "max" (no limit) is not an int
            used = int(Path("/sys/fs/cgroup", usage).read_text().strip())
        except (OSError, ValueError):
            continue
        free = min(free, max(cap - used, 0))
    return free


def available_device(device: str) -> int:
    """Free bytes of CUDA device `device` (cuda or cuda:N), as the driver reports them."""
    import torch  # imported already: `check_train_inputs` checked the device with it

    index = int(device.partition(":")[2] or torch.cuda.current_device())
    return torch.cuda.mem_get_info(index)[0]


def _gib(n: int) -> str:
    return f"{n / GIB:,.1f}"


def _hint(cfg: RunConfig, est: Estimate) -> str:
    """What to change, for the term that dominates."""
    terms = {"parameters": est.parameters + est.optimiser, "rollout": est.rollout, "activations": est.activations,
             "workers": est.workers + (0 if cfg.runtime.kind == "local" else est.processes), "prompts": est.prompts}
    top = max(terms, key=terms.__getitem__)
    if top == "prompts":
        return PROMPTS_HINT
    if top == "parameters":
        return "a smaller model, or policy.lora to train adapters only"
    if top == "workers":
        return "fewer runtime.spot_workers and ondemand_workers, or --runtime local"
    shape = "policy.dit.resolution" if cfg.policy.kind == "dit" else "policy.llm.max_new_tokens"
    if top == "rollout":
        return f"lower train.prompts_per_step x group_size or {shape}"
    ckpt = "" if cfg.train.gradient_checkpointing else ", or set train.gradient_checkpointing"
    return f"lower train.micro_batch or {shape}{ckpt}"


def refusal(cfg: RunConfig, est: Estimate, where: str, need: int, free: int, machine: str) -> str:
    """The one line that refuses a run needing `need` bytes where `machine` has `free`."""
    terms = (("params", est.parameters), ("optimiser", est.optimiser), ("rollout", est.rollout),
             ("activations", est.activations), ("workers", 0 if est.on_gpu else est.workers),
             ("processes", est.processes), ("prompts", est.prompts))
    if machine != "this machine":
        terms = terms[:4]
    shown = ", ".join(f"{name} {_gib(n)}" for name, n in terms if n >= GIB // 20)
    return (f"{where}the run needs about {_gib(need)} GiB ({shown}), {machine} has {_gib(free)} GiB available "
            f"({_hint(cfg, est)}; {OVERRIDE}=off runs it anyway)")


def check_prompt_memory(cfg: RunConfig, where: str = "", host_free: int | None = None) -> None:
    """ConfigError when the run's prompt files alone would take more than this machine has available
    (`prompt_bytes`): asked before they are parsed, which is where that memory would go."""
    need = prompt_bytes(cfg)
    free = available_host() if host_free is None else host_free
    if need and free is not None and need > free and not _turned_off():
        raise ConfigError(f"{where}prompts.path: the prompt files take about {_gib(need)} GiB once parsed, this "
                          f"machine has {_gib(free)} GiB available ({PROMPTS_HINT}; {OVERRIDE}=off runs it anyway)")


def check_memory(cfg: RunConfig, where: str = "", host_free: int | None = None,
                 device_free: int | None = None) -> Estimate:
    """ConfigError (one line with the estimate) when run `cfg` needs more memory than this machine
    has available, or, on a CUDA device, more than its GPU has free; else the estimate. `host_free`
    and `device_free` stand in for what the machine reports (tests). Without /proc/meminfo there
    is nothing to compare against, and the host is not checked."""
    est = estimate(cfg)
    if _turned_off():
        return est  # the estimate is a model: a user who knows better runs anyway
    free = available_host() if host_free is None else host_free
    if free is not None and est.host > free:
        raise ConfigError(refusal(cfg, est, where, est.host, free, "this machine"))
    if est.on_gpu:
        free = available_device(cfg.device) if device_free is None else device_free
        if est.device > free:
            line = refusal(cfg, est, where, est.device, free, cfg.device)
            n = learners_that_fit(cfg, free)
            node = f" of one node: cloud.gpus_per_node {n} or more" if n and n > cfg.cloud.gpus_per_node else ""
            more = f"; train.learner_gpus: {n} would fit (the model sharded over {n} GPUs{node})" if n and \
                n > cfg.train.learner_gpus else ""
            raise ConfigError(f"{line}{more}; {device_constants().describe()}")
    return est
