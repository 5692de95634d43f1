"""The ideogram4 family's tiny random-weight pipeline (backend/tiny_models.py builds it by name)."""

from __future__ import annotations

from typing import Any

from ..tiny_parts import Seeder, qwen3vl_config, qwen3vl_tokenizer


def _ideogram4(seed: Seeder, size: str) -> Any:
    """Ideogram 4-like: Qwen3VLModel with 36 thin layers (the pipeline taps layers 0, 3, ..., 33, 35: a module
    constant), two 2-layer transformers (conditional and unconditional), FLUX.2's VAE layout (here 4 channels)."""
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Ideogram4Pipeline
    from diffusers.models.transformers.transformer_ideogram4 import Ideogram4Transformer2DModel
    from diffusers.pipelines.ideogram4.pipeline_ideogram4 import QWEN3_VL_ACTIVATION_LAYERS
    from transformers import Qwen3VLModel

    tok = qwen3vl_tokenizer()
    hidden, latent = 32, 4

    def transformer() -> Any:
        return Ideogram4Transformer2DModel(
            in_channels=4 * latent, num_layers=2, attention_head_dim=16, num_attention_heads=2, intermediate_size=64,
            adaln_dim=16, llm_features_dim=len(QWEN3_VL_ACTIVATION_LAYERS) * hidden, rope_theta=5_000_000,
            mrope_section=(4, 2, 2), norm_eps=1e-5)

    return Ideogram4Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False),
        vae=seed("vae", lambda: AutoencoderKLFlux2(block_out_channels=(8, 16, 16, 16), layers_per_block=1,
                                                   latent_channels=latent, norm_num_groups=4, sample_size=64)),
        text_encoder=seed("text_encoder", lambda: Qwen3VLModel(qwen3vl_config(tok, hidden, layers=36))),
        tokenizer=tok,
        transformer=seed("transformer", transformer),
        unconditional_transformer=seed("unconditional_transformer", transformer),
        prompt_enhancer_head=None,
    )


# The builders by tiny name (the family declaration's `tiny`), and the sizes they come in
BUILDERS = {"ideogram4": _ideogram4}
SIZES: tuple[str, ...] = ("tiny",)
