"""Apply ControlNet (TPU): one ControlNet with its control image on top of a pipeline; several chain. The worker
does the work.

Saved workflows store widget values by position: never reorder or remove inputs here; add new ones last,
with defaults (tests/test_node_contract.py guards this).
"""

from __future__ import annotations

from ..backend import families
from ..backend.controller import api
from ..backend.protocol.errors import ModelError
from . import comfy_bridge

CATEGORY = "TPU"
# every union mode of every family's union ControlNets, in the families' order; a ControlNet takes its own
UNION_MODES = ("none", *dict.fromkeys(m for p in families.PIPELINES.values() for k in p.controlnets for m in k.modes))


def _family_modes() -> str:
    return "; ".join(f"{p.name} ({k.model}): {', '.join(k.modes)}" for p in families.PIPELINES.values()
                     for k in p.controlnets if k.modes)


def _kinds(holds) -> str:
    """The pipelines with a ControlNet kind `holds` is true of (from the declarations: a new family joins)."""
    return families.pipeline_names(lambda p: any(holds(k) for k in p.controlnets))


class TPUApplyControlNet:
    DESCRIPTION = ("Adds a ControlNet with its control image (e.g. from Load Image, or ComfyUI's Canny and other "
                   "preprocessors) to the pipeline; chain several to combine them. "
                   f"{families.controlnet_names()} (union ControlNets with modes: {_kinds(lambda k: k.modes)}; "
                   f"one at a time: {_kinds(lambda k: not k.multi)}; every step, no start or end: "
                   f"{_kinds(lambda k: not k.steps_window)}), from ComfyUI's models/controlnet folder: single "
                   "files in diffusers' layout (how these ControlNets are published) or diffusers folders. The model is not reloaded: the worker loads the ControlNet beside it; "
                   "changing strength, start, end or the image never recompiles in compiled mode. With Sample's "
                   "image (and mask) it works from that image, where diffusers has the pipeline (image to image: "
                   f"{_kinds(lambda k: k.img2img)}; inpainting: {_kinds(lambda k: k.inpaint)}).")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("TPU_PIPELINE",)
    RETURN_NAMES = ("pipeline",)
    OUTPUT_TOOLTIPS = ("The pipeline with this ControlNet; connect it to Sample or to another Apply ControlNet.",)
    FUNCTION = "apply"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "pipeline": ("TPU_PIPELINE", {"tooltip": "From Load TPU Pipeline (or another Apply ControlNet, or "
                                                         "Load LoRA)."}),
                "controlnet_name": (comfy_bridge.controlnet_names(), {"tooltip":
                                    "A ControlNet made for this model, in ComfyUI's models/controlnet folder: a "
                                    ".safetensors file in diffusers' layout (a published "
                                    "diffusion_pytorch_model.safetensors, renamed) or a diffusers folder (config.json "
                                    "and weights). XLabs FLUX.1 and LDM-layout files are not read."}),
                "image": ("IMAGE", {"tooltip": "The control image: edges, depth, pose, ... of the kind the ControlNet "
                                               "(or its union mode) expects. Resized to Sample's size as ComfyUI "
                                               "does (centre crop to the aspect ratio, nearest); image i of a run "
                                               "uses image i of this batch (cycling)."}),
                "strength": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 10.0, "step": 0.01, "tooltip":
                             "How strongly the control image steers the image (the ControlNet's conditioning "
                             "scale). 1 = as trained, 0 = off."}),
                "start_percent": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 1.0, "step": 0.001, "tooltip":
                                  "The share of the steps done before the ControlNet starts acting."}),
                "end_percent": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.001, "tooltip":
                                "The share of the steps after which it stops acting."}),
                "union_mode": (list(UNION_MODES), {"default": "none", "tooltip":
                               "For union ControlNets (one model, several kinds of control): the kind of this "
                               f"control image. {_family_modes()}. 'none' for other ControlNets."}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, controlnet_name):
        if not comfy_bridge.controlnet_path(controlnet_name):
            return (f"controlnet_name: '{controlnet_name}' is not in ComfyUI's models/controlnet folder; put it there "
                    "and press R to refresh the list.")
        return True

    def apply(self, pipeline, controlnet_name, image, strength, start_percent, end_percent, union_mode,
              unique_id=None):
        path = comfy_bridge.controlnet_path(controlnet_name)
        if not path:
            raise ModelError(f"controlnet_name: '{controlnet_name}' is not in ComfyUI's models/controlnet folder.")
        spec, text = api.with_controlnet(pipeline, path, image.cpu().numpy(), strength, start_percent, end_percent,
                                         union_mode)
        comfy_bridge.send_text(unique_id, text)
        return {"ui": {"text": [text]}, "result": (spec,)}
