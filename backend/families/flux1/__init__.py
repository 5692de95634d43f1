"""FLUX.1 (Black Forest Labs): dev, schnell and their fine-tunes; CLIP-L and T5-XXL text encoders, the
16-channel LDM VAE (ae.safetensors), 2x2 packed latents."""

from __future__ import annotations

from collections.abc import Mapping

from ..base import Configs, ControlNets, Embeddings, ModelFamily, Pipeline, Shapes, TextSlot, count, scaled

CONVERTER_WIDTH = 3072  # diffusers' FLUX.1 single-file converter hard-codes the published width
# Load TPU Pipeline (ComfyUI files)'s flux_kontext: a Kontext file holds the same tensors as FLUX.1 [dev], so the
# file's name says it (auto: "kontext" in it, as in every published one), or the artist does (on, off)
KONTEXT_CHOICES = ("auto", "on", "off")
FILL, CONTROL, KONTEXT = "FluxFillPipeline", "FluxControlPipeline", "FluxKontextPipeline"
# FLUX.1 Redux (Apply Redux): the published SigLIP image encoder's config, the image embedder's and the image
# processor's (FLUX.1-Redux-dev's feature_extractor), so that nothing is fetched from the Hub
REDUX_CONFIGS = "flux1-redux"


def sizes(s: Shapes, published: dict, texts: Mapping[str, Shapes]) -> dict:
    hidden, head = s["img_in.weight"][0], s["double_blocks.0.img_attn.norm.query_norm.scale"][0]
    return {"in_channels": s["img_in.weight"][1], "num_layers": count(s, "double_blocks."),
            "num_single_layers": count(s, "single_blocks."), "attention_head_dim": head,
            "num_attention_heads": hidden // head, "joint_attention_dim": s["txt_in.weight"][1],
            "pooled_projection_dim": s["vector_in.in_layer.weight"][1],
            "guidance_embeds": "guidance_in.in_layer.weight" in s,
            "axes_dims_rope": scaled(published["axes_dims_rope"], head, even=True),
            **({"out_channels": out} if (out := s["final_layer.linear.weight"][0]) != s["img_in.weight"][1] else {})}


def text_widths(s: Shapes, kinds: frozenset[str]) -> dict[str, int]:
    return {"clip-l": s["vector_in.in_layer.weight"][1], "t5": s["txt_in.weight"][1]}


def denoiser_layout(s: Shapes, prefix: str, quant: str, file_name: str) -> str:
    """diffusers' converter reads the published width; other widths go through ComfyUI's own key map."""
    width = s["img_in.weight"][0]
    if width == CONVERTER_WIDTH:
        return "flux1"
    if quant == "gguf":
        from ...protocol.errors import ModelError

        raise ModelError(f"diffusion_model: '{file_name}' is a GGUF FLUX.1 file {width} wide; diffusers reads GGUF "
                         "FLUX.1 files of the published width (3072) only.")
    return "flux1-comfy-map"


def tool(sizes: dict, file_name: str, kontext: str) -> str:
    """The pipeline a FLUX.1 file makes: Fill and Depth/Canny read a condition beside the latents (input channels
    latents + masked image + mask, or latents + control image); Kontext is told by name or by the loader."""
    latents, inputs = sizes.get("out_channels", sizes["in_channels"]), sizes["in_channels"]
    cls = FILL if inputs > 2 * latents else CONTROL if inputs == 2 * latents else ""
    if kontext == "on" and cls:
        from ...protocol.errors import ModelError

        raise ModelError(f"flux_kontext: '{file_name}' is a FLUX.1 {TOOL_NAMES[cls]} model ({inputs} input channels), "
                         "not FLUX.1 Kontext (which has FLUX.1 [dev]'s tensors); set flux_kontext to auto.")
    if cls:
        return cls
    named = kontext == "auto" and "kontext" in file_name.lower()
    return KONTEXT if kontext == "on" or named else "FluxPipeline"


