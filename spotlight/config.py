"""Run configuration: one dataclass per component, nested under `RunConfig`.

A YAML file in `experiments/` is a `RunConfig` written down. Loading rejects unknown keys and
values of the wrong type or range with a single `ConfigError` line that names the file and the
dotted field (`experiments/x.yaml: train.lr: expected a number > 0, got -1`). The defaults of
`RunConfig()` are the embedded default run: the tiny DiT on CPU.

Every numeric field has a documented range, checked in its section's `__post_init__`; every float
is finite (`.inf` and `.nan` are refused for every float field by `_coerce`). Maxima bound what one
setting can make a run allocate or loop over; they are generous (far beyond any real run) and each
error names the field and the range. The file itself is read by `schedulers.input_file`: at most
`MAX_CONFIG_BYTES`, UTF-8, no YAML anchors or aliases, no duplicate keys, at most 64 levels deep,
and not empty. Values quoted in errors are cut to ~200 characters.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from cloud.bounded_json import JsonRefused, load_file
from cloud.config import CloudConfig
from cloud.model_cache import cached_folder, is_remote, local_folder, source_problem
from schedulers.update_placement import PLACES, SP_ROLLOUT_ONLY
from schedulers.input_file import (SEED_MAX, ConfigError, InputError, InputFileError, at_most, check, load_yaml,
                                   parse_yaml, short)
from spotlight.reward_names import BUILTIN_REWARDS, check_name, component_field  # noqa: F401 — BUILTIN_REWARDS re-exported

MAX_CONFIG_BYTES = 1 << 20
"""Largest config file read (1 MiB; the shipped ones are under 1 KB)."""
_DEVICE = re.compile(r"cpu|cuda(:\d{1,3})?|mps")


def model_config(file: Path, where: str) -> dict[str, Any] | str:
    """The JSON object in a model folder's config `file`, or what is wrong with it in a few words
    (`where` names the file): bounded by `MAX_CONFIG_BYTES`, read without importing anything."""
    if not file.is_file():
        return f"{where} is missing"
    try:
        data = load_file(file, max_bytes=MAX_CONFIG_BYTES, what=where)
    except JsonRefused as err:  # over MAX_CONFIG_BYTES, nested too deeply, not JSON
        return f"{where} is not readable JSON ({err.reason})"
    except OSError as err:
        return f"{where} is not readable JSON ({type(err).__name__})"
    return data if isinstance(data, dict) else f"{where} is not a JSON object"


@dataclass
class DiTConfig:
    """The diffusion transformer (diffusers `QwenImageTransformer2DModel`), and where its text
    conditioning, decoding and sigma schedule come from."""

    preset: Literal["tiny", "qwen-image"] = "tiny"
    """`tiny`: a random 2-layer config that trains on CPU, computed in float32; `qwen-image`: the
    released 20B config, computed in bfloat16. With `pretrained_path` the architecture is the
    folder's, and the preset still picks the dtype (of the transformer, text encoder and VAE alike)."""
    pretrained_path: str | None = None
    """A diffusers Qwen-Image checkpoint folder: local, or `s3://BUCKET/PREFIX` / `gs://BUCKET/PREFIX`
    / a Hugging Face repo id (`org/name`), which each node fetches once into its model cache
    (`cloud.model_cache`; the checks below then read that copy, keys keep this string). Either a pipeline
    folder (what `QwenImagePipeline.save_pretrained` writes: model_index.json, transformer/,
    text_encoder/, tokenizer/, vae/, scheduler/): prompts then go through its text encoder, samples
    are decoded by its VAE and follow its scheduler's sigmas, whatever `preset` says, and there is
    no synthetic warm start (`warm_start.steps` must be 0). Or a transformer alone (its own folder,
    or one holding only transformer/): the stand-in text encoder, and the preset's decoding (tiny:
    the latent is the image; qwen-image needs a vae/). `spotlight train` checks the folder before
    anything starts (`spotlight.rl.dit_model.check_pipeline_folder`)."""
    resolution: int = 16
    """Image side in pixels, 1..4096, a multiple of 2 x `vae_scale`: the latent side (resolution /
    `vae_scale`) must divide by the patch size 2."""
    text_tokens: int = 8
    """Prompt length in tokens for the deterministic stand-in text encoder, 1..4096 (a pipeline's
    text encoder gives every prompt its own length)."""

    def __post_init__(self) -> None:
        _check_source(self.pretrained_path)
        check(self.resolution > 0, "resolution", "a positive integer", self.resolution)
        at_most(self, ("resolution",), 4096, " pixels")
        scale = self.vae_scale
        check(self.resolution % (2 * scale) == 0, "resolution",
               f"a size whose latent side (resolution / {scale}) divides by the patch size 2: "
               f"a multiple of {2 * scale}",
               self.resolution)
        check(self.text_tokens > 0, "text_tokens", "a positive integer", self.text_tokens)
        at_most(self, ("text_tokens",), 4096)

    @property
    def pipeline(self) -> bool:
        """Whether `pretrained_path` is a diffusers pipeline folder: it holds model_index.json,
        text_encoder/, tokenizer/ or vae/ (`check_pipeline_folder` then wants them all). Read from
        the disk of the machine that asks, every time."""
        path = self.folder
        return path is not None and ((path / "model_index.json").is_file() or any(
            (path / sub).is_dir() for sub in ("text_encoder", "tokenizer", "vae")))

    @property
    def vae_scale(self) -> int:
        """Image pixels per latent pixel. A `pretrained_path` with vae/: its VAE's downsampling,
        2 ** len(temperal_downsample) as `QwenImagePipeline` computes it (8 for Qwen-Image's), whatever
        the preset; otherwise the preset's (tiny: 1, the latent is the image; qwen-image: 8).

        Read from the disk of the machine that asks, every time (no cache to go stale): so config
        validation does not fail for a folder that is not there (yet) — a missing folder or an
        unreadable vae/config.json gives the preset's, and `check_pipeline_folder` (run by
        `spotlight train` and by `DiTPolicy.from_config`) then names what is wrong. A config sent
        to another node (an SP member's spec, a worker) is validated again there, against its copy."""
        file = self.folder / "vae" / "config.json" if self.folder is not None else None
        if file is not None and file.is_file():
            vae = model_config(file, "vae/config.json")
            downsample = vae.get("temperal_downsample") if isinstance(vae, dict) else None
            if isinstance(downsample, list) and len(downsample) <= 8:
                return 2 ** len(downsample)
        return 1 if self.preset == "tiny" else 8

    @property
    def latent_side(self) -> int:
        return self.resolution // self.vae_scale

    @property
    def folder(self) -> Path | None:
        """Where `pretrained_path` is read on this machine (`cloud.model_cache.local_folder`): the
        folder itself, or a remote source's cache folder, which holds it once fetched; None
        without one. Nothing is fetched."""
        return local_folder(self.pretrained_path) if self.pretrained_path else None

    def folder_problem(self) -> str | None:
        """What makes `pretrained_path` unusable as the DiT's folder, in a few words; None when
        nothing is found wrong. Only file names and JSON configs are read (no import, no weights),
        so `spotlight train` refuses a bad folder before anything starts
        (`spotlight.rl.dit_model.check_pipeline_folder`); loading can still fail, and says so.

        A pipeline folder (`pipeline`) must hold every component `QwenImagePipeline` loads, of
        Qwen-Image's classes, whose shapes fit together: the transformer's joint_attention_dim is
        the text encoder's hidden size, its out_channels the VAE's z_dim and in_channels 4 x z_dim
        (latents packed in 2x2 patches). A transformer alone must be one, and the qwen-image preset
        needs a vae/ to decode."""
        unfetched = _unfetched(self.pretrained_path)
        if unfetched is not None:
            return unfetched
        path = self.folder or Path("")
        shown = short(str(self.pretrained_path or ""))
        if not path.is_dir():
            return (f"{shown} is not an existing folder (expected a local folder, s3://BUCKET/PREFIX, "
                    "gs://BUCKET/PREFIX or a Hugging Face repo id)")

        def config(file: Path) -> dict[str, Any] | str:
            return model_config(file, f"{shown}: {file.relative_to(path)}")

        def of_class(data: dict[str, Any], file: str, name: str) -> str | None:
            got = data.get("_class_name")
            return None if got in (None, name) else f"{shown}: {file} names {short(got)} (expected {name})"

        if not self.pipeline:
            sub = "transformer/" if (path / "transformer").is_dir() else ""
            transformer = config(path / sub / "config.json")
            if isinstance(transformer, str):
                return f"{transformer} (expected a diffusers pipeline folder or a QwenImageTransformer2DModel folder)"
            if self.preset != "tiny":
                return (f"{shown} has no vae/ to decode the qwen-image preset's latents (expected a diffusers "
                        "QwenImagePipeline folder)")
            return of_class(transformer, f"{sub}config.json", "QwenImageTransformer2DModel")
        parts = ("transformer", "text_encoder", "tokenizer", "vae", "scheduler")
        missing = [f"{p}/" for p in parts if not (path / p).is_dir()]
        missing += [] if (path / "model_index.json").is_file() else ["model_index.json"]
        if missing:
            return (f"{shown} is a diffusers pipeline folder without {', '.join(missing)} (expected what "
                    f"QwenImagePipeline.save_pretrained writes: model_index.json, {', '.join(p + '/' for p in parts)})")
        transformer, text, vae = (config(path / p / "config.json") for p in ("transformer", "text_encoder", "vae"))
        if isinstance(transformer, str) or isinstance(text, str) or isinstance(vae, str):
            return next(c for c in (transformer, text, vae) if isinstance(c, str))
        wrong = (of_class(transformer, "transformer/config.json", "QwenImageTransformer2DModel")
                 or of_class(vae, "vae/config.json", "AutoencoderKLQwenImage"))
        if wrong is not None:
            return wrong
        archs = text.get("architectures") or []
        if "Qwen2_5_VLForConditionalGeneration" not in archs:
            return (f"{shown}: text_encoder/config.json names {short(archs)} (expected "
                    "Qwen2_5_VLForConditionalGeneration, Qwen-Image's text encoder)")
        text_config = text.get("text_config")  # transformers 5 nests it; older configs are flat
        hidden = (text_config if isinstance(text_config, dict) else {}).get("hidden_size", text.get("hidden_size"))
        joint, z = transformer.get("joint_attention_dim"), vae.get("z_dim")
        if joint != hidden:
            return (f"{shown}: the transformer's joint_attention_dim ({short(joint)}) is not the text encoder's "
                    f"hidden size ({short(hidden)}): they are not parts of one pipeline")
        channels = (transformer.get("in_channels"), transformer.get("out_channels"))
        if not isinstance(z, int) or channels != (4 * z, z):
            return (f"{shown}: the transformer's in/out channels ({short(channels[0])}/{short(channels[1])}) do not "
                    f"fit the VAE's z_dim ({short(z)}: expected 4 x z_dim in, z_dim out)")
        downsample = vae.get("temperal_downsample")
        if not isinstance(downsample, list) or len(downsample) > 8:
            return (f"{shown}: vae/config.json's temperal_downsample is {short(downsample)} (expected a list of "
                    "0..8 flags)")
        return None


