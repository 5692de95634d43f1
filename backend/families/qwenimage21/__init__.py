"""Qwen-Image 2.1 (Alibaba Qwen): one model that makes and edits images (several reference images, fed to its
Qwen3-VL-8B text encoder and, VAE-encoded, prepended to the image tokens), a single-stream block-causal transformer
with a KV cache, and a 16x RGBA VAE. diffusers 0.42.1: QwenImage21Pipeline (its Turbo checkpoint sets
`sample_sigmas` in model_index.json, which the pipeline runs when the call gives no sigmas).

How the pack runs it, as diffusers defines it:
- true CFG as two branches (`true_cfg_scale` above 1 with a negative prompt; cache contexts "cond" and "uncond"):
  Qwen-Image 2.1 is meant to run at 1 (its templates: cfg 1), where it runs one pass;
- its transformer has a tensor-parallel plan (Shard TP) and no context-parallel plan (Context Parallel refused);
- sizes are multiples of 32 (the VAE's 16x, then 2x2 groups of latent pixels);
- Sample's images are its references, every one (`image=` list), with every image it makes; the pipeline resizes
  each to `output_resolution`² pixels at its aspect, which it defaults to 1024;
- its images are RGBA: the worker keeps RGB for ComfyUI's IMAGE (`alpha`).

ComfyUI's files load. The diffusion model (qwen_image_2.1_*.safetensors: ComfyUI's own layout, `txt_in.text_norm`,
a fused `img_mlp.gate_up`; recognised by its keys before Qwen-Image's, which hold `txt_norm` instead) through
diffusers' single-file converter; Qwen3-VL-8B (qwen3vl_8b_*.safetensors, ComfyUI's names) as transformers'
Qwen3VLForConditionalGeneration; the VAE (qwen_image_2.1_vae_bf16.safetensors) through the family's own
converter (convert.py: diffusers has none for it). The configs are diffusers' class defaults (the published
model's) and Qwen3-VL-8B-Instruct's; the processor's image settings are Qwen3-VL's. A Turbo file
(qwen_image_2.1_turbo_*) holds the same tensors and loads with the same configs: Turbo's sigma grid (its diffusers
folder's `sample_sigmas`) is in no file.
Licence: Qwen Research License Agreement (non-commercial research and evaluation; commercial use needs a licence
from Qwen).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..base import Configs, ModelFamily, Pipeline, Shapes, TextSlot, count, scaled


def sizes(s: Shapes, published: dict, texts: Mapping[str, Shapes]) -> dict:
    """Widths and counts from ComfyUI's layout (its fused gate-and-up MLP, or diffusers' split one), the head size
    from the q-norm, the rotary axes scaled from the published ones."""
    hidden, head = s["img_in.weight"][0], s["transformer_blocks.0.attn.norm_q.weight"][0]
    mlp = (s["transformer_blocks.0.img_mlp.gate_up.weight"][0] // 2 if "transformer_blocks.0.img_mlp.gate_up.weight"
           in s else s["transformer_blocks.0.img_mlp.proj.weight"][0])
    return {"in_channels": s["img_in.weight"][1], "out_channels": s["proj_out.weight"][0],
            "num_layers": count(s, "transformer_blocks."), "attention_head_dim": head,
            "num_attention_heads": hidden // head, "context_in_dim": s["txt_in.text_norm.weight"][0],
            "mlp_ratio": mlp // hidden, "axes_dims_rope": scaled(published["axes_dims_rope"], head, even=True)}


def text_widths(s: Shapes, kinds: frozenset[str]) -> dict[str, int]:
    return {"qwen3vl": s["txt_in.text_norm.weight"][0]}


# diffusers 0.42.1's QwenImage21Rope.forward: `image_pad_mask.tolist()`, then Python loops over it
UNTRACEABLE = ("its rotary embedding reads the image mask into Python lists (QwenImage21Rope), which torch.compile "
               "cannot trace")

# TaylorSeer extrapolates each block's attention and feed-forward (its only two)
TAYLORSEER_MODULES = (r"transformer_blocks\.\d+\.(attn|img_mlp)",)
NO_CACHE = ("first block: diffusers' FirstBlockCache finds a model's blocks through its TransformerBlockRegistry, "
            "which has no entry for QwenImage21TransformerBlock; magcache: diffusers ships magnitude ratios for "
            "FLUX.1 only")

FAMILY = ModelFamily(
    id="qwenimage21", order=55, tiny=("qwenimage21",), name="Qwen-Image 2.1",
    pipelines=(Pipeline("QwenImage21Pipeline", "Qwen-Image 2.1", 2, "true_cfg_scale", True, cfg_passes="branches",
                        variable_text=True, references=True, sigmas="always", sigmas_arg=True, alpha=True,
                        comfy_encoder=("qwen_image", "TextEncodeQwenImage21"),
                        whole_denoiser_untraceable=UNTRACEABLE, padded_text_exact=False,
                        step_caches=("taylorseer",), taylorseer_modules=TAYLORSEER_MODULES, no_step_cache=NO_CACHE,
                        image_note="Qwen-Image 2.1 resizes each reference to about 1024x1024 pixels (its "
                                   "output_resolution) at its own aspect"),),
    configs=(Configs("qwenimage21", (TextSlot("text_encoder", "qwen3vl"),)),),
    denoiser_keys=("txt_in.text_norm.weight", "modulation.1.weight", "transformer_blocks.0.attn.norm_q.weight",
                   "img_in.weight", "proj_out.weight"),
    width_key="img_in.weight", width_agrees=("proj_out.weight", 1), sizes=sizes, text_widths=text_widths,
    vae="vae-qwenimage21", vae_hint="qwen_image_2.1_vae_bf16.safetensors", latent_packing=1,
)
