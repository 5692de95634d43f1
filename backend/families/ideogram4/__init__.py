"""Ideogram 4 (Ideogram): a conditional and an unconditional transformer, two models run at every step and blended
as `w·cond + (1 − w)·uncond`, reading 13 concatenated layer outputs of Qwen3-VL-8B, with FLUX.2's VAE, 2x2 patches.
diffusers 0.42.1: Ideogram4Pipeline (components `transformer` and `unconditional_transformer`).

How the pack runs it, as diffusers defines it:
- guidance: Sample's one guidance is `guidance_scale` with `guidance_schedule=None` (`call_args`). The pipeline
  takes either a constant scale or a per-step schedule of exactly num_inference_steps entries (its default is a
  48-entry schedule, so any other step count fails without one); a constant scale is what one guidance number
  means, and it broadcasts to the steps asked, whatever their number. ComfyUI's template lowers the guidance for
  the last 30 % of the steps (CFGOverride 3): one number cannot say that; the pack's guidance applies throughout;
- both models run at every step, whatever the guidance: "models" passes, which CFG Parallel does not split yet;
- no tensor- or context-parallel plan in diffusers (Shard TP and Context Parallel refused, naming the reason);
- the pipeline sets its own logit-normal sigmas (mu, std); sizes are multiples of 16; no negative prompt, no image.

ComfyUI's files (ideogram4_*.safetensors and ideogram4_unconditional_*: the same keys, told apart by name only;
fused `attention.qkv`) are recognised by `embed_image_indicator` and refused, naming the way that works (a
diffusers folder): diffusers has no single-file converter for them.
Licence: Ideogram Non-Commercial Model Agreement (commercial use needs a paid licence).
"""

from __future__ import annotations

from ..base import ModelFamily, Pipeline, unread

FILES_REFUSED = ("diffusers 0.42.1 has no single-file converter for Ideogram4Transformer2DModel, and its two files, "
                 "ideogram4_* and ideogram4_unconditional_*, hold the same keys, told apart by their names only")

FAMILY = ModelFamily(
    id="ideogram4", order=67, tiny=("ideogram4",), name="Ideogram 4",
    pipelines=(Pipeline("Ideogram4Pipeline", "Ideogram 4", 2, "guidance_scale", False, cfg_passes="models",
                        comfy_encoder=("ideogram4", "CLIPTextEncode"),
                        sigmas="always", call_args=(("guidance_schedule", None),),
                        unfit_samplers=("uni_pc", "uni_pc_bh2"),
                        no_image="diffusers' Ideogram4Pipeline makes images from text only",
                        no_step_cache="diffusers' Ideogram4Pipeline calls its two transformers without the cache "
                                      "contexts that diffusers' cache hooks keep their state by"),),
    configs=(),
    denoiser_keys=("embed_image_indicator.weight", "input_proj.weight", "llm_cond_proj.weight"),
    width_key="input_proj.weight", width_agrees=("llm_cond_proj.weight", 0), sizes=unread, text_widths=unread,
    vae="vae-flux2", vae_hint="flux2-vae.safetensors", files=False, files_refused=FILES_REFUSED,
)
