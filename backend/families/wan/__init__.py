"""Wan 2.1 / 2.2 (Alibaba Wan): video. A DiT over (frames, height, width) patches with the UMT5-XXL text encoder
and Wan's causal 3D VAE (8x spatial, 4x temporal: a video has 1 + 4k frames); CFG as two branches ("cond",
"uncond"); diffusers ships a context-parallel plan for its transformer but no tensor-parallel one.

Image to video (WanImageToVideoPipeline) encodes the start image with the VAE as the video's first frame and
hands the denoiser its latents and a mask next to the noise (in channels 36 for 16 latent ones); Wan 2.1's also
conditions every block on the image through a CLIP vision encoder (clip_vision_h: `image_encoder` and
`image_processor`), Wan 2.2 I2V A14B's has none. Wan 2.2 TI2V 5B is one model for both: its model_index sets
expand_timesteps, with which WanImageToVideoPipeline (made from the loaded WanPipeline) keeps the start image's
latents as the first latent frame at timestep 0 (ComfyUI's Wan22ImageToVideoLatent does the same).

The published text-to-video models, as ComfyUI's files hold them (all in Wan's own key layout, which diffusers'
single-file converter reads): Wan 2.1 (1.3B and 14B: one config, the sizes read from the file), Wan 2.2 TI2V 5B
(48 latent channels: Wan 2.2's own VAE, 16x spatial) and Wan 2.2 A14B, two 14B experts of Wan 2.1's shape (the
high-noise one runs the steps above boundary_ratio of the schedule, the low-noise one the rest: diffusers'
`transformer` and `transformer_2`), chosen as two diffusion models; Wan 2.2 I2V A14B is such a pair of image-to-video
experts (ComfyUI's wan2.2_i2v_high_noise_14B / low_noise_14B files). Wan 2.1 I2V (wan2.1_i2v_480p_14B and
720p: one config, the 480p schedule) is one file with a CLIP image embedding, read with ComfyUI's
clip_vision_h.safetensors (image_encoders.py) chosen in the loader's clip_vision.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..base import Configs, ModelFamily, Pipeline, Shapes, TextSlot, count, head_dim

TEXT = (TextSlot("text_encoder", "umt5"),)
WAN21 = Configs("wan21-t2v-1.3b", TEXT, "Wan 2.1")
WAN22_5B = Configs("wan22-ti2v-5b", TEXT, "Wan 2.2 TI2V 5B", "wan2.2_vae.safetensors")
WAN22_A14B = Configs("wan22-t2v-a14b", TEXT, "Wan 2.2 A14B")
WAN22_I2V = Configs("wan22-i2v-a14b", TEXT, "Wan 2.2 I2V A14B")
WAN21_I2V = Configs("wan21-i2v-14b", TEXT, "Wan 2.1 I2V")
WAN22_LATENTS = 48  # Wan 2.2 5B's VAE; Wan 2.1's (and A14B's) has 16


def sizes(s: Shapes, published: dict, texts: Mapping[str, Shapes]) -> dict:
    """ComfyUI's (Wan's own) key layout: dim from the patch embedding, heads of 128 as ComfyUI assumes."""
    dim = s["patch_embedding.weight"][0]
    head = head_dim(dim, published["attention_head_dim"])
    return {"in_channels": s["patch_embedding.weight"][1], "out_channels": s["head.head.weight"][0] // 4,
            "num_layers": count(s, "blocks."), "attention_head_dim": head, "num_attention_heads": dim // head,
            "ffn_dim": s["blocks.0.ffn.0.weight"][0], "text_dim": s["text_embedding.0.weight"][1],
            "freq_dim": s["time_embedding.0.weight"][1], **image_sizes(s, dim)}


def image_sizes(s: Shapes, dim: int) -> dict:
    """Wan 2.1 I2V's CLIP image embedding (ComfyUI's img_emb, for clip_vision_h's 1280-wide features) and the
    image keys and values it adds to every block's cross-attention (as wide as the model)."""
    if "img_emb.proj.0.weight" not in s:
        return {}
    return {"image_dim": s["img_emb.proj.0.weight"][0], "added_kv_proj_dim": dim}


def text_widths(s: Shapes, kinds: frozenset[str]) -> dict[str, int]:
    return {"umt5": s["text_embedding.0.weight"][1]}


def configs_for(s: Shapes, kinds: frozenset[str]) -> Configs:
    """Wan 2.2 5B by its 48 latent channels; a denoiser that reads more channels than it makes (the start image's
    latents and mask beside the noise) is Wan 2.1 I2V with a CLIP image embedding, an expert of Wan 2.2 I2V A14B
    without; every other one is Wan 2.1 text to video."""
    if s["patch_embedding.weight"][1] == WAN22_LATENTS:
        return WAN22_5B
    if s["patch_embedding.weight"][1] != s["head.head.weight"][0] // 4:
        return WAN21_I2V if "img_emb.proj.0.weight" in s else WAN22_I2V
    return WAN21


# Step caches, on each expert of a pair: diffusers' first block cache knows Wan's blocks; TaylorSeer extrapolates
# each block's self-attention, cross-attention and feed-forward (its default names match no Wan module: it would do
# nothing). Not MagCache: diffusers 0.42 ships magnitude ratios for FLUX.1 only (each Wan expert needs its own).
TAYLORSEER_MODULES = (r"blocks\.\d+\.(attn1|attn2|ffn)",)
_VIDEO = dict(cfg_passes="branches", cp_plan=True, frame_step=4, step_caches=("first block", "taylorseer"),
              taylorseer_modules=TAYLORSEER_MODULES)

FAMILY = ModelFamily(
    id="wan", order=70, tiny=("wan", "wan-i2v", "wan22"), name="Wan",
    pipelines=(Pipeline("WanPipeline", "Wan", 2, "guidance_scale", False, **_VIDEO,
                        start_image_via="WanImageToVideoPipeline", start_image_if="expand_timesteps"),
               Pipeline("WanImageToVideoPipeline", "Wan", 2, "guidance_scale", False, **_VIDEO, start_image=True,
                        needs_image=True)),
    configs=(WAN21, WAN22_5B, WAN21_I2V),
    denoiser_keys=("head.modulation", "patch_embedding.weight", "blocks.0.ffn.0.weight"),
    width_key="patch_embedding.weight", width_agrees=("text_embedding.0.weight", 0), sizes=sizes,
    text_widths=text_widths, vae="vae-wan",
    vae_hint="wan_2.1_vae.safetensors (Wan 2.2 5B: wan2.2_vae.safetensors)", out_key="head.head.weight",
    latent_packing=4, configs_for=configs_for,
    experts={WAN21.folder: WAN22_A14B, WAN22_I2V.folder: WAN22_I2V},
)
