"""The LLM policy: a transformers causal LM sampled token by token and trained with token-level GRPO.

A sample is `<bos>` + prompt characters, then up to `max_new_tokens` sampled tokens; its completion
ends after (and includes) the first `<eos>`. Invariants:

- Every random draw of a sample comes from `seeding.generator(run seed, prompt id, sample seed,
  token step)`, and tokens are drawn by Gumbel-max with that per-sample noise, so a sample's tokens
  do not depend on the batch, micro-batch or process that samples it.
- Prompts are left-padded (masked out, positions counted from the first real token), so padding
  changes neither the logits of a sample nor its log-probs (beyond float rounding).
- `backward` aggregates the loss as a mean over all completion tokens of the whole rollout: each
  micro-batch contributes `sum / total_tokens`, so the accumulated gradient equals the full-batch
  gradient whatever `train.micro_batch` is.
- Log-probs are `log_softmax(logits / temperature)` at the chosen token, in the rollout and in the
  update alike, so the first update of an iteration starts at ratio 1.
- The model stays in eval mode: dropout (off in Qwen2, maybe on in a loaded model) would make the
  update's log-probs differ from the rollout's for the same weights.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from spotlight.rl.char_tokenizer import build_char_tokenizer
from spotlight.config import ConfigError, LLMConfig, RunConfig
from spotlight.rl.lora import base_state, frozen_reference, has_lora, peft_config
from spotlight.rl.grpo import kl_k3, masked_mean, ppo_clip_loss
from spotlight.rl.policy import Rollout, sum_stats
from spotlight.rl.prompts import ARITHMETIC_OPERAND_MAX, Prompt, arithmetic_answer
from spotlight.rl.seeding import generator

WARM_START_STREAM = 0x3A57
"""Tag of the warm start's operand draws: keys (seed, step, tag), never a sample's 4-key stream."""

# "07+13=" is 7 tokens with <bos> and a completion at most a few more; 64 leaves room for longer prompts.
TINY_MAX_POSITIONS = 64


def tiny_qwen2_config(llm: LLMConfig, tokenizer: PreTrainedTokenizerBase) -> Qwen2Config:
    """The tiny Qwen2 architecture of `llm`, with the tokenizer's vocabulary and special ids."""
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=llm.hidden_size,
        num_hidden_layers=llm.num_layers,
        num_attention_heads=llm.num_heads,
        num_key_value_heads=llm.num_kv_heads,
        intermediate_size=llm.intermediate_size,
        max_position_embeddings=TINY_MAX_POSITIONS,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids counting real tokens only: (B, L) 0/1 mask -> (B, L); left pads get 0.

    Transformers derives positions from the cache length, not the mask, so left-padded rows would
    otherwise be shifted by their padding."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    num_completion: int,
    temperature: float,
) -> torch.Tensor:
    """Log-probs at `temperature` of the last `num_completion` tokens of each row.

    input_ids, attention_mask: (B, P + T) — left-padded prompts then T = num_completion tokens.
    Returns (B, T): `log_softmax(logits / temperature)` of token t given the tokens before it.
    """
    # Only the T positions that predict completion tokens need logits (a real vocabulary is 150k wide).
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions(attention_mask),
        logits_to_keep=num_completion + 1,
    ).logits[:, :-1]
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, input_ids[:, -num_completion:, None]).squeeze(-1)


