"""ComfyUI nodes of ComfyUI-TPU: thin wrappers (inputs, tooltips, validation, progress) over backend.api."""

from .info_nodes import TPUDeviceInfo, TPUFreeWorkers
from .pipeline_nodes import LoadTPUPipeline, TPUSample

NODE_CLASS_MAPPINGS = {
    "LoadTPUPipeline": LoadTPUPipeline,
    "TPUSample": TPUSample,
    "TPUDeviceInfo": TPUDeviceInfo,
    "TPUFreeWorkers": TPUFreeWorkers,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "LoadTPUPipeline": "Load TPU Pipeline",
    "TPUSample": "Sample (TPU)",
    "TPUDeviceInfo": "TPU Device Info",
    "TPUFreeWorkers": "Free TPU Workers",
}
