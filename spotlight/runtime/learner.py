"""The learner: the trainer role. It owns the policy being trained, its optimiser and checkpoints.

Plain Python; the Ray runtime hosts it in an on-demand actor (`spotlight.runtime.ray_runtime`), the local
runtime calls it directly. Weights leave it only through `weights()` (a CPU state dict tagged with
the version = iterations applied), which rollout workers load before computing a version's requests.

With `train.ema_decay` it also keeps an EMA of the trained parameters (`spotlight.rl.ema`), which
only it holds: it samples evaluation requests with it itself (`evaluate`), checkpoints it and
writes it to `final/`; the workers never see it.

It counts the bytes an update moves (`tensor_bytes`), for metrics.jsonl: `publish_bytes`, what the
publication after the update carries (the tensors `weights()` hands out), and with the update on
the fleet `update_gradient_bytes`, the gradients that arrived for it, every round's: one per
`TRAIN` request, each the sum of `train.parts_per_request` micro-batches. The
simulator's byte model (`spotlight.sim.transfers`) is checked against them
(tests/spotlight/sim/test_transfer_bytes.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch

from spotlight.checkpoints import checkpoint, sharded
from spotlight.checkpoints.model_card import write_model_card
from spotlight.config import RunConfig
from schedulers.request import Request
from spotlight.rl.ema import ema_init, ema_update_, swapped_in
from spotlight.rl.gradient import GradientSum, Gradients, chunk_gradient
from spotlight.rl.lora import LocalBase, add_lora, base_state, fingerprint, trainable, trained_state
from spotlight.rl.policy import Policy, Rollout
from spotlight.rl.prompts import Prompt
from spotlight.rl.prompt_file import run_prompts
from spotlight.rl.warm_start import apply_warm_start
from spotlight.checkpoints.resume_identity import identity, mismatch


class NonFiniteUpdate(RuntimeError):
    """A NaN or infinite loss or gradient: the optimiser step that would have applied it is not
    taken, and the run stops. `str(err)` is one line naming the iteration."""


def build_policy(cfg: RunConfig) -> Policy:
    if cfg.policy.kind == "dit":
        from spotlight.rl.dit_policy import DiTPolicy

        return DiTPolicy.from_config(cfg)
    from spotlight.rl.llm_policy import LLMPolicy

    return LLMPolicy.from_config(cfg)


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of `tensors` as they travel (numel x element size each; no header)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def on_cpu(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A copy of `state` on the CPU that later steps do not change (what leaves the learner)."""
    return {k: v.detach().cpu().clone() for k, v in state.items()}


