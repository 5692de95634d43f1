"""The sdxl family's tiny random-weight pipelines (backend/tiny_models.py builds them by name)."""

from __future__ import annotations

from typing import Any

from ..tiny_parts import Seeder, clip_text, clip_tokenizer, vae_kl


def _sdxl(seed: Seeder, size: str) -> Any:
    """SDXL-like UNet with text_time added conditioning; two CLIP encoders (the second with projection)."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel

    clip_tok = clip_tokenizer()
    clip_tok_2 = clip_tokenizer(pad_token="!")
    hidden_1, hidden_2, time_dim = 16, 32, 8
    unet = seed(
        "unet",
        lambda: UNet2DConditionModel(
            sample_size=8,
            in_channels=4,
            out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            block_out_channels=(16, 32),
            layers_per_block=1,
            norm_num_groups=4,
            attention_head_dim=(2, 4),
            transformer_layers_per_block=(1, 1),
            use_linear_projection=True,
            cross_attention_dim=hidden_1 + hidden_2,
            addition_embed_type="text_time",
            addition_time_embed_dim=time_dim,
            projection_class_embeddings_input_dim=6 * time_dim + hidden_2,
        ),
    )
    scheduler = EulerDiscreteScheduler(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        prediction_type="epsilon",
        timestep_spacing="leading",
        steps_offset=1,
    )
    return StableDiffusionXLPipeline(
        vae=vae_kl(seed, 4, scaling_factor=0.13025),
        text_encoder=clip_text(seed, "text_encoder", clip_tok, hidden_1, with_projection=False),
        text_encoder_2=clip_text(seed, "text_encoder_2", clip_tok_2, hidden_2, with_projection=True),
        tokenizer=clip_tok,
        tokenizer_2=clip_tok_2,
        unet=unet,
        scheduler=scheduler,
        force_zeros_for_empty_prompt=True,
    )



# The builders by tiny name (the family declaration's `tiny`), and the sizes they come in
BUILDERS = {"sdxl": _sdxl}
SIZES: tuple[str, ...] = ("tiny",)


# Its tiny ControlNets (Apply ControlNet) by name: (diffusers class, changes to the config taken from the
# tiny pipeline's denoiser); tiny_models.build_tiny_controlnet builds them
CONTROLNETS: dict[str, tuple[str, dict[str, Any]]] = {
    "sdxl": ("ControlNetModel", {}),
    "sdxl-union": ("ControlNetUnionModel", {"num_control_type": 8, "num_trans_channel": 16, "num_trans_head": 2,
                                                    "num_proj_channel": 16}),
}
