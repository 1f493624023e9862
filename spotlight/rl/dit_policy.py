"""The DiT policy: Flow-GRPO on a Qwen-Image-class transformer.

Rollout samples with the resumable SDE sampler and keeps each sample's trajectory and per-step
log-probs; the update recomputes the log-prob of every stochastic transition under the current
weights and applies the PPO-clip loss over (sample, SDE step) pairs.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from cloud.bounded_json import load_file
from spotlight.config import MAX_CONFIG_BYTES, ConfigError, DiTConfig, RunConfig
from spotlight.rl.dit_model import (PixelDecoder, QwenVAEDecoder, build_transformer, check_pipeline_folder,
                                    model_dtype, pack, pretrained_folder, true_cfg, unpack, velocity)
from spotlight.rl.dit_sampler import FlowSDESampler, SampleState
from spotlight.rl.flow_sde import qwen_image_sigmas, sde_mean_std
from spotlight.rl.lora import base_state, frozen_reference, has_lora, lora_metadata, storable
from spotlight.rl.grpo import flow_grpo_kl, gaussian_kl_same_std, gaussian_logprob, ppo_clip_loss
from spotlight.rl.phase_seconds import PhaseSeconds
from spotlight.rl.policy import Rollout, sum_stats
from spotlight.rl.prompt_encoder import HashedWordEncoder, PromptEncoder, QwenPromptEncoder
from spotlight.rl.prompts import Prompt
from spotlight.rl.seeding import generator
from spotlight.rl.synthetic_images import images_to_latents, synthetic_images, synthetic_text_images

_WARM_START = 0x3A3  # stream tag of the warm start's data and noise


def _local_scheduler_config(dit: DiTConfig) -> dict | None:
    """The checkpoint folder's scheduler/scheduler_config.json, when there is one."""
    file = pretrained_folder(dit) / "scheduler" / "scheduler_config.json" if dit.pretrained_path else None
    return load_file(file, max_bytes=MAX_CONFIG_BYTES) if file is not None and file.is_file() else None


def conditioning(cfg: RunConfig, model) -> tuple[PromptEncoder, Callable[[torch.Tensor], torch.Tensor]]:
    """The text encoder and the latent decoder of run `cfg`'s DiT `model`, on `cfg.device`, in
    `model_dtype` (the VAE in float32): a pipeline folder's own (`QwenPromptEncoder` from its text_encoder/ and
    tokenizer/, `QwenVAEDecoder` from its vae/), else the hashed stand-in and, for the tiny
    preset, the pixel decoder (the latent is the image). The learner, every rollout worker and
    every SP member (`sp_member.build_policy`) build theirs here, so all condition and decode alike."""
    dit = cfg.policy.dit
    path = pretrained_folder(dit) if dit.pretrained_path else None
    dtype = model_dtype(dit)
    if path is not None and (path / "text_encoder").is_dir():
        encoder: PromptEncoder = QwenPromptEncoder(path, cfg.device, dtype)
    else:
        encoder = HashedWordEncoder(model.config.joint_attention_dim, dit.text_tokens)
    if path is not None and (path / "vae").is_dir():
        # float32 whatever the transformer's dtype, as flow_grpo keeps its VAE
        # (`pipeline.vae.to(device, dtype=torch.float32)`, scripts/train_*.py): the decode makes the
        # pixels the reward scores, and the VAE is small (Qwen-Image's: 127M parameters, 0.5 GB).
        return encoder, QwenVAEDecoder(path, cfg.device, torch.float32)
    if dit.preset == "tiny":
        return encoder, PixelDecoder()
    raise ConfigError(f"policy.dit.pretrained_path: the qwen-image preset needs a local checkpoint with vae/ to "
                      f"decode latents, got {dit.pretrained_path!r}")


