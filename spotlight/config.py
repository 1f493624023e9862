"""Run configuration: one dataclass per component, nested under `RunConfig`.

A YAML file in `experiments/` is a `RunConfig` written down. Loading rejects unknown keys and
values of the wrong type or range with a single `ConfigError` line that names the file and the
dotted field (`experiments/x.yaml: train.lr: expected a number > 0, got -1`). The defaults of
`RunConfig()` are the embedded default run: the tiny DiT on CPU.

Each section is a pydantic dataclass (`schedulers.input.config_section`): every field declares its
type strictly and every number its range, on the field; every float is finite (`.inf` and `.nan`
are refused for every float field); checks of several fields together stay in the section's
`__post_init__`. Maxima bound what one setting can make a run allocate or loop over; they are
generous (far beyond any real run) and each error names the field and the range. The file itself
is read by `schedulers.input.files`: at most `MAX_CONFIG_BYTES`, UTF-8, no YAML anchors or
aliases, no duplicate keys, at most 64 levels deep, and not empty. Values quoted in errors are cut
to ~200 characters.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import StrictBool, StrictFloat, StrictInt, StrictStr, StringConstraints

from cloud.bounded_json import JsonRefused, load_file
from cloud.config import CloudConfig
from cloud.model_cache import cached_folder, is_remote, local_folder, source_problem
from schedulers.input.config_section import build, limited, section
from schedulers.update_placement import PLACES, SP_ROLLOUT_ONLY
from schedulers.input.files import (SEED_MAX, ConfigError, InputError, InputFileError, check, load_yaml, parse_yaml,
                                    short)
from spotlight.reward_names import BUILTIN_REWARDS, check_name, component_field  # noqa: F401 — BUILTIN_REWARDS re-exported

MAX_CONFIG_BYTES = 1 << 20
"""Largest config file read (1 MiB; the shipped ones are under 1 KB)."""


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


@section
class DiTConfig:
    """The diffusion transformer (diffusers `QwenImageTransformer2DModel`), and where its text
    conditioning, decoding and sigma schedule come from."""

    preset: Literal["tiny", "qwen-image"] = "tiny"
    """`tiny`: a random 2-layer config that trains on CPU, computed in float32; `qwen-image`: the
    released 20B config, computed in bfloat16. With `pretrained_path` the architecture is the
    folder's, and the preset still picks the dtype (of the transformer, text encoder and VAE alike)."""
    pretrained_path: StrictStr | None = None
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
    resolution: StrictInt = limited(16, gt=0, le=4096, unit=" pixels")
    """Image side in pixels, 1..4096, a multiple of 2 x `vae_scale`: the latent side (resolution /
    `vae_scale`) must divide by the patch size 2."""
    text_tokens: StrictInt = limited(8, gt=0, le=4096)
    """Prompt length in tokens for the deterministic stand-in text encoder, 1..4096 (a pipeline's
    text encoder gives every prompt its own length)."""

    def __post_init__(self) -> None:
        _check_source(self.pretrained_path)
        scale = self.vae_scale
        check(self.resolution % (2 * scale) == 0, "resolution",
               f"a size whose latent side (resolution / {scale}) divides by the patch size 2: "
               f"a multiple of {2 * scale}",
               self.resolution)

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


