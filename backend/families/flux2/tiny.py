"""The flux2 family's tiny random-weight pipelines (backend/tiny_models.py builds them by name)."""

from __future__ import annotations

from typing import Any

from ..tiny_parts import Seeder, qwen_text_common, qwen_tokenizer


def _flux2(seed: Seeder, size: str) -> Any:
    """FLUX.2 [klein]-like: Qwen3 text encoder (3 stacked hidden layers), step-distilled (no CFG)."""
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2KleinPipeline,
        Flux2Transformer2DModel,
    )
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = qwen_tokenizer()
    hidden = 32
    # The pipeline stacks hidden states 9, 18 and 27 by default, so the encoder needs 27 (very thin) layers.
    text_config = Qwen3Config(
        **qwen_text_common(len(tok), hidden),
        num_hidden_layers=27,
        head_dim=16,
        tie_word_embeddings=True,
        use_cache=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    latent = 4
    transformer = seed(
        "transformer",
        lambda: Flux2Transformer2DModel(
            patch_size=1,
            in_channels=4 * latent,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=3 * hidden,
            timestep_guidance_channels=32,
            mlp_ratio=3.0,
            axes_dims_rope=(4, 4, 4, 4),
            guidance_embeds=False,
        ),
    )
    vae = seed(
        "vae",
        lambda: AutoencoderKLFlux2(
            block_out_channels=(8, 16, 16, 16),
            layers_per_block=1,
            latent_channels=latent,
            norm_num_groups=4,
            sample_size=64,
        ),
    )
    return Flux2KleinPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000,
            shift=3.0,
            use_dynamic_shifting=True,
            time_shift_type="exponential",
            base_shift=0.5,
            max_shift=1.15,
            base_image_seq_len=256,
            max_image_seq_len=4096,
        ),
        vae=vae,
        text_encoder=seed("text_encoder", lambda: Qwen3ForCausalLM(text_config)),
        tokenizer=tok,
        transformer=transformer,
        is_distilled=True,
    )



# The builders by tiny name (the family declaration's `tiny`), and the sizes they come in
BUILDERS = {"flux2": _flux2}
SIZES: tuple[str, ...] = ("tiny",)
