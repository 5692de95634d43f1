"""The ltx2 family's tiny random-weight pipelines (backend/tiny_models.py builds them by name): LTX-2.3's layout
(per-modality connector projections, gated attention, cross-attention modulation on both streams) in about a
megabyte. The smallest size it makes is 64x64 (a 2x2 latent: a 1x1 one breaks the decoder's padding)."""

from __future__ import annotations

from typing import Any

from ..tiny_parts import Seeder, gemma_tokenizer

# The vocoder's real output rate: 100 mel frames a second (16 kHz, hop 160) x prod(upsample_factors) = 8000 Hz,
# a rate AAC takes (the published vocoder: 100 x 240 = 24 kHz); its config's output_sampling_rate says the same
TINY_RATE = 8000


def _gemma3(seed: Seeder, tok: Any, hidden: int = 32, layers: int = 2) -> Any:
    """Gemma3ForConditionalGeneration (LTX-2.3's text encoder): a 2-layer text tower and a 1-layer SigLIP tower
    (never run by the pipeline, which the class needs)."""
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )

    text = Gemma3TextConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                            num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                            max_position_embeddings=1024, sliding_window=64, pad_token_id=tok.pad_token_id,
                            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, query_pre_attn_scalar=16,
                            use_cache=False)
    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                image_size=28, patch_size=14)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                          image_token_index=tok.convert_tokens_to_ids("<image_soft_token>"),
                          boi_token_index=tok.convert_tokens_to_ids("<start_of_image>"),
                          eoi_token_index=tok.convert_tokens_to_ids("<end_of_image>"))
    return seed("text_encoder", lambda: Gemma3ForConditionalGeneration(config))


def _gemma4(seed: Seeder, tok: Any, hidden: int = 32, layers: int = 2) -> Any:
    """Gemma4UnifiedForConditionalGeneration (LTX-2.5's text encoder), its text tower only (vision and audio are
    optional in its config, and the pipeline runs none): 2 layers, the last one full attention."""
    from transformers import Gemma4UnifiedConfig, Gemma4UnifiedForConditionalGeneration
    from transformers.models.gemma4_unified.configuration_gemma4_unified import Gemma4UnifiedTextConfig

    text = Gemma4UnifiedTextConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                                   num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                                   head_dim=16, global_head_dim=16, max_position_embeddings=1024, sliding_window=64,
                                   layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"],
                                   pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                                   eos_token_id=tok.eos_token_id, use_cache=False)
    config = Gemma4UnifiedConfig(text_config=text, vision_config=None, audio_config=None)
    return seed("text_encoder", lambda: Gemma4UnifiedForConditionalGeneration(config))


def _ltx25(seed: Seeder, size: str) -> Any:
    """LTX-2.5-like: tiny-ltx2 with LTX-2.5's Gemma 4 text encoder and its DiT without feed-forward biases
    (ff_bias False, as LTX-2.5's config); the same text width and layers, so the connectors stay as they are."""
    return _ltx2(seed, size, text_encoder=_gemma4, ff_bias=False)


