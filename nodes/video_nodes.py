"""Sample Video (TPU): a video pipeline's frames as ComfyUI's IMAGE batch, which its own Save Animated WEBP / Save
Video and the usual video nodes take, and the sound of a model that makes one (LTX-2) as ComfyUI's AUDIO, which
its Create Video takes beside the frames. Sampling itself is Sample's (api.sample); only the inputs differ.

A model without sound (Wan) gives None on the AUDIO output: Create Video then writes a video without an audio
stream, as before the output existed (a silent track would claim a sound the model never made).

Saved workflows store widget values by position: never reorder or remove inputs here; add new ones last, with
defaults (tests/test_node_contract.py guards this).
"""

from __future__ import annotations

import torch

from ..backend.controller import api
from ..backend.families.ltx2 import two_stage
from ..backend.protocol.errors import SampleError
from ..backend.protocol.messages import steps_per_image
from ..backend.protocol.spec import DEFAULT_FRAME_RATE, SampleRequest
from . import comfy_bridge
from .pipeline_nodes import CATEGORY


class TPUSampleVideo:
    DESCRIPTION = ("Generates a video with a video pipeline from Load TPU Pipeline (Wan 2.1 / 2.2, LTX-2 and "
                   "MiniMax H3 with sound; text to video, image to video from a start image, MiniMax H3's first / "
                   "last frame and reference images, with reference sounds, to video). The frames come out as an image "
                   "batch, one frame after another, for Create Video, Save Animated WEBP or any node that takes "
                   "frames; LTX-2's and MiniMax H3's sound comes out as audio for Create Video's audio input, and "
                   "an audio in (Load Audio) makes LTX-2's video to that sound (image + audio to video). The same "
                   "seed gives "
                   "the same video. Shows progress with seconds per step and can be cancelled.")
    CATEGORY = CATEGORY
    RETURN_TYPES = ("IMAGE", "AUDIO")
    RETURN_NAMES = ("frames", "audio")
    OUTPUT_TOOLTIPS = ("The video's frames in order (with several videos, one video after another).",
                       "The video's sound (LTX-2: stereo at its vocoder's rate, as long as the frames at frame_rate; "
                       "MiniMax H3: at its audio VAE's rate; with several videos, one waveform each). Models without "
                       "sound (Wan) give none: connect it "
                       "to Create Video, which then makes a video without sound.")
    FUNCTION = "sample"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "pipeline": ("TPU_PIPELINE", {"tooltip": "From Load TPU Pipeline: a video model (Wan, LTX-2, MiniMax H3)."}),
                "prompt": ("STRING", {"multiline": True, "default": "", "tooltip": "What the video should show."}),
                "negative_prompt": ("STRING", {"multiline": True, "default": "", "tooltip":
                                    "What the video should not show (used when guidance is above 1)."}),
                "width": ("INT", {"default": 832, "min": 16, "max": 8192, "step": 16, "tooltip":
                          "Frame width in pixels, a multiple of 16 for Wan (832 for 480p, 1280 for 720p), of 32 for LTX-2 and MiniMax H3."}),
                "height": ("INT", {"default": 480, "min": 16, "max": 8192, "step": 16, "tooltip":
                           "Frame height in pixels, a multiple of 16 for Wan (480 or 720), of 32 for LTX-2 and MiniMax H3."}),
                "frames": ("INT", {"default": 81, "min": 1, "max": 1021, "step": 1, "tooltip":
                           "Frames of the video: 1 + a multiple of 4 for Wan (81 is about 5 s at 16 fps), 1 + a multiple of 8 "
                           "for LTX-2 (121 is about 5 s at 24 fps), 5 + a multiple of 17 for MiniMax H3 (124 to 345, "
                           "24 fps); another count is refused naming the nearest that fits. "
                           "Time and memory grow with frames × width × height."}),
                "steps": ("INT", {"default": 30, "min": 1, "max": 1000, "tooltip":
                          "Denoising steps. Wan 2.1: 30-50; LTX-2 distilled: 8."}),
                "guidance": ("FLOAT", {"default": 5.0, "min": 0.0, "max": 30.0, "step": 0.1, "round": 0.01,
                             "tooltip": "How strongly to follow the prompt (CFG: above 1 runs the model twice per "
                                        "step, with the negative prompt). Wan 2.1: 5-6. LTX-2: the "
                                        "video's and the sound's CFG alike; distilled: 1. MiniMax H3: unused "
                                        "(guidance-distilled)."}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF, "control_after_generate": True,
                         "tooltip": "Random seed. The same seed, size, frames and settings give the same video."}),
            },
            "optional": {
                "batch_size": ("INT", {"default": 1, "min": 1, "max": 64, "tooltip":
                               "Videos per run; video i uses seed + i. With Data Parallel, the videos are split "
                               "across the replicas."}),
                "start_image": ("IMAGE", {"tooltip":
                                "Image to video: the first frame of the video (e.g. from Load Image), stretched to "
                                "width × height. Needs a model that takes one (Wan 2.2 TI2V 5B, Wan 2.2 I2V A14B, Wan "
                                "2.1 I2V, LTX-2, MiniMax H3); video i starts from image i of this batch (cycling when it has "
                                "fewer)."}),
                "frame_rate": ("FLOAT", {"default": DEFAULT_FRAME_RATE, "min": 1.0, "max": 240.0, "step": 1.0,
                                         "tooltip":
                               "Frames per second, for models that take it (LTX-2: the sound's length and the "
                               "motion's timing; give Create Video the same fps). Wan (16 fps; Wan 2.2 5B: 24) and "
                               "MiniMax H3 (24 fps) ignore it."}),
                "upscale_model": (["none", *comfy_bridge.safetensors_files("latent_upscale_models")],
                                  {"default": "none", "tooltip":
                                   "LTX-2's two-stage upscale, as ComfyUI's LTX-2.3 / 2.5 templates run it: an x2 "
                                   "latent upsampler from models/latent_upscale_models (ltx-2.3-spatial-upscaler-"
                                   "x2-*). The first stage makes the video at half of width × height (steps steps), "
                                   "the upsampler doubles its latents, a second stage refines them at full size "
                                   "on upscale_sigmas. width and height: multiples of 64. none: one stage at full "
                                   "size."}),
                "upscale_sigmas": ("STRING", {"default": "0.85, 0.725, 0.4219", "tooltip":
                                   "With upscale_model: the second stage's sigmas, as ComfyUI's ManualSigmas writes "
                                   "them (the templates': 0.85, 0.725, 0.4219; a last 0 may follow). One step each; "
                                   "the upscaled video is re-noised to the first."}),
                "audio_guidance": ("FLOAT", {"default": -1.0, "min": -1.0, "max": 30.0, "step": 0.1, "round": 0.01,
                                   "tooltip": "LTX-2: the sound's own CFG, as ComfyUI's LTXV Dual CFG Guider "
                                              "sets audio_cfg beside video_cfg (guidance). -1: the same as "
                                              "guidance. Either above 1 runs the negative prompt pass."}),
                "audio": ("AUDIO", {"tooltip":
                          "Image + audio to video (LTX-2): the video's sound, e.g. from Load Audio. The model keeps "
                          "it and makes frames that go with it (with start_image: from that first frame), so it "
                          "must last as long as the video (frames / frame_rate seconds; trim a longer one with "
                          "Trim Audio Duration). Resampled to the model's rate; mono is used on both channels. The "
                          "audio output gives it back as the model decodes it."}),
                "end_image": ("IMAGE", {"tooltip":
                              "The last frame of the video, for models that take one (MiniMax H3: first and last "
                              "frame to video; alone, the video ends on it). Cropped to the video's aspect; video i "
                              "ends on image i of this batch (cycling)."}),
                "reference_images": ("IMAGE", {"tooltip":
                                     "Reference images (subjects, style, scene) for models that take them (MiniMax "
                                     "H3: up to 9, in batch order; the prompt can name them <Picture 1>, <Picture "
                                     "2>, ...). Every video sees all of them. Not with a start or end image."}),
                "reference_audio": ("AUDIO", {"tooltip":
                                    "Reference sounds (a voice, music) for models that take them (MiniMax H3's "
                                    "reference to video, beside reference_images: up to 3, in batch order; the "
                                    "prompt names them <Audio 1>, <Audio 2>, ...), e.g. from Load Audio. Cut to the "
                                    "video's length and resampled to the model's rate."}),
            },
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    def sample(self, pipeline, prompt, negative_prompt, width, height, frames, steps, guidance, seed, batch_size=1,
               start_image=None, frame_rate=DEFAULT_FRAME_RATE, upscale_model="none",
               upscale_sigmas="0.85, 0.725, 0.4219", audio_guidance=-1.0, audio=None, end_image=None,
               reference_images=None, reference_audio=None, unique_id=None):
        started, queued = comfy_bridge.now(), comfy_bridge.queued_at()
        image = start_image.cpu().numpy() if start_image is not None else None
        request = SampleRequest(prompt=prompt, negative_prompt=negative_prompt, width=width, height=height,
                                steps=steps, guidance=guidance, seed=seed, batch_size=batch_size, frames=frames,
                                frame_rate=frame_rate, audio_guidance=audio_guidance,
                                **_upscale(upscale_model, upscale_sigmas))
        last = end_image.cpu().numpy() if end_image is not None else None
        refs = reference_images.cpu().numpy() if reference_images is not None else None
        prepared = api.prepare_sample(pipeline, request, image, audio=audio, end_image=last,  # resolved and checked
                                      references=refs, reference_audio=reference_audio)  # once, here
        if prepared.notes:
            comfy_bridge.send_text(unique_id, "\n".join(prepared.notes))
        out = comfy_bridge.run_cancellable(api.run_sample_outputs, prepared, node_id=unique_id,
                                           total=steps_per_image(prepared.req) * batch_size,  # both stages'
                                           after=" + the VAE decode")
        comfy_bridge.show_latency(unique_id, queued, started, list(prepared.notes))
        audio = None
        if "audio" in out:  # ComfyUI's AUDIO: waveform [batch, channels, samples] on the CPU
            audio = {"waveform": torch.from_numpy(out["audio"]), "sample_rate": int(out["audio_rate"][0])}
        return (torch.from_numpy(out["images"]), audio)


def _upscale(name: str, sigmas: str) -> dict:
    """The request's two-stage upscale: the upsampler file's path and stage 2's sigmas (none: one stage)."""
    if name == "none":
        return {}
    if not (path := comfy_bridge.folder_file("latent_upscale_models", name)):
        raise SampleError(f"upscale_model: {name!r} is not in ComfyUI's latent_upscale_models folders; put the "
                          "file in models/latent_upscale_models, or choose none.")
    try:
        return {"upscale_model": path, "upscale_sigmas": two_stage.parse_sigmas(sigmas)}
    except ValueError as e:
        raise SampleError(str(e)) from None
