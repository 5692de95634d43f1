"""Qwen-Image (Alibaba Qwen) and Qwen-Image-Edit (2509 and later: Edit Plus, several input images): an MMDiT
with the Qwen2.5-VL text encoder and Wan 2.1's VAE; true CFG as two branches; the text length follows the
prompt.

The releases, as diffusers 0.42.1 runs them and Comfy-Org publishes their files (one layout: diffusers' own keys):
- Qwen-Image-2512 is Qwen-Image with new weights: QwenImagePipeline, the same configs.
- Qwen-Image-Edit (the first one) runs QwenImageEditPipeline; Edit-2509 and Edit-2511 run
  QwenImageEditPlusPipeline; all over the same transformer tensors, and the edit pipelines also need Qwen2-VL's
  processor (its image settings: backend/configs/qwenimage/processor, Qwen2.5-VL-7B-Instruct's, which the edit
  releases ship; the vocabulary is ComfyUI's bundled Qwen tokenizer).
- Edit-2511 sets diffusers' `zero_cond_t` (the reference images' tokens modulated at timestep 0), a config value
  with no weights of its own; Comfy-Org's 2511 files carry an empty `__index_timestep_zero__` tensor for it
  (newer ComfyUI reads it as its "index_timestep_zero" reference method; 0.3.75 ignores it).
So a file tells 2511 by that tensor (or by "2511" in its name, for files of other converters that drop it); nothing else in the files tells an edit model from Qwen-Image, and the
file name does, as ComfyUI's templates name them (qwen_image_edit_2509_fp8_e4m3fn.safetensors,
qwen_image_edit_2511_bf16.safetensors): "edit" in the name makes an edit pipeline, "edit" followed by a release
number (2509, 2511, ...) Edit Plus. ComfyUI itself keeps edit-ness in the workflow (its TextEncodeQwenImageEdit
nodes), where the pack's Sample already takes the images: the name is what the artist's download already says,
and a renamed file is one rename from loading as what it is (the loader's notes say which pipeline a file
made and why). From diffusers folders they load as their model_index and configs say (tests/test_images.py).

Qwen-Image-Layered (an image split into RGBA layers: diffusers' QwenImageLayeredPipeline) has the same tensors
plus `time_text_embed.addition_t_embedding` (diffusers' `use_additional_t_cond`): its file is refused by name, as
Sample returns images, not layers; without the refusal it would load as Qwen-Image with that tensor ignored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..base import Configs, ControlNets, ModelFamily, Pipeline, Shapes, TextSlot, count, scaled

ZERO_COND_MARKER = "__index_timestep_zero__"  # Comfy-Org's Edit-2511 files: an empty tensor, diffusers' zero_cond_t
LAYERED_MARKER = "time_text_embed.addition_t_embedding."  # Qwen-Image-Layered's layer/image embedding
_RELEASE = re.compile(r"edit[^a-z0-9]?(\d{4})")  # "edit_2509", "edit-2511": an Edit Plus release


def sizes(s: Shapes, published: dict, texts: Mapping[str, Shapes]) -> dict:
    hidden, head = s["img_in.weight"][0], s["transformer_blocks.0.attn.norm_q.weight"][0]
    patch = published["patch_size"]
    return {"in_channels": s["img_in.weight"][1], "out_channels": s["proj_out.weight"][0] // (patch * patch),
            "num_layers": count(s, "transformer_blocks."), "attention_head_dim": head,
            "num_attention_heads": hidden // head, "joint_attention_dim": s["txt_norm.weight"][0],
            "guidance_embeds": any(k.startswith("time_text_embed.guidance_embedder.") for k in s),
            "axes_dims_rope": scaled(published["axes_dims_rope"], head, even=True),
            "zero_cond_t": ZERO_COND_MARKER in s, "use_additional_t_cond": any(k.startswith(LAYERED_MARKER) for k in s)}


def text_widths(s: Shapes, kinds: frozenset[str]) -> dict[str, int]:
    return {"qwen25vl": s["txt_norm.weight"][0]}


def denoiser_layout(s: Shapes, prefix: str, quant: str, file_name: str) -> str:
    return "diffusers" if prefix == "" and quant == "" else "qwenimage"  # ComfyUI's files hold diffusers' keys


def variant(sizes: dict, file_name: str, configs: Configs,
            kontext: str = "auto") -> tuple[dict[str, dict], tuple[str, ...]]:
    """The edit pipelines by the 2511 marker or the file name (the module docstring says why), with their
    processor; a note says which pipeline the file made and why."""
    if sizes["use_additional_t_cond"]:
        from ...protocol.errors import ModelError

        raise ModelError(f"diffusion_model: '{file_name}' is Qwen-Image-Layered (its {LAYERED_MARKER}* tensors), "
                         "which ComfyUI-TPU does not run: it splits an image into RGBA layers (diffusers' "
                         "QwenImageLayeredPipeline), and Sample returns images. Choose a Qwen-Image (2512 included) or "
                         "Qwen-Image-Edit (2509, 2511) file.")
    name = file_name.lower()
    release = _RELEASE.search(name)
    if sizes["zero_cond_t"]:
        pipeline, why = "QwenImageEditPlusPipeline", f"Qwen-Image-Edit-2511 (the file's {ZERO_COND_MARKER} tensor)"
    elif release:  # a 2511 file without the marker (another converter's) still is 2511
        pipeline, why = "QwenImageEditPlusPipeline", f"Qwen-Image-Edit-{release.group(1)} (its file name)"
        if release.group(1) == "2511":
            return ({"": {"_class_name": pipeline, "processor": ["transformers", "Qwen2VLProcessor"]},
                     "transformer": {"zero_cond_t": True}},
                    (f"read as {why}, zero_cond_t on: {pipeline}, the input images are its references",))
    elif "edit" in name:
        pipeline, why = "QwenImageEditPipeline", "Qwen-Image-Edit (its file name)"
    else:
        return {}, ("read as Qwen-Image (text to image): an edit model's file name says 'edit' "
                    "(qwen_image_edit_2509_...), as ComfyUI's templates name them",)
    return ({"": {"_class_name": pipeline, "processor": ["transformers", "Qwen2VLProcessor"]}},
            (f"read as {why}: {pipeline}, the input images are its references",))


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

# TaylorSeer extrapolates each block's attention and both feed-forward outputs (the features the TaylorSeer paper
# caches), not the attention alone (diffusers' default): in Qwen-Image at 1024² the feed-forwards are about half of a
# block's work (54 %), which the default would compute at every step (bench/README.md)
TAYLORSEER_MODULES = (r"transformer_blocks\.\d+\.(attn|img_mlp|txt_mlp)",)
_EDIT = dict(references=True, inpaint="QwenImageEditInpaintPipeline", needs_image=True)
FAMILY = ModelFamily(
    id="qwenimage", order=50, tiny=("qwenimage",), name="Qwen-Image",
    pipelines=(
        _pipeline("QwenImagePipeline", "Qwen-Image", img2img="QwenImageImg2ImgPipeline",
                  inpaint="QwenImageInpaintPipeline", step_caches=("first block", "taylorseer"),
                  taylorseer_modules=TAYLORSEER_MODULES, controlnets=(CONTROLNETS,)),
        _pipeline("QwenImageEditPipeline", "Qwen-Image-Edit", **_EDIT, reference_mode="one"),
        _pipeline("QwenImageEditPlusPipeline", "Qwen-Image-Edit", **_EDIT),
    ),
    configs=(Configs("qwenimage", (TextSlot("text_encoder", "qwen25vl"),)),),
    denoiser_keys=("transformer_blocks.0.img_mod.1.weight", "txt_norm.weight", "img_in.weight"),
    width_key="img_in.weight", width_agrees=("txt_in.weight", 0), sizes=sizes, text_widths=text_widths,
    vae="vae-wan", vae_hint="qwen_image_vae.safetensors", denoiser_layout=denoiser_layout,
    variant=variant,
)
