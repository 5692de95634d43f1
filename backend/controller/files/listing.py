"""ComfyUI's model folders, per role: the files that fit each dropdown, and a chosen name back to its path.

Listing runs inside ComfyUI's `GET /object_info`, so it is bounded: each file is recognised once per version
(one bounded header read, headers.MAX_HEADER, whatever roles it is listed for), a symlinked folder is entered
once (a `loop -> .` link ends there), and after LIST_SECONDS the files not yet read are listed without being
read; a file that cannot be read is listed (choosing it says what is wrong), never stops the others.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path

from ...protocol import settings
from ...protocol.errors import ModelError
from .headers import GGUF, PICKLE, SAFETENSORS, Unreadable, load
from .recognise import contents

# ComfyUI's model folders per role (folder_paths names; "unet" and "clip" are its legacy second folders)
ROLE_FOLDERS = {"checkpoint": "checkpoints", "diffusion_model": "diffusion_models",
                "text_encoder": "text_encoders", "vae": "vae", "clip_vision": "clip_vision"}
NONE = "(none)"  # the dropdown entry for "no file"
LISTED = SAFETENSORS + GGUF + PICKLE
LIST_SECONDS = 20.0  # reading headers for the lists stops after this; the rest are listed unread
MAX_FILES = 20_000  # files walked per folder

log = logging.getLogger(__name__)


def _walk(root: Path) -> Iterable[Path]:
    """The model files under `root`, in name order, following symlinked folders once each."""
    seen: set[tuple[int, int]] = set()
    found = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        try:
            stat = os.stat(dirpath)
        except OSError:
            continue
        if (stat.st_dev, stat.st_ino) in seen:  # a link back to a folder already listed
            dirnames[:] = []
            continue
        seen.add((stat.st_dev, stat.st_ino))
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.lower().endswith(LISTED) and not name.startswith("."):
                found += 1
                if found > MAX_FILES:
                    log.warning("ComfyUI-TPU lists the first %d model files of %s only.", MAX_FILES, root)
                    return
                yield Path(dirpath) / name


def fitting_roles(path: Path) -> frozenset[str]:
    """The roles a file fits, from one bounded read of its header; every role when it cannot be read (it is
    listed, and choosing it says what is wrong with it)."""
    try:
        stat = path.stat()
    except OSError:
        return frozenset(ROLE_FOLDERS)
    return _roles(str(path), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=65536)  # small entries: the header itself is not kept
def _roles(path_text: str, mtime_ns: int, size: int) -> frozenset[str]:
    try:
        found = contents(load(Path(path_text), size))
    except (OSError, Unreadable):
        return frozenset(ROLE_FOLDERS)
    return frozenset(role for role in ROLE_FOLDERS if found.fits(role))


def list_files(roots: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """For each role, the files of its folders (names relative to the folder, as ComfyUI shows them) that fit
    it: what the pack recognises for that role, plus files it cannot read as safetensors (pickle, truncated,
    GGUF text encoders), so that choosing one explains what is wrong instead of the file being missing."""
    deadline = time.monotonic() + LIST_SECONDS
    unread = 0
    found: dict[str, list[str]] = {}
    for role in ROLE_FOLDERS:
        names: set[str] = set()
        for root in roots.get(role, ()):
            base = Path(root)
            if not base.is_dir():
                continue
            for path in _walk(base):
                if time.monotonic() < deadline:
                    fits = role in fitting_roles(path)
                else:
                    fits, unread = True, unread + 1
                if fits:
                    names.add(path.relative_to(base).as_posix())
        found[role] = sorted(names, key=str.lower)
    if unread:
        log.warning("ComfyUI-TPU listed %d model files without reading them: reading headers took more than "
                    "%.0f s. Choosing one reads it then.", unread, LIST_SECONDS)
    return found


def resolve_file(name: str, role: str, roots: Iterable[str]) -> Path:
    """A file name as the dropdown lists it (relative to one of the role's folders) to its path. `..` and
    absolute names are refused (absolute ones unless COMFYUI_TPU_ALLOW_ABSOLUTE_PATHS=1); a symlink inside
    the folder is the user's choice and is followed."""
    roots = [Path(r) for r in roots]
    name = name.strip()
    candidate = Path(name)
    folder = ROLE_FOLDERS[role]
    if candidate.is_absolute():
        if not settings.ALLOW_ABSOLUTE_PATHS.on():
            raise ModelError(f"{role}: '{name}' is an absolute path, which is refused by default. Put the file in "
                             f"ComfyUI's models/{folder} folder and choose it from the list, or start ComfyUI with "
                             f"{settings.ALLOW_ABSOLUTE_PATHS.name}=1.")
        if candidate.is_file():
            return candidate
    elif ".." in candidate.parts:
        raise ModelError(f"{role}: '{name}' points outside ComfyUI's models/{folder} folders; choose a file "
                         "from the list (no '..').")
    else:
        for root in roots:
            if (root / candidate).is_file():
                return root / candidate
    where = ", ".join(map(str, roots)) or f"models/{folder}"
    raise ModelError(f"{role}: '{name}' was not found in ComfyUI's {folder} folders ({where}). Put the file "
                     "there and press R in ComfyUI to refresh the lists.")
