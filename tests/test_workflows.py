"""Every shipped workflow is a test: it loads in the real ComfyUI frontend, converts, runs and makes images.

The UI workflows (workflows/*.json, what the frontend saves and artists share) are opened in the server's own
web frontend in headless Chromium (scripts/frontend.py); the frontend must know every node and accept every
widget value, and its app.graphToPrompt() gives the API prompt, which runs on the real server with the real
model names replaced by tiny models (TINY below: the workflow files keep the real names). The derived API
copies (workflows/api/) must match, and ComfyUI's template browser must list the workflows.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from comfy_server import error_message
from export_api_workflows import api_path, render
from frontend import (
    MODEL_INPUTS,
    Conversion,
    Frontend,
    find_chromium,
    load_ui_workflow,
    run_workflow,
    substitute_models,
    workflow_files,
)
from helpers import device_info
from lora_fixtures import make
from PIL import Image

from backend.families.ltx2.tiny import upsampler

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / "workflows"
FILES = workflow_files(WORKFLOWS)
PACK = "ComfyUI-TPU"  # the pack's folder name under custom_nodes (scripts/comfy_server.py links it so)
NOTES = {"Note", "MarkdownNote"}  # frontend-only nodes: not part of the prompt

# Real model name -> tiny stand-in (built by the `tiny_models` fixture). A workflow naming another model fails
# here until its tiny stand-in is added.
TINY = {
    "tiny-flux": "tiny-flux",
    "FLUX.1-schnell": "tiny-flux",
    "FLUX.1-dev": "tiny-flux",
    "stable-diffusion-3.5-medium": "tiny-sd3",
    "stable-diffusion-xl-base-1.0": "tiny-sdxl",
    "FLUX.2-dev": "tiny-flux2",  # 2 attention heads: Shard TP 2 works
    "Wan2.1-T2V-1.3B-Diffusers": "tiny-wan",
    "Wan2.1-I2V-14B-480P-Diffusers": "tiny-wan-i2v",
    "LTX-2": "tiny-ltx2",
    "LTX-2.5": "tiny-ltx25",
    "MiniMax-H3": "tiny-minimax-h3",
    # model files in ComfyUI's folders -> the tiny FLUX.1 files written by ComfyUI's own code (file_fixtures.py)
    "flux1-dev.safetensors": "flux1-tiny.safetensors",
    "flux1-dev-fp8-e4m3fn.safetensors": "flux1-tiny-fp8-e5m2.safetensors",  # a plain fp8 transformer file
    "clip_l.safetensors": "clip_l-tiny.safetensors",
    "t5xxl_fp8_e4m3fn.safetensors": "t5xxl-tiny_fp8_e4m3fn.safetensors",
    "ae.safetensors": "ae-tiny.safetensors",
    "flux1-kontext-dev.safetensors": "flux1-kontext-tiny.safetensors",
    "flux1-fill-dev.safetensors": "flux1-fill-tiny.safetensors",
    "z_image_turbo_bf16.safetensors": "z_image_turbo-tiny_bf16.safetensors",
    "qwen_3_4b.safetensors": "qwen_3-tiny.safetensors",
    # ComfyUI's quantized files (int8 ConvRot; fp8 + nvfp4), quantized by comfy-kitchen (file_fixtures.py)
    "z_image_turbo_int8_convrot.safetensors": "z_image_turbo-tiny_int8_convrot.safetensors",
    "qwen_3_4b_fp8_mixed.safetensors": "qwen_3-tiny_fp8_mixed.safetensors",
    "qwen_image_edit_2511_int8_convrot.safetensors": "qwen_image_edit_2511-tiny_int8_convrot.safetensors",
    "qwen_2.5_vl_7b_fp8_scaled.safetensors": "qwen_2.5_vl-tiny.safetensors",
    "qwen_image_vae.safetensors": "qwen_image_vae-tiny.safetensors",
    "wan2.2_ti2v_5B_fp16.safetensors": "wan2.2_ti2v-tiny.safetensors",
    "umt5_xxl_fp8_e4m3fn_scaled.safetensors": "umt5_xxl-tiny_fp8_e4m3fn_scaled.safetensors",
    "wan2.2_vae.safetensors": "wan2.2_vae-tiny.safetensors",
    "wan2.2_i2v_high_noise_14B_fp8_scaled.safetensors": "wan2.2_i2v_high_noise-tiny.safetensors",
    "wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors": "wan2.2_i2v_low_noise-tiny.safetensors",
    "wan_2.1_vae.safetensors": "wan_2.1_vae-tiny.safetensors",
    # the 2026 image templates' files (tests/file_fixtures.py qwenimage21, krea2, krea2-quant, flux3, ideogram4).
    # Qwen-Image 2.1: no int8 ConvRot fixture of its transformer or Qwen3-VL-8B exists, so the plain tiny files
    # stand in for the template's int8 ones (tests/test_files.py quantizes both on the fly); the Turbo file loads
    # with the base model's configs (Sampling Options' sigmas give the Turbo schedule), so the same file
    "qwen_image_2.1_int8_convrot.safetensors": "qwen_image_2.1-tiny.safetensors",  # plain: no int8 fixture
    "qwen_image_2.1_turbo_int8_convrot.safetensors": "qwen_image_2.1-tiny.safetensors",  # plain: no int8 fixture
    "qwen3vl_8b_int8_convrot.safetensors": "qwen3vl_8b-tiny.safetensors",  # plain: no int8 fixture
    "qwen_image_2.1_vae_bf16.safetensors": "qwen_image_2.1_vae-tiny.safetensors",
    # Krea 2 Turbo's scaled fp8 transformer: no scaled-fp8 Krea fixture exists, so its int8 ConvRot one (quantized,
    # kept so in the worker) stands in; Qwen3-VL-4B in scaled fp8: plain, no quantized fixture of it
    "krea2_turbo_fp8_scaled.safetensors": "krea2_turbo-tiny_int8_convrot.safetensors",  # int8 for scaled fp8
    "qwen3vl_4b_fp8_scaled.safetensors": "qwen3vl_4b-tiny.safetensors",  # plain: no quantized fixture
    # FLUX 3 [klein] base in int8 ConvRot as the template's (256 wide); its int8 Qwen3-VL-4B: plain, no fixture
    "flux3-image-klein-base-int8-convrot.safetensors": "flux3-image-klein-base-int8-convrot-tiny.safetensors",
    "qwen3vl_4b_int8_convrot.safetensors": "qwen3vl_4b-tiny.safetensors",  # plain: no int8 fixture
    "flux2-vae.safetensors": "flux2-vae-tiny.safetensors",
    # Ideogram 4's two transformers in ComfyUI's scaled fp8, as the template's; its scaled-fp8 Qwen3-VL-8B: plain
    "ideogram4_fp8_scaled.safetensors": "ideogram4-tiny_fp8_scaled.safetensors",
    "ideogram4_unconditional_fp8_scaled.safetensors": "ideogram4_unconditional-tiny_fp8_scaled.safetensors",
    "qwen3vl_8b_fp8_scaled.safetensors": "qwen3vl_8b-36layers-tiny.safetensors",  # plain: no quantized fixture
    # LTX-2.3's checkpoint (fp8, as published) and Gemma 3 in fp4 mixed (nvfp4 + fp8), named as the templates name them
    "ltx-2.3-22b-dev-fp8.safetensors": "ltx-2.3-22b-dev-fp8.safetensors",
    "gemma_3_12B_it_fp4_mixed.safetensors": "gemma_3_12B_it_fp4_mixed.safetensors",
    # MiniMax H3's t2v / i2v and r2v templates' files, quantized as theirs (file_fixtures.py minimax_h3)
    "minimax_h3_fl2va_pruned_int8_convrot.safetensors": "minimax_h3_fl2va_pruned-tiny_int8_convrot.safetensors",
    "minimax_h3_ref2va_pruned_int8_convrot.safetensors": "minimax_h3_ref2va_pruned-tiny_int8_convrot.safetensors",
    "qwen3vl_32b_minimax_h3_nvfp4_awq.safetensors": "qwen3vl_32b_minimax_h3-tiny_nvfp4_awq.safetensors",
    "minimax_h3_video_vae_int8_convrot.safetensors": "minimax_h3_video_vae-tiny_int8_convrot.safetensors",
    "minimax_h3_audio_vae_fp32.safetensors": "minimax_h3_audio_vae-tiny_fp32.safetensors",
    "(none)": "(none)",
}
REAL_NAMES = {name for name in TINY if not name.startswith("tiny-")} - {"(none)"}  # tiny_demo runs as shipped
# ... and where one workflow's file needs another tiny stand-in than TINY's: Krea 2's tiny VAE is not Qwen-Image's
TINY_OF = {"image_krea2_turbo_t2i": {"qwen_image_vae.safetensors": "qwen_image_vae-krea2-tiny.safetensors"}}
# LoRA files the workflows name -> the tiny model whose LoRA (made by peft at test time) stands in for them, and
# the seed it is made with. Input pictures the workflows name (Load Image) -> their size on the CPU; each is an
# RGBA picture with a transparent square (Load Image's mask: the part to repaint).
LORAS = {"flux1_style_lora.safetensors": ("tiny-flux", 0), "flux1_detail_lora.safetensors": ("tiny-flux", 1),
         "ltx_2.3_22b_distilled_1.1_lora_dynamic_fro09_avg_rank_111_bf16.safetensors": ("tiny-ltx2", 0)}
# LTX-2's x2 latent upscalers the workflows name (models/latent_upscale_models) -> the tiny one's seed
UPSCALERS = {"ltx-2.3-spatial-upscaler-x2-1.1.safetensors": 0,
             "ltx-2.5-latent-spatial-upscaler-x2-bf16-1.0.safetensors": 1}
INPUTS = {"example.png": (64, 64), "depth.png": (48, 64), "reference.png": (64, 48), "cactus_man.png": (64, 64),
          # the r2v template's references: MiniMax H3 resizes each to its published 2048-pixel short edge
          "red_superboy_on_city_roof.png": (64, 64), "mecha_dragon_lightning.png": (64, 48)}
# Sounds the workflows name (Load Audio) -> their length in seconds on the CPU: a stereo sine at 44.1 kHz as an mp3
# (written with PyAV, ComfyUI's own), as long as tiny-ltx2's 9 frames at 24 fps, resampled to its audio VAE's 16 kHz
SOUNDS = {"ltx_23_audio.mp3": 0.4}
# ControlNet files the workflows name -> the tiny ControlNet (backend.tiny_models.CONTROLNETS) standing in
CONTROLNETS = {"FLUX.1-dev-ControlNet-Union-Pro.safetensors": "flux-union",
               "controlnet-canny-sdxl-1.0.safetensors": "sdxl", "controlnet-depth-sdxl-1.0.safetensors": "sdxl",
               "Z-Image-Turbo-Fun-Controlnet-Union-2.1.safetensors": "zimage"}
# FLUX.1 Redux's files the workflows name (models/style_models, models/clip_vision) -> the tiny ones
# (tests/file_fixtures.py flux1redux, for the tiny FLUX.1's 32-wide text)
REDUX = {"style_models/flux1-redux-dev.safetensors": "style_models/flux1-redux-tiny.safetensors",
         "clip_vision/sigclip_vision_patch14_384.safetensors": "clip_vision/sigclip_vision_patch14_384-tiny.safetensors"}
SIZE_FACTOR = 16  # of the tiny models the workflows run on (FLUX.1, SD3, FLUX.2, Z-Image, Wan)
# the families whose tiny files the workflows use (comfyui_files' families, built from the start: conftest)
COMFYUI_FILES = ("flux1", "flux1tools", "flux1redux", "zimage", "zimage-quant", "wan", "qwenimage", "qwenimage-quant",
                 "flux2", "krea2", "krea2-quant", "qwenimage21", "flux3", "ideogram4", "ltx2", "minimax_h3")
# names the frontend may not find here (not installed where the UI loads)
ALLOWED = {**{name: set(TINY) for name in MODEL_INPUTS}, "lora_name": set(LORAS), "image": set(INPUTS),
           "audio": set(SOUNDS),
           "controlnet_name": set(CONTROLNETS), "style_model_name": {Path(n).name for n in REDUX if "style" in n},
           "clip_vision_name": {Path(n).name for n in REDUX if "clip_vision" in n}, "upscale_model": set(UPSCALERS)}
# Real-size settings that would take minutes on the CPU, by node type and input: set in the converted API
# prompt of every workflow that names a real model (the files keep the real values; tiny_demo runs as
# shipped). Multi-chip workflows run with world size 2 (two CPU worker processes).
CPU_SETTINGS = {
    "TPUSample": {"width": 64, "height": 64, "steps": 2},
    "TPUSampleLatent": {"width": 64, "height": 64, "steps": 2},
    "TPUSampleVideo": {"width": 32, "height": 32, "frames": 5, "steps": 2},
    "TPUCompile": {"backend": "eager", "warmup": "64x64"},
    "TPUShardTP": {"degree": 2},
    "TPUDataParallel": {"replicas": 2},
    "TPUContextParallel": {"degree": 2},
}
# ... and where the tiny model needs more (tiny-ltx2: sides of 32 and a 2x2 latent, 8k + 1 frames; 128: a
# two-stage upscale's first stage at 64)
CPU_SETTINGS_OF = {"tiny-ltx2": {"TPUSampleVideo": {"width": 128, "height": 128, "frames": 9}},
                   "ltx-2.3-22b-dev-fp8.safetensors": {"TPUSampleVideo": {"width": 128, "height": 128, "frames": 9}},
                   "tiny-ltx25": {"TPUSampleVideo": {"width": 128, "height": 128, "frames": 9}},
                   # tiny-minimax-h3: sides of 32, and its shortest video (17n + 5 frames, at least 5 s at 24 fps)
                   "tiny-minimax-h3": {"TPUSampleVideo": {"width": 32, "height": 32, "frames": 124}},
                   "minimax_h3_fl2va_pruned-tiny_int8_convrot.safetensors":
                       {"TPUSampleVideo": {"width": 32, "height": 32, "frames": 124}},
                   "minimax_h3_ref2va_pruned-tiny_int8_convrot.safetensors":
                       {"TPUSampleVideo": {"width": 32, "height": 32, "frames": 124}}}
# A saved mp4's sound against its frames: LTX-2's audio VAE makes whole latents of 4 mel frames (100 a second), up
# to 2 mel frames either side of frames / fps, and is causal (3 mel frames short); AAC pads to 1024-sample frames,
# with one frame of priming
MEL_FRAMES_SHORT, AAC_FRAME = 2 + 3, 1024
OLD_WORKFLOW = Path(__file__).parent / "data" / "tiny_demo_before_prompt_per_line.json"
# ComfyUI's own CLIP loaders build the published sizes from fixed configs (CLIP-L 768 wide, T5-XXL 4096), so the
# tiny text encoder files cannot load through them: a workflow that encodes with them converts and runs up to that
# loader, which must fail with ComfyUI's own size mismatch (tests/test_conditioning.py runs ComfyUI's encoder code
# on tiny sizes and Sample with its output instead).
COMFY_CLIP_LOADERS = {"CLIPLoader", "DualCLIPLoader", "TripleCLIPLoader"}


@pytest.fixture(scope="module")
def tiny_files(server, comfyui_files):
    """The tiny files of COMFYUI_FILES in the server's own model folders (models/diffusion_models, ...)."""
    from backend.controller.files.listing import ROLE_FOLDERS

    models = comfyui_files(*COMFYUI_FILES) / "models"
    for folder in ROLE_FOLDERS.values():
        target = server.work_dir / "models" / folder
        target.mkdir(parents=True, exist_ok=True)
        for file in (models / folder).glob("*") if (models / folder).is_dir() else ():
            if not (target / file.name).exists():
                (target / file.name).symlink_to(file)
    return models


