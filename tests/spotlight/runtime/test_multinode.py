"""`spotlight train` on a real multi-node Ray cluster (tests/ray_cluster.py: `ray start` nodes on
loopback, each its own process group): on-demand roles stay on the head, spot executors run on
every spot node, a drained node gives its work back, a SIGKILLed node's work is re-queued, a node
that joins gets executors and work — and the run ends bit-identical to a local run of the config;
the fleet update moves between the nodes the bytes the simulator's byte model counts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time

import pytest
import ray
import torch
from safetensors.torch import load_file

from spotlight.rl.dit_model import transformer_arch
from spotlight.sim import transfers
from spotlight.sim.transfers import DiTShape

from conftest import small_dit_config
from ray_cluster import LoopbackCluster, descendants

STEPS = 4


def _config(train=None, **runtime):
    return small_dit_config(
        train={"steps": STEPS, "prompts_per_step": 6, "group_size": 4, "checkpoint_every": STEPS, **(train or {})},
        sampler={"num_steps": 12},
        runtime={"kind": "ray", "spot_workers": 2, "ondemand_workers": 1, **runtime},
    )


def _weights(out):
    (path,) = (out / "final").glob("*.safetensors")
    return load_file(str(path))


def _actor_nodes() -> dict[str, list[str]]:
    """Class name -> node ids of the alive actors of this cluster (from the GCS's actor table)."""
    where: dict[str, list[str]] = {}
    for a in ray._private.state.actors().values():
        if a["State"] == "ALIVE":
            where.setdefault(a["ActorClassName"].rsplit(".", 1)[-1], []).append(a["Address"]["NodeID"])
    return where


def _when_leased(runtime, then) -> threading.Thread:
    """Call `then()` once the queue has a request leased (mid-rollout), from another thread."""
    def run():
        deadline = time.monotonic() + 60
        while runtime.queue.stats()["leased"] == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        then()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _until(done, runtime, logs, timeout_s: float = 90.0) -> None:
    """Let the engine follow the cluster (between phases) until `done()`."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, logs
        runtime.engine.poll_sources()
        runtime.engine.settle()
        time.sleep(0.05)


def _drain(cluster, node_id: str) -> None:
    """What a cloud integration does with a preemption notice: Ray drains the node (30 s deadline)."""
    cluster.drain(node_id, int(time.time() * 1000) + 30_000, "spot interruption (test)")


@pytest.mark.slow
def test_a_cluster_run_follows_its_nodes_and_ends_bit_identical_to_a_local_run(tmp_path, logged):
    from spotlight.runtime.ray_runtime import RayRuntime
    from spotlight.train.trainer import Trainer

    local = Trainer(_config(kind="local"), tmp_path / "local", progress=False).build().train()
    assert local["requests_lost"] == 0

    with LoopbackCluster() as cluster:
        spot_a = cluster.add_node({"spot": 1}, name="spot-a")
        spot_b = cluster.add_node({"spot": 1}, name="spot-b")
        cfg = _config(address=cluster.address)
        runtime = RayRuntime(cfg)
        logs = logged
        seen: dict[str, object] = {}
        rollout = runtime.rollout
        calls = []

        def node_id(ip: str) -> str:
            (nid,) = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == ip]
            return nid

        def disturbed_rollout(requests, *args, **kwargs):
            calls.append(len(calls))
            it = len(calls) - 1
            if it == 0:
                seen["placement"] = _actor_nodes()
                seen["ids"] = {n.name: node_id(n.ip) for n in (cluster.head, spot_a, spot_b)}
            elif it == 1:  # a notice first: Ray drains spot-a mid-rollout, which then dies
                seen["drain"] = _when_leased(runtime, lambda: _drain(cluster, seen["ids"]["spot-a"]))
            elif it == 2:  # a new spot node joins; then spot-b dies without notice mid-rollout
                seen["drain"].join()
                _until(lambda: any(n.noticed for n in runtime.engine.nodes.values()), runtime, logs)
                cluster.kill(spot_a)
                spot_c = cluster.add_node({"spot": 1}, name="spot-c")
                _until(lambda: any(w.spot and spot_c.ip in w.nodes[0] and w.phase.value == "idle"
                                   for w in runtime.engine.workers.values()), runtime, logs)
                seen["spot_c"] = spot_c
                seen["kill"] = _when_leased(runtime, lambda: cluster.kill(spot_b))
            elif it == 3:  # the lease the kill waited for may have been another node's: spot-b then held
                # nothing, and only Ray's view tells its death, which a loaded machine may report after
                # the run's last rollout. The run must have seen it before it ends.
                seen["kill"].join()
                _until(lambda: any(spot_b.ip in name and not n.alive for name, n in runtime.engine.nodes.items()),
                       runtime, logs)
            return rollout(requests, *args, **kwargs)

        runtime.rollout = disturbed_rollout
        summary = Trainer(cfg, tmp_path / "cluster", progress=False).build(runtime).train()
        seen["kill"].join()

    ids = seen["ids"]
    placement = seen["placement"]
    for role in ("Learner", "_QueueActor", "RewardWorker"):
        assert placement[role] == [ids["head"]], (role, placement, ids)
    workers = placement["RolloutWorker"]
    assert sorted(workers) == sorted([ids["head"], ids["spot-a"], ids["spot-b"]]), (placement, ids)

    assert summary["requests_lost"] == 0 and summary["requests_duplicated"] == 0, summary
    assert summary["preemptions"] >= 1 and summary["workers_lost"] >= 1, (summary, logs)
    assert summary["requests_completed"] == local["requests_completed"]
    by_node = summary["requests_by_node"]
    assert any(seen["spot_c"].ip in node and n > 0 for node, n in by_node.items()), (by_node, logs)
    assert any("joined" in line for line in logs) and any("drained" in line for line in logs), logs

    a, b = _weights(tmp_path / "local"), _weights(tmp_path / "cluster")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_no_spot_capacity_is_said_in_one_line_then_falls_back_or_waits_visibly(tmp_path, logged):
    from spotlight.train.trainer import Trainer

    with LoopbackCluster() as cluster:  # the head alone: nothing advertises `spot`
        cfg = _config(address=cluster.address, ondemand_workers=0, spot_workers=1, spot_wait_s=2.0,
                      spot_fallback=True)
        logs = logged
        start = time.monotonic()
        summary = Trainer(cfg, tmp_path / "fallback", progress=False).build().train()
        said = [line for line in logs if line.startswith("no spot capacity")]
        assert len(said) == 1 and "runtime.spot_fallback" in said[0] and "\n" not in said[0], logs
        assert summary["requests_lost"] == 0 and summary["steps"] == STEPS
        assert list(summary["requests_by_node"]) == [next(n for n in summary["requests_by_node"])]
        assert next(iter(summary["requests_by_node"])).startswith("fallback@127.0.0.2")
        assert summary["fleet"] == {"ondemand_nodes": 1, "spot_nodes": 0}  # the meter pays for the head alone
        assert time.monotonic() - start < 120

        # Without the fallback the run waits, saying so every spot_wait_s, until a spot node joins.
        cfg = _config(address=cluster.address, ondemand_workers=0, spot_workers=1, spot_wait_s=1.0,
                      spot_fallback=False)
        logs.clear()
        joined = threading.Event()

        def join_when_said():
            while sum(line.startswith("no spot capacity") for line in logs) < 2:
                time.sleep(0.05)
            cluster.add_node({"spot": 1}, name="late-spot")
            joined.set()

        thread = threading.Thread(target=join_when_said, daemon=True)
        thread.start()
        summary = Trainer(cfg, tmp_path / "wait", progress=False).build().train()
        thread.join()
        waited = [line for line in logs if line.startswith("no spot capacity")]
        assert len(waited) >= 2 and all("waiting for a spot node" in line for line in waited), logs
        assert joined.is_set() and summary["requests_lost"] == 0 and summary["steps"] == STEPS
        assert all(node.startswith("spot@127.0.0.3") for node in summary["requests_by_node"]), summary


@pytest.mark.slow
def test_a_spot_node_sigkilled_while_it_computes_the_update_changes_no_weight(tmp_path, logged):
    """`train.update_on: fleet` on the cluster, spot nodes of two executors each: a request is served
    by a node's crew (both executors compute its micro-batches, the lead sends one gradient). Once
    spot-b's crew has computed a request of the second update and holds another, spot-b's processes
    are SIGKILLed: the request in flight is re-queued whole and computed by another crew. In the
    third update spot-a is drained (a notice) while its crew holds a request: the crew finishes it
    and pulls no more. The run ends bit-identical to a local run whose learner computes every
    update alone (the same micro-batches and requests of k = 8: the same tree)."""
    from schedulers.request import Kind
    from spotlight.runtime.ray_runtime import RayRuntime
    from spotlight.train.trainer import Trainer

    local_cfg = _config({"micro_batch": 2}, kind="local")  # the same parts: the same float sums
    local = Trainer(local_cfg, tmp_path / "local", progress=False).build().train()
    assert local_cfg.train.update_on == "learner"

    with LoopbackCluster() as cluster:
        spot_a = cluster.add_node({"spot": 2}, name="spot-a")
        spot_b = cluster.add_node({"spot": 2}, name="spot-b")
        cfg = _config({"micro_batch": 2, "update_on": "fleet"}, address=cluster.address)
        logs = logged
        runtime = RayRuntime(cfg)
        update, calls, seen, crews = runtime.update, [], {}, []

        def on(node, workers) -> list[str]:
            return [w for w in workers if w in runtime.engine.workers and node.ip in runtime.engine.workers[w].nodes[0]]

        def kill_when_spot_b_computes():
            """Once a crew of spot-b has computed a request of this update and holds another. Its
            processes are known before the decision, so the kill lands right after it, while the
            request in hand still computes (a scan of /proc between them gave a part time to finish:
            once in CI nothing was left in flight to re-queue)."""
            deadline = time.monotonic() + 60
            before = sum(runtime.queue.completions_by_worker(Kind.TRAIN).get(w, 0) for w in on(spot_b, runtime.engine.workers))
            while time.monotonic() < deadline:
                pids = descendants(spot_b.process.pid)
                done = runtime.queue.completions_by_worker(Kind.TRAIN)
                if sum(done.get(w, 0) for w in on(spot_b, done)) > before and on(spot_b, runtime.queue.held(Kind.TRAIN)):
                    for pid in pids:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    cluster.kill(spot_b)  # and whatever started since the scan
                    seen["killed"] = True
                    return
                time.sleep(0.002)

        def drain_when_spot_a_holds():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if on(spot_a, runtime.queue.held(Kind.TRAIN)):
                    (nid,) = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == spot_a.ip]
                    _drain(cluster, nid)
                    seen["drained"] = True
                    return
                time.sleep(0.002)

        def disturbed_update(*args, **kwargs):
            calls.append(len(calls))
            if len(calls) == 1:  # see every crew the engine forms
                serve_crew = runtime.executor.serve_crew
                runtime.executor.serve_crew = lambda workers, version, at_most=None: (
                    crews.append([w.nodes[0] for w in workers]) or serve_crew(workers, version, at_most))
            if len(calls) in (2, 3):
                act = kill_when_spot_b_computes if len(calls) == 2 else drain_when_spot_a_holds
                seen[len(calls)] = threading.Thread(target=act, daemon=True)
                seen[len(calls)].start()
            elif len(calls) == 4:  # the last update: the run must have seen spot-b's death before it ends
                # (a crew that finished its request just before the kill leaves only Ray's view to tell
                # it, which a loaded machine may report after the run: seen in CI, workers_lost 0)
                seen[2].join()
                _until(lambda: any(spot_b.ip in name and not n.alive for name, n in runtime.engine.nodes.items()),
                       runtime, logs)
            return update(*args, **kwargs)

        runtime.update = disturbed_update
        summary = Trainer(cfg, tmp_path / "cluster", progress=False).build(runtime).train()
        seen[2].join()
        seen[3].join()
        rows = [json.loads(line) for line in (tmp_path / "cluster" / "metrics.jsonl").read_text().splitlines()]

    assert seen.get("killed") and seen.get("drained"), logs
    assert any(len(c) == 2 and spot_a.ip in c[0] for c in crews), crews  # both executors of a spot node
    assert summary["requests_lost"] == 0 and summary["requests_duplicated"] == 0, summary
    assert summary["workers_lost"] >= 1 and summary["requests_interrupted"] >= 1, (summary, logs)
    assert summary["preemptions"] >= 1 and any("drained" in line for line in logs), (summary, logs)
    assert sum(r["gradient_parts_spot"] for r in rows) > 0, rows
    # Every update had all its requests: 2 rounds of ceil(16 samples (the 4 prompts there are x 4) x
    # 12 SDE steps / 2 rows) = 96 micro-batches in requests of 8.
    parts = -(-min(cfg.train.prompts_per_step, cfg.prompts.count) * cfg.train.group_size * len(cfg.sampler.sde_steps) // 2)
    assert {r["gradient_parts"] for r in rows} == {2 * -(-parts // 8)}, rows
    # What reached the learner from the other nodes is the byte model's (spotlight.sim.transfers),
    # the SIGKILL notwithstanding: one gradient of the model's part size per request (the killed
    # crew's once, from the crew that computed it again), and every publication is the whole
    # float32 model.
    shape = DiTShape.from_arch(transformer_arch(cfg.policy.dit))
    part, publication = transfers.part_bytes(shape, 0, 4, 4), transfers.publication_bytes(shape, 0, 4, 4)
    for r in rows:  # gradient_parts: the requests the learner folded (every one, checked above)
        assert r["update_gradient_bytes"] == r["gradient_parts"] * part and r["publish_bytes"] == publication, r
    a, b = _weights(tmp_path / "local"), _weights(tmp_path / "cluster")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
