"""The wan family's tiny random-weight pipelines (backend/tiny_models.py builds them by name)."""

from __future__ import annotations

from typing import Any

from ..tiny_parts import Seeder, t5_tokenizer


def _wan(seed: Seeder, size: str) -> Any:
    """Wan 2.1-like text to video: UMT5 text encoder, a 2-block video DiT (patches 1x2x2, 2 heads), Wan's causal 3D
    VAE (8x spatial, 4x temporal) and the published UniPC flow schedule. 5 frames of 32x32 make 8 tokens."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    tok = t5_tokenizer()
    hidden, z_dim = 32, 4
    text = UMT5Config(vocab_size=len(tok), d_model=hidden, d_kv=hidden // 4, d_ff=2 * hidden, num_layers=2,
                      num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=32,
                      feed_forward_proj="gated-gelu", dropout_rate=0.0, is_encoder_decoder=False, use_cache=False,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    transformer = seed(
        "transformer",
        lambda: WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=z_dim,
            out_channels=z_dim, text_dim=hidden, freq_dim=16, ffn_dim=32, num_layers=2, rope_max_seq_len=1024,  # the published table
        ),
    )
    vae = seed(
        "vae",
        lambda: AutoencoderKLWan(
            base_dim=8, z_dim=z_dim, dim_mult=[1, 2, 2, 2], num_res_blocks=1, temperal_downsample=[False, True, True],
            latents_mean=[0.0] * z_dim, latents_std=[1.0] * z_dim,
        ),
    )
    return WanPipeline(
        tokenizer=tok,
        text_encoder=seed("text_encoder", lambda: UMT5EncoderModel(text)),
        vae=vae,
        scheduler=UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0),
        transformer=transformer,
    )


def _wan_i2v(seed: Seeder, size: str) -> Any:
    """Wan 2.1-like image to video: the text-to-video parts of `_wan`, a CLIP vision image encoder (clip_vision_h's
    role: its second-to-last hidden state conditions every block) and its image processor, and a denoiser that
    also reads the start image's latents and mask (in channels 2 · z_dim + 4, as the published 36 for 16)."""
    from diffusers import WanImageToVideoPipeline, WanTransformer3DModel
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    t2v = _wan(seed, size)
    z_dim, width = t2v.vae.config.z_dim, 16
    vision = CLIPVisionConfig(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
                              num_attention_heads=2, image_size=32, patch_size=8, projection_dim=width)
    transformer = seed(
        "transformer_i2v",
        lambda: WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=2 * z_dim + 4,
            out_channels=z_dim, text_dim=t2v.text_encoder.config.d_model, freq_dim=16, ffn_dim=32, num_layers=2,
            rope_max_seq_len=1024, image_dim=width, added_kv_proj_dim=24,
        ),
    )
    processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                   image_mean=[0.48145466, 0.4578275, 0.40821073],
                                   image_std=[0.26862954, 0.26130258, 0.27577711])
    return WanImageToVideoPipeline(
        tokenizer=t2v.tokenizer, text_encoder=t2v.text_encoder, vae=t2v.vae, scheduler=t2v.scheduler,
        transformer=transformer, image_encoder=seed("image_encoder", lambda: CLIPVisionModel(vision)),
        image_processor=processor,
    )


def _wan22(seed: Seeder, size: str) -> Any:
    """Wan 2.2 A14B-like text to video: `_wan`'s parts with a second expert (`transformer_2`, low noise, its own
    weights) and the published boundary_ratio (0.875) and flow shift (12): 2 steps run the high-noise expert only,
    3 run both (the last step's timestep is below the boundary)."""
    from diffusers import UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel

    wan = _wan(seed, size)
    low = seed("transformer_2", lambda: WanTransformer3DModel.from_config(wan.transformer.config))
    return WanPipeline(
        tokenizer=wan.tokenizer, text_encoder=wan.text_encoder, vae=wan.vae, transformer=wan.transformer,
        transformer_2=low, boundary_ratio=0.875,
        scheduler=UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=12.0),
    )



# The builders by tiny name (the family declaration's `tiny`), and the sizes they come in
BUILDERS = {"wan": _wan, "wan-i2v": _wan_i2v, "wan22": _wan22}
SIZES: tuple[str, ...] = ("tiny",)
