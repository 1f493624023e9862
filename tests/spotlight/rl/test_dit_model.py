import torch

from spotlight.config import DiTConfig
from spotlight.rl.dit_model import QWEN_IMAGE_TRANSFORMER, build_transformer, pack, unpack, velocity
from spotlight.rl.dit_policy import DiTPolicy

from conftest import small_dit_config


def test_pack_unpack_round_trip():
    x = torch.randn(2, 4, 8, 8)
    tokens = pack(x)
    assert tokens.shape == (2, 16, 16)
    assert torch.equal(unpack(tokens, 8), x)
    # a 2x2 patch of one channel lands in one token, channel-major like Qwen-Image's _pack_latents
    assert torch.equal(tokens[0, 0, :4], x[0, 0, :2, :2].flatten())


def test_qwen_image_config_is_the_20b_transformer():
    from diffusers import QwenImageTransformer2DModel

    with torch.device("meta"):
        model = QwenImageTransformer2DModel(**QWEN_IMAGE_TRANSFORMER)
    n = sum(p.numel() for p in model.parameters())
    assert 19e9 < n < 21e9


def test_pretrained_path_loads_the_saved_transformer(tmp_path):
    cfg = small_dit_config()
    policy = DiTPolicy.from_config(cfg)
    policy.save_pretrained(tmp_path / "ckpt" / "transformer")
    loaded = build_transformer(DiTConfig(pretrained_path=str(tmp_path / "ckpt")), seed=99)
    x, sigma = torch.randn(2, 64, 16), torch.tensor([0.3, 0.8])
    emb, mask = policy.encoder(["a red image", "a blue image"])
    with torch.no_grad():
        assert torch.equal(velocity(loaded, x, sigma, emb, mask, 16), velocity(policy.model, x, sigma, emb, mask, 16))


def test_random_init_is_a_function_of_the_seed():
    a, b, c = (build_transformer(DiTConfig(), s) for s in (1, 1, 2))
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_hashed_encoder_shares_words_and_masks_padding():
    policy = DiTPolicy.from_config(small_dit_config())
    emb, mask = policy.encoder(["a red image", "a blue image"])
    assert emb.shape == (2, 8, 32) and mask.tolist()[0] == [1, 1, 1, 0, 0, 0, 0, 0]
    assert torch.equal(emb[0, 0], emb[1, 0]) and torch.equal(emb[0, 2], emb[1, 2])
    assert not torch.equal(emb[0, 1], emb[1, 1])


def test_vae_decoder_unnormalises_and_decodes_with_the_qwen_image_vae(tmp_path):
    """The real decode path, on a tiny random AutoencoderKLQwenImage saved as a checkpoint's vae/."""
    from diffusers import AutoencoderKLQwenImage

    from spotlight.rl.dit_model import QwenVAEDecoder

    torch.manual_seed(0)
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
                                 temperal_downsample=[False, True, True], latents_mean=[0.1] * 4, latents_std=[2.0] * 4)
    vae.save_pretrained(str(tmp_path / "vae"))
    decoder = QwenVAEDecoder(tmp_path, dtype=torch.float32)
    z = torch.randn(2, 4, 4, 4)
    images = decoder(z)
    with torch.no_grad():
        expected = vae.decode((z * 2.0 + 0.1).unsqueeze(2), return_dict=False)[0][:, :, 0]
    assert images.shape == (2, 3, 32, 32)  # the VAE upsamples by 8
    assert torch.allclose(images, ((expected + 1) / 2).clamp(0, 1), atol=1e-5)
