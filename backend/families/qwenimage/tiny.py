"""The qwenimage family's tiny random-weight pipelines (backend/tiny_models.py builds them by name)."""

from __future__ import annotations

from typing import Any

from ..tiny_parts import Seeder, qwen_text_common, qwen_tokenizer


def _qwenimage(seed: Seeder, size: str) -> Any:
    """Qwen-Image-like: Qwen2.5-VL text encoder (tiny vision tower included), Wan-style causal 3D VAE."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tok = qwen_tokenizer()
    hidden = 32
    ids = tok.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(
        text_config={
            **qwen_text_common(len(tok), hidden),
            "num_hidden_layers": 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            "pad_token_id": tok.pad_token_id,
            "bos_token_id": tok.pad_token_id,
            "eos_token_id": tok.eos_token_id,
            "use_cache": False,
        },
        vision_config={
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "out_hidden_size": hidden,
            "fullatt_block_indexes": [0],
        },
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=True,
    )
    z_dim = 4
    transformer = seed(
        "transformer",
        lambda: QwenImageTransformer2DModel(
            patch_size=2,
            in_channels=4 * z_dim,
            out_channels=z_dim,
            num_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=hidden,
            axes_dims_rope=(4, 6, 6),
        ),
    )
    vae = seed(
        "vae",
        lambda: AutoencoderKLQwenImage(
            base_dim=8,
            z_dim=z_dim,
            dim_mult=[1, 2, 2, 2],
            num_res_blocks=1,
            temperal_downsample=[False, True, True],
            latents_mean=[0.0] * z_dim,
            latents_std=[1.0] * z_dim,
        ),
    )
    return QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000,
            shift=1.0,
            use_dynamic_shifting=True,
            time_shift_type="exponential",
            base_shift=0.5,
            max_shift=0.9,
            base_image_seq_len=256,
            max_image_seq_len=8192,
            shift_terminal=0.02,
        ),
        vae=vae,
        text_encoder=seed("text_encoder", lambda: Qwen2_5_VLForConditionalGeneration(config)),
        tokenizer=tok,
        transformer=transformer,
    )



# The builders by tiny name (the family declaration's `tiny`), and the sizes they come in
BUILDERS = {"qwenimage": _qwenimage}
SIZES: tuple[str, ...] = ("tiny",)


# Its tiny ControlNets (Apply ControlNet) by name: (diffusers class, changes to the config taken from the
# tiny pipeline's denoiser); tiny_models.build_tiny_controlnet builds them
CONTROLNETS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwenimage": ("QwenImageControlNetModel", {"num_layers": 1}),
}
