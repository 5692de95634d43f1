"""FLUX 3 [klein] (Black Forest Labs): diffusers runs it only as a modular pipeline (`modular_pipelines/flux3`), a
folder holding modular_model_index.json: the step-distilled model (one pass per step, `flow_map` transformer) and
the base one (CFG through the folder's ClassifierFreeGuidance guider). Qwen3-VL text encoder, FLUX.2's VAE, 2x2
packed latents; both take reference images (edit).

ComfyUI's files load, as its templates name them: the diffusion model (flux3-image-klein-*.safetensors, the base
model's name says `base`; BFL's layout: `content_mode_blocks.image.N`, `emb_in.image`) through diffusers'
single-file converter (convert_flux3_transformer_checkpoint_to_diffusers); the step-distilled model is told by
its tensors (the flow map's `ref_time_in`, as diffusers' own checkpoint detection tells it), not by its name.
Qwen3-VL-4B (qwen3vl_4b_*.safetensors, the file Krea 2's templates read too) as transformers'
Qwen3VLForConditionalGeneration, and FLUX.2's VAE (flux2-vae.safetensors). The parts become the family's
modular pipeline (worker/modular.py `from_files`); the configs are diffusers' class defaults for the transformer,
Qwen3-VL-4B-Instruct's and FLUX.2's VAE, and the scheduler is the blocks' own, as for a diffusers folder.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..base import Configs, ModelFamily, Modular, Pipeline, Shapes, TextSlot, count, scaled

# the auto blocks start with a prompt upsampler (Qwen3.5-9B, `prompt_upsampler`): left out, the prompt is encoded
# as the artist wrote it (ComfyUI's templates run the upsampler as a separate TextGenerate node)
_UPSAMPLER = ("prompt_upsampler",)
_ENCODER = ("flux3", "CLIPTextEncode")  # its templates: CLIPLoader type flux3 (Qwen3-VL-4B), CLIP Text Encode


# the Qwen3-VL hidden states the blocks stack (their text_encoder_out_layers: 4, 8, ..., 32) into one text feature
TEXT_TAPS = 8
TEXT_LAYERS = 32  # the deepest of them: hidden_states[32], the output of layer 32


def sizes(s: Shapes, published: dict, texts: Mapping[str, Shapes]) -> dict:
    """Widths and counts from BFL's layout, the head size from the q-norm, the rotary axes scaled from the
    published ones; a flow map (the step-distilled model) where the file holds its second timestep embedder."""
    hidden, head = s["emb_in.image.weight"][0], s["single_blocks.0.norm.query_norm.scale"][0]
    return {"in_channels": s["emb_in.image.weight"][1], "cond_in_channels": s["emb_in.image_cond.weight"][1],
            "num_layers": count(s, "content_mode_blocks.image."), "num_single_layers": count(s, "single_blocks."),
            "attention_head_dim": head, "num_attention_heads": hidden // head,
            "joint_attention_dim": s["txt_in.weight"][1], "timestep_channels": s["time_in.in_layer.weight"][1],
            "mlp_ratio": s["single_blocks.0.mlp_out.weight"][1] / hidden,
            "axes_dims_rope": scaled(published["axes_dims_rope"], head, even=True),
            "flow_map": "ref_time_in.in_layer.weight" in s}


def text_widths(s: Shapes, kinds: frozenset[str]) -> dict[str, int]:
    return {"qwen3vl": s["txt_in.weight"][1] // TEXT_TAPS}


def variant(sizes: dict, file_name: str, configs: Configs,
            kontext: str = "auto") -> tuple[dict[str, dict], tuple[str, ...]]:
    """The base model (no flow map) is the other modular pipeline, its guider running CFG."""
    if sizes["flow_map"]:
        return {}, ("read as FLUX 3 [klein] (step-distilled): the file holds the flow map's ref_time_in",)
    return {"": {"_class_name": "Flux3ModularPipeline"}}, (
        "read as FLUX 3 [klein] base (CFG through its guider): the file holds no flow map (ref_time_in)",)


# diffusers' modular denoise blocks call the transformer outside any cache context, which the cache hooks need
NO_CACHE = ("diffusers' modular FLUX 3 blocks call the transformer without the cache contexts that diffusers' "
            "cache hooks keep their state by")

FAMILY = ModelFamily(
    id="flux3", order=25, tiny=("flux3", "flux3-base"), name="FLUX 3 [klein]",
    pipelines=(
        Pipeline("Flux3DistilledModularPipeline", "FLUX 3 [klein]", 2, "guidance_scale", False, references=True,
                 max_references=10, latent_patch=2, modular=Modular("Flux3DistilledAutoBlocks", without=_UPSAMPLER),
                 no_step_cache=NO_CACHE, comfy_encoder=_ENCODER, check_kind="modular pipeline"),
        Pipeline("Flux3ModularPipeline", "FLUX 3 [klein] base", 2, "guidance_scale", False, references=True,
                 max_references=10, latent_patch=2, modular=Modular("Flux3AutoBlocks", without=_UPSAMPLER, guider=True),
                 no_step_cache=NO_CACHE, comfy_encoder=_ENCODER),
    ),
    configs=(Configs("flux3", (TextSlot("text_encoder", "qwen3vl"),)),),
    # the original (BFL) layout's keys, as diffusers' convert_flux3_transformer_checkpoint_to_diffusers reads them
    denoiser_keys=("content_mode_blocks.image.0.attn_out.weight", "emb_in.image.weight",
                   "early_stream_modulations.image.lin.weight"),
    absent_keys=("double_blocks.0.img_attn.qkv.weight",),
    width_key="emb_in.image.weight", width_agrees=("txt_in.weight", 0), sizes=sizes, text_widths=text_widths,
    text_layers=(("qwen3vl", TEXT_LAYERS),),
    vae="vae-flux2", vae_hint="FLUX.2's flux2-vae.safetensors", variant=variant,
)
