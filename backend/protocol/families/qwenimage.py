"""Qwen-Image (Alibaba Qwen) and Qwen-Image-Edit (2509 and later: Edit Plus, several input images): an MMDiT
with the Qwen2.5-VL text encoder and Wan 2.1's VAE; true CFG as two branches; the text length follows the
prompt.

The newer releases, as diffusers 0.42.1 and ComfyUI 0.3.75 show them: Qwen-Image-2512 is Qwen-Image's pipeline and
transformer with new weights (its files load as Qwen-Image). Edit-2509 and Edit-2511 run QwenImageEditPlusPipeline
over the same transformer tensors; diffusers' transformer has a `zero_cond_t` flag (the reference images' tokens
modulated at timestep 0), a config value with no tensor of its own, which Edit-2511 is published with (not
checked against the Hub here). From diffusers folders they load as their model_index and configs say
(tests/test_images.py). ComfyUI's files of them hold nothing that tells an edit model (or 2511) from Qwen-Image, so
from files the pack builds QwenImagePipeline; the Edit pipelines would also need Qwen2-VL's image processor, which
the pack does not ship. ComfyUI 0.3.75 itself has no zero_cond_t."""

from __future__ import annotations

from collections.abc import Mapping

from .base import Configs, ControlNets, ModelFamily, Pipeline, Shapes, TextSlot, count, scaled


def sizes(s: Shapes, published: dict, texts: Mapping[str, Shapes]) -> dict:
    hidden, head = s["img_in.weight"][0], s["transformer_blocks.0.attn.norm_q.weight"][0]
    patch = published["patch_size"]
    return {"in_channels": s["img_in.weight"][1], "out_channels": s["proj_out.weight"][0] // (patch * patch),
            "num_layers": count(s, "transformer_blocks."), "attention_head_dim": head,
            "num_attention_heads": hidden // head, "joint_attention_dim": s["txt_norm.weight"][0],
            "guidance_embeds": any(k.startswith("time_text_embed.guidance_embedder.") for k in s),
            "axes_dims_rope": scaled(published["axes_dims_rope"], head, even=True)}


def text_widths(s: Shapes, kinds: frozenset[str]) -> dict[str, int]:
    return {"qwen25vl": s["txt_norm.weight"][0]}


def denoiser_layout(s: Shapes, prefix: str, quant: str, file_name: str) -> str:
    return "diffusers" if prefix == "" and quant == "" else "qwenimage"  # ComfyUI's files hold diffusers' keys


def _pipeline(class_name: str, name: str, **traits) -> Pipeline:
    """The Qwen-Image transformer: true CFG as two branches, its own context-parallel plan, prompt-long text."""
    return Pipeline(class_name, name, 2, "true_cfg_scale", True, cfg_passes="branches", cp_plan=True,
                    variable_text=True, sigmas="always", **traits)


def controlnet_config(s: Shapes, denoiser: dict) -> dict:
    """A Qwen-Image ControlNet file's config (InstantX's union: diffusers' layout); patch and rotary axes as the
    pipeline's transformer."""
    hidden, head = s["img_in.weight"][0], s["transformer_blocks.0.attn.norm_q.weight"][0]
    return {"patch_size": denoiser.get("patch_size", 2), "in_channels": s["img_in.weight"][1],
            "out_channels": denoiser.get("out_channels", 16), "num_layers": count(s, "transformer_blocks."),
            "attention_head_dim": head, "num_attention_heads": hidden // head,
            "joint_attention_dim": s["txt_norm.weight"][0],
            "axes_dims_rope": denoiser.get("axes_dims_rope", [16, 56, 56]),
            "extra_condition_channels": s["controlnet_x_embedder.weight"][1] - s["img_in.weight"][1]}


CONTROLNETS = ControlNets("QwenImageControlNetModel", "QwenImageMultiControlNetModel", "QwenImageControlNetPipeline",
                          keys=("controlnet_x_embedder.weight", "img_in.weight", "txt_norm.weight",
                                "controlnet_blocks.0.weight"),
                          config=controlnet_config)

_EDIT = dict(references=True, inpaint="QwenImageEditInpaintPipeline", needs_image=True)
FAMILY = ModelFamily(
    id="qwenimage", name="Qwen-Image",
    pipelines=(
        _pipeline("QwenImagePipeline", "Qwen-Image", img2img="QwenImageImg2ImgPipeline",
                  inpaint="QwenImageInpaintPipeline", step_caches=("first block", "taylorseer"),
                  controlnets=(CONTROLNETS,)),
        _pipeline("QwenImageEditPipeline", "Qwen-Image-Edit", **_EDIT),
        _pipeline("QwenImageEditPlusPipeline", "Qwen-Image-Edit", **_EDIT),
    ),
    configs=(Configs("qwenimage", (TextSlot("text_encoder", "qwen25vl"),)),),
    denoiser_keys=("transformer_blocks.0.img_mod.1.weight", "txt_norm.weight", "img_in.weight"),
    width_key="img_in.weight", width_agrees=("txt_in.weight", 0), sizes=sizes, text_widths=text_widths,
    vae="vae-wan", vae_hint="qwen_image_vae.safetensors", denoiser_layout=denoiser_layout,
)
