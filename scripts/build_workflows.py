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

from frontend import open_frontend  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / "workflows"

NOTE_COLOR = {"color": "#432", "bgcolor": "#653"}  # the frontend's own "brown" note colours


def _note(node_id: int, pos: list[int], text: str, size=(330, 330)) -> dict:
    return {"id": node_id, "type": "MarkdownNote", "title": "About this workflow", "pos": pos, "size": list(size),
            "widgets": {"text": text.strip()}, **NOTE_COLOR}


def _text_to_image(*, title: str, model: str, offload: str, prompt: str, width: int, height: int, steps: int,
                   guidance: float, seed: int, seed_control: str, prefix: str, note: str, description: str,
                   note_height: int) -> dict:
    """Load TPU Pipeline -> Sample (TPU) -> Save Image, with a note. Node ids 1, 2, 3 (the note is 4)."""
    return {
        "name": title,
        "nodes": [
            {"id": 1, "type": "LoadTPUPipeline", "pos": [40, 130], "size": [330, 180],
             "widgets": {"model": model, "dtype": "auto", "device": "auto", "offload": offload, "model_path": ""}},
            {"id": 2, "type": "TPUSample", "pos": [410, 130], "size": [400, 470],
             "widgets": {"prompt": prompt, "negative_prompt": "", "width": width, "height": height, "steps": steps,
                         "guidance": guidance, "seed": seed, "control_after_generate": seed_control,
                         "batch_size": 1}},
            {"id": 3, "type": "SaveImage", "pos": [850, 130], "size": [360, 470],
             "widgets": {"filename_prefix": prefix}},
            _note(4, [40, 360], note, size=(330, note_height)),
        ],
        "links": [[1, "pipeline", 2, "pipeline"], [2, "images", 3, "images"]],
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
            conversion.check(allowed_values={"model": None})  # models need not be installed here
            path = Path(args.out) / f"{name}.json"
            path.write_text(json.dumps(workflow, indent=2) + "\n")
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
