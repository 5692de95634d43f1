"""The flux3 family's tiny random-weight pipelines: FLUX 3 [klein] as diffusers' modular pipelines (diffusers has
no Flux3Pipeline), saved as a folder holding modular_model_index.json (backend/tiny_models.py builds them by name)."""

from __future__ import annotations

from typing import Any

from ..tiny_parts import QWEN3VL_CHAT_TEMPLATE, Seeder, qwen_tokenizer

# The blocks' default text taps: Qwen3-VL hidden_states 4, 8, ..., 32, so the encoder needs 32 (very thin) layers
TAPS = (4, 8, 12, 16, 20, 24, 28, 32)
HIDDEN, LATENT = 32, 4



def qwen3vl_processor(tok: Any, patch: int = 16, merge: int = 2) -> Any:
    """Qwen3VLProcessor (the blocks' `tokenizer`): the tiny tokenizer with Qwen3-VL's image and video processors
    at Qwen3-VL's settings (patch 16, temporal patch 2, merge 2, mean/std 0.5) and a small pixel budget."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tok.chat_template = QWEN3VL_CHAT_TEMPLATE
    size = {"shortest_edge": (patch * merge) ** 2, "longest_edge": (patch * merge) ** 2 * 16}
    common = {"patch_size": patch, "temporal_patch_size": 2, "merge_size": merge, "image_mean": [0.5] * 3,
              "image_std": [0.5] * 3, "size": size}
    return Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(**common), tokenizer=tok,
                            video_processor=Qwen3VLVideoProcessor(**common), chat_template=QWEN3VL_CHAT_TEMPLATE)


def qwen3vl_config(tok: Any, hidden: int, layers: int) -> Any:
    """A tiny Qwen3-VL config (text: 2 heads of 16, interleaved mRoPE [2, 3, 3]; vision: 1 block, patch 16)."""
    from transformers import Qwen3VLConfig

    ids = tok.convert_tokens_to_ids
    text = {"vocab_size": len(tok), "hidden_size": hidden, "intermediate_size": 2 * hidden,
            "num_hidden_layers": layers, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16,
            "max_position_embeddings": 4096, "pad_token_id": tok.pad_token_id, "use_cache": False,
            "tie_word_embeddings": True,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [2, 3, 3],
                                "mrope_interleaved": True}}
    vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "patch_size": 16,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": hidden,
              "num_position_embeddings": 64, "deepstack_visual_indexes": [0]}
    return Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
                         video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
                         vision_end_token_id=ids("<|vision_end|>"), tie_word_embeddings=True)


def _flux3(seed: Seeder, distilled: bool) -> Any:
    """FLUX 3 [klein]-like: Qwen3-VL text encoder (8 stacked hidden states), FLUX.2's VAE, a 1+1-block
    transformer (`flow_map` when step-distilled); the base one carries a ClassifierFreeGuidance guider."""
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler
    from diffusers.models.transformers.transformer_flux3 import Flux3Transformer2DModel
    from diffusers.modular_pipelines import Flux3AutoBlocks, Flux3DistilledAutoBlocks
    from transformers import Qwen3VLForConditionalGeneration

    tok = qwen_tokenizer()
    parts = {
        "text_encoder": seed("text_encoder", lambda: Qwen3VLForConditionalGeneration(
            qwen3vl_config(tok, HIDDEN, TAPS[-1]))),
        "tokenizer": qwen3vl_processor(tok),  # the blocks call it `tokenizer` but type it AutoProcessor
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
