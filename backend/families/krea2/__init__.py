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

ComfyUI's files load: the diffusion model (krea2_turbo_*.safetensors: its own layout, `txtfusion.`,
`blocks.N.attn.wq`) through diffusers' single-file converter, Qwen3-VL-4B (qwen3vl_4b_*.safetensors, ComfyUI's
names) as transformers' Qwen3VLModel, and Qwen-Image's VAE (qwen_image_vae.safetensors). Raw and Turbo files hold
the same tensors: "turbo" in the file name sets `is_distilled` (Turbo's fixed shift), as ComfyUI's templates name
them. The configs are Krea 2's (diffusers' Krea2Transformer2DModel defaults) and Qwen3-VL-4B-Instruct's.
Licence: Krea 2 community licence (free for individuals and small businesses; companies over 50 employees need an
enterprise licence).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..base import Configs, ModelFamily, Pipeline, Shapes, TextSlot, count, scaled


def sizes(s: Shapes, published: dict, texts: Mapping[str, Shapes]) -> dict:
    """Widths and counts from ComfyUI's layout; head sizes from the q-norms, rotary axes scaled from the
    published ones."""
    hidden, head = s["first.weight"][0], s["blocks.0.attn.qknorm.qnorm.scale"][0]
    text, text_head = (s["txtfusion.layerwise_blocks.0.prenorm.scale"][0],
                       s["txtfusion.layerwise_blocks.0.attn.qknorm.qnorm.scale"][0])
    return {"in_channels": s["first.weight"][1], "num_layers": count(s, "blocks."), "attention_head_dim": head,
            "num_attention_heads": hidden // head, "num_key_value_heads": s["blocks.0.attn.wk.weight"][0] // head,
            "intermediate_size": s["blocks.0.mlp.gate.weight"][0], "timestep_embed_dim": s["tmlp.0.weight"][1],
            "text_hidden_dim": text, "num_text_layers": s["txtfusion.projector.weight"][1],
            "text_num_attention_heads": text // text_head,
            "text_num_key_value_heads": s["txtfusion.layerwise_blocks.0.attn.wk.weight"][0] // text_head,
            "text_intermediate_size": s["txtfusion.layerwise_blocks.0.mlp.gate.weight"][0],
            "num_layerwise_text_blocks": count(s, "txtfusion.layerwise_blocks."),
            "num_refiner_text_blocks": count(s, "txtfusion.refiner_blocks."),
            "axes_dims_rope": scaled(published["axes_dims_rope"], head, even=True)}


# Krea2Pipeline stacks the Qwen3-VL hidden states of its text_encoder_select_layers (2, 5, ..., 35: model_index)
TEXT_LAYERS = 35


def text_widths(s: Shapes, kinds: frozenset[str]) -> dict[str, int]:
    return {"qwen3vl": s["txtfusion.layerwise_blocks.0.prenorm.scale"][0]}


def variant(sizes: dict, file_name: str, configs: Configs,
            kontext: str = "auto") -> tuple[dict[str, dict], tuple[str, ...]]:
    """Turbo by its file name (Raw and Turbo files hold the same tensors): its fixed timestep shift."""
    if "turbo" in file_name.lower():
        return {"": {"is_distilled": True}}, ("read as Krea 2 Turbo (its file name): is_distilled, a fixed shift",)
    return {}, ("read as Krea 2 (Raw): a Turbo file's name says 'turbo' (krea2_turbo_...), as ComfyUI's templates "
                "name them",)

NO_STYLE_REFERENCE = ("diffusers' Krea2Pipeline has no reference images (ComfyUI's Krea 2 style reference adds "
                      "reference tokens to the transformer, which diffusers does not have); use a style LoRA "
                      "(Load LoRA) instead, or run the style-reference template in ComfyUI itself")

FAMILY = ModelFamily(
    id="krea2", order=65, tiny=("krea2",), name="Krea 2",
    pipelines=(Pipeline("Krea2Pipeline", "Krea 2", 2, "guidance_scale", False, cfg_passes="branches",
                        unnamed_branches=True, cfg_above=0.0, comfy_encoder=("krea2", "CLIPTextEncode"),
                        sigmas="always", sigmas_arg=True, no_image=NO_STYLE_REFERENCE,
                        no_step_cache="diffusers' Krea2Pipeline calls its transformer without the cache contexts "
                                      "('cond', 'uncond') that diffusers' cache hooks keep their state by, so its two "
                                      "guidance passes would read each other's cache"),),
    configs=(Configs("krea2", (TextSlot("text_encoder", "qwen3vl"),)),),
    denoiser_keys=("txtfusion.projector.weight", "first.weight", "blocks.0.attn.wq.weight"),
    width_key="first.weight", width_agrees=("blocks.0.attn.wq.weight", 1), sizes=sizes, text_widths=text_widths,
    text_layers=(("qwen3vl", TEXT_LAYERS),),
    vae="vae-wan", vae_hint="qwen_image_vae.safetensors", variant=variant,
)
