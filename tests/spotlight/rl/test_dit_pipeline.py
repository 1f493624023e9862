"""A DiT run from a local diffusers Qwen-Image pipeline folder (`policy.dit.pretrained_path`).

On a tiny real-architecture `QwenImagePipeline` saved as a folder (experiments/qwen_image_folder.py:
Qwen2.5-VL text encoder, Qwen-Image VAE, transformer, Qwen-Image's scheduler config, a tokenizer
made offline):
- the folder is a real pipeline: `QwenImagePipeline.from_pretrained` loads it and samples;
- the real text encoder takes an equal-length batch (diffusers returns mask=None there) and gives
  every prompt the numbers it has alone;
- the policy takes the folder's encoder, VAE (latents at 1/8 of the pixels, read from the VAE's
  config) and scheduler, in float32 for the tiny preset and bfloat16 for qwen-image (its VAE in
  float32); a request's prompts are encoded once for all its steps; a folder
  holding a transformer alone keeps the stand-in encoder and the pixel decoder;
- an SP degree-2 group on the pipeline samples the images of degree 1;
- `train.gradient_checkpointing` gives the gradient computed without it, bit for bit;
- `final/` of a LoRA run loads through `QwenImagePipeline.from_pretrained` + `load_lora_weights`
  and reproduces the policy's samples; a full fine-tune's through `QwenImageTransformer2DModel`;
- a bad folder is one `spotlight: error:` line from `spotlight train`, exit 2, nothing written.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil

import pytest
import torch

from conftest import small_dit_config
from spotlight.config import ConfigError, DiTConfig
from spotlight.rl.dit_model import check_pipeline_folder, velocity
from spotlight.rl.prompts import Prompt

RES = 64
"""Image side: the VAE's 8x gives 8x8 latents, 16 image tokens."""


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One torch thread, as every role of a run computes (`runtime.torch_threads`): the SP members'
    numbers are then this process's, and on 2 shared cores OpenMP threads only spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pipeline_config(folder, **over):
    """A tiny run on the pipeline folder: 64 px, 4 denoising steps, no warm start."""
    over = {"warm_start": {"steps": 0}, **over}
    over["policy"] = {**over.get("policy", {}), "dit": {"pretrained_path": str(folder), "resolution": RES,
                                                        **over.get("policy", {}).get("dit", {})}}
    return small_dit_config(**over)


@pytest.fixture(scope="module")
def policy(tiny_qwen_pipeline):
    from spotlight.rl.dit_policy import DiTPolicy

    return DiTPolicy.from_config(pipeline_config(tiny_qwen_pipeline))


