"""ComfyUI-TPU: run diffusers pipelines from ComfyUI on TPUs (TorchTPU), NVIDIA GPUs or the CPU.

ComfyUI imports this file; the nodes live in nodes/, the machinery in backend/.
"""

import importlib.util

if importlib.util.find_spec("comfy") is None:
    # Imported outside ComfyUI (pytest collects this folder as a package): the nodes need ComfyUI.
    NODE_CLASS_MAPPINGS: dict = {}
    NODE_DISPLAY_NAME_MAPPINGS: dict = {}
else:
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
