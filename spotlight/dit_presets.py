"""The DiT presets' transformer shapes, as the keyword arguments of diffusers'
`QwenImageTransformer2DModel`: plain dicts, so that the memory estimate and the simulator's
transfer sizes read the very shapes the policies build without importing torch (~1 s)."""

TINY_TRANSFORMER = dict(
    patch_size=2,
    in_channels=16,
    out_channels=4,
    num_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=32,
    axes_dims_rope=(8, 4, 4),
)
"""The tiny CPU preset (`policy.dit.preset: tiny`): a random 2-layer config that trains on 2 CPU
cores (sum(axes_dims_rope) == attention_head_dim; in_channels = 4 latent channels x 2x2 packing);
16x16 latents -> 64 image tokens."""

QWEN_IMAGE_TRANSFORMER = dict(
    patch_size=2,
    in_channels=64,
    out_channels=16,
    num_layers=60,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=3584,
    axes_dims_rope=(16, 56, 56),
)
"""The released Qwen-Image transformer (20B): diffusers' defaults for QwenImageTransformer2DModel."""