def load_pipeline(folder):
    from diffusers import QwenImagePipeline

    pipe = QwenImagePipeline.from_pretrained(str(folder), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


# ---- the folder ------------------------------------------------------------------------------------


def test_the_tiny_pipeline_is_a_real_qwen_image_pipeline(tiny_qwen_pipeline):
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLForConditionalGeneration

    from experiments.qwen_image_folder import ADDED_TOKENS

    pipe = load_pipeline(tiny_qwen_pipeline)
    assert isinstance(pipe.text_encoder, Qwen2_5_VLForConditionalGeneration)
    assert isinstance(pipe.vae, AutoencoderKLQwenImage) and pipe.vae_scale_factor == 8
    assert isinstance(pipe.transformer, QwenImageTransformer2DModel)
    assert pipe.scheduler.config.max_shift == 0.9 and pipe.scheduler.config.shift_terminal == 0.02
    tok = pipe.tokenizer
    prefix = pipe.prompt_template_encode.split("{}")[0]
    assert len(tok(prefix)["input_ids"]) == pipe.prompt_template_encode_start_idx == 34
    ids = tok.convert_tokens_to_ids([t for t, _ in ADDED_TOKENS])  # Qwen's added tokens, in their released order
    assert ids == list(range(ids[0], ids[0] + len(ADDED_TOKENS))) and ids[-1] == len(tok) - 1
    assert pipe.text_encoder.config.image_token_id == tok.convert_tokens_to_ids("<|image_pad|>")
    image = pipe("a red square", num_inference_steps=2, height=RES, width=RES, output_type="pt").images
    assert image.shape == (1, 3, RES, RES) and 0 <= float(image.min()) and float(image.max()) <= 1


# ---- the text encoder ------------------------------------------------------------------------------


def test_an_equal_length_batch_through_the_real_encoder_is_its_prompts_alone(policy):
    """diffusers 0.42 returns mask=None for a batch without padding (issue 25: `mask.long()` crashed
    there); here it is all ones, and each prompt's rows are its numbers alone, bit for bit — the
    same as diffusers' own batched encoding to float rounding."""
    encoder = policy.encoder
    same = ["a red cat", "a cat red"]  # the same words: the same token count
    tok = encoder.pipe.tokenizer
    assert len(tok(same[0])["input_ids"]) == len(tok(same[1])["input_ids"])
    with torch.no_grad():
        theirs, their_mask = encoder.pipe.encode_prompt(same, max_sequence_length=encoder.max_tokens)
    assert their_mask is None
    emb, mask = encoder(same)
    alone = [encoder.encode_one(t) for t in same]
    assert mask.dtype == torch.long and bool(mask.all()) and emb.shape == theirs.shape
    assert all(torch.equal(emb[i], alone[i]) for i in range(2))
    assert torch.allclose(emb, theirs.float(), atol=1e-5)
    # Unequal lengths and a repeated prompt: real rows as alone, zeros and mask 0 after them.
    texts = ["a red cat", "a very long and winding description of a tan dog", "a red cat"]
    emb, mask = encoder(texts)
    n = alone[0].shape[0]
    assert mask[0].tolist() == [1] * n + [0] * (emb.shape[1] - n) and bool(mask[1].all())
    assert torch.equal(emb[0, :n], alone[0]) and not emb[0, n:].any() and torch.equal(emb[2], emb[0])
    assert torch.equal(emb[1], encoder.encode_one(texts[1]))


# ---- the policy on the folder ----------------------------------------------------------------------


def test_the_policy_takes_the_folders_encoder_vae_and_scheduler(policy, tiny_qwen_pipeline):
    from spotlight.rl.dit_model import QwenVAEDecoder
    from spotlight.rl.prompt_encoder import QwenPromptEncoder

    dit = policy.cfg.policy.dit
    assert dit.preset == "tiny" and dit.pipeline and dit.vae_scale == 8 and policy.side == RES // 8
    assert isinstance(policy.encoder, QwenPromptEncoder) and isinstance(policy.decoder, QwenVAEDecoder)
    # float32 for the tiny preset, all three parts
    assert policy.model.dtype == policy.encoder.pipe.text_encoder.dtype == policy.decoder.vae.dtype == torch.float32
    pipe = load_pipeline(tiny_qwen_pipeline)
    assert torch.allclose(policy.sampler.sigmas, _pipeline_sigmas(pipe, 4, policy.tokens), atol=1e-6)
    prompts = [Prompt(0, "a red image"), Prompt(1, "a blue image")]
    rollout = policy.rollout(prompts, [5, 6])
    assert rollout.images.shape == (2, 3, RES, RES)
    # The resolution must fit the VAE's 8x and the 2x2 patches: 16 px do, 24 do not.
    assert DiTConfig(pretrained_path=str(tiny_qwen_pipeline), resolution=16).latent_side == 2
    with pytest.raises(ConfigError, match=r"resolution: expected a size whose latent side \(resolution / 8\) "
                                          r".*: a multiple of 16, got 24"):
        pipeline_config(tiny_qwen_pipeline, policy={"dit": {"resolution": 24}})


def _pipeline_sigmas(pipe, steps, tokens):
    """The sigmas `QwenImagePipeline.__call__` sets on its scheduler for `steps` steps and `tokens` image tokens."""
    import numpy as np
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift, retrieve_timesteps

    c = pipe.scheduler.config
    mu = calculate_shift(tokens, c.base_image_seq_len, c.max_image_seq_len, c.base_shift, c.max_shift)
    retrieve_timesteps(pipe.scheduler, steps, "cpu", sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    return pipe.scheduler.sigmas.float()


def test_the_qwen_image_preset_computes_the_folder_in_bfloat16_and_decodes_in_float32(tiny_qwen_pipeline):
    from spotlight.rl.dit_model import build_transformer
    from spotlight.rl.dit_policy import conditioning

    cfg = pipeline_config(tiny_qwen_pipeline, policy={"dit": {"preset": "qwen-image"}})
    assert cfg.policy.dit.vae_scale == 8  # the VAE's, as for the tiny preset
    model = build_transformer(cfg.policy.dit, cfg.seed)
    encoder, decoder = conditioning(cfg, model)
    assert model.dtype == encoder.pipe.text_encoder.dtype == torch.bfloat16
    assert decoder.vae.dtype == torch.float32  # as flow_grpo keeps its VAE


def test_a_request_is_encoded_once_for_all_its_steps_and_its_rollout_carries_the_seconds(policy):
    """The worker advances a request one step a call; the text encoder must not run at every step.
    The finished rollout carries the seconds of its encoding and decoding, and a second request
    (other prompts) is encoded anew."""
    calls = []
    view = copy.copy(policy)
    view.phase_seconds = type(policy.phase_seconds)()
    view._encoded = None

    def counted(texts):
        calls.append(tuple(texts))
        return policy.encoder(texts)

    view.encoder = counted
    prompts = [Prompt(0, "a red image")] * 2
    state = view.init_state(prompts, [5, 6])
    while state.step < view.num_steps:
        state = view.advance(prompts, state, state.step + 1)
    rollout = view.finish(prompts, state)
    assert calls == [("a red image",) * 2], calls  # once, not num_steps (4) times
    assert set(rollout.seconds) == {"encode", "decode"} and all(s > 0 for s in rollout.seconds.values())
    # the samples of one call advancing all steps (one encoding either way): the cache changes no number
    whole = policy.advance(prompts, policy.init_state(prompts, [5, 6]))
    assert torch.equal(rollout.images, policy.finish(prompts, whole).images)
    other = view.rollout([Prompt(1, "a blue image")], [7])
    assert calls[-1] == ("a blue image",) and set(other.seconds) == {"encode", "decode"}
    assert view.phase_seconds.take() == {}  # each second reported with one rollout only


def test_a_folder_with_a_transformer_alone_keeps_the_stand_in_encoder_and_pixels(tiny_qwen_pipeline, tmp_path):
    from spotlight.rl.dit_model import PixelDecoder
    from spotlight.rl.dit_policy import DiTPolicy
    from spotlight.rl.prompt_encoder import HashedWordEncoder

    shutil.copytree(tiny_qwen_pipeline / "transformer", tmp_path / "only" / "transformer")
    cfg = small_dit_config(policy={"dit": {"pretrained_path": str(tmp_path / "only")}}, warm_start={"steps": 20})
    assert not cfg.policy.dit.pipeline and cfg.policy.dit.vae_scale == 1 and cfg.policy.dit.latent_side == 16
    check_pipeline_folder(cfg)  # a warm start over a transformer alone is still allowed
    policy = DiTPolicy.from_config(cfg)
    assert isinstance(policy.encoder, HashedWordEncoder) and isinstance(policy.decoder, PixelDecoder)


# ---- SP groups -------------------------------------------------------------------------------------


def test_an_sp_group_of_two_on_the_pipeline_gives_the_images_of_degree_one(tiny_qwen_pipeline):
    """Members load the folder's transformer and build the learner's encoder and VAE decoder
    (`sp_member.build_policy`): a degree-2 group's finished request is the learner policy's
    rollout of the same prompt and seeds — images, trajectory and log-probs, bit for bit."""
    from elastic_sp.agent import NodeAgent
    from elastic_sp.weights import NodeWeights
    from schedulers.request import Kind, Request
    from spotlight.rl.dit_model import QwenVAEDecoder
    from spotlight.rl.dit_policy import DiTPolicy
    from spotlight.rl.prompt_encoder import QwenPromptEncoder
    from spotlight.rl.sp_member import build_model, build_policy, serve_spec

    from test_elastic_sp_agent import group_of_two, serve

    # 128 px: 16x16 latents, 64 image tokens, which group_of_two splits 2 ways (at most 32 per member)
    cfg = pipeline_config(tiny_qwen_pipeline, policy={"dit": {"resolution": 128}})
    spec = serve_spec(cfg, timeout_s=60.0, finish=True)
    assert spec.arch["joint_attention_dim"] == 32 and spec.side == 16  # the folder's transformer, the VAE's 8x
    model = build_model(spec)
    learner = DiTPolicy.from_config(cfg)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), learner.model.state_dict().values()))
    member = build_policy(spec, model, "cpu")  # what each member builds, in this process
    assert isinstance(member.encoder, QwenPromptEncoder) and isinstance(member.decoder, QwenVAEDecoder)
    queue, coord = group_of_two(spec, NodeAgent("n0", spec, NodeWeights.share(model.state_dict())))
    try:
        got = serve(queue, coord, Request("r", Kind.ROLLOUT, prompt_id=3, prompt_text="a red image", seeds=(11, 12),
                                          weight_version=0))
    finally:
        coord.close()
    assert torch.get_num_threads() == cfg.runtime.torch_threads  # as every member computes (_one_thread)
    want = learner.rollout([Prompt(3, "a red image")] * 2, [11, 12])
    assert got.images.shape == (2, 3, 128, 128)
    assert torch.equal(got.images, want.images)
    assert all(torch.equal(got.data[k], want.data[k]) for k in ("trajectory", "log_probs"))


