"""Writes requirements.txt from pyproject.toml's [project.dependencies] (one list, kept by hand in one place).

ComfyUI-Manager and comfy-cli read requirements.txt; pip and the registry read pyproject.toml.
`--check` exits 1 when requirements.txt is out of date (the tests run it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
HEADER = "# Generated from pyproject.toml [project.dependencies] by scripts/sync_requirements.py; do not edit by hand.\n"


def render() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return HEADER + "".join(f"{d}\n" for d in deps)


def main() -> int:
    target = ROOT / "requirements.txt"
    text = render()
    if "--check" in sys.argv:
        if target.read_text() != text:
            print("requirements.txt is out of date: run python scripts/sync_requirements.py", file=sys.stderr)
            return 1
        return 0
    target.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
