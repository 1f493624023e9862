"""A rollout worker: pulls requests from the queue when idle and computes them step by step.

Plain Python; the Ray runtime hosts one per worker slot in an actor (spot or on-demand), the local
runtime runs one in-process. Per denoising step it heartbeats (renewing its lease and reporting its
progress) and commits the partial state every `commit_every` steps, so a death without notice
loses at most that many steps. When a heartbeat returns a preemption notice (or `notify` is called
by a local watcher), it stops at the next step boundary, gives its in-flight request back with its
state, and pulls nothing more: with a notice, no finished step is ever recomputed.

An LLM request is not resumable mid-way (its unit of work is a whole group of short completions):
given back, it restarts from scratch.
"""

from __future__ import annotations

from typing import Any

from schedulers.preemption import SigtermSource
from schedulers.request import Request
from spotlight.config import RunConfig
from spotlight.learner import build_policy
from spotlight.policy import Policy, Rollout
from spotlight.prompts import Prompt


class RolloutWorker:
    def __init__(self, name: str, cfg: RunConfig, queue: Any, policy: Policy | None = None,
                 commit_every: int = 1) -> None:
        self.name = name
        self.cfg = cfg
        self.queue = queue
        self.policy = policy
        self.commit_every = commit_every
        self.version = -1
        self.notice: Any = None
        self.sources: list[Any] = []
        self.watcher: Any = None

    def build(self) -> "RolloutWorker":
        if self.policy is None:
            self.policy = build_policy(self.cfg)
        self._watch()
        return self

    def _watch(self) -> None:
        """Watch this node for a preemption notice in a background thread: its metadata endpoints
        (AWS IMDSv2, GCP) and/or SIGTERM, as `runtime.notice_sources` says."""
        names = self.cfg.runtime.notice_sources
        if not names:
            return
        from schedulers.clock import WallClock
        from schedulers.preemption import NoticeWatcher

        clock = WallClock()
        if "aws" in names:
            from cloud.aws import ImdsSpotWatcher

            self.sources.append(ImdsSpotWatcher(clock))
        if "gcp" in names:
            from cloud.gcp import GcpPreemptionWatcher

            self.sources.append(GcpPreemptionWatcher(clock))
        if "sigterm" in names:
            self.sources.append(SigtermSource(clock))  # build() runs on the process's main thread
        self.watcher = NoticeWatcher(self.sources, self.notify, clock, self.cfg.runtime.notice_poll_s).start()

    def close(self) -> None:
        """Stop watching for notices (and give SIGTERM back to its previous handler)."""
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None
        for source in self.sources:
            if isinstance(source, SigtermSource):
                source.uninstall()
        self.sources = []

    def set_weights(self, version: int, state_dict: dict | None = None) -> None:
        """Load `state_dict` as weight version `version` (None: the shared policy already has them)."""
        if state_dict is not None:
            self.policy.model.load_state_dict(state_dict)
        self.version = version

    def notify(self, notice: Any) -> None:
        self.notice = notice

    def serve(self) -> dict[str, Any]:
        """Pull and compute until the queue has nothing for this worker or a notice arrives."""
        done = given_back = 0
        while self.notice is None:
            # Only requests for the weights held: a replacement worker whose serve() was queued before
            # newer weights arrived must leave newer requests for after its set_weights calls run.
            leases = self.queue.pull(self.name, 1, weight_version=self.version)
            if not leases:
                break
            finished = self.compute(leases[0].request)
            done += finished
            given_back += not finished
        return {"worker": self.name, "completed": done, "given_back": given_back, "noticed": self.notice is not None}

    def compute(self, req: Request) -> bool:
        """Run `req` to the end and complete it (True), or give it back on a notice (False)."""
        if req.weight_version != self.version:
            raise RuntimeError(f"worker {self.name} holds weights v{self.version}, request {req.id} needs "
                               f"v{req.weight_version}: the runtime must publish weights before serving")
        prompts = [Prompt(req.prompt_id, req.prompt_text)] * len(req.seeds)
        policy = self.policy
        if not policy.resumable:
            if self._noticed(req, 0):
                self.queue.give_back(self.name, req.id, None, 0)
                return False
            return self._complete(req, policy.rollout(prompts, list(req.seeds)))
        state = req.state if req.state is not None else policy.init_state(prompts, req.seeds)
        last = self.cfg.sampler.num_steps
        while state.step < last:
            if self._noticed(req, state.step):
                self.queue.give_back(self.name, req.id, state, state.step)
                return False
            state = policy.advance(prompts, state, state.step + 1)
            if state.step < last and state.step % self.commit_every == 0:
                self.queue.checkpoint(self.name, req.id, state, state.step)
        return self._complete(req, policy.finish(prompts, state))

    def _noticed(self, req: Request, step: int) -> bool:
        notice = self.queue.heartbeat(self.name, {req.id: step})
        if notice is not None and self.notice is None:
            self.notice = notice
        return self.notice is not None

    def _complete(self, req: Request, result: Rollout) -> bool:
        self.queue.complete(self.name, req.id, result)
        return True
