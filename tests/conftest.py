"""Shared fixtures: tiny models built at test time, a real ComfyUI server with the pack, env for 2-core CI."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import file_fixtures
import pytest
import xdist_groups
from xdist_groups import pytest_configure_node, pytest_xdist_make_scheduler  # noqa: F401 (xdist's hooks)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

# One torch thread per process: on 2-core machines more threads make tiny models 10-40x slower.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("COMFYUI_TPU_WORKER_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The plain diffusers references computed in this process use the MKL mode the pack gives its CPU workers
# (backend/controller/process_env.py: CPU_MATH_ENV), so that the same weights give the same pixels here too.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The model lists include the Hugging Face cache: the tests see an empty one unless they make their own.
os.environ["HF_HUB_CACHE"] = os.path.join(tempfile.gettempdir(), "comfyui-tpu-tests-no-hub-cache")

COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
TPU_VENV = os.environ.get("TPU_VENV")

# The test tiers, as registered in pyproject.toml; `pytest -m unit` is the daily loop, plain `pytest` runs all.
TIERS = {"unit", "pipelines", "workers", "server", "frontend", "soak"}
# what the unit tier may not use: comfyui_files builds ComfyUI's files of every family it is given (a minute of
# CPU on a fresh clone), so its tests are of the pipelines tier
NOT_UNIT = {"comfyui_files"}


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent with -p no:xdist
def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (scripts/test.sh): one xdist worker per CPU core, the unit tier included (its 309 tests: 27 s of
    CPU in one process, 37 s on two workers, each of which imports torch and diffusers: about 19 s a core)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """Every test carries exactly one tier marker, so that `-m` selects each test into exactly one tier, and no
    unit test uses comfyui_files (NOT_UNIT), so that the daily loop stays under a minute on a fresh clone.

    In a run of in-process tests only (unit, pipelines), those that read comfyui_files' files go last: the main
    process then never waits for their background builder (tiny_models), which runs on the other core."""
    wrong = []
    for item in items:
        tiers = sorted(TIERS & {m.name for m in item.iter_markers()})
        if len(tiers) != 1:
            wrong.append(f"{item.nodeid}: {', '.join(tiers) or 'no tier'}")
        elif tiers == ["unit"] and (uses := sorted(NOT_UNIT & set(item.fixturenames))):
            wrong.append(f"{item.nodeid}: unit, but uses {', '.join(uses)}: mark it pipelines")
    if wrong:
        raise pytest.UsageError(
            f"each test needs exactly one of the markers {', '.join(sorted(TIERS))} (pytestmark = "
            "pytest.mark.X at module top, or @pytest.mark.X on the test):\n  " + "\n  ".join(wrong)
        )
    result = yield  # `-m` deselects here
    xdist_groups.write_units(config, items)  # on an xdist worker: which tests run together
    if items and all(item.get_closest_marker("unit") or item.get_closest_marker("pipelines") for item in items):
        items.sort(key=lambda item: "comfyui_files" in item.fixturenames)  # stable: each group keeps its order
    return result


# comfyui_files' builders started in the background, by folder (see tiny_models)
_BUILDING: dict[Path, subprocess.Popen] = {}


def _lock_file(folder: Path) -> int:
    """An open descriptor of the lock file of `folder` (beside it): the xdist workers share the built fixtures."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    return os.open(folder.parent / f".{folder.name}.lock", os.O_CREAT | os.O_RDWR, 0o644)


