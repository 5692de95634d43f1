"""Device Info and Free TPU Workers: what the pack is doing, and a way to give the chips back."""

from __future__ import annotations

import json

from ..backend.controller import api
from . import comfy_bridge

CATEGORY = "TPU"


class TPUDeviceInfo:
    DESCRIPTION = ("Shows the detected device (TPU generation, chips and devices — a v7x chip is two devices —, "
                   "memory per device, the worker counts TorchTPU launches on this host, and anything that keeps a "
                   "TPU from being used), the state of the worker processes (loaded model, loads, samples, compile "
                   "and prompt-cache statistics) and where the last Sample's time went (last_prompt, seconds). "
                   "Safe to run at any time.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("info",)
    OUTPUT_TOOLTIPS = ("The same information as JSON text.",)
    FUNCTION = "info"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}, "hidden": {"unique_id": "UNIQUE_ID"}}

    @classmethod
    def IS_CHANGED(cls, **_):
        return float("nan")  # always re-run: the state changes between prompts

    def info(self, unique_id=None):
        dev = api.device_info()
        data = {"device": dev.kind, "name": dev.name, "chips": dev.chips, "devices": dev.devices,
                "memory_gib_per_device": dev.memory_gib, "group_sizes": dev.group_sizes, "notes": list(dev.notes),
                "torch_tpu_installed": dev.torch_tpu_installed, "workers": api.worker_info(),
                "last_prompt": api.last_latency()}
        if (cluster := api.hosts_info()) is not None:
            data["hosts"] = cluster
        text = json.dumps(data, indent=1)
        comfy_bridge.send_text(unique_id, text)
        return {"ui": {"text": [text]}, "result": (text,)}


class TPUFreeWorkers:
    DESCRIPTION = ("Stops the worker processes, freeing every chip and the memory they hold. The next Sample starts "
                   "them again (and reloads the model).")
    CATEGORY = CATEGORY
    RETURN_TYPES = ()
    FUNCTION = "free"
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}

    @classmethod
    def IS_CHANGED(cls, **_):
        return float("nan")

    def free(self):
        api.shutdown()
        return {}