@section
class LLMConfig:
    """The causal language model: the tiny Qwen2 built from the seed, or a transformers folder."""

    pretrained_path: StrictStr | None = None
    """A folder with a transformers causal LM and its tokenizer, as `save_pretrained` writes them
    (config.json, weights, tokenizer files): local, or `s3://BUCKET/PREFIX` / `gs://BUCKET/PREFIX`
    / a Hugging Face repo id, fetched once per node as `DiTConfig.pretrained_path` is; null means
    the tiny config. Prompts go through the tokenizer's chat template when it has one; the tiny
    sizes below are then unused."""
    hidden_size: StrictInt = limited(64, gt=0, le=65536)
    """Tiny config sizes: hidden_size 1..65,536, num_layers 1..1,024, num_heads and num_kv_heads
    1..1,024, intermediate_size 1..262,144 (beyond the largest released LLMs)."""
    num_layers: StrictInt = limited(2, gt=0, le=1024)
    num_heads: StrictInt = limited(4, gt=0, le=1024)
    num_kv_heads: StrictInt = limited(2, gt=0, le=1024)
    intermediate_size: StrictInt = limited(128, gt=0, le=262144)
    max_new_tokens: StrictInt = limited(4, gt=0, le=32768, unit=" tokens")
    """Completion length limit in tokens, 1..32,768 (answers of the arithmetic task have at most 3 digits)."""
    temperature: StrictFloat = limited(1.0, gt=0, le=100)
    """Sampling temperature, in (0, 100]."""

    def __post_init__(self) -> None:
        _check_source(self.pretrained_path)
        check(self.hidden_size % self.num_heads == 0, "hidden_size",
               f"a multiple of num_heads ({self.num_heads})", self.hidden_size)
        check(self.num_heads % self.num_kv_heads == 0, "num_kv_heads",
               f"a divisor of num_heads ({self.num_heads})", self.num_kv_heads)

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


@section
class LoRAConfig:
    """LoRA adapters (peft) instead of full-parameter training: only the adapters are trained,
    published to workers and checkpointed; the base stays frozen (`spotlight.rl.lora`)."""

    rank: StrictInt = limited(0, ge=0, le=4096, expected="an integer in 0..4096 (0: no LoRA)")
    """Adapter rank r, 0..4,096; 0 trains every parameter (no LoRA)."""
    alpha: StrictFloat | None = limited(None, gt=0, le=65536, expected="a number in (0, 65536] or null")
    """peft's lora_alpha (adapters scale by alpha / rank), in (0, 65,536]; null: alpha = rank."""
    target_modules: list[Annotated[str, StringConstraints(strict=True, min_length=1, max_length=200)]] | None = limited(
        None, min_length=1, max_length=256, expected="null or a list of 1..256 module names")
    """Names (suffixes) of the linear layers that get adapters; null: the policy's defaults
    (`DIT_LORA_TARGETS` / `LLM_LORA_TARGETS`)."""

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def lora_alpha(self) -> float:
        """peft's lora_alpha: `alpha`, or the rank when it is null."""
        return self.alpha or self.rank


