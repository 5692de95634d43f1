"""Stable Diffusion XL (Stability AI) and its fine-tunes: a UNet in the LDM layout; CLIP-L and CLIP-G text
encoders, the 4-channel LDM VAE (sdxl_vae.safetensors); CFG on a doubled batch."""

from __future__ import annotations

from collections.abc import Mapping

from . import text_encoders
from .base import Configs, Embeddings, ModelFamily, Pipeline, Shapes, TextSlot, count, groups, head_dim


def _cross_attention_key(s: Shapes) -> str:
    return next(k for k in s if k.endswith("attn2.to_k.weight"))


def sizes(s: Shapes, published: dict, texts: Mapping[str, Shapes]) -> dict:
    """The UNet's layout from the LDM keys (input_blocks: resnets, attention and downsamplers in order)."""
    levels: list[list[tuple[int, int]]] = [[]]  # per level: (channels, attention depth) of each resnet
    i = 1
    while f"input_blocks.{i}.0.op.weight" in s or f"input_blocks.{i}.0.out_layers.3.weight" in s:
        if f"input_blocks.{i}.0.op.weight" in s:
            levels.append([])
        else:
            levels[-1].append((s[f"input_blocks.{i}.0.out_layers.3.weight"][0],
                               count(s, f"input_blocks.{i}.1.transformer_blocks.")))
        i += 1
    channels = [lvl[0][0] for lvl in levels]
    depth = [lvl[0][1] for lvl in levels]
    adm = s["label_emb.0.0.weight"][1]
    time_dim = published["addition_time_embed_dim"]
    pooled_width = text_encoders.projection(texts["clip-g"]) if "clip-g" in texts else None
    if pooled_width and (adm - pooled_width) % 6 == 0:
        time_dim = (adm - pooled_width) // 6
    down = ["CrossAttnDownBlock2D" if d else "DownBlock2D" for d in depth]
    return {"in_channels": s["input_blocks.0.0.weight"][1], "out_channels": s["out.2.weight"][0],
            "block_out_channels": channels, "layers_per_block": len(levels[0]),
            "transformer_layers_per_block": [max(d, 1) for d in depth],
            "down_block_types": down,
            "up_block_types": [t.replace("Down", "Up") for t in reversed(down)],
            "attention_head_dim": [c // head_dim(c, 64) for c in channels],
            "cross_attention_dim": s[_cross_attention_key(s)][1], "projection_class_embeddings_input_dim": adm,
            "addition_time_embed_dim": time_dim, "norm_num_groups": groups(channels),
            "use_linear_projection": len(s["middle_block.1.proj_in.weight"]) == 2}


def text_widths(s: Shapes, kinds: frozenset[str]) -> dict[str, int]:
    return {}  # the CLIP pair is checked together (clip_pair)


def clip_pair(s: Shapes, clip_l: Shapes, clip_g: Shapes) -> int | None:
    """Its cross-attention reads CLIP-L's and CLIP-G's hidden states side by side."""
    wanted = s[_cross_attention_key(s)][1]
    return None if text_encoders.width(clip_l) + text_encoders.width(clip_g) == wanted else wanted


def embedding_widths(unet: dict) -> tuple[int, int]:
    """Cross-attention width (CLIP-L + CLIP-G), and CLIP-G's projection (the added embedding's input less the six
    size and crop numbers)."""
    return unet["cross_attention_dim"], unet["projection_class_embeddings_input_dim"] - 6 * unet["addition_time_embed_dim"]


# ComfyUI's SDXL conditioning (comfy/sdxl_clip.py): CLIP-L's and CLIP-G's penultimate states side by side (L first),
# 77 tokens per chunk of 75; pooled = CLIP-G's projected pooled output: diffusers' layout.
EMBEDDINGS = Embeddings("CLIP-L and CLIP-G (the checkpoint's CLIP, or DualCLIPLoader type sdxl)", embedding_widths,
                        length=77, chunks=4)

FAMILY = ModelFamily(
    id="sdxl", name="SDXL",
    pipelines=(Pipeline("StableDiffusionXLPipeline", "SDXL", 1, "guidance_scale", False, cfg_doubles_batch=True,
                        cfg_passes="batch", img2img="StableDiffusionXLImg2ImgPipeline",
                        inpaint="StableDiffusionXLInpaintPipeline", seeded_steps=True, embeddings=EMBEDDINGS),),
    configs=(Configs("sdxl", (TextSlot("text_encoder", "clip-l"), TextSlot("text_encoder_2", "clip-g"))),),
    denoiser_keys=("input_blocks.0.0.weight", "label_emb.0.0.weight", "middle_block.1.proj_in.weight"),
    width_key="input_blocks.0.0.weight", width_agrees=("time_embed.0.weight", 1),
    sizes=sizes, text_widths=text_widths,
    vae="vae-ldm", vae_hint="sdxl_vae.safetensors", denoiser="unet",
    latent_packing=1, single_file=True, lora_formats=("comfyui-sdxl",), clip_pair=clip_pair,
)
