"""The main job: start a real ComfyUI headless with ComfyUI-TPU, run a workflow, print the PNG paths.

The workflow is in ComfyUI's API format (workflows/api/), or in the UI format the frontend saves
(workflows/*.json): that one is converted by the server's own web frontend in headless Chromium.

Models come from --models (a diffusers folder, e.g. your ComfyUI's models/diffusers). A model that the
workflow names but that folder lacks is replaced by the built-in tiny random-weight model of the same
family (built offline on first use), with a note, so the demo runs anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from comfy_server import ComfyServer, error_message, load_workflow  # noqa: E402

from backend.controller.models import find_models  # noqa: E402
from backend.protocol import settings  # noqa: E402
from backend.tiny_models import build_tiny_pipeline  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(settings.CACHE.raw()).expanduser()

# Which tiny family stands in for a real model, by words in its name.
TINY_FOR = (("flux.2", "flux2"), ("flux2", "flux2"), ("flux", "flux"), ("sd3", "sd3"),
            ("stable-diffusion-3", "sd3"), ("xl", "sdxl"), ("qwen", "qwenimage"))


def tiny_family(name: str) -> str:
    lowered = name.lower()
    return next((family for word, family in TINY_FOR if word in lowered), "flux")


def use_tiny_models(prompt: dict, models_dir: Path) -> None:
    """Replaces each model the workflow names but `models_dir` lacks by the tiny model of its family."""
    present = set(find_models([str(models_dir)]))
    for node in prompt.values():
        name = node.get("inputs", {}).get("model")
        if node.get("class_type") == "LoadTPUPipeline" and isinstance(name, str) and name not in present:
            tiny = f"tiny-{tiny_family(name)}"
            if tiny not in present:
                build_tiny_pipeline(tiny_family(name), models_dir / tiny)
                present.add(tiny)
            if name != tiny:
                print(f"[demo] '{name}' is not in {models_dir}; using the built-in tiny model '{tiny}' instead")
            node["inputs"]["model"] = tiny


def convert_in_frontend(server: ComfyServer, workflow: dict, name: str) -> dict:
    """A UI-format workflow -> API prompt, by the server's own web frontend in headless Chromium."""
    from frontend import Frontend, find_chromium

    # Debian's headless Chromium, installed with apt by scripts/ensure_chromium.sh when missing (says why if not).
    chromium = find_chromium() or subprocess.run(["bash", str(ROOT / "scripts" / "ensure_chromium.sh")],
                                                 stdout=subprocess.PIPE, text=True).stdout.strip() or None
    with Frontend(server, chromium=chromium) as ui:
        conversion = ui.convert(workflow, name)
    print(f"[demo] converted the UI workflow {name} in the ComfyUI frontend ({conversion.seconds:.1f} s)")
    return conversion.check(allowed_values={"model": None}).prompt  # models are checked by use_tiny_models


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workflow", default=str(ROOT / "workflows" / "api" / "tiny_demo.json"),
                        help="workflow to run, API format (default: the tiny demo) or UI format (converted by "
                             "the real frontend in headless Chromium: scripts/ensure_chromium.sh installs it)")
    parser.add_argument("--models", default=str(CACHE / "models"), help="diffusers models folder")
    parser.add_argument("--out", default=str(ROOT / "output"), help="where to copy the PNGs")
    parser.add_argument("--comfyui", default=os.environ.get("COMFYUI_DIR"), help="ComfyUI folder")
    args = parser.parse_args()
    if not args.comfyui:
        parser.error("--comfyui (or COMFYUI_DIR) is required; scripts/demo.sh sets it")

    models_dir = Path(args.models)
    models_dir.mkdir(parents=True, exist_ok=True)
    workflow = json.loads(Path(args.workflow).read_text())
    ui_format = isinstance(workflow.get("nodes"), list)

    with ComfyServer(args.comfyui, str(models_dir), env={"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "")}
                     if os.environ.get("OMP_NUM_THREADS") else None) as server:
        print(f"[demo] ComfyUI is running at {server.url} (log: {server.log_path})")
        if ui_format:
            try:
                prompt = convert_in_frontend(server, workflow, Path(args.workflow).stem)
            except Exception as e:
                print(f"[demo] could not convert the UI workflow {args.workflow}: {e}\n"
                      f"[demo] API-format copies of the shipped workflows are in {ROOT / 'workflows' / 'api'}",
                      file=sys.stderr)
                return 1
        else:
            prompt = load_workflow(args.workflow)
        use_tiny_models(prompt, models_dir)
        result = server.run(prompt, timeout=1800)
        if result["status"] != "success":
            print(f"[demo] the workflow failed: {error_message(result) or result['status']}", file=sys.stderr)
            print(server.log_tail(), file=sys.stderr)
            return 1
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for image in result["images"]:
            target = out / image.name
            shutil.copy(image, target)
            print(target.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
