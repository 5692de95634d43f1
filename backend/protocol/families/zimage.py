"""Z-Image (Alibaba Tongyi-MAI): Turbo (8 steps, guidance distilled: used at guidance 0) and the base model (CFG).
A 6B single-stream transformer (noise and caption refiners, then joint layers) reading the second-to-last hidden
state of Qwen3-4B (the qwen_3_4b.safetensors FLUX.2 [klein] reads), FLUX.1's VAE (ae.safetensors), 2x2 patches.

diffusers runs CFG for any guidance_scale above 0 (not above 1), on one call with a doubled list of latents. Its
transformer has repeated blocks but neither a tensor- nor a context-parallel plan; the pack adds neither: the
6.15 B transformer is 12.3 GB in bfloat16 and fits one chip (a 16 GB v5e with offload 'model' beside Qwen3-4B's
8 GB; 32 GB and up with everything resident), so Data Parallel is the way to more chips.

ComfyUI keeps the transformer in its own (Lumina 2 `NextDiT`) layout: fused qkv, `x_embedder.`, `final_layer.`,
which diffusers' single-file converter reads. Base and Turbo files hold the same tensors; they differ in steps
and guidance, which the workflow sets.
"""

from __future__ import annotations

from collections.abc import Mapping

from .base import Configs, ModelFamily, Pipeline, Shapes, TextSlot, count, scaled


def sizes(s: Shapes, published: dict, texts: Mapping[str, Shapes]) -> dict:
    """Widths and counts from ComfyUI's layout, the head size from the q-norm, the rotary axes scaled from the
    published ones; the patch sizes are the published (2, 1)."""
    dim, head = s["cap_embedder.1.weight"][0], s["layers.0.attention.q_norm.weight"][0]
    patch = published["all_patch_size"][0] ** 2 * published["all_f_patch_size"][0]
    return {"in_channels": s["x_embedder.weight"][1] // patch, "dim": dim, "n_layers": count(s, "layers."),
            "n_refiner_layers": count(s, "noise_refiner."), "n_heads": dim // head,
            "n_kv_heads": (s["layers.0.attention.qkv.weight"][0] // head - dim // head) // 2,
            "cap_feat_dim": s["cap_embedder.1.weight"][1], "axes_dims": scaled(published["axes_dims"], head, even=True)}


def text_widths(s: Shapes, kinds: frozenset[str]) -> dict[str, int]:
    return {"qwen3": s["cap_embedder.1.weight"][1]}


FAMILY = ModelFamily(
    id="zimage", name="Z-Image",
    pipelines=(Pipeline("ZImagePipeline", "Z-Image", 2, "guidance_scale", False, cfg_doubles_batch=True,
                        cfg_passes="batch", variable_text=True, img2img="ZImageImg2ImgPipeline",
                        inpaint="ZImageInpaintPipeline", cfg_above=0.0, prompt_step=32, sigmas="always"),),
    configs=(Configs("zimage", (TextSlot("text_encoder", "qwen3"),), "Z-Image Turbo"),),
    denoiser_keys=("cap_embedder.1.weight", "layers.0.adaLN_modulation.0.weight", "x_embedder.weight"),
    width_key="x_embedder.weight", width_agrees=("cap_embedder.1.weight", 0), sizes=sizes, text_widths=text_widths,
    vae="vae-ldm", vae_hint="FLUX.1's ae.safetensors", lora_formats=("comfyui-zimage",),
)