KONTEXT_RESIZE = ("the reference is stretched to the Kontext resolution nearest its aspect ratio (about 1 megapixel, "
                  "as FluxKontextPipeline does; the resolution ComfyUI's FluxKontextImageScale picks, which crops "
                  "instead), so pictures of one aspect share a compiled graph; input image i goes with image i of "
                  "the run (cycling)")
TOOL_NAMES = {FILL: "Fill", CONTROL: "Depth/Canny", KONTEXT: "Kontext"}
TOOL_NOTES = {
    FILL: "FLUX.1 Fill: repaints the white part of Sample's mask in Sample's image (inpainting; outpainting with "
          "Pad Image for Outpainting); guidance 30 as published",
    CONTROL: "FLUX.1 Depth/Canny: follows the structure of Sample's image, the control image (a depth map, or "
             "edges from ComfyUI's Canny node); guidance 10 (Depth) or 30 (Canny) as published",
    KONTEXT: "FLUX.1 Kontext: edits Sample's image (the reference) as the prompt says; without an image it makes "
             "one from text",
}


def variant(sizes: dict, file_name: str, configs: Configs,
            kontext: str = "auto") -> tuple[dict[str, dict], tuple[str, ...]]:
    overrides, notes = {}, []
    if (cls := tool(sizes, file_name, kontext)) != "FluxPipeline":
        overrides[""] = {"_class_name": cls}
        how = " (by its file name; set flux_kontext to off if it is not)" if cls == KONTEXT and kontext == "auto" else ""
        notes.append(TOOL_NOTES[cls] + how)
    if not sizes["guidance_embeds"]:
        overrides["scheduler"] = {"shift": 1.0, "use_dynamic_shifting": False}  # schnell: its own schedule
        notes.append("FLUX.1 [schnell] (no guidance embedding): 4 steps, guidance 0")
    return overrides, tuple(notes)


def controlnet_config(s: Shapes, denoiser: dict) -> dict:
    """A FLUX.1 ControlNet file's config (InstantX, Shakker-Labs: diffusers' layout); rotary axes as the pipeline's."""
    hidden, head = s["x_embedder.weight"][0], s["transformer_blocks.0.attn.norm_q.weight"][0]
    hint = s.get("input_hint_block.conv_out.weight")
    return {"patch_size": 1, "in_channels": s["x_embedder.weight"][1], "num_layers": count(s, "transformer_blocks."),
            "num_single_layers": count(s, "single_transformer_blocks."), "attention_head_dim": head,
            "num_attention_heads": hidden // head, "joint_attention_dim": s["context_embedder.weight"][1],
            "pooled_projection_dim": s["time_text_embed.text_embedder.linear_1.weight"][1],
            "guidance_embeds": "time_text_embed.guidance_embedder.linear_1.weight" in s,
            "axes_dims_rope": denoiser.get("axes_dims_rope", [16, 56, 56]),
            "num_mode": s["controlnet_mode_embedder.weight"][0] if "controlnet_mode_embedder.weight" in s else None,
            "conditioning_embedding_channels": hint[0] if hint else None}


# InstantX's and Shakker-Labs' union ControlNets: the control_mode of each kind of control image
UNION_MODES = ("canny", "tile", "depth", "blur", "pose", "gray", "lq")
CONTROLNETS = ControlNets("FluxControlNetModel", "FluxMultiControlNetModel", "FluxControlNetPipeline",
                          img2img="FluxControlNetImg2ImgPipeline", inpaint="FluxControlNetInpaintPipeline",
                          modes=UNION_MODES, mode_key="num_mode",
                          keys=("controlnet_x_embedder.weight", "x_embedder.weight", "context_embedder.weight",
                                "transformer_blocks.0.attn.norm_q.weight"),
                          config=controlnet_config)

