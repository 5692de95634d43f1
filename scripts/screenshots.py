"""Screenshots of the shipped workflows in the real ComfyUI UI (headless Chromium, scripts/frontend.py).

Writes, for each workflows/<name>.json:
  docs/images/<name>.png   the whole UI with the workflow open, for docs/workflows.md;
  workflows/<name>.jpg     a small picture of the graph: the card ComfyUI's template browser shows for it;
docs/images/template_browser.png: the template browser showing the pack's workflows; and
web/docs/images/<NodeType>.png: a close-up of each node (NODE_SHOTS) as one of the workflows sets it, for
that node's help page (web/docs/<NodeType>.md, which ComfyUI's help panel and GitHub both show).

    eval "$(bash scripts/bootstrap.sh)"; export COMFYUI_DIR
    "$VENV/bin/python" scripts/screenshots.py [NAME ...]
"""

from __future__ import annotations

import argparse
import base64
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from frontend import _FIT_JS, load_ui_workflow, open_frontend, workflow_files  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / "workflows"
IMAGES = ROOT / "docs" / "images"
NODE_IMAGES = ROOT / "web" / "docs" / "images"  # beside the help pages, so both readers find them
THUMB_WIDTH = 480
NODE_SCALE = 1.25  # zoom of the node close-ups
# Node type -> (workflow, node id) whose close-up illustrates its help page (web/docs/images/<type>.png)
NODE_SHOTS = {
    "LoadTPUPipeline": ("flux1_schnell_offload", 1),
    "LoadTPUPipelineFiles": ("flux1_dev_comfyui_files", 1),
    "TPUSample": ("flux1_img2img", 2),
    "TPULoadLoRA": ("flux1_lora", 5),
    "TPUApplyControlNet": ("flux1_controlnet_union", 7),
    "TPUApplyRedux": ("flux1_redux", 6),
    "TPUSetExecutionMode": ("sd35_medium_compiled", 5),
    "TPUCompile": ("sd35_medium_compiled", 6),
    "TPUShardTP": ("flux2_dev_tp8", 5),
    "TPUDataParallel": ("data_parallel_prompts", 5),
    "TPUCFGParallel": ("sd35_cfg_parallel", 5),
    "TPUContextParallel": ("flux1_context_parallel", 5),
    "TPUSamplingOptions": ("flux1_dev_true_cfg", 5),
    "TPUSampleVideo": ("wan21_i2v", 2),
    "TPUSampleLatent": ("flux1_latent_hires_fix", 2),
}
PACK = "ComfyUI-TPU"  # the folder name the throwaway server gives the pack (scripts/comfy_server.py)
# Settings of this throwaway server's user for tidy pictures: no minimap or canvas statistics, open workflows listed in the side bar
# rather than as tabs (each load opens a tab).
_QUIET_UI_JS = """async () => {
  const s = window.app.extensionManager.setting;
  await s.set('Comfy.Minimap.Visible', false);
  await s.set('Comfy.Graph.CanvasInfo', false);
  await s.set('Comfy.Workflow.WorkflowTabsPosition', 'Sidebar');
}"""


# Centres one node in the canvas at a given zoom, redraws, and returns its box on the page (title bar and the
# source badge above it included) with a margin.
_NODE_JS = r"""async (id, scale, margin) => {
  const app = window.app, canvas = app.canvas, el = canvas.canvas, node = app.graph.getNodeById(id);
  if (!node) throw new Error(`no node ${id}`);
  const title = window.LiteGraph.NODE_TITLE_HEIGHT, badge = 24;
  const x0 = node.pos[0], y0 = node.pos[1] - title - badge;
  const x1 = x0 + node.size[0], y1 = node.pos[1] + node.size[1];
  canvas.ds.scale = scale;
  canvas.ds.offset[0] = el.clientWidth / 2 / scale - (x0 + x1) / 2;
  canvas.ds.offset[1] = el.clientHeight / 2 / scale - (y0 + y1) / 2;
  canvas.deselectAll?.();
  canvas.setDirty(true, true);
  canvas.draw(true, true);
  await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
  const r = el.getBoundingClientRect(), [ox, oy] = canvas.ds.offset;
  return {x: r.left + (x0 + ox) * scale - margin, y: r.top + (y0 + oy) * scale - margin,
          width: (x1 - x0) * scale + 2 * margin, height: (y1 - y0) * scale + 2 * margin};
}"""


def node_closeup(ui, node_id: int, path: Path) -> Path:
    """PNG of one node of the open graph, zoomed in, as the UI draws it."""
    clip = ui.page.call_js(_NODE_JS, node_id, NODE_SCALE, 12)
    time.sleep(0.3)  # let the frontend's DOM widgets (text areas) follow the canvas
    return ui.page.screenshot(path, clip)


def thumbnail(ui, path: Path) -> Path:
    """JPEG of the free part of the canvas with the open graph fitted into it, THUMB_WIDTH pixels wide."""
    clip = ui.page.call_js(_FIT_JS, 20)
    time.sleep(0.3)
    clip["scale"] = THUMB_WIDTH / clip["width"]
    data = ui.page.call("Page.captureScreenshot", {"format": "jpeg", "quality": 85, "clip": clip})["data"]
    path.write_bytes(base64.b64decode(data))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="workflows (default: all in workflows/)")
    args = parser.parse_args()
    files = [p for p in workflow_files(WORKFLOWS) if not args.names or p.stem in args.names]
    IMAGES.mkdir(parents=True, exist_ok=True)
    NODE_IMAGES.mkdir(parents=True, exist_ok=True)
    with open_frontend(width=1600, height=900) as (_, ui):
        ui.page.call_js(_QUIET_UI_JS)
        for path in files:
            ui.load(load_ui_workflow(path), path.stem)
            print(ui.screenshot(None, IMAGES / f"{path.stem}.png"))
            print(thumbnail(ui, WORKFLOWS / f"{path.stem}.jpg"))
        for node_type, (name, node_id) in NODE_SHOTS.items():
            if args.names and name not in args.names:
                continue
            ui.load(load_ui_workflow(WORKFLOWS / f"{name}.json"), name)
            ui.page.evaluate("window.app.extensionManager.toast.removeAll()")
            print(node_closeup(ui, node_id, NODE_IMAGES / f"{node_type}.png"))
        if not args.names:
            ui.template_browser(PACK)
            print(ui.page.screenshot(IMAGES / "template_browser.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
