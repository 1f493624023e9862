"""`policy.lora.target_modules` checked before a run builds anything: on the policy's model as its
build makes it, without weights (`torch.device("meta")`). Its own module, beside `spotlight.rl.lora`,
because building that skeleton needs the policies' model builders, which import `lora` themselves."""

from __future__ import annotations

import torch

from spotlight.config import RunConfig
from spotlight.rl.lora import check_names


def check_targets(cfg: RunConfig) -> None:
    """What `add_lora` would refuse, said before a run builds anything (its warm start alone takes
    a minute on a CPU): ConfigError naming `policy.lora.target_modules` unless each name in it
    names a layer of the policy's model. Checked on the model's skeleton, built on the meta device
    (no weights, no memory; milliseconds once torch is imported). The defaults are not checked
    (not every model has every default target). A skeleton that cannot be built here (a folder
    transformers cannot read) is left to the real build, which says what is wrong with it."""
    if not (cfg.policy.lora.enabled and cfg.policy.lora.target_modules):
        return
    try:
        with torch.device("meta"):
            model = _skeleton(cfg)
    except Exception:  # noqa: BLE001 - the real build reports a model it cannot build, in its own words
        return
    check_names(model, cfg)


def _skeleton(cfg: RunConfig) -> torch.nn.Module:
    """The policy's model as its build makes it, without weights (call inside `torch.device("meta")`)."""
    if cfg.policy.kind == "dit":
        from diffusers import QwenImageTransformer2DModel

        from spotlight.rl.dit_model import transformer_arch

        return QwenImageTransformer2DModel(**transformer_arch(cfg.policy.dit))
    llm = cfg.policy.llm
    if llm.pretrained_path:
        from transformers import AutoConfig, AutoModelForCausalLM

        from cloud.model_cache import model_folder

        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_folder(llm.pretrained_path),
                                                                           local_files_only=True))
    from transformers import Qwen2ForCausalLM

    from spotlight.rl.char_tokenizer import build_char_tokenizer
    from spotlight.rl.llm_policy import tiny_qwen2_config

    return Qwen2ForCausalLM(tiny_qwen2_config(llm, build_char_tokenizer()))
