"""Runs before ComfyUI imports torch: keeps the TPU runtime out of ComfyUI's own process.

Loads backend/device.py by path (this file is not imported as part of the package).
"""

import importlib.util
import os
import sys

_spec = importlib.util.spec_from_file_location(
    "comfyui_tpu_prestartup_device", os.path.join(os.path.dirname(__file__), "backend", "device.py"))
_device = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _device  # dataclasses look their module up there
_spec.loader.exec_module(_device)
_changed = _device.configure_process_env()
if _changed:
    print(f"[ComfyUI-TPU] set {', '.join(_changed)} for ComfyUI's process (TPU work runs in worker processes)")
