"""The flux3 family's tiny random-weight pipelines: FLUX 3 [klein] as diffusers' modular pipelines (diffusers has
no Flux3Pipeline), saved as a folder holding modular_model_index.json (backend/tiny_models.py builds them by name)."""

from __future__ import annotations

from typing import Any

from ..tiny_parts import Seeder, qwen3vl_config, qwen3vl_processor, qwen3vl_tokenizer

# The blocks' default text taps: Qwen3-VL hidden_states 4, 8, ..., 32, so the encoder needs 32 (very thin) layers
TAPS = (4, 8, 12, 16, 20, 24, 28, 32)
HIDDEN, LATENT = 32, 4
# a small pixel budget for the references the tests give it (the published one is 1024² pixels)
SMALL = {"shortest_edge": 32 ** 2, "longest_edge": 32 ** 2 * 16}


def _flux3(seed: Seeder, distilled: bool) -> Any:
    """FLUX 3 [klein]-like: Qwen3-VL text encoder (8 stacked hidden states), FLUX.2's VAE, a 1+1-block
    transformer (`flow_map` when step-distilled); the base one carries a ClassifierFreeGuidance guider."""
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler
    from diffusers.models.transformers.transformer_flux3 import Flux3Transformer2DModel
    from diffusers.modular_pipelines import Flux3AutoBlocks, Flux3DistilledAutoBlocks
    from transformers import Qwen3VLForConditionalGeneration

    tok = qwen3vl_tokenizer()
    parts = {
        "text_encoder": seed("text_encoder", lambda: Qwen3VLForConditionalGeneration(
            qwen3vl_config(tok, HIDDEN, TAPS[-1]))),
        "tokenizer": qwen3vl_processor(tok, size=SMALL),  # the blocks call it `tokenizer` but type it AutoProcessor
        "vae": seed("vae", lambda: AutoencoderKLFlux2(block_out_channels=(8, 16, 16, 16), layers_per_block=1,
                                                      latent_channels=LATENT, norm_num_groups=4, sample_size=64)),
        "transformer": seed("transformer", lambda: Flux3Transformer2DModel(
            in_channels=4 * LATENT, cond_in_channels=4 * LATENT, num_layers=1, num_single_layers=1,
            attention_head_dim=16, num_attention_heads=2, joint_attention_dim=len(TAPS) * HIDDEN,
            timestep_channels=32, mlp_ratio=3.0, axes_dims_rope=(4, 4, 4, 4), flow_map=distilled)),
        # the blocks' own spec is FlowMatchEulerDiscreteScheduler.from_config({"shift": 6.93}); saved explicitly
        "scheduler": FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=6.93,
                                                     use_dynamic_shifting=False),
    }
    pipe = (Flux3DistilledAutoBlocks() if distilled else Flux3AutoBlocks()).init_pipeline()
    pipe.update_components(**parts)
    return pipe


# The builders by tiny name (the family declaration's `tiny`), and the sizes they come in
BUILDERS = {"flux3": lambda seed, size: _flux3(seed, True), "flux3-base": lambda seed, size: _flux3(seed, False)}
SIZES: tuple[str, ...] = ("tiny",)
