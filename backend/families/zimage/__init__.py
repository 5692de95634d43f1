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

ControlNets: alibaba-pai's Z-Image-Turbo-Fun-Controlnet-Union (1.0, 2.0, 2.1, lite) files hold diffusers' keys
(`control_layers.N.`, `control_all_x_embedder.2-1.`, `control_noise_refiner.N.`); diffusers'
ZImageControlNetModel borrows the rest from the transformer (`from_transformer`). "Union" means one model for
canny, depth, pose, ...: it reads the kind from the image and takes no mode. Its pipelines take neither a start
nor an end step, nor several ControlNets; the inpainting one makes the whole image from noise, the ControlNet
reading the image outside the mask and the mask (2.0 and later: a 33-channel input; 1.0 reads the control image
only).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..base import Configs, ControlNets, ModelFamily, Pipeline, Shapes, TextSlot, count, scaled


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


REFINER_SWITCH = "control_noise_refiner.0.before_proj.weight"  # zeros in 2.0's files, trained in 2.1's


def controlnet_config(s: Shapes, denoiser: dict, zeros: frozenset[str] = frozenset()) -> dict:
    """A Z-Image ControlNet file's config, as diffusers' single-file loader tells the releases apart
    (`infer_diffusers_model_type`): its control refiner blocks plain (1.0: no before/after projections), trained
    (2.1: `control_noise_refiner`) or absent or zero (2.0: the control layers refine instead). Where its control
    layers sit is stored nowhere: evenly over the transformer's layers, as every release places them (1.0: 6 of 30
    at 0, 5, ...; 2.x: 15 at 0, 2, ...; 2.1 lite: 3 at 0, 10, 20)."""
    dim, head = s["control_all_x_embedder.2-1.weight"][0], s["control_layers.0.attention.norm_q.weight"][0]
    patch = denoiser.get("all_patch_size", [2])[0] ** 2 * denoiser.get("all_f_patch_size", [1])[0]
    layers = count(s, "control_layers.")
    stride = max(1, denoiser.get("n_layers", layers) // layers)
    refiners = count(s, "control_noise_refiner.")
    if refiners and "control_noise_refiner.0.after_proj.weight" not in s:
        mode = None  # 1.0: plain transformer blocks refine the control image
    elif REFINER_SWITCH in s and REFINER_SWITCH not in zeros:
        mode = "control_noise_refiner"
    else:
        mode = "control_layers"
    base_refiners = denoiser.get("n_refiner_layers", refiners or 2)
    hinted = refiners if mode == "control_noise_refiner" else base_refiners if mode else 0  # refiner blocks steered
    return {"control_layers_places": [i * stride for i in range(layers)],
            "control_refiner_layers_places": list(range(hinted)),
            "control_in_dim": s["control_all_x_embedder.2-1.weight"][1] // patch, "add_control_noise_refiner": mode,
            "all_patch_size": list(denoiser.get("all_patch_size", [2])),
            "all_f_patch_size": list(denoiser.get("all_f_patch_size", [1])), "dim": dim,
            "n_refiner_layers": refiners or base_refiners, "n_heads": dim // head,
            "n_kv_heads": s["control_layers.0.attention.to_k.weight"][0] // head}


def controlnet_cannot_inpaint(config: dict, denoiser: dict) -> str:
    """Why this ControlNet cannot drive diffusers' ZImageControlNetInpaintPipeline ('' when it can)."""
    if config.get("control_in_dim", 0) > denoiser.get("in_channels", 16):
        return ""
    return ("it reads the control image only (Z-Image-Turbo-Fun-Controlnet-Union 1.0); inpainting needs one that "
            "also reads the image and the mask (2.0 or later)")


CONTROLNETS = ControlNets("ZImageControlNetModel", "", "ZImageControlNetPipeline",
                          inpaint="ZImageControlNetInpaintPipeline", steps_window=False, single_file=True,
                          no_modes=" (a Z-Image ControlNet Union reads the kind of control from the image itself)",
                          keys=("control_all_x_embedder.2-1.weight", "control_layers.0.before_proj.weight"),
                          zero_keys=(REFINER_SWITCH,), config=controlnet_config,
                          cannot_inpaint=controlnet_cannot_inpaint, inpaint_from_noise=True)

FAMILY = ModelFamily(
    id="zimage", order=60, tiny=("zimage",), name="Z-Image",
    pipelines=(Pipeline("ZImagePipeline", "Z-Image", 2, "guidance_scale", False, cfg_doubles_batch=True,
                        cfg_passes="batch", variable_text=True, img2img="ZImageImg2ImgPipeline",
                        inpaint="ZImageInpaintPipeline", unfit_samplers=("uni_pc", "uni_pc_bh2"), cfg_above=0.0, prompt_step=32, sigmas="always",
                        controlnets=(CONTROLNETS,)),),
    configs=(Configs("zimage", (TextSlot("text_encoder", "qwen3"),), "Z-Image Turbo"),),
    denoiser_keys=("cap_embedder.1.weight", "layers.0.adaLN_modulation.0.weight", "x_embedder.weight"),
    width_key="x_embedder.weight", width_agrees=("cap_embedder.1.weight", 0), sizes=sizes, text_widths=text_widths,
    vae="vae-ldm", vae_hint="FLUX.1's ae.safetensors",
)
