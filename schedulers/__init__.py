"""Requests with resumable state, the pull queue with priorities and leases, preemption handling
and exactly-once commit (DESIGN.md, idea 3). Nothing is implemented here yet."""
