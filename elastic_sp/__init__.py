"""Elastic sequence parallelism: Ulysses SP groups that re-form in place when members come and go.

- `ulysses`: `apply(model, group)` / `remove(model)` — Ulysses attention for Qwen-Image, from outside.
- `group`: an SP group generation on torch.distributed (gloo on CPU, NCCL on GPU), interruptible.
- `regroup_policy`: which groups to form from what is alive (pure; the simulator calls it too).
- `weights`: a node's live weights, the intra-node copy, the network copy, the checkpoint.
- `agent`: the per-node owner of member processes and weights; `member`: one member process.
- `coordinator`: membership, in-place regrouping, serving the pull queue with SP groups.
"""

from elastic_sp.regroup_policy import check_degree
from elastic_sp.ulysses import apply, remove

__all__ = ["apply", "check_degree", "remove"]
