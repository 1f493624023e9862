"""A policy's model sharded over a learner group with FSDP2 (issue 40): each transformer block of
a DiT (each decoder layer of an LLM) is its own `fully_shard` unit, then the root, so a rank holds
1/N of every parameter, gradient and Adam moment and gathers one block's parameters at a time.

Mixed precision as verl-omni and flow_grpo's FSDP setups have it: the sharded parameters — the
optimiser's master copy — are float32; a forward computes in the model's dtype
(`dit_model.model_dtype`: bfloat16 for qwen-image, float32 for the tiny models, where it is no
cast at all) and gradients are reduced in float32. Gradients are summed over the ranks, not
averaged (`set_gradient_divide_factor(1)`): every rank's micro-batches are parts of one loss that
is already normalised by the whole update's size (`Policy.backward_part`).
"""

from __future__ import annotations

import torch


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks FSDP shards one by one: a Qwen-Image transformer's `transformer_blocks`,
    a causal LM's `model.layers`."""
    if hasattr(model, "transformer_blocks"):
        return list(model.transformer_blocks)
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has neither transformer_blocks nor model.layers to shard")
    return list(layers)


def shard(model: torch.nn.Module, mesh, compute_dtype: torch.dtype) -> torch.nn.Module:
    """`model` sharded in place over device mesh `mesh` (module docstring); returns it."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = (MixedPrecisionPolicy() if compute_dtype == torch.float32 else
              MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32))
    model.float()
    units = blocks(model)
    for block in units:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    for unit in (*units, model):
        unit.set_gradient_divide_factor(1.0)
        # A plain SUM then (NCCL's pre-multiplied sum is what it would use otherwise; gloo has none).
        unit.set_force_sum_reduction_for_comms(True)
    return model