@contextlib.contextmanager
def building(folder: Path) -> Iterator[None]:
    """Holds `folder`'s lock: one process at a time builds into it, the others wait and then find it built."""
    fd = _lock_file(folder)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _shared_dir(tmp_path_factory, name: str) -> Path:
    """A folder of this run that every xdist worker sees (the workers' temporary folders share a parent)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory, request) -> Path:
    """A diffusers models folder holding tiny-flux, tiny-sd3, tiny-sdxl, ... (random weights, built here, once
    per run: the xdist workers share it). Each family under a lock of its own, each xdist worker starting at its
    own place in the list, so that on a fresh clone the workers build different families at once.

    Then it starts the builder of comfyui_files' folder in the background, for the families that the modules of
    the selected tests that use comfyui_files declare (COMFYUI_FILES = (...)): one builder process for all of
    them (each start imports torch, diffusers and ComfyUI: ~5 s of CPU), and it runs on the second core while
    the first tests run. It holds the folder's lock until it is done; where another xdist worker's builder holds
    it, none starts."""
    from backend.tiny_models import FAMILIES, MORE, build_all

    root = Path(os.environ.get("COMFYUI_TPU_TEST_MODELS") or _shared_dir(tmp_path_factory, "models"))
    names = FAMILIES + MORE
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    start = len(names) * int(worker.removeprefix("gw") or 0) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    for family in names[start:] + names[:start]:
        with building(root.parent / f".{root.name}-locks" / f"tiny-{family}"):  # the locks beside the folder
            build_all(root, families=[family])
    modules = dict.fromkeys(getattr(item, "module", None) for item in request.session.items
                            if "comfyui_files" in item.fixturenames)  # not a module's tests that never read them
    families = tuple(dict.fromkeys(f for module in modules for f in getattr(module, "COMFYUI_FILES", ())))
    out = _files_folder(root)
    if COMFYUI_DIR and families and not file_fixtures.built(out, families):
        fd = _lock_file(out)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another xdist worker's builder runs: comfyui_files waits for it
            os.close(fd)
            return root
        # The builder inherits the lock (the same open file) and holds it until it exits. A failure shows when
        # comfyui_files builds again.
        try:
            proc = subprocess.Popen(_files_builder(out, root, COMFYUI_DIR, families), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, pass_fds=(fd,))
        finally:
            os.close(fd)
        _BUILDING[out] = proc
        request.addfinalizer(lambda: (proc.kill(), proc.wait()))
    return root


def _files_folder(tiny_models: Path, folder: str = "comfyui-files") -> Path:
    return tiny_models.parent / f"{tiny_models.name}-{folder}"


def _files_builder(out: Path, tiny_models: Path, comfyui_dir, families) -> list[str]:
    return [sys.executable, str(ROOT / "tests" / "file_fixtures.py"), str(out), str(tiny_models), str(comfyui_dir),
            *families]


@pytest.fixture(scope="session")
def tiny_controlnets(tiny_models) -> Path:
    """A folder holding a diffusers folder of each tiny ControlNet (tiny-flux-union, tiny-sdxl, ...:
    backend.tiny_models.CONTROLNETS) and the same weights as single files (files/tiny-flux-union.safetensors)."""
    import shutil

    from backend.tiny_models import CONTROLNETS, build_tiny_controlnet

    root = tiny_models.parent / f"{tiny_models.name}-controlnet"
    with building(root):
        (root / "files").mkdir(parents=True, exist_ok=True)
        for name in CONTROLNETS:
            folder = build_tiny_controlnet(name, tiny_models / f"tiny-{CONTROLNETS[name][0]}", root / f"tiny-{name}")
            file = root / "files" / f"tiny-{name}.safetensors"
            if not file.is_file():
                shutil.copy(folder / "diffusion_pytorch_model.safetensors", file)
    return root


@pytest.fixture(scope="session")
def comfyui_files(tiny_models, comfyui_dir):
    """Builds (once, cached beside the tiny models) artists' files of the given families, written by ComfyUI's
    own converters, and their reference diffusers folders (tests/file_fixtures.py, in a subprocess so that
    ComfyUI's modules stay out of the test process); returns the folder holding models/ and diffusers/. A
    file the model lists of other tests must not see goes in a folder of its own (`folder`). The families that
    modules declare in COMFYUI_FILES are built in the background from the start (tiny_models)."""

    def build(*families: str, folder: str = "comfyui-files") -> Path:
        out = _files_folder(tiny_models, folder)
        if (background := _BUILDING.pop(out, None)) is not None:
            background.wait(timeout=1200)
        with building(out):  # waits for a builder of another xdist worker
            if not file_fixtures.built(out, families or file_fixtures.FAMILIES):  # the builder's start imports torch
                subprocess.run(_files_builder(out, tiny_models, comfyui_dir, families), check=True, timeout=1200)
        return out

    return build


@pytest.fixture(scope="session")
def comfyui_dir() -> Path:
    if not COMFYUI_DIR:
        pytest.skip("COMFYUI_DIR is not set: run the tests through scripts/test.sh")
    return Path(COMFYUI_DIR)


@pytest.fixture(scope="session")
def server(comfyui_dir, tiny_models, tmp_path_factory):
    """One real ComfyUI server with ComfyUI-TPU loaded, shared by the tests that only queue prompts."""
    from comfy_server import ComfyServer

    srv = ComfyServer(str(comfyui_dir), str(tiny_models), work_dir=str(tmp_path_factory.mktemp("comfy")))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture(autouse=True, scope="session")
def _stop_workers_at_end():
    yield
    from backend.controller import api

    api.shutdown()
