"""The LLM policy: a transformers causal LM sampled token by token and trained with token-level GRPO.

The model is the tiny Qwen2 built from the run seed (with the character tokenizer), or a local
transformers folder (`policy.llm.pretrained_path`) with its own tokenizer. A sample is the prompt's
tokens, then up to `max_new_tokens` sampled tokens; its completion ends after (and includes) the
first stop token (`LLMPolicy.stop_ids`). The prompt's tokens: when the tokenizer has a chat template,
the prompt text as the user's one message and the template's generation prompt
(`apply_chat_template(..., add_generation_prompt=True)`: Qwen's `<|im_start|>user\n{text}<|im_end|>\n
<|im_start|>assistant\n`); without one, `<bos>` (if the tokenizer has one) and the text. Completions
are decoded without special tokens. Invariants:

- Every random draw of a sample comes from `seeding.generator(run seed, prompt id, sample seed,
  token step)`, and tokens are drawn by Gumbel-max with that per-sample noise, so a sample's tokens
  do not depend on the batch, micro-batch or process that samples it (tests/spotlight/rl/test_llm_policy.py and,
  through a chat template, tests/spotlight/rl/test_llm_folder.py).
- Prompts are left-padded (masked out, positions counted from the first real token), so padding
  changes neither the logits of a sample nor its log-probs (beyond float rounding).
- Sampling runs the prompt once and then one position per token against a KV cache
  (`DynamicCache`); its log-probs equal the update's, recomputed over the whole sequence, to float
  tolerance.
- `backward` aggregates the loss as a mean over all completion tokens of the whole rollout: each
  micro-batch contributes `sum / total_tokens`, so the accumulated gradient equals the full-batch
  gradient whatever `train.micro_batch` is.
- Log-probs are `log_softmax(logits / temperature)` at the chosen token, in the rollout and in the
  update alike, so the first update of an iteration starts at ratio 1.
- The model stays in eval mode: dropout (off in Qwen2, maybe on in a loaded model) would make the
  update's log-probs differ from the rollout's for the same weights. With
  `train.gradient_checkpointing` only the checkpointed decoder layers themselves are flagged as
  training during the update's forward (what transformers checks before it checkpoints); their
  submodules stay in eval mode, and the gradient is the one without checkpointing
  (tests/spotlight/rl/test_llm_folder.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase, Qwen2Config, Qwen2ForCausalLM

from spotlight.rl.char_tokenizer import build_char_tokenizer
from spotlight.config import ConfigError, InputError, LLMConfig, RunConfig
from spotlight.rl.lora import base_state, frozen_reference, has_lora, peft_config
from spotlight.rl.grpo import kl_k3, masked_mean, ppo_clip_loss
from spotlight.rl.policy import Rollout, sum_stats
from spotlight.rl.prompts import ARITHMETIC_OPERAND_MAX, Prompt, arithmetic_answer
from spotlight.rl.seeding import generator

WARM_START_STREAM = 0x3A57
"""Tag of the warm start's operand draws: keys (seed, step, tag), never a sample's 4-key stream."""

ARITHMETIC_PROMPT = re.compile(r"\d+\+\d+=")
"""A prompt the warm start's accuracy can score (`arithmetic_answer` reads it)."""

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
    # Only the T positions that predict completion tokens need logits (a real vocabulary is 150k wide);
    # no KV cache: nothing is generated after this pass.
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=positions(attention_mask),
        logits_to_keep=num_completion + 1,
        use_cache=False,
    ).logits[:, :-1]
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, input_ids[:, -num_completion:, None]).squeeze(-1)


def stop_ids(tokenizer: PreTrainedTokenizerBase, model: torch.nn.Module) -> list[int]:
    """The tokens that end a completion: the tokenizer's eos, the model's generation-config eos
    tokens (what `generate` stops at: Qwen2.5-Instruct's are `<|im_end|>` and `<|endoftext|>`) and,
    when the chat template ends a turn with `<|im_end|>`, that token (a Qwen base model's eos is
    `<|endoftext|>`, but its chat template ends the assistant's turn with `<|im_end|>`)."""
    generation = getattr(model, "generation_config", None)
    eos = getattr(generation, "eos_token_id", None)
    ids = [tokenizer.eos_token_id, _im_end(tokenizer)] + (eos if isinstance(eos, list) else [eos])
    vocab = len(tokenizer)
    return sorted({i for i in ids if isinstance(i, int) and 0 <= i < vocab})