@pytest.fixture(scope="module")
def ui(server, tiny_files):
    if not find_chromium():
        pytest.skip("no Chromium: scripts/ensure_chromium.sh installs Debian's chromium-headless-shell (needs apt "
                    "and root), or set COMFYUI_TPU_CHROMIUM; the real-frontend tests need it")
    with Frontend(server) as frontend:
        yield frontend


def _ids(files):
    return [p.stem for p in files]


# each shipped workflow's conversion by the frontend, made once: the run test and the API-copy test both read it
_CONVERSIONS: dict[Path, Conversion] = {}


def converted(ui: Frontend, path: Path) -> Conversion:
    if path not in _CONVERSIONS:
        _CONVERSIONS[path] = ui.convert(load_ui_workflow(path), path.stem)
    return _CONVERSIONS[path]


def for_the_cpu(prompt: dict, name: str = "") -> dict:
    """An API prompt (of workflow `name`) with tiny models (TINY, TINY_OF) and, where it named real ones, the CPU
    settings."""
    tiny = substitute_models(prompt, {**TINY, **TINY_OF.get(name, {})})
    # (a real name, even where its tiny stand-in has the same name: LTX-2.3's files)
    if {v["inputs"].get(n) for v in prompt.values() for n in MODEL_INPUTS} & REAL_NAMES:
        named = {v["inputs"].get(n) for v in tiny.values() for n in MODEL_INPUTS}
        for node in tiny.values():
            node["inputs"].update(CPU_SETTINGS.get(node["class_type"], {}))
            for model in named & set(CPU_SETTINGS_OF):
                node["inputs"].update(CPU_SETTINGS_OF[model].get(node["class_type"], {}))
    return tiny


