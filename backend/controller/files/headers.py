"""The controller's one reader of weights-file headers: tensor names, shapes and dtypes; a tensor only where a
layout hangs on its values (`all_zeros`: Z-Image ControlNet 2.0 against 2.1, one matrix).

Bounded: a safetensors header is read only when it is at most MAX_HEADER bytes (far above any published model's,
far below what would stall ComfyUI), and checked against the file (truncated downloads, shapes that do not match
their bytes). Every problem is a ModelError that names the file and the fix.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from pathlib import Path

from ...protocol import quantized, settings
from ...protocol.errors import ModelError

SAFETENSORS = (".safetensors", ".sft")
GGUF = (".gguf",)
PICKLE = (".ckpt", ".pt", ".pth", ".bin", ".pkl")
# The largest published headers are a few hundred kB: a header takes about 120 bytes per tensor (measured on
# the test fixtures, written by ComfyUI), so Qwen-Image's transformer in scaled fp8 (about 3,900 tensors) needs
# about 0.5 MB and an all-in-one FLUX.1 checkpoint (about 1,450) 0.2 MB. A larger one is refused before it is
# read: a legal 121 MB header took 11 s and 1.3 GB of memory to parse.
MAX_HEADER = 8 * 2**20
MAX_GGUF_ENTRIES = 100_000  # tensors or metadata entries of a GGUF file (published ones: a few thousand)
ELEMENT_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "U64": 8, "I32": 4, "U32": 4, "I16": 2,
                 "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}  # E8M0: mxfp8's scales
MARKERS = (".comfy_quant", ".comfy_attention.config")  # ComfyUI's per-layer JSON, stored as uint8 tensors
MAX_MARKER = 1 << 16  # bytes of one marker tensor (ComfyUI's are a few dozen)
COMPUTE_FLOATS = ("F64", "F32", "F16", "BF16")  # loaded in the compute dtype (fp8 is upcast as it is used)
FLOAT_DTYPES = (*COMPUTE_FLOATS, "F8_E4M3", "F8_E5M2")


@dataclass(frozen=True)
class Header:
    """What a weights file holds, from its header: tensor names, shapes and dtypes, and its metadata."""

    path: Path
    format: str  # "safetensors" | "gguf"
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]
    metadata: dict
    size: int
    markers: dict[str, str] = field(default_factory=dict)  # ComfyUI's quantization markers: key -> JSON text

    def strip(self, prefix: str) -> dict[str, tuple[int, ...]]:
        """Logical shapes (quantized.logical_shapes) of the keys under `prefix`, with the prefix removed."""
        n = len(prefix)
        return {k[n:]: v for k, v in self.logical.items() if k.startswith(prefix)}

    @cached_property
    def quantized(self) -> quantized.Quantized | None:
        """ComfyUI's quantized layers (comfy_quant markers or _quantization_metadata), None in a plain file."""
        return quantized.read(self.shapes, self.dtypes, self.metadata, self.markers)

    @cached_property
    def logical(self) -> dict[str, tuple[int, ...]]:
        """The shapes a float model of the file has (sidecars left out, packed 4-bit weights at full width)."""
        return quantized.logical_shapes(self.shapes, self.quantized)

    def loaded_bytes(self, float_bytes: int) -> int:
        """Bytes its tensors take with floats at `float_bytes` each (others as stored)."""
        return sum(self.tensor_bytes(k, float_bytes) for k in self.shapes)

    def tensor_bytes(self, key: str, float_bytes: int) -> int:
        """Bytes tensor `key` takes with floats at `float_bytes` each (else as stored): what loaded_bytes counts."""
        dtype = self.dtypes[key]
        return math.prod(self.shapes[key]) * (float_bytes if dtype in COMPUTE_FLOATS else ELEMENT_BYTES.get(dtype, 1))


class Unreadable(Exception):
    """What is wrong with a file and the fix, without the file's name or the input it was chosen in."""

    def __init__(self, what: str, fix: str):
        super().__init__(f"{what}. {fix}")
        self.what = what


def read_header(path: Path, role: str = "model") -> Header:
    """The header of a safetensors or GGUF file, read once per version of the file; a pickle file, a truncated,
    oversized or foreign file raises a ModelError that names `role` (the input), the file and the fix."""
    path = Path(path)
    try:
        stat = path.stat()
        return _cached(str(path), stat.st_mtime_ns, stat.st_size)
    except OSError as e:
        raise ModelError(f"{role}: '{path.name}' cannot be read ({e.strerror}).") from None
    except Unreadable as e:
        raise ModelError(f"{role}: '{path.name}' {e}") from None


@lru_cache(maxsize=8)  # the files of the pipelines in use (a few each); listing reads through `load`
def _cached(path_text: str, mtime_ns: int, size: int) -> Header:
    return load(Path(path_text), size)


