"""Shard TP and Data Parallel: how many chips one pipeline uses, and how. The backend checks and runs it.

Saved workflows store widget values by position: never reorder or remove inputs here; add new ones last,
with defaults (tests/test_node_contract.py guards this).
"""

from __future__ import annotations

from ..backend import families
from ..backend.controller import api
from . import comfy_bridge

CATEGORY = "TPU"


class TPUShardTP:
    DESCRIPTION = ("Splits the model's transformer over several chips (tensor parallelism): each chip holds "
                   "and computes a slice of every layer, so a model too big for one chip fits and each step "
                   "is faster. "
                   f"{families.shard_tp_names()} can be sharded; {families.shard_tp_names(split=False)} cannot. Text "
                   "encoders are replicated on every chip unless shard_text_encoders is on and they have a "
                   "TP plan (Qwen2.5-VL, Qwen3, Mistral; CLIP and T5 have none). The VAE is replicated. "
                   "Checked before anything starts; the text next to the node shows what is sharded.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("TPU_PIPELINE",)
    RETURN_NAMES = ("pipeline",)
    OUTPUT_TOOLTIPS = ("The same pipeline, sharded; connect it to Sample (or to Data Parallel first).",)
    FUNCTION = "shard"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "pipeline": ("TPU_PIPELINE", {"tooltip": "From Load TPU Pipeline (offload must be 'none')."}),
                "degree": ("INT", {"default": 0, "min": 0, "max": 64, "tooltip":
                           "Chips to split the model over. 0 = auto: all chips of this host (on a CPU host, "
                           "which has no chips, auto is 1; a number up to the core count runs that many "
                           "processes). Must divide the chip count and the model's attention heads."}),
                "shard_text_encoders": ("BOOLEAN", {"default": False, "tooltip":
                                        "Also split text encoders that have a tensor-parallel plan "
                                        "(Qwen2.5-VL in Qwen-Image, Qwen3/Mistral in FLUX.2). CLIP and T5 "
                                        "(FLUX.1, SD3) have none and stay replicated on every chip."}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @classmethod
    def IS_CHANGED(cls, **_):
        return api.topology()  # auto counts the chips of the hosts that have joined

    def shard(self, pipeline, degree, shard_text_encoders, unique_id=None):
        spec, text = api.shard(pipeline, degree, shard_text_encoders)  # InputError: input, value, fix
        comfy_bridge.send_text(unique_id, text)
        return (spec,)


class TPUDataParallel:
    DESCRIPTION = ("Runs a copy of the (possibly sharded) model on each group of chips and splits the images "
                   "of each Sample between them: more images per second, same time per image. Image i always "
                   "uses seed + i, so the same seed gives the same image with any number of replicas (a "
                   "workflow made on 8 chips reproduces on 1): bit for bit with one chip or GPU per worker, "
                   "within 1e-5 for CPU workers with other thread counts. Put it after Shard TP when you use "
                   "both.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("TPU_PIPELINE",)
    RETURN_NAMES = ("pipeline",)
    OUTPUT_TOOLTIPS = ("The same pipeline, replicated; connect it to Sample.",)
    FUNCTION = "replicate"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "pipeline": ("TPU_PIPELINE", {"tooltip": "From Load TPU Pipeline or Shard TP."}),
                "replicas": ("INT", {"default": 0, "min": 0, "max": 64, "tooltip":
                             "Copies of the model. 0 = auto: all chips divided by the Shard TP degree (on a "
                             "CPU host, auto is 1; a number up to the core count runs that many processes). "
                             "Each copy needs the model's full memory (or its shard) on its chips."}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @classmethod
    def IS_CHANGED(cls, **_):
        return api.topology()  # auto counts the chips of the hosts that have joined

    def replicate(self, pipeline, replicas, unique_id=None):
        spec, text = api.replicate(pipeline, replicas)
        comfy_bridge.send_text(unique_id, text)
        return (spec,)
