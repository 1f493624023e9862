"""The RL core: the DiT and LLM policies (diffusers and transformers models), the Flow-GRPO SDE sampler with
log-probs, GRPO losses and advantages, rewards, prompts, seeding, warm starts."""
