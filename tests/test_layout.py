"""The two processes stay apart: the controller (ComfyUI's process) and the worker share only the protocol.

Checked two ways: by importing each side in a fresh interpreter and looking at what came in, and by reading
every import statement of each package.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
BACKEND = ROOT / "backend"
HEAVY = ("torch_tpu", "diffusers", "transformers", "accelerate")


def _loaded_after(code: str) -> list[str]:
    """The modules a fresh interpreter holds after running `code` (the repository on its path)."""
    script = textwrap.dedent(code) + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(absolute module name, imported at module level) for every import in `path`."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    tree = ast.parse(path.read_text(), str(path))
    top = {id(n) for n in tree.body}
    for node in tree.body:  # imports inside `if`/`try` at module level run at import time too
        if isinstance(node, (ast.If, ast.Try)):
            top |= {id(n) for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.append((name, id(node) in top))
    return found


def _modules(package: str) -> list[Path]:
    return sorted((BACKEND / package).rglob("*.py"))


def test_the_controller_imports_no_device_runtime_no_diffusers_and_no_worker():
    loaded = _loaded_after("import backend.controller.api, backend.controller.group")
    assert [m for m in loaded if m.split(".")[0] in HEAVY] == []
    assert [m for m in loaded if m.startswith("backend.worker")] == []


def test_the_worker_never_imports_the_controller():
    loaded = _loaded_after("import backend.worker.runtime, backend.worker.channel, backend.worker.__main__")
    assert "backend.worker.runtime" in loaded
    assert [m for m in loaded if m.startswith("backend.controller")] == []


def test_every_import_statement_keeps_the_sides_apart():
    problems = []
    for side, other in (("controller", "worker"), ("worker", "controller"), ("protocol", "controller"),
                        ("protocol", "worker")):
        for path in _modules(side):
            for name, _ in _imports(path):
                if name.startswith(f"backend.{other}"):
                    problems.append(f"{path.relative_to(ROOT)} imports {name}")
    for path in _modules("controller"):
        for name, at_import_time in _imports(path):
            if at_import_time and name.split(".")[0] in HEAVY:
                problems.append(f"{path.relative_to(ROOT)} imports {name} at import time")
    for path in sorted((BACKEND / "protocol").rglob("*.py")):
        for name, _ in _imports(path):
            if name.split(".")[0] in ("torch", *HEAVY):
                problems.append(f"{path.relative_to(ROOT)} imports {name}")
    for path in sorted((ROOT / "nodes").glob("*.py")):
        for name, _ in _imports(path):
            if name.startswith("backend.worker") or name.startswith("nodes.backend.worker"):
                problems.append(f"{path.relative_to(ROOT)} imports {name}")
    assert problems == []


def test_the_import_reader_sees_relative_imports():
    """The statement check above would pass vacuously if relative imports were misread."""
    names = {name for name, _ in _imports(BACKEND / "worker" / "runtime.py")}
    assert {"backend.protocol.messages", "backend.worker.compiler", "torch"} <= names
    names = {name for name, _ in _imports(BACKEND / "controller" / "api.py")}
    assert {"backend.controller", "backend.protocol.spec"} <= names


def test_every_backend_module_stays_within_500_lines():
    """A module past 500 lines holds more than one concern: split it by job (the house's rule)."""
    long = {str(p.relative_to(ROOT)): n for p in sorted(BACKEND.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}
