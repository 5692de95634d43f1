"""Runs before ComfyUI imports torch: keeps the TPU runtime out of ComfyUI's own process.

The pack's folder is not importable by name (ComfyUI loads it by path), so its `backend` package is imported
under a private name without running the pack's own `__init__.py` (which would import the nodes, and torch).
"""

import importlib
import os
import sys
import types

_PACKAGE = "comfyui_tpu_prestartup"
_pack = types.ModuleType(_PACKAGE)
_pack.__path__ = [os.path.dirname(os.path.abspath(__file__))]
sys.modules[_PACKAGE] = _pack
_process_env = importlib.import_module(f"{_PACKAGE}.backend.controller.process_env")
_changed = _process_env.configure_process_env()
if _changed:
    print(f"[ComfyUI-TPU] set {', '.join(_changed)} for ComfyUI's process (TPU work runs in worker processes)")
