"""Every family list a user reads comes from the registry (backend/families) or is held against it here.

Tooltips and messages build theirs with the registry's helpers (families.cfg_parallel_names() and the rest); a
string in nodes/ or backend/controller/ that names three families in a row by hand fails here. In the README and
docs/, web/docs/ and bench/README.md a list stands between `<!-- families:KEY -->` and `<!-- /families -->` and
must equal what the registry gives for KEY; pyproject.toml's description names every family.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from backend import families

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
MARKED = re.compile(r"<!-- families:([\w-]+) -->(.*?)<!-- /families -->", re.S)
# a family's name as strings write it (SD3/3.5, FLUX without its number)
FAMILY = re.compile(r"FLUX\.1|FLUX\.2|FLUX\b|SD3(?:/SD3\.5|/3\.5|\.5)?|SDXL|Qwen-Image(?:-Edit)?|Z-Image|Wan")
# what stands between two names of a list: a few words of qualifier, then a comma, "and" or "or"
BETWEEN = re.compile(r"^(?:\s*(?:[\w.\-\[\]]+\s*){0,4}?)?(?:,\s*(?:and\s+|or\s+)?|\s+and\s+|\s+or\s+)$")
# lists that are not the registry's to give, and why
NOT_THE_REGISTRYS = {
    # which LoRAs carry text-encoder layers is diffusers' LoRA loaders' matter (the families whose loaders read them)
    "FLUX.1, SD3 and SDXL LoRAs": "nodes/lora_nodes.py",
    # the models of one family (Wan) that take a start image, not a list of families
    "Wan 2.2 TI2V 5B, Wan 2.2 I2V A14B, Wan 2.1 I2V": "nodes/video_nodes.py",
}


def _lora_formats(fmt: str) -> str:
    """The families whose LoRA files of a format the LoRA tests read (tests/lora_fixtures.py FORMATS)."""
    from lora_fixtures import FORMATS

    tiny = {f"tiny-{name}": f for f in families.FAMILIES.values() for name in f.tiny}
    return families.names([f for f in families.FAMILIES.values()
                           if any(tiny[n] is f and fmt in formats for n, formats in FORMATS.items())], " and ")


LISTS: dict[str, Callable[[], str]] = {
    "all": lambda: families.names(last=" and "),
    "cfg_parallel": families.cfg_parallel_names,
    "cfg_batch": lambda: families.pipeline_names(lambda p: p.cfg_passes == "batch"),
    "cfg_branches": lambda: families.pipeline_names(lambda p: p.cfg_passes == "branches"),
    "cfg_named": lambda: families.pipeline_names(lambda p: p.cfg_passes == "branches" and not p.unnamed_branches),
    # one pass per step (a modular pipeline's guider runs two, which CFG Parallel does not split: not one of these)
    "cfg_none": lambda: families.pipeline_names(lambda p: not p.cfg_passes and not (p.modular and p.modular.guider)),
    "context_parallel": families.context_parallel_names,
    "no_context_parallel": lambda: families.context_parallel_names(split=False),
    "shard_tp": families.shard_tp_names,
    "no_shard_tp": lambda: families.shard_tp_names(split=False),
    "controlnet": families.controlnet_names,
    "inpainting": families.inpainting_names,
    "references": families.reference_names,
    "conditioning": families.conditioned_names,
    "no_conditioning": lambda: families.family_names(lambda p: p.embeddings is None, every=True),
    "true_cfg": families.true_cfg_names,
    "sigmas": lambda: families.pipeline_names(lambda p: p.sigmas_arg),  # Sampling Options' sigmas
    "video": lambda: families.family_names(lambda p: bool(p.frame_step)),
    "audio_in": lambda: families.family_names(lambda p: bool(p.audio_via)),
    "step_cache_first_block": lambda: families.step_cache_names("first block"),
    "step_cache_taylorseer": lambda: families.step_cache_names("taylorseer"),
    "step_cache_magcache": lambda: families.step_cache_names("magcache"),
    "no_step_cache": lambda: families.pipeline_names(lambda p: not p.step_caches),
    "lora_kohya": lambda: _lora_formats("kohya"),
    "lora_comfy": lambda: _lora_formats("comfy"),
    "lora_xlabs": lambda: _lora_formats("xlabs"),
}


def _pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
            *sorted((ROOT / "web").rglob("*.md"))]


def test_every_marked_list_in_the_docs_is_the_registrys():
    wrong, found = [], set()
    for page in _pages():
        for key, text in MARKED.findall(page.read_text()):
            found.add(key)
            if key not in LISTS:
                wrong.append(f"{page.relative_to(ROOT)}: unknown list {key!r} (known: {', '.join(LISTS)})")
            elif " ".join(text.split()) != LISTS[key]():
                wrong.append(f"{page.relative_to(ROOT)}: {key} says {text!r}; the registry gives {LISTS[key]()!r}")
    assert wrong == []
    readme = {key for key, _ in MARKED.findall((ROOT / "README.md").read_text())}
    assert {"all", "context_parallel", "shard_tp", "controlnet"} <= readme, readme  # the rest on the nodes' pages
    assert "cfg_parallel" in {key for key, _ in MARKED.findall((ROOT / "web/docs/TPUCFGParallel.md").read_text())}


def test_the_package_description_names_every_family():
    description = re.search(r'^description = "(.*)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    listed = re.search(r"\(([^()]*)\)", description)
    assert listed and listed.group(1) == families.names(last=" and "), description


def test_the_helpers_see_what_the_declarations_say():
    """The drift issue 32 found: Z-Image declares inpainting and two passes per step, so it is in both lists."""
    zimage = families.PIPELINES["ZImagePipeline"]
    assert zimage.inpaint and zimage.cfg_passes
    assert "Z-Image" in families.inpainting_names() and "Z-Image" in families.cfg_parallel_names()
    assert "Wan" in families.cfg_parallel_names() and "Wan" not in families.shard_tp_names()
    assert families.context_parallel_names(split=False) == (
        "FLUX 3 [klein], SD3/SD3.5, SDXL, Qwen-Image 2.1, Z-Image, Krea 2 and Ideogram 4")


def _strings(path: Path):
    """The string literals of a module (f-strings with their fields blanked), docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield "".join(v.value if isinstance(v, ast.Constant) else "\x00" for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node.value


def hand_written_lists(text: str) -> list[str]:
    """Runs of three or more family names joined as a list ("SD3, SDXL and Qwen-Image")."""
    text = re.sub(r"[()]", " ", text)
    found, run = [], []
    for match in FAMILY.finditer(text):
        if run and not BETWEEN.match(text[run[-1].end():match.start()]):
            found += [text[run[0].start():run[-1].end()]] if len(run) >= 3 else []
            run = []
        run.append(match)
    return found + ([text[run[0].start():run[-1].end()]] if len(run) >= 3 else [])


def test_the_finder_finds_a_hand_written_list():
    assert hand_written_lists("CFG Parallel applies to SD3/3.5 and SDXL (guidance above 1), Qwen-Image (true "
                              "CFG), FLUX.1.") == ["SD3/3.5 and SDXL  guidance above 1 , Qwen-Image  true CFG , FLUX.1"]
    assert hand_written_lists("FLUX.1-schnell: 4; FLUX.1-dev/FLUX.2: 28; SD3.5: 28-40; SDXL: 25-40") == []


def test_no_family_list_is_written_by_hand_in_the_nodes_or_the_controller():
    found = []
    for path in sorted([*(ROOT / "nodes").glob("*.py"), *(ROOT / "backend" / "controller").rglob("*.py")]):
        for text in _strings(path):
            found += [f"{path.relative_to(ROOT)}: {hit}" for hit in hand_written_lists(text)
                      if not any(allowed in " ".join(text.split()) for allowed in NOT_THE_REGISTRYS)]
    assert found == [], "build these from backend/families' helpers (names(), cfg_parallel_names(), ...)"