# ---- gradient checkpointing ------------------------------------------------------------------------


@pytest.mark.parametrize("lora", [0, 4], ids=["full", "lora"])
def test_gradient_checkpointing_gives_the_same_gradient(lora):
    from spotlight.rl.dit_policy import DiTPolicy
    from spotlight.rl.lora import add_lora, trainable
    from spotlight.rl.prompts import prompt_set

    grads, forwards = [], []
    for on in (False, True):
        cfg = small_dit_config(warm_start={"steps": 0}, policy={"lora": {"rank": lora}},
                               train={"gradient_checkpointing": on, "micro_batch": 6})
        policy = DiTPolicy.from_config(cfg)
        policy.model.eval()  # as the learner's model is (from_pretrained's, or after a warm start)
        assert policy.model.gradient_checkpointing is on
        if lora:
            add_lora(policy.model, cfg)
        prompts = prompt_set(cfg.prompts, cfg.seed)[:2]
        rollout = policy.rollout(prompts * 2, [1, 2, 3, 4])
        calls = []
        policy.model.transformer_blocks[0].register_forward_pre_hook(lambda *_: calls.append(1))
        policy.backward_part(rollout, torch.tensor([1.0, -1.0, 0.5, -0.5]), 1)
        grads.append([p.grad.clone() for p in trainable(policy.model) if p.grad is not None])
        forwards.append(len(calls))
    assert forwards == [1, 2]  # checkpointed: the block's forward runs again in the backward pass
    assert len(grads[0]) == len(grads[1]) > 0
    assert all(torch.equal(a, b) for a, b in zip(*grads))


