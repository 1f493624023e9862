"""The bytes one GRPO iteration moves between machines, and the seconds they take over the links.

With the update on the fleet (`train.update_on: fleet`) an iteration moves, besides the rollout's
trajectories:
1. **the weight publication**, learner -> every rollout worker, once per iteration: what training
   changes (`spotlight.rl.lora.trained_state`), every weight in the model's dtype, or with LoRA the
   adapters alone in float32 (`add_lora` keeps them in float32 over a bfloat16 base);
2. **the gradients**, worker -> queue actor -> learner, one per `Kind.TRAIN` request: the sum of
   the request's `train.parts_per_request` (k) micro-batches, summed on the worker before it
   leaves the node, so as large as one micro-batch's — the gradient of every trainable parameter
   the backward reaches, in that parameter's dtype (`spotlight.rl.gradient.part_gradient` leaves
   out the ones it does not reach: the last block's text stream after its attention, which nothing
   reads, `DiTShape.unreached`); the learner's ingress per round of the update is
   ceil(parts / k) requests x that.

Counts are exact for the Qwen-Image transformer family (diffusers' `QwenImageTransformer2DModel`),
derived from its config dict (`DiTShape.from_arch`) and the LoRA rank on the default targets
(`spotlight.config.DIT_LORA_TARGETS`). Qwen-Image (60 blocks, 24 heads of 128, text 3,584):
20,430,401,088 parameters = 40.9 GB in bfloat16; rank-64 adapters 424,673,280 = 1.70 GB in float32
(`spotlight bench lora`'s "1.7 GB at rank 64"). Both are checked against the module built on the
meta device, and the live runtime's byte counters against this module
(tests/spotlight/sim/test_transfer_bytes.py).

Seconds are bytes over link figures that are ASSUMPTIONS, each docstring naming its source; no
link has been measured by this project (the loopback cluster moves bytes through memory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spotlight.config import DIT_LORA_TARGETS
from spotlight.dit_presets import QWEN_IMAGE_TRANSFORMER, TINY_TRANSFORMER

GB = 1e9
"""Bytes in a (decimal) gigabyte: link speeds are decimal, so byte counts are too."""
GIB = 2**30
"""Bytes in a GiB: GPU memory (NVIDIA's "80GB" H100 is 80 GiB of HBM3)."""

# -- link figures (assumptions, in Gbit/s) ----------------------------------------------------------

NODE_GBPS = 100.0
"""What one GPU node's traffic outside NCCL gets, in Gbit/s — Ray's object transfers (weights,
gradients) are TCP on the node's primary interface, not the GPU fabric. ASSUMPTION from data
sheets: AWS p5.48xlarge has 3,200 Gbit/s of EFA over 32 network cards, 100 Gbit/s each, and the
primary ENA interface is one card; GCP a3-highgpu-8g has 200 Gbit/s on its host NIC beside 4 x 200
Gbit/s of GPUDirect-TCPX for NCCL only. 100 takes the smaller."""
LEARNER_GBPS = 100.0
"""The learner's ingress in Gbit/s: every gradient part lands on the learner's node (the queue actor
and the learner are pinned there), through that node's primary interface: as `NODE_GBPS` (an
on-demand node of the same kind). ASSUMPTION."""
CROSS_ZONE_FACTOR = 0.5
"""The fraction of a link's bandwidth that a transfer between the learner's node and a spot node
gets. ASSUMPTION: a spot fleet gathers capacity across zones and never shares the learner's cluster
placement group, and AWS caps a TCP flow between instances at 5 Gbit/s outside one placement group
against 10 Gbit/s inside (EC2 User Guide, "Amazon EC2 instance network bandwidth"); Ray moves an
object between two nodes over a handful of flows, so half of what the same transfer gets inside a
placement group. Cross-zone latency (~1 ms against ~0.1 ms inside one) costs TCP more of the same.
It caps one transfer: several at once into the learner (a fleet update's gradients arriving
together) share its full link — multi-flow traffic within a Region "can utilize the full network
bandwidth available to the instance" (the same page) — `StepTimes.gradient_transfer_s(queued=True)`."""
LOAD_GBPS = 200.0
"""Host memory to GPU when a worker loads published weights, in Gbit/s (25 GB/s). ASSUMPTION:
PCIe Gen5 x16 carries 64 GB/s per direction (PCI-SIG); torch's copies from pageable memory reach
about 40% of that."""
GROUP_GBPS = 2880.0
"""What a learner group's collectives get between the GPUs of its node, in Gbit/s of NCCL bus
bandwidth per GPU (360 GB/s). ASSUMPTION: an H100 SXM's NVLink 4 carries 450 GB/s per direction
(18 links of 25 GB/s, NVIDIA's H100 data sheet: 900 GB/s bidirectional) and NCCL's ring
all-gather / reduce-scatter reach about 80% of it at hundreds of MB a message. The runtime's
group lives on one node (`spotlight.runtime.learner_group`), so no inter-node link is modelled."""
LEARNER_STEP_S = 1.0
"""The learner's sum of the parts, clip and optimiser step, and the hand-off to the publication,
in seconds, besides receiving the parts. ASSUMPTION: an Adam step over 0.42B float32 adapters is
milliseconds on a GPU; the rest is Ray's calls per round."""


@dataclass(frozen=True)
class DiTShape:
    """A Qwen-Image-family transformer's shape (diffusers' `QwenImageTransformer2DModel` arguments),
    enough to count its parameters and its LoRA adapters."""

    layers: int
    heads: int
    head_dim: int
    in_channels: int
    out_channels: int
    patch_size: int
    text_dim: int
    """`joint_attention_dim`: the text encoder's hidden size (Qwen2.5-VL-7B: 3,584)."""

    @classmethod
    def from_arch(cls, arch: dict[str, Any]) -> DiTShape:
        """From the transformer's config dict (`spotlight.rl.dit_model.transformer_arch`)."""
        return cls(layers=arch["num_layers"], heads=arch["num_attention_heads"], head_dim=arch["attention_head_dim"],
                   in_channels=arch["in_channels"], out_channels=arch.get("out_channels") or arch["in_channels"],
                   patch_size=arch["patch_size"], text_dim=arch["joint_attention_dim"])

    @property
    def hidden(self) -> int:
        """The model width D = heads x head_dim (Qwen-Image: 3,072)."""
        return self.heads * self.head_dim

    def block_linears(self) -> dict[str, tuple[int, int]]:
        """Each linear layer of one transformer block, by the name a LoRA target gives it, as
        (in_features, out_features): the image and text streams' attention projections (the text
        stream's are `add_*`) and their 4x GELU MLPs; the modulations (`img_mod.1`, `txt_mod.1`)
        are linears too, but not default targets."""
        d = self.hidden
        square = {name: (d, d) for name in ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj",
                                             "add_v_proj", "to_add_out")}
        mlp = {f"{stream}_mlp.net.0.proj": (d, 4 * d) for stream in ("img", "txt")}
        mlp.update({f"{stream}_mlp.net.2": (4 * d, d) for stream in ("img", "txt")})
        mod = {f"{stream}_mod.1": (d, 6 * d) for stream in ("img", "txt")}
        return {**square, **mlp, **mod}

    def params(self) -> int:
        """Every parameter of the model (Qwen-Image: 20,430,401,088). Per block: the block's linears
        with their biases and the attention's four RMSNorms of head_dim (q, k and the text stream's
        q, k); outside: the timestep MLP (256 -> D -> D), the text RMSNorm, the image and text
        input projections, the output AdaLayerNorm's linear (D -> 2D) and the output projection."""
        d, out = self.hidden, self.patch_size ** 2 * self.out_channels
        block = sum(i * o + o for i, o in self.block_linears().values()) + 4 * self.head_dim
        outside = ((256 * d + d) + (d * d + d) + self.text_dim + (self.in_channels * d + d)
                   + (self.text_dim * d + d) + (d * 2 * d + 2 * d) + (d * out + out))
        return self.layers * block + outside

    def adapter_params(self, rank: int, targets: tuple[str, ...] | list[str] = DIT_LORA_TARGETS) -> int:
        """Parameters of LoRA adapters of `rank` on `targets` (peft: A is rank x in, B out x rank,
        no bias) in every block (Qwen-Image at rank 64 on the defaults: 424,673,280). A target that
        names no linear of a block is a ValueError."""
        linears = self.block_linears()
        unknown = [t for t in targets if t not in linears]
        if unknown:
            raise ValueError(f"LoRA targets {unknown} name no linear of a Qwen-Image block (expected some of "
                             f"{', '.join(linears)})")
        return self.layers * sum(rank * (linears[t][0] + linears[t][1]) for t in targets)

    def trained_params(self, rank: int, targets: tuple[str, ...] | list[str] = DIT_LORA_TARGETS) -> int:
        """What the optimiser steps: the adapters with LoRA (rank > 0), else every parameter."""
        return self.adapter_params(rank, targets) if rank > 0 else self.params()

    def unreached(self, rank: int, targets: tuple[str, ...] | list[str] = DIT_LORA_TARGETS) -> int:
        """Trained parameters no gradient reaches: the model's output reads the image stream alone,
        so the last block's text stream after its attention (`to_add_out` and the text MLP) feeds
        nothing, and the backward leaves them without a gradient (found by the live counters:
        tests/spotlight/sim/test_transfer_bytes.py). Qwen-Image: 84,953,088 parameters (0.4%); at rank 64,
        2,359,296 adapter parameters (0.6%)."""
        linears = self.block_linears()
        tail = ("to_add_out", "txt_mlp.net.0.proj", "txt_mlp.net.2")
        if rank > 0:
            return sum(rank * (linears[t][0] + linears[t][1]) for t in tail if t in targets)
        return sum(linears[t][0] * linears[t][1] + linears[t][1] for t in tail)

    def gradient_params(self, rank: int, targets: tuple[str, ...] | list[str] = DIT_LORA_TARGETS) -> int:
        """The trained parameters a gradient part carries: all but the `unreached` ones."""
        return self.trained_params(rank, targets) - self.unreached(rank, targets)


