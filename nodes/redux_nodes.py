"""Apply Redux (TPU): FLUX.1 Redux's reference images on top of a FLUX.1 pipeline, from the files ComfyUI's Load
Style Model and Load CLIP Vision read; several chain. The workers run diffusers' FluxPriorReduxPipeline.

Saved workflows store widget values by position: never reorder or remove inputs here; add new ones last,
with defaults (tests/test_node_contract.py guards this).
"""

from __future__ import annotations

from ..backend.controller import api
from ..backend.controller.redux import MAX_SCALE, TEXT_CHOICES
from ..backend.protocol.errors import ModelError
from . import comfy_bridge

CATEGORY = "TPU"
STYLE, VISION = "style_models", "clip_vision"  # ComfyUI's folders (models/style_models, models/clip_vision)


class TPUApplyRedux:
    DESCRIPTION = ("FLUX.1 Redux: makes images in the manner of the reference image (variations, or the prompt "
                   "steered by it), as diffusers' FluxPriorReduxPipeline followed by the FLUX.1 pipeline does. Reads "
                   "the files of ComfyUI's Load Style Model (flux1-redux-dev.safetensors) and Load CLIP Vision "
                   "(sigclip_vision_patch14_384.safetensors); the model is not reloaded. Chain several to combine "
                   "references (diffusers sums them, each with its scales). The scales are diffusers' "
                   "prompt_embeds_scale and pooled_prompt_embeds_scale; ComfyUI's Apply Style Model strength scales "
                   "the image tokens alone, which diffusers has no argument for, so it is not offered.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("TPU_PIPELINE",)
    RETURN_NAMES = ("pipeline",)
    OUTPUT_TOOLTIPS = ("The pipeline with this reference; connect it to Sample or to another Apply Redux.",)
    FUNCTION = "apply"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "pipeline": ("TPU_PIPELINE", {"tooltip": "A FLUX.1 pipeline: from Load TPU Pipeline (ComfyUI files) "
                                                         "or Load TPU Pipeline, or another Apply Redux, Load LoRA, "
                                                         "Apply ControlNet."}),
                "style_model_name": (comfy_bridge.safetensors_files(STYLE), {"tooltip":
                                     "FLUX.1 Redux's image embedder, in ComfyUI's models/style_models folder "
                                     "(flux1-redux-dev.safetensors)."}),
                "clip_vision_name": (comfy_bridge.safetensors_files(VISION), {"tooltip":
                                     "The SigLIP vision model Redux reads images with, in ComfyUI's "
                                     "models/clip_vision folder (sigclip_vision_patch14_384.safetensors)."}),
                "image": ("IMAGE", {"tooltip": "The reference image(s), stretched to 384x384 as diffusers' "
                                               "SiglipImageProcessor does (ComfyUI's CLIP Vision Encode crops the "
                                               "centre by default). Each image of the batch is a reference; all "
                                               "are summed."}),
                "prompt_embeds_scale": ("FLOAT", {"default": 1.0, "min": 0.0, "max": MAX_SCALE, "step": 0.01,
                                                  "tooltip": "diffusers' prompt_embeds_scale: multiplies this "
                                                             "reference's tokens, the prompt's included (with "
                                                             "text 'image only' the prompt's tokens are zeros)."}),
                "pooled_prompt_embeds_scale": ("FLOAT", {"default": 1.0, "min": 0.0, "max": MAX_SCALE, "step": 0.01,
                                                         "tooltip": "diffusers' pooled_prompt_embeds_scale: "
                                                                    "multiplies the pooled prompt embedding "
                                                                    "(CLIP-L's) that goes with this reference."}),
                "text": (list(TEXT_CHOICES), {"default": TEXT_CHOICES[0], "tooltip":
                         "'prompt and image': Sample's prompt (or positive CONDITIONING) is encoded by the loaded "
                         "text encoders and the image tokens follow it (FluxPriorReduxPipeline with text encoders). "
                         "'image only': zeros instead of the prompt (FluxPriorReduxPipeline without text encoders, "
                         "diffusers' example): Sample's prompt is not used."}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, style_model_name, clip_vision_name):
        for input_name, folder, name in (("style_model_name", STYLE, style_model_name),
                                         ("clip_vision_name", VISION, clip_vision_name)):
            if not comfy_bridge.folder_file(folder, name):
                return (f"{input_name}: '{name}' is not in ComfyUI's models/{folder} folder; put it there and press "
                        "R to refresh the list.")
        return True

    def apply(self, pipeline, style_model_name, clip_vision_name, image, prompt_embeds_scale,
              pooled_prompt_embeds_scale, text, unique_id=None):
        style, vision = comfy_bridge.folder_file(STYLE, style_model_name), comfy_bridge.folder_file(VISION,
                                                                                                      clip_vision_name)
        if not style or not vision:
            missing = ("style_model_name", STYLE, style_model_name) if not style else (
                "clip_vision_name", VISION, clip_vision_name)
            raise ModelError(f"{missing[0]}: '{missing[2]}' is not in ComfyUI's models/{missing[1]} folder.")
        spec, said = api.with_redux(pipeline, style, vision, image.cpu().numpy(), prompt_embeds_scale,
                                    pooled_prompt_embeds_scale, text)
        comfy_bridge.send_text(unique_id, said)
        return {"ui": {"text": [said]}, "result": (spec,)}
