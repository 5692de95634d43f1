"""The family registry (backend/families): each family module names things that exist, so adding a
family is adding its module, its configs and its fixtures, and nothing else has to know it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from backend import families
from backend import tiny_models as tiny
from backend.families import CONFIGS, FAMILIES, PIPELINES, config_dir, text_encoders, vaes
from backend.protocol.spec import read_index

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("family_id", sorted(FAMILIES))
def test_each_family_names_its_configs_parts_and_pipelines(family_id):
    family = FAMILIES[family_id]
    assert family.id == family_id and family.pipelines
    for configs in family.all_configs:
        folder = config_dir(configs.folder)
        index = read_index(folder)  # a modular family's is modular_model_index.json
        assert index["_class_name"] in {p.class_name for p in family.pipelines}, configs.folder
        assert (folder / family.denoiser / "config.json").is_file()
        assert configs is not family.experts or (folder / f"{family.denoiser}_2" / "config.json").is_file()
        assert (folder / "vae" / "config.json").is_file()
        for slot in configs.text_encoders:
            assert index[slot.component][0] == "transformers", (configs.folder, slot.component)
            assert (folder / slot.component / "config.json").is_file(), (configs.folder, slot.component)
            assert slot.kind in text_encoders.KINDS
    assert family.vae in vaes.KINDS
    assert all(PIPELINES[p.class_name].family == family_id for p in family.pipelines)


def test_every_configs_folder_belongs_to_one_family():
    folders = [c.folder for f in FAMILIES.values() for c in f.all_configs] + [
        e for f in FAMILIES.values() for e in f.extra_configs]
    assert sorted(folders) == sorted(CONFIGS)


def test_recognition_keys_tell_every_family_apart():
    """A file holding exactly one family's recognition keys is that family's, whatever the registry's order."""
    for family in FAMILIES.values():
        shapes = dict.fromkeys(family.denoiser_keys, (1, 1))
        assert families.recognise(shapes) is family
        assert [f.id for f in FAMILIES.values() if f.recognises(shapes)] == [family.id]


def test_messages_name_the_families_in_order():
    assert families.names() == (
        "FLUX.1, FLUX.2, FLUX 3 [klein], SD3/SD3.5, SDXL, Qwen-Image, Qwen-Image 2.1, Z-Image, Krea 2, Ideogram 4, Wan, "
        "LTX-2 or MiniMax H3")


def test_every_family_has_a_tiny_pipeline(tiny_models):
    """Its fixture: a tiny random-weight pipeline (backend/tiny_models.py) of one of its pipeline classes."""
    classes = [read_index(tiny_models / f"tiny-{name}")["_class_name"] for name in tiny.FAMILIES]
    assert sorted(PIPELINES[c].family for c in classes) == sorted(FAMILIES)


# ---- the controller never reaches a family's conversion or tiny-builder code (only the worker and tools use it)

ROOT = Path(__file__).resolve().parent.parent
FAMILY_WORKER_ONLY = ("convert", "tiny")  # backend/families/<id>/convert.py, tiny.py


LOADERS = ("conversions", "tiny_builders")  # backend.families' lazy loaders of those modules (importlib)


def _imported_names(path: Path) -> set[str]:
    """Every module `path` imports, as absolute names (relative imports resolved; `from X import y` gives X and
    X.y, since y may be a module), and `backend.families.<loader>` for each use of a loader of the registry."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = [*package[: len(package) - node.level + 1]] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names |= {module} | {f"{module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Attribute) and node.attr in LOADERS:
            names.add(f"backend.families.{node.attr}")
    return names


def _worker_only(name: str) -> bool:
    """A family's conversion or tiny-builder module (or the registry's loader of one), the shared tiny parts, or
    the tools' tiny models."""
    parts = name.removeprefix("nodes.").split(".")
    if parts[:2] == ["backend", "tiny_models"] or parts[:3] in (["backend", "families", "tiny_parts"],
                                                                *(["backend", "families", n] for n in LOADERS)):
        return True
    return parts[:2] == ["backend", "families"] and len(parts) >= 4 and parts[3] in FAMILY_WORKER_ONLY


def test_the_import_reader_sees_the_worker_side_modules():
    """The check below would pass vacuously if the reader missed a relative import or a loader's use."""
    assert "backend.families.tiny_parts.Seeder" in _imported_names(ROOT / "backend" / "families" / "flux1" / "tiny.py")
    assert _worker_only("backend.families.tiny_parts.Seeder")
    assert "backend.families.conversions" in _imported_names(ROOT / "backend" / "worker" / "lora.py")
    assert _worker_only("backend.families.flux1.convert") and not _worker_only("backend.families.flux1")


def test_no_controller_protocol_or_node_module_imports_a_family_converter_or_tiny_builder():
    paths = [*sorted((ROOT / "backend" / "controller").rglob("*.py")),
             *sorted((ROOT / "backend" / "protocol").rglob("*.py")), *sorted((ROOT / "nodes").glob("*.py"))]
    assert len(paths) > 40
    found = [f"{p.relative_to(ROOT)} imports {n}" for p in paths for n in sorted(_imported_names(p)) if _worker_only(n)]
    assert found == []


def test_importing_the_controller_loads_no_converter_no_tiny_builder_and_no_torch():
    """In a fresh interpreter: every module of the controller and the protocol (nodes/ needs ComfyUI, which
    loads torch itself; its imports are read above)."""
    script = textwrap.dedent("""
        import importlib, json, pkgutil, sys
        import backend.controller, backend.protocol
        for package in (backend.controller, backend.protocol):
            for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
                if info.name != "backend.controller.bound_torchrun":  # torchrun's entry, run as a child process
                    importlib.import_module(info.name)
        print(json.dumps(sorted(sys.modules)))
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "backend.controller.api" in loaded and "backend.controller.layouts" in loaded
    assert [m for m in loaded if _worker_only(m) or m.split(".")[0] == "torch"] == []
