"""One home for every COMFYUI_TPU_* setting, documented; and the pack's packaging metadata (licence, registry).

The settings are checked by reading the shipped tree: every COMFYUI_TPU_* name it mentions is defined in
backend/protocol/settings.py, none is read from the environment anywhere else, and docs/settings.md lists each
with its default and meaning. The metadata is read with ComfyUI's own pyproject parser (comfy_config).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from backend.protocol import settings

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ("backend", "nodes", "scripts", "bench", "docs", "web")
NAME = re.compile(r"COMFYUI_TPU_[A-Z0-9_]*[A-Z0-9]")
READ_ELSEWHERE = re.compile(r"""(environ|getenv)[^\n]{0,20}["']COMFYUI_TPU_""")


def _shipped_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "__init__.py", ROOT / "prestartup_script.py", ROOT / "bench" / "README.md"]
    for top in SHIPPED:
        files += [p for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".md", ".sh") and "results" not in p.parts]
    return files


def test_every_name_in_the_tree_is_a_defined_setting():
    unknown = {f"{p.relative_to(ROOT)}: {n}" for p in _shipped_files() for n in NAME.findall(p.read_text())
               if n not in settings.ALL}
    assert not unknown, f"COMFYUI_TPU_* names not defined in backend/protocol/settings.py: {sorted(unknown)}"


def test_no_setting_is_read_outside_the_settings_module():
    home = ROOT / "backend" / "protocol" / "settings.py"
    elsewhere = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in _shipped_files() if p.suffix == ".py" and p != home
                 for m in READ_ELSEWHERE.finditer(p.read_text())]
    assert not elsewhere, f"read through backend/protocol/settings.py instead: {elsewhere}"


def test_the_settings_page_lists_each_setting_with_its_default_and_meaning():
    page = (ROOT / "docs" / "settings.md").read_text()
    for s in settings.ALL.values():
        default = f"`{s.default}`" if s.default else "unset"
        row = f"| `{s.name}` | {default} | {s.doc} |"
        assert row in page, f"docs/settings.md: expected the row\n{row}"
    assert set(NAME.findall(page)) == set(settings.ALL), "docs/settings.md names a setting that does not exist"
    assert "docs/settings.md" in (ROOT / "README.md").read_text(), "README.md points to the settings page"


def test_values_are_read_as_documented(capsys):
    env = {settings.WARM_START.name: " 1 ", settings.START_TIMEOUT.name: "soon", settings.HOST_PORT.name: ""}
    assert settings.WARM_START.on(env) and not settings.ALLOW_PICKLE.on(env)
    assert not settings.WARM_START.on({settings.WARM_START.name: "yes"}), "a switch is on only at 1"
    assert settings.HOST_PORT.raw(env) == "29470", "empty means unset: the default"
    assert settings.START_TIMEOUT.number(env) == 180.0, "a value that is not a number falls back to the default"
    assert "ignoring COMFYUI_TPU_START_TIMEOUT='soon': not a number" in capsys.readouterr().out
    assert settings.WORKER_MEMORY_LIMIT_GB.number({}) is None, "no default: no value"
    assert settings.WORKER_MEMORY_LIMIT_GB.number({settings.WORKER_MEMORY_LIMIT_GB.name: "1.5"}) == 1.5
    assert all(s.kind in (settings.OPERATOR, settings.WORKER, settings.TOOLS) for s in settings.ALL.values())


# ---- packaging: licence, dependencies, registry metadata

def test_the_licence_text_ships_and_matches_pyproject():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    text = (ROOT / project["license"]["file"]).read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text and "END OF TERMS" in text
    assert any(c == "License :: OSI Approved :: Apache Software License" for c in project["classifiers"])


def test_every_third_party_import_of_the_pack_is_a_declared_dependency():
    """psutil (controller/hosts.py) included: ComfyUI-Manager installs requirements.txt, nothing else."""
    import ast
    import importlib.metadata

    import tomllib

    declared = {re.split(r"[<>=!~ ;\[]", d, maxsplit=1)[0].lower().replace("-", "_")
                for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    imported = set()
    for path in [*(ROOT / "backend").rglob("*.py"), *(ROOT / "nodes").rglob("*.py"), ROOT / "__init__.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    comfyui = {"comfy", "folder_paths", "server"}  # the host application's own modules
    # ... and what ComfyUI itself requires (its requirements.txt), imported only in ComfyUI's process: PyAV
    # (controller/sound_input.py resamples an AUDIO with it, as ComfyUI's audio and video nodes decode with it)
    comfyui |= {"av"}
    extra = {"torch_tpu"}  # the `tpu` extra
    # Brought by a declared dependency that requires it (checked below), so not listed again.
    transitive = {"PIL": ("diffusers", "pillow"), "tokenizers": ("transformers", "tokenizers")}
    for parent, dist in transitive.values():
        assert parent in declared and any(r.lower().startswith(dist) for r in importlib.metadata.requires(parent))
    third_party = imported - {"backend"} - comfyui - extra - set(transitive) - set(sys.stdlib_module_names)
    assert "psutil" in third_party
    assert third_party <= declared, f"imported but not declared in pyproject.toml: {sorted(third_party - declared)}"


def test_the_registry_metadata_is_complete(comfyui_dir):
    """Read with ComfyUI's own parser of [project] and [tool.comfy] (comfy_config, kept in step with comfy-cli's)."""
    if str(comfyui_dir) not in sys.path:
        sys.path.append(str(comfyui_dir))
    from comfy_config.config_parser import extract_node_configuration

    config = extract_node_configuration(str(ROOT))
    assert config is not None
    assert config.tool_comfy.publisher_id and config.tool_comfy.display_name
    assert config.project.name and config.project.version and config.project.urls.repository
    assert config.project.license.file == "LICENSE" and (ROOT / "LICENSE").is_file()
    import tomllib

    icon = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["comfy"].get("Icon", "https://")
    assert icon.startswith("https://"), f"Icon {icon!r}: give the image's URL, or leave it out (it is optional)"


def test_no_stray_logs_in_the_tree():
    import subprocess

    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    assert not [f for f in tracked if f.endswith(".log")]
    assert "*.log" in (ROOT / ".gitignore").read_text().split()