@dataclass
class LLMConfig:
    """The causal language model: the tiny Qwen2 built from the seed, or a transformers folder."""

    pretrained_path: str | None = None
    """A folder with a transformers causal LM and its tokenizer, as `save_pretrained` writes them
    (config.json, weights, tokenizer files): local, or `s3://BUCKET/PREFIX` / `gs://BUCKET/PREFIX`
    / a Hugging Face repo id, fetched once per node as `DiTConfig.pretrained_path` is; null means
    the tiny config. Prompts go through the tokenizer's chat template when it has one; the tiny
    sizes below are then unused."""
    hidden_size: int = 64
    """Tiny config sizes: hidden_size 1..65,536, num_layers 1..1,024, num_heads and num_kv_heads
    1..1,024, intermediate_size 1..262,144 (beyond the largest released LLMs)."""
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    max_new_tokens: int = 4
    """Completion length limit in tokens, 1..32,768 (answers of the arithmetic task have at most 3 digits)."""
    temperature: float = 1.0
    """Sampling temperature, in (0, 100]."""

    def __post_init__(self) -> None:
        _check_source(self.pretrained_path)
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "max_new_tokens"):
            check(getattr(self, name) > 0, name, "a positive integer", getattr(self, name))
        at_most(self, ("hidden_size",), 65536)
        at_most(self, ("num_layers", "num_heads", "num_kv_heads"), 1024)
        at_most(self, ("intermediate_size",), 262144)
        at_most(self, ("max_new_tokens",), 32768, " tokens")
        at_most(self, ("temperature",), 100)
        check(self.hidden_size % self.num_heads == 0, "hidden_size",
               f"a multiple of num_heads ({self.num_heads})", self.hidden_size)
        check(self.num_heads % self.num_kv_heads == 0, "num_kv_heads",
               f"a divisor of num_heads ({self.num_heads})", self.num_kv_heads)
        check(self.temperature > 0, "temperature", "a number > 0", self.temperature)

    def folder_problem(self) -> str | None:
        """What makes `pretrained_path` (an existing folder) unusable as a transformers causal LM
        with its tokenizer, in a few words; None when nothing is found wrong. Only its file names
        and config.json are read (no import, no weights), so `spotlight train` refuses a bad folder
        before anything starts; loading can still fail, and `LLMPolicy.from_config` says so."""
        unfetched = _unfetched(self.pretrained_path)
        if unfetched is not None:
            return unfetched
        path = self.folder or Path("")
        shown = short(str(self.pretrained_path or ""))
        config = path / "config.json"
        if not config.is_file():
            return f"{shown} has no config.json (expected a transformers causal LM folder, as save_pretrained writes)"
        data = model_config(config, f"{shown}: config.json")
        if isinstance(data, str):
            return data
        arch = data.get("architectures")
        # The class names transformers gives causal LMs (Qwen2ForCausalLM, GPT2LMHeadModel).
        if isinstance(arch, list) and arch and not any(
                isinstance(a, str) and a.endswith(("ForCausalLM", "LMHeadModel")) for a in arch):
            return f"{shown} is not a causal LM: config.json names {short(arch)} (expected a *ForCausalLM)"
        if not arch and not data.get("model_type"):
            return f"{shown}: config.json names no architectures and no model_type (expected a transformers config)"
        names = {p.name for p in path.iterdir()}
        if not names & {"tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tiktoken.model"}:
            return (f"{shown} has no tokenizer files (expected tokenizer.json, or tokenizer.model / vocab.json, "
                    "as tokenizer.save_pretrained writes them)")
        if not any(n.endswith((".safetensors", ".bin", ".safetensors.index.json", ".bin.index.json")) for n in names):
            return f"{shown} has no weights (expected model.safetensors or its shards)"
        return None

    @property
    def folder(self) -> Path | None:
        """Where `pretrained_path` is read on this machine (as `DiTConfig.folder`)."""
        return local_folder(self.pretrained_path) if self.pretrained_path else None


