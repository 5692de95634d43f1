"""Wan 2.1 / 2.2 (Alibaba Wan): video. A DiT over (frames, height, width) patches with the UMT5-XXL text encoder
and Wan's causal 3D VAE (8x spatial, 4x temporal: a video has 1 + 4k frames); CFG as two branches ("cond",
"uncond"); diffusers ships a context-parallel plan for its transformer but no tensor-parallel one.

Image to video (WanImageToVideoPipeline) encodes the start image with the VAE as the video's first frame and
hands the denoiser its latents and a mask next to the noise; Wan 2.1's also conditions every block on the image
through a CLIP vision encoder (clip_vision_h: `image_encoder` and `image_processor`), Wan 2.2's has none."""

from __future__ import annotations

from collections.abc import Mapping

from .base import Configs, ModelFamily, Pipeline, Shapes, TextSlot, count, head_dim


def sizes(s: Shapes, published: dict, texts: Mapping[str, Shapes]) -> dict:
    """ComfyUI's (Wan's own) key layout: dim from the patch embedding, heads of 128 as ComfyUI assumes."""
    dim = s["patch_embedding.weight"][0]
    head = head_dim(dim, published["attention_head_dim"])
    return {"in_channels": s["patch_embedding.weight"][1], "out_channels": s["head.head.weight"][0] // 4,
            "num_layers": count(s, "blocks."), "attention_head_dim": head, "num_attention_heads": dim // head,
            "ffn_dim": s["blocks.0.ffn.0.weight"][0], "text_dim": s["text_embedding.0.weight"][1]}


def text_widths(s: Shapes, kinds: frozenset[str]) -> dict[str, int]:
    return {"umt5": s["text_embedding.0.weight"][1]}


_VIDEO = dict(cfg_passes="branches", cp_plan=True, frame_step=4)

FAMILY = ModelFamily(
    id="wan", name="Wan",
    pipelines=(Pipeline("WanPipeline", "Wan", 2, "guidance_scale", False, **_VIDEO),
               Pipeline("WanImageToVideoPipeline", "Wan", 2, "guidance_scale", False, **_VIDEO, start_image=True,
                        needs_image=True)),
    configs=(Configs("wan21-t2v-1.3b", (TextSlot("text_encoder", "umt5"),)),),
    denoiser_keys=("head.modulation", "patch_embedding.weight", "blocks.0.ffn.0.weight"),
    width_key="patch_embedding.weight", width_agrees=("text_embedding.0.weight", 0), sizes=sizes,
    text_widths=text_widths, vae="vae-wan", vae_hint="wan_2.1_vae.safetensors", latent_packing=1, files=False,
)
