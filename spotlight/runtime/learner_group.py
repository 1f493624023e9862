"""The learner as a group of N processes (`train.learner_gpus: N`, issue 40): a full fine-tune whose
weights, gradients and Adam moments one GPU cannot hold is sharded over N with FSDP2
(`spotlight.rl.sharding`), each rank one process (one GPU on CUDA; gloo on CPU), checkpointed
shard by shard (`spotlight.checkpoints.sharded`).

`LearnerGroup` stands where `Learner` stands (the methods the runtimes call for a learner-only
update without an EMA), in the controller's process (the local runtime) or a Ray actor; it starts the ranks
(`GroupRank`, one process each, `_serve`) and sends each call to all of them — every rank runs the
same calls in the same order, so their collectives meet. Rank 0 answers.
The controller keeps a plain copy of the policy (`LearnerGroup.policy`) for the runtime's rollout
worker and for `final/`: it loads the gathered weights after every update.

An update round: the micro-batches are dealt round-robin, micro-batch i to rank i mod N, in
lockstep slots (FSDP2 reduces each backward's gradient across the ranks, so every rank runs the
same number of backward passes: a rank with no micro-batch left in the last slot runs one with
weight 0). Each backward's gradients are summed over the ranks (not averaged) and accumulated;
then the gradient norm is clipped (over the whole model), the stats are summed over the ranks, a
non-finite one stops every rank before the step, and Adam steps each rank's shard.

What is bit-identical: a group of N against itself — the same config and seed give the same
weights, and a resume (same N) continues bit for bit (tests/spotlight/runtime/test_learner_group.py).
What is not: N against 1 — the gradient of an update is summed in another order (rank sums per
slot, then slots; the single learner folds micro-batch after micro-batch), so weights differ by
float rounding (measured and stated in docs/design-choices.md). Adam itself is elementwise: a
shard steps exactly as the same elements would in one process.

On the Ray runtime the group is one actor (`ray_runtime.LearnerGroupActor`, holding the N GPUs on
CUDA) whose rank processes run on its node: the group spans one on-demand node.

Not yet (issue 40; the config refuses each in one line, `RunConfig.__post_init__`): LoRA, an EMA,
the fleet computing the update (`train.update_on`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import traceback
import warnings
from multiprocessing.connection import Client, Connection, Listener, wait
from pathlib import Path
from typing import Any

import torch

from spotlight.checkpoints import checkpoint, sharded
from spotlight.checkpoints.model_card import write_model_card
from spotlight.checkpoints.resume_identity import identity, mismatch
from spotlight.config import ConfigError, RunConfig
from spotlight.rl.lora import load_trained_state, trainable, trained_state
from spotlight.rl.policy import Policy, Rollout, sum_stats
from spotlight.rl.prompt_file import run_prompts
from spotlight.rl.sharding import shard
from spotlight.rl.warm_start import apply_warm_start
from spotlight.runtime.learner import NonFiniteUpdate, PinnedStaging, build_policy, on_cpu, tensor_bytes


def rank_device(device: str, rank: int) -> str:
    """Rank `rank`'s device: the CPU, or the GPU `rank` places after the configured one."""
    if not device.startswith("cuda"):
        return device
    return f"cuda:{int(device.partition(':')[2] or 0) + rank}"


