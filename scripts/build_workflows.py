"""Builds the shipped UI workflows (workflows/<name>.json) in the real ComfyUI frontend.

Each workflow below is a spec: nodes by type with widget values *by name*, links by slot name, a Markdown note
and a description. The frontend (scripts/frontend.py, headless Chromium) creates the nodes, sets the widgets,
links them and saves the graph with app.graph.serialize(), so the positional `widgets_values` come out in the
frontend's own order, exactly as if an artist had built the graph by hand and saved it.

The JSON files are what ships (and what the tests load); this script is how they were made. Rerun it after
changing a spec, then `scripts/export_api_workflows.py` and `scripts/screenshots.py`:

    eval "$(bash scripts/bootstrap.sh)"; export COMFYUI_DIR
    "$VENV/bin/python" scripts/build_workflows.py [NAME ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from frontend import MODEL_INPUTS, USER_FILE_INPUTS, open_frontend  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / "workflows"

NOTE_COLOR = {"color": "#432", "bgcolor": "#653"}  # the frontend's own "brown" note colours


def _note(node_id: int, pos: list[int], text: str, size=(330, 330)) -> dict:
    return {"id": node_id, "type": "MarkdownNote", "title": "About this workflow", "pos": pos, "size": list(size),
            "widgets": {"text": text.strip()}, **NOTE_COLOR}


def _text_to_image(*, title: str, model: str, offload: str, prompt: str, width: int, height: int, steps: int,
                   guidance: float, seed: int, seed_control: str, prefix: str, note: str, description: str,
                   note_height: int, negative_prompt: str = "", batch_size: int = 1,
                   prompt_per_line: bool = False, between: tuple[tuple[str, dict], ...] = (),
                   files: dict | None = None, sampler: str = "", scheduler: str = "") -> dict:
    """Load TPU Pipeline -> [the nodes of `between`, in order] -> Sample (TPU) -> Save Image, with a note.
    Node ids: Load 1, Sample 2, Save 3, the note 4, then 5, 6, ... for `between` ((type, widgets) pairs).
    With `files` (the file inputs by name), the loader is Load TPU Pipeline (ComfyUI files) instead."""
    sample_widgets = {"prompt": prompt, "negative_prompt": negative_prompt, "width": width, "height": height,
                      "steps": steps, "guidance": guidance, "seed": seed,
                      "control_after_generate": seed_control, "batch_size": batch_size}
    if prompt_per_line:
        sample_widgets["prompt_per_line"] = True
    if sampler or scheduler:
        sample_widgets.update(sampler=sampler or "default", scheduler=scheduler or "default")
    x, middle, chain = 410, [], [1]
    for i, (node_type, widgets) in enumerate(between):
        middle.append({"id": 5 + i, "type": node_type, "pos": [x, 130], "size": [300, 0], "widgets": widgets})
        chain.append(5 + i)
        x += 340
    chain.append(2)
    return {
        "name": title,
        "nodes": [
            {"id": 1, "type": "LoadTPUPipeline", "pos": [40, 130], "size": [330, 180],
             "widgets": {"model": model, "dtype": "auto", "device": "auto", "offload": offload, "model_path": ""}}
            if files is None else
            {"id": 1, "type": "LoadTPUPipelineFiles", "pos": [40, 130], "size": [330, 300],
             "widgets": {**files, "dtype": "auto", "device": "auto", "offload": offload}},
            {"id": 2, "type": "TPUSample", "pos": [x, 130], "size": [400, 470], "widgets": sample_widgets},
            {"id": 3, "type": "SaveImage", "pos": [x + 440, 130], "size": [360, 470],
             "widgets": {"filename_prefix": prefix}},
            # with nodes in between, the note spans the width under Load and them
            _note(4, [40, 360 if files is None else 520], note, size=(x - 80 if between else 330, note_height)),
            *middle,
        ],
        "links": [[a, "pipeline", b, "pipeline"] for a, b in zip(chain[:-1], chain[1:], strict=True)]
        + [[2, "images", 3, "images"]],
        "extra": {"description": description},
    }


def _image_workflow(*, title: str, prompt: str, steps: int, denoise: float, seed: int, prefix: str, note: str,
                    description: str, grow_mask: int | None = None) -> dict:
    """Load TPU Pipeline (FLUX.1-schnell) and ComfyUI's Load Image -> Sample (image, and with `grow_mask` the
    image's mask through ComfyUI's Grow Mask) -> Save Image. Node ids: Load 1, Sample 2, Save 3, note 4, Load
    Image 5, Grow Mask 6."""
    sample = {"prompt": prompt, "negative_prompt": "", "width": 1024, "height": 1024, "steps": steps,
              "guidance": 0.0, "seed": seed, "control_after_generate": "randomize", "batch_size": 1,
              "prompt_per_line": False, "denoise": denoise, "size_from_image": True}
    nodes = [
        {"id": 1, "type": "LoadTPUPipeline", "pos": [40, 130], "size": [330, 180],
         "widgets": {"model": "FLUX.1-schnell", "dtype": "auto", "device": "auto", "offload": "model",
                     "model_path": ""}},
        {"id": 5, "type": "LoadImage", "pos": [40, 360], "size": [330, 380], "widgets": {"image": "example.png"}},
        {"id": 2, "type": "TPUSample", "pos": [750 if grow_mask is not None else 410, 130], "size": [400, 560],
         "widgets": sample},
        {"id": 3, "type": "SaveImage", "pos": [1190 if grow_mask is not None else 850, 130], "size": [360, 470],
         "widgets": {"filename_prefix": prefix}},
        _note(4, [40, 790], note, size=(700 if grow_mask is not None else 770, 300)),
    ]
    links = [[1, "pipeline", 2, "pipeline"], [5, "IMAGE", 2, "image"], [2, "images", 3, "images"]]
    if grow_mask is not None:
        nodes.append({"id": 6, "type": "GrowMask", "pos": [410, 360], "size": [300, 0],
                      "widgets": {"expand": grow_mask, "tapered_corners": True}})
        links += [[5, "MASK", 6, "mask"], [6, "MASK", 2, "mask"]]
    return {"name": title, "nodes": nodes, "links": links, "extra": {"description": description}}


FLUX1_TEXT_FILES = {"text_encoder_1": "clip_l.safetensors", "text_encoder_2": "t5xxl_fp8_e4m3fn.safetensors",
                    "text_encoder_3": "(none)", "vae": "ae.safetensors", "checkpoint": "(none)"}


def _flux1_tool(*, title: str, diffusion_model: str, prompt: str, steps: int, guidance: float, prefix: str,
                note: str, description: str, pad: dict | None = None) -> dict:
    """Load TPU Pipeline (ComfyUI files: a FLUX.1 tool's diffusion model, clip_l, t5xxl, ae) and ComfyUI's Load
    Image -> [with `pad`: Pad Image for Outpainting, its image and mask] -> Sample (size from the image) -> Save
    Image. Node ids: Load 1, Sample 2, Save 3, note 4, Load Image 5, Pad 6."""
    sample = {"prompt": prompt, "negative_prompt": "", "width": 1024, "height": 1024, "steps": steps,
              "guidance": guidance, "seed": 0, "control_after_generate": "randomize", "batch_size": 1,
              "prompt_per_line": False, "denoise": 1.0, "size_from_image": True}
    x = 750 if pad is not None else 410
    nodes = [
        {"id": 1, "type": "LoadTPUPipelineFiles", "pos": [40, 130], "size": [330, 300],
         "widgets": {"diffusion_model": diffusion_model, **FLUX1_TEXT_FILES, "dtype": "auto", "device": "auto",
                     "offload": "model", "flux_kontext": "auto"}},
        {"id": 5, "type": "LoadImage", "pos": [40, 520], "size": [330, 380], "widgets": {"image": "example.png"}},
        {"id": 2, "type": "TPUSample", "pos": [x, 130], "size": [400, 560], "widgets": sample},
        {"id": 3, "type": "SaveImage", "pos": [x + 440, 130], "size": [360, 470],
         "widgets": {"filename_prefix": prefix}},
        _note(4, [40, 950], note, size=(x + 800, 280)),
    ]
    links = [[1, "pipeline", 2, "pipeline"], [2, "images", 3, "images"]]
    if pad is None:
        links.append([5, "IMAGE", 2, "image"])
    else:
        nodes.append({"id": 6, "type": "ImagePadForOutpaint", "pos": [410, 520], "size": [300, 0], "widgets": pad})
        links += [[5, "IMAGE", 6, "image"], [6, "IMAGE", 2, "image"], [6, "MASK", 2, "mask"]]
    return {"name": title, "nodes": nodes, "links": links, "extra": {"description": description}}
def _qwen_edit_int8() -> dict:
    """ComfyUI's 'Qwen Image Edit 2511 Int8' template with the pack's nodes: Load TPU Pipeline (ComfyUI files: its
    int8 ConvRot diffusion model, Qwen2.5-VL, its VAE) and Load Image -> Sample (the picture as the reference, 40
    steps, guidance 4: the template's values with its 4-step LoRA off) -> Save Image."""
    sample = {"prompt": "Convert this image to pop art poster style", "negative_prompt": "", "width": 1024,
              "height": 1024, "steps": 40, "guidance": 4.0, "seed": 0, "control_after_generate": "randomize",
              "batch_size": 1, "prompt_per_line": False, "denoise": 1.0, "size_from_image": True}
    note = """
## Qwen Image Edit 2511 Int8 (ComfyUI's template, the pack's nodes)

ComfyUI's **Qwen Image Edit 2511 Int8** template as **Load TPU Pipeline (ComfyUI files)** and **Load Image** →
**Sample (TPU)** (the picture as the reference, the instruction as the prompt, 40 steps, guidance 4, size from
the picture) → **Save Image**.

**Files**: the template's own: `models/diffusion_models/qwen_image_edit_2511_int8_convrot.safetensors`,
`models/text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors`, `models/vae/qwen_image_vae.safetensors`. The int8
weights stay quantized, each layer dequantized as it runs (docs/quantized.md).

The template's 4-step Lightning LoRA is off by default there: to use it, add Load LoRA (TPU) with it and set
steps 4, guidance 1.
"""
    nodes = [
        {"id": 1, "type": "LoadTPUPipelineFiles", "pos": [40, 130], "size": [330, 300],
         "widgets": {"diffusion_model": "qwen_image_edit_2511_int8_convrot.safetensors",
                     "text_encoder_1": "qwen_2.5_vl_7b_fp8_scaled.safetensors", "text_encoder_2": "(none)",
                     "text_encoder_3": "(none)", "vae": "qwen_image_vae.safetensors", "checkpoint": "(none)",
                     "dtype": "auto", "device": "auto", "offload": "auto"}},
        {"id": 5, "type": "LoadImage", "pos": [40, 520], "size": [330, 380], "widgets": {"image": "example.png"}},
        {"id": 2, "type": "TPUSample", "pos": [410, 130], "size": [400, 560], "widgets": sample},
        {"id": 3, "type": "SaveImage", "pos": [850, 130], "size": [360, 470], "widgets": {"filename_prefix": "Qwen_Edit_2511"}},
        _note(4, [40, 950], note, size=(1170, 300)),
    ]
    links = [[1, "pipeline", 2, "pipeline"], [2, "images", 3, "images"], [5, "IMAGE", 2, "image"]]
    return {"name": "qwen_image_edit_2511_int8", "nodes": nodes, "links": links, "extra": {"description": (
        "ComfyUI's 'Qwen Image Edit 2511 Int8' template with the pack's nodes and the same files: Load TPU Pipeline "
        "(ComfyUI files: qwen_image_edit_2511_int8_convrot, qwen_2.5_vl_7b_fp8_scaled, qwen_image_vae) and Load "
        "Image -> Sample (40 steps, guidance 4, size from the picture) -> Save Image.")}}


def _redux_workflow() -> dict:
    """Load TPU Pipeline (ComfyUI files: flux1-dev, clip_l, t5xxl, ae) -> Apply Redux (TPU) with ComfyUI's Load Image
    as the reference -> Sample -> Save Image. Node ids: Load 1, Sample 2, Save 3, note 4, Load Image 5, Redux 6."""
    sample = {"prompt": "a cozy reading corner, same mood and colours", "negative_prompt": "", "width": 1024,
              "height": 1024, "steps": 28, "guidance": 3.5, "seed": 0, "control_after_generate": "randomize",
              "batch_size": 1}
    nodes = [
        {"id": 1, "type": "LoadTPUPipelineFiles", "pos": [40, 130], "size": [330, 330],
         "widgets": {"diffusion_model": "flux1-dev.safetensors", **FLUX1_TEXT_FILES, "dtype": "auto",
                     "device": "auto", "offload": "model", "flux_kontext": "auto"}},
        {"id": 5, "type": "LoadImage", "pos": [40, 510], "size": [330, 380], "widgets": {"image": "example.png"}},
        {"id": 6, "type": "TPUApplyRedux", "pos": [410, 130], "size": [340, 0],
         "widgets": {"style_model_name": "flux1-redux-dev.safetensors",
                     "clip_vision_name": "sigclip_vision_patch14_384.safetensors", "prompt_embeds_scale": 1.0,
                     "pooled_prompt_embeds_scale": 1.0, "text": "prompt and image"}},
        {"id": 2, "type": "TPUSample", "pos": [790, 130], "size": [400, 470], "widgets": sample},
        {"id": 3, "type": "SaveImage", "pos": [1230, 130], "size": [360, 470], "widgets": {"filename_prefix": "flux1-redux"}},
        _note(4, [410, 320], """
## FLUX.1 Redux: images in the manner of a reference

**Load Image** (the reference) → **Apply Redux (TPU)** on the FLUX.1-dev pipeline → **Sample** → **Save Image**.

**Files**, where ComfyUI's own Load Style Model and Load CLIP Vision look: `models/style_models/flux1-redux-dev.safetensors`,
`models/clip_vision/sigclip_vision_patch14_384.safetensors`; and FLUX.1-dev's `flux1-dev`, `clip_l`,
`t5xxl_fp8_e4m3fn`, `ae`. The workers run diffusers' FluxPriorReduxPipeline: the reference (stretched to 384x384)
becomes tokens after the prompt's. `text` **image only** makes variations without the prompt. The scales are
diffusers' (they scale the prompt's tokens too); chain more Apply Redux nodes to mix references.
""", size=(340, 560)),
    ]
    links = [[1, "pipeline", 6, "pipeline"], [5, "IMAGE", 6, "image"], [6, "pipeline", 2, "pipeline"],
             [2, "images", 3, "images"]]
    return {"name": "flux1_redux", "nodes": nodes, "links": links, "extra": {"description": (
        "FLUX.1 Redux: Load Image (the reference) -> Apply Redux (TPU) (flux1-redux-dev in models/style_models, "
        "sigclip_vision_patch14_384 in models/clip_vision) on Load TPU Pipeline (ComfyUI files: flux1-dev, clip_l, "
        "t5xxl_fp8_e4m3fn, ae) -> Sample (1024x1024, 28 steps, guidance 3.5) -> Save Image.")}}


def _controlnet_workflow(*, name: str, model: str, controlnets: list[dict], canny: tuple[float, float], prompt: str,
                         negative_prompt: str, steps: int, guidance: float, note: str, description: str,
                         files: dict | None = None) -> dict:
    """Load TPU Pipeline -> Apply ControlNet (TPU) x len(controlnets) -> Sample -> Save Image; the first ControlNet's
    image from ComfyUI's Load Image through its own Canny node, each further one from a Load Image of its own.
    With `files` (the file inputs by name), the loader is Load TPU Pipeline (ComfyUI files).
    Node ids: Load 1, Sample 2, Save 3, note 4, Load Image 5, Canny 6, Apply ControlNet 7, 8, ..., further Load
    Image 20, 21, ..."""
    low, high = canny
    image_y = 360 if files is None else 500
    nodes = [
        {"id": 1, "type": "LoadTPUPipeline", "pos": [40, 130], "size": [330, 180],
         "widgets": {"model": model, "dtype": "auto", "device": "auto", "offload": "auto", "model_path": ""}}
        if files is None else
        {"id": 1, "type": "LoadTPUPipelineFiles", "pos": [40, 130], "size": [330, 300],
         "widgets": {**files, "dtype": "auto", "device": "auto", "offload": "auto"}},
        {"id": 5, "type": "LoadImage", "pos": [40, image_y], "size": [330, 380], "widgets": {"image": "example.png"}},
        {"id": 6, "type": "Canny", "pos": [410, 520], "size": [300, 0],
         "widgets": {"low_threshold": low, "high_threshold": high}},
    ]
    links = []
    x, source = 410, 1
    for i, widgets in enumerate(controlnets):
        nodes.append({"id": 7 + i, "type": "TPUApplyControlNet", "pos": [x, 130], "size": [320, 0],
                      "widgets": {k: v for k, v in widgets.items() if k != "picture"}})
        links.append([source, "pipeline", 7 + i, "pipeline"])
        if i == 0:
            links += [[5, "IMAGE", 6, "image"], [6, "IMAGE", 7, "image"]]
        else:
            nodes.append({"id": 20 + i, "type": "LoadImage", "pos": [x, 520], "size": [320, 380],
                          "widgets": {"image": widgets["picture"]}})
            links.append([20 + i, "IMAGE", 7 + i, "image"])
        source, x = 7 + i, x + 360
    sample = {"prompt": prompt, "negative_prompt": negative_prompt, "width": 1024, "height": 1024, "steps": steps,
              "guidance": guidance, "seed": 0, "control_after_generate": "randomize", "batch_size": 1}
    nodes += [{"id": 2, "type": "TPUSample", "pos": [x, 130], "size": [400, 470], "widgets": sample},
              {"id": 3, "type": "SaveImage", "pos": [x + 440, 130], "size": [360, 470],
               "widgets": {"filename_prefix": name.replace("_", "-")}},
              _note(4, [40, 960], note, size=(x - 80, 300))]
    links += [[source, "pipeline", 2, "pipeline"], [2, "images", 3, "images"]]
    return {"name": name, "nodes": nodes, "links": links, "extra": {"description": description}}


def _wan_video(*, name: str, model: str, prompt: str, negative_prompt: str, frames: int, steps: int, prefix: str,
               note: str, description: str, start_image: bool = False, files: dict | None = None,
               size: tuple[int, int] = (832, 480), fps: float = 16.0, guidance: float = 5.0) -> dict:
    """Load TPU Pipeline (a Wan diffusers folder; with `files`, Load TPU Pipeline (ComfyUI files)) [and ComfyUI's
    Load Image as the start image] -> Sample Video (TPU) -> ComfyUI's own Save Animated WEBP (with
    `files`: ComfyUI's own Save WEBM, a video file), with a note. Node ids: Load 1, Sample Video 2, Save 3, the
    note 4, Load Image 5."""
    sample = {"prompt": prompt, "negative_prompt": negative_prompt, "width": size[0], "height": size[1],
              "frames": frames, "steps": steps, "guidance": guidance, "seed": 0, "control_after_generate": "randomize",
              "batch_size": 1}
    nodes = [
        {"id": 1, "type": "LoadTPUPipeline", "pos": [40, 130], "size": [330, 180],
         "widgets": {"model": model, "dtype": "auto", "device": "auto", "offload": "auto", "model_path": ""}}
        if files is None else
        {"id": 1, "type": "LoadTPUPipelineFiles", "pos": [40, 130], "size": [330, 330],
         "widgets": {"dtype": "auto", "device": "auto", "offload": "auto", "flux_kontext": "auto",
                     "diffusion_model_2": "(none)", **files}},
        {"id": 2, "type": "TPUSampleVideo", "pos": [410, 130], "size": [400, 500], "widgets": sample},
        {"id": 3, "type": "SaveAnimatedWEBP", "pos": [850, 130], "size": [420, 500],
         "widgets": {"filename_prefix": prefix, "fps": fps, "lossless": False, "quality": 90, "method": "default"}}
        if files is None else
        {"id": 3, "type": "SaveWEBM", "pos": [850, 130], "size": [420, 500],
         "widgets": {"filename_prefix": prefix, "codec": "vp9", "fps": fps, "crf": 32.0}},
    ]
    links = [[1, "pipeline", 2, "pipeline"], [2, "frames", 3, "images"]]
    below = 360 if files is None else 560  # under the loader
    if start_image:
        nodes.append({"id": 5, "type": "LoadImage", "pos": [40, below], "size": [330, 380],
                      "widgets": {"image": "example.png"}})
        links.append([5, "IMAGE", 2, "start_image"])
    nodes.append(_note(4, [40, below + 430] if start_image else [40, 360 if files is None else 510], note,
                       size=(770, 300) if start_image else (330, 330)))
    return {"name": name, "nodes": nodes, "links": links, "extra": {"description": description}}


def _ltx2_text_to_video() -> dict:
    """Load TPU Pipeline (an LTX-2 diffusers folder) -> Sample Video (TPU) -> its frames and its sound into ComfyUI's
    own Create Video -> Save Video (an mp4 with both streams). Node ids: Load 1, Sample Video 2, Create Video 3,
    the note 4, Save Video 5."""
    sample = {"prompt": "a jazz trio playing in a small smoky club at night, close up on the saxophone, warm light, "
                        "the crowd murmuring", "negative_prompt": "", "width": 768, "height": 512, "frames": 121,
              "steps": 8, "guidance": 1.0, "seed": 0, "control_after_generate": "randomize", "batch_size": 1,
              "frame_rate": 24.0}
    note = """
## LTX-2 text to video, with sound

**Load TPU Pipeline** (LTX-2) → **Sample Video (TPU)** (768×512, 121 frames at **24 fps**, **8 steps, guidance
1**) → its **frames** and its **audio** into ComfyUI's own **Create Video** (fps 24) → **Save Video** (an mp4:
H.264 and AAC).

**Model**: a diffusers folder of LTX-2 (model_index.json naming LTX2Pipeline, with its `audio_vae` and `vocoder`)
in `models/diffusers/LTX-2`. The templates' distilled model runs at guidance 1 (one pass a step); the dev model
takes guidance 3-4 (CFG: two passes, which CFG Parallel splits over two chips). ComfyUI's own files load too, in
Load TPU Pipeline (ComfyUI files): ltx-2.3-22b-dev-fp8.safetensors in checkpoint, gemma_3_12B_it_fp4_mixed in
text_encoder_1.

A video has 1 + a multiple of 8 frames, sides multiples of 32. Give Create Video the frame_rate of Sample
Video: the sound lasts frames / frame_rate seconds. A start image (Load Image into start_image) makes it image to
video.
"""
    return {
        "name": "ltx2_t2v_sound",
        "nodes": [
            {"id": 1, "type": "LoadTPUPipeline", "pos": [40, 130], "size": [330, 180],
             "widgets": {"model": "LTX-2", "dtype": "auto", "device": "auto", "offload": "auto", "model_path": ""}},
            {"id": 2, "type": "TPUSampleVideo", "pos": [410, 130], "size": [400, 540], "widgets": sample},
            {"id": 3, "type": "CreateVideo", "pos": [850, 130], "size": [300, 120], "widgets": {"fps": 24.0}},
            {"id": 5, "type": "SaveVideo", "pos": [1190, 130], "size": [420, 500],
             "widgets": {"filename_prefix": "video/ltx2-t2v", "format": "auto", "codec": "auto"}},
            _note(4, [40, 360], note, size=(330, 420)),
        ],
        "links": [[1, "pipeline", 2, "pipeline"], [2, "frames", 3, "images"], [2, "audio", 3, "audio"],
                  [3, 0, 5, "video"]],
        "extra": {"description": "LTX-2 text to video with sound: Load TPU Pipeline (LTX-2) -> Sample Video (768x512, "
                                 "121 frames at 24 fps, 8 steps, guidance 1) -> frames and audio -> Create Video "
                                 "(24 fps) -> Save Video (mp4 with sound). Needs models/diffusers/LTX-2."},
    }


# The prompts of ComfyUI's templates (comfyui-workflow-templates 0.1.123), as they ship
LTX23_I2V_PROMPT = 'Egyptian royal in blue-and-gold headdress and high collar, white dress with golden embroidery and armbands, desert, robot soldiers in formation left and right. She walks steadily forward, head held level and gaze fixed ahead—no dipping or lowering of the head. The camera performs a single, smooth push-in only: starting in a wider shot of her, the robots, and the desert, it moves steadily forward until she is in a medium or medium-close frame, then holds. She stops, posture and head still upright, and says: “The old gods are silent. I am not.” Robot soldiers shift or march in place; sand and fabric move with the wind. No pull-back; the only camera move is the continuous push-in.'
LTX25_T2V_PROMPT = "A close-up of an Arctic hunter's face, his eyes fixed straight ahead, narrowed and locked on something in the far distance directly in front of him, frost dusting his dark beard, one hand slowly reaching toward the rifle slung on his back, his breath quick and shallow, the tension in his jaw visible even through the scarf. The camera slowly pulls back, revealing him crouched at the edge of an ice floe, and ahead of him, in the exact direction of his gaze, a polar bear moves slowly along a distant ice ridge, its pale coat blending into the white haze, facing toward him. The pull-back continues, the hunter in the foreground and the bear far ahead, the two facing each other across the dark lead of water, the ice field and grey sea stretching around them, seabirds wheeling overhead. Midway through the shot, the complete title \"LTX-2.5\" fades in large and centered, plain white sans-serif letters with wide spacing, no glow, no shadow, no ornament, the lettering large enough to dominate the center of the frame, emerging slowly from the mist, resting still and blending into the snowscape, with the hunter and the bear still visible below on either side of the title, staying through the end of the scene. The wind carries the distant sound of shifting ice, a single low growl rolling across the water."
LTX25_I2V_PROMPT = "Use the provided start image as the first frame. The cybernetic figure slowly turns his head to the right, his glowing blue eyes scanning the horizon, mechanical joints in his neck whirring faintly. The camera follows his gaze, panning across the rooftop to reveal the city beyond: a river of light winding between dark towers, a flying vehicle gliding past between the buildings, its lights streaking. He watches it pass, then his eyes narrow slightly. The camera settles on his profile against the city glow, distant hover traffic humming, wind gusting across the rooftop. No text, no black frames."
IDEOGRAM4_PROMPT = '{\n    "high_level_description": "A surreal streetwear mixed-media collage poster featuring a relaxed skateboarder mid-air against a vibrant blue sky, backed by giant puffy 3D letters spelling \'COMFY\'. The composition blends retro magazine cutout aesthetics with grunge elements like torn paper banners and distressed red stamps, conveying an effortless, cozy vibe.",\n    "style_description": {\n        "aesthetics": "Retro magazine cutout style, mixed-media digital collage, high-contrast streetwear graphic, featuring rough ripped paper edges and distressed grunge textures.",\n        "lighting": "High-contrast flash mixed with harsh midday sunlight on the skater cutout, contrasting with flat, bright graphic lighting on the 3D typography.",\n        "photo": "Vintage grainy 35mm film with distressed halftone scan textures and subtle light leaks.",\n        "medium": "Mixed-media digital collage",\n        "color_palette": ["#1E73BE", "#FDFDFD", "#C82A2A", "#657C9C", "#EFEFEF"]\n    },\n    "compositional_deconstruction": {\n        "background": "A vibrant, clear blue sky layered with a vintage grainy film texture and subtle halftone dot patterns, transitioning down to an implied pale gray concrete ramp at the very bottom edge.",\n        "elements": [\n            {\n                "type": "obj",\n                "bbox": [128, 149, 354, 810],\n                "desc": "Massive 3D puffy, inflatable white typography spelling \'COMFY\'. The letters stretch across the upper half of the canvas, acting as a surreal, soft cloud-like backdrop.",\n                "color_palette": ["#FDFDFD", "#E0E0E0", "#D3DBE2"]\n            },\n            {\n                "type": "obj",\n                "bbox": [459, 37, 727, 264],\n                "desc": "A cluster of oversized, distressed red stamped circles and dots, applied loosely to the midground like a grunge ink stamp, partially obscuring the bottom left of the text.",\n                "color_palette": ["#C82A2A", "#A11D1D"]\n            },\n            {\n                "type": "obj",\n                "bbox": [23, 366, 153, 666],\n                "desc": "A vertically oriented, torn paper side banner pinned to the left edge. The rough-edged paper displays the bold, stamped text \'STAY COZY\' in high-contrast black ink.",\n                "color_palette": ["#EFEFEF", "#1A1A1A", "#C82A2A"]\n            },\n            {\n                "type": "obj",\n                "bbox": [287, 210, 756, 819],\n                "desc": "A sharp photographic cutout of a skateboarder mid-air in a relaxed pose. He wears loose-fitting washed denim jeans and a plain white tee, appearing to effortlessly float above the concrete ramp. A distinct white cutout border surrounds his silhouette.",\n                "color_palette": ["#FDFDFD", "#657C9C", "#2B2B2B", "#DCA57D"]\n            },\n            {\n                "type": "obj",\n                "bbox": [773, 39, 973, 187],\n                "desc": "A surreal, miniature floating skateboard cutout, positioned playfully in the upper right sky as if defying gravity.",\n                "color_palette": ["#D2A679", "#2B2B2B", "#C82A2A"]\n            },\n            {\n                "type": "obj",\n                "bbox": [105, 830, 905, 980],\n                "desc": "A wide, horizontal strip of heavily textured torn paper spanning the lower third of the composition. It features the bold typographic phrase \'BEYOND THE COMFORT ZONE\' intermixed with \'EFFORTLESS RIDE\' alongside ripped edges that reveal the background.",\n                "color_palette": ["#EFEFEF", "#1A1A1A", "#999999"]\n            }\n        ]\n    }\n}'


def _ltx2_image_to_video() -> dict:
    """ComfyUI's video_ltx2_3_i2v template on the pack, in its two stages: Load Image (the start frame) and Load
    TPU Pipeline (ComfyUI files: its LTX-2.3 dev checkpoint and Gemma 3) -> Load LoRA (TPU) (its distilled LoRA at 0.5) -> Sample Video (TPU) with the x2
    spatial upscaler -> frames and sound into ComfyUI's own Create Video -> Save Video. Node ids: Load 1, Sample
    Video 2, Create Video 3, the note 4, Save Video 5, Load Image 6, Load LoRA 7."""
    return _ltx2_two_stage(
        name="video_ltx2_3_i2v", model="", files=LTX23_FILES, start_image=True, prompt=LTX23_I2V_PROMPT,
        frame_rate=25.0,
        upscaler="ltx-2.3-spatial-upscaler-x2-1.1.safetensors", audio_guidance=-1.0, prefix="video/ltx2-i2v",
        lora="ltx_2.3_22b_distilled_1.1_lora_dynamic_fro09_avg_rank_111_bf16.safetensors",
        description="LTX-2.3 image to video with sound, as ComfyUI's video_ltx2_3_i2v template: Load Image (start "
                    "frame) + Load TPU Pipeline (ComfyUI files: ltx-2.3-22b-dev-fp8, gemma_3_12B_it_fp4_mixed) -> "
                    "Load LoRA (its distilled LoRA, 0.5) -> Sampling Options (its stage-1 ManualSigmas) -> Sample "
                    "Video (1280x704, 121 frames at 25 fps, 8 steps at half size, guidance 1, then the x2 spatial "
                    "upscaler and 3 steps on 0.85, 0.725, 0.4219) -> frames and audio -> Create Video (25 fps) -> "
                    "Save Video (mp4 with sound). Needs the template's files: the checkpoint in models/checkpoints, "
                    "Gemma in models/text_encoders, the LoRA in models/loras and the upscaler in "
                    "models/latent_upscale_models.",
        note="""
## LTX-2.3 image to video, with sound, in two stages

**Load Image** (the first frame) and **Load TPU Pipeline (ComfyUI files)** (LTX-2.3 dev) → **Load LoRA (TPU)** (the template's
distilled LoRA at **0.5**) → **Sampling Options** (`sigmas`: the template's stage-1 ManualSigmas) → **Sample
Video (TPU)** (`start_image`; 1280×704, 121 frames at **25 fps**, **8 steps, guidance 1**, `upscale_model` the
×2 spatial upscaler) → **Create Video** (fps 25) → **Save Video**.

As ComfyUI's `video_ltx2_3_i2v` template runs it: 8 distilled steps at half size (640×352) on its stage-1
ManualSigmas **1.0, 0.99375, 0.9875, 0.98125, 0.975, 0.909375, 0.725, 0.421875** (Sampling Options' `sigmas`,
run as given), its ×2 latent upscaler (`ltx-2.3-spatial-upscaler-x2-1.1` in `models/latent_upscale_models`),
then 3 steps at full size on its ManualSigmas **0.85, 0.725, 0.4219** (`upscale_sigmas`), with the stage-1
sound carried over; Euler in both, as the template. 1280×720 and 126 frames become 1280×704 (two stages:
multiples of 64) and 121 frames (8k + 1). Not carried over: its start-frame strength 0.7 (the start frame at
full strength) and its prompt enhancer (off by default).

**Files**: the template's own: `models/checkpoints/ltx-2.3-22b-dev-fp8.safetensors` (the DiT, both VAEs, the
vocoder) and `models/text_encoders/gemma_3_12B_it_fp4_mixed.safetensors` (kept quantized). A diffusers folder of
LTX-2.3 dev loads too, in Load TPU Pipeline (`LTX-2`). The template's Gemma LoRA (`gemma-3-12b-it-abliterated_lora_rank64_bf16`, LoraLoader 1 / 1) feeds only its
prompt enhancer (TextGenerateLTX2Prompt, off by default): the prompt is encoded without it, so the video does
not depend on it (diffusers' LTX-2 LoRA loader takes the transformer and connectors only, no Gemma).
""")


# the LTX-2.3 / 2.5 templates' stage-1 ManualSigmas (diffusers' DISTILLED_SIGMA_VALUES, then ComfyUI's final 0)
LTX23_STAGE1_SIGMAS = "1.0, 0.99375, 0.9875, 0.98125, 0.975, 0.909375, 0.725, 0.421875, 0.0"
# LTX-2.3's files as its templates name them (Load TPU Pipeline (ComfyUI files): the all-in-one checkpoint and Gemma 3)
LTX23_FILES = {"diffusion_model": "(none)", "text_encoder_1": "gemma_3_12B_it_fp4_mixed.safetensors",
               "text_encoder_2": "(none)", "text_encoder_3": "(none)", "vae": "(none)",
               "checkpoint": "ltx-2.3-22b-dev-fp8.safetensors"}


def _ltx2_two_stage(*, name: str, model: str, start_image: bool, prompt: str, frame_rate: float, upscaler: str,
                    audio_guidance: float, prefix: str, description: str, note: str, lora: str = "",
                    negative: str = "pc game, console game, video game, cartoon, childish, ugly",
                    files: dict | None = None, frames: int = 121, image: str = "example.png",
                    audio: str = "") -> dict:
    """An LTX-2.3 / 2.5 template on the pack: [Load Image ->] Load TPU Pipeline (with `files`: Load TPU Pipeline
    (ComfyUI files)) [-> Load LoRA] [and Load Audio, the sound kept] -> Sample Video with the x2 upscaler
    (1280x704, 121 frames, 8 steps, guidance 1; stage 2 on the templates' sigmas) -> Create Video -> Save Video.
    Stage 1 runs the templates' own ManualSigmas (LTX23_STAGE1_SIGMAS) as Sampling Options' sigmas, the 8 steps
    following them. Node ids: Load 1, Sample Video 2, Create Video 3, the note 4, Save Video 5, Load Image 6, Load
    LoRA 7, Load Audio 8, Sampling Options 9."""
    sample = {"prompt": prompt, "negative_prompt": negative, "width": 1280, "height": 704, "frames": frames,
              "steps": 8, "guidance": 1.0, "seed": 0, "control_after_generate": "randomize", "batch_size": 1,
              "frame_rate": frame_rate, "upscale_model": upscaler, "upscale_sigmas": "0.85, 0.7250, 0.4219, 0.0",
              "audio_guidance": audio_guidance}
    below = 130 if files is None else 310  # the files loader is taller
    nodes = [{"id": 1, "type": "LoadTPUPipeline", "pos": [40, 130], "size": [330, 180],
              "widgets": {"model": model, "dtype": "auto", "device": "auto", "offload": "auto", "model_path": ""}}
             if files is None else
             {"id": 1, "type": "LoadTPUPipelineFiles", "pos": [40, 130], "size": [330, 330],
              "widgets": {**files, "dtype": "auto", "device": "auto", "offload": "auto"}},
             {"id": 9, "type": "TPUSamplingOptions", "pos": [410, 130], "size": [300, 0],
              "widgets": {"prompt_cache": True, "batched": False, "true_cfg_scale": 1.0, "step_cache": "off",
                          "cache_threshold": 0.0, "sigmas": LTX23_STAGE1_SIGMAS}},
             {"id": 2, "type": "TPUSampleVideo", "pos": [750, 130], "size": [400, 640], "widgets": sample},
             {"id": 3, "type": "CreateVideo", "pos": [1190, 130], "size": [300, 120], "widgets": {"fps": frame_rate}},
             {"id": 5, "type": "SaveVideo", "pos": [1530, 130], "size": [420, 500],
              "widgets": {"filename_prefix": prefix, "format": "auto", "codec": "auto"}},
             _note(4, [40, 820] if files is None else [410, 820], note, size=(770, 400))]
    links = [[2, "frames", 3, "images"], [2, "audio", 3, "audio"], [3, 0, 5, "video"], [9, "pipeline", 2, "pipeline"]]
    if lora:
        nodes.append({"id": 7, "type": "TPULoadLoRA", "pos": [40, below + 210], "size": [330, 130],
                      "widgets": {"lora_name": lora, "strength": 0.5, "strength_text_encoder": 1.0}})
        links += [[1, "pipeline", 7, "pipeline"], [7, "pipeline", 9, "pipeline"]]
    else:
        links.append([1, "pipeline", 9, "pipeline"])
    if start_image:
        nodes.append({"id": 6, "type": "LoadImage", "pos": [40, below + (370 if lora else 230)], "size": [330, 300],
                      "widgets": {"image": image}})
        links.append([6, "IMAGE", 2, "start_image"])
    if audio:
        nodes.append({"id": 8, "type": "LoadAudio", "pos": [40, below + 720], "size": [330, 140],
                      "widgets": {"audio": audio}})
        links.append([8, "AUDIO", 2, "audio"])
    return {"name": name, "nodes": nodes, "links": links, "extra": {"description": description}}


_LTX25_NOTE = """
## LTX-2.5 {what}, with sound, in two stages

{load}**Load TPU Pipeline** (LTX-2.5 distilled) → **Sampling Options** (`sigmas`: the template's stage-1
ManualSigmas) → **Sample Video (TPU)** ({start}1280×704, 121 frames at **24 fps**, **8 steps, guidance 1,
audio_guidance 1**, `upscale_model` its ×2 latent upscaler) → **Create Video** (fps 24) → **Save Video** (mp4
with sound).

As ComfyUI's `{name}` template runs it: 8 distilled steps at half size on its stage-1 ManualSigmas **1.0,
0.99375, 0.9875, 0.98125, 0.975, 0.909375, 0.725, 0.421875** (Sampling Options' `sigmas`, run as given), its ×2
latent upscaler (`ltx-2.5-latent-spatial-upscaler-x2-bf16-1.0` in `models/latent_upscale_models`), then 3 steps
at full size on its ManualSigmas **0.85, 0.725, 0.4219** (`upscale_sigmas`). Its **LTXV Dual CFG Guider**
(video_cfg 1, audio_cfg 1) is `guidance` and `audio_guidance`: plain CFG on the video and on the sound, one pass
a step at 1. 1280×720 becomes 1280×704 (two stages: multiples of 64); 5 s at 24 fps is 121 frames. Not carried
over: its `euler_ancestral` sampler in both stages (Euler runs: diffusers' LTXEulerAncestralRFScheduler would
draw each step's noise without the call's generator, since LTX2Pipeline hands scheduler.step none, so the video
would not follow the seed){strength} and the Gemma 4 prompt enhancer (on in the template).

**Model**: a diffusers folder of LTX-2.5 in `models/diffusers/LTX-2.5` (LTX2Pipeline with its Gemma 4 text
encoder, as diffusers 0.42.1 loads it); ComfyUI's split `ltx-2.5-*` files do not load yet.
"""


def _ltx25(image: bool) -> dict:
    """ComfyUI's video_ltx2_5_t2v / video_ltx2_5_i2v templates on the pack (_ltx2_two_stage)."""
    name = "video_ltx2_5_i2v" if image else "video_ltx2_5_t2v"
    what = "image to video" if image else "text to video"
    return _ltx2_two_stage(
        name=name, model="LTX-2.5", start_image=image, prompt=LTX25_I2V_PROMPT if image else LTX25_T2V_PROMPT,
        frame_rate=24.0, upscaler="ltx-2.5-latent-spatial-upscaler-x2-bf16-1.0.safetensors", audio_guidance=1.0,
        prefix=f"video/LTX-2.5_{'i2v' if image else 't2v'}",
        description=f"LTX-2.5 {what} with sound, as ComfyUI's {name} template: "
                    + ("Load Image (start frame) + " if image else "")
                    + "Load TPU Pipeline (LTX-2.5) -> Sampling Options (its stage-1 ManualSigmas) -> Sample Video "
                      "(1280x704, 121 frames at 24 fps, 8 steps at half size, guidance 1 and audio_guidance 1 as its dual CFG guider, then the x2 latent upscaler "
                      "and 3 steps on 0.85, 0.725, 0.4219) -> frames and audio -> Create Video (24 fps) -> Save "
                      "Video (mp4 with sound). Needs models/diffusers/LTX-2.5 and the upscaler in "
                      "models/latent_upscale_models.",
        note=_LTX25_NOTE.format(what=what, name=name, load="**Load Image** (the first frame) and " if image else "",
                                start="`start_image`; " if image else "",
                                strength=", its start-frame strength 0.7 in stage 1" if image else ""))


LTX23_IA2V_PROMPT = "The fuzzy cactus creature is talking to the viewer as it grips the steering wheel with one hand, the other hand gestures naturally as it speaks. The car is moving, revealing the sunlit coastal background, static camera fixed on character, smooth side-tracking shot matching the car speed\n\nscene: Sunlit coastal road trip, clear coastal background\ncharacter: Fuzzy cactus creature with big square sunglasses and a Hawaiian shirt\naction: One hand grips the steering wheel, the other gestures naturally while talking to the camera\ncamera: Fixed on character, smooth side-tracking shot matching car speed"


def _ltx2_image_audio_to_video() -> dict:
    """ComfyUI's video_ltx2_3_ia2v template on the pack, in its two stages (_ltx2_two_stage): Load Image (the start
    frame), Load Audio (the sound, kept) and Load TPU Pipeline (ComfyUI files: its LTX-2.3 dev checkpoint and Gemma
    3) -> Load LoRA (its distilled LoRA at 0.5) -> Sample Video with the x2 spatial upscaler -> frames and sound into
    ComfyUI's own Create Video -> Save Video."""
    note = """
## LTX-2.3 image + audio to video, in two stages

**Load Image** (the first frame), **Load Audio** (the sound) and **Load TPU Pipeline (ComfyUI files)** (LTX-2.3
dev) → **Load LoRA (TPU)** (the template's distilled LoRA at **0.5**) → **Sampling Options** (`sigmas`: the
template's stage-1 ManualSigmas) → **Sample Video (TPU)** (`start_image`, `audio`; 1280×704, 217 frames at **24
fps** = 9 s, **8 steps, guidance 1**, `upscale_model` the ×2 spatial upscaler) → **Create Video** (fps 24) →
**Save Video** (mp4 with sound).

The model **keeps the sound** and makes the frames to go with it (a talking or singing character): the
template's LTXVAudioVAEEncode and SetLatentNoiseMask(0) on the audio. The sound must last as long as the video:
frames / frame_rate seconds (a longer file: trim it first with Trim Audio Duration, as the template does to its
9 s). It is resampled to the model's rate.

As ComfyUI's `video_ltx2_3_ia2v` template runs it: 8 distilled steps at half size (640×352) on its stage-1
ManualSigmas **1.0, 0.99375, 0.9875, 0.98125, 0.975, 0.909375, 0.725, 0.421875** (Sampling Options' `sigmas`,
run as given), its ×2 latent upscaler (`ltx-2.3-spatial-upscaler-x2-1.1` in `models/latent_upscale_models`),
then 3 steps at full size on its ManualSigmas **0.85, 0.725, 0.4219** (`upscale_sigmas`), the sound kept in
both; Euler in both, as the template. 1280×720 and 9 s become 1280×704 (two stages: multiples of 64) and 217
frames (8k + 1). Not carried over: the start-frame strength 0.7 and the prompt enhancer (off by default).

**Files**: the template's own: `models/checkpoints/ltx-2.3-22b-dev-fp8.safetensors`,
`models/text_encoders/gemma_3_12B_it_fp4_mixed.safetensors`, and its `cactus_man.png` and `ltx_23_audio.mp3`
in ComfyUI's input folder. The template's Gemma LoRA (`gemma-3-12b-it-abliterated_lora_rank64_bf16`, LoraLoader 1 / 1) feeds only its
prompt enhancer (TextGenerateLTX2Prompt, off by default): the prompt is encoded without it, so the video does
not depend on it (diffusers' LTX-2 LoRA loader takes the transformer and connectors only, no Gemma).
"""
    return _ltx2_two_stage(
        name="video_ltx2_3_ia2v", model="", files=LTX23_FILES, start_image=True, image="cactus_man.png",
        audio="ltx_23_audio.mp3", prompt=LTX23_IA2V_PROMPT, frame_rate=24.0, frames=217,
        upscaler="ltx-2.3-spatial-upscaler-x2-1.1.safetensors", audio_guidance=-1.0, prefix="video/LTX_2.3_ia2v",
        lora="ltx_2.3_22b_distilled_1.1_lora_dynamic_fro09_avg_rank_111_bf16.safetensors", note=note,
        description="LTX-2.3 image + audio to video in two stages, as ComfyUI's video_ltx2_3_ia2v template: Load "
                    "Image (start frame) + Load Audio (the sound, kept) + Load TPU Pipeline (ComfyUI files: "
                    "ltx-2.3-22b-dev-fp8, gemma_3_12B_it_fp4_mixed) -> Load LoRA (its distilled LoRA, 0.5) -> Sampling "
                    "Options (its stage-1 ManualSigmas) -> Sample Video (1280x704, 217 frames at 24 fps, 8 steps at half size, guidance 1, then the x2 spatial "
                    "upscaler and 3 steps on 0.85, 0.725, 0.4219) -> frames and audio -> Create Video (24 fps) -> "
                    "Save Video (mp4 with sound). Needs the template's files, the LoRA in models/loras and the "
                    "upscaler in models/latent_upscale_models.")


def _template(name: str) -> dict:
    """A ComfyUI template as it ships (comfyui-workflow-templates-json, installed with ComfyUI)."""
    from importlib.resources import files

    return json.loads(files("comfyui_workflow_templates_json").joinpath("templates", f"{name}.json").read_text("utf-8"))


def _template_prompt(name: str) -> str:
    """The prompt a ComfyUI template ships with: its longest text widget outside the notes (MiniMax H3's sit on the
    subgraph node or a PrimitiveStringMultiline)."""
    texts = [v for n in _template(name)["nodes"] if n["type"] not in ("MarkdownNote", "Note")
             for v in (n.get("widgets_values") or []) if isinstance(v, str)]
    return max(texts, key=len)


def _template_widgets(name: str, node_type: str) -> list[list]:
    """The widget values of each node of `node_type` in a ComfyUI template, its subgraphs' nodes included."""
    wf = _template(name)
    nodes = [*wf["nodes"], *(n for sg in wf.get("definitions", {}).get("subgraphs", []) for n in sg["nodes"])]
    return [n["widgets_values"] for n in nodes if n["type"] == node_type]


# MiniMax H3's files as its t2v and i2v templates name them (the audio VAE in its own input)
MINIMAX_FILES = {"diffusion_model": "minimax_h3_fl2va_pruned_int8_convrot.safetensors",
                 "text_encoder_1": "qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors", "text_encoder_2": "(none)",
                 "text_encoder_3": "(none)", "vae": "minimax_h3_video_vae_int8_convrot.safetensors",
                 "checkpoint": "(none)", "audio_vae": "minimax_h3_audio_vae_fp32.safetensors"}
MINIMAX_FILES_NOTE = """**Files**: the template's own: `{transformer}` (diffusion_model, kept
quantized{what}), `qwen3vl_32b_minimax_h3_nvfp4_awq` (text_encoder_1, kept quantized), `minimax_h3_video_vae_int8_convrot`
(vae) and `minimax_h3_audio_vae_fp32` (**audio_vae**). A diffusers folder of MiniMax H3 loads too, in Load TPU
Pipeline (`MiniMax-H3`){folder}."""


def _template_references(name: str) -> list[str]:
    """The pictures a ComfyUI MiniMax H3 r2v template loads, in the order of its node's `ref_images` inputs
    (<Picture 1>, <Picture 2>, ...)."""
    wf = _template(name)
    by_id, links = {n["id"]: n for n in wf["nodes"]}, {link[0]: link for link in wf["links"]}
    node = next(n for n in wf["nodes"] if n["type"] == "MiniMaxH3ReferenceToVideo")
    inputs = sorted((i["name"], links[i["link"]][1]) for i in node["inputs"]
                    if i["name"].startswith("ref_images.") and i.get("link") is not None)
    return [by_id[source]["widgets_values"][0] for _, source in inputs]


def _minimax_h3(name: str) -> dict:
    """ComfyUI's MiniMax H3 templates on the pack (video_minimax_h3_t2v / _i2v / _r2v): Load TPU Pipeline (ComfyUI
    files: each template's own; r2v's transformer is its ref2va file, read from the template) [+ Load Image: the
    first frame; two Load Image -> Batch Images: the template's references] -> Sample Video (TPU) -> frames and
    sound into ComfyUI's own Create Video -> Save Video. Node ids: Load 1, Sample Video 2, Create Video 3, the note
    4, Save Video 5, Load Image 6 (and 7), Batch Images 8."""
    kind = name.rsplit("_", 1)[1]
    (unet,) = _template_widgets(name, "UNETLoader")
    files = {**MINIMAX_FILES, "diffusion_model": unet[0]}  # r2v: minimax_h3_ref2va_pruned_int8_convrot
    assert {w[0] for w in _template_widgets(name, "CLIPLoader") + _template_widgets(name, "VAELoader")} == {
        files["text_encoder_1"], files["vae"], files["audio_vae"]}, f"{name}: the template's files changed"
    transformer = unet[0].removesuffix(".safetensors")
    width, height = (640, 640) if kind == "i2v" else (864, 480)  # ResolutionSelector 1:1 / 16:9, 0.4 MP, x32
    sample = {"prompt": _template_prompt(name), "negative_prompt": "", "width": width, "height": height,
              "frames": 124, "steps": 20, "guidance": 1.0, "seed": 0, "control_after_generate": "randomize",
              "batch_size": 1, "frame_rate": 24.0}
    what = {"t2v": "text to video", "i2v": "first frame to video", "r2v": "reference images to video"}[kind]
    inputs = {"t2v": "", "i2v": "**Load Image** (the first frame, `start_image`) and ",
              "r2v": "two **Load Image** → ComfyUI's **Batch Images** (`reference_images`: <Picture 1>, <Picture 2> "
                     "in batch order) and "}[kind]
    audio = ("" if kind != "r2v" else "\n\nThe prompt's `<Audio 1>` is a reference sound (a voice, music), which the "
             "template leaves unconnected; connect a **Load Audio** to Sample Video's `reference_audio` (up to 3 "
             "sounds, cut to the video's 5 s).")
    files_note = MINIMAX_FILES_NOTE.format(
        transformer=transformer,
        what="; the ref2va transformer, for reference images only: text alone or a start frame needs "
             "`minimax_h3_fl2va_*`" if kind == "r2v" else "",
        folder=" for every task (its `transformer_ref` loads with the first reference images)" if kind == "r2v"
        else "")
    pictures = _template_references(name) if kind == "r2v" else []
    references = ("" if kind != "r2v" else f" The template's pictures, `{pictures[0]}` (<Picture 1>) and "
                  f"`{pictures[1]}` (<Picture 2>), go in ComfyUI's input folder; each is resized to MiniMax H3's "
                  "2048-pixel short edge (its published config), as diffusers' ref2va does.")
    note = f"""
## MiniMax H3 {what}, with sound

{inputs}**Load TPU Pipeline (ComfyUI files)** (MiniMax H3) → **Sample Video (TPU)** ({width}×{height}, **124 frames** = 5 s at
its fixed **24 fps**, **20 steps**) → its **frames** and **audio** into ComfyUI's own **Create Video** (fps 24) →
**Save Video** (mp4: H.264 and AAC).

The values of ComfyUI's `{name}` template: Resolution Selector at 0.4 MP ({width}×{height}), 5 s (124 frames:
17n + 5), 20 steps. The model is guidance-distilled (the template's Basic Guider: no CFG, one pass a step), so
guidance and the negative prompt are unused; the template's res_multistep / simple schedule is MiniMax H3's own
scheduler here. Its turbo LoRA (off in the template) goes through **Load LoRA (TPU)** with 8 steps (first /
last frame) or 4 (references).{audio}

{files_note}{references} Licence: MiniMax H3 Community License, not valid in the
EU, the UK, Korea and the USA.
"""
    below = 510  # under the loader
    nodes = [
        {"id": 1, "type": "LoadTPUPipelineFiles", "pos": [40, 130], "size": [330, 330],
         "widgets": {**files, "dtype": "auto", "device": "auto", "offload": "auto"}},
        {"id": 2, "type": "TPUSampleVideo", "pos": [410, 130], "size": [400, 600], "widgets": sample},
        {"id": 3, "type": "CreateVideo", "pos": [850, 130], "size": [300, 120], "widgets": {"fps": 24.0}},
        {"id": 5, "type": "SaveVideo", "pos": [1190, 130], "size": [420, 500],
         "widgets": {"filename_prefix": "video/MiniMax_H3", "format": "auto", "codec": "auto"}},
    ]
    links = [[1, "pipeline", 2, "pipeline"], [2, "frames", 3, "images"], [2, "audio", 3, "audio"],
             [3, 0, 5, "video"]]
    if kind == "i2v":
        nodes.append({"id": 6, "type": "LoadImage", "pos": [40, below], "size": [330, 380],
                      "widgets": {"image": "example.png"}})
        links.append([6, "IMAGE", 2, "start_image"])
    if kind == "r2v":
        nodes += [{"id": 6, "type": "LoadImage", "pos": [40, below], "size": [330, 380],
                   "widgets": {"image": pictures[0]}},
                  {"id": 7, "type": "LoadImage", "pos": [40, below + 430], "size": [330, 380],
                   "widgets": {"image": pictures[1]}},
                  {"id": 8, "type": "ImageBatch", "pos": [410, below + 430], "size": [300, 0], "widgets": {}}]
        links += [[6, "IMAGE", 8, "image1"], [7, "IMAGE", 8, "image2"], [8, "IMAGE", 2, "reference_images"]]
    nodes.append(_note(4, [750, below + 430] if kind == "r2v" else [40, below if kind == "t2v" else below + 430],
                       note, size=(740, 420)))
    return {"name": name, "nodes": nodes, "links": links,
            "extra": {"description": f"MiniMax H3 {what} with sound, as ComfyUI's {name} template: "
                                     + (f"{inputs.replace('**', '')}" if inputs else "")
                                     + f"Load TPU Pipeline (ComfyUI files: {transformer}, "
                                     "qwen3vl_32b_minimax_h3_nvfp4_awq, minimax_h3_video_vae_int8_convrot, "
                                     "minimax_h3_audio_vae_fp32)"
                                     + f" -> Sample Video ({width}x{height}, 124 frames at 24 fps, 20 steps) -> "
                                     "frames and audio -> Create Video (24 fps) -> Save Video (mp4 with sound)."}}


def _qwen_image_21_edit() -> dict:
    """ComfyUI's image_qwen_image_2_1_image_edit template on the pack: Load TPU Pipeline (ComfyUI files: the
    template's) and two Load Image, batched by ComfyUI's Batch Images, as Qwen-Image 2.1's references -> Sample ->
    Save Image. Node ids: Load 1, Sample 2, Save 3, the note 4, Load Image 5 and 6, Batch Images 7."""
    sample = {"prompt": "Replace costumes for the character", "negative_prompt": "", "width": 1024, "height": 1024,
              "steps": 25, "guidance": 1.0, "seed": 0, "control_after_generate": "randomize", "batch_size": 1,
              "prompt_per_line": False, "denoise": 1.0, "size_from_image": False, "sampler": "euler",
              "scheduler": "simple"}
    note = """
## Qwen-Image 2.1: edit with reference images

**Load Image** ×2 → ComfyUI's **Batch Images** → Sample's `image` (every image of the batch is a reference) →
**Sample** (1024×1024, **25 steps, guidance 1, `euler`, `simple`**: the values of ComfyUI's
`image_qwen_image_2_1_image_edit` template) → **Save Image**.

As in the template, the first picture is the person, the second what to put on them (the template's
`portrait_model_denim.png` and `clothing_light_blue_denim_shirt.png`); say the edit in the prompt. Batch
Images fits the second picture to the first's size. More references: chain more Batch Images (up to 10).
`size_from_image` is off: the result is width × height, as the template's 1024×1024 latent.

**Files**: the template's own, in Load TPU Pipeline (ComfyUI files): `qwen_image_2.1_int8_convrot` (kept
quantized), `qwen3vl_8b_int8_convrot`, `qwen_image_2.1_vae_bf16`. The diffusers folder `Qwen-Image-2.1` loads
too, in Load TPU Pipeline. Guidance 1: one pass per step. The template's prompt enhancer (off by default) is
left out.
"""
    return {
        "name": "image_qwen_image_2_1_image_edit",
        "nodes": [
            {"id": 1, "type": "LoadTPUPipelineFiles", "pos": [40, 130], "size": [330, 300],
             "widgets": {**QWEN_IMAGE_21_FILES, "dtype": "auto", "device": "auto", "offload": "auto"}},
            {"id": 5, "type": "LoadImage", "pos": [40, 520], "size": [330, 380], "widgets": {"image": "example.png"}},
            {"id": 6, "type": "LoadImage", "pos": [40, 950], "size": [330, 380],
             "widgets": {"image": "reference.png"}},
            {"id": 7, "type": "ImageBatch", "pos": [410, 520], "size": [300, 0], "widgets": {}},
            {"id": 2, "type": "TPUSample", "pos": [750, 130], "size": [400, 600], "widgets": sample},
            {"id": 3, "type": "SaveImage", "pos": [1190, 130], "size": [360, 470],
             "widgets": {"filename_prefix": "qwen-image-2.1-edit"}},
            _note(4, [410, 950], note, size=(740, 380)),
        ],
        "links": [[1, "pipeline", 2, "pipeline"], [5, "IMAGE", 7, "image1"], [6, "IMAGE", 7, "image2"],
                  [7, "IMAGE", 2, "image"], [2, "images", 3, "images"]],
        "extra": {"description": "Qwen-Image 2.1 image edit, as ComfyUI's image_qwen_image_2_1_image_edit template: "
                                 "Load TPU Pipeline (ComfyUI files: qwen_image_2.1_int8_convrot, "
                                 "qwen3vl_8b_int8_convrot, qwen_image_2.1_vae_bf16) and two Load Image -> Batch "
                                 "Images -> Sample (the references; 1024x1024, 25 steps, guidance 1, euler, simple) "
                                 "-> Save Image."},
    }


# The templates' files (comfyui-workflow-templates 0.1.123), for Load TPU Pipeline (ComfyUI files)
NO_FILE = {"text_encoder_2": "(none)", "text_encoder_3": "(none)", "checkpoint": "(none)"}
QWEN_IMAGE_21_FILES = {"diffusion_model": "qwen_image_2.1_int8_convrot.safetensors",
                       "text_encoder_1": "qwen3vl_8b_int8_convrot.safetensors",
                       "vae": "qwen_image_2.1_vae_bf16.safetensors", **NO_FILE}
FLUX3_KLEIN_BASE_FILES = {"diffusion_model": "flux3-image-klein-base-int8-convrot.safetensors",
                          "text_encoder_1": "qwen3vl_4b_int8_convrot.safetensors", "vae": "flux2-vae.safetensors",
                          **NO_FILE}
QWEN_IMAGE_21_TURBO_SIGMAS = "1.0, 0.978453, 0.95418, 0.926626, 0.89508, 0.845148, 0.704534, 0.414568, 0"
TURBO_EDIT_PROMPT = (
    "Relight the scene as a clear moonlit night: the sky seen through the oculus becomes a deep night sky with a "
    "bright full moon and a few stars, and the tree stays as a dark night silhouette. Soft blue-silver moonlight "
    "is now the only light source, casting a cool pale pool of light on the circular stone platform and a long "
    "soft shadow of the dancer. The concrete walls turn cool blue-grey with deep shadows, and the dancer's black "
    "dress catches a faint silver rim light. Keep her exact pose, the architecture, the framing and the tree "
    "position unchanged.")
FLUX3_T2I_PROMPT = (
    "close up profile of a young male athlete with closed eyes pressing his sweaty forehead against a soccer ball, "
    "right hand gripping the ball, stark white background, athletic jacket, white ball with jagged red graphic "
    "patterns, high contrast studio lighting, highly detailed skin texture, sharp focus Absolutely no text, no "
    "typography, no letters, no words, no numbers, no logos, no watermark, no captions, pure imagery only.")
NO_PROMPT_ENHANCER = """The template's **prompt enhancer** ({what}: ComfyUI's TextGenerate with `{file}`) is
not part of this workflow: the pack's nodes encode the prompt as you write it, so write the detailed prompt
yourself (or run the enhancer in ComfyUI and paste its text). Why: docs/models.md, "Prompt enhancers"."""


def _one_reference_edit(*, name: str, files: dict, prompt: str, sample: dict, prefix: str, note: str,
                        description: str, options: dict | None = None) -> dict:
    """Load TPU Pipeline (ComfyUI files: `files`) [-> Sampling Options] and ComfyUI's Load Image -> Sample (the
    image as the model's reference) -> Save Image, as the single-reference edit templates (Qwen-Image 2.1 Turbo,
    FLUX 3 [klein]). Node ids: Load 1, Sample 2, Save 3, note 4, Load Image 5, Sampling Options 6."""
    widgets = {"prompt": prompt, "negative_prompt": "", "width": 1024, "height": 1024, "seed": 0,
               "control_after_generate": "randomize", "batch_size": 1, "prompt_per_line": False, "denoise": 1.0,
               "size_from_image": False, **sample}
    nodes = [
        {"id": 1, "type": "LoadTPUPipelineFiles", "pos": [40, 130], "size": [330, 300],
         "widgets": {**files, "dtype": "auto", "device": "auto", "offload": "auto"}},
        {"id": 5, "type": "LoadImage", "pos": [40, 520], "size": [330, 380], "widgets": {"image": "example.png"}},
        {"id": 2, "type": "TPUSample", "pos": [750, 130], "size": [400, 600], "widgets": widgets},
        {"id": 3, "type": "SaveImage", "pos": [1190, 130], "size": [360, 470], "widgets": {"filename_prefix": prefix}},
        _note(4, [410, 760], note, size=(1140, 380)),
    ]
    links = [[5, "IMAGE", 2, "image"], [2, "images", 3, "images"]]
    if options is None:
        links.append([1, "pipeline", 2, "pipeline"])
    else:
        nodes.append({"id": 6, "type": "TPUSamplingOptions", "pos": [410, 130], "size": [300, 0], "widgets": options})
        links += [[1, "pipeline", 6, "pipeline"], [6, "pipeline", 2, "pipeline"]]
    return {"name": name, "nodes": nodes, "links": links, "extra": {"description": description}}


def _qwen_image_21_turbo_edit() -> dict:
    """ComfyUI's image_qwen_image_2_1_turbo_image_edit template: its ManualSigmas as Sampling Options' sigmas."""
    return _one_reference_edit(
        name="image_qwen_image_2_1_turbo_image_edit", prompt=TURBO_EDIT_PROMPT,
        files={**QWEN_IMAGE_21_FILES, "diffusion_model": "qwen_image_2.1_turbo_int8_convrot.safetensors"},
        sample={"steps": 8, "guidance": 1.0, "sampler": "euler", "scheduler": "default"}, prefix="Qwen_image_2.1",
        options={"prompt_cache": True, "batched": False, "true_cfg_scale": 1.0, "step_cache": "off",
                 "cache_threshold": 0.0, "sigmas": QWEN_IMAGE_21_TURBO_SIGMAS},
        description="Qwen-Image 2.1 Turbo image edit, as ComfyUI's image_qwen_image_2_1_turbo_image_edit "
                    "template: Load TPU Pipeline (ComfyUI files: qwen_image_2.1_turbo_int8_convrot, "
                    "qwen3vl_8b_int8_convrot, qwen_image_2.1_vae_bf16) -> Sampling Options (the template's 8 "
                    "ManualSigmas) and Load Image -> Sample (the reference; 1024x1024, 8 steps, guidance 1, euler) "
                    "-> Save Image.",
        note=f"""
## Qwen-Image 2.1 Turbo: edit a picture in 8 steps

**Load TPU Pipeline (ComfyUI files)** → **Sampling Options** (`sigmas`: the template's **ManualSigmas**,
`{QWEN_IMAGE_21_TURBO_SIGMAS}`)
→ **Sample** with **Load Image** as its reference (1024×1024, **8 steps, guidance 1, `euler`**: the values of
ComfyUI's `image_qwen_image_2_1_turbo_image_edit` template) → **Save Image**.

The sigmas reach diffusers' QwenImage21Pipeline as its `sigmas` (the final 0 is the scheduler's own); Sample's
steps follow them (8). The pipeline resizes the reference to about 1024×1024 pixels at its aspect (the
template's resolution 0 keeps its size). Guidance 1: one pass per step. Say the edit in the prompt.

{NO_PROMPT_ENHANCER.format(what="off by default", file="qwen3.5_9b_qwen_image_2.1_pe_i2i")}

**Files**: the template's own: `qwen_image_2.1_turbo_int8_convrot` (kept quantized), `qwen3vl_8b_int8_convrot`,
`qwen_image_2.1_vae_bf16`. The file loads with the base model's configs; Turbo's schedule is the sigmas above.
The diffusers folder `Qwen-Image-2.1-Turbo` loads too, in Load TPU Pipeline.
""")


def _flux3_klein_t2i() -> dict:
    """ComfyUI's image_flux3_klein_t2i template (the base model, CFG 3.5, 50 steps)."""
    return _text_to_image(
        title="image_flux3_klein_t2i", model="", files=FLUX3_KLEIN_BASE_FILES, offload="auto", note_height=420,
        prompt=FLUX3_T2I_PROMPT, width=1024, height=1024, steps=50, guidance=3.5, seed=0, seed_control="randomize",
        sampler="default", scheduler="default", prefix="image_flux3_klein_base_t2i",
        description="FLUX 3 [klein] base text to image, as ComfyUI's image_flux3_klein_t2i template: Load TPU "
                    "Pipeline (ComfyUI files: flux3-image-klein-base-int8-convrot, qwen3vl_4b_int8_convrot, "
                    "flux2-vae) -> Sample (1024x1024, 50 steps, guidance 3.5, the model's own scheduler: the "
                    "template's euler, simple) -> Save Image.",
        note=f"""
## FLUX 3 [klein] base: text to image

**Load TPU Pipeline (ComfyUI files)** → **Sample** (1024×1024, **50 steps, guidance 3.5**: the values of
ComfyUI's `image_flux3_klein_t2i` template) → **Save Image**.

The template's `euler` / `simple` is the model's own scheduler (flow-matching Euler, shift 6.93): sampler and
scheduler `default` (diffusers' FLUX 3 blocks make their scheduler themselves; no other is offered). Guidance is
the base model's classifier-free guidance (diffusers' guider): two passes per step.

{NO_PROMPT_ENHANCER.format(what="on by default in the template", file="qwen3.5_9b_flux3_prompt_upsampler_w4a8")}
The template's layout boxes (Create Bounding Boxes, Flux3LayoutPrompt) are not carried either.

**Files**: the template's own: `flux3-image-klein-base-int8-convrot` (kept quantized) +
`qwen3vl_4b_int8_convrot` + `flux2-vae`. The diffusers folder `FLUX-3-Image-Klein-Base`
(modular_model_index.json naming Flux3ModularPipeline) loads too, in Load TPU Pipeline.
""")


def _flux3_klein_edit() -> dict:
    """ComfyUI's image_flux3_klein_image_edit template (the base model, KSampler cfg 1 as saved, 50 steps)."""
    return _one_reference_edit(
        name="image_flux3_klein_image_edit", files=FLUX3_KLEIN_BASE_FILES,
        prompt="Change the dress color to red", prefix="image_flux3_klein_distilled_image_edit",
        sample={"steps": 50, "guidance": 1.0, "sampler": "default", "scheduler": "default"},
        description="FLUX 3 [klein] base image edit, as ComfyUI's image_flux3_klein_image_edit template: Load TPU "
                    "Pipeline (ComfyUI files: flux3-image-klein-base-int8-convrot, qwen3vl_4b_int8_convrot, "
                    "flux2-vae) and Load Image -> Sample (the reference; 1024x1024, 50 steps, guidance 1, the "
                    "model's own scheduler: the template's euler, simple) -> Save Image.",
        note=f"""
## FLUX 3 [klein] base: edit a picture

**Load Image** → Sample's `image` (the model's reference) with **Load TPU Pipeline (ComfyUI files)** →
**Sample** (1024×1024,
**50 steps, guidance 1**: the values of ComfyUI's `image_flux3_klein_image_edit` template's KSampler; its note
says cfg 3.5, which is guidance 3.5 here) → **Save Image**. Say the edit in the prompt. Its `euler` / `simple`
is the model's own scheduler: sampler and scheduler `default`.

The template writes the edit with layout boxes (`In <ref_image_0>, change the dress color <obj_1> to red`,
Create Bounding Boxes, Flux3LayoutPrompt); here it is plain text. More references: batch pictures into
`image` (ComfyUI's Batch Images), up to 10.

{NO_PROMPT_ENHANCER.format(what="off by default", file="qwen3.5_9b_flux3_prompt_upsampler_w4a8")}

**Files**: the template's own: `flux3-image-klein-base-int8-convrot` (kept quantized) +
`qwen3vl_4b_int8_convrot` + `flux2-vae`. The diffusers folder `FLUX-3-Image-Klein-Base` loads too, in Load TPU
Pipeline.
""")


def _wan_text_to_video() -> dict:
    return _wan_video(
        name="wan21_t2v", model="Wan2.1-T2V-1.3B-Diffusers",
        prompt="a red fox running through fresh snow in a pine forest, morning light, cinematic",
        negative_prompt="blurry, low quality, static, distorted", frames=33, steps=30, prefix="wan21-t2v",
        note="""
## Wan 2.1 text to video (1.3B)

**Load TPU Pipeline** (Wan 2.1 1.3B) → **Sample Video (TPU)** (832×480, 33 frames, **30 steps, guidance 5**) →
ComfyUI's own **Save Animated WEBP** (16 fps).

**Model**: the diffusers folder `models/diffusers/Wan2.1-T2V-1.3B-Diffusers`
(`hf download Wan-AI/Wan2.1-T2V-1.3B-Diffusers --local-dir ...`). ComfyUI's split Wan files: Load TPU
Pipeline (ComfyUI files), as in wan22_5b_t2v_comfyui_files.

A Wan video has 1 + a multiple of 4 frames (81 is about 5 s at 16 fps); time and memory grow with frames ×
width × height. The frames leave Sample Video as an image batch, so Save Video or any frame node takes them too.
Add **CFG Parallel** (2 chips: the two guidance passes) or **Context Parallel** (the video's tokens) before
Sample Video to make one video sooner, **Data Parallel** for several videos at once.
""",
        description="Wan 2.1 text to video: Load TPU Pipeline (Wan2.1-T2V-1.3B-Diffusers) -> Sample Video (832x480, "
                    "33 frames, 30 steps, guidance 5) -> Save Animated WEBP (16 fps). Needs "
                    "models/diffusers/Wan2.1-T2V-1.3B-Diffusers.")


def _wan_image_to_video() -> dict:
    return _wan_video(
        name="wan21_i2v", model="Wan2.1-I2V-14B-480P-Diffusers", start_image=True,
        prompt="the scene comes alive: gentle wind, light moving across it, slow camera push in, cinematic",
        negative_prompt="blurry, low quality, static, distorted", frames=33, steps=30, prefix="wan21-i2v",
        note="""
## Wan 2.1 image to video (14B, 480p)

**Load Image** (the start frame) and **Load TPU Pipeline** (Wan 2.1 I2V 14B 480P) → **Sample Video (TPU)**
(`start_image`; 832×480, 33 frames, **30 steps, guidance 5**) → ComfyUI's own **Save Animated WEBP** (16 fps).

**Model**: the diffusers folder `models/diffusers/Wan2.1-I2V-14B-480P-Diffusers`
(`hf download Wan-AI/Wan2.1-I2V-14B-480P-Diffusers --local-dir ...`); it holds the CLIP vision encoder
(clip_vision_h) too. About 33 GB in bfloat16: offload `auto` keeps what does not fit the chip in host memory.

The start image is the video's first frame, stretched to width × height (never cropped; the CLIP vision encoder
sees its centre square, as in diffusers). Each video of a batch starts from the image of the same index
(cycling). Add **CFG Parallel** or **Context Parallel** before Sample Video to make one video sooner.
""",
        description="Wan 2.1 image to video: Load Image (start frame) + Load TPU Pipeline "
                    "(Wan2.1-I2V-14B-480P-Diffusers) -> Sample Video (832x480, 33 frames, 30 steps, guidance 5) -> "
                    "Save Animated WEBP (16 fps). Needs models/diffusers/Wan2.1-I2V-14B-480P-Diffusers.")


def _wan22_5b_files() -> dict:
    return _wan_video(
        name="wan22_5b_t2v_comfyui_files", model="", size=(1280, 704), frames=121, steps=30, fps=24.0,
        files={"diffusion_model": "wan2.2_ti2v_5B_fp16.safetensors",
               "text_encoder_1": "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "text_encoder_2": "(none)",
               "text_encoder_3": "(none)", "vae": "wan2.2_vae.safetensors", "checkpoint": "(none)"},
        prompt="a red fox running through fresh snow in a pine forest, morning light, cinematic",
        negative_prompt="blurry, low quality, static, distorted", prefix="wan22-5b",
        note="""
## Wan 2.2 5B text to video from ComfyUI's own files

**Load TPU Pipeline (ComfyUI files)** → **Sample Video (TPU)** (1280×704, 121 frames, **30 steps, guidance 5**)
→ ComfyUI's own **Save WEBM** (24 fps).

**Files**: those of ComfyUI's Wan 2.2 5B template, where ComfyUI keeps them:
- `models/diffusion_models/wan2.2_ti2v_5B_fp16.safetensors`
- `models/text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors` (its tokenizer is inside it)
- `models/vae/wan2.2_vae.safetensors` (Wan 2.2's 48-channel VAE: sizes are multiples of 32)

121 frames are 5 s at 24 fps. **Offload `auto`**: about 10 GB of diffusion model and 11 GB of UMT5 in
bfloat16 (the fp8 file is upcast) stay on a 32 GB chip; on a 16 GB v5e they take turns. Wan 2.2 A14B: its
high-noise file in diffusion_model and its low-noise file in diffusion_model_2.
""",
        description="Wan 2.2 5B text to video from ComfyUI's files: Load TPU Pipeline (ComfyUI files: "
                    "wan2.2_ti2v_5B_fp16, umt5_xxl_fp8_e4m3fn_scaled, wan2.2_vae) -> Sample Video (1280x704, "
                    "121 frames, 30 steps, guidance 5) -> Save WEBM (24 fps).")


def _wan22_14b_i2v_files() -> dict:
    return _wan_video(
        name="wan22_14b_i2v_comfyui_files", model="", start_image=True, size=(640, 640), frames=81, steps=20,
        guidance=3.5, files={"diffusion_model": "wan2.2_i2v_high_noise_14B_fp8_scaled.safetensors",
               "diffusion_model_2": "wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors",
               "text_encoder_1": "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "text_encoder_2": "(none)",
               "text_encoder_3": "(none)", "vae": "wan_2.1_vae.safetensors", "checkpoint": "(none)"},
        prompt="the scene comes alive: gentle wind, light moving across it, slow camera push in, cinematic",
        negative_prompt="blurry, low quality, static, distorted", prefix="wan22-14b-i2v",
        note="""
## Wan 2.2 14B image to video from ComfyUI's own files

**Load Image** (the start frame) and **Load TPU Pipeline (ComfyUI files)** (the two experts) → **Sample Video
(TPU)** (`start_image`; 640×640, 81 frames, **20 steps, guidance 3.5**, as ComfyUI's template) → ComfyUI's own **Save
WEBM** (16 fps).

**Files**: those of ComfyUI's Wan 2.2 14B image-to-video template, where ComfyUI keeps them:
- `models/diffusion_models/wan2.2_i2v_high_noise_14B_fp8_scaled.safetensors` (diffusion_model) and
  `wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors` (diffusion_model_2): the high-noise expert runs the steps
  above 90 % of the noise schedule, the low-noise one the rest
- `models/text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors` (its tokenizer is inside it)
- `models/vae/wan_2.1_vae.safetensors`

No CLIP vision file: Wan 2.2's image-to-video experts read the start image through the VAE only (its latents
beside the noise). The start image is the first frame, stretched to width × height. **Offload `auto`**: the two
experts are about 57 GB in bfloat16 (scaled fp8 files are dequantized while loading), more than one chip holds;
what does not fit stays in host memory. Add **CFG Parallel** or **Context Parallel** before Sample Video to make
one video sooner.
""",
        description="Wan 2.2 14B image to video from ComfyUI's files: Load Image (start frame) + Load TPU Pipeline "
                    "(ComfyUI files: wan2.2_i2v_high_noise_14B_fp8_scaled, wan2.2_i2v_low_noise_14B_fp8_scaled, "
                    "umt5_xxl_fp8_e4m3fn_scaled, wan_2.1_vae) -> Sample Video (640x640, 81 frames, 20 steps, "
                    "guidance 3.5) -> Save WEBM (16 fps).")


def _hires_fix() -> dict:
    """Text to image, ComfyUI's Upscale Image By, then image to image at low denoise at the new size."""
    first = {"prompt": "a cozy mountain cabin at dusk, warm lit windows, snow, detailed", "negative_prompt": "",
             "width": 1024, "height": 1024, "steps": 4, "guidance": 0.0, "seed": 0,
             "control_after_generate": "randomize", "batch_size": 1}
    second = {**first, "seed": 0, "control_after_generate": "fixed", "prompt_per_line": False, "denoise": 0.45,
              "size_from_image": True}
    return {
        "name": "flux1_hires_fix",
        "nodes": [
            {"id": 1, "type": "LoadTPUPipeline", "pos": [40, 130], "size": [330, 180],
             "widgets": {"model": "FLUX.1-schnell", "dtype": "auto", "device": "auto", "offload": "model",
                         "model_path": ""}},
            {"id": 2, "type": "TPUSample", "pos": [410, 130], "size": [400, 470], "widgets": first},
            {"id": 5, "type": "ImageScaleBy", "pos": [850, 130], "size": [300, 0],
             "widgets": {"upscale_method": "lanczos", "scale_by": 1.5}},
            {"id": 6, "type": "TPUSample", "pos": [1190, 130], "size": [400, 560], "widgets": second},
            {"id": 3, "type": "SaveImage", "pos": [1630, 130], "size": [360, 470],
             "widgets": {"filename_prefix": "flux1-hires"}},
            {"id": 7, "type": "SaveImage", "pos": [850, 300], "size": [300, 340],
             "widgets": {"filename_prefix": "flux1-hires-first-pass"}},
            _note(4, [40, 650], """
## Hires fix: make it, upscale it, refine it

**Sample** (1024×1024, 4 steps) → ComfyUI's **Upscale Image By** (lanczos, ×1.5) → **Sample** again on the
bigger image at **denoise 0.45** → **Save Image** (1536×1536). The first pass is saved too.

The second Sample keeps the picture (denoise 0.45 repaints less than half) and adds the detail the larger size
allows; `size_from_image` makes it work at the upscaled size. Both Samples use the same loaded model: nothing
is loaded twice. Swap Upscale Image By for an upscale model (Load Upscale Model + Upscale Image (using Model))
for sharper results. On a TPU each size compiles once.

**Model**: `models/diffusers/FLUX.1-schnell`, as in the FLUX.1-schnell workflow.
""", size=(770, 300)),
        ],
        "links": [[1, "pipeline", 2, "pipeline"], [1, "pipeline", 6, "pipeline"], [2, "images", 5, "image"],
                  [5, "IMAGE", 6, "image"], [6, "images", 3, "images"], [2, "images", 7, "images"]],
        "extra": {"description": "Hires fix with FLUX.1-schnell: Sample (1024x1024, 4 steps) -> Upscale Image By "
                                 "(ComfyUI's own, x1.5) -> Sample at denoise 0.45 on the upscaled image -> Save "
                                 "Image (1536x1536; the first pass is saved too). Needs "
                                 "models/diffusers/FLUX.1-schnell."},
    }


def _latent_hires_fix() -> dict:
    """Sample Latent (no VAE decode), ComfyUI's Upscale Latent By, then Sample from the latent at low denoise."""
    first = {"prompt": "a cozy mountain cabin at dusk, warm lit windows, snow, detailed", "negative_prompt": "",
             "width": 1024, "height": 1024, "steps": 4, "guidance": 0.0, "seed": 0,
             "control_after_generate": "randomize", "batch_size": 1}
    second = {**first, "seed": 0, "control_after_generate": "fixed", "denoise": 0.55}
    return {
        "name": "flux1_latent_hires_fix",
        "nodes": [
            {"id": 1, "type": "LoadTPUPipeline", "pos": [40, 130], "size": [330, 180],
             "widgets": {"model": "FLUX.1-schnell", "dtype": "auto", "device": "auto", "offload": "model",
                         "model_path": ""}},
            {"id": 2, "type": "TPUSampleLatent", "pos": [410, 130], "size": [400, 470], "widgets": first},
            {"id": 5, "type": "LatentUpscaleBy", "pos": [850, 130], "size": [300, 0],
             "widgets": {"upscale_method": "nearest-exact", "scale_by": 1.5}},
            {"id": 6, "type": "TPUSample", "pos": [1190, 130], "size": [400, 560], "widgets": second},
            {"id": 3, "type": "SaveImage", "pos": [1630, 130], "size": [360, 470],
             "widgets": {"filename_prefix": "flux1-latent-hires"}},
            _note(4, [40, 650], """
## Latent hires fix: make it, upscale the latent, refine it

**Sample Latent (TPU)** (1024×1024, 4 steps) → ComfyUI's **Upscale Latent By** (×1.5) → **Sample (TPU)** from
that latent at **denoise 0.55** → **Save Image** (1536×1536).

The first pass never runs the VAE: Sample Latent hands back ComfyUI's LATENT (the model's own latents, as
KSampler gives them), so the image is decoded once, at the end. The latent sets the second Sample's size and
batch (its width, height and batch_size are not used). Upscaling a latent blurs it, so refine with denoise 0.5
or more; for less change, use the image hires fix (flux1_hires_fix). Both Samples share the loaded model.
Any Sample's `latent` output also goes to ComfyUI's own VAE Decode (with this model's VAE file).

**Model**: `models/diffusers/FLUX.1-schnell`, as in the FLUX.1-schnell workflow.
""", size=(770, 300)),
        ],
        "links": [[1, "pipeline", 2, "pipeline"], [1, "pipeline", 6, "pipeline"], [2, "latent", 5, "samples"],
                  [5, "LATENT", 6, "latent"], [6, "images", 3, "images"]],
        "extra": {"description": "Latent hires fix with FLUX.1-schnell: Sample Latent (1024x1024, 4 steps, no VAE "
                                 "decode) -> Upscale Latent By (ComfyUI's own, x1.5) -> Sample from the latent at "
                                 "denoise 0.55 -> Save Image (1536x1536). Needs models/diffusers/FLUX.1-schnell."},
    }

def _clip_text_encode() -> dict:
    """ComfyUI's own DualCLIPLoader -> CLIP Text Encode (weighted prompt) -> FluxGuidance -> Sample's positive."""
    sample = {"prompt": "", "negative_prompt": "", "width": 1024, "height": 1024, "steps": 28, "guidance": 3.5,
              "seed": 0, "control_after_generate": "randomize", "batch_size": 1}
    return {
        "name": "flux1_dev_clip_text_encode",
        "nodes": [
            {"id": 1, "type": "LoadTPUPipeline", "pos": [40, 130], "size": [330, 180],
             "widgets": {"model": "FLUX.1-dev", "dtype": "auto", "device": "auto", "offload": "none",
                         "model_path": ""}},
            {"id": 5, "type": "DualCLIPLoader", "pos": [40, 360], "size": [330, 130],
             "widgets": {"clip_name1": "clip_l.safetensors", "clip_name2": "t5xxl_fp8_e4m3fn.safetensors",
                         "type": "flux"}},
            {"id": 6, "type": "CLIPTextEncode", "pos": [410, 360], "size": [400, 200],
             "widgets": {"text": "a cozy mountain cabin in the snow, (golden hour:1.3), (warm lit windows:1.2), "
                                 "[people], detailed photo"}},
            {"id": 7, "type": "FluxGuidance", "pos": [410, 600], "size": [300, 60], "widgets": {"guidance": 3.5}},
            {"id": 2, "type": "TPUSample", "pos": [850, 130], "size": [400, 620], "widgets": sample},
            {"id": 3, "type": "SaveImage", "pos": [1290, 130], "size": [360, 470],
             "widgets": {"filename_prefix": "flux1-dev-clip-text-encode"}},
            _note(4, [40, 800], """
## Prompt weights: ComfyUI's CLIP Text Encode into Sample

ComfyUI's **DualCLIPLoader** (clip_l + t5xxl, type flux) → **CLIP Text Encode** with weights (`(golden hour:1.3)`)
→ **FluxGuidance** (3.5) → Sample's **positive** input → **Save Image**.

The text is encoded by ComfyUI's own text encoders in ComfyUI's process, weights and all, and Sample uses that
encoding instead of its prompt text (left empty here). FluxGuidance's value replaces Sample's guidance widget.
ConditioningConcat and ConditioningAverage work too; ConditioningCombine, area and timestep ranges are refused
(they need ComfyUI's own sampler). SD3/SD3.5 (TripleCLIPLoader) and SDXL (the checkpoint's CLIP) work the same
way, with a **negative** encoding as well when guidance is above 1.

**Files**: `models/diffusers/FLUX.1-dev` for Sample; `clip_l.safetensors` and `t5xxl_fp8_e4m3fn.safetensors` in
`models/text_encoders` for ComfyUI. The pipeline's own text encoders still load on the chip (unused here).
""", size=(770, 330)),
        ],
        "links": [[1, "pipeline", 2, "pipeline"], [5, "CLIP", 6, "clip"], [6, "CONDITIONING", 7, "conditioning"],
                  [7, "CONDITIONING", 2, "positive"], [2, "images", 3, "images"]],
        "extra": {"description": "Prompt weights with FLUX.1-dev: ComfyUI's DualCLIPLoader (clip_l, t5xxl) -> CLIP "
                                 "Text Encode ('(golden hour:1.3)') -> FluxGuidance 3.5 -> Sample's positive input "
                                 "(1024x1024, 28 steps) -> Save Image. Needs models/diffusers/FLUX.1-dev and the "
                                 "two text encoder files in models/text_encoders."},
    }


SPECS: dict[str, dict] = {
    "tiny_demo": _text_to_image(
        title="tiny_demo", model="tiny-flux", offload="none", note_height=240,
        prompt="a lighthouse on a cliff at sunset, oil painting", width=256, height=256, steps=4, guidance=0.0,
        seed=42, seed_control="fixed", prefix="comfyui-tpu-demo",
        description="Runs anywhere (TPU, GPU or CPU) on the built-in tiny random-weight FLUX.1 model: "
                    "Load TPU Pipeline (tiny-flux) -> Sample (256x256, 4 steps) -> Save Image.",
        note="""
## Tiny demo: runs anywhere

**Load TPU Pipeline** (`tiny-flux`) → **Sample (TPU)** (256×256, 4 steps) → **Save Image**.

`tiny-flux` is the pack's built-in **tiny random-weight FLUX.1** model: the image is noise by design. It checks
that the whole path works (worker process, device, progress) on a TPU, a GPU or the CPU, in seconds.

Make it once, from the pack's folder:
`python -m backend make-tiny-models ../../models/diffusers --families flux`

Then pick a real model in **Load TPU Pipeline** (see the FLUX.1-schnell workflow).
"""),
    "flux1_schnell_offload": _text_to_image(
        title="flux1_schnell_offload", model="FLUX.1-schnell", offload="model", note_height=300,
        prompt="a red fox sitting in fresh snow at golden hour, detailed fur, shallow depth of field",
        width=1024, height=1024, steps=4, guidance=0.0, seed=0, seed_control="randomize", prefix="flux1-schnell",
        description="FLUX.1-schnell on one chip with model offload: 1024x1024, 4 steps, guidance 0. Needs the "
                    "diffusers folder models/diffusers/FLUX.1-schnell.",
        note="""
## FLUX.1-schnell on one chip, with model offload

1024×1024, **4 steps, guidance 0**: schnell is distilled for 1–4 steps and ignores guidance.

**Model**: the diffusers folder of `black-forest-labs/FLUX.1-schnell` in `models/diffusers/FLUX.1-schnell`
(the folder holding `model_index.json`; nothing is downloaded at run time).

**Offload `model`**: each part (text encoders, transformer, VAE) moves to the chip only while it runs, so the
chip needs room for the largest part (the 12B transformer, about 24 GB in bfloat16) rather than all of them.
Use `none` on a chip with room for everything (faster), `sequential` when even that does not fit (slow).

The first run loads the weights; on a TPU each new image size also compiles once.
"""),
    "sd35_medium_compiled": _text_to_image(
        title="sd35_medium_compiled", model="stable-diffusion-3.5-medium", offload="none", note_height=240,
        between=(("TPUSetExecutionMode", {"mode": "compiled"}),
                 ("TPUCompile", {"target": "whole denoiser", "backend": "auto", "warmup": "1024x1024",
                                 "snap_to_warmup": False})),
        prompt="a watercolor painting of a hummingbird drinking from a red flower, soft morning light",
        negative_prompt="blurry, low quality, distorted", width=1024, height=1024, steps=40, guidance=4.5,
        seed=0, seed_control="randomize", prefix="sd35-medium",
        description="SD3.5 Medium compiled on one chip with a warm-up: Load TPU Pipeline -> Set Execution "
                    "Mode (compiled) -> Compile (whole denoiser, warm-up 1024x1024) -> Sample (1024x1024, 40 "
                    "steps, guidance 4.5) -> Save Image. Needs models/diffusers/stable-diffusion-3.5-medium.",
        note="""
## SD3.5 Medium, compiled on one chip

**Load TPU Pipeline** → **Set Execution Mode** (`compiled`) → **Compile (TPU)** (warm-up 1024×1024) →
**Sample** (1024×1024, **40 steps, guidance 4.5**) → **Save Image**.

**Model**: the diffusers folder of `stabilityai/stable-diffusion-3.5-medium` in
`models/diffusers/stable-diffusion-3.5-medium`.

**Compile** turns the transformer into one compiled graph (target `whole denoiser`: SD3's transformer has no
repeated blocks) and compiles the warm-up size before the first image. On a TPU expect **minutes** the first
time; the node says what it is compiling. After that every Sample at 1024×1024 reuses it, whatever the prompt,
seed, steps or guidance. The graphs are kept in ComfyUI's `user/comfyui-tpu/compile-cache` and come back after
a restart. Another size compiles once on its first Sample (or turn on `snap_to_warmup`).

Guidance above 1 uses the negative prompt.
"""),
    "flux2_dev_tp8": _text_to_image(
        title="flux2_dev_tp8", model="FLUX.2-dev", offload="none", note_height=240,
        between=(("TPUShardTP", {"degree": 8, "shard_text_encoders": True}),),
        prompt="a cozy reading nook with plants and a large window, morning light, photorealistic",
        width=1024, height=1024, steps=28, guidance=4.0, seed=0, seed_control="randomize", prefix="flux2-dev",
        description="FLUX.2-dev sharded over 8 chips with tensor parallel: Load TPU Pipeline -> Shard TP "
                    "(degree 8) -> Sample (1024x1024, 28 steps, guidance 4) -> Save Image. Needs a host with "
                    "8 chips and models/diffusers/FLUX.2-dev.",
        note="""
## FLUX.2-dev over 8 chips (tensor parallel)

**Load TPU Pipeline** → **Shard TP** (degree 8) → **Sample** (1024×1024, **28 steps, guidance 4**) →
**Save Image**.

**Model**: the diffusers folder of `black-forest-labs/FLUX.2-dev` in `models/diffusers/FLUX.2-dev`.
**Needs 8 chips** on one host (e.g. an 8-chip TPU VM).

**Shard TP** splits every layer of the transformer over the 8 chips: each holds and computes an eighth (the
32B transformer is about 64 GB in bfloat16, 8 GB per chip). `shard_text_encoders` is on, so the Mistral text
encoder (24B) is split the same way instead of being copied onto every chip. The degree must divide the chip
count and the attention heads; the text next to the node lists what is sharded. Offload must stay `none`.

The first Sample loads the weights (each chip reads only its slices).
"""),
    "data_parallel_prompts": _text_to_image(
        title="data_parallel_prompts", model="FLUX.1-schnell", offload="none", note_height=240,
        between=(("TPUDataParallel", {"replicas": 0}),), prompt_per_line=True,
        prompt="\n".join(["a red fox sitting in fresh snow at golden hour",
                          "a lighthouse on a cliff at sunset, oil painting",
                          "a bowl of ramen on a wooden table, studio photo",
                          "a mountain village at night, warm lit windows, snow",
                          "a vintage car on an empty desert road, film photo",
                          "a hummingbird next to a red flower, macro photo",
                          "a futuristic city street in the rain, neon lights",
                          "a cozy reading nook with plants, morning light"]),
        width=1024, height=1024, steps=4, guidance=0.0, seed=0, seed_control="randomize", prefix="flux1-dp",
        description="Data-parallel throughput over all chips: Load TPU Pipeline (FLUX.1-schnell) -> Data "
                    "Parallel (replicas auto: one model copy per chip) -> Sample (prompt_per_line: 8 "
                    "prompts, 1024x1024, 4 steps, guidance 0) -> Save Image. Needs "
                    "models/diffusers/FLUX.1-schnell.",
        note="""
## Data parallel: one prompt per chip

**Load TPU Pipeline** (FLUX.1-schnell) → **Data Parallel** (replicas `0` = auto) → **Sample**
(`prompt_per_line` on: 8 prompts, 1024×1024, **4 steps, guidance 0**) → **Save Image**.

**Model**: `models/diffusers/FLUX.1-schnell`, as in the FLUX.1-schnell workflow.

**Data Parallel** puts a copy of the model on every chip (auto: one per chip) and splits the images of each
Sample between them, in order: on 8 chips the 8 prompts take about as long as one. Each prompt line gets
`batch_size` images; image *i* uses seed + *i*, so any image comes out the same on 1 or 8 chips.

Each copy needs the whole model on its chip (about 34 GB in bfloat16); on smaller chips set offload to
`model` in Load TPU Pipeline (slower).
"""),
    "sd35_cfg_parallel": _text_to_image(
        title="sd35_cfg_parallel", model="stable-diffusion-3.5-medium", offload="none", note_height=260,
        between=(("TPUCFGParallel", {}),),
        prompt="a watercolor painting of a hummingbird drinking from a red flower, soft morning light",
        negative_prompt="blurry, low quality, distorted", width=1024, height=1024, steps=28, guidance=4.5,
        seed=0, seed_control="randomize", prefix="sd35-cfg-parallel",
        description="One SD3.5 image sooner on two chips: Load TPU Pipeline -> CFG Parallel (the two guidance "
                    "passes of every step on two chips) -> Sample (1024x1024, 28 steps, guidance 4.5) -> Save "
                    "Image. Needs 2 chips and models/diffusers/stable-diffusion-3.5-medium.",
        note="""
## SD3.5 Medium, CFG Parallel over 2 chips

**Load TPU Pipeline** → **CFG Parallel** → **Sample** (1024×1024, **28 steps, guidance 4.5**) → **Save Image**.

**Model**: `models/diffusers/stable-diffusion-3.5-medium`. **Needs 2 chips.**

With guidance above 1, SD3 runs its transformer on two halves of every step: with the prompt and with the
negative prompt. **CFG Parallel** gives each half to its own chip and swaps the results once per step, so one
image comes about twice as fast. The image matches one chip's within about 1e-5 (halved batches round
differently in the last bits). The text next to the node says what it does for the chosen model.

Add **Data Parallel** after it to use more chips for more images.
"""),
    "flux1_context_parallel": _text_to_image(
        title="flux1_context_parallel", model="FLUX.1-schnell", offload="none", note_height=260,
        between=(("TPUContextParallel", {"degree": 0, "mode": "ulysses"}),),
        prompt="a vast mountain landscape at dawn, tiny village in the valley, ultra detailed",
        width=2048, height=2048, steps=4, guidance=0.0, seed=0, seed_control="randomize", prefix="flux1-cp",
        description="One large FLUX.1 image sooner over all chips: Load TPU Pipeline (FLUX.1-schnell) -> Context "
                    "Parallel (auto, Ulysses) -> Sample (2048x2048, 4 steps, guidance 0) -> Save Image. Needs "
                    "models/diffusers/FLUX.1-schnell.",
        note="""
## FLUX.1 at 2048², Context Parallel

**Load TPU Pipeline** (FLUX.1-schnell) → **Context Parallel** (degree `0` = auto, `ulysses`) → **Sample**
(2048×2048, **4 steps, guidance 0**) → **Save Image**.

**Model**: `models/diffusers/FLUX.1-schnell`.

At 2048² the transformer sees 16 384 image tokens, and attention grows with their square. **Context
Parallel** (diffusers' own context parallelism) splits the tokens of every block over the chips: with Ulysses
each chip attends over all tokens for a share of the attention heads. Auto uses every chip whose count divides
the heads; the image matches one chip's within about 1e-6. It pays off on large images; at 1024² and below
CFG Parallel or Shard TP usually gain more.
"""),
    "flux1_dev_true_cfg": _text_to_image(
        title="flux1_dev_true_cfg", model="FLUX.1-dev", offload="none", note_height=300,
        between=(("TPUSamplingOptions", {"prompt_cache": True, "batched": True, "true_cfg_scale": 3.5}),
                 ("TPUCFGParallel", {})),
        prompt="studio portrait of an old sailor with a white beard, dramatic light, 85mm photo",
        negative_prompt="cartoon, painting, blurry", width=1024, height=1024, steps=28, guidance=3.5, seed=0,
        seed_control="randomize", batch_size=2, prefix="flux1-dev-true-cfg",
        description="FLUX.1-dev with true CFG on two chips: Load TPU Pipeline -> Sampling Options (prompt cache, "
                    "batched, true_cfg_scale 3.5) -> CFG Parallel -> Sample (1024x1024, 28 steps, guidance 3.5, "
                    "a negative prompt, 2 images) -> Save Image. Needs 2 chips and models/diffusers/FLUX.1-dev.",
        note="""
## FLUX.1-dev with a negative prompt (true CFG), on 2 chips

**Load TPU Pipeline** → **Sampling Options** → **CFG Parallel** → **Sample** (1024×1024, **28 steps, guidance
3.5**, 2 images) → **Save Image**. **Model**: `models/diffusers/FLUX.1-dev`. **Needs 2 chips.**

**Sampling Options**: `true_cfg_scale` 3.5 makes FLUX.1 follow the negative prompt (true classifier-free
guidance: a second transformer pass per step); `prompt_cache` keeps the prompts' embeddings, so the next seed
skips the text encoders; `batched` runs both images in one call (faster; the pixels differ in the last bits
from one call per image).

**CFG Parallel** runs the prompt's pass on one chip and the negative prompt's on the other: the same image as
one chip, bit for bit, in about half the time.
"""),
    "sdxl_sampler_scheduler": _text_to_image(
        title="sdxl_sampler_scheduler", model="stable-diffusion-xl-base-1.0", offload="none", note_height=330,
        prompt="a cozy cabin in a snowy pine forest at dusk, warm light in the windows, detailed, 35mm photo",
        negative_prompt="blurry, low quality, watermark", width=1024, height=1024, steps=30, guidance=6.0, seed=0,
        seed_control="randomize", sampler="dpmpp_2m", scheduler="karras", prefix="sdxl-dpmpp-2m-karras",
        description="SDXL with ComfyUI's sampler and scheduler names: Load TPU Pipeline -> Sample (1024x1024, 30 "
                    "steps, guidance 6, sampler dpmpp_2m, scheduler karras) -> Save Image. Needs "
                    "models/diffusers/stable-diffusion-xl-base-1.0.",
        note="""
## SDXL with a sampler and a scheduler

**Load TPU Pipeline** → **Sample** (1024×1024, 30 steps, guidance 6, **sampler `dpmpp_2m`, scheduler
`karras`**) → **Save Image**. **Model**: `models/diffusers/stable-diffusion-xl-base-1.0`.

Sample's last two inputs take **ComfyUI's own names**. Each runs the diffusers scheduler of the same method:
`dpmpp_2m` + `karras` is `DPMSolverMultistepScheduler` with `use_karras_sigmas` (the table is in
docs/nodes.md). `default` keeps the model's own scheduler.

Changing them **never reloads the weights or recompiles**. A choice the model cannot take is refused before
anything runs, naming the ones it can (FLUX, SD3 and Qwen-Image take the flow-matching ones).
"""),
    "image_qwen_image_2_1_t2i": _text_to_image(
        title="image_qwen_image_2_1_t2i", model="", files=QWEN_IMAGE_21_FILES, offload="auto", note_height=400,
        prompt="a cozy bookshop on a rainy evening, warm light through the window, a cat asleep on a stack of "
               "books, detailed, soft colours",
        negative_prompt="", width=1024, height=1024, steps=25, guidance=1.0, seed=0, seed_control="randomize",
        sampler="euler", scheduler="simple", prefix="qwen-image-2.1",
        description="Qwen-Image 2.1 text to image, as ComfyUI's image_qwen_image_2_1_t2i template: Load TPU "
                    "Pipeline (ComfyUI files: qwen_image_2.1_int8_convrot, qwen3vl_8b_int8_convrot, "
                    "qwen_image_2.1_vae_bf16) -> Sample (1024x1024, 25 steps, guidance 1, euler, simple) -> Save "
                    "Image.",
        note="""
## Qwen-Image 2.1: text to image

**Load TPU Pipeline (ComfyUI files)** → **Sample** (1024×1024, **25 steps, guidance 1, `euler`, `simple`**:
the values of ComfyUI's `image_qwen_image_2_1_t2i` template) → **Save Image**.

**Files**: the template's own: `qwen_image_2.1_int8_convrot` (kept quantized) + `qwen3vl_8b_int8_convrot` +
`qwen_image_2.1_vae_bf16`, made into diffusers' `QwenImage21Pipeline`. The diffusers folder `Qwen-Image-2.1`
loads too, in Load TPU Pipeline.

Guidance is the **true CFG scale**: at 1 (the template's) one pass per step and the negative prompt is not used;
above 1 with a negative prompt, two passes (CFG Parallel splits them). The template's prompt enhancer
(TextGenerate) is not part of this workflow.

Connect images to Sample's `image` to **edit**: every image is a reference (up to the template's 10).

Licence: Qwen Research License (non-commercial).
"""),
    "flux1_dev_comfyui_files": _text_to_image(
        title="flux1_dev_comfyui_files", model="", offload="model", note_height=380,
        files={"diffusion_model": "flux1-dev.safetensors", "text_encoder_1": "clip_l.safetensors",
               "text_encoder_2": "t5xxl_fp8_e4m3fn.safetensors", "text_encoder_3": "(none)",
               "vae": "ae.safetensors", "checkpoint": "(none)"},
        prompt="a cozy cabin in a snowy pine forest at dusk, warm light in the windows, detailed",
        width=1024, height=1024, steps=28, guidance=3.5, seed=0, seed_control="randomize", prefix="flux1-dev",
        description="FLUX.1-dev from the files of ComfyUI's FLUX guide, on one chip with model offload: Load TPU "
                    "Pipeline (ComfyUI files: flux1-dev.safetensors, clip_l, t5xxl_fp8_e4m3fn, ae) -> Sample "
                    "(1024x1024, 28 steps, guidance 3.5) -> Save Image. Needs those files in models/diffusion_models, "
                    "models/text_encoders and models/vae.",
        note="""
## FLUX.1-dev from ComfyUI's own files

**Load TPU Pipeline (ComfyUI files)** → **Sample (TPU)** (1024×1024, **28 steps, guidance 3.5**) →
**Save Image**.

**Files**: the split layout of ComfyUI's FLUX guide, where ComfyUI keeps them (no second copy needed):
- `models/diffusion_models/flux1-dev.safetensors` (or `models/unet/`; `flux1-dev-fp8` works too)
- `models/text_encoders/clip_l.safetensors` and `t5xxl_fp8_e4m3fn.safetensors` (or `t5xxl_fp16`; `models/clip/`
  works too)
- `models/vae/ae.safetensors`

fp8 text encoders are upcast to the compute dtype (bfloat16 on TPU and GPU) as they load; an fp8 diffusion model
keeps its fp8 weights (see flux1_dev_fp8). The model's configuration
ships with ComfyUI-TPU and the tokenizers come from ComfyUI: nothing is downloaded. For FLUX.1-schnell choose
`flux1-schnell.safetensors` (it is recognised: 4 steps, guidance 0).

**Offload `model`**: each part moves to the chip only while it runs; `none` is faster where everything fits.
"""),
    "flux1_dev_fp8": _text_to_image(
        title="flux1_dev_fp8", model="", offload="none", note_height=400,
        files={"diffusion_model": "flux1-dev-fp8-e4m3fn.safetensors", "text_encoder_1": "clip_l.safetensors",
               "text_encoder_2": "t5xxl_fp8_e4m3fn.safetensors", "text_encoder_3": "(none)",
               "vae": "ae.safetensors", "checkpoint": "(none)"},
        prompt="a red fox curled up asleep in fresh snow, morning light, wildlife photo",
        width=1024, height=1024, steps=28, guidance=3.5, seed=0, seed_control="randomize", prefix="flux1-dev-fp8",
        description="FLUX.1-dev in fp8 on one chip without offload: Load TPU Pipeline (ComfyUI files: "
                    "flux1-dev-fp8-e4m3fn.safetensors, clip_l, t5xxl_fp8_e4m3fn, ae; dtype auto keeps the fp8 "
                    "weights, offload none) -> Sample (1024x1024, 28 steps, guidance 3.5) -> Save Image.",
        note="""
## FLUX.1-dev in fp8, on one chip, without offload

**Load TPU Pipeline (ComfyUI files)** → **Sample (TPU)** (1024×1024, **28 steps, guidance 3.5**) →
**Save Image**.

**Files**: `models/diffusion_models/flux1-dev-fp8-e4m3fn.safetensors` (an fp8 FLUX.1-dev transformer, 12 GB),
`models/text_encoders/clip_l.safetensors` and `t5xxl_fp8_e4m3fn.safetensors`, `models/vae/ae.safetensors`.

**fp8 storage**: with dtype `auto` an fp8 diffusion model keeps its fp8 weights on the chip (about 11 GiB
instead of 22 in bfloat16) and each layer is computed in bfloat16 (diffusers' layerwise casting). With the text
encoders and the VAE that is about 20 GiB: one v6e chip (32 GiB) or a 24 GB GPU holds it with offload `none`.
For a bfloat16 file choose dtype `float8_e4m3fn` to store it the same way. Eager modes only: in compiled mode
the weights are upcast to bfloat16 (and need offload `model` on such a chip).
"""),
    "flux1_dev_step_cache": _text_to_image(
        title="flux1_dev_step_cache", model="FLUX.1-dev", offload="auto", note_height=360,
        between=(("TPUSamplingOptions", {"prompt_cache": True, "batched": False, "true_cfg_scale": 1.0,
                                         "step_cache": "first block", "cache_threshold": 0.0}),),
        prompt="a lighthouse on a rocky cliff at dusk, crashing waves, oil painting",
        width=1024, height=1024, steps=28, guidance=3.5, seed=0, seed_control="randomize",
        prefix="flux1-dev-step-cache",
        description="FLUX.1-dev with step caching: Load TPU Pipeline -> Sampling Options (step_cache first block, "
                    "default threshold) -> Sample (1024x1024, 28 steps, guidance 3.5) -> Save Image. Needs "
                    "models/diffusers/FLUX.1-dev.",
        note="""
## FLUX.1-dev with step caching

**Load TPU Pipeline** → **Sampling Options** → **Sample (TPU)** (1024×1024, **28 steps, guidance 3.5**) →
**Save Image**. **Model**: `models/diffusers/FLUX.1-dev`.

**step_cache `first block`** (diffusers' First Block Cache, what TeaCache and WaveSpeed do in ComfyUI): every
step runs the first transformer block; when its output changed less than the threshold since the last full
step, the other blocks are skipped and their cached change reused. `cache_threshold` 0 means the default
(0.08): raise it for speed, lower it for fidelity. The image differs a little from the uncached one.
`taylorseer` and `magcache` are the other kinds for FLUX.1. Eager modes only (not with Compile).
"""),
    "qwen_image_edit_2511_int8": _qwen_edit_int8(),
    "zimage_turbo_int8": _text_to_image(
        title="zimage_turbo_int8", model="", offload="auto", note_height=460,
        files={"diffusion_model": "z_image_turbo_int8_convrot.safetensors",
               "text_encoder_1": "qwen_3_4b_fp8_mixed.safetensors", "text_encoder_2": "(none)",
               "text_encoder_3": "(none)", "vae": "ae.safetensors", "checkpoint": "(none)"},
        prompt="a red fox in fresh snow at sunrise, soft golden light, detailed fur, photograph",
        width=1024, height=1024, steps=8, guidance=0.0, seed=0, seed_control="randomize", prefix="z-image-turbo",
        description="ComfyUI's 'Z-Image-Turbo Int8: Text to Image' template with the pack's nodes and the same files: "
                    "Load TPU Pipeline (ComfyUI files: z_image_turbo_int8_convrot, qwen_3_4b_fp8_mixed, ae) -> Sample "
                    "(1024x1024, 8 steps, guidance 0) -> Save Image. The quantized weights stay quantized.",
        note="""
## Z-Image Turbo Int8 (ComfyUI's template, the pack's nodes)

ComfyUI's **Z-Image-Turbo Int8** template (UNETLoader, CLIPLoader, VAELoader, KSampler 8 steps cfg 1) as
**Load TPU Pipeline (ComfyUI files)** → **Sample (TPU)** (1024×1024, **8 steps, guidance 0**) → **Save Image**.

**Files**: the template's own, where ComfyUI keeps them:
- `models/diffusion_models/z_image_turbo_int8_convrot.safetensors` (int8 ConvRot)
- `models/text_encoders/qwen_3_4b_fp8_mixed.safetensors` (fp8 with a few nvfp4 layers)
- `models/vae/ae.safetensors`

**Quantized files** stay quantized in memory: each layer is dequantized as it runs (comfy-kitchen). On a TPU
the int8 and fp8 layers stay quantized, and the text encoder's nvfp4 layers are dequantized at load. See
docs/quantized.md.

**Guidance 0** is KSampler's cfg 1: Turbo runs one pass per step.
"""),
    "zimage_turbo_comfyui_files": _text_to_image(
        title="zimage_turbo_comfyui_files", model="", offload="auto", note_height=420,
        files={"diffusion_model": "z_image_turbo_bf16.safetensors", "text_encoder_1": "qwen_3_4b.safetensors",
               "text_encoder_2": "(none)", "text_encoder_3": "(none)", "vae": "ae.safetensors",
               "checkpoint": "(none)"},
        prompt="a red fox in fresh snow at sunrise, soft golden light, detailed fur, photograph",
        width=1024, height=1024, steps=8, guidance=0.0, seed=0, seed_control="randomize", prefix="zimage-turbo",
        description="Z-Image Turbo from the files of ComfyUI's Z-Image template: Load TPU Pipeline (ComfyUI files: "
                    "z_image_turbo_bf16, qwen_3_4b, ae) -> Sample (1024x1024, 8 steps, guidance 0) -> Save Image. "
                    "Needs those files in models/diffusion_models, models/text_encoders and models/vae.",
        note="""
## Z-Image Turbo from ComfyUI's own files

**Load TPU Pipeline (ComfyUI files)** → **Sample (TPU)** (1024×1024, **8 steps, guidance 0**) → **Save Image**.

**Files**: those of ComfyUI's Z-Image Turbo template, where ComfyUI keeps them:
- `models/diffusion_models/z_image_turbo_bf16.safetensors` (or an fp8 file of it)
- `models/text_encoders/qwen_3_4b.safetensors` (the same file FLUX.2 [klein] 4B reads)
- `models/vae/ae.safetensors` (FLUX.1's VAE)

**Guidance 0**: Turbo is guidance-distilled, so it runs one pass per step. Guidance here is diffusers'
`guidance_scale`: any value above 0 turns CFG on (two passes per step; ComfyUI's cfg is this value + 1), which
the base Z-Image model wants (around 28-50 steps, guidance 3-5, with a negative prompt).

**Offload `auto`**: everything stays on a chip with 32 GB or more; on a 16 GB v5e the transformer (12.3 GB in
bfloat16) and the text encoder (8 GB) take turns. More chips: Data Parallel (the model has no Shard TP plan).
"""),
}


SPECS.update({
    "flux1_img2img": _image_workflow(
        title="flux1_img2img", prompt="the same scene as a watercolor painting, soft colors", steps=4, denoise=0.6,
        seed=0, prefix="flux1-img2img",
        description="Image to image with FLUX.1-schnell: Load Image -> Sample (denoise 0.6, 4 steps, size from the "
                    "image) -> Save Image. Needs models/diffusers/FLUX.1-schnell.",
        note="""
## Image to image

**Load Image** → **Sample (TPU)** (`image` connected, **denoise 0.6**, 4 steps) → **Save Image**.

**denoise** says how much of the picture is repainted: 1 repaints all of it, 0.3–0.6 keeps its layout and
colours, 0 returns it unchanged. `steps` steps run either way (over the end of a schedule of steps ÷ denoise
steps, as in ComfyUI's KSampler). `size_from_image` is on, so the result has the image's size (rounded down to a
multiple of 16); turn it off to get width × height instead (the image is then stretched, never cropped).

Pick your own picture in Load Image (or drop one on it). **Model**: `models/diffusers/FLUX.1-schnell`.
"""),
    "flux1_inpaint": _image_workflow(
        title="flux1_inpaint", prompt="a red fox sitting in the grass", steps=4, denoise=0.8, seed=0,
        prefix="flux1-inpaint", grow_mask=8,
        description="Inpainting with FLUX.1-schnell: Load Image (its mask from the mask editor) -> Grow Mask (8 px) "
                    "-> Sample (image + mask, denoise 0.8) -> Save Image. Needs models/diffusers/FLUX.1-schnell.",
        note="""
## Inpainting: repaint part of a picture

**Load Image** → **Grow Mask** (8 px) → **Sample (TPU)** (`image` and `mask`, denoise 0.8) → **Save Image**.

Draw the mask on the picture: right-click Load Image → **Open in MaskEditor**, paint over what should change,
save. White (painted) is repainted, the rest is kept. **Grow Mask** widens it a little so the new part blends in.
A mask of another size than the picture is stretched to it; the text next to Sample says so.

Lower **denoise** keeps more of what was under the mask. **Model**: `models/diffusers/FLUX.1-schnell`.
"""),
    "flux1_lora": _text_to_image(
        title="flux1_lora", model="FLUX.1-schnell", offload="model", note_height=300,
        between=(("TPULoadLoRA", {"lora_name": "flux1_style_lora.safetensors", "strength": 0.8,
                                  "strength_text_encoder": 1.0}),
                 ("TPULoadLoRA", {"lora_name": "flux1_detail_lora.safetensors", "strength": 0.5,
                                  "strength_text_encoder": 1.0})),
        prompt="a portrait of an old fisherman, dramatic light", width=1024, height=1024, steps=4, guidance=0.0,
        seed=0, seed_control="randomize", prefix="flux1-lora",
        description="Two LoRAs on FLUX.1-schnell: Load TPU Pipeline -> Load LoRA (TPU) x2 (strengths 0.8 and 0.5) "
                    "-> Sample (1024x1024, 4 steps) -> Save Image. Needs models/diffusers/FLUX.1-schnell and your "
                    "LoRA files in models/loras.",
        note="""
## LoRAs: chain as many as you like

**Load TPU Pipeline** → **Load LoRA (TPU)** (strength 0.8) → **Load LoRA (TPU)** (strength 0.5) → **Sample** →
**Save Image**.

Put LoRA files (**.safetensors**) made for FLUX.1 in `models/loras` and pick them in each Load LoRA (press R to
refresh the list). diffusers reads the common formats: diffusers/PEFT, kohya, ComfyUI-saved, XLabs.

The model is **not reloaded** when you add, remove or re-weight a LoRA: the worker rewrites only the layers the
LoRA touches (no recompile either). `strength` scales the image model, `strength_text_encoder` the text encoder
(for LoRAs that have one). A LoRA for another model is refused with a message; the model stays as it was.
"""),
    "flux1_kontext_edit": _flux1_tool(
        title="flux1_kontext_edit", diffusion_model="flux1-kontext-dev.safetensors",
        prompt="make it a watercolor painting, keep the composition", steps=28, guidance=2.5,
        prefix="flux1-kontext",
        description="FLUX.1 Kontext editing a picture: Load TPU Pipeline (ComfyUI files: flux1-kontext-dev, clip_l, "
                    "t5xxl_fp8_e4m3fn, ae) and Load Image -> Sample (the picture as the reference, an instruction as "
                    "the prompt, 28 steps, guidance 2.5, size from the picture) -> Save Image.",
        note="""
## FLUX.1 Kontext: edit a picture by saying what to change

**Load TPU Pipeline (ComfyUI files)** and **Load Image** → **Sample (TPU)** (the picture in `image`, an
instruction as the prompt, 28 steps, guidance 2.5) → **Save Image**.

**Files**: `models/diffusion_models/flux1-kontext-dev.safetensors` (or Comfy-Org's
`flux1-dev-kontext_fp8_scaled`), `clip_l`, `t5xxl_fp8_e4m3fn`, `ae` as for FLUX.1-dev. A Kontext file has the
same tensors as FLUX.1-dev: it is recognised by the **kontext** in its name (`flux_kontext` auto); for a renamed
file set `flux_kontext` to on.

The picture is resized to the Kontext resolution nearest its shape (about one megapixel, as ComfyUI's
FluxKontextImageScale does); the result has the picture's size (`size_from_image`, rounded to 16 pixels).
"""),
    "flux1_fill_outpaint": _flux1_tool(
        title="flux1_fill_outpaint", diffusion_model="flux1-fill-dev.safetensors",
        prompt="a wide mountain valley at sunrise, the same style", steps=28, guidance=30.0, prefix="flux1-fill",
        pad={"left": 0, "top": 0, "right": 256, "bottom": 0, "feathering": 24},
        description="FLUX.1 Fill outpainting: Load Image -> ComfyUI's Pad Image for Outpainting (256 px on the right) "
                    "-> Sample (the padded image and its mask, 28 steps, guidance 30) with Load TPU Pipeline (ComfyUI "
                    "files: flux1-fill-dev, clip_l, t5xxl_fp8_e4m3fn, ae) -> Save Image.",
        note="""
## FLUX.1 Fill: outpainting (and inpainting)

**Load Image** → **Pad Image for Outpainting** (256 px on the right) → **Sample (TPU)** (`image` and `mask`,
28 steps, **guidance 30**) → **Save Image**.

**Files**: `models/diffusion_models/flux1-fill-dev.safetensors` (recognised by its shapes), `clip_l`,
`t5xxl_fp8_e4m3fn`, `ae`. Fill repaints the white part of the mask and keeps the rest; it needs a mask (Sample
refuses it without one). To inpaint instead, connect Load Image's mask (drawn in the mask editor) directly.
"""),
    "flux1_hires_fix": _hires_fix(),
    "flux1_latent_hires_fix": _latent_hires_fix(),
    "flux1_dev_clip_text_encode": _clip_text_encode(),
    "flux1_controlnet_union": _controlnet_workflow(
        name="flux1_controlnet_union", model="FLUX.1-dev", canny=(0.2, 0.6),
        controlnets=[{"controlnet_name": "FLUX.1-dev-ControlNet-Union-Pro.safetensors", "strength": 0.7,
                      "start_percent": 0.0, "end_percent": 0.8, "union_mode": "canny"}],
        prompt="a cozy cabin in a snowy forest at dusk, warm light in the windows", negative_prompt="", steps=28,
        guidance=3.5,
        description="FLUX.1-dev with a union ControlNet: Load Image -> ComfyUI's Canny -> Apply ControlNet (TPU) "
                    "(union mode canny, strength 0.7, steps 0-0.8) -> Sample (1024x1024, 28 steps) -> Save Image. "
                    "Needs models/diffusers/FLUX.1-dev and the union ControlNet in models/controlnet.",
        note="""
## FLUX.1 with a union ControlNet

**Load Image** → ComfyUI's **Canny** → **Apply ControlNet (TPU)** (union mode `canny`, strength 0.7, acting on the
first 80 % of the steps) → **Sample** → **Save Image**.

A *union* ControlNet (InstantX's, Shakker-Labs' Union Pro) is one model for several kinds of control image; say
which kind in `union_mode`. Put its `diffusion_pytorch_model.safetensors` in `models/controlnet` (renamed as you
like). The control image is resized to Sample's size as ComfyUI does (centre crop, nearest).

Changing strength, start, end or the image never reloads the model (nor recompiles it in compiled mode).
**Model**: `models/diffusers/FLUX.1-dev`.
"""),
    "sdxl_two_controlnets": _controlnet_workflow(
        name="sdxl_two_controlnets", model="stable-diffusion-xl-base-1.0", canny=(0.3, 0.7),
        controlnets=[{"controlnet_name": "controlnet-canny-sdxl-1.0.safetensors", "strength": 0.6,
                      "start_percent": 0.0, "end_percent": 1.0, "union_mode": "none"},
                     {"controlnet_name": "controlnet-depth-sdxl-1.0.safetensors", "strength": 0.4,
                      "start_percent": 0.0, "end_percent": 0.6, "union_mode": "none", "picture": "depth.png"}],
        prompt="a lighthouse on a rocky coast, stormy sea, dramatic clouds",
        negative_prompt="blurry, low quality", steps=30, guidance=6.0,
        description="SDXL with two chained ControlNets: Load Image -> Canny -> Apply ControlNet (canny, 0.6) -> Apply "
                    "ControlNet (a depth map from Load Image, 0.4, steps 0-0.6) -> Sample (1024x1024, 30 steps) -> "
                    "Save Image. Needs models/diffusers/stable-diffusion-xl-base-1.0 and the two ControlNets.",
        note="""
## SDXL with two ControlNets

**Load Image** → **Canny** → **Apply ControlNet (TPU)** (canny, 0.6) → **Apply ControlNet (TPU)** (depth, 0.4, first
60 % of the steps) → **Sample** → **Save Image**. The depth map comes from its own **Load Image** (or a depth
preprocessor).

Chain as many as you like: they run together in one diffusers ControlNet pipeline. Put each ControlNet's
`diffusion_pytorch_model.safetensors` (e.g. diffusers/controlnet-canny-sdxl-1.0) in `models/controlnet`, renamed.
Union ControlNets (xinsir) chain with each other, not with these. **Model**:
`models/diffusers/stable-diffusion-xl-base-1.0`.
"""),
    "zimage_turbo_controlnet_union": _controlnet_workflow(
        name="zimage_turbo_controlnet_union", model="", canny=(0.2, 0.6),
        files={"diffusion_model": "z_image_turbo_bf16.safetensors", "text_encoder_1": "qwen_3_4b.safetensors",
               "text_encoder_2": "(none)", "text_encoder_3": "(none)", "vae": "ae.safetensors",
               "checkpoint": "(none)"},
        controlnets=[{"controlnet_name": "Z-Image-Turbo-Fun-Controlnet-Union-2.1.safetensors", "strength": 0.75,
                      "start_percent": 0.0, "end_percent": 1.0, "union_mode": "none"}],
        prompt="a cozy cabin in a snowy forest at dusk, warm light in the windows", negative_prompt="", steps=8,
        guidance=0.0,
        description="Z-Image Turbo (ComfyUI's files) with its union ControlNet: Load Image -> ComfyUI's Canny -> "
                    "Apply ControlNet (TPU) (strength 0.75) -> Sample (1024x1024, 8 steps, guidance 0) -> Save Image. "
                    "Needs z_image_turbo_bf16, qwen_3_4b and ae in ComfyUI's folders and "
                    "Z-Image-Turbo-Fun-Controlnet-Union-2.1.safetensors in models/controlnet.",
        note="""
## Z-Image Turbo with its union ControlNet

**Load TPU Pipeline (ComfyUI files)** and **Load Image** → ComfyUI's **Canny** → **Apply ControlNet (TPU)**
(strength 0.75) → **Sample** (1024×1024, **8 steps, guidance 0**) → **Save Image**.

**ControlNet**: alibaba-pai's `Z-Image-Turbo-Fun-Controlnet-Union-2.1.safetensors` (1.0 and 2.0 work too) in
`models/controlnet` (ComfyUI's own nodes keep it in `models/model_patches`). *Union*: one model for canny, depth,
pose, ...; it reads the kind from the image, so `union_mode` stays `none`. diffusers' Z-Image ControlNet pipeline
applies it at every step (start 0, end 1) and runs one ControlNet at a time.

**Files**: those of ComfyUI's Z-Image Turbo template (`z_image_turbo_bf16`, `qwen_3_4b`, `ae`).
"""),
    "flux1_redux": _redux_workflow(),
    "wan21_t2v": _wan_text_to_video(),
    "wan21_i2v": _wan_image_to_video(),
    "wan22_5b_t2v_comfyui_files": _wan22_5b_files(),
    "wan22_14b_i2v_comfyui_files": _wan22_14b_i2v_files(),
    "ltx2_t2v_sound": _ltx2_text_to_video(),
    "video_ltx2_3_i2v": _ltx2_image_to_video(),
    "video_ltx2_5_t2v": _ltx25(image=False),
    "video_ltx2_5_i2v": _ltx25(image=True),
    "video_ltx2_3_ia2v": _ltx2_image_audio_to_video(),
    **{name: _minimax_h3(name) for name in ("video_minimax_h3_t2v", "video_minimax_h3_i2v", "video_minimax_h3_r2v")},
    "image_qwen_image_2_1_image_edit": _qwen_image_21_edit(),
    "image_krea2_turbo_t2i": _text_to_image(
        title="image_krea2_turbo_t2i", model="", offload="auto", note_height=420,
        files={"diffusion_model": "krea2_turbo_fp8_scaled.safetensors",
               "text_encoder_1": "qwen3vl_4b_fp8_scaled.safetensors", "vae": "qwen_image_vae.safetensors", **NO_FILE},
        prompt="A high-resolution, surreal digital illustration showing a human hand holding a martini glass. The "
               "image is overlaid with whimsical, expressive ink-style doodles, including a cartoon figure inside "
               "the glass, a drawn citrus wedge on the rim, and various abstract sketches and faces surrounding the "
               "glass against a clean, white background. The style seamlessly blends a realistic, lit photograph "
               "with loose, hand-drawn marker artistry, creating a playful and artistic juxtaposition.",
        width=1024, height=1024, steps=8, guidance=0.0, seed=0, seed_control="randomize", sampler="euler",
        scheduler="simple", prefix="Krea2_turbo",
        description="Krea 2 Turbo text to image, as ComfyUI's image_krea2_turbo_t2i template: Load TPU Pipeline "
                    "(ComfyUI files: krea2_turbo_fp8_scaled, qwen3vl_4b_fp8_scaled, qwen_image_vae) -> Sample "
                    "(1024x1024, 8 steps, guidance 0 = ComfyUI's cfg 1, euler, simple) -> Save Image.",
        note="""
## Krea 2 Turbo: text to image

**Load TPU Pipeline (ComfyUI files)** → **Sample** (1024×1024, **8 steps, guidance 0, `euler`, `simple`**:
the values of ComfyUI's `image_krea2_turbo_t2i` template) → **Save Image**.

**Guidance 0** is the template's cfg 1: here guidance is diffusers' Krea `guidance_scale` (ComfyUI's cfg is it
+ 1), so Turbo runs one pass per step and the negative prompt is not used.

**The template's LoRA is left out**: its `krea2_darkbrush.safetensors` (0.8, trigger *muted minimalist sketch
style*) sits behind a switch that is off by default. To use it, put it in `models/loras`, add **Load LoRA
(TPU)** between Load and Sample (strength 0.8) and end the prompt with the trigger. The prompt enhancer (on in
the template, an LLM pass) is not part of this workflow.

**Files**: the template's own: `krea2_turbo_fp8_scaled` (Turbo: the name says `turbo`) +
`qwen3vl_4b_fp8_scaled` + `qwen_image_vae`, made into diffusers' `Krea2Pipeline`. The diffusers folder
`Krea-2-Turbo` loads too, in Load TPU Pipeline.
"""),
    "image_ideogram4_t2i": _text_to_image(
        title="image_ideogram4_t2i", model="", offload="auto", note_height=440,
        files={"diffusion_model": "ideogram4_fp8_scaled.safetensors",
               "diffusion_model_2": "ideogram4_unconditional_fp8_scaled.safetensors",
               "text_encoder_1": "qwen3vl_8b_fp8_scaled.safetensors", "vae": "flux2-vae.safetensors", **NO_FILE},
        prompt=IDEOGRAM4_PROMPT, width=768, height=1376, steps=20, guidance=7.0, seed=0, seed_control="randomize",
        sampler="euler", prefix="Ideogram_4.0",
        description="Ideogram 4 text to image, as ComfyUI's image_ideogram4_t2i template with its Default preset: "
                    "Load TPU Pipeline (ComfyUI files: ideogram4_fp8_scaled, ideogram4_unconditional_fp8_scaled, "
                    "qwen3vl_8b_fp8_scaled, flux2-vae) -> Sample (768x1376, 20 steps, guidance 7, euler, a JSON "
                    "caption as the prompt) -> Save Image.",
        note="""
## Ideogram 4: text to image

**Load TPU Pipeline (ComfyUI files)** → **Sample** (768×1376, **20 steps, guidance 7, `euler`**: ComfyUI's
`image_ideogram4_t2i` template with its **Default** preset; 9:16 at one megapixel is Resolution Selector's
768×1368, which the template rounds up to a multiple of 16) → **Save Image**.

The prompt is a **structured JSON caption** (the template's): a summary, a style block, and elements with
boxes and colours. Plain text works too, less predictably.

Guidance blends the model's two transformers (conditional and unconditional) at every step: two passes, no
negative prompt. The template lowers it to 3 for the last 30 % of the steps and sets the preset's sigmas (mu 0,
std 1.75); one guidance number cannot say the first, and the second is diffusers' own schedule (std 1.5).

**Files**: the template's own: `ideogram4_fp8_scaled` in diffusion_model, `ideogram4_unconditional_fp8_scaled`
in diffusion_model_2, `qwen3vl_8b_fp8_scaled`, `flux2-vae`, made into diffusers' `Ideogram4Pipeline`
(`transformer` and `unconditional_transformer`). The diffusers folder `Ideogram-4` loads too, in Load TPU
Pipeline.
"""),
    "image_qwen_image_2_1_turbo_image_edit": _qwen_image_21_turbo_edit(),
    "image_flux3_klein_t2i": _flux3_klein_t2i(),
    "image_flux3_klein_image_edit": _flux3_klein_edit(),
})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"workflows to build (default: all of {', '.join(SPECS)})")
    parser.add_argument("--out", default=str(WORKFLOWS), help="output folder")
    args = parser.parse_args()
    names = args.names or list(SPECS)
    unknown = set(names) - set(SPECS)
    if unknown:
        parser.error(f"unknown workflows: {', '.join(sorted(unknown))}")
    with open_frontend() as (_, ui):
        for name in names:
            workflow = ui.build(SPECS[name])
            workflow["id"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"comfyui-tpu/workflows/{name}"))  # stable id
            conversion = ui.convert(workflow, name)
            # models, model files, LoRAs and input pictures need not be installed here
            conversion.check(allowed_values=dict.fromkeys((*MODEL_INPUTS, *USER_FILE_INPUTS)))
            path = Path(args.out) / f"{name}.json"
            path.write_text(json.dumps(workflow, indent=2) + "\n")
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