# ---- final/ through the real pipeline --------------------------------------------------------------


def _ode_image(policy, text, seed, guidance=1.0):
    """The policy's deterministic (ODE) sample of `text` with `seed`: its initial noise (packed) and image."""
    view = policy.for_exploration(None, ode=True)
    if guidance != 1.0:
        view = copy.copy(view)
        view.cfg = dataclasses.replace(view.cfg, sampler=dataclasses.replace(view.cfg.sampler, guidance=guidance))
    prompts = [Prompt(0, text)]
    state = view.init_state(prompts, [seed])
    noise = state.latest.clone()
    return noise, view.decode(view.advance(prompts, state))


def _pipeline_image(pipe, text, noise, steps, guidance=1.0):
    """What a user gets from the pipeline for `text`, starting from `noise`."""
    extra = {"negative_prompt": " ", "true_cfg_scale": guidance} if guidance != 1.0 else {"true_cfg_scale": 1.0}
    return pipe(text, latents=noise, num_inference_steps=steps, height=RES, width=RES, output_type="pt",
                **extra).images


def _assert_reproduces(pipe, policy, text="a red image", seed=7):
    """The pipeline's transformer computes the policy's velocity, and its sample from the policy's
    initial noise — the same scheduler sigmas, Euler steps, text encoding and VAE decode — is the
    policy's ODE sample, plain and with true CFG (to float rounding: the pipeline feeds the
    timestep as t/1000 and no text mask for one prompt). Returns the plain image's error."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, policy.tokens, 4 * policy.channels, generator=g)
    emb, mask = policy.encoder(["a red image", "a blue square"])
    with torch.no_grad():
        ours = velocity(policy.model, x, torch.tensor([0.9, 0.3]), emb, mask, policy.side)
        theirs = velocity(pipe.transformer, x, torch.tensor([0.9, 0.3]), emb, mask, policy.side)
    assert torch.equal(ours, theirs)
    errors = []
    for guidance in (1.0, 4.0):
        noise, image = _ode_image(policy, text, seed, guidance)
        got = _pipeline_image(pipe, text, noise, policy.num_steps, guidance)
        assert got.shape == image.shape == (1, 3, RES, RES)
        errors.append(float((got - image).abs().max()))
    assert max(errors) < 1e-4, errors
    return errors[0]


def test_final_of_a_lora_run_loads_through_the_pipeline_and_reproduces_its_samples(tiny_qwen_pipeline, tmp_path):
    from spotlight.runtime.learner import Learner
    from spotlight.train.trainer import Trainer

    cfg = pipeline_config(tiny_qwen_pipeline, policy={"lora": {"rank": 4, "alpha": 8}},
                          train={"steps": 2, "prompts_per_step": 2, "group_size": 2, "checkpoint_every": 2,
                                 "lr": 3e-2, "updates_per_step": 1})
    Trainer(cfg, tmp_path / "run", progress=False).build().train()
    final = tmp_path / "run" / "final"
    assert not (final / "transformer").exists()  # the base is the pipeline folder, named in the card
    assert str(tiny_qwen_pipeline) in (final / "README.md").read_text()
    learner = Learner(cfg)
    assert learner.build(tmp_path / "run" / "checkpoints")["step"] == 2  # the trained policy, as it ended
    pipe = load_pipeline(tiny_qwen_pipeline)
    pipe.load_lora_weights(str(final))
    error = _assert_reproduces(pipe, learner.policy)
    # ...and the adapters are what it reproduces: the base alone samples another image, far off.
    noise, image = _ode_image(learner.policy, "a red image", 7)
    pipe.unload_lora_weights()
    base = _pipeline_image(pipe, "a red image", noise, learner.policy.num_steps)
    assert float((base - image).abs().max()) > 100 * max(error, 1e-7)


def test_final_of_a_full_fine_tune_loads_as_the_pipelines_transformer(policy, tiny_qwen_pipeline, tmp_path):
    """What `Learner.save_final` writes without LoRA (`DiTPolicy.save_pretrained`), of weights moved
    away from the folder's, loads with `QwenImageTransformer2DModel.from_pretrained` into the pipeline."""
    from diffusers import QwenImagePipeline, QwenImageTransformer2DModel

    trained = copy.copy(policy)
    trained.model = copy.deepcopy(policy.model)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in trained.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    trained.save_pretrained(tmp_path / "final")
    pipe = QwenImagePipeline.from_pretrained(
        str(tiny_qwen_pipeline), local_files_only=True,
        transformer=QwenImageTransformer2DModel.from_pretrained(str(tmp_path / "final"), local_files_only=True))
    pipe.set_progress_bar_config(disable=True)
    _assert_reproduces(pipe, trained)


