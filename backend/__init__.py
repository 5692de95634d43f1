"""ComfyUI-TPU backend: runs diffusers pipelines in worker processes on TPU, CUDA or CPU.

Two processes, two packages: `controller` runs in ComfyUI's process (describes, checks, launches, talks),
`worker` runs in one process per chip (loads, samples, compiles). They share only `protocol`. Nothing here
imports ComfyUI; `tiny_models` builds the random-weight test pipelines.
"""

__version__ = "0.1.0"
