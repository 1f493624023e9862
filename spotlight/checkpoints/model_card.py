"""final/README.md: the model card of a trained policy — what it is and how to load it.

Hugging Face reads the YAML front matter (library, base model, tags); people read the rest: the
base model, the reward, how many iterations trained it, the LoRA settings, a loading snippet that
matches the files `save_pretrained` wrote, and the whole run config.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from cloud.model_cache import cached_folder
from spotlight.config import RunConfig
from spotlight.reward_names import spec


def base_model(cfg: RunConfig) -> str:
    """The base model's name: its local checkpoint folder, or the architecture built from the seed
    (and warm-started, when the run did)."""
    arch = f"{cfg.policy.dit.preset} QwenImageTransformer2DModel" if cfg.policy.kind == "dit" \
        else "tiny Qwen2ForCausalLM"
    name = cfg.policy.pretrained_path or f"{arch}, random weights (seed {cfg.seed})"
    if cfg.warm_start.steps:
        name += f", warm-started for {cfg.warm_start.steps} supervised steps on synthetic data"
    return name


_BUCKET_IMPORT = "from cloud.model_cache import model_folder  # a bucket's folder, downloaded once\n"


def _named(path: str) -> tuple[str, str]:
    """(an import line or "", the Python expression a snippet loads model source `path` by): a folder
    or Hub id as a string; a bucket folder, which no `from_pretrained` reads, through Spotlight's cache."""
    if path.startswith(("s3://", "gs://")):
        return _BUCKET_IMPORT, f'model_folder("{path}")'
    return "", f'"{path}"'


def _local(path: str) -> Path | None:
    """Where model source `path` is on this machine, if it is (a bucket folder: its cached copy)."""
    return cached_folder(path) if path.startswith(("s3://", "gs://")) else Path(path)


def _loading(cfg: RunConfig) -> str:
    lora = cfg.policy.lora.enabled
    if cfg.policy.kind == "dit":
        if not lora:
            return ("from diffusers import QwenImageTransformer2DModel\n"
                    "transformer = QwenImageTransformer2DModel.from_pretrained(\"final\")")
        path = cfg.policy.pretrained_path if not cfg.warm_start.steps else None  # else final/ holds the base
        imported, named = _named(path) if path else ("", "")
        if path and cfg.policy.dit.pipeline:
            return (imported + "from diffusers import QwenImagePipeline\n"
                    f"pipe = QwenImagePipeline.from_pretrained({named})\n"
                    "pipe.load_lora_weights(\"final\")  # pytorch_lora_weights.safetensors")
        local = _local(path) if path else None
        sub = ', subfolder="transformer"' if local is not None and (local / "transformer").is_dir() else ""
        base = f'{named}{sub}' if path else '"final/transformer"'
        return (imported + "from diffusers import QwenImagePipeline, QwenImageTransformer2DModel\n"
                f"transformer = QwenImageTransformer2DModel.from_pretrained({base})\n"
                "pipe = QwenImagePipeline(..., transformer=transformer)  # or QwenImagePipeline.from_pretrained(base)\n"
                "pipe.load_lora_weights(\"final\")  # pytorch_lora_weights.safetensors")
    if not lora:
        return ("from transformers import AutoModelForCausalLM, AutoTokenizer\n"
                "model = AutoModelForCausalLM.from_pretrained(\"final\")\n"
                "tokenizer = AutoTokenizer.from_pretrained(\"final\")")
    path = cfg.policy.pretrained_path if cfg.policy.pretrained_path and not cfg.warm_start.steps else "final/base"
    imported, base = _named(path)
    return (imported + "from peft import PeftModel\n"
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
            f"model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained({base}), \"final\")\n"
            "tokenizer = AutoTokenizer.from_pretrained(\"final\")")


def model_card(cfg: RunConfig, iterations: int) -> str:
    """The card of a policy trained for `iterations` GRPO iterations with `cfg`."""
    lora = cfg.policy.lora
    library = "peft" if lora.enabled and cfg.policy.kind == "llm" else \
        "diffusers" if cfg.policy.kind == "dit" else "transformers"
    front = {"library_name": library, "tags": ["spotlight", "grpo", "reinforcement-learning"]
             + (["lora"] if lora.enabled else [])}
    if cfg.policy.pretrained_path:  # the Hub reads base_model as a model's name; a random base has none
        front["base_model"] = Path(cfg.policy.pretrained_path).name
    if lora.enabled:
        what = (f"LoRA adapters (rank {lora.rank}, alpha {lora.lora_alpha:g}) on "
                f"{', '.join(cfg.policy.lora_targets)}; the base model is frozen")
    else:
        what = "every parameter trained"
    algorithm = "Flow-GRPO" if cfg.policy.kind == "dit" else "token-level GRPO"
    return "\n".join([
        "---", yaml.safe_dump(front, sort_keys=False).strip(), "---", "",
        f"# {cfg.policy.kind.upper()} policy trained with Spotlight", "",
        f"- Base model: {base_model(cfg)}",
        f"- Training: {algorithm}, {iterations} iterations of {cfg.train.prompts_per_step} prompts x "
        f"{cfg.train.group_size} samples; {what}",
        f"- Reward: {_reward(cfg)}",
        f"- Prompts: {Path(cfg.prompts.path).name if cfg.prompts.path else f'{cfg.prompts.name} ({cfg.prompts.count})'}",
        *([f"- Weights: the exponential moving average of the trained parameters (train.ema_decay "
           f"{cfg.train.ema_decay:g}), not the last iteration's"] if cfg.train.ema_decay else []),
        f"- Run seed: {cfg.seed}", "",
        "## Loading", "", "```python", _loading(cfg), "```", "",
        "## Run config", "", "The settings in effect (the run folder's config.yaml has every field).", "",
        "```yaml", yaml.safe_dump(in_effect(cfg), sort_keys=False).strip(), "```", ""])


def in_effect(cfg: RunConfig) -> dict:
    """`cfg` as a dict without the fields this run did not use, so that a reader does not take a
    default for what trained the model: the one-reward `reward.name` when `reward.components` are
    given, `reward.colour_width` without a colour reward, and the built-in set's `prompts.name`
    and `count` when `prompts.path` is a file of the user's. Read back as a config, it trains the
    same run (what is left out reads back as its default, which the run does not read either)."""
    d = cfg.to_dict()
    if cfg.reward.components:
        del d["reward"]["name"]
    if not any(t.name == "colour" for t in cfg.reward.terms):
        del d["reward"]["colour_width"]
    if cfg.prompts.path:
        del d["prompts"]["name"], d["prompts"]["count"]
    return d


def _reward(cfg: RunConfig) -> str:
    """The reward as a sum of its weighted components ("ocr", "0.5 x ocr + 1 x score")."""
    terms = cfg.reward.terms
    if len(terms) == 1 and terms[0].weight == 1:
        return spec(terms[0])
    return " + ".join(f"{t.weight:g} x {spec(t)}" for t in terms)


def write_model_card(path: Path, cfg: RunConfig, iterations: int) -> None:
    Path(path).mkdir(parents=True, exist_ok=True)
    (Path(path) / "README.md").write_text(model_card(cfg, iterations))
