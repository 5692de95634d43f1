"""Regenerates the API-format copies of the shipped workflows (workflows/api/<name>.json) through the frontend.

The UI workflows (workflows/<name>.json) are the source. Their API-format copies, which the demo command
(`scripts/demo.sh`) and scripts queue over HTTP, are derived from them by the real ComfyUI frontend's
app.graphToPrompt() (scripts/frontend.py, headless Chromium); tests/test_workflows.py fails when a copy is stale.
They live in a subfolder because ComfyUI lists every top-level *.json of a pack's workflows/ folder in its
template browser, and an API-format file opens there as an empty graph.

    eval "$(bash scripts/bootstrap.sh)"; export COMFYUI_DIR
    "$VENV/bin/python" scripts/export_api_workflows.py            # rewrite workflows/api/*.json
    "$VENV/bin/python" scripts/export_api_workflows.py --check    # exit 1 if any is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from frontend import MODEL_INPUTS, USER_FILE_INPUTS, load_ui_workflow, open_frontend, workflow_files  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / "workflows"
API_DIR = WORKFLOWS / "api"


def api_path(ui_path: Path) -> Path:
    return API_DIR / ui_path.name


def render(prompt: dict) -> str:
    """The API prompt as the file holds it."""
    return json.dumps(prompt, indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 if a copy is stale or missing")
    args = parser.parse_args()
    stale = []
    API_DIR.mkdir(exist_ok=True)
    with open_frontend() as (_, ui):
        for path in workflow_files(WORKFLOWS):
            # Models, model files, LoRAs and input pictures need not be installed to convert: any name is fine here.
            conversion = ui.convert(load_ui_workflow(path), path.stem).check(
                allowed_values=dict.fromkeys((*MODEL_INPUTS, *USER_FILE_INPUTS)))
            text, target = render(conversion.prompt), api_path(path)
            if target.exists() and target.read_text() == text:
                continue
            stale.append(target)
            if not args.check:
                target.write_text(text)
                print(f"wrote {target.relative_to(ROOT)}")
    if args.check and stale:
        print("stale API-format workflows (run scripts/export_api_workflows.py): "
              + ", ".join(str(p.relative_to(ROOT)) for p in stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
