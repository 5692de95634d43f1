"""ComfyUI's own Load Audio, for the throwaway servers of the tests and the workflow builder (scripts/comfy_server.py
links this folder beside the pack), where ComfyUI's audio nodes fail to import: comfy_extras/nodes_audio.py
imports torchaudio at the top, and PyPI's torchaudio beside this torch breaks `import diffusers`
(docs/troubleshooting.md). Load Audio itself decodes with PyAV and never calls torchaudio.

The module is run from ComfyUI's own file, in a namespace of its own, with `torchaudio` bound to a stand-in whose
every function raises (only the nodes that resample call one: they are not registered); `sys.modules` is left as
it was, so any other pack importing torchaudio gets the real one or none. Where ComfyUI's audio nodes did import
(torchaudio installed), this registers nothing.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

NODE_CLASS_MAPPINGS: dict = {}
NODE_DISPLAY_NAME_MAPPINGS: dict = {}


def _stand_in() -> types.ModuleType:
    """A `torchaudio` whose attributes raise when called, naming why."""

    def missing(*_args, **_kwargs):
        raise RuntimeError("torchaudio is not installed here (scripts/comfy_audio_nodes)")

    module = types.ModuleType("torchaudio")
    module.__getattr__ = lambda name: types.SimpleNamespace(resample=missing, __call__=missing)  # type: ignore
    return module


def _comfy_load_audio() -> dict:
    """ComfyUI's LoadAudio class from comfy_extras/nodes_audio.py, run with the stand-in torchaudio."""
    import folder_paths

    source = Path(folder_paths.__file__).resolve().parent / "comfy_extras" / "nodes_audio.py"
    spec = importlib.util.spec_from_file_location("comfy_audio_nodes_nodes_audio", source)
    module = importlib.util.module_from_spec(spec)
    saved = sys.modules.get("torchaudio")
    sys.modules["torchaudio"] = _stand_in()
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["torchaudio"]
        else:
            sys.modules["torchaudio"] = saved
    return {"LoadAudio": module.LoadAudio}


if importlib.util.find_spec("torchaudio") is None:
    NODE_CLASS_MAPPINGS = _comfy_load_audio()
    NODE_DISPLAY_NAME_MAPPINGS = {"LoadAudio": "Load Audio"}
