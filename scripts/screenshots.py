"""Screenshots of the shipped workflows in the real ComfyUI UI (headless Chromium, scripts/frontend.py).

Writes, for each workflows/<name>.json:
  docs/images/<name>.png   the whole UI with the workflow open, for README.md;
  workflows/<name>.jpg     a small picture of the graph: the card ComfyUI's template browser shows for it;
and docs/images/template_browser.png: the template browser showing the pack's workflows.

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
THUMB_WIDTH = 480
PACK = "ComfyUI-TPU"  # the folder name the throwaway server gives the pack (scripts/comfy_server.py)
# Settings of this throwaway server's user for tidy pictures: no minimap or canvas statistics, open workflows listed in the side bar
# rather than as tabs (each load opens a tab).
_QUIET_UI_JS = """async () => {
  const s = window.app.extensionManager.setting;
  await s.set('Comfy.Minimap.Visible', false);
  await s.set('Comfy.Graph.CanvasInfo', false);
  await s.set('Comfy.Workflow.WorkflowTabsPosition', 'Sidebar');
}"""


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
    with open_frontend(width=1600, height=900) as (_, ui):
        ui.page.call_js(_QUIET_UI_JS)
        for path in files:
            ui.load(load_ui_workflow(path), path.stem)
            print(ui.screenshot(None, IMAGES / f"{path.stem}.png"))
            print(thumbnail(ui, WORKFLOWS / f"{path.stem}.jpg"))
        if not args.names:
            ui.template_browser(PACK)
            print(ui.page.screenshot(IMAGES / "template_browser.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
