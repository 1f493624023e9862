"""experiments/economics_targets.py: the fleets it asks the simulator for."""

from experiments.economics_targets import spot_gpus


def test_the_targets_fleet_is_whole_nodes_a_cloud_rents():
    # 4x of 16 on-demand GPUs over the trace's nodes, as nodes of a power of two: nine zones get
    # nodes of 8 (72 GPUs), not the 7 an even spread of 64 gives; the shipped traces are unchanged.
    assert spot_gpus(64, 9) == 72
    assert [spot_gpus(64, n) for n in (32, 24, 64, 4)] == [64, 48, 64, 64]
    assert spot_gpus(64, 100) == 100  # more nodes than GPUs asked: one GPU each