class DiTPolicy:
    resumable = True
    """Rollout requests can stop after any step and resume from their SampleState."""

    def __init__(self, cfg: RunConfig, model, encoder: PromptEncoder, decoder) -> None:
        self.cfg = cfg
        self.model = model
        self.encoder = encoder
        self.decoder = decoder
        self.ref_model = None
        self._conditioned: tuple | None = None
        self._encoded: tuple | None = None
        self.phase_seconds = PhaseSeconds()
        self._negative_conditioning: tuple[torch.Tensor, torch.Tensor] | None = None
        dit = cfg.policy.dit
        self.side = dit.latent_side
        self.channels = model.config.out_channels
        self.tokens = (self.side // 2) ** 2
        sigmas = qwen_image_sigmas(cfg.sampler.num_steps, self.tokens, _local_scheduler_config(dit))
        self.sampler = FlowSDESampler(cfg.sampler, sigmas, cfg.seed)

    @classmethod
    def from_config(cls, cfg: RunConfig) -> "DiTPolicy":
        """The run's policy: its transformer (`build_transformer`), text encoder and decoder
        (`conditioning`), and with `train.gradient_checkpointing` diffusers' own gradient
        checkpointing on the transformer — it acts only where gradients are taken (the update,
        the warm start) and gives the same gradients (tests/spotlight/rl/test_dit_pipeline.py)."""
        if cfg.policy.dit.pretrained_path:
            pretrained_folder(cfg.policy.dit)  # a remote folder is fetched to this node's cache first
        check_pipeline_folder(cfg)
        model = build_transformer(cfg.policy.dit, cfg.seed, cfg.device)
        if cfg.train.gradient_checkpointing:
            model.enable_gradient_checkpointing()
        return cls(cfg, model, *conditioning(cfg, model))

    @property
    def num_steps(self) -> int:
        return self.sampler.cfg.num_steps

    def for_exploration(self, num_steps: int | None, ode: bool) -> "DiTPolicy":
        """This policy (same model, encoder and decoder: no copy) sampling as exploration does:
        `num_steps` denoising steps (None: the rollout's), stochastic unless `ode`. A seed keeps its
        identity: the initial noise and the k-th SDE step's noise are the rollout's own draws."""
        steps = num_steps or self.num_steps
        if steps == self.num_steps and not ode:
            return self
        view = copy.copy(self)
        sampler_cfg = dataclasses.replace(self.cfg.sampler, num_steps=steps, sde_window=None)
        view.cfg = dataclasses.replace(self.cfg, sampler=sampler_cfg)
        sigmas = qwen_image_sigmas(steps, self.tokens, _local_scheduler_config(self.cfg.policy.dit))
        view.sampler = FlowSDESampler(sampler_cfg, sigmas, self.cfg.seed)
        if ode:
            view.sampler.sde_steps = range(0)
        view.phase_seconds = PhaseSeconds()  # its rollouts report their own seconds
        return view

    # ---- sampling ---------------------------------------------------------------------------

    def _conditioning(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        emb, mask = self.encoder(texts)
        return emb.to(self.cfg.device), mask.to(self.cfg.device)

    def _request_conditioning(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """The conditioning of the samples being advanced, encoded once for all their steps (a
        request is advanced one step a call, to heartbeat and commit between: encoding at every
        step would run the text encoder num_steps times a request) and timed as `encode`."""
        key = tuple(texts)
        if self._encoded is None or self._encoded[0] != key:
            self._encoded = None  # the old one's memory is free before the new one is made
            with self.phase_seconds.timed("encode", self.cfg.device):
                self._encoded = (key, *self._conditioning(texts))
        return self._encoded[1], self._encoded[2]

    def velocity_fn(self, texts: Sequence[str], model=None):
        """The sampler's velocity callable with the prompts' conditioning bound in."""
        emb, mask = self._request_conditioning(texts)
        net = model if model is not None else self.model
        return lambda x, sigma: self._velocity(net, x, sigma, emb, mask)

    def _velocity(self, net, x: torch.Tensor, sigma: torch.Tensor, emb: torch.Tensor,
                  mask: torch.Tensor) -> torch.Tensor:
        """The velocity every path uses — rollout, exploration, the update and its KL reference —
        so that a recomputed log-prob equals the rollout's: guided by the negative prompt when
        `sampler.guidance` > 1 (`true_cfg`). x: (B, S, 4C); sigma: (B,); emb (B, T, D); mask (B, T)."""
        v = velocity(net, x, sigma, emb, mask, self.side)
        scale = self.cfg.sampler.guidance
        if scale == 1:
            return v
        neg_emb, neg_mask = self._negative()
        batch = x.shape[0]
        uncond = velocity(net, x, sigma, neg_emb.expand(batch, -1, -1), neg_mask.expand(batch, -1), self.side)
        return true_cfg(v, uncond, scale)

    def _negative(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The negative prompt's conditioning, (1, T, D) and (1, T): encoded once."""
        if self._negative_conditioning is None:
            self._negative_conditioning = self._conditioning([self.cfg.sampler.negative_prompt])
        return self._negative_conditioning

    def init_state(self, prompts: Sequence[Prompt], seeds: Sequence[int]) -> SampleState:
        return self.sampler.init([p.id for p in prompts], seeds, (self.tokens, 4 * self.channels), self.cfg.device)

    @torch.no_grad()
    def advance(self, prompts: Sequence[Prompt], state: SampleState, until: int | None = None) -> SampleState:
        """Continue `state` (samples of `prompts`) to step `until` (default: the end)."""
        return self.sampler.advance(self.velocity_fn([p.text for p in prompts]), state, until)

    @torch.no_grad()
    def decode(self, state: SampleState) -> torch.Tensor:
        with self.phase_seconds.timed("decode", self.cfg.device):
            return self.decoder(unpack(state.latest, self.side))

    @torch.no_grad()
    def finish(self, prompts: Sequence[Prompt], state: SampleState) -> Rollout:
        """The rollout of samples whose state has reached the last step."""
        if state.step != self.num_steps:
            raise ValueError(f"samples are at step {state.step} of {self.num_steps}, not finished")
        images = self.decode(state)
        return Rollout(list(prompts), list(state.seeds), images=images,
                       data={"trajectory": state.trajectory, "log_probs": state.log_probs},
                       seconds=self.phase_seconds.take())

    @torch.no_grad()
    def rollout(self, prompts: Sequence[Prompt], seeds: Sequence[int]) -> Rollout:
        mb = self.cfg.train.micro_batch
        parts = []
        for lo in range(0, len(prompts), mb):
            ps, ss = list(prompts[lo:lo + mb]), list(seeds[lo:lo + mb])
            parts.append(self.finish(ps, self.advance(ps, self.init_state(ps, ss))))
        return self.merge(parts)

    def merge(self, parts: Sequence[Rollout]) -> Rollout:
        return Rollout.concat(parts)

    # ---- the GRPO update --------------------------------------------------------------------

    def update_parts(self, rollout: Rollout) -> int:
        """How many micro-batches `backward_part` splits the update of `rollout` into: its (sample,
        SDE step) pairs, `train.micro_batch` at a time."""
        return -(-len(rollout) * len(self.sampler.sde_steps) // self.cfg.train.micro_batch)

    def backward_part(self, rollout: Rollout, advantages: torch.Tensor, index: int,
                      scale: float = 1.0) -> dict[str, float]:
        """Accumulate (`scale` x) the gradient of micro-batch `index` of the mean PPO-clip loss over
        all (sample, SDE step) pairs; returns its share of the stats (the stats of the whole update
        are the sums of the parts').

        The pairs are flattened sample-major; each row carries its own sigma, so one forward
        covers several denoising steps."""
        g = self.cfg.grpo
        traj, old = rollout.data["trajectory"], rollout.data["log_probs"]
        steps = list(self.sampler.sde_steps)
        n, k = len(rollout), len(steps)
        total, mb = n * k, self.cfg.train.micro_batch
        rows = torch.arange(index * mb, min((index + 1) * mb, total))
        if not 0 <= index or not len(rows):
            raise IndexError(f"micro-batch {index} of an update of {self.update_parts(rollout)}")
        si, sp = rows // k, rows % k
        st = torch.tensor(steps)[sp]
        sigmas, after_one = self.sampler.sigmas_on(traj.device), float(self.sampler.sigmas[1])
        emb, mask = self._rollout_conditioning(rollout)
        emb, mask = emb[si], mask[si]
        adv = advantages.to(traj.device)
        x, x_next = traj[si, st], traj[si, st + 1]
        sigma, sigma_next = sigmas[st], sigmas[st + 1]
        v = self._velocity(self.model, x, sigma, emb, mask)
        mean, std = sde_mean_std(x, v, sigma, sigma_next, self.cfg.sampler.noise_level, after_one)
        logp = gaussian_logprob(x_next, mean, std)
        loss_el, clipped = ppo_clip_loss(logp, old[si, sp], adv[si], g.clip_low, g.clip_high)
        loss = loss_el.sum()
        kl_sum = torch.zeros((), device=loss.device)
        if g.kl_beta > 0 and self.ref_model is not None:
            with torch.no_grad():
                v_ref = self._velocity(self.ref_model, x, sigma, emb, mask)
                ref_mean, _ = sde_mean_std(x, v_ref, sigma, sigma_next, self.cfg.sampler.noise_level, after_one)
            kl = (gaussian_kl_same_std(mean, ref_mean, std) if g.kl_estimator == "exact"
                  else flow_grpo_kl(mean, ref_mean, std, sigma_next - sigma))
            loss = loss + g.kl_beta * kl.sum()
            kl_sum = kl.detach().sum()
        (loss / total if scale == 1 else loss / total * scale).backward()
        # One transfer to the host for the four stats (each `.item()` would wait on the GPU).
        sums = torch.stack([loss.detach(), clipped.sum(), kl_sum, (logp.detach() - old[si, sp]).abs().sum()])
        loss_s, clipped_s, kl_s, dev_s = sums.float().tolist()
        return {"loss": loss_s / total, "clip_frac": clipped_s / total, "kl": kl_s / total, "ratio_dev": dev_s / total}

    def _rollout_conditioning(self, rollout: Rollout) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompts' conditioning of the whole rollout, encoded together (as the rollout was:
        the padding, hence every number, is the batch's) and kept for its next micro-batch."""
        if self._conditioned is None or self._conditioned[0] is not rollout:
            self._conditioned = (rollout, *self._conditioning([p.text for p in rollout.prompts]))
        return self._conditioned[1], self._conditioned[2]

    def backward(self, rollout: Rollout, advantages: torch.Tensor) -> dict[str, float]:
        """Accumulate the gradient of the mean PPO-clip loss over all (sample, SDE step) pairs, one
        micro-batch (`backward_part`) after the other."""
        return sum_stats(self.backward_part(rollout, advantages, i) for i in range(self.update_parts(rollout)))

    def set_reference(self) -> None:
        self.ref_model = frozen_reference(self.model)

    # ---- warm start ---------------------------------------------------------------------------

    def warm_start(self, prompts: Sequence[Prompt], steps: int, batch_size: int, lr: float, seed: int,
                   on_step: Callable[[], None] | None = None) -> dict[str, float]:
        """Flow matching on synthetic prompt-conditioned images (`synthetic_images`, or with
        `warm_start.data: text` `synthetic_text_images`); `on_step` is called after each step (a progress bar)."""
        if self.cfg.policy.dit.preset != "tiny" or self.cfg.policy.dit.pipeline:
            raise ConfigError("warm_start.steps: the synthetic warm start is for the tiny random model; qwen-image "
                              "and a pipeline folder start from their own weights (set warm_start.steps: 0)")
        opt = torch.optim.Adam(self.model.parameters(), lr=lr)
        texts = [p.text for p in prompts]
        draw = synthetic_text_images if self.cfg.warm_start.data == "text" else synthetic_images
        losses: list[float] = []
        self.model.train()
        for step in range(steps):
            g = generator(seed, _WARM_START, step)
            batch = [texts[i] for i in torch.randint(len(texts), (batch_size,), generator=g).tolist()]
            x0 = pack(images_to_latents(draw(batch, self.side, g), self.channels)).to(self.cfg.device)
            noise = torch.randn(x0.shape, generator=g).to(self.cfg.device)
            # Logit-normal sigmas (as in SD3 / Qwen-Image training) weight the middle of the schedule.
            sigma = torch.sigmoid(torch.randn(batch_size, generator=g)).to(self.cfg.device)
            xt = (1 - sigma.view(-1, 1, 1)) * x0 + sigma.view(-1, 1, 1) * noise
            emb, mask = self._conditioning(batch)
            loss = F.mse_loss(velocity(self.model, xt, sigma, emb, mask, self.side), noise - x0)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if on_step is not None:
                on_step()
        self.model.eval()
        tail = losses[-50:] or [float("nan")]
        return {"loss": sum(tail) / len(tail)}

    def save_pretrained(self, path: Path) -> None:
        """The transformer as diffusers saves it; with LoRA, the adapters as diffusers' LoRA file
        (`pytorch_lora_weights.safetensors`, which `QwenImagePipeline.load_lora_weights` loads) and,
        unless the base is a local pretrained checkpoint as it is on disk (no warm start changed it), the
        base transformer in `transformer/`."""
        path = Path(path)
        if not has_lora(self.model):
            self.model.save_pretrained(str(path), safe_serialization=True)
            return
        from diffusers import QwenImagePipeline
        from peft.utils import get_peft_model_state_dict
        from safetensors.torch import save_file

        if not self.cfg.policy.dit.pretrained_path or self.cfg.warm_start.steps:  # a warm start changed the base
            (path / "transformer").mkdir(parents=True, exist_ok=True)
            self.model.save_config(str(path / "transformer"))
            save_file(storable(base_state(self.model)),
                      str(path / "transformer" / "diffusion_pytorch_model.safetensors"))
        adapters = {k: v.detach().contiguous().cpu() for k, v in get_peft_model_state_dict(self.model).items()}
        QwenImagePipeline.save_lora_weights(str(path), transformer_lora_layers=adapters,
                                            transformer_lora_adapter_metadata=lora_metadata(self.cfg))
