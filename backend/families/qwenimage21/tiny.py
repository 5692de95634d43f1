"""The qwenimage21 family's tiny random-weight pipeline (backend/tiny_models.py builds it by name)."""

from __future__ import annotations

from typing import Any

from ..tiny_parts import Seeder, qwen3vl_config, qwen3vl_processor, qwen3vl_tokenizer


def _qwenimage21(seed: Seeder, size: str) -> Any:
    """Qwen-Image 2.1-like: Qwen3-VL (2 text layers, a 1-block vision tower) read through its processor, a
    2-layer block-causal transformer (KV cache on), and the 5-level RGBA VAE (the real 16x spatial factor)."""
    from diffusers import (
        AutoencoderKLQwenImage21,
        FlowMatchEulerDiscreteScheduler,
        QwenImage21Pipeline,
        QwenImage21Transformer2DModel,
    )
    from transformers import Qwen3VLForConditionalGeneration

    tok = qwen3vl_tokenizer()
    hidden, z = 32, 4
    transformer = seed("transformer", lambda: QwenImage21Transformer2DModel(
        patch_size=1, in_channels=z, out_channels=z, num_layers=2, attention_head_dim=16, num_attention_heads=2,
        context_in_dim=hidden, mlp_ratio=3, axes_dims_rope=(4, 6, 6), causal_condition=True))
    vae = seed("vae", lambda: AutoencoderKLQwenImage21(
        base_dim=8, decoder_base_dim=8, z_dim=z, dim_mult=[1, 1, 1, 1, 1], num_res_blocks=1,
        temperal_downsample=[False, True, True, True], latents_mean=[0.0] * z, latents_std=[1.0] * z,
        in_channels=4, out_channels=4))
    return QwenImage21Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True,
                                                  base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
                                                  max_image_seq_len=4096, time_shift_type="exponential"),
        vae=vae,
        text_encoder=seed("text_encoder", lambda: Qwen3VLForConditionalGeneration(qwen3vl_config(tok, hidden))),
        processor=qwen3vl_processor(tok),
        transformer=transformer,
    )


# The builders by tiny name (the family declaration's `tiny`), and the sizes they come in
BUILDERS = {"qwenimage21": _qwenimage21}
SIZES: tuple[str, ...] = ("tiny",)
