"""Ulysses sequence-parallel attention on torch.distributed, SP group membership and in-place
regrouping, the per-node agent and intra-node weight copy (DESIGN.md, idea 2). Nothing is
implemented here yet."""
