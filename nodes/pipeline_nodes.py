"""Load TPU Pipeline and Sample: inputs, tooltips and validation; the backend does the work.

Saved workflows store widget values by position: never reorder or remove inputs here; add new ones
last, with defaults (tests/test_node_contract.py guards this).
"""

from __future__ import annotations

import torch

from ..backend import families
from ..backend.controller import api
from ..backend.controller.files.assemble import FileChoice
from ..backend.controller.files.listing import NONE
from ..backend.families.flux1 import KONTEXT_CHOICES
from ..backend.protocol.errors import InputError
from ..backend.protocol.samplers import DEFAULT, SAMPLER_CHOICES, SCHEDULER_CHOICES
from ..backend.protocol.spec import DEVICE_CHOICES, DTYPE_CHOICES, OFFLOAD_CHOICES, SampleRequest
from . import comfy_bridge

CATEGORY = "TPU"


# Both Load nodes: where to run, and offload (each node keeps its own default)
DEVICE_INPUT = (list(DEVICE_CHOICES), {"default": "auto", "tooltip":
                "Where to run. auto picks a TPU if one is present, else a CUDA GPU, else the CPU."})
OFFLOAD_TOOLTIP = ("Keep parts of the model in host memory when the chip's memory is too small. auto: picks one "
                   "of the others from the model's size and the chip's memory, and says which and why next to "
                   "this node. none: fastest. model: each sub-model moves to the chip while it runs (a little "
                   "slower). sequential: layer by layer (much slower, least memory).")

