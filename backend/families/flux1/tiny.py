"""The flux1 family's tiny random-weight pipelines (backend/tiny_models.py builds them by name)."""

from __future__ import annotations

from typing import Any

from ..tiny_parts import Seeder, clip_text, clip_tokenizer, t5_encoder, t5_tokenizer, vae_kl

# FLUX.1 shapes per size. "small" was sized by measurement (one CPU thread, 256x256, 4 steps: ~0.5 s, ~7.6 MB).
# Transformer FLOPs cost a lot of stored bytes per FLOP at 256 tokens, so a full-resolution-heavy VAE decoder
# (wide first block, convolutions reuse each weight 65k times) supplies most of the time: the 4 transformer
# steps take ~40 ms, the decode ~0.45 s. Widening the transformer instead would need ~40 MB for the same time.
_FLUX_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "heads": 2,
        "head_dim": 16,
        "rope": (4, 6, 6),
        "double": 1,
        "single": 1,
        "vae": (8, 16, 16, 16),
        "vae_layers": 1,
    },
    "small": {
        "heads": 4,
        "head_dim": 24,
        "rope": (4, 10, 10),
        "double": 2,
        "single": 2,
        "vae": (112, 32, 16, 16),
        "vae_layers": 1,
    },
}


def _flux(seed: Seeder, size: str) -> Any:
    """FLUX.1-schnell-like: no guidance embedding, CLIP-L pooled + T5 sequence conditioning."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    shape = _FLUX_SIZES[size]
    clip_tok = clip_tokenizer()
    t5_tok = t5_tokenizer()
    clip_hidden, t5_dim, latent = 32, 32, 4
    transformer = seed(
        "transformer",
        lambda: FluxTransformer2DModel(
            patch_size=1,
            in_channels=4 * latent,
            num_layers=shape["double"],
            num_single_layers=shape["single"],
            attention_head_dim=shape["head_dim"],
            num_attention_heads=shape["heads"],
            joint_attention_dim=t5_dim,
            pooled_projection_dim=clip_hidden,
            guidance_embeds=False,
            axes_dims_rope=shape["rope"],
        ),
    )
    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000,
            shift=1.0,
            use_dynamic_shifting=False,
            base_shift=0.5,
            max_shift=1.15,
            base_image_seq_len=256,
            max_image_seq_len=4096,
        ),
        vae=vae_kl(
            seed,
            latent,
            shape["vae"],
            shape["vae_layers"],
            scaling_factor=0.3611,
            shift_factor=0.1159,
            use_quant_conv=False,
            use_post_quant_conv=False,
        ),
        text_encoder=clip_text(seed, "text_encoder", clip_tok, clip_hidden, with_projection=False),
        tokenizer=clip_tok,
        text_encoder_2=t5_encoder(seed, "text_encoder_2", t5_tok, t5_dim),
        tokenizer_2=t5_tok,
        transformer=transformer,
    )



# The builders by tiny name (the family declaration's `tiny`), and the sizes they come in
BUILDERS = {"flux": _flux}
SIZES: tuple[str, ...] = ("tiny", "small")


# Its tiny ControlNets (Apply ControlNet) by name: (diffusers class, changes to the config taken from the
# tiny pipeline's denoiser); tiny_models.build_tiny_controlnet builds them
CONTROLNETS: dict[str, tuple[str, dict[str, Any]]] = {
    "flux": ("FluxControlNetModel", {"num_layers": 1, "num_single_layers": 1}),
    "flux-union": ("FluxControlNetModel", {"num_layers": 1, "num_single_layers": 1, "num_mode": 7}),
}