def expected_images(prompt: dict) -> int:
    """Images saved by an API prompt: each Save Image gets its Sample's batch_size per prompt (per non-empty line
    with prompt_per_line); each Save Animated WEBP, Save WEBM and Save Video one file, all the frames of its input
    in it."""
    count = 0
    for node in prompt.values():
        if node["class_type"] in ("SaveAnimatedWEBP", "SaveWEBM", "SaveVideo"):
            count += 1
        elif node["class_type"] == "SaveImage":
            s = prompt[node["inputs"]["images"][0]]["inputs"]
            prompts = [p for p in s["prompt"].splitlines() if p.strip()] if s.get("prompt_per_line") else [1]
            count += s["batch_size"] * len(prompts)
    return count


def image_size(prompt: dict, node_id: str) -> tuple[int, int]:
    """(width, height) of the IMAGE (or a LATENT's, in pixels) a node of an API prompt makes: Sample's width ×
    height, or with size_from_image its input's size rounded down to the model's factor, or its latent's size;
    Load Image's picture; Upscale Image By's and Upscale Latent By's input scaled."""
    node = prompt[node_id]
    inputs = node["inputs"]
    if node["class_type"] == "LoadImage":
        return INPUTS[inputs["image"]]
    if node["class_type"] == "ImagePadForOutpaint":
        w, h = image_size(prompt, inputs["image"][0])
        return w + inputs["left"] + inputs["right"], h + inputs["top"] + inputs["bottom"]
    if node["class_type"] == "ImageScaleBy":
        w, h = image_size(prompt, inputs["image"][0])
        return round(w * inputs["scale_by"]), round(h * inputs["scale_by"])
    if node["class_type"] == "LatentUpscaleBy":  # ComfyUI rounds the latent's sides (1/8 of the pixels)
        w, h = image_size(prompt, inputs["samples"][0])
        return round(w // 8 * inputs["scale_by"]) * 8, round(h // 8 * inputs["scale_by"]) * 8
    assert node["class_type"] in ("TPUSample", "TPUSampleLatent", "TPUSampleVideo"), node
    if isinstance(inputs.get("latent"), list):  # the latent sets the size
        return image_size(prompt, inputs["latent"][0])
    if inputs.get("size_from_image") and isinstance(inputs.get("image"), list):
        w, h = image_size(prompt, inputs["image"][0])
        return w // SIZE_FACTOR * SIZE_FACTOR, h // SIZE_FACTOR * SIZE_FACTOR
    return inputs["width"], inputs["height"]


@pytest.fixture(scope="module")
def workflow_files_on_the_server(server, tiny_models, tiny_controlnets, tiny_files, tmp_path_factory):
    """The LoRA, ControlNet, Redux and latent upscaler files and input pictures the workflows name, in the server's
    models/loras, models/controlnet, models/style_models, models/clip_vision, models/latent_upscale_models and
    input folders."""
    for name, tiny in REDUX.items():
        target = server.work_dir / "models" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.symlink_to(tiny_files.parent / "redux-models" / tiny)
    controlnets = server.work_dir / "models" / "controlnet"
    controlnets.mkdir(parents=True, exist_ok=True)
    for name, tiny in CONTROLNETS.items():
        if not (controlnets / name).exists():
            (controlnets / name).symlink_to(tiny_controlnets / "files" / f"tiny-{tiny}.safetensors")
    loras = server.work_dir / "models" / "loras"
    loras.mkdir(parents=True, exist_ok=True)
    made = tmp_path_factory.mktemp("workflow-loras")
    for name, (model, seed) in LORAS.items():
        path, _ = make(tiny_models, model, "diffusers", made / name, seed=seed)
        (loras / name).write_bytes(path.read_bytes())
    upscalers = server.work_dir / "models" / "latent_upscale_models"
    for name, seed in UPSCALERS.items():
        if not (upscalers / name).exists():
            upsampler(upscalers / name, seed)
    pictures = server.work_dir / "input"
    pictures.mkdir(exist_ok=True)
    for name, (w, h) in INPUTS.items():
        rgba = np.full((h, w, 4), 255, np.uint8)
        rgba[..., 0] = np.linspace(0, 255, w, dtype=np.uint8)[None]
        rgba[h // 4: h // 2, w // 4: w // 2, 3] = 0
        Image.fromarray(rgba, "RGBA").save(pictures / name)
    for name, seconds in SOUNDS.items():
        _write_sound(pictures / name, seconds)


def _write_sound(path: Path, seconds: float, rate: int = 44100) -> None:
    """A stereo sine (220 Hz left, 330 Hz right) of `seconds`, encoded as mp3 by PyAV (libmp3lame)."""
    import av

    t = np.arange(round(rate * seconds)) / rate
    wave = (0.5 * np.stack([np.sin(2 * np.pi * 220 * t), np.sin(2 * np.pi * 330 * t)])).astype(np.float32)
    with av.open(str(path), "w", format="mp3") as container:
        stream = container.add_stream("libmp3lame", rate=rate, layout="stereo")
        frame = av.AudioFrame.from_ndarray(wave, format="fltp", layout="stereo")
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)


def world_size(prompt: dict) -> int:
    """Worker processes the pipeline of a prompt runs on, on the CPU: Shard TP degree x Context Parallel degree x
    CFG Parallel (2) x Data Parallel replicas (0 = auto is 1 on a CPU host)."""
    size = 1
    for node in prompt.values():
        count = {"TPUShardTP": "degree", "TPUDataParallel": "replicas",
                 "TPUContextParallel": "degree"}.get(node["class_type"])
        size *= (node["inputs"][count] or 1) if count else 2 if node["class_type"] == "TPUCFGParallel" else 1
    return size


@pytest.mark.unit
def test_the_shipped_workflows_are_there_and_explain_themselves():
    assert {"tiny_demo", "flux1_schnell_offload", "sd35_medium_compiled", "flux2_dev_tp8",
            "data_parallel_prompts", "flux1_dev_comfyui_files", "sd35_cfg_parallel", "flux1_context_parallel",
            "flux1_dev_true_cfg", "flux1_img2img", "flux1_inpaint", "flux1_lora", "flux1_hires_fix",
            "flux1_kontext_edit", "flux1_fill_outpaint", "flux1_latent_hires_fix", "flux1_controlnet_union",
            "sdxl_two_controlnets", "zimage_turbo_comfyui_files", "zimage_turbo_controlnet_union", "wan21_t2v",
            "wan21_i2v", "flux1_dev_clip_text_encode", "wan22_5b_t2v_comfyui_files",
            "wan22_14b_i2v_comfyui_files", "flux1_redux", "ltx2_t2v_sound", "image_qwen_image_2_1_t2i",
            "zimage_turbo_int8", "qwen_image_edit_2511_int8", "image_qwen_image_2_1_image_edit",
            "image_krea2_turbo_t2i", "image_ideogram4_t2i", "video_ltx2_3_i2v", "video_ltx2_5_t2v",
            "video_ltx2_5_i2v", "image_qwen_image_2_1_turbo_image_edit", "image_flux3_klein_t2i",
            "image_flux3_klein_image_edit", "video_ltx2_3_ia2v", "video_minimax_h3_t2v",
            "video_minimax_h3_i2v", "video_minimax_h3_r2v"} <= {p.stem for p in FILES}
    for path in FILES:
        wf = load_ui_workflow(path)
        assert isinstance(wf.get("nodes"), list) and "links" in wf, f"{path.name} is not a UI-format workflow"
        assert wf.get("extra", {}).get("description"), f"{path.name}: no extra.description"
        notes = [n for n in wf["nodes"] if n["type"] in NOTES]
        assert notes and notes[0]["widgets_values"][0].strip(), f"{path.name}: no note that describes it"


@pytest.mark.frontend
@pytest.mark.parametrize("path", FILES, ids=_ids(FILES))
def test_workflow_loads_converts_and_runs(ui, server, path, workflow_files_on_the_server):
    wf = load_ui_workflow(path)
    conversion = converted(ui, path)
    problems = conversion.problems(allowed_values=ALLOWED) + conversion.console_errors
    assert not problems, f"{path.name} in the frontend:\n" + "\n".join(problems)

    prompt = conversion.prompt
    expected = {str(n["id"]): n["type"] for n in wf["nodes"] if n["type"] not in NOTES and n.get("mode", 0) == 0}
    assert {k: v["class_type"] for k, v in prompt.items()} == expected

    models = {v["inputs"][name] for v in prompt.values() for name in MODEL_INPUTS
              if v["class_type"].startswith("LoadTPUPipeline") and name in v["inputs"]}
    assert models <= set(TINY), f"add a tiny stand-in for {models - set(TINY)} to TINY"
    started = time.perf_counter()
    runnable = for_the_cpu(prompt, path.stem)
    result = run_workflow(server, runnable, timeout=300)
    if loaders := {v["class_type"] for v in runnable.values()} & COMFY_CLIP_LOADERS:
        failed = next(m["data"] for m in result["messages"] if m["type"] == "execution_error")
        assert failed["node_type"] in loaders and "size mismatch" in error_message(result), error_message(result)
        assert not result["images"]
        return
    assert result["status"] == "success", f"{path.name}: {error_message(result)}\n{server.log_tail()}"
    assert len(result["images"]) == expected_images(runnable), result["history"].get("outputs")
    sizes = {image_size(runnable, k) for k, v in runnable.items() if v["class_type"] in ("TPUSample", "TPUSampleVideo")}
    videos = {v["inputs"]["frames"] for v in runnable.values() if v["class_type"] == "TPUSampleVideo"}
    for image in result["images"]:
        if image.suffix == ".webm":  # ComfyUI's Save WEBM: a VP9 video, read back with PyAV (ComfyUI's own)
            import av

            with av.open(str(image)) as container:
                frames = [(f.width, f.height) for f in container.decode(video=0)]
            assert len(frames) in videos and set(frames) <= sizes, (image, len(frames), set(frames), sizes)
            continue
        if image.suffix == ".mp4":  # ComfyUI's Create Video -> Save Video: H.264 frames and the AAC sound
            _check_video_with_sound(image, runnable, videos, sizes)
            continue
        with Image.open(image) as im:
            frames = getattr(im, "n_frames", 1)
            assert (im.format, frames in videos) == (("WEBP", True) if videos else ("PNG", False)), (image, im.format)
            assert im.size in sizes, (image, im.size, sizes)
    seconds = time.perf_counter() - started
    workers = device_info(server)["workers"]
    assert len(workers) == world_size(runnable), workers
    print(f"{path.stem}: converted in {conversion.seconds:.2f} s, ran in {seconds:.1f} s on {len(workers)} "
          "worker(s)",
          *(f"\n  older than its nodes (fine; rebuild to show the new inputs): {o}" for o in conversion.outdated))


def _check_video_with_sound(path: Path, prompt: dict, videos: set[int], sizes: set[tuple[int, int]]) -> None:
    """An mp4 read back with PyAV (ComfyUI's own): a video stream of Sample Video's frames at Create Video's fps,
    and an audio stream as long as the frames (within the causal audio VAE's 3 mel frames and AAC's padding)."""
    import av

    fps = {v["inputs"]["fps"] for v in prompt.values() if v["class_type"] == "CreateVideo"}
    rates = {v["inputs"]["frame_rate"] for v in prompt.values() if v["class_type"] == "TPUSampleVideo"}
    assert fps == rates and len(fps) == 1, ("Create Video's fps is Sample Video's frame_rate", fps, rates)
    with av.open(str(path)) as container:
        assert [s.type for s in container.streams] == ["video", "audio"], container.streams
        video, audio = container.streams.video[0], container.streams.audio[0]
        rate = float(video.average_rate)
        frames = [(f.width, f.height) for f in container.decode(video=0)]
        container.seek(0)
        samples = sum(f.samples for f in container.decode(audio=0))
        sample_rate = audio.rate
    assert len(frames) in videos and set(frames) <= sizes and rate == fps.pop(), (path, len(frames), rate)
    seconds, heard = len(frames) / rate, samples / sample_rate
    assert seconds - MEL_FRAMES_SHORT / 100 - 1e-6 <= heard <= seconds + 2 * AAC_FRAME / sample_rate, (seconds, heard)


@pytest.mark.server
def test_a_model_without_sound_gives_create_video_none_and_a_video_without_audio(server, tiny_models):
    """Wan makes no sound: Sample Video's audio output is None, which Create Video takes (its audio is optional),
    and Save Video writes a video stream only (wan21_t2v with its frames and audio into Create Video)."""
    import av

    prompt = for_the_cpu(json.loads(api_path(WORKFLOWS / "wan21_t2v.json").read_text()))
    del prompt["3"]  # Save Animated WEBP
    prompt["5"] = {"class_type": "CreateVideo", "inputs": {"images": ["2", 0], "audio": ["2", 1], "fps": 16.0}}
    prompt["6"] = {"class_type": "SaveVideo", "inputs": {"video": ["5", 0], "filename_prefix": "video/wan-silent",
                                                         "format": "auto", "codec": "auto"}}
    result = run_workflow(server, prompt, timeout=300)
    assert result["status"] == "success", f"{error_message(result)}\n{server.log_tail()}"
    (path,) = result["images"]
    with av.open(str(path)) as container:
        assert [s.type for s in container.streams] == ["video"]
        assert len(list(container.decode(video=0))) == prompt["2"]["inputs"]["frames"]


@pytest.mark.frontend
def test_a_workflow_saved_before_an_input_was_added_still_runs(ui, server):
    """Saved workflows outlive node changes: tiny_demo as saved before Sample gained prompt_per_line (its last
    input) opens without a widget error, converts with the input's default, and runs."""
    old = load_ui_workflow(OLD_WORKFLOW)
    sample = next(n for n in old["nodes"] if n["type"] == "TPUSample")
    assert len(sample["widgets_values"]) == 9
    assert "prompt_per_line" not in {i["name"] for i in sample["inputs"]}
    conversion = ui.convert(old, OLD_WORKFLOW.stem)
    problems = conversion.problems(allowed_values=ALLOWED) + conversion.console_errors
    assert not problems, "\n".join(problems)
    assert conversion.outdated == ["node 2 (TPUSample): saved without prompt_per_line, denoise, size_from_image, "
                                   "sampler, scheduler (defaults used)"]
    # the same prompt as today's tiny_demo, the new input at its default
    today = json.loads(api_path(WORKFLOWS / "tiny_demo.json").read_text())
    assert conversion.prompt["2"]["inputs"] == today["2"]["inputs"]
    assert conversion.prompt["2"]["inputs"]["prompt_per_line"] is False
    assert conversion.prompt["2"]["inputs"]["sampler"] == conversion.prompt["2"]["inputs"]["scheduler"] == "default"
    result = run_workflow(server, conversion, timeout=120)
    assert result["status"] == "success", f"{error_message(result)}\n{server.log_tail()}"
    assert len(result["images"]) == 1


@pytest.mark.frontend
@pytest.mark.parametrize("path", FILES, ids=_ids(FILES))
def test_api_copy_is_what_the_frontend_makes(ui, path):
    """workflows/api/<name>.json (used by the demo command) is derived, never edited by hand."""
    conversion = converted(ui, path)
    target = api_path(path)
    assert target.exists() and target.read_text() == render(conversion.prompt), (
        f"{target.relative_to(ROOT)} is stale or missing: run scripts/export_api_workflows.py")


@pytest.mark.unit
def test_no_api_copy_without_its_workflow():
    orphans = {p.name for p in (WORKFLOWS / "api").glob("*.json")} - {p.name for p in FILES}
    assert not orphans, f"workflows/api/ files without a UI workflow in workflows/: {sorted(orphans)}"


@pytest.mark.server
def test_template_browser_lists_exactly_the_workflows(server):
    """ComfyUI serves a pack's workflows/ folder as its template folder (like example_workflows/): the list
    holds the UI workflows and nothing else, each file and its thumbnail come back as they are on disk."""
    listing = server.get("/workflow_templates").json()
    assert sorted(listing.get(PACK, [])) == sorted(p.stem for p in FILES), listing
    for path in FILES:
        r = server.get(f"/api/workflow_templates/{PACK}/{path.name}")
        assert r.status_code == 200 and r.json() == load_ui_workflow(path)
        thumb = server.get(f"/api/workflow_templates/{PACK}/{path.stem}.jpg")
        assert thumb.status_code == 200 and thumb.content[:3] == b"\xff\xd8\xff", (
            f"no template-browser thumbnail workflows/{path.stem}.jpg: run scripts/screenshots.py")
        assert (ROOT / "docs" / "images" / f"{path.stem}.png").exists(), "run scripts/screenshots.py"


@pytest.mark.frontend
@pytest.mark.parametrize("path", FILES[:1], ids=_ids(FILES[:1]))
def test_template_opens_in_the_frontend(ui, server, path):
    """What clicking the template in the browser does (the frontend's ?template= link takes the same path)."""
    ui.open(f"{server.url}/?template={path.stem}&source={PACK}")
    saved = load_ui_workflow(path)["nodes"]
    wanted = sorted((n["id"], n["type"], n.get("widgets_values")) for n in saved)
    deadline = time.monotonic() + 30
    while True:
        # (a node that gained inputs since the file was saved shows their defaults after the saved values)
        count = {n["id"]: len(n.get("widgets_values") or []) for n in saved}
        got = sorted((n["id"], n["type"], (n.get("widgets_values") or [])[: count.get(n["id"], 0)] or None)
                     for n in ui.serialize()["nodes"])
        if got == wanted or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert got == wanted


@pytest.mark.frontend
def test_template_browser_shows_them(ui):
    """The real template browser, opened as its side-bar button does, shows a card for each workflow."""
    try:
        texts = ui.template_browser(PACK)
    finally:
        ui.close_dialogs()
    assert {p.stem for p in FILES} <= set(texts), texts


# Opens a node's help as the node library's help button (and the selection toolbox's) does, in the real frontend,
# and waits for the page it renders: the help store's HTML and the help panel's text
_OPEN_HELP_JS = """async (name) => {
  const app = document.querySelector('#vue-app').__vue_app__;
  const stores = app.config.globalProperties.$pinia._s;
  if (window.app.extensionManager.sidebarTab.activeSidebarTabId !== 'node-library')
    await window.app.extensionManager.command.execute('Workspace.ToggleSidebarTab.node-library');
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  for (let i = 0; i < 100 && !stores.get('nodeHelp'); i++) await sleep(100);
  const help = stores.get('nodeHelp');
  help.openHelp(stores.get('nodeDef').nodeDefsByName[name]);
  let panel = null;
  for (let i = 0; i < 300; i++) {
    panel = document.querySelector('.node-help-content');
    if (!help.isLoading && help.renderedHelpHtml && panel && panel.innerText.trim()) break;
    await sleep(100);
  }
  // the text shows before its pictures have loaded: wait for them too (bounded, 10 s)
  for (let i = 0; i < 100 && panel && [...panel.querySelectorAll('img')].some((img) => !img.complete); i++)
    await sleep(100);
  const out = {html: help.renderedHelpHtml, error: help.error, base: help.baseUrl, text: panel && panel.innerText,
               images: panel ? [...panel.querySelectorAll('img')].map((img) => [img.src, img.complete && img.naturalWidth > 0]) : []};
  help.closeHelp();
  return out;
}"""


@pytest.mark.frontend
@pytest.mark.parametrize("name", ["TPUSample", "TPUCFGParallel", "TPUVAEDecode"])
def test_a_nodes_help_page_opens_in_comfyuis_help_panel(ui, name):
    """The frontend finds the node's page (web/docs/<class>.md) and shows it, pictures included; a node without a
    page would show its description instead, with the store's error set."""
    page = (ROOT / "web" / "docs" / f"{name}.md").read_text()
    title = page.splitlines()[0].removeprefix("# ")
    got = ui.page.call_js(_OPEN_HELP_JS, name)
    assert got["error"] is None and got["base"] == f"/extensions/{PACK}/docs/", got
    assert got["text"].splitlines()[0].strip() == title, got["text"][:200]
    sentence = next(line for line in page.splitlines()[2:] if line and not line.startswith(("!", "#")))
    assert " ".join(sentence.split()[:4]).replace("`", "").replace("*", "") in got["text"], (sentence, got["text"][:400])
    assert "<!--" not in got["text"]
    assert all(loaded for _, loaded in got["images"]), got["images"]
    assert len(got["images"]) == page.count("](images/")


@pytest.mark.frontend
def test_frontend_reports_what_is_wrong(ui, tmp_path):
    """The checks above would notice: an unknown node, shifted widget values, a value not offered, an
    API-format file opened as a workflow."""
    wf = load_ui_workflow(WORKFLOWS / "tiny_demo.json")
    sample = next(n for n in wf["nodes"] if n["type"] == "TPUSample")
    sample["widgets_values"] = sample["widgets_values"][1:]  # one value lost: the rest shift by one
    loader = next(n for n in wf["nodes"] if n["type"] == "LoadTPUPipeline")
    loader["widgets_values"][1] = "float8"  # dtype
    wf["nodes"].append({**json.loads(json.dumps(loader)), "id": 99, "type": "NoSuchNode", "outputs": []})
    conversion = ui.convert(wf, "broken")
    assert conversion.missing_nodes == ["NoSuchNode"]
    assert any(e.startswith("node 2 (TPUSample): steps=0 is outside") for e in conversion.widget_errors), \
        conversion.widget_errors
    assert any(u["widget"] == "dtype" and u["value"] == "float8" for u in conversion.unknown_values)

    api = json.loads(api_path(WORKFLOWS / "tiny_demo.json").read_text())
    assert any("no nodes" in m for m in ui.convert(api, "api").messages)

