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

from frontend import MODEL_INPUTS, open_frontend  # noqa: E402

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
                   files: dict | None = None) -> dict:
    """Load TPU Pipeline -> [the nodes of `between`, in order] -> Sample (TPU) -> Save Image, with a note.
    Node ids: Load 1, Sample 2, Save 3, the note 4, then 5, 6, ... for `between` ((type, widgets) pairs).
    With `files` (the file inputs by name), the loader is Load TPU Pipeline (ComfyUI files) instead."""
    sample_widgets = {"prompt": prompt, "negative_prompt": negative_prompt, "width": width, "height": height,
                      "steps": steps, "guidance": guidance, "seed": seed,
                      "control_after_generate": seed_control, "batch_size": batch_size}
    if prompt_per_line:
        sample_widgets["prompt_per_line"] = True
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
            _note(4, [40, 360 if files is None else 480], note, size=(x - 80 if between else 330, note_height)),
            *middle,
        ],
        "links": [[a, "pipeline", b, "pipeline"] for a, b in zip(chain[:-1], chain[1:], strict=True)]
        + [[2, "images", 3, "images"]],
        "extra": {"description": description},
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

fp8 files are upcast to the compute dtype (bfloat16 on TPU and GPU) as they load. The model's configuration
ships with ComfyUI-TPU and the tokenizers come from ComfyUI: nothing is downloaded. For FLUX.1-schnell choose
`flux1-schnell.safetensors` (it is recognised: 4 steps, guidance 0).

**Offload `model`**: each part moves to the chip only while it runs; `none` is faster where everything fits.
"""),
}


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
            conversion.check(allowed_values=dict.fromkeys(MODEL_INPUTS))  # models need not be installed here
            path = Path(args.out) / f"{name}.json"
            path.write_text(json.dumps(workflow, indent=2) + "\n")
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
