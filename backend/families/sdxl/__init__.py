"""Stable Diffusion XL (Stability AI) and its fine-tunes: a UNet in the LDM layout; CLIP-L and CLIP-G text
encoders, the 4-channel LDM VAE (sdxl_vae.safetensors); CFG on a doubled batch."""

from __future__ import annotations

from collections.abc import Mapping

from .. import text_encoders
from ..base import (
    Configs,
    ControlNets,
    Embeddings,
    ModelFamily,
    Pipeline,
    Shapes,
    TextSlot,
    count,
    groups,
    head_dim,
)


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


_UNMEASURED = ("flip_sin_to_cos", "freq_shift", "act_fn", "norm_eps", "addition_embed_type", "addition_time_embed_dim",
               "upcast_attention", "resnet_time_scale_shift", "downsample_padding", "mid_block_scale_factor")


def controlnet_config(s: Shapes, unet: dict) -> dict:
    """An SDXL ControlNet file's config (diffusers' layout, as diffusers/controlnet-*-sdxl-1.0 and xinsir publish
    them): sizes from its tensors, what no tensor holds from the pipeline's UNet config."""
    levels = count(s, "down_blocks.")
    channels = [s[f"down_blocks.{i}.resnets.0.conv1.weight"][0] for i in range(levels)]
    depth = [count(s, f"down_blocks.{i}.attentions.0.transformer_blocks.") for i in range(levels)]
    embedding = [s["controlnet_cond_embedding.conv_in.weight"][0]] + [
        s[f"controlnet_cond_embedding.blocks.{i}.weight"][0] for i in range(1, count(s, "controlnet_cond_embedding.blocks."), 2)]
    proj = next((s[k] for k in s if k.endswith("attentions.0.proj_in.weight")), (0, 0))
    same = list(channels) == list(unet.get("block_out_channels", ()))
    config = {k: unet[k] for k in _UNMEASURED if k in unet}
    config.update({
        "in_channels": s["conv_in.weight"][1], "conditioning_channels": s["controlnet_cond_embedding.conv_in.weight"][1],
        "block_out_channels": channels, "layers_per_block": count(s, "down_blocks.0.resnets."),
        "down_block_types": ["CrossAttnDownBlock2D" if d else "DownBlock2D" for d in depth],
        "transformer_layers_per_block": [max(d, 1) for d in depth],
        "attention_head_dim": unet["attention_head_dim"] if same else [c // head_dim(c, 64) for c in channels],
        "cross_attention_dim": s[_cross_attention_key(s)][1], "use_linear_projection": len(proj) == 2,
        "projection_class_embeddings_input_dim": s["add_embedding.linear_1.weight"][1],
        "conditioning_embedding_out_channels": embedding, "norm_num_groups": unet.get("norm_num_groups", groups(channels))})
    if "task_embedding" in s:  # the union kind
        config.update({"num_control_type": s["task_embedding"][0], "num_trans_channel": s["task_embedding"][1],
                       "num_trans_layer": count(s, "transformer_layes."),
                       "num_proj_channel": s["control_type_proj.linear_1.weight"][1] if "control_type_proj.linear_1.weight" in s
                       else s["task_embedding"][1]})
    else:
        config["mid_block_type"] = "UNetMidBlock2DCrossAttn" if "mid_block.attentions.0.proj_in.weight" in s else "UNetMidBlock2D"
    return config


_CONTROLNET_KEYS = ("controlnet_cond_embedding.conv_in.weight", "add_embedding.linear_1.weight", "conv_in.weight")
CONTROLNETS = ControlNets("ControlNetModel", "MultiControlNetModel", "StableDiffusionXLControlNetPipeline",
                          img2img="StableDiffusionXLControlNetImg2ImgPipeline",
                          inpaint="StableDiffusionXLControlNetInpaintPipeline", image_arg="image",
                          keys=_CONTROLNET_KEYS, absent_keys=("task_embedding",), config=controlnet_config)
# xinsir's union ControlNets (ComfyUI's SetUnionControlNetType names these)
UNION_MODES = ("openpose", "depth", "hed/pidi/scribble/ted", "canny/lineart/anime_lineart/mlsd", "normal", "segment",
               "tile", "repaint")
UNION = ControlNets("ControlNetUnionModel", "MultiControlNetUnionModel", "StableDiffusionXLControlNetUnionPipeline",
                    img2img="StableDiffusionXLControlNetUnionImg2ImgPipeline",
                    inpaint="StableDiffusionXLControlNetUnionInpaintPipeline", modes=UNION_MODES, mode_lists=True,
                    keys=(*_CONTROLNET_KEYS, "task_embedding"), config=controlnet_config)


def embedding_widths(unet: dict) -> tuple[int, int]:
    """Cross-attention width (CLIP-L + CLIP-G), and CLIP-G's projection (the added embedding's input less the six
    size and crop numbers)."""
    return unet["cross_attention_dim"], unet["projection_class_embeddings_input_dim"] - 6 * unet["addition_time_embed_dim"]


# ComfyUI's SDXL conditioning (comfy/sdxl_clip.py): CLIP-L's and CLIP-G's penultimate states side by side (L first),
# 77 tokens per chunk of 75; pooled = CLIP-G's projected pooled output: diffusers' layout.
EMBEDDINGS = Embeddings("CLIP-L and CLIP-G (the checkpoint's CLIP, or DualCLIPLoader type sdxl)", embedding_widths,
                        length=77, chunks=4)

FAMILY = ModelFamily(
    id="sdxl", order=40, tiny=("sdxl",), name="SDXL",
    pipelines=(Pipeline("StableDiffusionXLPipeline", "SDXL", 1, "guidance_scale", False, cfg_doubles_batch=True,
                        cfg_passes="batch", img2img="StableDiffusionXLImg2ImgPipeline",
                        inpaint="StableDiffusionXLInpaintPipeline", seeded_steps=True, strength_floor=True,
                        controlnets=(CONTROLNETS, UNION), embeddings=EMBEDDINGS),),
    configs=(Configs("sdxl", (TextSlot("text_encoder", "clip-l"), TextSlot("text_encoder_2", "clip-g"))),),
    denoiser_keys=("input_blocks.0.0.weight", "label_emb.0.0.weight", "middle_block.1.proj_in.weight"),
    width_key="input_blocks.0.0.weight", width_agrees=("time_embed.0.weight", 1),
    sizes=sizes, text_widths=text_widths,
    vae="vae-ldm", vae_hint="sdxl_vae.safetensors", denoiser="unet",
    latent_packing=1, single_file=True, clip_pair=clip_pair,
)
