"""Each node's help page: web/docs/<node class>.md, which ComfyUI's help panel reads (the pack's WEB_DIRECTORY,
served at /extensions/<pack folder>/) and GitHub shows; docs/nodes.md indexes them. The server test that
ComfyUI serves them is in tests/test_comfyui.py."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
WEB = ROOT / "web"
PAGES = WEB / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def node_mappings() -> tuple[dict[str, str], dict[str, str]]:
    """NODE_CLASS_MAPPINGS (class name -> Python class name) and NODE_DISPLAY_NAME_MAPPINGS, read from
    nodes/__init__.py without importing it (the nodes need ComfyUI)."""
    found = {}
    for node in ast.parse((ROOT / "nodes" / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            found[node.targets[0].id] = {ast.literal_eval(k): (v.id if isinstance(v, ast.Name) else ast.literal_eval(v))
                                         for k, v in zip(node.value.keys, node.value.values, strict=True)}
    return found["NODE_CLASS_MAPPINGS"], found["NODE_DISPLAY_NAME_MAPPINGS"]


def test_every_node_class_has_a_page_titled_by_its_display_name():
    classes, display = node_mappings()
    assert len(classes) >= 18
    pages = {p.stem for p in PAGES.glob("*.md")}
    assert pages == set(classes), f"pages without a node: {pages - set(classes)}; nodes without a page: " \
                                  f"{set(classes) - pages}"
    for name in classes:
        first = (PAGES / f"{name}.md").read_text().splitlines()[0]
        assert first == f"# {display[name]}", f"web/docs/{name}.md starts {first!r}"


def test_the_web_directory_holds_only_the_help_pages_and_their_pictures():
    """ComfyUI serves all of WEB_DIRECTORY and loads every .js file in it into the browser: docs only."""
    init = (ROOT / "__init__.py").read_text()
    assert re.search(r'^WEB_DIRECTORY = "\./web"$', init, re.M), "the pack's __init__ names web/ as WEB_DIRECTORY"
    files = [p.relative_to(WEB) for p in WEB.rglob("*") if p.is_file()]
    others = [str(p) for p in files if p.suffix not in (".md", ".png") or p.parts[0] != "docs"]
    assert others == [], f"web/ would serve {others}"


def test_the_pages_links_and_pictures_exist_and_the_index_links_every_page():
    classes, _ = node_mappings()
    broken = []
    for page in PAGES.glob("*.md"):
        for target in LINK.findall(page.read_text()):
            path = target.split("#", 1)[0]
            if path and not target.startswith("http") and not (page.parent / path).exists():
                broken.append(f"{page.name}: {target}")
    assert broken == []
    index = (ROOT / "docs" / "nodes.md").read_text()
    linked = {Path(t).stem for t in LINK.findall(index) if t.startswith("../web/docs/")}
    assert linked >= set(classes), f"docs/nodes.md does not link {set(classes) - linked}"
    assert len(index.split()) < 600, "docs/nodes.md is the index; the depth is on the pages"


def test_the_readme_is_short_and_lists_every_workflow_and_the_two_commands():
    """README.md is for artists: at most 1,000 words (`wc -w`), the depth in docs/."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.split()) <= 1000, f"README.md has {len(readme.split())} words"
    shipped = {p.name for p in (ROOT / "workflows").glob("*.json")}
    linked = {Path(t).name for t in LINK.findall(readme) if t.startswith("workflows/")}
    assert shipped and linked == shipped, f"not listed: {shipped - linked}; not shipped: {linked - shipped}"
    assert "bash scripts/demo.sh " in readme and "bash scripts/test.sh " in readme
    broken = [t for t in LINK.findall(readme) if not t.startswith("http") and not (ROOT / t.split("#")[0]).exists()]
    assert broken == []


def test_the_readme_and_the_tpu_page_give_the_same_status():
    """What has run where is said once, the same way, on both pages an installer reads first."""
    status = "Nothing in this pack has run on a TPU or a GPU yet"
    readme = " ".join((ROOT / "README.md").read_text().replace("> ", "").split())
    tpu = " ".join((ROOT / "docs" / "tpu.md").read_text().split())
    assert status in readme and status in tpu
