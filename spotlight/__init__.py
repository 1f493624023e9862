"""Spotlight: GRPO post-training of Qwen-Image-class DiTs and LLM policies on spot GPUs.

The core: config, policies (DiT via diffusers, LLM via transformers), the SDE sampler with
log-probs, GRPO losses, rewards, checkpoints, the iteration loop and the `spotlight` CLI.
"""

__version__ = "0.1.0"
