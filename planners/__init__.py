"""Seed exploration on stale weights (docs/design.md, idea 1): seed pools (`seed_pool`),
variance-maximising seed selection (`selection`), the exploration planners (`allocation`) and the
stale-rank health monitor (`stale_rank`)."""