def turn_end_id(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The token a completion should end with: `<|im_end|>` when the chat template ends a turn with
    it, else the tokenizer's eos (what the warm start teaches)."""
    im_end = _im_end(tokenizer)
    return im_end if im_end is not None else tokenizer.eos_token_id


def _im_end(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """`<|im_end|>`'s id when the chat template uses it and the vocabulary has it, else None."""
    if "<|im_end|>" not in (getattr(tokenizer, "chat_template", None) or ""):
        return None
    return tokenizer.get_vocab().get("<|im_end|>")


@contextmanager
def checkpointed_layers(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block, the decoder layers that have gradient checkpointing on recompute their
    activations in the backward pass; outside it, and in every other module, nothing changes.

    transformers checkpoints a layer only while `layer.training` is true
    (`GradientCheckpointingLayer`), and the policy stays in eval mode (no dropout: the update's
    log-probs must be the rollout's). So only the layers' own flags are set, not their submodules'
    (attention, MLP, dropout); Qwen2's decoder layer reads `self.training` nowhere else."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules()
              if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing and not m.training]
    for layer in layers:
        layer.training = True
    try:
        yield
    finally:
        for layer in layers:
            layer.training = False


def gumbel(vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Gumbel(0, 1) noise (vocab,): argmax(logp + noise) samples from softmax(logp)."""
    u = torch.rand(vocab, generator=gen, dtype=torch.float64)
    return (-torch.log(-torch.log(u))).float()


class LLMPolicy:
    """A causal LM policy over text prompts; see the module docstring for its invariants."""

    resumable = False
    """A rollout request is computed whole (a group of short completions); given back, it restarts."""

    def __init__(self, cfg: RunConfig, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> None:
        self.cfg = cfg
        self.llm = cfg.policy.llm
        self.model = model
        self.tokenizer = tokenizer
        self.reference: torch.nn.Module | None = None
        self.device = torch.device(cfg.device)
        self.chat: bool = bool(getattr(tokenizer, "chat_template", None))
        """Prompts go through the tokenizer's chat template (the rule: whenever it has one)."""
        self.stop_ids: list[int] = stop_ids(tokenizer, model)
        """Token ids that end a completion (`stop_ids`); none: every completion is max_new_tokens long."""
        self.eos_id: int | None = turn_end_id(tokenizer)
        """The token that ends a completion the warm start teaches (one of `stop_ids`)."""
        # Pretrained tokenizers (Qwen's) may have no bos or pad token: no prefix, pad with eos.
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id: int = pad if pad is not None else 0
        # A chat template writes whatever starts a sequence itself (Llama 3's writes {{ bos_token }}).
        self.prefix: list[int] = [] if self.chat or tokenizer.bos_token_id is None else [tokenizer.bos_token_id]

    @classmethod
    def from_config(cls, cfg: RunConfig) -> LLMPolicy:
        """Load `policy.llm.pretrained_path` (a local folder, or a remote one fetched once into this
        node's model cache: `cloud.model_cache.model_folder`), or build the tiny Qwen2 seeded by
        `cfg.seed`; with `train.gradient_checkpointing`, the update recomputes activations
        (`checkpointed_layers`)."""
        llm = cfg.policy.llm
        if llm.pretrained_path:
            from cloud.model_cache import model_folder
            from cloud.store import StoreError

            try:
                path = model_folder(llm.pretrained_path)
            except (InputError, StoreError) as err:
                raise ConfigError(f"policy.llm.pretrained_path: {' '.join(str(err).split())}") from None
            problem = llm.folder_problem()
            if problem is not None:
                raise ConfigError(f"policy.llm.pretrained_path: {problem}")
            try:
                tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
                model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
            except (OSError, ValueError, KeyError) as err:  # what transformers raises for a folder it cannot use
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise ConfigError(f"policy.llm.pretrained_path: {llm.pretrained_path!r} does not load as a transformers "
                                  f"causal LM with its tokenizer: {first[:200]}") from None
        else:
            tokenizer = build_char_tokenizer()
            # Initial weights are a function of the run seed alone; the global RNG is left as it was.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.seed)
                model = Qwen2ForCausalLM(tiny_qwen2_config(llm, tokenizer))
        if cfg.train.gradient_checkpointing:
            # use_reentrant=False: the reentrant variant needs an input that requires grad, which a
            # frozen (LoRA) base's embeddings never give. transformers >= 5 renamed the method
            # (activation_checkpointing_enable; the old name warns); 4.x has only the old one.
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable({"use_reentrant": False})
        return cls(cfg, model.to(device=cfg.device, dtype=torch.float32).eval(), tokenizer)

    # ---- sampling ------------------------------------------------------------------------------

    def prompt_ids(self, text: str) -> list[int]:
        """The tokens a sample of prompt `text` starts with: the chat template's user turn and
        generation prompt when the tokenizer has a template, else `prefix` + the text's tokens."""
        if not self.chat:
            return self.prefix + self.tokenizer.encode(text, add_special_tokens=False)
        # Rendered to text and then encoded (its special tokens are matched as such): the return type
        # of tokenize=True changed in transformers 5 (a BatchEncoding, a list before).
        rendered = self.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                      add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(rendered, add_special_tokens=False)

    def encode(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """`prompt_ids` of each text, left-padded to the longest: (input_ids, attention_mask), each (B, P)."""
        rows = [self.prompt_ids(t) for t in texts]
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
        with T = max_new_tokens; tokens after a row's stop token are pad with logp 0 and mask 0.

        The prompt is run once, filling a KV cache; every later forward is the one new token per
        row at its own position (left padding: a row's positions count its real tokens), with the
        mask grown by one column, so a token costs one position, not the whole prefix again.
        """
        B, T = ids.shape[0], self.llm.max_new_tokens
        tokens = torch.full((B, T), self.pad_id, device=self.device)
        logps = torch.zeros(B, T, device=self.device)
        live = torch.zeros(B, T, device=self.device)
        done = torch.zeros(B, dtype=torch.bool, device=self.device)
        stops = torch.tensor(self.stop_ids, dtype=torch.long, device=self.device)
        pos = positions(mask)
        # use_cache: the model makes its own cache (a `DynamicCache` built from its config, which knows
        # its layer types, e.g. sliding-window ones); each step below extends it in place.
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
            done |= torch.isin(tok, stops)
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
        """Fraction of arithmetic prompts ("07+13=") whose greedy completion is the answer."""
        answers = self.greedy(prompts)
        return sum(a == str(arithmetic_answer(p.text)) for a, p in zip(answers, prompts)) / max(len(prompts), 1)

    # ---- update --------------------------------------------------------------------------------

    def set_reference(self) -> None:
        """Freeze a copy of the current weights as the KL reference."""
        self.reference = frozen_reference(self.model)

    def update_parts(self, rollout: Rollout) -> int:
        """Micro-batches of the update over `rollout`: `train.micro_batch` samples each."""
        return -(-len(rollout) // self.cfg.train.micro_batch)

    def backward_part(self, rollout: Rollout, advantages: torch.Tensor, index: int,
                      scale: float = 1.0) -> dict[str, float]:
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
        with checkpointed_layers(self.model):
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
        (part if scale == 1 else part * scale).backward()
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
        the prompt is encoded as every sample's is (`prompt_ids`: through the chat template when
        there is one), and the target ends with `eos_id` (`<|im_end|>` under a Qwen template).
        Cross-entropy is on the answer tokens and that end token only. Returns the last step's loss
        and the greedy accuracy on the arithmetic prompts of `prompts` (no accuracy without any).
        """
        if self.eos_id is None:
            raise ValueError("the warm start teaches completions that end with an eos token, and the tokenizer "
                             "has none (set warm_start.steps: 0)")
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
        # Accuracy on the run's arithmetic prompts; a prompt file of other questions has no such number.
        sums = [p for p in prompts if ARITHMETIC_PROMPT.fullmatch(p.text)]
        return {"loss": loss.item(), **({"accuracy": self.accuracy(sums)} if sums else {})}

    def save_pretrained(self, path: Path | str) -> None:
        """Model (safetensors + config + generation config) and tokenizer (with its chat template),
        loadable by `from_config` via `pretrained_path` and by `AutoModelForCausalLM` /
        `AutoTokenizer`. With LoRA: the adapter as peft saves one (`adapter_config.json`,
        `adapter_model.safetensors`: `PeftModel.from_pretrained(base, path)` loads it) and the
        tokenizer; the base model in `base/` unless it is the local pretrained folder as it is on
        disk (the adapter config names that folder; a warm start changed the base, so it is saved)."""
        path = Path(path)
        if not has_lora(self.model):
            self.model.save_pretrained(path)
            self.tokenizer.save_pretrained(path)
            return
        from peft.utils import get_peft_model_state_dict
        from safetensors.torch import save_file

        config = peft_config(self.cfg)
        base_is_folder = bool(self.llm.pretrained_path) and self.cfg.warm_start.steps == 0
        config.base_model_name_or_path = self.llm.pretrained_path if base_is_folder else "base"
        if not base_is_folder:
            self.model.save_pretrained(path / "base", state_dict=base_state(self.model))
        config.save_pretrained(str(path))
        # The names PeftModel.save_pretrained writes: the wrapper's prefix, no adapter name.
        adapters = {"base_model.model." + k: v.detach().contiguous().cpu()
                    for k, v in get_peft_model_state_dict(self.model).items()}
        save_file(adapters, str(path / "adapter_model.safetensors"), metadata={"format": "pt"})
        self.tokenizer.save_pretrained(path)
