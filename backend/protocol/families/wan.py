"""Wan 2.1 / 2.2 (Alibaba Wan): video. A DiT over (frames, height, width) patches with the UMT5-XXL text encoder
and Wan's causal 3D VAE (8x spatial, 4x temporal: a video has 1 + 4k frames); CFG as two branches ("cond",
"uncond"); diffusers ships a context-parallel plan for its transformer but no tensor-parallel one.

Image to video (WanImageToVideoPipeline) encodes the start image with the VAE as the video's first frame and
hands the denoiser its latents and a mask next to the noise; Wan 2.1's also conditions every block on the image
through a CLIP vision encoder (clip_vision_h: `image_encoder` and `image_processor`), Wan 2.2's has none.

The published text-to-video models, as ComfyUI's files hold them (all in Wan's own key layout, which diffusers'
single-file converter reads): Wan 2.1 (1.3B and 14B: one config, the sizes read from the file), Wan 2.2 TI2V 5B
(48 latent channels: Wan 2.2's own VAE, 16x spatial) and Wan 2.2 A14B, two 14B experts of Wan 2.1's shape (the
high-noise one runs the steps above boundary_ratio of the schedule, the low-noise one the rest: diffusers'
`transformer` and `transformer_2`), chosen as two diffusion models.
"""

from __future__ import annotations

from collections.abc import Mapping

from .base import Configs, ModelFamily, Pipeline, Shapes, TextSlot, count, head_dim

TEXT = (TextSlot("text_encoder", "umt5"),)
WAN21 = Configs("wan21-t2v-1.3b", TEXT, "Wan 2.1")
WAN22_5B = Configs("wan22-ti2v-5b", TEXT, "Wan 2.2 TI2V 5B", "wan2.2_vae.safetensors")
WAN22_A14B = Configs("wan22-t2v-a14b", TEXT, "Wan 2.2 A14B")
WAN22_LATENTS = 48  # Wan 2.2 5B's VAE; Wan 2.1's (and A14B's) has 16


def sizes(s: Shapes, published: dict, texts: Mapping[str, Shapes]) -> dict:
    """ComfyUI's (Wan's own) key layout: dim from the patch embedding, heads of 128 as ComfyUI assumes."""
    dim = s["patch_embedding.weight"][0]
    head = head_dim(dim, published["attention_head_dim"])
    return {"in_channels": s["patch_embedding.weight"][1], "out_channels": s["head.head.weight"][0] // 4,
            "num_layers": count(s, "blocks."), "attention_head_dim": head, "num_attention_heads": dim // head,
            "ffn_dim": s["blocks.0.ffn.0.weight"][0], "text_dim": s["text_embedding.0.weight"][1],
            "freq_dim": s["time_embedding.0.weight"][1]}


def text_widths(s: Shapes, kinds: frozenset[str]) -> dict[str, int]:
    return {"umt5": s["text_embedding.0.weight"][1]}


def configs_for(s: Shapes, kinds: frozenset[str]) -> Configs:
    """Wan 2.2 5B by its 48 latent channels; every other one diffusion model is Wan 2.1 text to video."""
    return WAN22_5B if s["patch_embedding.weight"][1] == WAN22_LATENTS else WAN21


# Step caches, on each expert of a pair: diffusers' first block cache knows Wan's blocks; TaylorSeer extrapolates
# each block's self-attention, cross-attention and feed-forward (its default names match no Wan module: it would do
# nothing). Not MagCache: diffusers 0.42 ships magnitude ratios for FLUX.1 only (each Wan expert needs its own).
TAYLORSEER_MODULES = (r"blocks\.\d+\.(attn1|attn2|ffn)",)
_VIDEO = dict(cfg_passes="branches", cp_plan=True, frame_step=4, step_caches=("first block", "taylorseer"),
              taylorseer_modules=TAYLORSEER_MODULES)

FAMILY = ModelFamily(
    id="wan", name="Wan",
    pipelines=(Pipeline("WanPipeline", "Wan", 2, "guidance_scale", False, **_VIDEO),
               Pipeline("WanImageToVideoPipeline", "Wan", 2, "guidance_scale", False, **_VIDEO, start_image=True,
                        needs_image=True)),
    configs=(WAN21, WAN22_5B),
    denoiser_keys=("head.modulation", "patch_embedding.weight", "blocks.0.ffn.0.weight"),
    width_key="patch_embedding.weight", width_agrees=("text_embedding.0.weight", 0), sizes=sizes,
    text_widths=text_widths, vae="vae-wan",
    vae_hint="wan_2.1_vae.safetensors (Wan 2.2 5B: wan2.2_vae.safetensors)", latent_packing=1,
    configs_for=configs_for, experts=WAN22_A14B,
)
