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

ComfyUI's files load, as its image_ideogram4_t2i template names them: two diffusion models, ideogram4_*.safetensors
(the conditional transformer, in the loader's diffusion_model) and ideogram4_unconditional_*.safetensors (the
unconditional one, in diffusion_model_2; the template loads them with two UNETLoaders), Qwen3-VL-8B
(qwen3vl_8b_*.safetensors, ComfyUI's names) as transformers' Qwen3VLModel, and FLUX.2's VAE (flux2-vae). The two
transformer files hold the same keys (ComfyUI's own layout, comfy/ldm/ideogram4/model.py: a fused
`attention.qkv`, `attention.o`): which is which is told where their names say ("unconditional") and by their
bytes. diffusers 0.42.1 has no single-file converter for them: the family's own renaming (convert.py) reads them.
The configs are diffusers' Ideogram4Transformer2DModel defaults (ComfyUI's supported_models.Ideogram4 agrees), the
pipeline's FlowMatchEulerDiscreteScheduler (no dynamic shifting: the pipeline sets its own sigmas), Qwen3-VL-8B-
Instruct's text encoder and tokenizer settings, and FLUX.2's VAE.
Licence: Ideogram Non-Commercial Model Agreement (commercial use needs a paid licence).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..base import Configs, ModelFamily, Pair, Pipeline, Shapes, TextSlot, count, scaled

# the Qwen3-VL layers whose hidden states the transformer reads, concatenated per token (diffusers'
# QWEN3_VL_ACTIVATION_LAYERS: 0, 3, ..., 33, 35)
TAPPED_LAYERS = 13
TEXT_LAYERS = 36  # layer 35's output, the deepest of them: Qwen3-VL-8B's 36 layers


def sizes(s: Shapes, published: dict, texts: Mapping[str, Shapes]) -> dict:
    """Widths and counts from ComfyUI's layout (head size from the q-norm); the rotary split, which no tensor
    stores, is the published one scaled in proportion to the head (ComfyUI fixes every size but the input
    channels and the layer count: supported_models.Ideogram4)."""
    hidden, head = s["input_proj.weight"][0], s["layers.0.attention.norm_q.weight"][0]
    rope = published["mrope_section"]
    return {"in_channels": s["input_proj.weight"][1], "num_layers": count(s, "layers."), "attention_head_dim": head,
            "num_attention_heads": hidden // head, "intermediate_size": s["layers.0.feed_forward.w1.weight"][0],
            "adaln_dim": s["adaln_proj.weight"][0], "llm_features_dim": s["llm_cond_proj.weight"][1],
            "mrope_section": scaled(rope, sum(rope) * head // published["attention_head_dim"], even=False)}


def text_widths(s: Shapes, kinds: frozenset[str]) -> dict[str, int]:
    return {"qwen3vl": s["llm_cond_proj.weight"][1] // TAPPED_LAYERS}


FAMILY = ModelFamily(
    id="ideogram4", order=67, tiny=("ideogram4",), name="Ideogram 4",
    pipelines=(Pipeline("Ideogram4Pipeline", "Ideogram 4", 2, "guidance_scale", False, cfg_passes="models",
                        comfy_encoder=("ideogram4", "CLIPTextEncode"),
                        sigmas="always", call_args=(("guidance_schedule", None),),
                        unfit_samplers=("uni_pc", "uni_pc_bh2"),
                        no_image="diffusers' Ideogram4Pipeline makes images from text only",
                        no_step_cache="diffusers' Ideogram4Pipeline calls its two transformers without the cache "
                                      "contexts that diffusers' cache hooks keep their state by"),),
    configs=(Configs("ideogram4", (TextSlot("text_encoder", "qwen3vl"),)),),
    denoiser_keys=("embed_image_indicator.weight", "input_proj.weight", "llm_cond_proj.weight"),
    width_key="input_proj.weight", width_agrees=("llm_cond_proj.weight", 0), sizes=sizes, text_widths=text_widths,
    text_layers=(("qwen3vl", TEXT_LAYERS),),
    vae="vae-flux2", vae_hint="flux2-vae.safetensors",
    pair=Pair("unconditional_transformer", "the conditional transformer", "the unconditional transformer",
              "unconditional", "ideogram4_unconditional_*.safetensors"),
)