ARCHITECTURES = {"qwen-image": DiTShape.from_arch(QWEN_IMAGE_TRANSFORMER), "tiny": DiTShape.from_arch(TINY_TRANSFORMER)}
"""The shapes the step-time model knows by name (`StepTimes.model`): the released Qwen-Image
transformer and the tiny CPU DiT."""


# -- bytes -----------------------------------------------------------------------------------------

def publication_bytes(shape: DiTShape, rank: int, weight_bytes: int = 2, adapter_bytes: int = 4) -> int:
    """Bytes of one weight publication (`Learner.weights()`): every parameter at `weight_bytes` each
    (bf16: 2), or with LoRA (rank > 0) the adapters alone at `adapter_bytes` each (float32: 4).
    Qwen-Image: 40.86 GB full, 1.70 GB at rank 64."""
    return shape.adapter_params(rank) * adapter_bytes if rank > 0 else shape.params() * weight_bytes


def part_bytes(shape: DiTShape, rank: int, weight_bytes: int = 2, adapter_bytes: int = 4) -> int:
    """Bytes of one gradient part (a TRAIN request's result): the gradient of every trainable
    parameter the backward reaches (`DiTShape.gradient_params`), in its parameter's dtype.
    Qwen-Image: 40.69 GB full, 1.69 GB at rank 64."""
    return shape.gradient_params(rank) * (adapter_bytes if rank > 0 else weight_bytes)


