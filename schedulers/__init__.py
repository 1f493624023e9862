"""The pull scheduler (DESIGN.md, idea 3): requests with resumable state (`request`), the pull
queue with priorities, leases and exactly-once commit (`queue`, and `queue_actor` for Ray), the
injected clock (`clock`), and preemption notices from every source as one typed event
(`preemption`)."""
