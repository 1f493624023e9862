"""Seed pools, variance-maximising seed selection, the bandit exploration planner and the
stale-rank health monitor (DESIGN.md, idea 1). Nothing is implemented here yet."""
