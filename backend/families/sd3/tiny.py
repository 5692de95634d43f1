"""The sd3 family's tiny random-weight pipelines (backend/tiny_models.py builds them by name)."""

from __future__ import annotations

from typing import Any

from ..tiny_parts import Seeder, clip_text, clip_tokenizer, t5_encoder, t5_tokenizer, vae_kl


def _sd3(seed: Seeder, size: str) -> Any:
    """SD3/3.5-like MMDiT: CLIP-L + CLIP-G (pooled and penultimate states) + T5, 16 latent channels."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    clip_tok = clip_tokenizer()
    clip_tok_2 = clip_tokenizer(pad_token="!")
    t5_tok = t5_tokenizer()
    clip_hidden, t5_dim = 16, 32  # the two CLIP widths are concatenated and zero-padded to the T5 width
    transformer = seed(
        "transformer",
        lambda: SD3Transformer2DModel(
            sample_size=32,
            patch_size=2,
            in_channels=16,
            num_layers=2,
            attention_head_dim=8,
            num_attention_heads=4,
            joint_attention_dim=t5_dim,
            caption_projection_dim=32,
            pooled_projection_dim=2 * clip_hidden,
            out_channels=16,
            pos_embed_max_size=64,
            dual_attention_layers=(0,),
            qk_norm="rms_norm",
        ),
    )
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0),
        vae=vae_kl(
            seed,
            16,
            scaling_factor=1.5305,
            shift_factor=0.0609,
            use_quant_conv=False,
            use_post_quant_conv=False,
        ),
        text_encoder=clip_text(seed, "text_encoder", clip_tok, clip_hidden, with_projection=True),
        tokenizer=clip_tok,
        text_encoder_2=clip_text(seed, "text_encoder_2", clip_tok_2, clip_hidden, with_projection=True),
        tokenizer_2=clip_tok_2,
        text_encoder_3=t5_encoder(seed, "text_encoder_3", t5_tok, t5_dim),
        tokenizer_3=t5_tok,
    )



# The builders by tiny name (the family declaration's `tiny`), and the sizes they come in
BUILDERS = {"sd3": _sd3}
SIZES: tuple[str, ...] = ("tiny",)


# Its tiny ControlNets (Apply ControlNet) by name: (diffusers class, changes to the config taken from the
# tiny pipeline's denoiser); tiny_models.build_tiny_controlnet builds them
CONTROLNETS: dict[str, tuple[str, dict[str, Any]]] = {
    "sd3": ("SD3ControlNetModel", {"num_layers": 1}),
}