class LoadTPUPipeline:
    DESCRIPTION = (f"Chooses a diffusers model folder ({families.names(last=', ')}) and how to run it. "
                   "Nothing is loaded here: the weights load in a worker process on the first Sample and stay "
                   "warm across prompts.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("TPU_PIPELINE",)
    RETURN_NAMES = ("pipeline",)
    OUTPUT_TOOLTIPS = ("The pipeline description; connect it to Sample.",)
    FUNCTION = "describe"

    @classmethod
    def INPUT_TYPES(cls):
        models = api.list_models(comfy_bridge.diffusers_roots())
        return {
            "required": {
                "model": (models, {"tooltip": "A diffusers model folder (one holding model_index.json, or a modular "
                                              "pipeline's modular_model_index.json: FLUX 3 [klein], MiniMax H3) found in "
                                              "ComfyUI's models/diffusers folder (a symlink to a folder elsewhere "
                                              "works), or a diffusers model in the Hugging Face cache "
                                              "(HF_HOME, as `hf download` leaves it) by its repo id. Put new "
                                              "models there and refresh. For single files (checkpoints, "
                                              "diffusion models) use Load TPU Pipeline (ComfyUI files)."}),
                "dtype": (list(DTYPE_CHOICES), {"default": "auto", "tooltip":
                          "Number format of the weights. auto = bfloat16 on TPU and GPU, float32 on CPU. "
                          "float32 doubles memory; float16 is for older GPUs. float8_e4m3fn: the transformer's "
                          "weights stored in fp8 (half of bfloat16's memory), each layer computed in bfloat16; "
                          "eager modes only."}),
                "device": DEVICE_INPUT,
                "offload": (list(OFFLOAD_CHOICES), {"default": "auto", "tooltip": OFFLOAD_TOOLTIP}),
            },
            "optional": {
                "model_path": ("STRING", {"default": "", "tooltip":
                               "Optional: a model folder name typed by hand (relative to models/diffusers). "
                               "When set, it is used instead of 'model'."}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, model, device="auto", model_path=""):
        try:  # the chosen device: 'cpu' must work on a host whose TPU cannot be used (v4, a pod host)
            api.make_spec(model_path or model, comfy_bridge.diffusers_roots(), device_choice=device)
        except InputError as e:
            return str(e)
        return True

    def describe(self, model, dtype, device, offload, model_path="", unique_id=None):
        spec = api.make_spec(model_path or model, comfy_bridge.diffusers_roots(), dtype, device, offload)
        comfy_bridge.send_text(unique_id, api.describe_pipeline(spec))  # where it runs, what offload auto chose
        return (spec,)


FILE_TOOLTIPS = {  # the families' own modules say what each reads (backend/families)
    "diffusion_model": f"The diffusion model file (models/diffusion_models or models/unet): {families.names(families.FROM_FILES)}, "
                       "in bf16, fp16, fp32 or fp8 (fp8 stays fp8 with dtype auto in eager modes), or GGUF (CPU and GPU "
                       "only). Qwen-Image-Edit files load as edit models when their name says 'edit' (as ComfyUI's "
                       "templates name them: qwen_image_edit_2509_...); Edit-2511 files are told by their content. "
                       "LTX-2.3 comes as a checkpoint (below); LTX-2.5's split DiT is refused by name (its diffusers "
                       "folder loads). Leave '(none)' when using a checkpoint.",
    "text_encoder": "A text encoder file (models/text_encoders or models/clip), in any order. "
                    f"{families.text_encoders_needed()}. With a checkpoint, only to replace or add to the ones "
                    "it holds.",
    "vae": "The VAE file (models/vae). " + "; ".join(f"{f.name}: {f.vae_hint}" for f in families.FROM_FILES)
           + ". Leave '(none)' to use the checkpoint's own VAE.",
    "diffusion_model_2": "Only for models of two experts (Wan 2.2 A14B, text or image to video): the low-noise "
                         "expert (…_low_noise_14B_….safetensors), with the high-noise one in diffusion_model; the high-noise "
                         "expert runs the first steps, the low-noise one the rest. And for Ideogram 4: its unconditional "
                         "transformer (ideogram4_unconditional_….safetensors), with the conditional one (ideogram4_…) in "
                         "diffusion_model; both run every step. Leave '(none)' for every other model.",
    "clip_vision": "Only for Wan 2.1 image to video: clip_vision_h.safetensors (models/clip_vision, what ComfyUI's "
                   "Load CLIP Vision reads), the CLIP vision encoder that reads the start image. Leave '(none)' "
                   "for every other model (Wan 2.2's image-to-video models read the start image through the VAE "
                   "only).",
    "audio_vae": "Only for a model that makes video with sound from split files (MiniMax H3, LTX-2.5): its audio "
                 "VAE (minimax_h3_audio_vae_fp32.safetensors; ltx-2.5-audio-vae-bf16.safetensors, its vocoder "
                 "inside; models/vae), which decodes the sound. Leave '(none)' for every other model (LTX-2.3's "
                 "checkpoint holds its own).",
    "checkpoint": f"An all-in-one checkpoint (models/checkpoints) of {families.single_file_names()} (with or "
                  "without its text encoders), or LTX-2.3's ltx-2.3-22b-dev-fp8 (its DiT, VAEs and vocoder; its "
                  "Gemma 3 file in a text encoder input). Its parts are used unless chosen above; leave '(none)' "
                  "when using a diffusion model.",
}


class LoadTPUPipelineFiles:
    DESCRIPTION = ("Builds a pipeline from the model files you already have in ComfyUI's folders, as its own loaders "
                   "read them, for " + families.names(families.FROM_FILES, " and ") + ": a diffusion model with its "
                   "text encoders and VAE (the split layout of ComfyUI's guides and templates; Wan 2.2 A14B's two "
                   "experts, and Ideogram 4's two transformers, in diffusion_model and diffusion_model_2; MiniMax "
                   "H3's audio VAE in audio_vae), or an all-in-one checkpoint (" + families.single_file_names()
                   + "; LTX-2.3's with its Gemma 3 file); which files each model takes is on this node's help page. "
                   "The files "
                   "are checked here (family, sizes, that they fit together) without reading their weights; "
                   "they load in a worker process on the first Sample and stay warm. Nothing is downloaded: the "
                   "configurations of the published models ship with ComfyUI-TPU and the tokenizers come from "
                   "ComfyUI. With Shard TP, each chip reads only its slices of a Qwen-Image file; other files "
                   "are read whole by each chip, then sharded.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("TPU_PIPELINE",)
    RETURN_NAMES = ("pipeline",)
    OUTPUT_TOOLTIPS = ("The pipeline description; connect it to Sample (or Shard TP, Data Parallel, Compile).",)
    FUNCTION = "describe"

    @classmethod
    def INPUT_TYPES(cls):
        files = api.list_files(comfy_bridge.file_roots())
        te = [NONE, *files["text_encoder"]]
        return {
            "required": {
                "diffusion_model": ([NONE, *files["diffusion_model"]], {"default": NONE, "tooltip":
                                    FILE_TOOLTIPS["diffusion_model"]}),
                "text_encoder_1": (te, {"default": NONE, "tooltip": FILE_TOOLTIPS["text_encoder"]}),
                "text_encoder_2": (te, {"default": NONE, "tooltip": FILE_TOOLTIPS["text_encoder"]}),
                "text_encoder_3": (te, {"default": NONE, "tooltip": FILE_TOOLTIPS["text_encoder"]}),
                "vae": ([NONE, *files["vae"]], {"default": NONE, "tooltip": FILE_TOOLTIPS["vae"]}),
                "checkpoint": ([NONE, *files["checkpoint"]], {"default": NONE, "tooltip":
                               FILE_TOOLTIPS["checkpoint"]}),
                "dtype": (list(DTYPE_CHOICES), {"default": "auto", "tooltip":
                          "Number format the weights are computed in. auto = bfloat16 on TPU and GPU, float32 "
                          "on CPU; an fp8 diffusion model keeps its fp8 weights (each layer computed in that "
                          "dtype; in compiled mode they are upcast). float8_e4m3fn: store any diffusion model's "
                          "weights in fp8, computed in bfloat16; eager modes only."}),
                "device": DEVICE_INPUT,
                "offload": (list(OFFLOAD_CHOICES), {"default": "none", "tooltip":
                            OFFLOAD_TOOLTIP + " Here the default is none (choose auto to have it picked)."}),
            },
            "optional": {
                "flux_kontext": (list(KONTEXT_CHOICES), {"default": "auto", "tooltip":
                                 "Whether a FLUX.1 diffusion model is FLUX.1 Kontext (instruction editing of Sample's "
                                 "image). A Kontext file holds the same tensors as FLUX.1 [dev], so nothing inside it "
                                 "tells them apart. auto: Kontext when the file's name contains 'kontext' (as every "
                                 "published one does: flux1-kontext-dev, flux1-dev-kontext_fp8_scaled); on: Kontext "
                                 "whatever its name; off: never. Fill, Depth and Canny files are told by their "
                                 "shapes."}),
                "diffusion_model_2": ([NONE, *files["diffusion_model"]], {"default": NONE, "tooltip":
                                      FILE_TOOLTIPS["diffusion_model_2"]}),
                "clip_vision": ([NONE, *files["clip_vision"]], {"default": NONE, "tooltip":
                                FILE_TOOLTIPS["clip_vision"]}),
                "audio_vae": ([NONE, *files["vae"]], {"default": NONE, "tooltip": FILE_TOOLTIPS["audio_vae"]}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @staticmethod
    def _choice(diffusion_model, text_encoder_1, text_encoder_2, text_encoder_3, vae, checkpoint,
                flux_kontext="auto", diffusion_model_2=NONE, clip_vision=NONE, audio_vae=NONE) -> FileChoice:
        return FileChoice(checkpoint=checkpoint, diffusion_model=diffusion_model,
                          text_encoders=(text_encoder_1, text_encoder_2, text_encoder_3), vae=vae,
                          flux_kontext=flux_kontext, diffusion_model_2=diffusion_model_2, clip_vision=clip_vision,
                          audio_vae=audio_vae)

    @classmethod
    def VALIDATE_INPUTS(cls, device="auto"):
        """Only the device here. ComfyUI repeats a VALIDATE_INPUTS error once per input the method takes (0.3.75
        execution.py: one `custom_validation_failed` per argument), so the files, which need all nine inputs
        together, are checked as the node runs: one message naming the input, before any worker starts."""
        try:
            api.devices.resolve_kind(device)
        except InputError as e:
            return str(e)
        return True

    def describe(self, diffusion_model, text_encoder_1, text_encoder_2, text_encoder_3, vae, checkpoint, dtype,
                 device, offload, flux_kontext="auto", diffusion_model_2=NONE, clip_vision=NONE, audio_vae=NONE,
                 unique_id=None):
        choice = self._choice(diffusion_model, text_encoder_1, text_encoder_2, text_encoder_3, vae, checkpoint,
                              flux_kontext, diffusion_model_2, clip_vision, audio_vae)
        spec = api.make_file_spec(choice, comfy_bridge.file_roots(), dtype, device, offload)
        comfy_bridge.send_text(unique_id, api.describe_files(spec))
        return (spec,)


LATENT_TOOLTIP = ("ComfyUI's LATENT of the images: the model's VAE latents, unscaled, as KSampler gives them "
                  "(Sample Latent's help page: layout per model), for Upscale Latent By, another Sample's latent input, VAE "
                  "Decode with the same VAE file.")


class TPUSample:
    DESCRIPTION = ("Generates images with the pipeline from Load TPU Pipeline. The same seed gives the same image; "
                   "image i of a batch uses seed + i. Shows progress with seconds per step and can be cancelled. "
                   "With an image it works from that image (image to image, or inpainting with a mask; reference "
                   f"images for {families.reference_names()}); with a latent it works from that latent (a latent "
                   "hires fix: Sample, Upscale Latent By, Sample). It also gives the images' LATENT. With positive "
                   "(and negative) CONDITIONING from ComfyUI's CLIP Text Encode, that encoding replaces the prompt "
                   f"text ({families.conditioned_names()}).")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("IMAGE", "LATENT")
    RETURN_NAMES = ("images", "latent")
    OUTPUT_TOOLTIPS = ("The generated images, ready for Save Image or Preview Image.", LATENT_TOOLTIP)
    FUNCTION = "sample"
    OUTPUTS = "images+latents"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "pipeline": ("TPU_PIPELINE", {"tooltip": "From Load TPU Pipeline."}),
                "prompt": ("STRING", {"multiline": True, "default": "", "tooltip": "What the image should show."}),
                "negative_prompt": ("STRING", {"multiline": True, "default": "", "tooltip":
                                    "What the image should not show. Used by the models that run "
                                    f"classifier-free guidance ({families.cfg_parallel_names()}); "
                                    "guidance-distilled ones ignore it."}),
                "width": ("INT", {"default": 1024, "min": 16, "max": 8192, "step": 16, "tooltip":
                          "Image width in pixels; a multiple of 16 for FLUX/SD3/Qwen-Image, of 8 for SDXL. "
                          "On TPU each new size compiles once."}),
                "height": ("INT", {"default": 1024, "min": 16, "max": 8192, "step": 16, "tooltip":
                           "Image height in pixels; same rules as width."}),
                "steps": ("INT", {"default": 20, "min": 1, "max": 1000, "tooltip":
                          "Denoising steps. FLUX.1-schnell: 4; FLUX.1-dev/FLUX.2: 28; SD3.5: 28-40; SDXL: 25-40."}),
                "guidance": ("FLOAT", {"default": 3.5, "min": 0.0, "max": 30.0, "step": 0.1, "round": 0.01,
                             "tooltip": "How strongly to follow the prompt. FLUX.1-schnell: 0; FLUX.1-dev: 3.5; "
                                        "SD3.5: 4.5; SDXL: 5-7; Qwen-Image: 4 (true CFG, uses the negative prompt)."}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF, "control_after_generate": True,
                         "tooltip": "Random seed. The same seed, size and settings give the same image."}),
                "batch_size": ("INT", {"default": 1, "min": 1, "max": 64, "tooltip":
                               "Images per run; image i uses seed + i, so each can be reproduced alone."}),
            },
            "optional": {
                "prompt_per_line": ("BOOLEAN", {"default": False, "tooltip":
                                    "Each non-empty line of the prompt is a prompt of its own, with "
                                    "batch_size images each, in order (seeds continue: line 2 starts at "
                                    "seed + batch_size). With Data Parallel, the images are split across "
                                    "the replicas."}),
                "image": ("IMAGE", {"tooltip":
                          "Optional: start from this image (image to image), or with a mask repaint part of it "
                          f"(inpainting: {families.inpainting_names()}). "
                          f"{families.reference_names()} take it as a reference image instead; "
                          f"{families.pipeline_names(lambda p: p.needs_mask)} needs it with a mask; "
                          f"{families.pipeline_names(lambda p: p.control_image)} take it as the control image "
                          "(a depth map, ComfyUI's Canny node). Image i of the run (seed + i) starts from image i of "
                          "this batch (cycling when it has fewer)."}),
                "mask": ("MASK", {"tooltip":
                         "Optional, with an image: the part to repaint (white = repaint, black = keep), e.g. Load "
                         "Image's mask output after the mask editor. Stretched to the image's size if it differs."}),
                "denoise": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01, "tooltip":
                            "With an image: how much to change it. 1 repaints everything (the image still sets "
                            "the colours of the noise), 0.3-0.6 keeps its layout, 0 returns it unchanged. 'steps' "
                            "steps run either way, over the end of a schedule of steps / denoise steps, as in "
                            "ComfyUI's KSampler."}),
                "size_from_image": ("BOOLEAN", {"default": False, "tooltip":
                                    "On: width and height follow the image (rounded down to what the model needs). "
                                    "Off: the image is stretched to width × height when its size differs (never "
                                    "cropped); the text next to the node says so."}),
                "sampler": (list(SAMPLER_CHOICES), {"default": DEFAULT, "tooltip":
                            "ComfyUI's sampler names, run by the diffusers scheduler of the same method (the table "
                            "is in Sample's help page). default: the model's own scheduler. Flow-matching models take "
                            "the flow-matching ones (euler, heun, dpmpp_2m, uni_pc, ...); a choice the model "
                            "cannot take is refused before anything runs, naming the ones it can. Changing it "
                            "never reloads or recompiles."}),
                "scheduler": (list(SCHEDULER_CHOICES), {"default": DEFAULT, "tooltip":
                              "ComfyUI's scheduler (noise schedule) names: karras, exponential and beta are "
                              "diffusers' use_karras/exponential/beta_sigmas; normal, simple, sgm_uniform and "
                              "ddim_uniform its timestep spacings (flow models: simple = normal = their shifted "
                              "linear schedule). default: the model's own schedule."}),
                "latent": ("LATENT", {"tooltip":
                           "Optional: start from this latent (Empty Latent Image, EmptySD3LatentImage, VAE Encode "
                           "with this model's VAE, Upscale Latent By, another Sample's latent). It sets the size "
                           "and the batch (width, height and batch_size are then not used). With denoise below 1 "
                           "the images start from it (a latent hires fix: 0.4-0.6); at 1 only its size counts."}),
                "positive": ("CONDITIONING", {"tooltip":
                             "Optional: ComfyUI's own text encoding (CLIP Text Encode, CLIPTextEncodeFlux/SD3, "
                             "FluxGuidance, ConditioningConcat, ConditioningAverage) instead of the prompt text, "
                             "which is then not used. Load the model's text encoders with ComfyUI's CLIP loaders "
                             "(they run in ComfyUI's process). This is how prompt weights such as (word:1.3) "
                             f"apply. {families.conditioned_names()}; FluxGuidance's guidance replaces the guidance "
                             "widget on FLUX.1. One encoding (not ConditioningCombine, area, mask or timestep "
                             "ranges)."}),
                "negative": ("CONDITIONING", {"tooltip":
                             "Optional, with positive: the negative encoding instead of negative_prompt. "
                             + families.pipeline_names(lambda p: p.embeddings and p.cfg_passes and not p.true_cfg)
                             + " need it when guidance is above 1 (an empty CLIP Text Encode or ConditioningZeroOut "
                             f"for none); {families.true_cfg_names()} use it only with true CFG (Sampling "
                             "Options)."}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    def sample(self, pipeline, prompt, negative_prompt, width, height, steps, guidance, seed, batch_size,
               prompt_per_line=False, image=None, mask=None, denoise=1.0, size_from_image=False, sampler=DEFAULT,
               scheduler=DEFAULT, latent=None, positive=None, negative=None, unique_id=None):
        started, queued = comfy_bridge.now(), comfy_bridge.queued_at()
        image = image.cpu().numpy() if image is not None else None
        mask = mask.cpu().numpy() if mask is not None else None
        notes, samples, asked = [], None, (width, height, batch_size)
        if latent is not None:
            samples, width, height, batch_size = api.latent_input(
                pipeline, latent["samples"].cpu().float().numpy(), "noise_mask" in latent)
        elif size_from_image and image is not None:
            width, height, note = api.size_from_image(pipeline, image)
            notes += [f"size {width}x{height}, from the image"] + ([note] if note else [])
        elif size_from_image:
            notes.append(f"size_from_image: no image is connected, so the size is {width}x{height}")
        request = SampleRequest(prompt=prompt, negative_prompt=negative_prompt, width=width, height=height,
                                steps=steps, guidance=guidance, seed=seed, batch_size=batch_size,
                                prompt_per_line=prompt_per_line, denoise=denoise, sampler=sampler,
                                scheduler=scheduler, outputs=self.OUTPUTS)
        prepared = api.prepare_sample(pipeline, request, image, mask, samples, asked,
                                      positive=comfy_bridge.conditioning_arrays(positive),
                                      negative=comfy_bridge.conditioning_arrays(negative))  # resolved and checked once
        notes += prepared.notes
        if notes:
            comfy_bridge.send_text(unique_id, "\n".join(notes))
        out = comfy_bridge.run_cancellable(api.run_sample_outputs, prepared, node_id=unique_id,
                                           total=steps * len(request.images()))
        # the notes again (the progress text replaced them), then where the time went
        comfy_bridge.show_latency(unique_id, queued, started, notes)
        result = tuple(self._output(name, out) for name in self.OUTPUTS.split("+"))
        if not notes:
            return result
        return {"ui": {"text": ["\n".join(notes)]}, "result": result}

    @staticmethod
    def _output(name: str, out: dict):
        """One of the node's outputs: IMAGE as it is, LATENT as ComfyUI's {"samples": tensor}."""
        if name == "images":
            return torch.from_numpy(out["images"])
        return {"samples": torch.from_numpy(out["latents"])}


class TPUVAEDecode:
    DESCRIPTION = ("Decodes a LATENT with the pipeline's own VAE on the chips (in its workers), as Sample decodes: "
                   "the pixels equal Sample's own IMAGE. For the pack's LATENT (Sample Latent, a latent hires fix) "
                   "and ComfyUI's (VAE Encode, Empty Latent Image) of the same model.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("IMAGE",)
    RETURN_NAMES = ("images",)
    OUTPUT_TOOLTIPS = ("The decoded images, ready for Save Image or Preview Image.",)
    FUNCTION = "decode"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "pipeline": ("TPU_PIPELINE", {"tooltip": "From Load TPU Pipeline: its VAE decodes."}),
                "samples": ("LATENT", {"tooltip": "A LATENT of this model (Sample, Sample Latent, VAE Encode with "
                                                  "its VAE)."}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    def decode(self, pipeline, samples, unique_id=None):
        images = comfy_bridge.run_cancellable(api.decode, pipeline, samples["samples"].cpu().float().numpy(),
                                              node_id=unique_id, total=1)
        return (torch.from_numpy(images),)


class TPUSampleLatent(TPUSample):
    DESCRIPTION = ("Sample (TPU) that gives only the LATENT: the VAE does not run, so a latent hires fix or a "
                   "refiner pays for one decode at the end (a last Sample (TPU), or ComfyUI's VAE Decode with "
                   "this model's VAE file). The same inputs as Sample (TPU).")
    RETURN_TYPES = ("LATENT",)
    RETURN_NAMES = ("latent",)
    OUTPUT_TOOLTIPS = (LATENT_TOOLTIP,)
    OUTPUTS = "latents"
