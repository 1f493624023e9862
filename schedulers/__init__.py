"""The pull scheduler (docs/design.md, idea 3): requests and a DiT request's resumable state
(`request`, `sample_state`), the pull queue with priorities, leases and exactly-once commit
(`queue`, and `queue_actor` for Ray), the fleet engine — the one place the orchestration of a
fleet is written (`fleet`) —, the injected clock (`clock`), preemption notices from every source as
one typed event (`preemption`), preemption traces (`traces`, `trace_synth`); and, on the floor
below everything, what is read from outside, bounded and checked (`input`: user files, data read
back, config sections)."""