def requests(parts: int, per_request: int = 1) -> int:
    """`Kind.TRAIN` requests per round of the update: `parts` micro-batches, `per_request` summed in
    each (`train.parts_per_request`; `schedulers.update.chunks`): ceil(parts / per_request)."""
    if parts < 1 or per_request < 1:
        raise ValueError(f"an update round needs parts >= 1 and per_request >= 1, got {parts} and {per_request}")
    return -(-parts // per_request)


def ingress_bytes(parts: int, part: int, per_request: int = 1) -> int:
    """Bytes the learner receives per round of the update: one gradient of `part` bytes per
    request (`requests`: the live runtime sends each request's sum of `per_request` micro-batches;
    nothing more is summed on the way)."""
    return requests(parts, per_request) * part


def group_pass_bytes(shape: DiTShape, n: int, weight_bytes: int = 2, reduce_bytes: int = 4) -> int:
    """Bytes one rank of a learner group of `n` moves per micro-batch pass of a full fine-tune
    (`spotlight.rl.sharding`: FSDP2 per block, resharded after the forward): every parameter
    all-gathered in the compute dtype for the forward and again for the backward, and every
    gradient reduce-scattered in float32 — each a ring collective in which a rank sends and receives
    (n - 1) / n of the whole. 0 for one learner (no collective). Qwen-Image, n = 8: 143.0 GB."""
    if n < 1:
        raise ValueError(f"a learner group needs n >= 1, got {n}")
    return (n - 1) * shape.params() * (2 * weight_bytes + reduce_bytes) // n


# -- seconds ---------------------------------------------------------------------------------------

def transfer_s(nbytes: float, gbps: float, factor: float = 1.0) -> float:
    """Seconds to move `nbytes` bytes over a link of `gbps` Gbit/s at `factor` of its bandwidth."""
    if gbps <= 0 or factor <= 0:
        raise ValueError(f"a link needs gbps > 0 and factor > 0, got {gbps} and {factor}")
    return nbytes * 8 / (gbps * 1e9 * factor)


def publication_s(nbytes: float, node_gbps: float = NODE_GBPS, learner_gbps: float = LEARNER_GBPS,
                  cross_zone: float = CROSS_ZONE_FACTOR, load_gbps: float = LOAD_GBPS) -> float:
    """Seconds from a publication leaving the learner to every worker holding it: one transfer at the
    slower of the learner's and a node's link across zones — Ray pulls an object from any node that
    holds a copy, so a fleet of any size fills in a pipelined tree, each node receiving the bytes
    once — then the worker's load into its GPU. Qwen-Image at the defaults: 8.2 s full, 0.34 s at
    rank 64."""
    return transfer_s(nbytes, min(node_gbps, learner_gbps), cross_zone) + transfer_s(nbytes, load_gbps)


def gather_s(nbytes: float, learner_gbps: float = LEARNER_GBPS, cross_zone: float = CROSS_ZONE_FACTOR,
             step_s: float = LEARNER_STEP_S) -> float:
    """Seconds of the learner's gather-and-step in one round (what `StepTimes.update_round_s` stands
    for): its ingress of `nbytes` across zones — every part converges on its one node — plus the
    sum and the optimiser step. The gradients of on-demand workers in the learner's zone are charged
    the cross-zone rate too (an upper bound). Qwen-Image at 32 requests: 209 s full, 9.6 s at rank 64."""
    return transfer_s(nbytes, learner_gbps, cross_zone) + step_s

