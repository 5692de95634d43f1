"""The minimax_h3 family's tiny random-weight pipeline: MiniMax H3 as diffusers' modular pipeline (one folder holding
modular_model_index.json serves its t2va, fl2va and ref2va workflows; backend/tiny_models.py builds it by name)."""

from __future__ import annotations

from typing import Any

from ..tiny_parts import Seeder, qwen_tokenizer

TEXT_HIDDEN = 16
TEXT_LAYERS = 51  # MiniMax H3 reads hidden_states[50]: the text encoder needs more than 50 decoder layers
AUDIO_RATE = 8000  # hop 200 = 40 latents a second, as the released 32 kHz with hop 800


def _qwen3vl(tok: Any) -> Any:
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    ids = tok.convert_tokens_to_ids
    text = {"vocab_size": len(tok), "hidden_size": TEXT_HIDDEN, "intermediate_size": 32,
            "num_hidden_layers": TEXT_LAYERS, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "use_cache": False,
            "pad_token_id": tok.pad_token_id,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5_000_000.0, "mrope_section": [2, 1, 1],
                                "mrope_interleaved": True}}
    vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "patch_size": 16,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": TEXT_HIDDEN,
              "num_position_embeddings": 64, "deepstack_visual_indexes": [0]}
    return Qwen3VLForConditionalGeneration(Qwen3VLConfig(
        text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"), tie_word_embeddings=False))


def _processor(tok: Any) -> Any:
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    # patch 16, merge 2: a 32x32 image is one merged vision token; a small pixel cap keeps the presentation short
    common = {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2, "image_mean": [0.5] * 3,
              "image_std": [0.5] * 3, "size": {"shortest_edge": 32 * 32, "longest_edge": 64 * 64}}
    return Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(**common), tokenizer=tok,
                            video_processor=Qwen3VLVideoProcessor(**common))


def _minimax_h3(seed: Seeder, size: str) -> Any:
    """MiniMax H3-like: the released VAE's temporal geometry (17-frame chunks, x4 time: 17n+5 frames), x16 space,
    a mono-or-stereo audio VAE at a tiny 8 kHz, two 2-block transformers (t2va/fl2va and ref2va)."""
    from diffusers import (
        AutoencoderKLMiniMaxH3,
        AutoencoderKLMiniMaxH3Audio,
        MiniMaxH3Scheduler,
        MiniMaxH3Transformer3DModel,
    )
    from diffusers.modular_pipelines import MiniMaxH3Blocks

    tok = qwen_tokenizer()
    latent, audio_latent = 4, 4
    dit = {"num_attention_heads": 2, "attention_head_dim": 16, "hidden_size": 32, "num_layers": 2,
           "num_refiner_layers": 1, "ffn_dim": 64, "in_channels": latent, "audio_in_channels": audio_latent,
           "patch_size": (1, 2, 2), "text_dim": TEXT_HIDDEN, "freq_dim": 16, "time_embed_hidden_dim": 32,
           "time_embed_dim": 16, "rope_freq_dim": 2}
    parts = {
        "tokenizer": tok,
        "processor": _processor(tok),
        "text_encoder": seed("text_encoder", lambda: _qwen3vl(tok)),
        "vae": seed("vae", lambda: AutoencoderKLMiniMaxH3(
            latent_channels=latent, block_out_channels=(8,) * 6, layers_per_block=1, norm_num_groups=4,
            decoder_num_layers=1, decoder_num_attention_heads=2, decoder_attention_head_dim=8,
            decoder_num_register_tokens=4, decoder_ffn_mult=2, latents_mean=(0.0,) * latent,
            latents_std=(1.0,) * latent)),
        "audio_vae": seed("audio_vae", lambda: AutoencoderKLMiniMaxH3Audio(
            encoder_dim=4, encoder_rates=(2, 4, 5, 5), latent_dim=16, latent_channels=audio_latent,
            num_attention_heads=2, decoder_dim=64, decoder_rates=(5, 5, 2, 2, 2), decoder_kernel_sizes=(9, 9, 4, 4, 4),
            resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1, 3, 5),), sampling_rate=AUDIO_RATE,
            latents_mean=[0.0] * audio_latent, latents_std=[1.0] * audio_latent)),
        "scheduler": MiniMaxH3Scheduler(shift=12.0),
        "audio_scheduler": MiniMaxH3Scheduler(shift=3.0),
        "transformer": seed("transformer", lambda: MiniMaxH3Transformer3DModel(**dit)),
        "transformer_ref": seed("transformer_ref", lambda: MiniMaxH3Transformer3DModel(**dit)),
    }
    pipe = MiniMaxH3Blocks().init_pipeline()
    pipe.update_components(**parts)
    # the released 2048-pixel short edge of an image reference packs thousands of rows (34 s a tiny ref2va call)
    pipe.update_components(reference_image_short_edge=64)
    return pipe


# The builders by tiny name (the family declaration's `tiny`), and the sizes they come in
BUILDERS = {"minimax-h3": _minimax_h3}
SIZES: tuple[str, ...] = ("tiny",)
