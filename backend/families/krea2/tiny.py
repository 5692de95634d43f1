"""The krea2 family's tiny random-weight pipeline (backend/tiny_models.py builds it by name)."""

from __future__ import annotations

from typing import Any

from ..tiny_parts import Seeder, qwen3vl_config, qwen_tokenizer

# Krea2Pipeline's default taps of Qwen3-VL-4B's 36 layers (hidden states 2, 5, ..., 35): kept, so the tiny text
# encoder has 36 thin layers and the transformer reads 12 stacked states, as the published one
TAPS = (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35)


def _krea2(seed: Seeder, size: str) -> Any:
    """Krea 2-like: Qwen3VLModel (36 thin layers), a 2-block transformer (2 query heads, 1 key/value head, text
    fusion 1+1 blocks), Qwen-Image's VAE layout (here 4 channels)."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        Krea2Pipeline,
        Krea2Transformer2DModel,
    )
    from transformers import Qwen3VLModel

    tok = qwen_tokenizer()
    hidden, z = 32, 4
    transformer = seed("transformer", lambda: Krea2Transformer2DModel(
        in_channels=4 * z, num_layers=2, attention_head_dim=16, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=64, timestep_embed_dim=32, text_hidden_dim=hidden, num_text_layers=len(TAPS),
        text_num_attention_heads=2, text_num_key_value_heads=2, text_intermediate_size=64,
        num_layerwise_text_blocks=1, num_refiner_text_blocks=1, axes_dims_rope=(4, 6, 6)))
    vae = seed("vae", lambda: AutoencoderKLQwenImage(
        base_dim=8, z_dim=z, dim_mult=[1, 2, 2, 2], num_res_blocks=1, temperal_downsample=[False, True, True],
        latents_mean=[0.0] * z, latents_std=[1.0] * z))
    return Krea2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True,
                                                  base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                                                  max_image_seq_len=6400, time_shift_type="exponential"),
        vae=vae,
        text_encoder=seed("text_encoder", lambda: Qwen3VLModel(qwen3vl_config(tok, hidden, layers=36))),
        tokenizer=tok,
        transformer=transformer,
        text_encoder_select_layers=TAPS,
    )


# The builders by tiny name (the family declaration's `tiny`), and the sizes they come in
BUILDERS = {"krea2": _krea2}
SIZES: tuple[str, ...] = ("tiny",)
