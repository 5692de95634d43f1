"""ComfyUI nodes of ComfyUI-TPU: thin wrappers (inputs, tooltips, validation, progress) over backend.api."""

from ..backend.controller import api
from . import comfy_bridge
from .compile_nodes import TPUCompile, TPUSetExecutionMode
from .controlnet_nodes import TPUApplyControlNet
from .info_nodes import TPUDeviceInfo, TPUFreeWorkers
from .lora_nodes import TPULoadLoRA
from .parallel_nodes import TPUDataParallel, TPUShardTP
from .pipeline_nodes import LoadTPUPipeline, LoadTPUPipelineFiles, TPUSample, TPUSampleLatent, TPUVAEDecode
from .redux_nodes import TPUApplyRedux
from .speed_nodes import TPUCFGParallel, TPUContextParallel, TPUSamplingOptions
from .video_nodes import TPUSampleVideo

comfy_bridge.treat_sigterm_as_ctrl_c()
api.start_hosts()  # several hosts configured: the others can join from now on
api.warm_start()  # COMFYUI_TPU_WARM_START=1: this host's worker starts now, in the background

NODE_CLASS_MAPPINGS = {
    "LoadTPUPipeline": LoadTPUPipeline,
    "TPUSample": TPUSample,
    "TPUDeviceInfo": TPUDeviceInfo,
    "TPUFreeWorkers": TPUFreeWorkers,
    "TPUShardTP": TPUShardTP,
    "TPUDataParallel": TPUDataParallel,
    "TPUSetExecutionMode": TPUSetExecutionMode,
    "TPUCompile": TPUCompile,
    "LoadTPUPipelineFiles": LoadTPUPipelineFiles,
    "TPUCFGParallel": TPUCFGParallel,
    "TPUContextParallel": TPUContextParallel,
    "TPUSamplingOptions": TPUSamplingOptions,
    "TPULoadLoRA": TPULoadLoRA,
    "TPUSampleVideo": TPUSampleVideo,
    "TPUApplyControlNet": TPUApplyControlNet,
    "TPUSampleLatent": TPUSampleLatent,
    "TPUVAEDecode": TPUVAEDecode,
    "TPUApplyRedux": TPUApplyRedux,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "LoadTPUPipeline": "Load TPU Pipeline",
    "TPUSample": "Sample (TPU)",
    "TPUDeviceInfo": "TPU Device Info",
    "TPUFreeWorkers": "Free TPU Workers",
    "TPUShardTP": "Shard TP",
    "TPUDataParallel": "Data Parallel",
    "TPUSetExecutionMode": "Set Execution Mode",
    "TPUCompile": "Compile (TPU)",
    "LoadTPUPipelineFiles": "Load TPU Pipeline (ComfyUI files)",
    "TPUCFGParallel": "CFG Parallel",
    "TPUContextParallel": "Context Parallel",
    "TPUSamplingOptions": "Sampling Options (TPU)",
    "TPULoadLoRA": "Load LoRA (TPU)",
    "TPUSampleVideo": "Sample Video (TPU)",
    "TPUApplyControlNet": "Apply ControlNet (TPU)",
    "TPUSampleLatent": "Sample Latent (TPU)",
    "TPUVAEDecode": "VAE Decode (TPU)",
    "TPUApplyRedux": "Apply Redux (TPU)",
}
