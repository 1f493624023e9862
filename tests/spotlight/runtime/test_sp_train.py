"""Elastic SP groups inside `spotlight train` on Ray (`spotlight.runtime.ray_sp`, `elastic_sp.ray_agent`).

- The node agent's host applies the coordinator's numbered commands in their order, whatever order
  they arrive in, and publishes new weights to its members (no Ray: the plain class).
- A tiny-DiT run with `runtime.sp_degree: 2` on a local Ray cluster (rollouts, exploration with its
  own sampler, weights published after every update) ends with the weights of the same run at
  sp_degree 1, bit for bit: the tiny DiT's 64 image tokens and 2 heads divide by the degree, so
  Ulysses is exact, and a group commits what a `RolloutWorker` commits.
- On a real multi-node Ray cluster (loopback addresses, nodes advertising `spot: 2`): a member
  SIGKILLed mid-request — its group is dissolved, the request goes back at its committed step, the
  survivor re-forms in place (no process restarts), and the run still ends with the sp_degree-1
  weights; then the same with a whole node SIGKILLed (its agent actor's death is every member's loss).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from safetensors.torch import load_file

from conftest import small_dit_config
from schedulers.request import Kind
from spotlight.config import RunConfig

RUN = {
    "train": {"steps": 3, "prompts_per_step": 2, "group_size": 4, "checkpoint_every": 3},
    "sampler": {"num_steps": 8},
    # Sample-bounded (deterministic) exploration with fewer steps than the rollout: SP groups sample
    # it with the exploration sampler, before the first rollout and during every update.
    "exploration": {"enabled": True, "samples_per_step": 8, "request_size": 4, "round_samples": 8,
                    "candidates_per_prompt": 8, "num_steps": 4},
}


def config(**runtime: Any) -> RunConfig:
    return small_dit_config(**RUN, runtime={"kind": "ray", "spot_workers": 2, "ondemand_workers": 0, **runtime})


def train(out: Path, cfg: RunConfig, during: Callable[[Any], None] | None = None) -> tuple[dict, dict, Any]:
    """Run `cfg` to its end; `during(runtime)` runs in a thread meanwhile. Returns the summary,
    the final weights and the runtime."""
    from spotlight.runtime.ray_runtime import RayRuntime
    from spotlight.train.trainer import Trainer

    runtime = RayRuntime(cfg)
    thread = None
    if during is not None:
        thread = threading.Thread(target=during, args=(runtime,), daemon=True)
        thread.start()
    summary = Trainer(cfg, out, progress=False).build(runtime).train()
    if thread is not None:
        thread.join(5.0)
    (weights,) = (out / "final").glob("*.safetensors")
    return summary, load_file(str(weights)), runtime


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[dict, dict]:
    """The run at sp_degree 1 (rollout worker actors) on a local cluster: its summary and weights."""
    summary, weights, _ = train(tmp_path_factory.mktemp("sp1") / "run", config())
    assert summary["requests_completed"] > 3 * 2  # the rollouts, and exploration requests
    return summary, weights


# ---- the agent host, without Ray -----------------------------------------------------------------


def test_the_agent_host_applies_commands_in_their_order_and_publishes_weights() -> None:
    from elastic_sp import protocol as P
    from elastic_sp.agent import Lost
    from elastic_sp.ray_agent import AgentHost
    from elastic_sp.weights import digest
    from spotlight.rl.sp_member import serve_spec

    spec = serve_spec(config())
    v0 = spec.build_model().state_dict()
    v1 = {k: v + 1 for k, v in v0.items()}
    host = AgentHost("node0", spec, v0, version=0)
    host.build()
    got: list[tuple[str, Any]] = []

    def until(done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 120
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {got}"
            got.extend(host.reports(0.5))

    try:
        pid, device, _ = host.call(0, "spawn", "m0", "node", None, None)
        assert device == "cpu"
        until(lambda: any(isinstance(m, P.Ready) for _, m in got), "the member to start")
        assert next(m for _, m in got if isinstance(m, P.Ready)).source == "node"
        # Numbered 2 and 1, posted in that order: the host publishes (1) before it asks (2).
        host.command(2, "send", "m0", P.Digest())
        host.command(1, "publish", 1, v1)
        until(lambda: any(isinstance(m, P.Digested) for _, m in got), "the digest")
        assert next(m for _, m in got if isinstance(m, P.Digested)).digest == digest(v1) != digest(v0)
        assert host.agent.weights.version == 1  # the node's live copy is the new version
        with pytest.raises(ValueError, match="already running"):
            host.call(3, "spawn", "m0", "node", None, None)
        host.command(4, "kill", "m0")
        until(lambda: any(isinstance(m, Lost) for _, m in got), "the member's loss")
        assert [n for n, m in got if isinstance(m, Lost)] == ["m0"]
    finally:
        host.call(5, "close")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_run_sp_groups_cannot_serve_is_refused_in_one_line() -> None:
    from conftest import small_llm_config
    from spotlight.config import ConfigError
    from spotlight.runtime.ray_sp import check_sp

    check_sp(config(sp_degree=2))  # the tiny DiT's 2 heads split over 2
    cases = [
        (config(sp_degree=4), "runtime.sp_degree: SP degree 4 exceeds the model's 2 attention heads"),
        (small_llm_config(runtime={"kind": "ray", "sp_degree": 2}), "runtime.sp_degree: sequence parallelism serves "
                                                                     "the DiT policy, not policy.kind 'llm'"),
    ]
    for cfg, start in cases:
        with pytest.raises(ConfigError) as err:
            check_sp(cfg)
        assert str(err.value).startswith(start) and "\n" not in str(err.value), str(err.value)


# ---- training runs ------------------------------------------------------------------------------


@pytest.mark.slow
def test_sp_degree_2_trains_to_the_weights_of_sp_degree_1(tmp_path, reference) -> None:
    summary, weights, runtime = train(tmp_path / "sp2", config(sp_degree=2))
    assert_same_weights(weights, reference[1])
    assert summary["requests_completed"] == reference[0]["requests_completed"]
    assert summary["requests_duplicated"] == summary["requests_lost"] == 0
    coord = runtime.executor.coord
    # spot0 and spot1 (one device each) were served by one group of both.
    assert [g.degree for g in coord.groups.values()] == [2]
    assert all(h.source == "node" for h in coord.members.values())
    assert set(runtime.executor.stats()) == {"sp_regroups", "sp_regroup_s"}


@pytest.mark.slow
def test_a_lora_run_at_sp_degree_2_ends_with_the_adapters_of_sp_degree_1(tmp_path) -> None:
    """LoRA in SP groups: each node starts from the learner's whole model, then every publish
    carries the adapters alone (a partial publish the node agents merge)."""
    from spotlight.train.trainer import Trainer

    lora = {"lora": {"rank": 4, "alpha": 8}}
    # The degree-1 reference in one process (the local runtime ends with the Ray runtime's weights).
    Trainer(small_dit_config(**RUN, policy=lora), tmp_path / "sp1", progress=False).build().train()
    one = load_file(str(tmp_path / "sp1" / "final" / "pytorch_lora_weights.safetensors"))
    summary, two, run = train(tmp_path / "sp2", small_dit_config(
        **RUN, policy=lora, runtime={"kind": "ray", "spot_workers": 2, "ondemand_workers": 0, "sp_degree": 2}))
    assert all("lora_" in k for k in two) and any(float(v.abs().sum()) > 0 for k, v in two.items() if "lora_B" in k)
    assert_same_weights(two, one)
    assert [g.degree for g in run.executor.coord.groups.values()] == [2]
    assert summary["requests_duplicated"] == summary["requests_lost"] == 0


def mid_request(coord: Any, on: Callable[[Any], bool] = lambda g: True) -> Any:
    """A degree-2 group (`on` it) computing a rollout request it has committed a step of, frozen
    (its members SIGSTOPped) and checked to hold it still with steps left once the coordinator has
    caught up with what they had sent (`settled`), so a kill lands mid-request; else None (and
    nothing frozen)."""
    try:
        g = next((g for g in list(coord.groups.values()) if g.degree == 2 and g.lease is not None
                  and g.lease.request.kind is Kind.ROLLOUT and g.committed is not None and g.committed.step >= 1
                  and on(g)), None)
    except RuntimeError:  # the coordinator changed the dict while we looked: look again
        return None
    lease = g.lease if g is not None else None
    if lease is None:
        return None
    rid, pids = lease.request.id, [coord.members[m].pid for m in g.members]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    settled(coord, g)
    lease, committed = g.lease, g.committed
    if (coord.groups.get(g.name) is g and lease is not None and lease.request.id == rid and committed is not None
            and committed.step < coord.spec.num_steps):
        return g
    for pid in pids:
        os.kill(pid, signal.SIGCONT)
    return None


def settled(coord: Any, g: Any, quiet_s: float = 1.0, limit_s: float = 10.0) -> None:
    """Wait until frozen group `g`'s progress, as the coordinator sees it, has not moved for `quiet_s`:
    the reports its members sent before they froze have been taken in (the coordinator commits each
    step with two calls to the queue actor, which lag behind on 2 loaded cores)."""
    seen, since, deadline = None, time.monotonic(), time.monotonic() + limit_s
    while time.monotonic() < deadline:
        now = (coord.groups.get(g.name) is g, g.lease is not None, g.committed.step if g.committed else None)
        if now != seen:
            seen, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.05)


def kill_a_member_then_a_node(cluster: Any, killed: list[tuple[str, str, int]]) -> Callable[[Any], None]:
    """A `during`: SIGKILL rank 1 of a group mid-request; once its survivor has re-formed, SIGKILL
    the other node (its raylet, its agent actor, its members) while its group is mid-request."""

    def during(runtime: Any) -> None:
        deadline = time.monotonic() + 300
        while not hasattr(runtime, "executor") and time.monotonic() < deadline:
            time.sleep(0.01)
        coord = runtime.executor.coord
        runtime.executor.sp.keep_events = True  # for the failure message
        while time.monotonic() < deadline:
            if not killed and (g := mid_request(coord)) is not None:
                victim, survivor = (coord.members[m] for m in g.members[::-1])
                os.kill(victim.pid, signal.SIGKILL)
                os.kill(survivor.pid, signal.SIGCONT)
                killed.append(("member", victim.name, g.committed.step))
            elif len(killed) == 1 and coord.regroups:
                hit = coord.members[killed[0][1]].node
                g = mid_request(coord, lambda g: coord.members[g.members[0]].node != hit)
                if g is not None:
                    ip = coord.agents[coord.members[g.members[0]].node].where["ip"]
                    cluster.kill(next(n for n in cluster.nodes if n.ip == ip))
                    killed.append(("node", coord.members[g.members[0]].node, g.committed.step))
                    return
            time.sleep(0.002)

    return during


@pytest.fixture(scope="module")
def cluster():
    """A head and two nodes advertising `spot: 2` (2 SP members each), on loopback addresses (the
    tests that use it kill at most one node, the last of them)."""
    import ray

    from spotlight.bench.loopback_cluster import LoopbackCluster

    if ray.is_initialized():
        ray.shutdown()
    with LoopbackCluster() as c:
        c.add_node({"spot": 2})
        c.add_node({"spot": 2})
        yield c


@pytest.mark.slow
def test_the_sp_train_bench_reports_an_in_place_regroup_against_a_cold_restart(cluster) -> None:
    from spotlight.bench.sp_train import run_sp_train_bench

    out = run_sp_train_bench(address=cluster.address, iterations=2, prompts=4, repeats=1)
    assert out["weights_equal"] is True and out["sp_regroups"] >= 1
    assert 0 < out["detect_s"] < out["recover_s"] and out["detect_s"] < out["resume_s"]
    if out["resumed_on"] == "the survivor's new group":
        assert out["recover_s"] < out["resume_s"]
    assert 0 < out["regroup_s"] <= out["recover_s"] < out["cold_restart_s"]
    assert out["cold_restart_over_regroup"] > 1 and out["throughput_sp1_rps"] > 0 and out["throughput_sp2_rps"] > 0


def test_the_sp_train_bench_refuses_a_run_it_cannot_time() -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "spotlight.cli", "bench", "sp-train", "--iterations", "1"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "spotlight: error: --iterations: sp-train needs 2 or more (one to time, the last to lose a member in), got 1"]


@pytest.mark.slow
def test_a_member_then_a_node_killed_mid_request_on_a_cluster(tmp_path, reference, cluster) -> None:
    killed: list[tuple[str, str, int]] = []
    summary, weights, runtime = train(tmp_path / "kill", config(sp_degree=2, address=cluster.address),
                                      kill_a_member_then_a_node(cluster, killed))
    assert [k[0] for k in killed] == ["member", "node"], killed
    assert_same_weights(weights, reference[1])
    coord = runtime.executor.coord
    (_, victim, _), (_, node, _) = killed
    # Four members, one per device of the two spot nodes, each started once with its weights from
    # its node's live copy: the killed one and the dead node's are gone, none was restarted, and
    # the survivor re-formed in place (degree 1) and served on.
    assert len(coord.members) == 4 and all(h.source == "node" for h in coord.members.values())
    alive = [m for m, h in coord.members.items() if h.alive]
    assert len(alive) == 1 and coord.members[alive[0]].node == coord.members[victim].node != node
    assert runtime.executor.stats()["sp_regroups"] >= 1
    assert summary["sp_regroups"] >= 1 and summary["sp_regroup_s"] > 0  # summary.json says so too
    # Each node's agent ran on its own node.
    assert {a.where["node_id"] for a in coord.agents.values()} == {n.cluster_id for n in runtime.engine.nodes.values()
                                                                   if n.spot}
    # Both requests went back at their committed steps and were resumed; nothing lost or doubled.
    events = [(round(e.t, 3), e.kind, e.data) for e in coord.events
              if e.kind in ("lost", "dissolved", "leased", "completed", "regrouped", "killed")]
    assert summary["requests_resumed"] >= 2, ({k: v for k, v in summary.items() if "requests" in k or "steps" in k},
                                              killed, events)
    assert summary["requests_lost"] == summary["requests_duplicated"] == 0
    assert summary["requests_completed"] == reference[0]["requests_completed"]
