"""One image sooner: CFG Parallel, Context Parallel and Sampling Options. The backend checks and runs them.

Saved workflows store widget values by position: never reorder or remove inputs here; add new ones last,
with defaults (tests/test_node_contract.py guards this).
"""

from __future__ import annotations

from ..backend import families
from ..backend.controller import api
from ..backend.protocol.spec import CP_MODES, STEP_CACHES
from . import comfy_bridge

CATEGORY = "TPU"


class TPUCFGParallel:
    DESCRIPTION = ("Runs the two guidance passes of every denoising step (with and without the prompt) on two "
                   "chips at once, so one image comes about twice as fast when the model runs classifier-free "
                   f"guidance: {families.cfg_parallel_names()} (true CFG: true_cfg_scale in Sampling Options; "
                   "the others with their guidance on). Guidance-distilled models ("
                   f"{families.pipeline_names(lambda p: not p.cfg_passes and not (p.modular and p.modular.guider), ', ')}"
                   ", FLUX.1 without true CFG) run one pass and are refused or gain nothing; "
                   f"{families.pipeline_names(lambda p: bool(p.modular and p.modular.guider))} (its guider runs both "
                   f"passes in its own loop) and {families.pipeline_names(lambda p: p.cfg_passes == 'models')} (two "
                   "transformers) are refused too. Same image as one chip: bit for bit where the two passes are "
                   f"two calls ({families.pipeline_names(lambda p: p.cfg_passes == 'branches')}), within about 1e-5 "
                   f"where they are one batch ({families.pipeline_names(lambda p: p.cfg_passes == 'batch')}). The "
                   "text next to the node says what it does for the chosen model.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("TPU_PIPELINE",)
    RETURN_NAMES = ("pipeline",)
    OUTPUT_TOOLTIPS = ("The same pipeline on 2 chips per copy; connect it to Sample (or Data Parallel).",)
    FUNCTION = "split"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "pipeline": ("TPU_PIPELINE", {"tooltip": "From Load TPU Pipeline, Shard TP or Context Parallel "
                                                         "(put Data Parallel after it)."}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    def split(self, pipeline, unique_id=None):
        spec, text = api.cfg_parallel(pipeline)  # InputError: input, value, fix
        comfy_bridge.send_text(unique_id, text)
        return {"ui": {"text": [text]}, "result": (spec,)}


class TPUContextParallel:
    DESCRIPTION = ("Splits the transformer's tokens (the image and the prompt) over several chips for every "
                   "block, with diffusers' own context parallelism: one large image comes sooner. "
                   f"{families.context_parallel_names()} can be split (their transformers have a context-parallel "
                   f"plan); {families.context_parallel_names(split=False)} cannot (CFG Parallel or Data Parallel instead). "
                   "Pays off on long sequences (large images); text "
                   "encoders and VAE run on every chip. Images match one chip within about 1e-6.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("TPU_PIPELINE",)
    RETURN_NAMES = ("pipeline",)
    OUTPUT_TOOLTIPS = ("The same pipeline, its sequence split; connect it to Sample (or CFG Parallel, Data "
                       "Parallel).",)
    FUNCTION = "split"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "pipeline": ("TPU_PIPELINE", {"tooltip": "From Load TPU Pipeline (offload 'none'; not with Shard "
                                                         "TP)."}),
                "degree": ("INT", {"default": 0, "min": 0, "max": 64, "tooltip":
                           "Chips to split the sequence over. 0 = auto: the chips left after CFG Parallel (on a "
                           "CPU host auto is 1; a number up to the core count runs that many processes). With "
                           "ulysses it must divide the attention heads; the image's tokens must split evenly."}),
                "mode": (list(CP_MODES), {"default": "ulysses", "tooltip":
                         "ulysses: each chip attends over all tokens for a share of the heads (two all-to-alls "
                         "per attention; usually faster). ring: each chip keeps a share of the keys and values "
                         "and passes them around (less memory; on the CPU only here)."}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @classmethod
    def IS_CHANGED(cls, **_):
        return api.topology()  # auto counts the chips of the hosts that have joined

    def split(self, pipeline, degree, mode, unique_id=None):
        spec, text = api.context_parallel(pipeline, degree, mode)
        comfy_bridge.send_text(unique_id, text)
        return {"ui": {"text": [text]}, "result": (spec,)}


class TPUSamplingOptions:
    DESCRIPTION = ("How Sample runs the pipeline. prompt_cache (on by default): a prompt seen before on this "
                   "model reuses its embeddings, so a new seed, size, steps or guidance never runs the text "
                   "encoders again (same pixels). batched (off by default): the images of one prompt in one "
                   "pipeline call, faster where the chip has room, but not bit-identical to one image at a time. "
                   f"true_cfg_scale: the true classifier-free guidance of {families.true_cfg_names()} against the "
                   "negative prompt. "
                   "step_cache (off by default): skips transformer work on steps that barely change the image.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("TPU_PIPELINE",)
    RETURN_NAMES = ("pipeline",)
    OUTPUT_TOOLTIPS = ("The same pipeline with these options; connect it to Sample.",)
    FUNCTION = "options"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "pipeline": ("TPU_PIPELINE", {"tooltip": "Any pipeline (from Load TPU Pipeline or a node after "
                                                         "it)."}),
                "prompt_cache": ("BOOLEAN", {"default": True, "tooltip":
                                 "Reuse the text encoders' output for a prompt (and negative prompt) seen before on "
                                 "this model: skips encoding, and under offload moving the text encoders to the "
                                 "chip. Same pixels as without it. Bounded; emptied when the model changes."}),
                "batched": ("BOOLEAN", {"default": False, "tooltip":
                            "On: the images of one prompt (batch_size) go through the model in one call, each "
                            "with its own seed: faster where the chip has room. Off: one call per image, so any "
                            "image can be reproduced alone, bit for bit, with any batch size or replica count "
                            "(one chip or GPU per worker; within 1e-5 for CPU workers with other thread counts)."}),
                "true_cfg_scale": ("FLOAT", {"default": 1.0, "min": 1.0, "max": 30.0, "step": 0.1, "round": 0.01,
                                   "tooltip": f"{families.true_cfg_names()} only: above 1, true classifier-free guidance against the "
                                              "negative prompt (two passes per step: slower, which CFG Parallel "
                                              "splits over 2 chips). 1 = off, FLUX.1's default."}),
            },
            "optional": {  # added after workflows were saved: a prompt without them keeps the old behaviour
                "step_cache": (list(STEP_CACHES), {"default": "off", "tooltip":
                               "Skip or approximate transformer work on steps whose input barely changed "
                               "(diffusers' cache hooks; what TeaCache and WaveSpeed do): faster, slightly different "
                               "pixels. " + "; ".join(f"{kind}: {families.step_cache_names(kind)}" for kind in STEP_CACHES[1:])
                               + ". Wan 2.2 A14B: on each expert. Not in compiled mode."}),
                "cache_threshold": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 10.0, "step": 0.01, "round": 0.001,
                                    "tooltip": "How much change a skipped step may hide: higher is faster and "
                                               "further from the uncached image. 0 = the cache's default (first "
                                               "block 0.08, magcache 0.06); taylorseer has none."}),
                "sigmas": ("STRING", {"default": "", "tooltip":
                           "A noise schedule of your own, written as ComfyUI's ManualSigmas writes it (e.g. "
                           "Qwen-Image 2.1 Turbo's '1.0, 0.978453, 0.95418, 0.926626, 0.89508, 0.845148, "
                           "0.704534, 0.414568, 0'): handed to the pipeline as diffusers' sigmas, and Sample's "
                           f"steps follow its length. {families.pipeline_names(lambda p: p.sigmas_arg)} only. "
                           "Empty = the model's own "
                           "schedule."}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    def options(self, pipeline, prompt_cache, batched, true_cfg_scale, step_cache="off", cache_threshold=0.0,
                sigmas="", unique_id=None):
        spec, text = api.sampling_options(pipeline, prompt_cache, batched, true_cfg_scale, step_cache,
                                          cache_threshold, sigmas)
        comfy_bridge.send_text(unique_id, text)
        return {"ui": {"text": [text]}, "result": (spec,)}