# ---- bad folders -----------------------------------------------------------------------------------


def _configs(folder):
    """The JSON configs of the tiny pipeline folder, by relative path (no weights)."""
    return {str(p.relative_to(folder)): json.loads(p.read_text()) for p in folder.rglob("*.json")
            if p.parent.name != "tokenizer"}


def _folder(tmp_path, configs, drop=()):
    """A pipeline folder of `configs` only (the checks read no weights), without the parts in `drop`."""
    root = tmp_path / "pipe"
    for rel, data in configs.items():
        if rel.split("/")[0] in drop:
            continue
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(json.dumps(data))
    if "tokenizer" not in drop:
        (root / "tokenizer").mkdir(parents=True, exist_ok=True)
    return root


def _broken(configs, rel, **change):
    out = copy.deepcopy(configs)
    out[rel].update(change)
    return out


def test_folder_problems_name_what_is_wrong(tiny_qwen_pipeline, tmp_path):
    ok = _configs(tiny_qwen_pipeline)
    assert DiTConfig(pretrained_path=str(_folder(tmp_path / "ok", ok)), resolution=RES).folder_problem() is None
    cases = [
        (_folder(tmp_path / "a", ok, drop=("vae",)), "is a diffusers pipeline folder without vae/"),
        (_folder(tmp_path / "b", ok, drop=("text_encoder", "model_index.json")),
         "without text_encoder/, model_index.json"),
        (_folder(tmp_path / "c", _broken(ok, "transformer/config.json", joint_attention_dim=48)),
         "joint_attention_dim (48) is not the text encoder's hidden size (32)"),
        (_folder(tmp_path / "d", _broken(ok, "transformer/config.json", in_channels=64, out_channels=16)),
         "in/out channels (64/16) do not fit the VAE's z_dim (4"),
        (_folder(tmp_path / "e", _broken(ok, "vae/config.json", _class_name="AutoencoderKL")),
         "vae/config.json names 'AutoencoderKL' (expected AutoencoderKLQwenImage)"),
        (_folder(tmp_path / "f", _broken(ok, "text_encoder/config.json", architectures=["T5EncoderModel"])),
         "expected Qwen2_5_VLForConditionalGeneration"),
        (tmp_path / "nowhere", "is not an existing folder"),
    ]
    for folder, expect in cases:
        problem = DiTConfig(pretrained_path=str(folder), resolution=RES).folder_problem()
        assert problem is not None and expect in problem, (folder.name, problem)
    (tmp_path / "c" / "pipe" / "vae" / "config.json").write_text("{not json")
    assert "vae/config.json is not readable JSON" in DiTConfig(pretrained_path=str(tmp_path / "c" / "pipe"),
                                                                resolution=RES).folder_problem()
    # A folder that is not there (yet) or a VAE config that cannot be read: validation takes the
    # preset's scale and does not fail; the check above says what is wrong.
    assert DiTConfig(pretrained_path=str(tmp_path / "nowhere"), resolution=16).latent_side == 16
    # The VAE's downsampling is read, not assumed: two 2x steps make 4x.
    vae = _broken(ok, "vae/config.json", temperal_downsample=[False, True])
    assert DiTConfig(pretrained_path=str(_folder(tmp_path / "g", vae)), resolution=RES).latent_side == RES // 4