def _check_source(source: str | None) -> None:
    """A `pretrained_path` that names no model source is one ConfigError line naming the field."""
    problem = source_problem(source) if source is not None else None
    if problem is not None:
        raise ConfigError(f"pretrained_path: {problem}")


def _unfetched(source: str | None) -> str | None:
    """What to say of a remote `pretrained_path` not (yet) in this machine's model cache, else None."""
    if source and is_remote(source) and cached_folder(source) is None:
        return (f"{short(source)} is not in this machine's model cache yet (`spotlight train` and "
                "`python -m cloud.model_cache RUN_YAML` fetch it)")
    return None


DIT_LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
                    "img_mlp.net.0.proj", "img_mlp.net.2", "txt_mlp.net.0.proj", "txt_mlp.net.2")
"""The DiT's default LoRA targets: every attention and MLP linear of each Qwen-Image block, as the
community's Flow-GRPO recipes for Qwen-Image train them (not the modulation or embedding layers)."""
LLM_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The LLM's default LoRA targets: every attention and MLP projection of a Qwen2 layer."""


@dataclass
class LoRAConfig:
    """LoRA adapters (peft) instead of full-parameter training: only the adapters are trained,
    published to workers and checkpointed; the base stays frozen (`spotlight.rl.lora`)."""

    rank: int = 0
    """Adapter rank r, 0..4,096; 0 trains every parameter (no LoRA)."""
    alpha: float | None = None
    """peft's lora_alpha (adapters scale by alpha / rank), in (0, 65,536]; null: alpha = rank."""
    target_modules: list[str] | None = None
    """Names (suffixes) of the linear layers that get adapters; null: the policy's defaults
    (`DIT_LORA_TARGETS` / `LLM_LORA_TARGETS`)."""

    def __post_init__(self) -> None:
        check(0 <= self.rank <= 4096, "rank", "an integer in 0..4096 (0: no LoRA)", self.rank)
        check(self.alpha is None or 0 < self.alpha <= 65536, "alpha", "a number in (0, 65536] or null", self.alpha)
        check(self.target_modules is None or (0 < len(self.target_modules) <= 256 and all(
            isinstance(m, str) and 0 < len(m) <= 200 for m in self.target_modules)), "target_modules",
            "null or a list of 1..256 module names", self.target_modules)

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def lora_alpha(self) -> float:
        """peft's lora_alpha: `alpha`, or the rank when it is null."""
        return self.alpha or self.rank


