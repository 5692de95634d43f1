"""Load LoRA (TPU): one LoRA file on top of a pipeline's weights; several chain. The worker does the work.

Saved workflows store widget values by position: never reorder or remove inputs here; add new ones last,
with defaults (tests/test_node_contract.py guards this).
"""

from __future__ import annotations

from ..backend import families
from ..backend.controller import api
from ..backend.protocol.errors import ModelError
from ..backend.protocol.spec import LORA_EXPERTS
from . import comfy_bridge

CATEGORY = "TPU"


class TPULoadLoRA:
    DESCRIPTION = ("Applies a LoRA file (from ComfyUI's models/loras folder) to the pipeline; chain several to "
                   "combine them. The model is not reloaded: the worker writes the LoRA into the weights it holds, "
                   "and changing a strength or removing the node rewrites only the layers the LoRA touches (no "
                   "recompile in compiled mode). Reads the formats diffusers reads: diffusers/PEFT, kohya, "
                   "ComfyUI-saved, XLabs and more. Only .safetensors files are listed.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("TPU_PIPELINE",)
    RETURN_NAMES = ("pipeline",)
    OUTPUT_TOOLTIPS = ("The pipeline with this LoRA; connect it to Sample or to another Load LoRA.",)
    FUNCTION = "add"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "pipeline": ("TPU_PIPELINE", {"tooltip": "From Load TPU Pipeline (or another Load LoRA)."}),
                "lora_name": (comfy_bridge.lora_files(), {"tooltip":
                              f"A LoRA made for this model's family ({families.names(last=' and ')}), in "
                              "ComfyUI's models/loras folder. Only .safetensors files are listed."}),
                "strength": ("FLOAT", {"default": 1.0, "min": -10.0, "max": 10.0, "step": 0.01, "tooltip":
                             "How strongly the LoRA changes the image model (transformer or UNet). 1 = as "
                             "trained, 0 = off, negative values push the other way."}),
                "strength_text_encoder": ("FLOAT", {"default": 1.0, "min": -10.0, "max": 10.0, "step": 0.01,
                                          "tooltip": "How strongly the LoRA changes the text encoders, for LoRAs "
                                                     "that have text-encoder layers (some FLUX.1, SD3 and SDXL "
                                                     "LoRAs); ignored otherwise. 1 = as trained, like ComfyUI's "
                                                     "Load LoRA."}),
            },
            "optional": {  # added after workflows were saved: a prompt without it keeps the old behaviour
                "experts": (list(LORA_EXPERTS), {"default": "both", "tooltip":
                            "Wan 2.2 A14B (two diffusion models: high noise, then low noise): which one this LoRA "
                            "goes into. A LoRA published as a high-noise and a low-noise file: chain two Load "
                            "LoRA nodes, one file each, with 'high noise' and 'low noise' (what LoraLoaderModelOnly "
                            "on each model does in ComfyUI). One file for both: 'both'. Other models have one "
                            "denoiser: leave it at 'both'."}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, lora_name):
        if not comfy_bridge.lora_path(lora_name):
            return (f"lora_name: '{lora_name}' is not in ComfyUI's models/loras folder; put it there and press R to "
                    "refresh the list.")
        return True

    def add(self, pipeline, lora_name, strength, strength_text_encoder, experts="both", unique_id=None):
        path = comfy_bridge.lora_path(lora_name)
        if not path:
            raise ModelError(f"lora_name: '{lora_name}' is not in ComfyUI's models/loras folder.")
        spec, text = api.with_lora(pipeline, path, strength, strength_text_encoder, experts)
        comfy_bridge.send_text(unique_id, text)
        return {"ui": {"text": [text]}, "result": (spec,)}
