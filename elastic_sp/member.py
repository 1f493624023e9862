"""A member process: one device's worth of an SP group, alive for as long as its device is.

It is started once by its node's agent, builds the transformer and its sampler (through the spec's
builder, `spec.Builder`: elastic_sp knows only the transformer's attention), takes its weights (an
intra-node copy of the node's shared-memory weights, the checkpoint on a cold start, or later from
a peer over its first group), and then executes commands: form a group, run a request (an
exploration request with the builder's explorer; with `spec.finish`, rank 0 completes it with the
builder's result), one forward, load a new weight version from the node's live copy, export or
digest its weights, stop. Regrouping changes only which process group its collectives
use (`ulysses.apply` swaps the group in place): the process, the model and the weights stay.

A reader thread moves commands from the pipe into an inbox. A Form, Halt or Stop that arrives while
the member is computing means its group is being re-formed: the next collective (or step boundary)
notices and the member drops the work — the coordinator has already given the request back at
its committed step — and turns to the command. When the agent's end of the pipe closes, the
member exits: nothing it holds is needed without its agent.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

import torch

from elastic_sp import protocol as P
from elastic_sp import ulysses
from elastic_sp.group import GroupBroken, Rendezvous, SPGroup, timed_form
from elastic_sp.spec import Builder, ServeSpec
from schedulers.request import Kind
from elastic_sp.weights import (
    NodeWeights,
    copy_into,
    copy_over_group,
    digest,
    load_checkpoint,
)

_INTERRUPTING = (P.Form, P.Halt, P.Stop)


class Inbox:
    """Commands read from the pipe by a background thread; `wake` is also what collectives wait on."""

    def __init__(self, channel: P.Channel) -> None:
        self.channel = channel
        self.wake = threading.Event()
        self._queue: deque[Any] = deque()
        self._thread = threading.Thread(target=self._read, name="inbox", daemon=True)

    def start(self) -> Inbox:
        self._thread.start()
        return self

    def _read(self) -> None:
        while True:
            try:
                msg = self.channel.recv()
            except (EOFError, OSError):
                os._exit(0)  # the agent is gone; see the module docstring
            self._queue.append(msg)
            self.wake.set()

    def pending(self) -> bool:
        """Whether a command that changes the group (Form, Halt, Stop) is waiting: those interrupt
        the work in progress; the others (Digest, Export, ...) wait their turn."""
        return any(isinstance(m, _INTERRUPTING) for m in list(self._queue))

    def get(self) -> Any:
        while not self._queue:
            self.wake.wait(1.0)
            self.wake.clear()
        return self._queue.popleft()


class Member:
    def __init__(self, name: str, spec: ServeSpec, channel: P.Channel, device: str) -> None:
        self.name = name
        self.spec = spec
        self.channel = channel
        self.device = torch.device(device)
        self.inbox = Inbox(channel)
        self.builder: Builder | None = None
        self.model: torch.nn.Module | None = None
        self.policy: Any = None
        self.group = SPGroup.local()
        self.group_name = ""
        self.version: int | None = None
        """The weight version held, when known (the node's live copy says; from a checkpoint or a
        peer it is not)."""
        self._explorer: Any = None

    def build(self, weights: dict[str, torch.Tensor] | None, checkpoint: str | None, started: float,
              version: int | None = None) -> None:
        """Build the model and take weights: the node's live copy (weight version `version`), else
        the checkpoint, else none yet (a peer sends them when the first group forms)."""
        self.builder = self.spec.builder_module()
        self.model = self.builder.build_model(self.spec).to(self.device)
        if weights is not None:
            copy_into(self.model, weights)
            self.version = version
            source = "node"
        elif checkpoint is not None:
            copy_into(self.model, load_checkpoint(checkpoint))
            source = "checkpoint"
        else:
            source = "none"
        self.policy = self.builder.build_policy(self.spec, self.model, str(self.device))
        ulysses.apply(self.model, None)
        self.inbox.start()
        self.channel.send(P.Ready(self.name, os.getpid(), source, time.time() - started))

    def serve(self) -> None:
        while True:
            msg = self.inbox.get()
            try:
                self.handle(msg)
            except GroupBroken as err:
                generation = err.generation if err.generation is not None else self.group.generation
                self.channel.send(P.Broken(self.name, generation, str(err)))
            except Exception:  # report, keep serving: the coordinator decides what a failure means
                self.channel.send(P.Failed(self.name, traceback.format_exc()))

    def handle(self, msg: Any) -> None:
        if isinstance(msg, P.Form):
            self.form(msg)
        elif isinstance(msg, P.Run):
            self.run(msg)
        elif isinstance(msg, P.Forward):
            self._check_generation(msg.generation)
            with torch.no_grad():
                out = self.builder.velocity(self.model, msg.x.to(self.device), msg.sigma.to(self.device),
                                            msg.emb.to(self.device),
                                            None if msg.mask is None else msg.mask.to(self.device), msg.side)
            self.channel.send(P.Output(self.name, self.group.generation, self.group.rank, out.cpu()))
        elif isinstance(msg, P.Halt):
            if msg.generation == self.group.generation:
                self.group.abandon()
                self.group = SPGroup.local(-1, self.device)
        elif isinstance(msg, P.Load):
            # Queued behind the request it may arrive during (Load does not interrupt): the new
            # weights apply from the next request on, and the node's copy is read, never written.
            copy_into(self.model, msg.tensors, subset=True)  # a partial publish names the trained part
            self.version = msg.version
        elif isinstance(msg, P.Export):
            self.channel.send(P.Exported(self.name, NodeWeights.share(self.model.state_dict()).tensors), shared=True)
        elif isinstance(msg, P.Digest):
            self.channel.send(P.Digested(self.name, digest(self.model)))
        elif isinstance(msg, P.Stop):
            os._exit(0)  # skips destructors of abandoned process groups (see group.py)
        else:
            raise TypeError(f"unknown command {type(msg).__name__}")

    def _check_generation(self, generation: int) -> None:
        if generation != self.group.generation:
            raise GroupBroken(f"command for generation {generation}, member is in {self.group.generation}", generation)

    def form(self, msg: P.Form) -> None:
        self.group.abandon()
        self.group = SPGroup.local(-1, self.device)  # in no generation until the new one is formed
        try:
            group, rendezvous_s = timed_form(Rendezvous(msg.host, msg.port, msg.generation, msg.timeout_s),
                                             msg.rank, msg.size, self.device, self.inbox)
        except GroupBroken as err:
            err.generation = msg.generation
            raise
        self.group, self.group_name = group, msg.group
        ulysses.apply(self.model, group)
        t = time.perf_counter()
        if msg.weights_from is not None and msg.weights_to:
            copy_over_group(group, self.model, msg.weights_from, msg.weights_to)
        self.channel.send(P.Formed(self.name, msg.group, msg.generation, rendezvous_s, time.perf_counter() - t))

    def run(self, msg: P.Run) -> None:
        """Step the request; rank 0 reports after every step. A pending command stops it at the
        next collective or step boundary (GroupBroken)."""
        self._check_generation(msg.generation)
        req = msg.request
        if self.version is not None and req.weight_version != self.version:
            raise RuntimeError(f"member {self.name} holds weights v{self.version}, request {req.id} needs "
                               f"v{req.weight_version}: weights must be published before serving")
        policy = self._policy_for(req.kind)
        prompts = [self.builder.prompt(req.prompt_id, req.prompt_text)] * len(req.seeds)
        state = req.state if req.state is not None else policy.init_state(prompts, req.seeds)
        reported_x = 0 if req.state is None else state.trajectory.shape[1]
        reported_lp = state.log_probs.shape[1]
        while state.step < policy.num_steps:
            if self.inbox.pending():
                raise GroupBroken(f"group generation {self.group.generation}: re-formed by the agent")
            state = policy.advance(prompts, state, state.step + 1)
            if self.group.rank == 0:
                result = None
                if self.spec.finish and state.step >= policy.num_steps:
                    result = self.builder.finish(self.spec, policy, prompts, state, req.kind)
                self.channel.send(P.Committed(self.name, msg.generation, req.id, state.step,
                                              state.trajectory[:, reported_x:].cpu(),
                                              state.log_probs[:, reported_lp:].cpu(), result))
                reported_x, reported_lp = state.trajectory.shape[1], state.log_probs.shape[1]

    def _policy_for(self, kind: Kind) -> Any:
        """The policy a request of `kind` is sampled with (`spec.Builder.explorer` for exploration)."""
        if kind is not Kind.EXPLORATION or (self.spec.explore_num_steps is None and not self.spec.explore_ode):
            return self.policy
        if self._explorer is None:
            self._explorer = self.builder.explorer(self.spec, self.policy)
        return self._explorer


def member_main(name: str, spec: ServeSpec, conn: Connection, device: str,
                weights: dict[str, torch.Tensor] | None, checkpoint: str | None, started: float,
                version: int | None = None) -> None:
    """Entry point of a member process (see `agent.NodeAgent.spawn`)."""
    # One intra-op thread per member: several members share a node's cores, and oversubscribed
    # OpenMP pools on 2 cores with 4 members are many times slower than 1 thread each.
    torch.set_num_threads(1)
    # SIGTERM is the node's preemption notice, which its agent watches (`ray_agent`): a preempted
    # VM's shutdown sends it to every process, and a member must live on to finish the step in
    # flight and give its request back. It ends when its agent stops it, kills it, or goes (the
    # pipe closes: `serve` returns), never on the signal itself.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    channel = P.Channel(conn)
    member = Member(name, spec, channel, device)
    try:
        member.build(weights, checkpoint, started, version)
    except Exception:
        channel.send(P.Failed(name, traceback.format_exc()))
        os._exit(1)
    del weights  # the node's shared-memory copy is the agent's; this process keeps its own
    member.serve()