class GroupRank:
    """One rank of the group: its shard of the model and of Adam's state (module docstring)."""

    def __init__(self, cfg: RunConfig, rank: int, world: int, rendezvous: str) -> None:
        import torch.distributed as dist

        self.cfg = dataclasses.replace(cfg, device=rank_device(cfg.device, rank))
        self.rank, self.world = rank, world
        self.version = 0
        self._staging: PinnedStaging | None = None
        """On CUDA, rank 0's page-locked buffers `weights()` copies through, made at its first call."""
        torch.set_num_threads(cfg.runtime.torch_threads)  # the same in every role (runtime.torch_threads)
        if self.cfg.device.startswith("cuda"):
            torch.cuda.set_device(self.cfg.device)
        dist.init_process_group("nccl" if self.cfg.device.startswith("cuda") else "gloo",
                                init_method=rendezvous, rank=rank, world_size=world)

    def build(self, checkpoints: Path | None) -> dict[str, Any]:
        """As `Learner.build`: the policy (its warm start from the cache `Trainer` filled), the KL
        reference, sharded; Adam over the shards; the newest usable checkpoint of either format."""
        from torch.distributed.device_mesh import init_device_mesh

        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        self.policy: Policy = build_policy(cfg)
        warm = apply_warm_start(self.policy, cfg, run_prompts(cfg.prompts, cfg.seed))
        if cfg.grpo.kl_beta > 0:
            self.policy.set_reference()
        model = self.policy.model
        self.dtype = next(model.parameters()).dtype  # what it computes and publishes in
        self.identity = identity(cfg, trained_state(model))  # of the model as one learner holds it
        mesh = init_device_mesh("cuda" if cfg.device.startswith("cuda") else "cpu", (self.world,))
        shard(model, mesh, self.dtype)
        if getattr(self.policy, "ref_model", None) is not None:
            shard(self.policy.ref_model, mesh, self.dtype)
        elif getattr(self.policy, "reference", None) is not None:
            shard(self.policy.reference, mesh, self.dtype)
        self.optimizer = torch.optim.Adam(trainable(model), lr=cfg.train.lr)
        skipped: list[str] = []
        ckpt = None if checkpoints is None else self._resume(Path(checkpoints), skipped.append)
        notes = []
        if ckpt is not None:
            self.version = ckpt.step
            written = self._loaded_state.get("learner_gpus", 1)
            if written == 1:
                notes.append(f"checkpoint {ckpt.path.name} was written by one learner process; it is cut into "
                             f"{self.world} shards")
            elif written != self.world:
                notes.append(f"checkpoint {ckpt.path.name} was written by {written} learner processes; its shards "
                             f"are redistributed over {self.world}")
        return {"warm_start": warm, "step": self.version, "checkpoint": str(ckpt.path) if ckpt else None,
                "skipped": skipped, "notes": notes}

    def _resume(self, root: Path, refused: Any) -> checkpoint.Checkpoint | None:
        """`checkpoint.newest_usable` for a group: rank 0 alone walks back, verifies and sets aside
        (the ranks share the folder), every rank loads what it found; a checkpoint that verified but
        does not load is set aside by rank 0 too, and the walk goes on. Another run's is refused."""
        import torch.distributed as dist

        while True:
            found = [None]
            if self.rank == 0:
                ckpt = checkpoint.newest_usable(root, refused)  # verified: manifest, sizes, hashes, headers
                found = [ckpt.step if ckpt is not None else None]
            dist.broadcast_object_list(found, src=0)
            if found[0] is None:
                return None
            ckpt = checkpoint.Checkpoint(root / f"{checkpoint.PREFIX}{found[0]:06d}", found[0])
            try:
                how = sharded.load if sharded.is_sharded(ckpt) else sharded.load_plain
                self._loaded_state = how(ckpt, self.policy.model, self.optimizer, hashes=False,
                                         belongs=self._belongs)
                return ckpt
            except checkpoint.CheckpointMismatch:
                raise
            except checkpoint.CheckpointError as err:  # every rank read the same files: all are here
                dist.barrier()
                if self.rank == 0:
                    moved = checkpoint.set_aside(ckpt)
                    refused(f"checkpoint {ckpt.path} skipped: {err}; moved to {moved.name}")
                dist.barrier()

    def _belongs(self, state: dict[str, Any]) -> str | None:
        return mismatch(state.get("identity"), self.cfg, self.identity["shapes"])

    def update(self, parts: list[Rollout], advantages: torch.Tensor) -> dict[str, float]:
        """`train.updates_per_step` rounds over the rollout (module docstring); bumps the version."""
        rollout = self.policy.merge(parts)
        stats: dict[str, float] = {}
        for u in range(self.cfg.train.updates_per_step):
            stats = self._round(u, rollout, advantages)
        return stats

    def _round(self, u: int, rollout: Rollout, advantages: torch.Tensor) -> dict[str, float]:
        import torch.distributed as dist

        n = self.cfg.train.updates_per_step
        model, policy = self.policy.model, self.policy
        self.optimizer.zero_grad(set_to_none=True)
        parts = policy.update_parts(rollout)
        own: dict[str, float] = {}
        for slot in range(-(-parts // self.world)):
            index = slot * self.world + self.rank
            if index < parts:
                own = sum_stats([own, policy.backward_part(rollout, advantages, index)])
            else:  # nothing left for this rank: a pass that adds nothing, for the collectives
                own = {k: own.get(k, 0.0) for k in policy.backward_part(rollout, advantages, parts - 1, scale=0.0)}
        keys = sorted(own)
        summed = torch.tensor([own[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(summed)
        stats = dict(zip(keys, summed.tolist()))
        norm = torch.nn.utils.clip_grad_norm_(trainable(model), self.cfg.train.grad_clip)
        stats["grad_norm"] = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        bad = next(((k, v) for k, v in stats.items() if not math.isfinite(v)), None)
        if bad is not None:  # every rank sees the same sums: all stop here, none steps
            raise NonFiniteUpdate(f"iteration {self.version}: {bad[0]} is {bad[1]} in update {u + 1} of {n}: "
                                  "training diverged (a smaller train.lr or grad_clip may help)")
        self.optimizer.step()
        if u == n - 1:
            self.version += 1
            stats["publish_bytes"] = sum(p.numel() for p in trainable(model)) * self.dtype.itemsize
        return stats

    def weights(self, handoff: str | None = None) -> dict[str, torch.Tensor] | str | None:
        """The whole model's weights on rank 0 (CPU, in the dtype it computes in) — or, given a
        `handoff` path, written there as a safetensors file and the path returned; None on the
        other ranks, which take part in the gathers. Gathered a tensor at a time (a rank holds one
        whole tensor beyond its shard, not the model), cast on the device and, on CUDA, copied out
        through page-locked buffers (`PinnedStaging`, as the single learner publishes)."""
        from safetensors.torch import save_file
        from torch.distributed.tensor import DTensor

        cuda = self.cfg.device.startswith("cuda")
        if cuda and self._staging is None:
            self._staging = PinnedStaging()
        names, out = [], {}
        for name, value in self.policy.model.state_dict().items():
            whole = value.full_tensor() if isinstance(value, DTensor) else value  # a collective
            if self.rank != 0:
                continue
            whole = whole.detach().to(self.dtype) if whole.is_floating_point() else whole.detach()
            if cuda:
                self._staging.put(name, whole)
                names.append(name)
            else:
                out[name] = whole if handoff else whole.clone()
        if self.rank != 0:
            return None
        if cuda:  # the buffers as they are into a file; copies of them into a reply
            out = self._staging.take(names, copy=handoff is None)
        if handoff is None:
            return out
        save_file(out, handoff)
        return handoff

    def save_checkpoint(self, root: Path) -> str:
        return str(sharded.save(Path(root), self.version, self.policy.model, self.optimizer,
                                extra={"identity": self.identity}).path)


def _send(conn: Connection, value: Any) -> None:
    """`value` to the other end, pickled by value (a Connection's own pickler would pass torch
    tensors as shared-memory handles, which only a multiprocessing child of this process can open)."""
    conn.send_bytes(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def _serve(conn: Connection, rank: int, world: int, rendezvous: str) -> None:
    """A rank's process (`python -m spotlight.runtime.learner_group`): take the run config, then run
    the calls the group sends, in order, until told to stop (None) or the controller is gone (its
    end of the connection closed)."""
    # FSDP2 warns that a model's output is a view, which an in-place op would cut from its backward
    # hook: the policies never change a model's output in place (they compute out of place from it).
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    try:
        member = GroupRank(_recv(conn), rank, world, rendezvous)
    except BaseException as err:
        _send(conn, ("error", type(err).__name__, f"{err}", traceback.format_exc()))
        return
    while True:
        try:
            call = _recv(conn)
        except (EOFError, OSError):
            break
        if call is None:
            break
        name, args = call
        try:
            _send(conn, ("ok", getattr(member, name)(*args)))
        except BaseException as err:
            _send(conn, ("error", type(err).__name__, f"{err}", traceback.format_exc()))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


KEY = "SPOTLIGHT_LEARNER_GROUP_KEY"
"""The environment variable a rank reads its connection's key from (then drops it)."""
PASSED_ON = {e.__name__: e for e in (NonFiniteUpdate, checkpoint.CheckpointMismatch, ConfigError)}
"""What a rank raises that the controller handles by its kind (a diverged update, another run's
checkpoint, a bad config): raised again here, its line as it was."""


def rank_command(address: str, rank: int, world: int, rendezvous: str) -> list[str]:
    """The command line of rank `rank`'s process (`main`)."""
    return [sys.executable, "-m", __name__, address, str(rank), str(world), rendezvous]


SHARED_MEMORY = "/dev/shm"
"""Where the gathered weights are handed to the controller, memory-backed (Linux's tmpfs)."""


def _handoff(nbytes: int) -> str | None:
    """A new private folder in `SHARED_MEMORY` with room for `nbytes` (and 10% to spare); None when
    there is none (no such file system, or too small)."""
    try:
        if shutil.disk_usage(SHARED_MEMORY).free < nbytes * 1.1:
            return None
        return tempfile.mkdtemp(prefix="spotlight-weights-", dir=SHARED_MEMORY)
    except OSError:
        return None


def load_file_into(model: torch.nn.Module, path: str) -> None:
    """A safetensors file of `model`'s whole state dict copied into it tensor by tensor (its names
    must be exactly the model's, as `load_state_dict` would check)."""
    from safetensors import safe_open

    state = model.state_dict()
    with safe_open(path, framework="pt") as f:
        names = set(f.keys())
        if names != set(state):
            diff = sorted(names ^ set(state))
            raise KeyError(f"the gathered weights' tensor names differ from the model's ({', '.join(diff[:3])}...)")
        with torch.no_grad():
            for name in names:
                state[name].copy_(f.get_tensor(name))


def _connect(listener: Listener, key: bytes, processes: list[subprocess.Popen]) -> dict[int, Connection]:
    """Rank -> its connection, once every rank has connected. A rank that exits first (a broken
    import in its environment, a GPU it cannot open: its traceback is on the terminal above)
    ends the wait with one line, rather than leaving `spotlight train` waiting for it forever."""
    conns: dict[int, Connection] = {}
    failed: list[BaseException] = []

    def accept() -> None:
        try:
            while len(conns) < len(processes):
                conn = listener.accept()
                rank = _recv(conn)
                if rank == _WAKE:  # the wait below is over
                    conn.close()
                    return
                conns[rank] = conn
        except BaseException as err:  # a bad handshake
            failed.append(err)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(timeout=0.1)
        gone = [(rank, code) for rank, p in enumerate(processes)
                if rank not in conns and (code := p.poll()) is not None]
        if gone and thread.is_alive():
            # A closed listener does not wake a thread in accept() (Linux): a connection of our own does.
            with Client(listener.address, family="AF_UNIX", authkey=key) as wake:
                _send(wake, _WAKE)
            thread.join()
            rank, code = gone[0]
            raise LearnerGroupError(f"learner process {rank} of {len(processes)} exited with code {code} before "
                                    "it connected (its error is above)")
    if failed:
        raise LearnerGroupError(f"the learner processes did not connect: {type(failed[0]).__name__}: {failed[0]}")
    return conns


_WAKE = -1
"""What `_connect` sends itself to end its accepting thread."""


class LearnerGroupError(RuntimeError):
    """A rank failed: `str(err)` is one line naming it and what it raised; the traceback follows."""


class LearnerGroup:
    """The `Learner` of a run with `train.learner_gpus` > 1 (module docstring)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.version = 0
        self._ranks: list[tuple[subprocess.Popen, Connection]] = []
        self._folder = tempfile.mkdtemp(prefix="spotlight-learners-")

    def build(self, checkpoints: Path | None = None) -> dict[str, Any]:
        """Start the ranks and build them (`GroupRank.build`); the controller's plain copy of the
        policy gets their weights. Each rank is `python -m spotlight.runtime.learner_group` (not a
        multiprocessing child: those import the parent's main module again, a user's script
        included), connected back through a socket in a private folder, with a key only it has.
        The copy is on the learner's device where the rollout worker samples with it (the local
        runtime); on the Ray runtime the workers are elsewhere and it stays on the CPU (`weights`,
        `final/`)."""
        n = self.cfg.train.learner_gpus
        key = secrets.token_bytes(32)
        address = os.path.join(self._folder, "group.sock")
        rendezvous = f"file://{os.path.join(self._folder, 'store')}"
        env = {**os.environ, KEY: key.hex()}
        with Listener(address, family="AF_UNIX", authkey=key) as listener:
            processes = [subprocess.Popen(rank_command(address, rank, n, rendezvous), env=env) for rank in range(n)]
            try:
                conns = _connect(listener, key, processes)
            except BaseException:
                for process in processes:  # none is left behind, whichever did not connect
                    process.kill()
                    process.wait()
                raise
        self._ranks = [(processes[rank], conns[rank]) for rank in range(n)]
        for _, conn in self._ranks:
            _send(conn, self.cfg)
        info = self._call("build", checkpoints)
        self.version = info["step"]
        torch.set_num_threads(self.cfg.runtime.torch_threads)
        here = self.cfg if self.cfg.runtime.kind == "local" else dataclasses.replace(self.cfg, device="cpu")
        self.policy = build_policy(here)  # the rollout worker's and final/'s: plain, whole
        self._bytes = tensor_bytes(self.policy.model.state_dict().values())  # what a gather hands over
        self._gather()
        return info

    def _gather(self) -> None:
        """The ranks' weights into the controller's copy. Through a file in shared memory where it
        has room for them (`_handoff`: read back tensor by tensor, so the copy never sits beside a
        second whole one); else through the connection, pickled (a container's /dev/shm is often
        64 MiB)."""
        folder = _handoff(self._bytes)
        if folder is None:
            load_trained_state(self.policy.model, self._call("weights"))
            return
        path = os.path.join(folder, "weights.safetensors")
        try:
            self._call("weights", path)
            load_file_into(self.policy.model, path)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def weights(self) -> dict[str, torch.Tensor]:
        """The last update's weights (a CPU copy later updates do not change): what the Ray
        runtime publishes to its workers, as `Learner.weights`."""
        return on_cpu(trained_state(self.policy.model))

    def full_state(self) -> dict[str, torch.Tensor]:
        """As `Learner.full_state` (an SP node's members start from it): without LoRA, the weights."""
        return self.weights()

    def _call(self, name: str, *args: Any) -> Any:
        """`name(*args)` on every rank; rank 0's answer. A rank that fails ends the group (the others
        would wait for it in a collective forever): LearnerGroupError, or the NonFiniteUpdate it raised."""
        for _, conn in self._ranks:
            _send(conn, (name, args))
        answers: dict[int, Any] = {}
        ranks = list(self._ranks)
        conns = {conn: rank for rank, (_, conn) in enumerate(ranks)}
        while len(answers) < len(ranks):
            for conn in wait([c for c, r in conns.items() if r not in answers]):
                rank = conns[conn]
                try:
                    answer = _recv(conn)
                except (EOFError, OSError):  # it died without a word (killed, out of memory)
                    try:
                        code = ranks[rank][0].wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        code = None
                    answer = ("error", "ProcessExited", f"exit code {code}", "")
                if answer[0] == "error":
                    self.close()
                    _, kind, message, trace = answer
                    if kind in PASSED_ON:  # what the controller answers as it does a single learner's
                        raise PASSED_ON[kind](message)
                    raise LearnerGroupError(f"learner process {rank} of {len(ranks)}: {kind}: {message}\n{trace}")
                answers[rank] = answer[1]
        return answers[0]

    def update(self, parts: list[Rollout], advantages: torch.Tensor) -> dict[str, float]:
        stats = self._call("update", parts, advantages)
        self.version += 1
        self._gather()  # the weights the rollout worker samples with (the publication after the update)
        return stats

    def save_checkpoint(self, root: Path) -> str:
        return self._call("save_checkpoint", root)

    def save_final(self, path: Path) -> None:
        """As `Learner.save_final`, from the controller's copy (it holds the last update's weights)."""
        self.policy.save_pretrained(Path(path))
        write_model_card(Path(path), self.cfg, self.version)
        checkpoint.give_own_modes(Path(path))

    def close(self) -> None:
        """Stop the ranks: asked first, then ended (a rank stuck in a collective does not answer)."""
        for process, conn in self._ranks:
            try:
                _send(conn, None)
            except (OSError, ValueError):
                pass
        for process, conn in self._ranks:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            conn.close()
        self._ranks = []
        shutil.rmtree(self._folder, ignore_errors=True)


def main(argv: list[str]) -> None:
    """A rank: `python -m spotlight.runtime.learner_group ADDRESS RANK WORLD RENDEZVOUS`, the key in
    the environment (`KEY`)."""
    address, rank, world, rendezvous = argv
    conn = Client(address, family="AF_UNIX", authkey=bytes.fromhex(os.environ.pop(KEY)))
    _send(conn, int(rank))
    _serve(conn, int(rank), int(world), rendezvous)
    if rank == "0":  # the group's private folder, which a controller killed outright leaves behind
        shutil.rmtree(os.path.dirname(address), ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