@dataclass
class PolicyConfig:
    """Which policy is trained; only the sub-config of that kind is used."""

    kind: Literal["dit", "llm"] = "dit"
    dit: DiTConfig = field(default_factory=DiTConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    pretrained_path: str | None = None
    """The model folder of the policy of this kind: `policy.pretrained_path: FOLDER` is
    `policy.dit.pretrained_path` (a diffusers pipeline or transformer folder) or
    `policy.llm.pretrained_path` (a transformers causal LM), whichever `kind` is; give either
    (both only with the same value). Once loaded it holds that folder, or null."""

    def __post_init__(self) -> None:
        own = self.kind
        sub = getattr(self, own)
        if self.pretrained_path is not None and sub.pretrained_path is None:
            try:  # validated again with its folder (a pipeline folder's VAE sets the latent side)
                setattr(self, own, dataclasses.replace(sub, pretrained_path=self.pretrained_path))
            except InputError as err:
                raise ConfigError(f"{own}.{err}") from None
        check(self.pretrained_path in (None, getattr(self, own).pretrained_path), "pretrained_path",
              f"the folder of {own}.pretrained_path ({getattr(self, own).pretrained_path!r}), or null: they are one "
              "setting", self.pretrained_path)
        self.pretrained_path = getattr(self, own).pretrained_path

    @property
    def lora_targets(self) -> list[str]:
        """The modules that get adapters: `lora.target_modules`, or this kind's defaults."""
        default = DIT_LORA_TARGETS if self.kind == "dit" else LLM_LORA_TARGETS
        return list(self.lora.target_modules or default)


@dataclass
class SamplerConfig:
    """The Flow-GRPO SDE sampler (DiT only)."""

    num_steps: int = 8
    """Denoising steps per sample, 1..1,000."""
    noise_level: float = 0.7
    """`a` in the SDE's std `sqrt(sigma / (1 - sigma)) * a`, in (0, 10]."""
    sde_window: tuple[int, int] | None = None
    """[first, last) steps that are stochastic (and trained on); the rest are ODE steps. None: all."""
    guidance: float = 1.0
    """True classifier-free guidance (Qwen-Image's `true_cfg_scale`; its pipeline's default is 4):
    every velocity — rollout, exploration and the update's recomputed log-probs alike — is the
    prompt's and the negative prompt's passes combined by `spotlight.rl.dit_model.true_cfg`. 1: off
    (one pass); in [1, 100]."""
    negative_prompt: str = " "
    """The negative prompt's text with guidance > 1 (Qwen-Image's pipeline uses " "); at most 1,000
    characters."""

    def __post_init__(self) -> None:
        check(self.num_steps > 0, "num_steps", "a positive integer", self.num_steps)
        at_most(self, ("num_steps",), 1000, " steps")
        check(self.noise_level > 0, "noise_level", "a number > 0", self.noise_level)
        at_most(self, ("noise_level",), 10)
        check(self.guidance >= 1, "guidance", "a number >= 1 (1: no guidance)", self.guidance)
        at_most(self, ("guidance",), 100)
        check(isinstance(self.negative_prompt, str) and len(self.negative_prompt) <= 1000, "negative_prompt",
              "a text of at most 1,000 characters", str(self.negative_prompt)[:40])
        if self.sde_window is not None:
            lo, hi = self.sde_window
            check(0 <= lo < hi <= self.num_steps, "sde_window",
                   f"[first, last) with 0 <= first < last <= num_steps ({self.num_steps})", list(self.sde_window))

    @property
    def sde_steps(self) -> range:
        lo, hi = self.sde_window if self.sde_window is not None else (0, self.num_steps)
        return range(lo, hi)


DIT_REWARDS = ("colour", "jpeg_compressibility", "jpeg_incompressibility", "clip_score", "ocr")
"""Built-in rewards that score images (a DiT policy's)."""
LLM_REWARDS = ("arithmetic", "answer_match")
"""Built-in rewards that score completions (an LLM policy's)."""
_FUNCTION = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*|[^\x00-\x1f:][^\x00-\x1f]*\.py:[A-Za-z_]\w*")
"""A user reward: `package.module:name` or `path/to/file.py:name`."""


@dataclass
class RewardComponent:
    """One term of the reward: a built-in or registered reward (`name`) or a callable of the
    user's (`function`), scaled by `weight`. Exactly one of `name` and `function` is set."""

    name: str | None = None
    """A built-in reward (`DIT_REWARDS`, `LLM_REWARDS`) or one registered under the
    `spotlight.rewards` entry-point group; checked at load."""
    function: str | None = None
    """A Python callable of the user's: "package.module:name" or "path/to/file.py:name" (a path
    relative to the working directory). It is called as `f(outputs, prompts, metadata)` with the
    batch's decoded outputs (DiT: a list of PIL images; LLM: a list of completion strings), the
    prompt strings and each prompt's metadata dict, and returns one finite float per sample."""
    weight: float = 1.0
    """Its weight in the sum, a finite number in [-1e6, 1e6] (negative: a penalty)."""
    model_path: str | None = None
    """Local weights of a model-based reward (clip_score); null: `reward.model_path`."""

    def __post_init__(self) -> None:
        check((self.name is None) != (self.function is None), "name",
              "exactly one of name (a built-in reward) and function (module:callable or file.py:callable)",
              self.name if self.name is not None else self.function)
        if self.name is not None:
            check_name(self.name, "name")
        if self.function is not None:
            check(len(self.function) <= 1000 and _FUNCTION.fullmatch(self.function) is not None, "function",
                  "package.module:callable or path/to/file.py:callable", self.function)
        check(abs(self.weight) <= 1e6, "weight", "a number in [-1e6, 1e6]", self.weight)

    @property
    def label(self) -> str:
        """What metrics call this component: the reward's name, or the callable's."""
        return self.name if self.name is not None else self.function.rsplit(":", 1)[1]


@dataclass
class RewardConfig:
    """The reward: one built-in reward by `name`, or several `components` summed by weight; see
    `spotlight.rl.rewards` for the names."""

    name: str = "colour"
    """The one-component shorthand, used when `components` is empty: a name of `DIT_REWARDS` or
    `LLM_REWARDS`, or one registered under the `spotlight.rewards` entry-point group; checked at load."""
    components: list[RewardComponent] = field(default_factory=list)
    """Rewards combined by weight, `[{name: ocr, weight: 1.0}, {function: "my_reward.py:score",
    weight: 0.5}]`, at most 32; each one's mean and std are in the metrics. Empty: `name` alone."""
    model_path: str | None = None
    """Local weights for model-based rewards (clip_score: a CLIP/PickScore folder); `spotlight train`
    checks that it is an existing folder before it builds anything."""
    colour_width: float = 0.5
    """Colour reward: `exp(-|rgb - target|^2 / colour_width)` per pixel; in (0, 1e6]."""
    workers: int = 1
    """Reward actors on Ray, 1..1,024: an iteration's batch is split between them (stateless)."""
    num_gpus: float = 0.0
    """GPUs each reward actor holds on Ray, 0..8 (fractions share one): model-based rewards (OCR,
    CLIP) then run on it. 0: CPU."""
    timeout_s: float = 600.0
    """Longest one component may take to score one batch, in (0, 86,400] s: a reward that hangs
    longer is stopped, tried once more, then stops the run naming the component."""

    def __post_init__(self) -> None:
        if not self.components:
            check_name(self.name, "name")
        check(self.colour_width > 0, "colour_width", "a number > 0", self.colour_width)
        at_most(self, ("colour_width",), 1e6)
        check(len(self.components) <= 32, "components", "at most 32 components", len(self.components))
        labels = [c.label for c in self.components]
        for i, label in enumerate(labels):
            check(labels.count(label) == 1, f"components[{i}]", "a reward used once (each component "
                  "is a metric of its own)", label)
        check(1 <= self.workers <= 1024, "workers", "an integer in 1..1024", self.workers)
        check(0 <= self.num_gpus <= 8, "num_gpus", "a number in [0, 8]", self.num_gpus)
        check(self.timeout_s > 0, "timeout_s", "a number > 0", self.timeout_s)
        at_most(self, ("timeout_s",), 86400, " s")

    @property
    def terms(self) -> list[RewardComponent]:
        """The reward's components: `components`, or `name` with weight 1."""
        return list(self.components) or [RewardComponent(name=self.name)]


@dataclass
class GRPOConfig:
    """Group-relative policy optimisation: advantages and the clipped loss."""

    clip_low: float = 1e-3
    """The ratio is clipped to [1 - clip_low, 1 + clip_high]; clip_low in (0, 1), clip_high in (0, 100]."""
    clip_high: float = 1e-3
    adv_clip: float = 5.0
    """Advantages are clipped to [-adv_clip, adv_clip]; in (0, 1e6]."""
    adv_eps: float = 1e-4
    """`A = (r - mean_g) / (std_g + adv_eps)`; in (0, 1]."""
    kl_beta: float = 0.0
    """Weight of the KL penalty to the reference (warm-started) policy, in [0, 1e6]; 0 disables it."""
    drop_zero_advantage_groups: bool = False
    """Leave groups whose advantages are all zero (every sample rewarded the same) out of the
    update, as flow_grpo does: they add no policy gradient, but kept they count in the loss's mean
    and shrink the step by their share (common with exact-match LLM rewards). Off by default so
    existing configs keep their results; when every group is all zero, all are kept."""
    kl_estimator: Literal["exact", "flow_grpo"] = "exact"
    """The DiT's KL per SDE step: "exact", the closed-form KL of the step's two Gaussians; or
    "flow_grpo", flow_grpo's value, which is |dt| times it (5-50x smaller on the tiny config's 8 steps),
    so that a `kl_beta` taken from flow_grpo's configs means what it meant there. An LLM's KL is
    the k3 estimator per token either way, and takes "exact" only. docs/training.md."""

    def __post_init__(self) -> None:
        for name in ("clip_low", "clip_high", "adv_clip", "adv_eps"):
            check(getattr(self, name) > 0, name, "a number > 0", getattr(self, name))
        check(self.clip_low < 1, "clip_low", "a number in (0, 1)", self.clip_low)
        check(self.kl_beta >= 0, "kl_beta", "a number >= 0", self.kl_beta)
        at_most(self, ("clip_high",), 100)
        at_most(self, ("adv_clip", "kl_beta"), 1e6)
        at_most(self, ("adv_eps",), 1)


PARTS_PER_REQUEST = 8
"""`train.parts_per_request`'s default (`TrainConfig.parts_per_request`)."""


@dataclass
class TrainConfig:
    """The iteration loop and the optimiser."""

    steps: int = 30
    """GRPO iterations, 1..1,000,000."""
    prompts_per_step: int = 8
    """Prompts per iteration, 1..65,536."""
    group_size: int = 8
    """G: samples per prompt, 2..4,096. An iteration's samples (prompts_per_step x group_size) are at
    most 1,048,576: the rollout of one iteration is held in memory."""
    lr: float = 1e-4
    """Learning rate, in (0, 1]."""
    updates_per_step: int = 2
    """Optimiser steps per iteration, each over the whole rollout; 1..1,000."""
    grad_clip: float = 1.0
    """Gradient norm clip, in (0, 1e6]."""
    checkpoint_every: int = 10
    """Iterations between checkpoints (the last iteration is always checkpointed); 1..1,000,000."""
    micro_batch: int = 64
    """Samples per forward pass in rollout and update, 1..65,536: bounds memory; the results differ only
    by float rounding, so it may change when a run resumes (`spotlight.checkpoints.resume_identity.NEUTRAL`)."""
    eval_prompts: int = 0
    """Prompts of a fixed evaluation set scored at the start of every iteration (0: no evaluation), 0..65,536.
    `eval_reward` is the policy's mean reward on fixed prompts and seeds, unbiased by how an
    iteration chose its own seeds (exploration picks contrasting ones: their mean is not the policy's)."""
    eval_seeds: int = 8
    """Seeds per evaluation prompt, 1..4,096."""
    eval_every: int = 1
    """Iterations between evaluations, 1..1,000,000 (when evaluation is on: `eval_prompts` > 0 or
    `prompts.eval_path`); the last iteration is always evaluated. Each writes the per-component
    eval rewards to the metrics and, for a DiT, a grid of the samples under `eval/` and in
    TensorBoard (an LLM's completions: a JSONL file there)."""
    ema_decay: float = 0.0
    """An exponential moving average of the trained parameters (the adapters with LoRA), updated
    after every optimiser step with this decay, in [0, 1); 0: off. When on, evaluation samples with
    it and `final/` holds it; checkpointed and resumed exactly."""
    gradient_checkpointing: bool = False
    """Recompute activations in the update's backward pass instead of keeping them (diffusers' and
    transformers' own gradient checkpointing): less memory, ~30% more update time, the same result."""
    update_on: str = "learner"
    """Who computes the update's gradient: "learner" (the learner alone), "fleet" (every
    rollout worker, spot and on-demand, pulls its micro-batches from the queue as `TRAIN`
    requests, gradient work before exploration; the learner sums them in micro-batch order and
    steps — the same weights as "learner", bit for bit), or "auto" (each update where the run's
    own updates measured faster: `schedulers/update_placement.py`). docs/training.md."""
    parts_per_request: int = PARTS_PER_REQUEST
    """k: consecutive micro-batches summed into one gradient before it travels, 1..4,096; fixed by
    the config, never by who is live. An update round of P micro-batches is ceil(P / k) chunks,
    chunk c covering micro-batches [c*k, min((c+1)*k, P)): on the fleet one `TRAIN` request each,
    served by a node (a crew of up to k of its idle workers computes its micro-batches, its lead
    folds them in index order and sends one gradient: k times fewer, as large, transfers to the
    learner), and the learner folds the chunk sums in chunk order. The learner alone sums in the
    same tree, so `update_on` still changes no bit; k changes only float rounding (none at all
    where P <= k: one chunk is the plain fold), like `micro_batch`, so it may change when a run
    resumes (`spotlight.checkpoints.resume_identity.NEUTRAL`). Default 8: the GPUs of an 8-GPU node
    (p4d/p5, a2/a3), so a node of the usual size computes a request in one micro-batch's time.
    docs/training.md."""

    def __post_init__(self) -> None:
        check(self.update_on in PLACES, "update_on", f"{', '.join(PLACES[:-1])} or {PLACES[-1]}", self.update_on)
        for name in ("steps", "prompts_per_step", "updates_per_step", "checkpoint_every", "micro_batch",
                     "parts_per_request"):
            check(getattr(self, name) > 0, name, "a positive integer", getattr(self, name))
        check(self.group_size >= 2, "group_size", "an integer >= 2 (GRPO needs a group)", self.group_size)
        check(self.lr > 0, "lr", "a number > 0", self.lr)
        check(self.eval_prompts >= 0, "eval_prompts", "an integer >= 0", self.eval_prompts)
        check(self.eval_seeds > 0, "eval_seeds", "a positive integer", self.eval_seeds)
        check(self.eval_every > 0, "eval_every", "a positive integer", self.eval_every)
        check(0 <= self.ema_decay < 1, "ema_decay", "a number in [0, 1) (0: no EMA)", self.ema_decay)
        check(self.grad_clip > 0, "grad_clip", "a number > 0", self.grad_clip)
        at_most(self, ("steps", "checkpoint_every", "eval_every"), 1_000_000)
        at_most(self, ("prompts_per_step", "micro_batch", "eval_prompts"), 65536)
        at_most(self, ("group_size", "eval_seeds", "parts_per_request"), 4096)
        at_most(self, ("updates_per_step",), 1000)
        at_most(self, ("lr",), 1)
        at_most(self, ("grad_clip",), 1e6)
        check(self.prompts_per_step * self.group_size <= 1 << 20, "group_size",
               f"at most {(1 << 20) // self.prompts_per_step:,} with prompts_per_step {self.prompts_per_step} "
               "(at most 1,048,576 samples per iteration)", self.group_size)


@dataclass
class PromptsConfig:
    """The prompt set; prompts are drawn per iteration from it, deterministically from the seed.
    A file of the user's (`path`) or a built-in set (`name`)."""

    name: Literal["colours", "arithmetic"] = "colours"
    """The built-in set, used when `path` is null: `colours` (a DiT's) or `arithmetic` (an LLM's)."""
    count: int = 8
    """Size of the built-in set, 1..1,000,000 (colours: at most the number of named colours); a
    file's prompts are all used."""
    path: str | None = None
    """The user's prompts (`spotlight.rl.prompt_file`): a `.txt` file (one prompt a line), a
    `.jsonl` file (`{"prompt": ..., other fields}`: the other fields are the prompt's metadata,
    handed to rewards), or a flow_grpo dataset folder (its `train.txt` or `train_metadata.jsonl`)."""
    eval_path: str | None = None
    """Held-out prompts for evaluation (`train.eval_every`), read like `path`; null: a dataset
    folder's `test.txt` / `test_metadata.jsonl` when `path` is one, else prompts of the training set."""

    text_field: str = "prompt"
    """The field of a `.jsonl` line that holds the prompt (GSM8K's files: `question`); the line's other
    fields are its metadata."""

    def __post_init__(self) -> None:
        check(self.count > 0, "count", "a positive integer", self.count)
        at_most(self, ("count",), 1_000_000)
        check(0 < len(self.text_field) <= 200 and self.text_field.isprintable(), "text_field",
              "the name of a jsonl field", self.text_field)
        for name in ("path", "eval_path"):
            value = getattr(self, name)
            check(value is None or (0 < len(value) <= 4096 and "\x00" not in value), name,
                  "null or a file or folder path", value)


@dataclass
class WarmStartConfig:
    """The short supervised start that gives a random tiny model something for GRPO to improve.

    DiT: flow matching on synthetic prompt-conditioned images; LLM: next-token training on worked
    examples. The result is cached on disk, keyed by everything that determines it.
    """

    steps: int = 2400
    """Optimiser steps, 0..10,000,000; 0 disables the warm start."""
    batch_size: int = 32
    """Examples per optimiser step, 1..65,536."""
    lr: float = 1e-3
    """Learning rate, in (0, 1]."""
    cache_dir: str | None = None
    """Where warm-started weights are cached; None means $SPOTLIGHT_CACHE or ~/.cache/spotlight."""
    data: Literal["colours", "text"] = "colours"
    """What the tiny DiT's synthetic images show: `colours`, the colour each prompt names
    (`synthetic_images`); `text`, each prompt's double-quoted text drawn black on white, for the
    OCR reward (`synthetic_text_images`)."""

    def __post_init__(self) -> None:
        check(self.steps >= 0, "steps", "an integer >= 0", self.steps)
        check(self.batch_size > 0, "batch_size", "a positive integer", self.batch_size)
        check(self.lr > 0, "lr", "a number > 0", self.lr)
        at_most(self, ("steps",), 10_000_000)
        at_most(self, ("batch_size",), 65536)
        at_most(self, ("lr",), 1)


@dataclass
class RuntimeConfig:
    """Where the roles run. `local`: one process; `ray`: the learner, rollout workers, the reward
    worker and the request queue are Ray actors (a local cluster is started when none is given)."""

    kind: Literal["ray", "local"] = "ray"
    address: str | None = None
    """Ray cluster to join (e.g. "auto" or "ray://head:10001"); None starts a local one."""
    spot_workers: int = 2
    """Rollout worker slots on spot capacity (actors that need the `spot` custom resource), 0..4,096."""
    ondemand_workers: int = 1
    """Rollout workers on on-demand capacity, 0..4,096: they keep the run going when every spot slot is gone."""
    commit_every: int = 1
    """Denoising steps between partial-state commits, 1..1,000: a death without notice loses at most this many."""
    lease_s: float = 30.0
    """A pulled request's lease, in (0, 86,400] s; heartbeats (one per step) renew it; an expired
    lease re-queues it."""
    notice_s: float = 120.0
    """Warning a replayed trace gives before each removal, in trace seconds, 0..3,600 (AWS: 120; 0: none)."""
    trace_speedup: float = 1.0
    """A replayed trace runs this many times faster than real time, in (0, 1e9]."""
    notice_sources: list[Literal["aws", "gcp", "sigterm"]] = field(default_factory=list)
    """Where each rollout worker watches for a preemption notice: AWS IMDSv2 (spot instance-action,
    rebalance recommendation), GCP (instance/preempted), SIGTERM to its process. Empty off the cloud."""
    notice_poll_s: float = 5.0
    """Seconds between polls of the notice sources, in (0, 3,600]."""
    torch_threads: int = 1
    """CPU threads torch uses in every role — the learner, each rollout worker, and the local
    runtime's one process — 1..256. The same number everywhere keeps local and Ray runs of a
    config bit-identical (a float sum's rounding depends on how it is split over threads), and one
    per process avoids OpenMP spinning when several roles share a node's cores."""
    sp_degree: int = 1
    """Sequence-parallel degree of the DiT's rollout and exploration requests, 1..64: each request
    is served by a group of this many devices (elastic SP; 1: one device per request)."""
    spot_wait_s: float = 300.0
    """On a cluster (`address`): how long the run waits for spot capacity it has none of, in
    (0, 86,400] s, before it says so and falls back (`spot_fallback`)."""
    spot_fallback: bool = True
    """No spot capacity for `spot_wait_s`: start `spot_workers` rollout workers on on-demand nodes
    in their place (True), or keep waiting for spot nodes, saying so every `spot_wait_s` (False)."""

    def __post_init__(self) -> None:
        check(self.spot_workers >= 0, "spot_workers", "an integer >= 0", self.spot_workers)
        check(self.ondemand_workers >= 0, "ondemand_workers", "an integer >= 0", self.ondemand_workers)
        check(self.spot_workers + self.ondemand_workers > 0, "ondemand_workers",
               "at least one rollout worker in all (spot_workers + ondemand_workers > 0)", self.ondemand_workers)
        check(self.commit_every > 0, "commit_every", "a positive integer", self.commit_every)
        check(self.lease_s > 0, "lease_s", "a number > 0", self.lease_s)
        check(self.notice_s >= 0, "notice_s", "a number >= 0", self.notice_s)
        check(self.trace_speedup > 0, "trace_speedup", "a number > 0", self.trace_speedup)
        check(self.notice_poll_s > 0, "notice_poll_s", "a number > 0", self.notice_poll_s)
        check(1 <= self.torch_threads <= 256, "torch_threads", "an integer in 1..256", self.torch_threads)
        check(1 <= self.sp_degree <= 64, "sp_degree", "an integer in 1..64", self.sp_degree)
        check(self.spot_wait_s > 0, "spot_wait_s", "a number > 0", self.spot_wait_s)
        at_most(self, ("spot_workers", "ondemand_workers"), 4096, " workers")
        at_most(self, ("commit_every",), 1000, " steps")
        at_most(self, ("lease_s", "spot_wait_s"), 86400, " s")
        at_most(self, ("notice_s", "notice_poll_s"), 3600, " s")
        at_most(self, ("trace_speedup",), 1e9)


@dataclass
class ExplorationConfig:
    """Seed exploration on stale weights (docs/design.md, idea 1): while the learner trains θ(t+1), idle
    rollout workers score candidate seeds of the next iteration's prompts with θ(t); the next rollout
    uses, per prompt, the G seeds whose rewards contrast most."""

    enabled: bool = False
    """Off: every iteration uses fresh seeds and no exploration runs (plain GRPO)."""
    planner: Literal["bandit", "uniform", "random"] = "bandit"
    """How exploration samples are spread over prompts: `bandit` (to where they add the most group
    reward variance), `uniform` (the same number per prompt), or `random` (none: random seeds, with
    only the stale-rank monitor's few probe samples explored)."""
    candidates_per_prompt: int = 32
    """Most seeds explored per prompt and iteration (train.group_size..65,536)."""
    budget_source: Literal["samples", "train_time"] = "samples"
    """`samples`: exactly `samples_per_step` exploration samples per iteration, finished before the next
    rollout starts (deterministic: same config and seed, same weights); `train_time`: as many as the
    idle rollout workers compute while the learner trains — the rest is cancelled when new weights
    are published, so exploration never delays an iteration (not deterministic)."""
    samples_per_step: int = 128
    """The `samples` budget: exploration samples per iteration over all prompts, 1..1,048,576."""
    request_size: int = 16
    """Most seeds per exploration request (computed as one batch by one worker), 1..4,096: a planner's
    allocation to a prompt is cut into requests of this size."""
    round_samples: int = 64
    """Bandit: samples handed out per planning round (results of a round steer the next), 1..1,048,576."""
    num_steps: int | None = None
    """Denoising steps of an exploration sample (DiT), 1..1,000; None: sampler.num_steps. Fewer steps
    replay the seed's first SDE noise draws on a coarser schedule."""
    ode: bool = False
    """DiT: explore with the deterministic ODE from the seed's initial noise (no SDE noise)."""
    prompt_candidates: int = 1
    """Prompts explored per rollout prompt, 1..1,024: > 1 explores that many times more prompts and rolls out
    those whose stale groups vary most (an LLM skips prompts its stale weights always or never solve)."""
    monitor_seeds: int = 4
    """Probe seeds per prompt the `random` planner explores, so the stale-rank monitor can measure
    (0..candidates_per_prompt)."""
    stale_rank_threshold: float = 0.3
    """When the mean Spearman between seed rankings under θ(t-1) and θ(t) falls below this, seeds
    are chosen at random until it recovers; in [-1, 1]."""
    optimism: float = 1.0
    """Bandit: how much the spread of a little-explored prompt is inflated (UCB-style); 0..1e6."""
    explore_first: bool = True
    """Explore the first iteration's seeds with the starting weights before its rollout. There is no
    train phase yet to hide it in, so it is on the critical path, once per run; it spends
    `samples_per_step` samples whatever the budget source (no update time has been measured yet)."""

    def __post_init__(self) -> None:
        for name in ("candidates_per_prompt", "samples_per_step", "request_size", "round_samples",
                     "prompt_candidates"):
            check(getattr(self, name) > 0, name, "a positive integer", getattr(self, name))
        check(self.monitor_seeds >= 0, "monitor_seeds", "an integer >= 0", self.monitor_seeds)
        check(self.num_steps is None or self.num_steps > 0, "num_steps", "a positive integer or null", self.num_steps)
        check(-1 <= self.stale_rank_threshold <= 1, "stale_rank_threshold", "a number in [-1, 1]",
               self.stale_rank_threshold)
        check(self.optimism >= 0, "optimism", "a number >= 0", self.optimism)
        at_most(self, ("candidates_per_prompt",), 65536, " seeds")
        at_most(self, ("samples_per_step", "round_samples"), 1 << 20, " samples")
        at_most(self, ("request_size",), 4096, " seeds")
        at_most(self, ("num_steps",), 1000, " steps")
        at_most(self, ("prompt_candidates",), 1024)
        at_most(self, ("optimism",), 1e6)


@dataclass
class RunConfig:
    """One training run. `RunConfig()` is the tiny DiT run."""

    seed: int = 0
    """Run seed: every random draw of the run derives from it; 0..2**32 - 1 (`SEED_MAX`)."""
    device: str = "cpu"
    """Torch device: cpu, cuda, cuda:N or mps (`spotlight train` checks that it is there)."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    prompts: PromptsConfig = field(default_factory=PromptsConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    exploration: ExplorationConfig = field(default_factory=ExplorationConfig)
    cloud: CloudConfig = field(default_factory=CloudConfig)

    def __post_init__(self) -> None:
        check(0 <= self.seed <= SEED_MAX, "seed", f"an integer in [0, {SEED_MAX}]", self.seed)
        check(isinstance(self.device, str) and _DEVICE.fullmatch(self.device) is not None, "device",
               "cpu, cuda, cuda:N or mps", self.device)
        ex = self.exploration
        check(ex.candidates_per_prompt >= self.train.group_size, "exploration.candidates_per_prompt",
               f"at least train.group_size ({self.train.group_size})", ex.candidates_per_prompt)
        check(ex.monitor_seeds <= ex.candidates_per_prompt, "exploration.monitor_seeds",
               f"at most exploration.candidates_per_prompt ({ex.candidates_per_prompt})", ex.monitor_seeds)
        if self.train.update_on != "learner":
            # Without LoRA the workers hold no KL reference (the learner's frozen copy stays with it;
            # with LoRA it is the base every worker has), and an SP group computes rollouts only.
            on = self.train.update_on
            check(self.grpo.kl_beta == 0 or self.policy.lora.enabled, "grpo.kl_beta",
                  f"0 with train.update_on: {on} unless policy.lora is on (the workers hold no KL reference "
                  "without LoRA; with it the reference is their own base)", self.grpo.kl_beta)
            check(self.runtime.sp_degree == 1, "runtime.sp_degree", f"1 with train.update_on: {on} "
                  f"({SP_ROLLOUT_ONLY})", self.runtime.sp_degree)
        if self.policy.kind == "llm":
            check(self.grpo.kl_estimator == "exact", "grpo.kl_estimator", "exact for an llm policy (its KL is "
                  "k3 per token; flow_grpo's scale is the DiT's SDE steps')", self.grpo.kl_estimator)
        kind = self.policy.kind
        other, own = (DIT_REWARDS, "an image reward") if kind == "llm" else (LLM_REWARDS, "a text reward")
        article = "an" if kind == "llm" else "a"
        for i, term in enumerate(self.reward.terms):
            where = component_field(self.reward, i, "name")
            check(term.name not in other, where, f"a reward for {article} {kind} policy ({term.name} is {own})",
                  term.name)
        if self.prompts.path is None:
            builtin = "arithmetic" if kind == "llm" else "colours"
            check(self.prompts.name == builtin, "prompts.name", f"'{builtin}' for {article} {kind} policy (or "
                  "prompts.path: a prompt file of yours)", self.prompts.name)

    @property
    def evaluates(self) -> bool:
        """Whether the run evaluates fixed prompts and seeds (`train.eval_every`)."""
        return self.train.eval_prompts > 0 or self.prompts.eval_path is not None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fingerprint(self, *sections: str) -> str:
        """A short hash of the named sections (all when none), for cache keys and resume checks."""
        d = self.to_dict()
        picked = {k: d[k] for k in sections} if sections else d
        return hashlib.sha256(json.dumps(picked, sort_keys=True).encode()).hexdigest()[:16]


# ---- building dataclasses from plain data, with one-line errors ---------------------------------


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is tuple:
        return "a list [" + ", ".join(_type_name(a) for a in typing.get_args(tp)) + "]"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            type(None): "null"}.get(tp, getattr(tp, "__name__", str(tp)))


def _coerce(value: Any, tp: Any, name: str) -> Any:
    # No field takes inf or nan (issue 13: `train.lr: .inf` trained 89% of the weights into NaN); said
    # here, before a union such as `float | None` would call it just "not a number or null".
    check(not isinstance(value, float) or math.isfinite(value), name, "a finite number", value)
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: expected a mapping of {tp.__name__} fields, got {short(value)}")
        return from_dict(tp, value, prefix=name + ".")
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, name)
            except ConfigError:
                continue
        raise ConfigError(f"{name}: expected {_type_name(tp)}, got {short(value)}")
    if origin is Literal:
        check(value in typing.get_args(tp), name, _type_name(tp), value)
        return value
    if origin is list:
        (arg,) = typing.get_args(tp)
        check(isinstance(value, (list, tuple)), name, f"a list of {_type_name(arg)}", value)
        return [_coerce(v, arg, f"{name}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        args = typing.get_args(tp)
        check(isinstance(value, (list, tuple)) and len(value) == len(args), name, _type_name(tp), value)
        return tuple(_coerce(v, a, f"{name}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if tp is type(None):
        check(value is None, name, "null", value)
        return None
    if tp is bool:
        check(isinstance(value, bool), name, "true or false", value)
        return value
    if tp is int:
        check(isinstance(value, int) and not isinstance(value, bool), name, "an integer", value)
        return value
    if tp is float:
        check(isinstance(value, (int, float)) and not isinstance(value, bool), name, "a number", value)
        try:
            number = float(value)
        except OverflowError:  # an integer beyond float's range
            number = math.inf
        check(math.isfinite(number), name, "a finite number", value)
        return number
    if tp is str:
        check(isinstance(value, str), name, "a string", value)
        return value
    raise TypeError(f"config field {name} has unsupported type {tp!r}")  # a bug in this module, not in the input


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass `cls` from `data`, rejecting unknown keys and mistyped values."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields), key=str)  # keys are not all strings in a bad file
    if unknown:
        key = unknown[0] if isinstance(unknown[0], str) and len(unknown[0]) <= 100 else short(unknown[0])
        raise ConfigError(f"{prefix}{key}: unknown field (expected one of {', '.join(fields)})")
    kwargs = {k: _coerce(v, hints[k], prefix + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except InputError as err:
        # __post_init__ names the field relative to its own dataclass; make it dotted from the root.
        raise ConfigError(f"{prefix}{err}") from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML run config (`schedulers.input_file.load_yaml`: bounded, no aliases, no duplicate
    keys, not empty). Every error is one `ConfigError` line starting with the file name."""
    path = Path(path)
    try:
        data = load_yaml(path, "config", MAX_CONFIG_BYTES)
    except InputFileError as err:
        raise ConfigError(str(err)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of RunConfig fields at the top level, got {type(data).__name__}")
    try:
        return from_dict(RunConfig, _merge(data, overrides or {}))
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None


def config_from_yaml(text: str, source: str = "<config text>") -> RunConfig:
    """A run config from YAML text that `to_yaml` wrote and a message carried rather than a file
    (an `elastic_sp.spec.ServeSpec`'s `config`, over the agent's authenticated connection), read by
    the same loader as a config file and bounded like one. Errors are one `ConfigError` line
    starting with `source`."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{source}: {len(text)} characters (expected at most {MAX_CONFIG_BYTES})")
    try:
        data = parse_yaml(text, source, "config")
    except InputFileError as err:
        raise ConfigError(str(err)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of RunConfig fields at the top level, "
                          f"got {type(data).__name__}")
    try:
        return from_dict(RunConfig, data)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def default_config(overrides: dict[str, Any] | None = None) -> RunConfig:
    """The embedded default run (the tiny DiT), with optional overrides."""
    try:
        return from_dict(RunConfig, overrides or {})
    except ConfigError as err:
        raise ConfigError(f"<default config>: {err}") from None


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s values set in it, section into section. A section of `base` that is
    not a mapping (`train: [1, 2]`) is kept as it is, whatever `over` sets in it, so that
    `from_dict` refuses it as it would without overrides: a flag (`--steps 1`) must not replace a
    malformed section with the defaults (tests/spotlight/test_bad_input.py, "train: [1, 2] with --steps")."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        elif isinstance(value, dict) and key in out:
            continue  # not a mapping where one belongs: from_dict says so, naming the section
        else:
            out[key] = value
    return out


def to_yaml(cfg: RunConfig) -> str:
    def plain(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, tuple):
            return [plain(v) for v in x]
        return x

    return yaml.dump(plain(cfg.to_dict()), Dumper=_PlainDumper, sort_keys=False)


class _PlainDumper(yaml.SafeDumper):
    """SafeDumper that writes every value out: PyYAML emits an anchor and aliases for an object
    that appears twice, which `load_config` refuses (issue 13); what we write must read back."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