BAD_FOLDERS = [  # (id, what to change in the tiny pipeline's configs, config lines, a piece of the error)
    ("missing vae/", {"drop": ("vae",)}, "", "is a diffusers pipeline folder without vae/"),
    ("transformer of another text encoder", {"rel": "transformer/config.json", "joint_attention_dim": 48}, "",
     "joint_attention_dim (48) is not the text encoder's hidden size (32)"),
    ("a warm start over the pipeline", {}, "warm_start:\n  steps: 100\n",
     "warm_start.steps: expected 0 with a pipeline folder"),
]


@pytest.mark.parametrize("change,lines,expect", [c[1:] for c in BAD_FOLDERS], ids=[c[0] for c in BAD_FOLDERS])
def test_spotlight_train_refuses_a_bad_pipeline_folder_in_one_line(tiny_qwen_pipeline, tmp_path, change, lines, expect):
    from test_bad_input import LIMIT_S, _run, _tree

    change = dict(change)
    configs = _configs(tiny_qwen_pipeline)
    if "rel" in change:
        configs = _broken(configs, change.pop("rel"), **change)
    cwd = tmp_path / "cwd"
    _folder(cwd, configs, drop=change.get("drop", ()))
    (cwd / "c.yaml").write_text(f"policy:\n  dit:\n    pretrained_path: pipe\n    resolution: {RES}\n"
                                + (lines or "warm_start:\n  steps: 0\n"))
    before = _tree(cwd)
    code, stdout, stderr, seconds, _ = _run(["train", "c.yaml", "--runtime", "local"], cwd, tmp_path / "peak-kb")
    assert code == 2, stderr[-2000:]
    assert "Traceback" not in stdout + stderr and len(stderr.splitlines()) == 1, stderr[-2000:]
    assert stderr.startswith("spotlight: error: c.yaml: ") and expect in stderr and len(stderr) <= 301, stderr
    assert _tree(cwd) == before and seconds < LIMIT_S