def _ltx2(seed: Seeder, size: str, text_encoder: Any = None, ff_bias: bool = True) -> Any:
    """LTX-2.3-like text to video with sound: Gemma 3 text encoder, LTX-2's text connectors, a 2-block
    audio-video DiT, the video VAE at the real 32x spatial and 8x temporal compression (a video has 8k + 1
    frames), the audio VAE (16 mel bins) and a vocoder. What must agree: the DiT's audio channels = audio latent
    channels x mel bins / 4 = the audio VAE's base channels; the vocoder's input = its output channels x mel bins."""
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2Pipeline,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors, LTX2Vocoder

    tok = gemma_tokenizer()
    te = (text_encoder or _gemma3)(seed, tok)
    hidden, layers = te.config.text_config.hidden_size, te.config.text_config.num_hidden_layers
    heads, head_dim, a_heads, a_head_dim = 2, 8, 2, 4
    inner, a_inner = heads * head_dim, a_heads * a_head_dim
    transformer = seed("transformer", lambda: LTX2VideoTransformer3DModel(
        in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=heads,
        attention_head_dim=head_dim, cross_attention_dim=inner, audio_in_channels=8, audio_out_channels=8,
        audio_num_attention_heads=a_heads, audio_attention_head_dim=a_head_dim, audio_cross_attention_dim=a_inner,
        num_layers=2, caption_channels=hidden, rope_double_precision=False, rope_type="split",
        use_prompt_embeddings=False, gated_attn=True, cross_attn_mod=True, audio_gated_attn=True,
        audio_cross_attn_mod=True, vae_scale_factors=(8, 32, 32), ff_bias=ff_bias, audio_ff_bias=ff_bias))
    connectors = seed("connectors", lambda: LTX2TextConnectors(
        caption_channels=hidden, text_proj_in_factor=layers + 1,
        video_connector_num_attention_heads=heads, video_connector_attention_head_dim=head_dim,
        video_connector_num_layers=1, video_connector_num_learnable_registers=None,
        audio_connector_num_attention_heads=a_heads, audio_connector_attention_head_dim=a_head_dim,
        audio_connector_num_layers=1, audio_connector_num_learnable_registers=None,
        connector_rope_base_seq_len=32, rope_double_precision=False, rope_type="split",
        per_modality_projections=True, video_hidden_dim=inner, audio_hidden_dim=a_inner,
        video_gated_attn=True, audio_gated_attn=True))
    vae = seed("vae", lambda: AutoencoderKLLTX2Video(  # patch 4, then 3 spatio-temporal downsamples: 32x, 8x
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8, 8, 8, 8),
        down_block_types=("LTX2VideoDownBlock3D",) * 4, decoder_block_out_channels=(8, 8, 8),
        layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, True, False), decoder_spatio_temporal_scaling=(True, True, True),
        decoder_inject_noise=(False, False, False, False),
        downsample_type=("spatiotemporal", "spatiotemporal", "spatiotemporal", "spatial"),
        upsample_type=("spatiotemporal", "spatiotemporal", "spatiotemporal"), upsample_residual=(False, False, False),
        upsample_factor=(1, 1, 1), timestep_conditioning=False, patch_size=4, patch_size_t=1,
        encoder_causal=True, decoder_causal=False))
    audio_vae = seed("audio_vae", lambda: AutoencoderKLLTX2Audio(
        base_channels=8, output_channels=2, ch_mult=(1, 1, 1), num_res_blocks=1, attn_resolutions=None, in_channels=2,
        resolution=32, latent_channels=2, norm_type="pixel", causality_axis="height", dropout=0.0,
        mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160, is_causal=True, mel_bins=16))
    vocoder = seed("vocoder", lambda: LTX2Vocoder(
        in_channels=audio_vae.config.output_channels * audio_vae.config.mel_bins, hidden_channels=16, out_channels=2,
        upsample_kernel_sizes=[20, 16], upsample_factors=[10, 8], resnet_kernel_sizes=[3],
        resnet_dilations=[[1, 3, 5]], output_sampling_rate=TINY_RATE))
    scheduler = FlowMatchEulerDiscreteScheduler(  # LTX-2's published schedule (dynamic shift by the token count)
        num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
        base_image_seq_len=1024, max_image_seq_len=4096, shift_terminal=0.1, time_shift_type="exponential")
    return LTX2Pipeline(scheduler=scheduler, vae=vae, audio_vae=audio_vae, text_encoder=te, tokenizer=tok,
                        connectors=connectors, transformer=transformer, vocoder=vocoder)


def upsampler(path: Any, seed: int = 0) -> Any:
    """A tiny x2 spatial latent upsampler for tiny-ltx2's 4 latent channels, written as ComfyUI's
    latent_upscale_models hold Lightricks' (ltx-2.3-spatial-upscaler-x2-*): one safetensors file, diffusers'
    LTX2LatentUpsamplerModel keys, its config as JSON in the metadata. mid_channels must be a multiple of 32
    (GroupNorm(32))."""
    import json
    from pathlib import Path

    import torch
    from diffusers.pipelines.ltx2 import LTX2LatentUpsamplerModel
    from safetensors.torch import save_file

    config = dict(in_channels=4, mid_channels=32, num_blocks_per_stage=1, dims=3, spatial_upsample=True,
                  temporal_upsample=False)
    with torch.random.fork_rng():  # the caller's RNG stays as it was
        model = Seeder(seed)("latent_upsampler", lambda: LTX2LatentUpsamplerModel(**config))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path),
              metadata={"config": json.dumps(config)})
    return path


# The builders by tiny name (the family declaration's `tiny`), and the sizes they come in
BUILDERS = {"ltx2": _ltx2, "ltx25": _ltx25}
SIZES: tuple[str, ...] = ("tiny",)
