"""FLUX 3 [klein] (Black Forest Labs): diffusers runs it only as a modular pipeline (`modular_pipelines/flux3`), a
folder holding modular_model_index.json: the step-distilled model (one pass per step, `flow_map` transformer) and
the base one (CFG through the folder's ClassifierFreeGuidance guider). Qwen3-VL text encoder, FLUX.2's VAE, 2x2
packed latents; both take reference images (edit). Diffusers folders only for now: its artists' files
(`flux3-image-klein-*`) are recognised and refused, saying why (FILES_REFUSED; diffusers' single-file converter for
the transformer exists, `convert_flux3_transformer_checkpoint_to_diffusers`)."""

from __future__ import annotations

from collections.abc import Mapping

from ..base import ModelFamily, Modular, Pipeline, Shapes

# the auto blocks start with a prompt upsampler (Qwen3.5-9B, `prompt_upsampler`): left out, the prompt is encoded
# as the artist wrote it (ComfyUI's templates run the upsampler as a separate TextGenerate node)
_UPSAMPLER = ("prompt_upsampler",)
_ENCODER = ("flux3", "CLIPTextEncode")  # its templates: CLIPLoader type flux3 (Qwen3-VL-4B), CLIP Text Encode


FILES_REFUSED = ("diffusers runs FLUX 3 [klein] as a modular pipeline only, and ComfyUI-TPU builds only "
                 "DiffusionPipeline classes from ComfyUI's files so far")


def _no_files(*_args: object) -> dict:
    raise NotImplementedError("FLUX 3 [klein]'s single files are not read yet: use a diffusers folder")


def sizes(s: Shapes, published: dict, texts: Mapping[str, Shapes]) -> dict:
    return _no_files()


def text_widths(s: Shapes, kinds: frozenset[str]) -> dict[str, int]:
    return _no_files()


# diffusers' modular denoise blocks call the transformer outside any cache context, which the cache hooks need
NO_CACHE = ("diffusers' modular FLUX 3 blocks call the transformer without the cache contexts that diffusers' "
            "cache hooks keep their state by")

FAMILY = ModelFamily(
    id="flux3", order=25, tiny=("flux3", "flux3-base"), name="FLUX 3 [klein]",
    pipelines=(
        Pipeline("Flux3DistilledModularPipeline", "FLUX 3 [klein]", 2, "guidance_scale", False, references=True,
                 latent_patch=2, modular=Modular("Flux3DistilledAutoBlocks", without=_UPSAMPLER),
                 no_step_cache=NO_CACHE, comfy_encoder=_ENCODER, check_kind="modular pipeline"),
        Pipeline("Flux3ModularPipeline", "FLUX 3 [klein] base", 2, "guidance_scale", False, references=True,
                 latent_patch=2, modular=Modular("Flux3AutoBlocks", without=_UPSAMPLER, guider=True),
                 no_step_cache=NO_CACHE, comfy_encoder=_ENCODER),
    ),
    configs=(),
    # the original (BFL) layout's keys, as diffusers' convert_flux3_transformer_checkpoint_to_diffusers reads them
    denoiser_keys=("content_mode_blocks.0.attn_out.weight", "emb_in.weight"),
    absent_keys=("double_blocks.0.img_attn.qkv.weight",),
    width_key="emb_in.weight", width_agrees=("txt_in.weight", 0), sizes=sizes, text_widths=text_widths,
    vae="vae-flux2", vae_hint="FLUX.2's flux2-vae.safetensors", files=False, files_refused=FILES_REFUSED,
)