@section
class PolicyConfig:
    """Which policy is trained; only the sub-config of that kind is used."""

    kind: Literal["dit", "llm"] = "dit"
    dit: DiTConfig = field(default_factory=DiTConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    pretrained_path: StrictStr | None = None
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


@section
class SamplerConfig:
    """The Flow-GRPO SDE sampler (DiT only)."""

    num_steps: StrictInt = limited(8, gt=0, le=1000, unit=" steps")
    """Denoising steps per sample, 1..1,000."""
    noise_level: StrictFloat = limited(0.7, gt=0, le=10)
    """`a` in the SDE's std `sqrt(sigma / (1 - sigma)) * a`, in (0, 10]."""
    sde_window: tuple[StrictInt, StrictInt] | None = None
    """[first, last) steps that are stochastic (and trained on); the rest are ODE steps. None: all."""
    guidance: StrictFloat = limited(1.0, ge=1, le=100, note=" (1: no guidance)")
    """True classifier-free guidance (Qwen-Image's `true_cfg_scale`; its pipeline's default is 4):
    every velocity — rollout, exploration and the update's recomputed log-probs alike — is the
    prompt's and the negative prompt's passes combined by `spotlight.rl.dit_model.true_cfg`. 1: off
    (one pass); in [1, 100]."""
    negative_prompt: StrictStr = limited(" ", max_length=1000, expected="a text of at most 1,000 characters")
    """The negative prompt's text with guidance > 1 (Qwen-Image's pipeline uses " "); at most 1,000
    characters."""

    def __post_init__(self) -> None:
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
_FUNCTION = r"^(?:[A-Za-z_][\w.]*:[A-Za-z_]\w*|[^\x00-\x1f:][^\x00-\x1f]*\.py:[A-Za-z_]\w*)$"
"""A user reward: `package.module:name` or `path/to/file.py:name`."""


@section
class RewardComponent:
    """One term of the reward: a built-in or registered reward (`name`) or a callable of the
    user's (`function`), scaled by `weight`. Exactly one of `name` and `function` is set."""

    name: StrictStr | None = None
    """A built-in reward (`DIT_REWARDS`, `LLM_REWARDS`) or one registered under the
    `spotlight.rewards` entry-point group; checked at load."""
    function: StrictStr | None = limited(None, max_length=1000, pattern=_FUNCTION,
                                         expected="package.module:callable or path/to/file.py:callable")
    """A Python callable of the user's: "package.module:name" or "path/to/file.py:name" (a path
    relative to the working directory). It is called as `f(outputs, prompts, metadata)` with the
    batch's decoded outputs (DiT: a list of PIL images; LLM: a list of completion strings), the
    prompt strings and each prompt's metadata dict, and returns one finite float per sample."""
    weight: StrictFloat = limited(1.0, ge=-1e6, le=1e6, expected="a number in [-1e6, 1e6]")
    """Its weight in the sum, a finite number in [-1e6, 1e6] (negative: a penalty)."""
    model_path: StrictStr | None = None
    """Local weights of a model-based reward (clip_score); null: `reward.model_path`."""

    def __post_init__(self) -> None:
        check((self.name is None) != (self.function is None), "name",
              "exactly one of name (a built-in reward) and function (module:callable or file.py:callable)",
              self.name if self.name is not None else self.function)
        if self.name is not None:
            check_name(self.name, "name")

    @property
    def label(self) -> str:
        """What metrics call this component: the reward's name, or the callable's."""
        return self.name if self.name is not None else self.function.rsplit(":", 1)[1]


@section
class RewardConfig:
    """The reward: one built-in reward by `name`, or several `components` summed by weight; see
    `spotlight.rl.rewards` for the names."""

    name: StrictStr = "colour"
    """The one-component shorthand, used when `components` is empty: a name of `DIT_REWARDS` or
    `LLM_REWARDS`, or one registered under the `spotlight.rewards` entry-point group; checked at load."""
    components: list[RewardComponent] = limited(default_factory=list, max_length=32, expected="at most 32 components")
    """Rewards combined by weight, `[{name: ocr, weight: 1.0}, {function: "my_reward.py:score",
    weight: 0.5}]`, at most 32; each one's mean and std are in the metrics. Empty: `name` alone."""
    model_path: StrictStr | None = None
    """Local weights for model-based rewards (clip_score: a CLIP/PickScore folder); `spotlight train`
    checks that it is an existing folder before it builds anything."""
    colour_width: StrictFloat = limited(0.5, gt=0, le=1e6)
    """Colour reward: `exp(-|rgb - target|^2 / colour_width)` per pixel; in (0, 1e6]."""
    workers: StrictInt = limited(1, ge=1, le=1024, expected="an integer in 1..1024")
    """Reward actors on Ray, 1..1,024: an iteration's batch is split between them (stateless)."""
    num_gpus: StrictFloat = limited(0.0, ge=0, le=8, expected="a number in [0, 8]")
    """GPUs each reward actor holds on Ray, 0..8 (fractions share one): model-based rewards (OCR,
    CLIP) then run on it. 0: CPU."""
    timeout_s: StrictFloat = limited(600.0, gt=0, le=86400, unit=" s")
    """Longest one component may take to score one batch, in (0, 86,400] s: a reward that hangs
    longer is stopped, tried once more, then stops the run naming the component."""

    def __post_init__(self) -> None:
        if not self.components:
            check_name(self.name, "name")
        labels = [c.label for c in self.components]
        for i, label in enumerate(labels):
            check(labels.count(label) == 1, f"components[{i}]", "a reward used once (each component "
                  "is a metric of its own)", label)

    @property
    def terms(self) -> list[RewardComponent]:
        """The reward's components: `components`, or `name` with weight 1."""
        return list(self.components) or [RewardComponent(name=self.name)]


@section
class GRPOConfig:
    """Group-relative policy optimisation: advantages and the clipped loss."""

    clip_low: StrictFloat = limited(1e-3, gt=0, lt=1, expected="a number in (0, 1)")
    """The ratio is clipped to [1 - clip_low, 1 + clip_high]; clip_low in (0, 1), clip_high in (0, 100]."""
    clip_high: StrictFloat = limited(1e-3, gt=0, le=100)
    adv_clip: StrictFloat = limited(5.0, gt=0, le=1e6)
    """Advantages are clipped to [-adv_clip, adv_clip]; in (0, 1e6]."""
    adv_eps: StrictFloat = limited(1e-4, gt=0, le=1)
    """`A = (r - mean_g) / (std_g + adv_eps)`; in (0, 1]."""
    kl_beta: StrictFloat = limited(0.0, ge=0, le=1e6)
    """Weight of the KL penalty to the reference (warm-started) policy, in [0, 1e6]; 0 disables it."""
    drop_zero_advantage_groups: StrictBool = False
    """Leave groups whose advantages are all zero (every sample rewarded the same) out of the
    update, as flow_grpo does: they add no policy gradient, but kept they count in the loss's mean
    and shrink the step by their share (common with exact-match LLM rewards). Off by default so
    existing configs keep their results; when every group is all zero, all are kept."""
    kl_estimator: Literal["exact", "flow_grpo"] = "exact"
    """The DiT's KL per SDE step: "exact", the closed-form KL of the step's two Gaussians; or
    "flow_grpo", flow_grpo's value, which is |dt| times it (5-50x smaller on the tiny config's 8 steps),
    so that a `kl_beta` taken from flow_grpo's configs means what it meant there. An LLM's KL is
    the k3 estimator per token either way, and takes "exact" only. docs/training.md."""


PARTS_PER_REQUEST = 8
"""`train.parts_per_request`'s default (`TrainConfig.parts_per_request`)."""


@section
class TrainConfig:
    """The iteration loop and the optimiser."""

    steps: StrictInt = limited(30, gt=0, le=1_000_000)
    """GRPO iterations, 1..1,000,000."""
    prompts_per_step: StrictInt = limited(8, gt=0, le=65536)
    """Prompts per iteration, 1..65,536."""
    group_size: StrictInt = limited(8, ge=2, le=4096, note=" (GRPO needs a group)")
    """G: samples per prompt, 2..4,096. An iteration's samples (prompts_per_step x group_size) are at
    most 1,048,576: the rollout of one iteration is held in memory."""
    lr: StrictFloat = limited(1e-4, gt=0, le=1)
    """Learning rate, in (0, 1]."""
    updates_per_step: StrictInt = limited(2, gt=0, le=1000)
    """Optimiser steps per iteration, each over the whole rollout; 1..1,000."""
    grad_clip: StrictFloat = limited(1.0, gt=0, le=1e6)
    """Gradient norm clip, in (0, 1e6]."""
    checkpoint_every: StrictInt = limited(10, gt=0, le=1_000_000)
    """Iterations between checkpoints (the last iteration is always checkpointed); 1..1,000,000."""
    micro_batch: StrictInt = limited(64, gt=0, le=65536)
    """Samples per forward pass in rollout and update, 1..65,536: bounds memory; the results differ only
    by float rounding, so it may change when a run resumes (`spotlight.checkpoints.resume_identity.NEUTRAL`)."""
    eval_prompts: StrictInt = limited(0, ge=0, le=65536)
    """Prompts of a fixed evaluation set scored at the start of every iteration (0: no evaluation), 0..65,536.
    `eval_reward` is the policy's mean reward on fixed prompts and seeds, unbiased by how an
    iteration chose its own seeds (exploration picks contrasting ones: their mean is not the policy's)."""
    eval_seeds: StrictInt = limited(8, gt=0, le=4096)
    """Seeds per evaluation prompt, 1..4,096."""
    eval_every: StrictInt = limited(1, gt=0, le=1_000_000)
    """Iterations between evaluations, 1..1,000,000 (when evaluation is on: `eval_prompts` > 0 or
    `prompts.eval_path`); the last iteration is always evaluated. Each writes the per-component
    eval rewards to the metrics and, for a DiT, a grid of the samples under `eval/` and in
    TensorBoard (an LLM's completions: a JSONL file there)."""
    ema_decay: StrictFloat = limited(0.0, ge=0, lt=1, expected="a number in [0, 1) (0: no EMA)")
    """An exponential moving average of the trained parameters (the adapters with LoRA), updated
    after every optimiser step with this decay, in [0, 1); 0: off. When on, evaluation samples with
    it and `final/` holds it; checkpointed and resumed exactly."""
    gradient_checkpointing: StrictBool = False
    """Recompute activations in the update's backward pass instead of keeping them (diffusers' and
    transformers' own gradient checkpointing): less memory, ~30% more update time, the same result."""
    update_on: StrictStr = "learner"
    """Who computes the update's gradient: "learner" (the learner alone), "fleet" (every
    rollout worker, spot and on-demand, pulls its micro-batches from the queue as `TRAIN`
    requests, gradient work before exploration; the learner sums them in micro-batch order and
    steps — the same weights as "learner", bit for bit), or "auto" (each update where the run's
    own updates measured faster: `schedulers/update_placement.py`). docs/training.md."""
    parts_per_request: StrictInt = limited(PARTS_PER_REQUEST, gt=0, le=4096)
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

    learner_gpus: StrictInt = limited(1, gt=0, le=64)
    """N: processes the learner runs as, one per on-demand GPU (on the CPU, N processes), 1..64. With
    N > 1 the model, its gradients and Adam's moments are sharded over them (FSDP2,
    `spotlight.runtime.learner_group`): for a full fine-tune one GPU cannot hold. Checkpoints are
    then one file per process, and a run may resume with another N (the shards are redistributed).
    For now N > 1 trains without LoRA or an EMA, with `update_on: learner`, on the local runtime.
    docs/training.md."""

    def __post_init__(self) -> None:
        check(self.update_on in PLACES, "update_on", f"{', '.join(PLACES[:-1])} or {PLACES[-1]}", self.update_on)
        check(self.prompts_per_step * self.group_size <= 1 << 20, "group_size",
               f"at most {(1 << 20) // self.prompts_per_step:,} with prompts_per_step {self.prompts_per_step} "
               "(at most 1,048,576 samples per iteration)", self.group_size)


TRAIN_FILES = ("train_metadata.jsonl", "train.txt")
"""What a flow_grpo dataset folder's training prompts are, in order of preference (metadata first)."""
TEST_FILES = ("test_metadata.jsonl", "test.txt")
"""What a dataset folder's held-out prompts are."""


def dataset_file(path: str | Path, names: tuple[str, ...]) -> Path | None:
    """The first of `names` in folder `path`, or None when there is none."""
    for name in names:
        if (Path(path) / name).is_file():
            return Path(path) / name
    return None


_A_PATH = dict(min_length=1, max_length=4096, pattern=r"^[^\x00]*$", expected="null or a file or folder path")
"""What a prompt file's path may be: 1..4,096 characters, no NUL (`PromptsConfig.path`, `eval_path`)."""


@section
class PromptsConfig:
    """The prompt set; prompts are drawn per iteration from it, deterministically from the seed.
    A file of the user's (`path`) or a built-in set (`name`)."""

    name: Literal["colours", "arithmetic"] = "colours"
    """The built-in set, used when `path` is null: `colours` (a DiT's) or `arithmetic` (an LLM's)."""
    count: StrictInt = limited(8, gt=0, le=1_000_000)
    """Size of the built-in set, 1..1,000,000 (colours: at most the number of named colours); a
    file's prompts are all used."""
    path: StrictStr | None = limited(None, **_A_PATH)
    """The user's prompts (`spotlight.rl.prompt_file`): a `.txt` file (one prompt a line), a
    `.jsonl` file (`{"prompt": ..., other fields}`: the other fields are the prompt's metadata,
    handed to rewards), or a flow_grpo dataset folder (its `train.txt` or `train_metadata.jsonl`)."""
    eval_path: StrictStr | None = limited(None, **_A_PATH)
    """Held-out prompts for evaluation (`train.eval_every`), read like `path`; null: a dataset
    folder's `test.txt` / `test_metadata.jsonl` when `path` is one, else prompts of the training set."""

    text_field: StrictStr = limited("prompt", min_length=1, max_length=200, expected="the name of a jsonl field")
    """The field of a `.jsonl` line that holds the prompt (GSM8K's files: `question`); the line's other
    fields are its metadata."""

    def __post_init__(self) -> None:
        check(self.text_field.isprintable(), "text_field", "the name of a jsonl field", self.text_field)


@section
class WarmStartConfig:
    """The short supervised start that gives a random tiny model something for GRPO to improve.

    DiT: flow matching on synthetic prompt-conditioned images; LLM: next-token training on worked
    examples. The result is cached on disk, keyed by everything that determines it.
    """

    steps: StrictInt = limited(2400, ge=0, le=10_000_000)
    """Optimiser steps, 0..10,000,000; 0 disables the warm start."""
    batch_size: StrictInt = limited(32, gt=0, le=65536)
    """Examples per optimiser step, 1..65,536."""
    lr: StrictFloat = limited(1e-3, gt=0, le=1)
    """Learning rate, in (0, 1]."""
    cache_dir: StrictStr | None = None
    """Where warm-started weights are cached; None means $SPOTLIGHT_CACHE or ~/.cache/spotlight."""
    data: Literal["colours", "text"] = "colours"
    """What the tiny DiT's synthetic images show: `colours`, the colour each prompt names
    (`synthetic_images`); `text`, each prompt's double-quoted text drawn black on white, for the
    OCR reward (`synthetic_text_images`)."""


@section
class RuntimeConfig:
    """Where the roles run. `local`: one process; `ray`: the learner, rollout workers, the reward
    worker and the request queue are Ray actors (a local cluster is started when none is given)."""

    kind: Literal["ray", "local"] = "ray"
    address: StrictStr | None = None
    """Ray cluster to join (e.g. "auto" or "ray://head:10001"); None starts a local one."""
    spot_workers: StrictInt = limited(2, ge=0, le=4096, unit=" workers")
    """Rollout worker slots on spot capacity (actors that need the `spot` custom resource), 0..4,096."""
    ondemand_workers: StrictInt = limited(1, ge=0, le=4096, unit=" workers")
    """Rollout workers on on-demand capacity, 0..4,096: they keep the run going when every spot slot is gone."""
    commit_every: StrictInt = limited(1, gt=0, le=1000, unit=" steps")
    """Denoising steps between partial-state commits, 1..1,000: a death without notice loses at most this many."""
    lease_s: StrictFloat = limited(30.0, gt=0, le=86400, unit=" s")
    """A pulled request's lease, in (0, 86,400] s; heartbeats (one per step) renew it; an expired
    lease re-queues it."""
    notice_s: StrictFloat = limited(120.0, ge=0, le=3600, unit=" s")
    """Warning a replayed trace gives before each removal, in trace seconds, 0..3,600 (AWS: 120; 0: none)."""
    trace_speedup: StrictFloat = limited(1.0, gt=0, le=1e9)
    """A replayed trace runs this many times faster than real time, in (0, 1e9]."""
    notice_sources: list[Literal["aws", "gcp", "sigterm"]] = field(default_factory=list)
    """Where each rollout worker watches for a preemption notice: AWS IMDSv2 (spot instance-action,
    rebalance recommendation), GCP (instance/preempted), SIGTERM to its process. Empty off the cloud."""
    notice_poll_s: StrictFloat = limited(5.0, gt=0, le=3600, unit=" s")
    """Seconds between polls of the notice sources, in (0, 3,600]."""
    torch_threads: StrictInt = limited(1, ge=1, le=256, expected="an integer in 1..256")
    """CPU threads torch uses in every role — the learner, each rollout worker, and the local
    runtime's one process — 1..256. The same number everywhere keeps local and Ray runs of a
    config bit-identical (a float sum's rounding depends on how it is split over threads), and one
    per process avoids OpenMP spinning when several roles share a node's cores."""
    sp_degree: StrictInt = limited(1, ge=1, le=64, expected="an integer in 1..64")
    """Sequence-parallel degree of the DiT's rollout and exploration requests, 1..64: each request
    is served by a group of this many devices (elastic SP; 1: one device per request)."""
    spot_wait_s: StrictFloat = limited(300.0, gt=0, le=86400, unit=" s")
    """On a cluster (`address`): how long the run waits for spot capacity it has none of, in
    (0, 86,400] s, before it says so and falls back (`spot_fallback`)."""
    spot_fallback: StrictBool = True
    """No spot capacity for `spot_wait_s`: start `spot_workers` rollout workers on on-demand nodes
    in their place (True), or keep waiting for spot nodes, saying so every `spot_wait_s` (False)."""

    def __post_init__(self) -> None:
        check(self.spot_workers + self.ondemand_workers > 0, "ondemand_workers",
               "at least one rollout worker in all (spot_workers + ondemand_workers > 0)", self.ondemand_workers)


@section
class ExplorationConfig:
    """Seed exploration on stale weights (docs/design.md, idea 1): while the learner trains θ(t+1), idle
    rollout workers score candidate seeds of the next iteration's prompts with θ(t); the next rollout
    uses, per prompt, the G seeds whose rewards contrast most."""

    enabled: StrictBool = False
    """Off: every iteration uses fresh seeds and no exploration runs (plain GRPO)."""
    planner: Literal["bandit", "uniform", "random"] = "bandit"
    """How exploration samples are spread over prompts: `bandit` (to where they add the most group
    reward variance), `uniform` (the same number per prompt), or `random` (none: random seeds, with
    only the stale-rank monitor's few probe samples explored)."""
    candidates_per_prompt: StrictInt = limited(32, gt=0, le=65536, unit=" seeds")
    """Most seeds explored per prompt and iteration (train.group_size..65,536)."""
    budget_source: Literal["samples", "train_time"] = "samples"
    """`samples`: exactly `samples_per_step` exploration samples per iteration, finished before the next
    rollout starts (deterministic: same config and seed, same weights); `train_time`: as many as the
    idle rollout workers compute while the learner trains — the rest is cancelled when new weights
    are published, so exploration never delays an iteration (not deterministic)."""
    samples_per_step: StrictInt = limited(128, gt=0, le=1 << 20, unit=" samples")
    """The `samples` budget: exploration samples per iteration over all prompts, 1..1,048,576."""
    request_size: StrictInt = limited(16, gt=0, le=4096, unit=" seeds")
    """Most seeds per exploration request (computed as one batch by one worker), 1..4,096: a planner's
    allocation to a prompt is cut into requests of this size."""
    round_samples: StrictInt = limited(64, gt=0, le=1 << 20, unit=" samples")
    """Bandit: samples handed out per planning round (results of a round steer the next), 1..1,048,576."""
    num_steps: StrictInt | None = limited(None, gt=0, le=1000, unit=" steps")
    """Denoising steps of an exploration sample (DiT), 1..1,000; None: sampler.num_steps. Fewer steps
    replay the seed's first SDE noise draws on a coarser schedule."""
    ode: StrictBool = False
    """DiT: explore with the deterministic ODE from the seed's initial noise (no SDE noise)."""
    prompt_candidates: StrictInt = limited(1, gt=0, le=1024)
    """Prompts explored per rollout prompt, 1..1,024: > 1 explores that many times more prompts and rolls out
    those whose stale groups vary most (an LLM skips prompts its stale weights always or never solve)."""
    monitor_seeds: StrictInt = limited(4, ge=0)
    """Probe seeds per prompt the `random` planner explores, so the stale-rank monitor can measure
    (0..candidates_per_prompt)."""
    stale_rank_threshold: StrictFloat = limited(0.3, ge=-1, le=1, expected="a number in [-1, 1]")
    """When the mean Spearman between seed rankings under θ(t-1) and θ(t) falls below this, seeds
    are chosen at random until it recovers; in [-1, 1]."""
    optimism: StrictFloat = limited(1.0, ge=0, le=1e6)
    """Bandit: how much the spread of a little-explored prompt is inflated (UCB-style); 0..1e6."""
    explore_first: StrictBool = True
    """Explore the first iteration's seeds with the starting weights before its rollout. There is no
    train phase yet to hide it in, so it is on the critical path, once per run; it spends
    `samples_per_step` samples whatever the budget source (no update time has been measured yet)."""


@section
class RunConfig:
    """One training run. `RunConfig()` is the tiny DiT run."""

    seed: StrictInt = limited(0, ge=0, le=SEED_MAX, expected=f"an integer in [0, {SEED_MAX}]")
    """Run seed: every random draw of the run derives from it; 0..2**32 - 1 (`SEED_MAX`)."""
    device: StrictStr = limited("cpu", pattern=r"^(?:cpu|cuda(?::\d{1,3})?|mps)$", expected="cpu, cuda, cuda:N or mps")
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
        if (n := self.train.learner_gpus) > 1:  # what a learner group does not do yet (issue 40)
            t = self.train
            for ok, key, expected, got in ((self.policy.lora.rank == 0, "policy.lora.rank", "0", self.policy.lora.rank),
                                           (t.ema_decay == 0, "train.ema_decay", "0", t.ema_decay),
                                           (t.update_on == "learner", "train.update_on", "learner", t.update_on)):
                check(ok, key, f"{expected} with train.learner_gpus: {n} (a sharded learner trains a full "
                      "fine-tune, by itself, for now)", got)
            # One GPU a rank, every rank on one node (the local machine, or the Ray actor's node):
            # more than a node holds could never be placed, and would not be priced as it runs.
            check(not self.device.startswith("cuda") or n <= self.cloud.gpus_per_node, "train.learner_gpus",
                  f"at most cloud.gpus_per_node ({self.cloud.gpus_per_node}) on {self.device} (a learner group's "
                  "processes share one node, a GPU each: set cloud.gpus_per_node to the node's GPUs)", n)
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

    def evaluation_file(self) -> str | Path | None:
        """The file the evaluation prompts are read from: `prompts.eval_path`, else (with
        `train.eval_prompts` > 0) a dataset folder's test file; None: they are training prompts."""
        path = self.prompts.eval_path
        if path is None and self.train.eval_prompts and self.prompts.path is not None and Path(self.prompts.path).is_dir():
            return dataset_file(self.prompts.path, TEST_FILES)
        return path

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fingerprint(self, *sections: str) -> str:
        """A short hash of the named sections (all when none), for cache keys and resume checks."""
        d = self.to_dict()
        picked = {k: d[k] for k in sections} if sections else d
        return hashlib.sha256(json.dumps(picked, sort_keys=True).encode()).hexdigest()[:16]


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build config section `cls` from plain data (`schedulers.input.config_section.build`: unknown keys,
    mistyped values and values out of their declared range refused), errors naming the dotted field
    after `prefix`."""
    try:
        return build(cls, data)
    except ConfigError as err:
        raise ConfigError(f"{prefix}{err}") from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML run config (`schedulers.input.files.load_yaml`: bounded, no aliases, no duplicate
    keys, not empty). Every error is one `ConfigError` line starting with the file name."""
    path = Path(path)
    try:
        data = load_yaml(path, "config", MAX_CONFIG_BYTES)
    except InputFileError as err:
        raise ConfigError(str(err)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of RunConfig fields at the top level, got {type(data).__name__}")
    try:
        return from_dict(RunConfig, merge_sections(data, overrides or {}))
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


def merge_sections(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s values set in it, section into section. A section of `base` that is
    not a mapping (`train: [1, 2]`) is kept as it is, whatever `over` sets in it, so that
    `from_dict` refuses it as it would without overrides: a flag (`--steps 1`) must not replace a
    malformed section with the defaults (tests/spotlight/test_bad_input.py, "train: [1, 2] with --steps")."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_sections(out[key], value)
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