class PinnedStaging:
    """The way the weights leave a CUDA learner: copied into page-locked host buffers allocated once
    (one per tensor, kept while its shape and dtype hold), all copies queued before one wait, then
    cloned into ordinary memory — the copy that later steps do not change. Measured on an H100
    (docs/measurements.md, 2026-11-27): the LoRA adapters to pageable memory 1.5 s, into pinned
    buffers 34 ms; a clone in host memory costs a memcpy at host bandwidth."""

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}

    def copy(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        for k, v in state.items():
            self.put(k, v)
        return self.take(list(state))

    def put(self, name: str, value: torch.Tensor) -> None:
        """Queue `value`'s copy into `name`'s buffer (`value` may be freed once this returns: the
        allocator reuses its memory only for work queued after the copy, on the same stream)."""
        buf = self.buffers.get(name)
        if buf is None or buf.shape != value.shape or buf.dtype != value.dtype:
            buf = self.buffers[name] = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
        buf.copy_(value.detach(), non_blocking=True)

    def take(self, names: list[str], copy: bool = True) -> dict[str, torch.Tensor]:
        """The buffers `put` filled, once every queued copy has landed (the one wait): copies of
        them, or (`copy=False`) the buffers themselves, valid until the next `put`."""
        torch.cuda.synchronize()
        return {k: self.buffers[k].clone() if copy else self.buffers[k] for k in names}


class Learner:
    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.version = 0
        self.ema: dict[str, torch.Tensor] | None = None
        """With `train.ema_decay`: the EMA of `trained_state`, float32, on the model's device."""
        self.gradient_bytes = 0
        """Bytes of the gradients received for the update in progress (`step_added`), every round's."""
        self._incoming: tuple[int, GradientSum, int] | None = None
        """(round, its sum so far, bytes received for it) while a fleet update's chunks arrive."""
        self._staging: PinnedStaging | None = None
        """On CUDA: the page-locked buffers `weights()` copies through, made at its first call."""

    def build(self, checkpoints: Path | None = None) -> dict[str, Any]:
        """Make the policy, warm-start it (cached), freeze the KL reference, and resume from the
        newest checkpoint under `checkpoints` that verifies and loads (`checkpoint.newest_usable`:
        the ones skipped are set aside). Returns {"warm_start", "step", "checkpoint", "skipped"}:
        "skipped" holds one line per checkpoint set aside, for the controller to log. With
        `train.ema_decay` the EMA starts at the weights the update starts from (warm-started, with
        the adapters injected), or is the checkpoint's: one without it is refused as unusable."""
        cfg = self.cfg
        torch.set_num_threads(cfg.runtime.torch_threads)  # the same in every role (runtime.torch_threads)
        torch.manual_seed(cfg.seed)  # nothing should draw from it; seeded so that nothing varies if something does
        self.policy = build_policy(cfg)
        warm = apply_warm_start(self.policy, cfg, run_prompts(cfg.prompts, cfg.seed))
        if cfg.policy.lora.enabled:  # after the warm start: it trains the base, the adapters start at zero
            add_lora(self.policy.model, cfg)
        if cfg.grpo.kl_beta > 0:
            self.policy.set_reference()
        self.optimizer = torch.optim.Adam(trainable(self.policy.model), lr=cfg.train.lr)
        if cfg.train.ema_decay > 0:
            self.ema = ema_init(trained_state(self.policy.model))
        # What every checkpoint records and every resume checks first (another run's is refused).
        self.identity = identity(cfg, trained_state(self.policy.model))
        skipped: list[str] = []
        ckpt = None if checkpoints is None else checkpoint.newest_usable(Path(checkpoints), skipped.append,
                                                                         use=self._load)
        notes = []
        if ckpt is not None:
            self.version = ckpt.step
            if sharded.is_sharded(ckpt):
                notes.append(f"checkpoint {ckpt.path.name} was written by {self._group} learner processes; its "
                             "shards are gathered into this one")
        return {"warm_start": warm, "step": self.version, "checkpoint": str(ckpt.path) if ckpt else None,
                "skipped": skipped, "notes": notes}

    def _load(self, ckpt: checkpoint.Checkpoint) -> None:
        """Checkpoint `ckpt` into the model and optimiser: this learner's format, or a learner
        group's (`train.learner_gpus` > 1 wrote it: the shards read whole, `sharded.load`)."""
        if not sharded.is_sharded(ckpt):
            checkpoint.load(ckpt, self.policy.model, self.optimizer, ema=self.ema, belongs=self._belongs)
        else:  # a group keeps no EMA, so a run with one is another config: `belongs` refuses it
            state = sharded.load(ckpt, self.policy.model, self.optimizer, belongs=self._belongs)
            self._group = state.get("learner_gpus")

    def weights(self) -> dict[str, torch.Tensor]:
        """The current weights (version `self.version`) as a CPU state dict: what training changes
        (`trained_state`: every weight, or only the adapters with LoRA). Published after every
        update, so on CUDA through pinned buffers (`PinnedStaging`)."""
        state = trained_state(self.policy.model)
        if not self.cfg.device.startswith("cuda"):
            return on_cpu(state)
        if self._staging is None:
            self._staging = PinnedStaging()
        return self._staging.copy(state)

    def base(self) -> dict[str, torch.Tensor] | LocalBase | None:
        """With LoRA, what a worker needs once, when it starts, to hold the learner's frozen base
        (then `weights()` carries the adapters alone); None without LoRA.

        Without a warm start every node builds the same base from the config (the pretrained
        folder, or the seed's random weights), so only its fingerprint goes (`LocalBase`): a 41 GB
        Qwen-Image base is read from each node's disk rather than sent from this one. A warm-started
        base exists only here (a warm start on other hardware could round differently): its
        weights go, as a CPU state dict."""
        if not self.cfg.policy.lora.enabled:
            return None
        if self.cfg.warm_start.steps == 0:
            return LocalBase(fingerprint(base_state(self.policy.model)))
        return on_cpu(base_state(self.policy.model))

    def full_state(self) -> dict[str, torch.Tensor]:
        """The whole model's state dict (CPU; with LoRA: the base under peft's names and the
        adapters): what an SP node's members start from (`RaySPExecutor`), before the adapters
        of each version."""
        return on_cpu(self.policy.model.state_dict())

    def update(self, parts: list[Rollout], advantages: torch.Tensor) -> dict[str, float]:
        """`train.updates_per_step` optimiser steps over the rollout made of per-request `parts`
        (in request order), every micro-batch computed here, summed in the tree the fleet's
        requests sum in (chunks of `train.parts_per_request`: `spotlight.rl.gradient`); bumps the version."""
        rollout = self.policy.merge(parts)
        stats: dict[str, float] = {}
        for u in range(self.cfg.train.updates_per_step):
            total = GradientSum(self.policy.update_parts(rollout), self.cfg.train.parts_per_request)
            for c, indices in enumerate(total.ranges):
                total.add(c, *chunk_gradient(self.policy, rollout, advantages, indices))
            stats = self.step(u, total)
        return stats

    def update_parts(self, parts: list[Rollout]) -> int:
        """Micro-batches in each round of the update over `parts` (the fleet computes them in
        `Kind.TRAIN` requests of `train.parts_per_request` each; `step_with` takes their sums)."""
        return self.policy.update_parts(self.policy.merge(parts))

    def step(self, round: int, total: GradientSum) -> dict[str, float]:
        """Round `round` of the update: one optimiser step with the summed gradient `total`; the
        last round (`train.updates_per_step`) bumps the version. The stats of the round."""
        n = self.cfg.train.updates_per_step
        self.optimizer.zero_grad(set_to_none=True)
        total.apply_to(self.policy.model)
        stats = total.stats()
        stats["grad_norm"] = torch.nn.utils.clip_grad_norm_(trainable(self.policy.model),
                                                            self.cfg.train.grad_clip).item()
        # One NaN step poisons every weight it touches (Adam spreads it through its moments), and
        # every later checkpoint would carry it: stop before the step instead.
        bad = next(((k, v) for k, v in stats.items() if isinstance(v, float) and not math.isfinite(v)), None)
        if bad is not None:
            raise NonFiniteUpdate(f"iteration {self.version}: {bad[0]} is {bad[1]} in update {round + 1} of {n}: "
                                  "training diverged (a smaller train.lr or grad_clip may help)")
        self.optimizer.step()
        if self.ema is not None:
            ema_update_(self.ema, trained_state(self.policy.model), self.cfg.train.ema_decay)
        if round == n - 1:
            self.version += 1
            # What the publication after this update carries: `weights()` copies these tensors.
            stats["publish_bytes"] = tensor_bytes(trained_state(self.policy.model).values())
        return stats

    def step_with(self, round: int, results: list[tuple[Gradients, dict[str, float]]]) -> dict[str, float]:
        """`step` with the fleet's results, one per `TRAIN` request in chunk order: each is a chunk's
        sum (`chunk_gradient`), so adding them in that order is the tree's last level
        (`add_part` each, then `step_added`)."""
        for i, result in enumerate(results):
            self.add_part(round, i, len(results), [result])
        return self.step_added(round)

    def add_part(self, round: int, chunk: int, chunks: int, results: list[tuple[Gradients, dict[str, float]]]) -> None:
        """Round `round`'s chunk `chunk` of `chunks` (`results`: the one request's result, as the
        queue gives it), folded into the round's sum in chunk order as it arrives — while the
        fleet computes the rest (`schedulers.update.FleetUpdate`'s `add`); `step_added` steps once
        every chunk is in."""
        if self._incoming is None or self._incoming[0] != round:
            self._incoming = (round, GradientSum(chunks), 0)
        (grads, stats), = results
        _, total, received = self._incoming
        total.add(chunk, grads, stats)
        self._incoming = (round, total, received + tensor_bytes(grads.values()))

    def step_added(self, round: int) -> dict[str, float]:
        """`step` with the sum of the chunks `add_part` took for round `round`. Its stats carry
        `update_gradient_bytes`: the bytes of the gradients received for this update so far (this
        round and the ones before it), as they arrived."""
        if self._incoming is None or self._incoming[0] != round:
            raise RuntimeError(f"round {round} of the update has no gradient yet")
        _, total, received = self._incoming
        self._incoming = None
        self.gradient_bytes = received + (self.gradient_bytes if round > 0 else 0)
        return {**self.step(round, total), "update_gradient_bytes": self.gradient_bytes}

    def evaluate(self, requests: list[Request]) -> list[Rollout]:
        """`requests` sampled here with the EMA weights swapped in (`policy.rollout`, one `Rollout`
        per request, in order), as a worker samples a request but without the trajectories: what
        the reward reads. The training weights are put back bit for bit; the optimiser is not
        touched. Without an EMA: with the current weights (the runtimes ask the workers then)."""
        out = []
        with self._ema_weights():
            for req in requests:  # the prompts of a request as `RolloutWorker.compute` builds them
                prompts = [Prompt(req.prompt_id, req.prompt_text)] * len(req.seeds)
                out.append(dataclasses.replace(self.policy.rollout(prompts, list(req.seeds)), data={}))
        return out

    def _ema_weights(self) -> AbstractContextManager[None]:
        """Inside the block the model holds the EMA weights (`swapped_in`); without an EMA, its own."""
        return swapped_in(self.policy.model, self.ema) if self.ema is not None else nullcontext()

    def _belongs(self, state: dict[str, Any]) -> str | None:
        """Why a checkpoint's state.json `state` is not this run's (None: it is)."""
        return mismatch(state.get("identity"), self.cfg, self.identity["shapes"])

    def save_checkpoint(self, root: Path) -> str:
        return str(checkpoint.save(Path(root), self.version, self.policy.model, self.optimizer, ema=self.ema,
                                   extra={"identity": self.identity}).path)

    def save_final(self, path: Path) -> None:
        """The trained policy in its libraries' formats (`Policy.save_pretrained`) and its model card;
        with `train.ema_decay`, the EMA weights (the training weights are put back afterwards)."""
        with self._ema_weights():
            self.policy.save_pretrained(Path(path))
        write_model_card(Path(path), self.cfg, self.version)
        checkpoint.give_own_modes(Path(path))
