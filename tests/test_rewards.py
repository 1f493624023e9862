import json
import string

import pytest
import torch

from spotlight.config import default_config, ConfigError, RewardConfig
from spotlight.rl.policy import Rollout
from spotlight.rl.prompts import COLOURS, Prompt
from spotlight.rl.rewards import build_reward, jpeg_kilobytes


def _solid(rgb, side=16):
    return torch.tensor(rgb).view(3, 1, 1).expand(3, side, side).clone()


def test_colour_reward_closed_form():
    red, blue = COLOURS["red"], COLOURS["blue"]
    images = torch.stack([_solid(red), _solid(blue)])
    rollout = Rollout([Prompt(0, "a red image"), Prompt(0, "a red image")], [0, 1], images=images)
    r = build_reward(RewardConfig(name="colour", colour_width=0.5))(rollout)
    d2 = sum((a - b) ** 2 for a, b in zip(red, blue))
    assert r.tolist() == pytest.approx([1.0, torch.exp(torch.tensor(-d2 / 0.5)).item()])


def test_jpeg_rewards_prefer_flat_or_busy_images():
    g = torch.Generator().manual_seed(0)
    images = torch.stack([_solid((0.5, 0.5, 0.5), 64), torch.rand(3, 64, 64, generator=g)])
    rollout = Rollout([Prompt(0, "x")] * 2, [0, 1], images=images)
    kb = jpeg_kilobytes(images)
    assert kb[0] < kb[1]
    assert torch.equal(build_reward(RewardConfig(name="jpeg_compressibility"))(rollout), -kb)
    assert torch.equal(build_reward(RewardConfig(name="jpeg_incompressibility"))(rollout), kb)


def test_arithmetic_reward():
    rollout = Rollout([Prompt(0, "07+05="), Prompt(1, "10+10="), Prompt(2, "01+01=")], [0, 0, 0],
                      completions=["12", "21", "2"])
    assert build_reward(RewardConfig(name="arithmetic"))(rollout).tolist() == [1.0, 0.0, 1.0]


def test_unknown_reward_and_missing_weights_are_config_errors(tmp_path):
    # Refused when the config is read (issue 13: it used to be refused only when the reward was built).
    with pytest.raises(ConfigError, match="reward.name: expected one of .*colour"):
        default_config({"reward": {"name": "aesthetics"}})
    with pytest.raises(ConfigError, match="reward.model_path"):
        build_reward(RewardConfig(name="clip_score", model_path=str(tmp_path / "none")))


def _tiny_clip(path):
    """A real transformers CLIP with a random tiny config and a character tokenizer, saved locally."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in string.ascii_lowercase:
        vocab[c] = len(vocab)
        vocab[c + "</w>"] = len(vocab)
    path.mkdir()
    (path / "vocab.json").write_text(json.dumps(vocab))
    (path / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = CLIPTokenizer(str(path / "vocab.json"), str(path / "merges.txt"))
    images = CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16})
    cfg = CLIPConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, max_position_embeddings=16, bos_token_id=0, eos_token_id=1,
                         pad_token_id=1),
        vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=16, patch_size=8),
        projection_dim=8)
    torch.manual_seed(0)
    model = CLIPModel(cfg)
    model.save_pretrained(str(path))
    CLIPProcessor(image_processor=images, tokenizer=tokenizer).save_pretrained(str(path))
    return model, CLIPProcessor(image_processor=images, tokenizer=tokenizer)


def test_clip_score_reward_loads_local_weights_and_scores_text_image_agreement(tmp_path):
    model, processor = _tiny_clip(tmp_path / "clip")
    images = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    prompts = [Prompt(0, "a red image"), Prompt(1, "a blue image")]
    reward = build_reward(RewardConfig(name="clip_score", model_path=str(tmp_path / "clip")))
    r = reward(Rollout(prompts, [0, 1], images=images))
    # closed form from the same model called directly
    inputs = processor(text=[p.text for p in prompts], images=list((images * 255).round().to(torch.uint8)),
                       return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model(**inputs)
    cos = torch.nn.functional.cosine_similarity(out.image_embeds, out.text_embeds)
    assert torch.allclose(r, model.logit_scale.exp().detach() * cos, atol=1e-5)
