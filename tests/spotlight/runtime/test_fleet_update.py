"""The update's gradient as work for the fleet (`train.update_on: fleet`): micro-batches pulled from
the queue as TRAIN requests by any worker, summed by the learner in micro-batch order — so the
weights never depend on who computed what, or on preemptions during the update."""

import random

import pytest
import torch
from safetensors.torch import load_file

from schedulers.clock import ManualClock
from schedulers.queue import PullQueue
from schedulers.request import GradientWork, Kind, Request
from schedulers.traces import ReplayAction
from schedulers.update import Done, FleetUpdate
from spotlight.rl.gradient import GradientSum
from spotlight.train.trainer import Trainer

from conftest import small_dit_config, small_llm_config

# LoRA with a KL penalty: the workers' own base is the reference (without LoRA they have none).
_LORA_KL = {"policy": {"lora": {"rank": 4, "alpha": 8}}, "grpo": {"kl_beta": 0.05}}
CONFIGS = {"dit": small_dit_config, "llm": small_llm_config,
           "dit-lora-kl": lambda **over: small_dit_config(**_LORA_KL, **over),
           "llm-lora-kl": lambda **over: small_llm_config(**_LORA_KL, **over)}


def _config(kind, update_on, runtime="local", **train):
    return CONFIGS[kind](
        train={"steps": 3, "prompts_per_step": 4, "group_size": 4, "checkpoint_every": 3, "micro_batch": 4,
               "update_on": update_on, **train},
        runtime={"kind": runtime, "spot_workers": 2, "ondemand_workers": 1})


