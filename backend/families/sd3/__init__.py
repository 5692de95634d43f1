"""Stable Diffusion 3 and 3.5 (Stability AI): MMDiT; CLIP-L, CLIP-G and (optional) T5-XXL text encoders,
the 16-channel LDM VAE; CFG on a doubled batch."""

from __future__ import annotations

from collections.abc import Mapping

from .. import text_encoders
from ..base import Configs, ControlNets, Embeddings, ModelFamily, Pipeline, Shapes, TextSlot, count


def sizes(s: Shapes, published: dict, texts: Mapping[str, Shapes]) -> dict:
    hidden, _, patch, _ = s["x_embedder.proj.weight"]
    qk_norm = "joint_blocks.0.x_block.attn.ln_q.weight" in s
    head = s["joint_blocks.0.x_block.attn.ln_q.weight"][0] if qk_norm else 64  # without qk-norm, as ComfyUI
    return {"in_channels": s["x_embedder.proj.weight"][1], "patch_size": patch,
            "out_channels": s["final_layer.linear.weight"][0] // (patch * patch), "num_layers": count(s, "joint_blocks."),
            "attention_head_dim": head, "num_attention_heads": hidden // head,
            "joint_attention_dim": s["context_embedder.weight"][1],
            "caption_projection_dim": s["context_embedder.weight"][0],
            "pooled_projection_dim": s["y_embedder.mlp.0.weight"][1],
            "pos_embed_max_size": int(round(s["pos_embed"][1] ** 0.5)), "qk_norm": "rms_norm" if qk_norm else None,
            "dual_attention_layers": sorted(int(k.split(".")[1]) for k in s if k.endswith("x_block.attn2.qkv.weight"))}


def text_widths(s: Shapes, kinds: frozenset[str]) -> dict[str, int]:
    return {"t5": s["context_embedder.weight"][1]}


def clip_pair(s: Shapes, clip_l: Shapes, clip_g: Shapes) -> int | None:
    """The pooled projections of CLIP-L and CLIP-G together feed its pooled input."""
    wanted = s["y_embedder.mlp.0.weight"][1]
    return None if text_encoders.projection(clip_l) + text_encoders.projection(clip_g) == wanted else wanted


def controlnet_config(s: Shapes, denoiser: dict) -> dict:
    """An SD3/SD3.5 ControlNet file's config (diffusers' layout). SD3.5's own ControlNets have no position embedding
    of their own and take the pooled text (force_zeros_for_pooled_projection false, as diffusers' conversion of
    them says); the earlier SD3 ControlNets have one and take zeros there."""
    hidden, patch = s["pos_embed_input.proj.weight"][0], s["pos_embed_input.proj.weight"][2]
    qk = "transformer_blocks.0.attn.norm_q.weight" in s
    head = s["transformer_blocks.0.attn.norm_q.weight"][0] if qk else denoiser.get("attention_head_dim", 64)
    layers = count(s, "transformer_blocks.")
    in_channels = s["pos_embed.proj.weight"][1] if "pos_embed.proj.weight" in s else denoiser.get("in_channels", 16)
    positions = s.get("pos_embed.pos_embed")
    return {"sample_size": denoiser.get("sample_size", 128), "patch_size": patch, "in_channels": in_channels,
            "num_layers": layers, "attention_head_dim": head, "num_attention_heads": hidden // head,
            "joint_attention_dim": s["context_embedder.weight"][1] if "context_embedder.weight" in s else
            denoiser.get("joint_attention_dim", 4096),
            "caption_projection_dim": hidden, "pooled_projection_dim": s["time_text_embed.text_embedder.linear_1.weight"][1],
            "out_channels": denoiser.get("out_channels", 16),
            "pos_embed_max_size": round(positions[1] ** 0.5) if positions else denoiser.get("pos_embed_max_size", 96),
            "extra_conditioning_channels": s["pos_embed_input.proj.weight"][1] - in_channels,
            "dual_attention_layers": [i for i in range(layers) if f"transformer_blocks.{i}.attn2.to_q.weight" in s],
            "qk_norm": "rms_norm" if qk else None, "use_pos_embed": positions is not None,
            "pos_embed_type": "sincos" if positions is not None else None,
            "force_zeros_for_pooled_projection": positions is not None}


CONTROLNETS = ControlNets("SD3ControlNetModel", "SD3MultiControlNetModel", "StableDiffusion3ControlNetPipeline",
                          global_rng=True,
                          keys=("pos_embed_input.proj.weight", "controlnet_blocks.0.weight",
                                "time_text_embed.text_embedder.linear_1.weight"),
                          config=controlnet_config)


# ComfyUI's SD3 conditioning (comfy/text_encoders/sd3_clip.py): CLIP-L and CLIP-G penultimate states side by side,
# zero-padded to 4096, then T5-XXL's states (77 tokens at least) along the sequence; pooled = CLIP-L's and CLIP-G's
# pooled outputs (L's unprojected: the published SD3 CLIP-L's projection is the identity). diffusers' layout; its
# text path gives 77 + 256 tokens (T5 absent: zeros, as padding gives).
EMBEDDINGS = Embeddings("CLIP-L, CLIP-G and T5-XXL (TripleCLIPLoader; or DualCLIPLoader type sd3 without T5)",
                        lambda c: (c["joint_attention_dim"], c["pooled_projection_dim"]), length=77 + 256)

FAMILY = ModelFamily(
    id="sd3", order=30, tiny=("sd3",), name="SD3/SD3.5",
    pipelines=(Pipeline("StableDiffusion3Pipeline", "SD3", 2, "guidance_scale", False, repeated_blocks=False,
                        cfg_doubles_batch=True, cfg_passes="batch", img2img="StableDiffusion3Img2ImgPipeline",
                        inpaint="StableDiffusion3InpaintPipeline", controlnets=(CONTROLNETS,), embeddings=EMBEDDINGS),),
    configs=(Configs("sd3", (TextSlot("text_encoder", "clip-l"), TextSlot("text_encoder_2", "clip-g"),
                             TextSlot("text_encoder_3", "t5", optional=True))),),
    denoiser_keys=("joint_blocks.0.x_block.attn.qkv.weight", "x_embedder.proj.weight"),
    width_key="x_embedder.proj.weight", width_agrees=("context_embedder.weight", 0),
    sizes=sizes, text_widths=text_widths,
    vae="vae-ldm", vae_hint="SD3.5's VAE (or a checkpoint that holds one)",
    latent_packing=1, single_file=True, clip_pair=clip_pair,
)
