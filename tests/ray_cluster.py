"""A real multi-node Ray cluster on this machine, on loopback only: `spotlight.bench.loopback_cluster`
(moved there so that `spotlight bench sp-train` starts one too); re-exported for the tests."""

from spotlight.bench.loopback_cluster import HEAD_IP, ClusterNode, LoopbackCluster, descendants, free_port

__all__ = ["HEAD_IP", "ClusterNode", "LoopbackCluster", "descendants", "free_port"]