def _run(cfg, out, runtime=None):
    summary = Trainer(cfg, out, progress=False).build(runtime).train()
    (weights,) = (out / "final").glob("*.safetensors")
    rows = [__import__("json").loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return summary, load_file(str(weights)), rows


def _assert_same_weights(a, b):
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


def test_a_gradient_sum_is_the_same_whatever_order_its_parts_arrive_in():
    g = torch.Generator().manual_seed(0)
    parts = [({"w": torch.randn(64, generator=g) * 10 ** (i % 5)}, {"loss": float(i)}) for i in range(7)]
    in_order, shuffled = GradientSum(7), GradientSum(7)
    for i, (grads, stats) in enumerate(parts):
        in_order.add(i, grads, stats)
    for i in random.Random(1).sample(range(7), 7):
        shuffled.add(i, *parts[i])
    assert shuffled.complete and torch.equal(in_order.grads["w"], shuffled.grads["w"])
    assert shuffled.stats() == {"loss": 21.0}
    # Not trivially so: adding the same parts in another order gives other floats.
    reverse = parts[0][0]["w"].clone() * 0
    for grads, _ in reversed(parts):
        reverse += grads["w"]
    assert not torch.equal(reverse, in_order.grads["w"])
    with pytest.raises(ValueError, match="added twice"):
        shuffled.add(3, *parts[3])


def test_parts_summed_per_request_are_folded_in_chunks_then_in_chunk_order():
    g = torch.Generator().manual_seed(0)
    parts = [({"w": torch.randn(64, generator=g) * 10 ** (i % 5)}, {"loss": float(i)}) for i in range(7)]
    total = GradientSum(7, chunk=3)  # 3 does not divide 7: the last chunk is one micro-batch
    assert [list(r) for r in total.ranges] == [[0, 1, 2], [3, 4, 5], [6]]
    sums = []
    for r in total.ranges:  # what a worker sends: its chunk folded left, first + second + ...
        w = parts[r[0]][0]["w"].clone()
        for i in r[1:]:
            w += parts[i][0]["w"]
        sums.append(({"w": w}, {"loss": sum(float(i) for i in r)}))
    for c in (2, 0, 1):  # in any order: added in chunk order
        total.add(c, *sums[c])
    tree = sums[0][0]["w"].clone()
    tree += sums[1][0]["w"]
    tree += sums[2][0]["w"]
    assert total.complete and torch.equal(total.grads["w"], tree) and total.stats() == {"loss": 21.0}
    # Another tree than the plain fold (k = 1), which is why the learner alone uses the same k.
    flat = GradientSum(7)
    for i, part in enumerate(parts):
        flat.add(i, *part)
    assert not torch.equal(flat.grads["w"], tree)
    with pytest.raises(ValueError, match="added twice or out of range"):
        total.add(3, *sums[0])
    # The fleet's requests are those chunks, named by their micro-batches.
    queue = PullQueue(ManualClock(), 30.0)
    update = FleetUpdate(queue, version=5, rounds=1, parts=7, data="rollout", step=lambda r, ids: Done(ids),
                         weights=lambda: None, per_request=3)
    assert update.ids == ["it5/u0/m0-2", "it5/u0/m3-5", "it5/u0/m6"]
    leases = queue.pull("a", 3, [Kind.TRAIN], weight_version=5)
    assert [list(lease.request.work.indices) for lease in leases] == [list(r) for r in total.ranges]


def test_a_fleet_update_puts_its_rounds_one_after_the_other():
    queue = PullQueue(ManualClock(), 30.0)
    steps = []
    update = FleetUpdate(queue, version=5, rounds=2, parts=3, data="rollout",
                         step=lambda r, ids: steps.append((r, ids)) or Done(f"stats{r}"), weights=lambda: "w1")
    assert not update.done() and queue.open(Kind.TRAIN) == 3 and steps == []
    leases = queue.pull("a", 3, [Kind.TRAIN, Kind.EXPLORATION], weight_version=5)
    assert [lease.request.work for lease in leases] == [GradientWork(0, i, "rollout") for i in range(3)]
    for lease in leases:
        queue.complete("a", lease.request.id, lease.request.work.index)
    assert not update.done() and steps == [(0, ["it5/u0/m0", "it5/u0/m1", "it5/u0/m2"])]
    # Round 1 carries the learner's weights after round 0.
    leases = queue.pull("b", 3)
    assert [lease.request.work.weights for lease in leases] == ["w1"] * 3
    for lease in leases:
        queue.complete("b", lease.request.id, None)
    assert update.done() and update.last_step.value == "stats1" and [r for r, _ in steps] == [0, 1]


def test_gradient_work_is_served_before_exploration_and_after_the_rollout():
    queue = PullQueue(ManualClock(), 30.0)
    queue.put([Request("x", Kind.EXPLORATION, 0, "", (1,), 0), Request("t", Kind.TRAIN, 0, "", (), 0),
               Request("r", Kind.ROLLOUT, 0, "", (1,), 0)])
    assert [lease.request.id for lease in queue.pull("w", 3)] == ["r", "t", "x"]


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_the_local_runtime_updating_through_the_queue_ends_bit_identical(tmp_path, kind):
    _, alone, _ = _run(_config(kind, "learner"), tmp_path / "learner")
    _, fleet, rows = _run(_config(kind, "fleet"), tmp_path / "fleet")
    _assert_same_weights(alone, fleet)
    assert all(r["gradient_parts"] > 0 and r["gradient_parts_spot"] == 0 for r in rows)
    if kind.endswith("kl"):  # the penalty was really computed (0 only while the adapters are zero)
        assert rows[-1]["kl"] > 0, rows


@pytest.mark.parametrize("kind", ["dit", "llm"])
def test_parts_summed_per_request_end_bit_identical_to_the_learner_summing_the_same_chunks(tmp_path, kind):
    # k = 3 divides neither round's micro-batches (DiT: 16 samples x 4 SDE steps / 4 rows; LLM: 16
    # samples / 4): the last chunk is short. 2 rounds (train.updates_per_step) of ceil(P / 3) requests.
    _, alone, _ = _run(_config(kind, "learner", parts_per_request=3), tmp_path / "learner")
    _, fleet, rows = _run(_config(kind, "fleet", parts_per_request=3), tmp_path / "fleet")
    _assert_same_weights(alone, fleet)
    assert all(r["gradient_parts"] == 2 * {"dit": 6, "llm": 2}[kind] for r in rows), rows


def test_auto_places_each_update_where_the_runs_own_updates_were_faster():
    from schedulers.update_placement import UpdatePlacement

    fixed = UpdatePlacement("fleet")
    assert [fixed.on_fleet() for _ in range(3)] == [True] * 3
    auto = UpdatePlacement("auto", retry_every=4)
    seconds = {False: 2.0, True: 1.0}  # the fleet is faster
    places = []
    for _ in range(10):
        places.append(auto.on_fleet())
        auto.measured(places[-1], seconds[places[-1]])
    # learner, fleet (each measured once), then the fleet, the learner again every 4th update
    assert places == [False, True, True, True, False, True, True, True, False, True]
    seconds[True] = 3.0  # the fleet got slower (spot nodes gone): measured at its next update, dropped
    auto.measured(True, 3.0)
    assert auto.on_fleet() is False
    with pytest.raises(ValueError, match="update_on"):
        UpdatePlacement("spot")


def test_auto_ends_bit_identical_whatever_it_chose(tmp_path):
    _, alone, _ = _run(_config("dit", "learner", steps=4), tmp_path / "learner")
    _, auto, rows = _run(_config("dit", "auto", steps=4), tmp_path / "auto")
    _assert_same_weights(alone, auto)
    assert [r["update_on_fleet"] for r in rows][:2] == [False, True]  # each place measured once
    assert all(("gradient_parts" in r) == r["update_on_fleet"] for r in rows), rows


def test_fleet_update_refuses_what_its_workers_cannot_compute():
    from schedulers.input.files import ConfigError

    with pytest.raises(ConfigError, match="grpo.kl_beta"):
        small_dit_config(train={"update_on": "fleet"}, grpo={"kl_beta": 0.01})
    with pytest.raises(ConfigError, match="update_on"):
        small_dit_config(train={"update_on": "spot"})


def _preemptions_in_updates():
    """On the train phases' replay clock: spot0 gets a notice then dies, spot1 dies without one,
    both come back."""
    return [ReplayAction(0.05, 0, "notice"), ReplayAction(0.2, 0, "kill"), ReplayAction(0.35, 1, "kill"),
            ReplayAction(0.7, 1, "add"), ReplayAction(0.8, 0, "add")]


class _PreemptAfterSpotWork:
    """A fleet source that schedules `actions` (replay seconds from then on, on the train phases'
    clock) once a spot worker has sent a gradient part: the kills come by what happened, not by
    seconds. With the trace at fixed times, a loaded machine (CI, two xdist workers) ran the first
    update slower than the kills at 0.05-0.35 s and the restarted nodes outlasted the run: no spot
    part at all."""

    def __init__(self, queue, actions):
        self.queue, self.actions, self.scheduled = queue, actions, False

    def poll(self, engine):
        from schedulers.fleet import FleetAction

        if self.scheduled:
            return
        sent = self.queue.completions_by_worker(Kind.TRAIN)
        if any(getattr(engine.nodes.get(w.rsplit(".", 1)[0]), "spot", False) for w in sent):
            now = engine.replay.now()
            for a in self.actions:
                engine.schedule(FleetAction(now + a.at_s, f"spot{a.slot}", a.action))
            self.scheduled = True

    def capacity_may_come(self):
        return False


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dit", "llm", "llm-lora-kl"])
def test_spot_workers_killed_during_updates_change_no_weight(tmp_path, kind):
    from spotlight.runtime.ray_runtime import RayRuntime

    class PreemptedAfterSpotWork(RayRuntime):
        def build(self, checkpoints):
            info = super().build(checkpoints)
            self.engine.sources.append(_PreemptAfterSpotWork(self.queue, _preemptions_in_updates()))
            return info

    # Requests of 2 micro-batches, 8 a round (DiT: 16 samples x 4 SDE steps / 4 rows; LLM: 16 samples
    # of one row each): every node's worker can take some. With the LLM's 4-row micro-batches
    # (2 requests a round) the on-demand worker took both of every round on a loaded machine.
    train = {"parts_per_request": 2, **({"micro_batch": 1} if kind.startswith("llm") else {})}
    _, alone, _ = _run(_config(kind, "learner", **train), tmp_path / "learner")
    cfg = _config(kind, "fleet", runtime="ray", **train)
    summary, weights, rows = _run(cfg, tmp_path / "ray", PreemptedAfterSpotWork(cfg, replay_phases=("train",)))
    # The preemptions came (so a spot worker had computed a part of an update first), during updates.
    assert summary["preemptions"] >= 1 and summary["workers_lost"] >= 1, summary
    assert summary["requests_lost"] == 0 and summary["requests_duplicated"] == 0, summary
    assert sum(r["gradient_parts_spot"] for r in rows) > 0, rows
    assert {r["gradient_parts"] for r in rows} == {8 * cfg.train.updates_per_step}, rows  # each update whole
    _assert_same_weights(alone, weights)


def test_an_action_scheduled_during_a_run_goes_in_time_order_and_never_in_the_past():
    from schedulers.fleet import FleetAction, FleetEngine

    clock = ManualClock()
    engine = FleetEngine(clock, PullQueue(clock, 30.0), None, [],
                         actions=[FleetAction(1.0, "spot0", "kill"), FleetAction(3.0, "spot0", "add")],
                         replay_phases=("train",))
    engine.schedule(FleetAction(2.0, "spot1", "kill"))
    assert [(a.at_s, a.node) for a in engine.actions] == [(1.0, "spot0"), (2.0, "spot1"), (3.0, "spot0")]
    engine._phase("train")
    clock.advance(2.5)
    with pytest.raises(ValueError, match="in the past"):
        engine.schedule(FleetAction(2.0, "spot1", "add"))
