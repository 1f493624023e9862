"""A rollout worker: pulls requests from the queue when idle and computes them step by step.

Plain Python; the Ray runtime hosts one per worker slot in an actor (spot or on-demand), the local
runtime runs one in-process. Per denoising step it heartbeats (renewing its lease and reporting its
progress) and commits the partial state every `commit_every` steps, so a death without notice
loses at most that many steps. When a heartbeat returns a preemption notice (or `notify` is called
by a local watcher), it stops at the next step boundary, gives its in-flight request back with its
state, and pulls nothing more: with a notice, no finished step is ever recomputed.

A `Kind.TRAIN` request (a chunk of `train.parts_per_request` micro-batches of the update) is served
by a node: the worker that pulls it is its node's crew lead (`serve(..., crew=...)`, the fleet
engine forms the crew of the node's idle workers); each member computes a share of the chunk's
micro-batches (`gradient_parts`), the lead folds all of them in index order (`fold_parts`) and
sends the one gradient. The fold's order is the micro-batches', not the crew's, so a node with
fewer live GPUs, a crew of one, or the learner alone give the same bits.

An LLM request is not resumable mid-way (its unit of work is a whole group of short completions):
given back, it restarts from scratch.

Exploration requests (`Kind.EXPLORATION`) run the same way with the policy's exploration settings
(`exploration.num_steps`, `exploration.ode`); their result is only what the reward needs (images
or completions, no trajectories). When the controller cancels exploration (new weights are out),
the worker learns it from its next heartbeat and drops the request at once.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Collection, Sequence
from typing import Any, Protocol

import torch

from schedulers.preemption import SigtermSource
from schedulers.request import GradientWork, Kind, Request
from spotlight.config import RunConfig
from spotlight.runtime.learner import build_policy
from spotlight.rl.gradient import Gradients, fold_parts, part_gradient
from spotlight.rl.lora import LocalBase, add_lora, fingerprint, load_trained_state
from spotlight.rl.policy import Policy, Rollout
from spotlight.rl.prompts import Prompt


def _resolve(handle: Any) -> Any:
    """What a `GradientWork` handle stands for: the object itself in one process; on Ray, the
    object an ObjectRef names (fetched once per worker: callers keep it, and compare handles with `_same`)."""
    if type(handle).__name__ == "ObjectRef":
        import ray

        return ray.get(handle)
    return handle


def _same(a: Any, b: Any) -> bool:
    """The same handle: the same object here; on Ray, refs naming the same object (each request
    arrives with its own copy of the ref)."""
    if type(a).__name__ == "ObjectRef" and type(b).__name__ == "ObjectRef":
        return a.binary() == b.binary()
    return a is b


def notice_sources(names: Collection[str], clock: Any) -> list[Any]:
    """The notice sources `runtime.notice_sources` names, on `clock`: AWS IMDSv2, GCP's metadata
    server, SIGTERM (installing its handler: call it on the process's main thread). What a rollout
    worker watches, and an SP node's agent (`spotlight.runtime.ray_sp`)."""
    sources: list[Any] = []
    if "aws" in names:
        from cloud.aws import ImdsSpotWatcher

        sources.append(ImdsSpotWatcher(clock))
    if "gcp" in names:
        from cloud.gcp import GcpPreemptionWatcher

        sources.append(GcpPreemptionWatcher(clock))
    if "sigterm" in names:
        sources.append(SigtermSource(clock))
    return sources


Part = tuple[Gradients, dict[str, float]]
"""One micro-batch's gradient (on the CPU when it crossed a process) and its stats."""


class CrewMember(Protocol):
    """Another worker of the lead's node as the lead reaches it (`RolloutWorker.serve`'s crew): it
    computes micro-batches of a `TRAIN` request with the weights of the request and sends each
    one's gradient back unsummed (`RolloutWorker.gradient_parts`)."""

    def submit(self, work: GradientWork, indices: list[int]) -> Any:
        """Start computing `indices` of `work`; returns what `collect` takes."""
        ...

    def collect(self, handle: Any) -> list[Part]:
        """The parts `submit` started, in the order of its indices. Raises `CrewMemberLost` when the
        member died meanwhile (the lead then computes them itself: the same bits)."""
        ...


class CrewMemberLost(RuntimeError):
    """A crew member died while it computed parts the lead asked of it."""


class LocalCrewMember:
    """A crew member in this process (`InProcessExecutor`): it computes when asked."""

    def __init__(self, worker: "RolloutWorker") -> None:
        self.worker = worker

    def submit(self, work: GradientWork, indices: list[int]) -> Any:
        return self.worker.gradient_parts(work, indices)

    def collect(self, handle: Any) -> list[Part]:
        return handle


def shares(indices: range, crew: int) -> list[list[int]]:
    """`indices` dealt round the crew (the lead first): position j computes indices[j::crew]. The
    lead's share begins with the chunk's first micro-batch, so the fold starts on its own tensors."""
    return [list(indices[j::crew]) for j in range(min(crew, len(indices)))]


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
        self._explorer: Policy | None = None
        self.refused: Exception | None = None
        """Why `build` refused this worker (a base that is not the learner's), if it did."""
        self._update_data: tuple[Any, Rollout] | None = None
        """(the update's rollout handle, the rollout merged): the iteration's, for its parts."""
        self._updater: tuple[Any, Policy] | None = None
        """(the weights handle loaded, a copy of the policy holding them): a later round's."""

    def build(self, base: dict[str, torch.Tensor] | LocalBase | None = None) -> "RolloutWorker":
        """Make the policy (unless one is shared) and watch for notices. With LoRA, `base` is what
        `Learner.base` gives: the frozen base's weights, loaded once here, or the fingerprint the
        base this node builds itself must match. Every publish then carries the adapters alone,
        and the KL reference (the base) is at hand for the update's parts."""
        torch.set_num_threads(self.cfg.runtime.torch_threads)  # the same in every role (runtime.torch_threads)
        if self.policy is None:
            self.policy = build_policy(self.cfg)
            if self.cfg.policy.lora.enabled:
                if base is None:
                    raise ValueError("a LoRA run's worker needs the learner's base (Learner.base)")
                if isinstance(base, LocalBase):
                    own = fingerprint(self.policy.model.state_dict())
                    if own != base.fingerprint:
                        # Kept for set_weights too: on Ray nobody waits on build, the runtime waits on that.
                        self.refused = RuntimeError(
                            f"worker {self.name}: the base model this node loaded ({own}) is not the learner's "
                            f"({base.fingerprint}): policy's pretrained_path must hold the same weights on every node")
                        raise self.refused
                else:
                    self.policy.model.load_state_dict(base)
                add_lora(self.policy.model, self.cfg)
                if self.cfg.grpo.kl_beta > 0:  # the base with the adapters off: the update's parts need it
                    self.policy.set_reference()
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
        self.sources = notice_sources(names, clock)  # build() runs on the process's main thread
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
        if self.refused is not None:
            raise self.refused
        if state_dict is not None:
            load_trained_state(self.policy.model, state_dict)
        self.version = version

    def notify(self, notice: Any) -> None:
        self.notice = notice

    def serve(self, kinds: Collection[Kind] | None = None, crew: Sequence[CrewMember] = (),
              at_most: int | None = None) -> dict[str, Any]:
        """Pull (requests of `kinds`; default all) and compute until the queue has nothing for this
        worker, `at_most` requests are done (None: no limit), or a notice arrives. With `crew` (the
        other idle workers of this node) this worker is their lead: a `TRAIN` request's micro-batches
        are shared among all of them."""
        done = given_back = cancelled = 0
        while self.notice is None and (at_most is None or done + given_back + cancelled < at_most):
            # Only requests for the weights held: a replacement worker whose serve() was queued before
            # newer weights arrived must leave newer requests for after its set_weights calls run.
            leases = self.queue.pull(self.name, 1, kinds, weight_version=self.version)
            if not leases:
                break
            outcome = self.compute(leases[0].request, crew)
            done += outcome is True
            given_back += outcome is False
            cancelled += outcome is None
        return {"worker": self.name, "completed": done, "given_back": given_back, "cancelled": cancelled,
                "noticed": self.notice is not None}

    def policy_for(self, kind: Kind) -> Policy:
        """The policy a request of `kind` is computed with (exploration may sample more cheaply)."""
        if kind is not Kind.EXPLORATION:
            return self.policy
        if self._explorer is None:
            ex = self.cfg.exploration
            self._explorer = self.policy.for_exploration(ex.num_steps, ex.ode)
        return self._explorer

    def compute(self, req: Request, crew: Sequence[CrewMember] = ()) -> bool | None:
        """Run `req` to the end and complete it (True), give it back on a notice (False), or drop it
        because the controller cancelled it (None). `crew`: see `serve`."""
        if req.weight_version != self.version:
            raise RuntimeError(f"worker {self.name} holds weights v{self.version}, request {req.id} needs "
                               f"v{req.weight_version}: the runtime must publish weights before serving")
        if req.kind is Kind.TRAIN:
            return self._gradient(req, crew)
        prompts = [Prompt(req.prompt_id, req.prompt_text)] * len(req.seeds)
        policy = self.policy_for(req.kind)
        if not policy.resumable:
            stop = self._stop(req, 0)
            if stop == "notice":
                self.queue.give_back(self.name, req.id, None, 0)
            if stop:
                return None if stop == "cancelled" else False
            return self._complete(req, policy.rollout(prompts, list(req.seeds)))
        state = req.state if req.state is not None else policy.init_state(prompts, req.seeds)
        last = policy.num_steps
        while state.step < last:
            stop = self._stop(req, state.step)
            if stop == "cancelled":
                return None
            if stop == "notice":
                self.queue.give_back(self.name, req.id, state, state.step)
                return False
            state = policy.advance(prompts, state, state.step + 1)
            if state.step < last and state.step % self.commit_every == 0:
                self.queue.checkpoint(self.name, req.id, state, state.step)
        return self._complete(req, policy.finish(prompts, state))

    def _gradient(self, req: Request, crew: Sequence[CrewMember] = ()) -> bool | None:
        """A chunk of the update (`GradientWork`: `train.parts_per_request` micro-batches) served by
        this node: dealt round this worker and its `crew` (`shares`), every part computed as the
        learner computes its own (`part_gradient`), folded here in index order (`fold_parts`: the
        same bits as `chunk_gradient` on one device), sent as one gradient on the CPU with the
        parts' stats. A request is one unit: a notice before it starts gives it back; once started
        it is finished."""
        stop = self._stop(req, 0)
        if stop == "notice":
            self.queue.give_back(self.name, req.id, None, 0)
        if stop:
            return None if stop == "cancelled" else False
        work = req.work
        dealt = shares(work.indices, 1 + len(crew))
        asked = [(m, share, m.submit(work, share)) for m, share in zip(crew, dealt[1:])]
        policy, rollout, advantages = self._update_inputs(work)
        parts = {i: part_gradient(policy, rollout, advantages, i) for i in dealt[0]}
        for member, share, handle in asked:
            try:
                parts.update(zip(share, member.collect(handle)))
            except CrewMemberLost:  # its node lives on (a death of the node ends this worker too)
                parts.update((i, part_gradient(policy, rollout, advantages, i)) for i in share)
        result = fold_parts((parts.pop(i) for i in work.indices), device="cpu")
        self.queue.complete(self.name, req.id, result)
        return True

    def gradient_parts(self, work: GradientWork, indices: list[int]) -> list[Part]:
        """As a crew member: micro-batches `indices` of `work`, each its own gradient on the CPU,
        unsummed (the lead folds every part of the chunk in index order)."""
        policy, rollout, advantages = self._update_inputs(work)
        return [part_gradient(policy, rollout, advantages, i, device="cpu") for i in indices]

    def _update_inputs(self, work: GradientWork) -> tuple[Policy, Rollout, torch.Tensor]:
        """What `work`'s micro-batches are computed from: the policy with the weights of its round
        (round 0: the rollout's, held; a later round: the learner's after the round before, loaded
        into a copy of the policy), the iteration's rollout merged and its advantages (resolved once
        per iteration and round weights: every request of the iteration carries the same handles)."""
        parts, advantages = work.data
        if self._update_data is None or not _same(self._update_data[0], parts):
            self._update_data = (parts, self.policy.merge(_resolve(parts)))
        policy = self.policy
        if work.weights is not None:  # a later round: the learner's weights after the round before
            if self._updater is None:
                self._updater = (None, copy.deepcopy(self.policy))
            if not _same(self._updater[0], work.weights):
                load_trained_state(self._updater[1].model, _resolve(work.weights))
                self._updater = (work.weights, self._updater[1])
            policy = self._updater[1]
        return policy, self._update_data[1], advantages

    def _stop(self, req: Request, step: int) -> str | None:
        """Heartbeat; "notice" if this worker must stop, "cancelled" if `req` was cancelled, else None."""
        notice, cancelled = self.queue.heartbeat(self.name, {req.id: step}, report_cancelled=True)
        if notice is not None and self.notice is None:
            self.notice = notice
        if self.notice is not None:
            return "notice"
        return "cancelled" if req.id in cancelled else None

    def _complete(self, req: Request, result: Rollout) -> bool:
        if req.kind is Kind.EXPLORATION:
            # The controller needs only what the reward reads: no trajectories or log-probs to ship.
            result = dataclasses.replace(result, data={})
        self.queue.complete(self.name, req.id, result)
        return True