def load(path: Path, size: int) -> Header:
    """The header, uncached; raises Unreadable (what is wrong, to follow the file's name) or OSError."""
    suffix = path.suffix.lower()
    if suffix in PICKLE:
        allowed = " (COMFYUI_TPU_ALLOW_PICKLE does not change this: files are read by their safetensors header)" \
            if settings.ALLOW_PICKLE.on() else ""
        raise Unreadable(f"is a pickle file ({suffix}), which can run arbitrary code when loaded and which "
                         f"ComfyUI-TPU does not read{allowed}", "Use the .safetensors version of this model (most "
                         "models are published as .safetensors), or convert it.")
    if suffix in GGUF:
        return _gguf(path, size)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise Unreadable("is empty or truncated: the download did not finish", "Download it again.")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise Unreadable("is not a safetensors file (or is truncated): its first bytes do not describe a header",
                             "Download it again, or use a .safetensors file.")
        if n > MAX_HEADER:
            raise Unreadable(f"has a header of {n:,} bytes, more than the {MAX_HEADER:,} ComfyUI-TPU reads (published "
                             "models need under 1 MB)", "It is not a model file ComfyUI-TPU can use.")
        raw = f.read(n)
    try:
        table = json.loads(raw)
        metadata = table.pop("__metadata__", None) or {}
        shapes = {key: tuple(int(d) for d in entry["shape"]) for key, entry in table.items()}
        dtypes = {key: str(entry["dtype"]) for key, entry in table.items()}
        spans = {key: (int(entry["data_offsets"][0]), int(entry["data_offsets"][1])) for key, entry in table.items()}
    except (ValueError, TypeError, KeyError, AttributeError, IndexError):
        raise Unreadable("is not a safetensors file (or is truncated): its header is not readable",
                         "Download it again.") from None
    end = max((stop for _, stop in spans.values()), default=0)
    if 8 + n + end > size:
        raise Unreadable(f"is truncated: it has {size:,} bytes but its header describes {8 + n + end:,}",
                         "The download did not finish: download it again.")
    for key, (start, stop) in spans.items():
        if dtypes[key] in ELEMENT_BYTES and math.prod(shapes[key]) * ELEMENT_BYTES[dtypes[key]] != stop - start:
            raise Unreadable(f"is damaged: its header gives the tensor '{key}' the shape {list(shapes[key])} "
                             f"({dtypes[key]}), which does not match the {stop - start:,} bytes it stores",
                             "Download it again.")
    return Header(path, "safetensors", shapes, dtypes, metadata, size, _markers(path, 8 + n, spans))


def _markers(path: Path, data_start: int, spans: dict[str, tuple[int, int]]) -> dict[str, str]:
    """The JSON text of ComfyUI's marker tensors (`<layer>.comfy_quant`: how the layer is quantized), which are
    tensor data, not header: a few dozen bytes each, read by their offsets. A marker that is not UTF-8 is kept as
    '' (the quantization check names it)."""
    keys = [k for k in spans if k.endswith(MARKERS)]
    found = {}
    if not keys:
        return found
    with open(path, "rb") as f:
        for key in keys:
            start, stop = spans[key]
            if stop - start > MAX_MARKER:
                raise Unreadable(f"is damaged: its marker tensor '{key}' holds {stop - start:,} bytes, more than "
                                 "ComfyUI's quantization markers ever do", "Download it again.")
            f.seek(data_start + start)
            try:
                found[key] = f.read(stop - start).decode("utf-8")
            except UnicodeDecodeError:
                found[key] = ""
    return found


def _gguf(path: Path, size: int) -> Header:
    with open(path, "rb") as f:
        head = f.read(24)  # magic, version, tensor count, metadata count
    if len(head) == 24 and head[:4] == b"GGUF":
        tensors, entries = struct.unpack("<QQ", head[8:24])
        if max(tensors, entries) > MAX_GGUF_ENTRIES:
            raise Unreadable(f"is a GGUF file with {tensors:,} tensors and {entries:,} metadata entries, more than "
                             "any model ComfyUI-TPU reads: it is damaged or not a model", "Download it again.")
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        shapes = {t.name: tuple(int(d) for d in reversed(t.shape.tolist())) for t in reader.tensors}
        dtypes = {t.name: t.tensor_type.name for t in reader.tensors}
    except ImportError:
        raise Unreadable("is a GGUF file, and the gguf package is not installed",
                         "pip install gguf (ComfyUI-TPU's requirements list it).") from None
    except Exception as e:  # the reader raises ValueError/KeyError/IndexError on truncated or foreign files
        raise Unreadable(f"could not be read as a GGUF file ({type(e).__name__}: {e}); it may be truncated",
                         "Download it again.") from None
    return Header(path, "gguf", shapes, dtypes, {}, size)


def all_zeros(path: Path, key: str, role: str = "model") -> bool:
    """Whether tensor `key` of the safetensors file is all zeros (-0.0 included), as diffusers' single-file loader
    tests it to tell releases apart; reads that one tensor."""
    import torch  # ComfyUI's process has it loaded already
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return not bool(f.get_tensor(key).to(torch.float32).any())
    except (OSError, SafetensorError) as e:
        raise ModelError(f"{role}: '{Path(path).name}' cannot be read ({e}); download it again.") from None
