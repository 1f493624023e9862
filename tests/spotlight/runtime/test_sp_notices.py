"""Preemption notices reach SP groups (`runtime.sp_degree` > 1): each node's agent watches
`runtime.notice_sources` on its node, and a notice it sees is handled as a drain of the node
(`elastic_sp.fleet_executor.SPExecutor`); `spotlight launch` sets notice sources for SP runs too."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from schedulers.preemption import Cause
from test_sp_train import assert_same_weights, config, mid_request, train


def test_launch_sets_notice_sources_for_an_sp_run() -> None:
    from spotlight.launch_config import for_the_cloud

    cfg, changes = for_the_cloud(config(sp_degree=2), "s3://fleet-bucket/runs/sp")
    assert cfg.runtime.notice_sources == ["aws", "gcp", "sigterm"] and cfg.runtime.sp_degree == 2
    assert "runtime.notice_sources: [] -> [aws, gcp, sigterm]" in changes


@pytest.mark.slow
def test_a_sigterm_on_a_node_mid_request_is_a_notice_the_groups_act_on(tmp_path) -> None:
    """SIGTERM to spot1's agent (what a preempted VM's shutdown sends every process) while its group
    is mid-request: the group gives the request back at its committed step, spot0's member re-forms
    alone and serves on, and the run ends with the weights of the undisturbed run, nothing lost or
    computed twice."""
    noticed: list[tuple[str, int]] = []

    def during(runtime: Any) -> None:
        deadline = time.monotonic() + 300
        while not hasattr(runtime, "executor") and time.monotonic() < deadline:
            time.sleep(0.01)
        coord = runtime.executor.coord
        while time.monotonic() < deadline:
            g = mid_request(coord)
            if g is not None:
                node = coord.members[g.members[1]].node
                os.kill(coord.agents[node].where["pid"], signal.SIGTERM)
                noticed.append((node, g.committed.step))
                for m in g.members:  # mid_request froze them
                    os.kill(coord.members[m].pid, signal.SIGCONT)
                return
            time.sleep(0.002)

    cfg = config(sp_degree=2, notice_sources=["sigterm"], notice_poll_s=0.05)
    summary, weights, runtime = train(tmp_path / "notice", cfg, during)
    assert len(noticed) == 1, "no group was caught mid-request"
    (node, _), coord = noticed[0], runtime.executor.coord
    assert coord.agents[node].notice.cause is Cause.SIGTERM
    # The noticed node's member was retired (stopped, not lost); the other re-formed alone.
    assert [h.alive for h in coord.members.values() if h.node == node] == [False]
    assert [g.degree for g in coord.groups.values()] == [1]
    assert summary["sp_regroups"] >= 1 and summary["requests_resumed"] >= 1
    assert summary["requests_lost"] == summary["requests_duplicated"] == summary["workers_lost"] == 0
    _, undisturbed, _ = train(tmp_path / "plain", config(sp_degree=2))
    assert_same_weights(weights, undisturbed)
