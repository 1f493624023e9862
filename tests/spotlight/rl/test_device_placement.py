"""Every tensor of a DiT rollout and update sits on the policy's device, checked without a GPU: the
policy runs on torch's meta device, which refuses to mix its tensors with CPU ones as CUDA does
("Tensor on device cpu is not on the expected device meta!"). Issue 39, item 3: the first version
of this test found the sampler handing the transformer its timestep on the CPU, which would have
stopped the first rollout on a GPU. Covered: the SDE rollout with true CFG, its decode, the ODE
exploration sampler, the update with a KL reference and with LoRA adapters; the update's stats are
the one place that reads the device (one transfer, not one per stat)."""

from __future__ import annotations

import pytest
import torch

from conftest import small_dit_config
from spotlight.rl.prompts import Prompt


def _on_meta(**over):
    from spotlight.rl.dit_policy import DiTPolicy

    cfg = small_dit_config(train={"group_size": 2, "micro_batch": 3}, sampler={"num_steps": 3, "guidance": 2.0},
                           **over)
    policy = DiTPolicy.from_config(cfg)
    if cfg.grpo.kl_beta > 0:
        policy.set_reference()
    explorer = policy.for_exploration(2, ode=True)  # made first: a config made now would refuse meta
    for model in (policy.model, policy.ref_model):
        if model is not None:
            model.to("meta")
    for view in (policy, explorer):
        object.__setattr__(view.cfg, "device", "meta")  # the config refuses it: a test device, not a user's
    return policy, explorer


@pytest.mark.parametrize("over", [{"grpo": {"kl_beta": 0.01}}, {"policy": {"lora": {"rank": 4, "alpha": 8}}}],
                         ids=["kl-reference", "lora"])
def test_a_rollout_and_an_update_keep_every_tensor_on_the_policys_device(over):
    policy, explorer = _on_meta(**over)
    prompts = [Prompt(0, "a red image")] * 2
    state = policy.advance(prompts, policy.init_state(prompts, [1, 2]))
    assert state.trajectory.device.type == state.log_probs.device.type == "meta"
    rollout = policy.finish(prompts, state)
    assert rollout.images.device.type == "meta" and set(rollout.seconds) == {"encode", "decode"}
    assert explorer.advance(prompts, explorer.init_state(prompts, [3, 4])).latest.device.type == "meta"
    with pytest.raises(NotImplementedError, match="^Cannot copy out of meta tensor"):  # the stats, at the end
        policy.backward_part(rollout, torch.tensor([1.0, -1.0]), 0)
    grads = [p.grad for p in policy.model.parameters() if p.grad is not None]
    assert grads and all(g.device.type == "meta" for g in grads)
