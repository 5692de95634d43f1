"""Krea 2 (Krea): a single-stream transformer (grouped-query attention, a text-fusion stage over 12 stacked hidden
states of Qwen3-VL-4B) with Qwen-Image's VAE, 2x2 patches. diffusers 0.42.1: Krea2Pipeline; Turbo is the same
pipeline with `is_distilled` in model_index.json (a fixed timestep shift), used at guidance 0 and 8 steps.

How the pack runs it, as diffusers defines it:
- guidance is diffusers' Krea convention, `cond + g·(cond − uncond)` (CFG at ComfyUI's cfg 1 + g), on for any
  guidance above 0, as two transformer calls a step that the pipeline does not name (CFG Parallel tells them apart
  by their order); Turbo at guidance 0 runs one pass. `is_distilled` only fixes the shift: a Turbo model given
  guidance still runs two passes, so it marks nothing distilled here;
- no tensor- or context-parallel plan in diffusers (Shard TP and Context Parallel refused, naming the reason);
- sizes are multiples of 16; the text has a fixed length (the pipeline's prompt template, 512 tokens).

Style reference (ComfyUI's image_krea2_turbo_*_image_style_reference template) is not in diffusers: the pipeline
takes no image, its transformer no reference tokens (ComfyUI adds them with TextEncodeQwenImageEditPlus and
FluxKontextMultiReferenceLatentMethod beside the krea2_style_reference LoRA). So Sample's image is refused, naming
that. Style LoRAs (krea2_darkbrush) load through diffusers' Krea2LoraLoaderMixin.

ComfyUI's files (krea2_turbo_*.safetensors: its own layout, `txtfusion.`, `blocks.N.attn.wq`) are recognised by
their keys and refused, naming the way that works (a diffusers folder): loading them is not written yet.
Licence: Krea 2 community licence (free for individuals and small businesses; companies over 50 employees need an
enterprise licence).
"""

from __future__ import annotations

from ..base import ModelFamily, Pipeline, unread

NO_STYLE_REFERENCE = ("diffusers' Krea2Pipeline has no reference images (ComfyUI's Krea 2 style reference adds "
                      "reference tokens to the transformer, which diffusers does not have); use a style LoRA "
                      "(Load LoRA) instead, or run the style-reference template in ComfyUI itself")

FAMILY = ModelFamily(
    id="krea2", order=65, tiny=("krea2",), name="Krea 2",
    pipelines=(Pipeline("Krea2Pipeline", "Krea 2", 2, "guidance_scale", False, cfg_passes="branches",
                        unnamed_branches=True, cfg_above=0.0, comfy_encoder=("krea2", "CLIPTextEncode"),
                        sigmas="always", sigmas_arg=True,
                        no_image=NO_STYLE_REFERENCE),),
    configs=(),
    denoiser_keys=("txtfusion.projector.weight", "first.weight", "blocks.0.attn.wq.weight"),
    width_key="first.weight", width_agrees=("blocks.0.attn.wq.weight", 1), sizes=unread, text_widths=unread,
    vae="vae-wan", vae_hint="qwen_image_vae.safetensors", files=False,
)
