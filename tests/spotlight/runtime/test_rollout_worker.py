"""RolloutWorker without Ray: pulls from a PullQueue, gives work back on a notice at a step
boundary, and another worker's resumed result equals the undisturbed one bit for bit."""

import torch

from schedulers.clock import ManualClock
from schedulers.preemption import Cause, PreemptionNotice
from schedulers.queue import PullQueue
from schedulers.request import Kind, Request
from spotlight.rl.dit_policy import DiTPolicy
from spotlight.rl.llm_policy import LLMPolicy
from spotlight.runtime.rollout_worker import RolloutWorker

from conftest import small_dit_config, small_llm_config


def _requests(n=2, version=0):
    return [Request(f"r{i}", Kind.ROLLOUT, i, "a red image" if i % 2 == 0 else "a blue image", (1, 2, 3),
                    weight_version=version, order=i) for i in range(n)]


class NoticeAfter:
    """A queue wrapper that posts a notice to `worker` once it has heartbeated `beats` times."""

    def __init__(self, queue, worker, beats):
        self.queue, self.worker, self.beats = queue, worker, beats

    def __getattr__(self, name):
        return getattr(self.queue, name)

    def heartbeat(self, worker, progress=None, report_cancelled=False):
        if worker == self.worker:
            self.beats -= 1
            if self.beats == 0:
                self.queue.notify(worker, PreemptionNotice(Cause.TRACE, None, worker))
        return self.queue.heartbeat(worker, progress, report_cancelled)


def _worker(name, queue, policy, cfg):
    w = RolloutWorker(name, cfg, queue, policy=policy)
    w.set_weights(0)
    return w


def test_a_notice_gives_the_request_back_at_a_step_boundary_and_the_resume_is_bit_identical():
    cfg = small_dit_config(sampler={"num_steps": 6})
    policy = DiTPolicy.from_config(cfg)

    undisturbed = PullQueue(ManualClock())
    undisturbed.put(_requests())
    _worker("solo", undisturbed, policy, cfg).serve()

    queue = PullQueue(ManualClock())
    queue.put(_requests())
    first = _worker("spot", NoticeAfter(queue, "spot", beats=4), policy, cfg)
    out = first.serve()
    assert out == {"worker": "spot", "completed": 0, "given_back": 1, "cancelled": 0, "noticed": True}
    assert queue.pull("spot") == []  # a noticed worker gets nothing more
    _worker("ondemand", queue, policy, cfg).serve()

    stats = queue.stats()
    assert stats["requests_given_back"] == 1 and stats["requests_resumed"] == 1
    assert stats["steps_resumed"] == 3 and stats["steps_recomputed"] == 0  # stopped after step 3 of 6
    for a, b in zip(queue.results(["r0", "r1"]), undisturbed.results(["r0", "r1"])):
        assert torch.equal(a.images, b.images)
        assert torch.equal(a.data["trajectory"], b.data["trajectory"])
        assert torch.equal(a.data["log_probs"], b.data["log_probs"])


def test_a_death_without_notice_resumes_from_the_last_committed_step():
    cfg = small_dit_config(sampler={"num_steps": 6}, runtime={"commit_every": 2})
    policy = DiTPolicy.from_config(cfg)
    reference = PullQueue(ManualClock())
    reference.put(_requests(1))
    _worker("solo", reference, policy, cfg).serve()

    queue = PullQueue(ManualClock())
    queue.put(_requests(1))
    (lease,) = queue.pull("doomed")
    # the doomed worker computes 3 steps, commits at step 2, starts step 4 and dies
    prompts = [_prompt(lease.request)] * 3
    state = policy.init_state(prompts, lease.request.seeds)
    for _ in range(3):
        queue.heartbeat("doomed", {"r0": state.step})
        state = policy.advance(prompts, state, state.step + 1)
        if state.step % 2 == 0:
            queue.checkpoint("doomed", "r0", state, state.step)
    queue.heartbeat("doomed", {"r0": state.step})
    assert queue.worker_lost("doomed") == ["r0"]
    _worker("ondemand", queue, policy, cfg).serve()
    assert queue.stats()["steps_recomputed"] == (3 - 2) + 1  # step 3 again, and the step in flight
    assert torch.equal(queue.result("r0").images, reference.result("r0").images)


def _prompt(request):
    from spotlight.rl.prompts import Prompt

    return Prompt(request.prompt_id, request.prompt_text)


def test_a_worker_never_computes_with_other_weights_than_a_request_names():
    cfg = small_dit_config()
    policy = DiTPolicy.from_config(cfg)
    queue = PullQueue(ManualClock())
    queue.put(_requests(2, version=1))
    stale = _worker("stale", queue, policy, cfg)  # holds version 0
    assert stale.serve()["completed"] == 0
    assert queue.stats()["queued"] == 2
    stale.set_weights(1)
    assert stale.serve()["completed"] == 2


def test_an_llm_request_given_back_restarts_whole():
    cfg = small_llm_config()
    policy = LLMPolicy.from_config(cfg)
    queue = PullQueue(ManualClock())
    queue.put([Request("q", Kind.ROLLOUT, 0, "07+05=", (1, 2), weight_version=0)])
    out = _worker("spot", NoticeAfter(queue, "spot", beats=1), policy, cfg).serve()
    assert out["given_back"] == 1
    _worker("ondemand", queue, policy, cfg).serve()
    assert len(queue.result("q").completions) == 2
    assert queue.stats()["steps_resumed"] == 0


def test_sigterm_is_a_notice_the_worker_acts_on():
    import os
    import signal
    import time

    cfg = small_dit_config(runtime={"notice_sources": ["sigterm"], "notice_poll_s": 0.01})
    queue = PullQueue(ManualClock())
    queue.put(_requests(1))
    before = signal.getsignal(signal.SIGTERM)
    worker = RolloutWorker("spot", cfg, queue).build()
    try:
        worker.set_weights(0, worker.policy.model.state_dict())
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while worker.notice is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker.notice is not None and worker.notice.cause is Cause.SIGTERM
        assert worker.serve()["completed"] == 0  # noticed: it pulls nothing
    finally:
        worker.close()
    assert signal.getsignal(signal.SIGTERM) == before
