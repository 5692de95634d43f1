"""ComfyUI-TPU: run diffusers pipelines from ComfyUI on TPUs (TorchTPU), NVIDIA GPUs or the CPU.

ComfyUI imports this file; the nodes live in nodes/, the machinery in backend/.
"""

import importlib.util

# ComfyUI serves this folder at /extensions/<this folder's name>/, where its frontend's help panel reads each
# node's page (web/docs/<NodeClass>.md, the same files GitHub shows). It must hold docs only: ComfyUI loads any
# .js file in it into every browser that opens the UI (tests/test_help_pages.py holds it to .md and .png files).
WEB_DIRECTORY = "./web"

if importlib.util.find_spec("comfy") is None:
    # Imported outside ComfyUI (pytest collects this folder as a package): the nodes need ComfyUI.
    NODE_CLASS_MAPPINGS: dict = {}
    NODE_DISPLAY_NAME_MAPPINGS: dict = {}
else:
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS", "WEB_DIRECTORY"]
