"""ComfyUI-TPU backend: runs diffusers pipelines in worker processes on TPU, CUDA or CPU.

Nothing here imports ComfyUI. The ComfyUI process only describes work and talks to workers;
all device work (loading, offload hooks, sampling) happens in `backend.worker` processes.
"""

__version__ = "0.1.0"
