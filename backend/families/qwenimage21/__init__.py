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

ComfyUI's files (qwen_image_2.1_*.safetensors: ComfyUI's own layout, `txt_in.text_norm`, a fused
`img_mlp.gate_up`) are recognised by their keys before Qwen-Image's (which hold `txt_norm` instead) and refused,
naming the way that works: loading them is not written yet (diffusers' single-file converter reads the
transformer; the RGBA VAE and the Qwen3-VL encoder files need conversions of their own).
Licence: Qwen Research License Agreement (non-commercial research and evaluation; commercial use needs a licence
from Qwen).
"""

from __future__ import annotations

from ..base import ModelFamily, Pipeline, unread

FAMILY = ModelFamily(
    id="qwenimage21", order=55, tiny=("qwenimage21",), name="Qwen-Image 2.1",
    pipelines=(Pipeline("QwenImage21Pipeline", "Qwen-Image 2.1", 2, "true_cfg_scale", True, cfg_passes="branches",
                        variable_text=True, references=True, sigmas="always", sigmas_arg=True, alpha=True,
                        comfy_encoder=("qwen_image", "TextEncodeQwenImage21"),
                        image_note="Qwen-Image 2.1 resizes each reference to about 1024x1024 pixels (its "
                                   "output_resolution) at its own aspect"),),
    configs=(),
    denoiser_keys=("txt_in.text_norm.weight", "modulation.1.weight", "transformer_blocks.0.attn.norm_q.weight",
                   "img_in.weight", "proj_out.weight"),
    width_key="img_in.weight", width_agrees=("proj_out.weight", 1), sizes=unread, text_widths=unread,
    vae="vae-wan", vae_hint="qwen_image_2.1_vae_bf16.safetensors", latent_packing=1, files=False,
)