def gumbel(vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Gumbel(0, 1) noise (vocab,): argmax(logp + noise) samples from softmax(logp)."""
    u = torch.rand(vocab, generator=gen, dtype=torch.float64)
    return (-torch.log(-torch.log(u))).float()


class LLMPolicy:
    """A causal LM policy over character prompts; see the module docstring for its invariants."""

    resumable = False
    """A rollout request is computed whole (a group of short completions); given back, it restarts."""

    def __init__(self, cfg: RunConfig, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> None:
        self.cfg = cfg
        self.llm = cfg.policy.llm
        self.model = model
        self.tokenizer = tokenizer
        self.reference: torch.nn.Module | None = None
        self.device = torch.device(cfg.device)
        # Pretrained tokenizers (Qwen's) may have no bos or pad token: no prefix, pad with eos.
        self.eos_id: int = tokenizer.eos_token_id
        self.pad_id: int = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self.prefix: list[int] = [] if tokenizer.bos_token_id is None else [tokenizer.bos_token_id]

    @classmethod
    def from_config(cls, cfg: RunConfig) -> LLMPolicy:
        """Load `policy.llm.pretrained_path` (local only), or build the tiny Qwen2 seeded by `cfg.seed`."""
        llm = cfg.policy.llm
        if llm.pretrained_path:
            path = Path(llm.pretrained_path)
            if not (path / "config.json").is_file():
                raise ConfigError(f"policy.llm.pretrained_path: expected a local folder with a transformers "
                                  f"causal LM (config.json, weights, tokenizer), got {str(path)!r}")
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
        else:
            tokenizer = build_char_tokenizer()
            # Initial weights are a function of the run seed alone; the global RNG is left as it was.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.seed)
                model = Qwen2ForCausalLM(tiny_qwen2_config(llm, tokenizer))
        return cls(cfg, model.to(device=cfg.device, dtype=torch.float32).eval(), tokenizer)

    # ---- sampling ------------------------------------------------------------------------------

    def encode(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefix + prompt tokens, left-padded to the longest: (input_ids, attention_mask), each (B, P)."""
        rows = [self.prefix + self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        width = max(len(r) for r in rows)
        ids = torch.tensor([[self.pad_id] * (width - len(r)) + r for r in rows], device=self.device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device)
        return ids, mask

    @torch.no_grad()
    def _generate(
        self, ids: torch.Tensor, mask: torch.Tensor, prompts: Sequence[Prompt], seeds: Sequence[int] | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample (seeds given) or greedily decode (seeds None) `max_new_tokens` tokens after the prompts.

        ids, mask: (B, P) left-padded prompts. Returns (tokens, logp, completion_mask), each (B, T)
        with T = max_new_tokens; tokens after a row's <eos> are pad with logp 0 and mask 0.
        """
        B, T = ids.shape[0], self.llm.max_new_tokens
        tokens = torch.full((B, T), self.pad_id, device=self.device)
        logps = torch.zeros(B, T, device=self.device)
        live = torch.zeros(B, T, device=self.device)
        done = torch.zeros(B, dtype=torch.bool, device=self.device)
        pos = positions(mask)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        pos = pos[:, -1:]
        for t in range(T):
            logp = torch.log_softmax(out.logits[:, -1].float() / self.llm.temperature, dim=-1)
            if seeds is None:
                tok = logp.argmax(-1)
            else:
                noise = torch.stack([gumbel(logp.shape[-1], generator(self.cfg.seed, p.id, s, t))
                                     for p, s in zip(prompts, seeds)])
                tok = (logp + noise.to(self.device)).argmax(-1)
            tok = torch.where(done, self.pad_id, tok)
            tokens[:, t] = tok
            logps[:, t] = torch.where(done, 0.0, logp.gather(-1, tok[:, None]).squeeze(-1))
            live[:, t] = (~done).float()
            done |= tok == self.eos_id
            if done.all():
                break
            # Finished rows keep feeding pad; it only influences positions that are masked out anyway.
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            pos = pos + 1
            out = self.model(input_ids=tok[:, None], attention_mask=mask, position_ids=pos,
                             past_key_values=out.past_key_values, use_cache=True)
        return tokens, logps, live

    def _decode(self, tokens: torch.Tensor, live: torch.Tensor) -> list[str]:
        return [self.tokenizer.decode(row[m.bool()].tolist(), skip_special_tokens=True)
                for row, m in zip(tokens, live)]

    def for_exploration(self, num_steps: int | None, ode: bool) -> "LLMPolicy":
        """Exploration samples completions as rollouts do (the denoising settings are DiT-only)."""
        return self

    def rollout(self, prompts: Sequence[Prompt], seeds: Sequence[int]) -> Rollout:
        """One sampled completion per (prompt, seed) pair, micro-batched, under no_grad."""
        if len(prompts) != len(seeds):
            raise ValueError(f"rollout needs one seed per prompt, got {len(prompts)} prompts and {len(seeds)} seeds")
        ids, mask = self.encode([p.text for p in prompts])
        mb = self.cfg.train.micro_batch
        parts = [self._generate(ids[i:i + mb], mask[i:i + mb], prompts[i:i + mb], seeds[i:i + mb])
                 for i in range(0, len(prompts), mb)]
        tokens, old_logp, live = (torch.cat(x) for x in zip(*parts))
        # Drop trailing columns no sample reached (live columns are a prefix: a finished row stays
        # finished); they would cost update compute and change nothing.
        T = int(live.any(0).sum())
        tokens, old_logp, live = tokens[:, :T], old_logp[:, :T], live[:, :T]
        return Rollout(
            prompts=list(prompts),
            seeds=list(seeds),
            completions=self._decode(tokens, live),
            data={
                "input_ids": torch.cat([ids, tokens], dim=1),
                "attention_mask": torch.cat([mask, torch.ones_like(tokens)], dim=1),
                "completion_mask": live,
                "old_logp": old_logp,
            },
        )

    def merge(self, parts: Sequence[Rollout]) -> Rollout:
        """Per-request rollouts in order; shorter completions are right-padded (pad tokens, attended
        but masked out of the loss: they come after every real token, so causal attention keeps
        the real tokens' log-probs unchanged)."""
        return Rollout.concat(parts, pad={"input_ids": self.pad_id, "attention_mask": 1})

    def greedy(self, prompts: Sequence[Prompt]) -> list[str]:
        """Greedy completions (no randomness), micro-batched."""
        ids, mask = self.encode([p.text for p in prompts])
        mb = self.cfg.train.micro_batch
        out: list[str] = []
        for i in range(0, len(prompts), mb):
            tokens, _, live = self._generate(ids[i:i + mb], mask[i:i + mb], prompts[i:i + mb], None)
            out += self._decode(tokens, live)
        return out

    def accuracy(self, prompts: Sequence[Prompt]) -> float:
        """Fraction of arithmetic prompts whose greedy completion is the answer."""
        answers = self.greedy(prompts)
        return sum(a == str(arithmetic_answer(p.text)) for a, p in zip(answers, prompts)) / max(len(prompts), 1)

    # ---- update --------------------------------------------------------------------------------

    def set_reference(self) -> None:
        """Freeze a copy of the current weights as the KL reference."""
        self.reference = frozen_reference(self.model)

    def update_parts(self, rollout: Rollout) -> int:
        """Micro-batches of the update over `rollout`: `train.micro_batch` samples each."""
        return -(-len(rollout) // self.cfg.train.micro_batch)

    def backward_part(self, rollout: Rollout, advantages: torch.Tensor, index: int) -> dict[str, float]:
        """Accumulate the gradient of micro-batch `index` (samples [index*mb, (index+1)*mb)) of the
        token-level GRPO loss over the whole rollout; the part's share of the stats ("tokens": its
        completion tokens)."""
        d = rollout.data
        beta = self.cfg.grpo.kl_beta
        if beta > 0 and self.reference is None:
            raise RuntimeError("grpo.kl_beta > 0 needs a reference policy: call set_reference() first")
        mb = self.cfg.train.micro_batch
        i = index * mb
        if index < 0 or i >= len(rollout):
            raise IndexError(f"micro-batch {index} of an update of {self.update_parts(rollout)}")
        T = d["completion_mask"].shape[1]
        total = d["completion_mask"].sum().clamp_min(1.0)
        adv = advantages.to(device=self.device, dtype=torch.float32)
        ids, attn = d["input_ids"][i:i + mb], d["attention_mask"][i:i + mb]
        m = d["completion_mask"][i:i + mb]
        logp = token_logprobs(self.model, ids, attn, T, self.llm.temperature)
        loss, clipped = ppo_clip_loss(logp, d["old_logp"][i:i + mb], adv[i:i + mb, None],
                                      self.cfg.grpo.clip_low, self.cfg.grpo.clip_high)
        kl_part = 0.0
        if beta > 0:
            with torch.no_grad():
                ref_logp = token_logprobs(self.reference, ids, attn, T, self.llm.temperature)
            kl = kl_k3(logp, ref_logp)
            loss = loss + beta * kl
            kl_part = float((kl.detach() * m).sum() / total)
        part = (loss * m).sum() / total
        part.backward()
        return {"loss": float(part.detach()), "clip_frac": float((clipped * m).sum() / total), "kl": kl_part,
                "tokens": float(m.sum())}

    def backward(self, rollout: Rollout, advantages: torch.Tensor) -> dict[str, float]:
        """Accumulate the gradient of the token-level GRPO loss over the rollout, one micro-batch
        (`backward_part`) after the other; the caller steps.

        advantages: (N,) one per sample. Loss = mean over all completion tokens of the rollout of
        ppo_clip(token) + kl_beta * k3(token).
        """
        return sum_stats(self.backward_part(rollout, advantages, i) for i in range(self.update_parts(rollout)))

    # ---- warm start ----------------------------------------------------------------------------

    def warm_start(
        self, prompts: Sequence[Prompt], steps: int, batch_size: int, lr: float, seed: int,
        on_step: Callable[[], None] | None = None,
    ) -> dict[str, float]:
        """Supervised training (Adam) on worked examples "07+13=" -> "20<eos>", in place; `on_step`
        is called after each step (a progress bar).

        Operands are drawn uniformly from range(ARITHMETIC_OPERAND_MAX) from seed-keyed streams;
        cross-entropy is on the answer tokens and <eos> only. Returns the last step's loss and the
        greedy accuracy on `prompts`.
        """
        opt = torch.optim.Adam(self.model.parameters(), lr=lr)
        loss = torch.tensor(float("nan"))
        for step in range(steps):
            draw = generator(seed, step, WARM_START_STREAM)
            pairs = torch.randint(0, ARITHMETIC_OPERAND_MAX, (batch_size, 2), generator=draw).tolist()
            # Zero-padded operands, exactly as `prompt_set` writes its prompts.
            ids, mask = self.encode([f"{a:02d}+{b:02d}=" for a, b in pairs])
            answers = [self.tokenizer.encode(str(a + b), add_special_tokens=False) + [self.eos_id] for a, b in pairs]
            A = max(len(a) for a in answers)
            target = torch.tensor([a + [self.pad_id] * (A - len(a)) for a in answers], device=self.device)
            target_mask = torch.tensor([[1.0] * len(a) + [0.0] * (A - len(a)) for a in answers], device=self.device)
            logp = token_logprobs(self.model, torch.cat([ids, target], 1),
                                  torch.cat([mask, torch.ones_like(target)], 1), A, temperature=1.0)
            loss = -masked_mean(logp, target_mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if on_step is not None:
                on_step()
        # No warm-start gradient may leak into the first GRPO backward.
        self.model.zero_grad(set_to_none=True)
        return {"loss": loss.item(), "accuracy": self.accuracy(prompts)}

    def save_pretrained(self, path: Path | str) -> None:
        """Model (safetensors + config) and tokenizer, loadable by `from_config` via `pretrained_path`.
        With LoRA: the adapter as peft saves one (`adapter_config.json`, `adapter_model.safetensors`:
        `PeftModel.from_pretrained(base, path)` loads it) and the tokenizer; the base model in `base/`
        unless it is a local pretrained checkpoint (the adapter config names it)."""
        path = Path(path)
        if not has_lora(self.model):
            self.model.save_pretrained(path)
            self.tokenizer.save_pretrained(path)
            return
        from peft.utils import get_peft_model_state_dict
        from safetensors.torch import save_file

        config = peft_config(self.cfg)
        config.base_model_name_or_path = self.llm.pretrained_path or "base"
        if not self.llm.pretrained_path:
            self.model.save_pretrained(path / "base", state_dict=base_state(self.model))
        config.save_pretrained(str(path))
        # The names PeftModel.save_pretrained writes: the wrapper's prefix, no adapter name.
        adapters = {"base_model.model." + k: v.detach().contiguous().cpu()
                    for k, v in get_peft_model_state_dict(self.model).items()}
        save_file(adapters, str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
        self.tokenizer.save_pretrained(path)
