"""Set Execution Mode and Compile: inputs, tooltips and messages; backend/compiler.py does the work.

Saved workflows store widget values by position: never reorder or remove inputs here; add new ones
last, with defaults (tests/test_node_contract.py guards this).
"""

from __future__ import annotations

from ..backend.controller import api
from ..backend.controller.compile_plan import parse_warmup
from ..backend.protocol.errors import CompileError
from ..backend.protocol.spec import COMPILE_BACKENDS, COMPILE_TARGETS, MODE_CHOICES
from . import comfy_bridge

CATEGORY = "TPU"

# Compiled graphs are kept in ComfyUI's user directory (unless COMFYUI_TPU_COMPILE_CACHE says otherwise);
# workers read it when they start.
api.set_compile_cache_dir(comfy_bridge.compile_cache_dir())


class TPUSetExecutionMode:
    DESCRIPTION = ("Chooses how the pipeline runs, without reloading it. strict eager: op by op (the default, no "
                   "compile wait). compiled: torch.compile of the transformer/UNet, fastest after a one-time compile "
                   "per image size (use Compile to choose details and compile sizes up front). These two are the "
                   "modes TorchTPU's diffusers guide documents. defer-and-fuse eager (TorchTPU fuses ops into larger "
                   "graphs) and debug eager (every op waits for the chip) are TorchTPU's own modes that its guide no "
                   "longer documents: kept so saved workflows run, untried on a TPU.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("TPU_PIPELINE",)
    RETURN_NAMES = ("pipeline",)
    OUTPUT_TOOLTIPS = ("The same pipeline with this execution mode; connect it to Sample or Compile.",)
    FUNCTION = "set_mode"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "pipeline": ("TPU_PIPELINE", {"tooltip": "From Load TPU Pipeline."}),
                "mode": (list(MODE_CHOICES), {"default": "strict eager", "tooltip":
                         "strict eager: no compile wait, slowest per step. compiled: fastest per step; each new "
                         "image size, batch or frame count compiles once (minutes on TPU), then is reused, also "
                         "after a restart; steps, sampler, seed, prompt and guidance never recompile. "
                         "defer-and-fuse eager (TPU only, strict eager on GPU/CPU) and debug eager (launch "
                         "blocking, for troubleshooting): TorchTPU modes its diffusers guide no longer documents, "
                         "untried on a TPU."}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    def set_mode(self, pipeline, mode, unique_id=None):
        spec, notes = api.with_mode(pipeline, mode)
        text = "\n".join([f"mode: {mode}", *notes])
        comfy_bridge.send_text(unique_id, text)
        return {"ui": {"text": [text]}, "result": (spec,)}


class TPUCompile:
    DESCRIPTION = ("Compiles the transformer/UNet with torch.compile (static shapes) and compiles the warm-up sizes "
                   "right away, so the first real Sample at those sizes starts at full speed. Any other size compiles "
                   "once on its first Sample (announced next to the node) and is reused after that. Compiled graphs "
                   "are kept on disk in ComfyUI's user folder and reused after a restart.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("TPU_PIPELINE",)
    RETURN_NAMES = ("pipeline",)
    OUTPUT_TOOLTIPS = ("The pipeline in compiled mode with this plan; connect it to Sample.",)
    FUNCTION = "compile"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "pipeline": ("TPU_PIPELINE", {"tooltip": "From Load TPU Pipeline (or Set Execution Mode)."}),
                "target": (list(COMPILE_TARGETS), {"default": "whole denoiser", "tooltip":
                           "whole denoiser: one graph for the whole transformer/UNet, fastest. repeated blocks: "
                           "compiles one block and reuses it for the others, much shorter compile, nearly as fast; "
                           "used automatically with offload 'model'. SD3 has no repeated blocks."}),
                "backend": (list(COMPILE_BACKENDS), {"default": "auto", "tooltip":
                            "auto: TorchTPU's compiler on TPU, inductor on GPU/CPU. eager / aot_eager only trace "
                            "(no speed-up): for testing and troubleshooting."}),
                "warmup": ("STRING", {"default": "1024x1024", "tooltip":
                           "Sizes to compile now, before the first prompt: WIDTHxHEIGHT, comma separated, with an "
                           "optional xBATCH (e.g. '1024x1024, 832x1216x2'); videos with their frames as "
                           "xFRAMESf (e.g. '832x480x81f'); LTX-2's at Sample Video's frame_rate, written after "
                           "them where it is not 24 (e.g. '768x512x121f@25fps': the sound's length is a shape). "
                           "Empty: compile each size on its first Sample instead."}),
                "snap_to_warmup": ("BOOLEAN", {"default": False, "tooltip":
                                   "On: a Sample at a size that was not warmed up uses the closest warm-up size "
                                   "(same shape first) instead of compiling a new one; the image then has that size "
                                   "and the node says so."}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, warmup):
        try:
            parse_warmup(warmup)
        except CompileError as e:
            return str(e)
        return True

    def compile(self, pipeline, target, backend, warmup, snap_to_warmup, unique_id=None):
        spec, notes = api.with_compile(pipeline, target, backend, warmup, snap_to_warmup)
        for note in notes:
            comfy_bridge.send_text(unique_id, note)
        info = comfy_bridge.run_cancellable(api.load, spec, node_id=unique_id, total=api.warmup_steps(spec))
        text = "\n".join([*notes, describe_stats(info.get("compile") or {})])
        comfy_bridge.send_text(unique_id, text)
        return {"ui": {"text": [text]}, "result": (spec,)}


def describe_stats(stats: dict) -> str:
    """Compile statistics as a few lines for the node's text."""
    compiled = stats.get("compiled")
    if not compiled:
        return f"mode: {stats.get('mode', '?')} (nothing compiled)"
    lines = [f"compiled: {compiled['component']}",
             f"{stats['compiles']} compiles ({stats['compile_s']:.1f} s), {stats['hits']} reuses, "
             f"{stats['unexpected_recompiles']} unexpected recompiles"]
    for s in stats.get("shapes", []):
        if s["component"] == compiled["component"]:
            disk = ", from the disk cache" if s["from_disk"] else ""
            lines.append(f"  {s['shape']}: compiled in {s['compile_s']:.1f} s{disk}, reused {s['hits']}x")
    cache = stats.get("cache", {})
    lines.append(f"cache: {cache.get('dir')} ({cache.get('status')})")
    return "\n".join(lines)