# TaylorSeer extrapolates the attention and feed-forward outputs of the double blocks and the attention and MLP
# projection of the single blocks (the features the TaylorSeer paper caches), not the attention alone (diffusers'
# default): in FLUX.1-dev at 1024² the attention modules are about 40-46 % of a block's work, so the default would
# compute the rest at every step (bench/README.md)
TAYLORSEER_MODULES = (r"transformer_blocks\.\d+\.(attn|ff|ff_context)", r"single_transformer_blocks\.\d+\.(attn|proj_mlp)")

# ComfyUI's FLUX conditioning: T5-XXL's last hidden states (its tokenizer pads to 256 tokens), pooled = CLIP-L's
# pooled output without projection (comfy/text_encoders/flux.py): diffusers' prompt_embeds and pooled_prompt_embeds
EMBEDDINGS = Embeddings("CLIP-L and T5-XXL (DualCLIPLoader, type flux)",
                        lambda c: (c["joint_attention_dim"], c["pooled_projection_dim"]), length=512, guidance=True)

FAMILY = ModelFamily(
    id="flux1", order=10, tiny=("flux",), name="FLUX.1",
    # FLUX.1 runs two passes only with true CFG (true_cfg_scale > 1 and a negative prompt: Sampling Options)
    pipelines=(Pipeline("FluxPipeline", "FLUX.1", 2, "guidance_scale", True, cfg_passes="branches", cp_plan=True,
                        sigmas="unless flow sigmas", true_cfg=True,
                        img2img="FluxImg2ImgPipeline", inpaint="FluxInpaintPipeline",
                        step_caches=("first block", "taylorseer", "magcache"), taylorseer_modules=TAYLORSEER_MODULES,
                        controlnets=(CONTROLNETS,), embeddings=EMBEDDINGS, redux=True),
               # The FLUX.1 tools, with FLUX.1's text encoders (so its CONDITIONING) and the image inputs as the
               # pipelines take them. Kontext runs true CFG as FLUX.1 does (two calls per step, unnamed: CFG
               # Parallel splits them by order); diffusers' Fill and Control pipelines have no true CFG (one pass).
               # FLUX.1's context-parallel plan splits the tools' sequence too: Kontext's reference tokens join it
               # (an odd total is refused by worker/parallel.check_even_split), Fill's and Depth's condition is in
               # the channels
               Pipeline(KONTEXT, "FLUX.1 Kontext", 2, "guidance_scale", True, cfg_passes="branches", cp_plan=True,
                        sigmas="unless flow sigmas", references=True, image_note=KONTEXT_RESIZE, true_cfg=True,
                        unnamed_branches=True, reference_mode="kontext",
                        embeddings=EMBEDDINGS, redux=True),
               Pipeline(FILL, "FLUX.1 Fill", 2, "guidance_scale", True, cp_plan=True, sigmas="unless flow sigmas",
                        inpaint=FILL, needs_image=True, needs_mask=True, embeddings=EMBEDDINGS,
                        redux=True),
               Pipeline(CONTROL, "FLUX.1 Depth/Canny", 2, "guidance_scale", True, cp_plan=True,
                        sigmas="unless flow sigmas", needs_image=True, control_image=True, embeddings=EMBEDDINGS,
                        redux=True)),
    configs=(Configs("flux1", (TextSlot("text_encoder", "clip-l"), TextSlot("text_encoder_2", "t5"))),),
    denoiser_keys=("double_blocks.0.img_attn.qkv.weight", "img_in.weight", "vector_in.in_layer.weight"),
    width_key="img_in.weight", width_agrees=("txt_in.weight", 0), out_key="final_layer.linear.weight",
    sizes=sizes, text_widths=text_widths, vae="vae-ldm", vae_hint="FLUX.1's ae.safetensors",
    single_file=True,
    denoiser_layout=denoiser_layout, variant=variant, extra_configs=(REDUX_CONFIGS,), variant_input="flux_kontext",
)
