"""What a run needs from a cloud: providers, stores, the codec, prices, cost and SkyPilot tasks.

Providers (`provider.py`: the `Provider` Protocol; `aws.py`, `gcp.py`, and `local.py`, a folder
plus notices replayed from a preemption trace) say where checkpoints are stored and how a node
learns it is about to be preempted (AWS IMDSv2, the GCE metadata server). Stores (`store.py`: the
`Store` Protocol, store URIs and a folder store; `aws.py`: the S3 store) hold checkpoints, with
transient failures retried under the injected clock (`retry.py`). `codec.py` turns plain data and
tensors into bytes that decode into nothing else (no pickles), for stored optimiser/RNG states,
in-flight snapshots and the elastic-SP agent's messages. `prices.csv` / `prices.py` are the GPU
price table with its sources and refreshes (EC2 spot price history, SkyPilot's catalog);
`cost.py` meters dollars and holds the budget and deadline policies (`CostControl`), with
`iteration_time.py` as the a-priori lower bound on an iteration. `sky.py` turns a run config into
SkyPilot tasks (an on-demand head, spot worker pools), validates them with SkyPilot's own
virtualenv and launches them."""
