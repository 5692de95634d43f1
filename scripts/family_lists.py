"""Rewrites every family list the docs mark (`<!-- families:KEY -->...<!-- /families -->` in README.md, docs/,
web/docs/ and bench/README.md) and pyproject.toml's description from the registry, after a family folder is
added or changed. tests/test_family_lists.py holds them to the registry with the same definitions (LISTS).

    "$VENV/bin/python" scripts/family_lists.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from test_family_lists import LISTS, MARKED, _pages  # noqa: E402

from backend import families  # noqa: E402


def main() -> int:
    for page in _pages():
        text = page.read_text()
        new = MARKED.sub(lambda m: f"<!-- families:{m.group(1)} -->{LISTS[m.group(1)]()}<!-- /families -->", text)
        if new != text:
            page.write_text(new)
            print(f"rewrote {page.relative_to(ROOT)}")
    project = ROOT / "pyproject.toml"
    text = project.read_text()
    new = re.sub(r'^(description = "[^"(]*\()[^()]*(\).*")$', lambda m: m.group(1) + families.names(last=" and ")
                 + m.group(2), text, count=1, flags=re.M)
    if new != text:
        project.write_text(new)
        print("rewrote pyproject.toml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
