"""ComfyUI's quantized safetensors files (int8 and int8 ConvRot, nvfp4, mxfp8, W4A4, W4A8, AWQ, fp8 "mixed"),
told apart by their header and checked before any worker starts. Torch-free: the controller reads it; the worker's
torch side is backend/worker/quantized.py.

ComfyUI marks each quantized Linear `L` with a uint8 tensor `L.comfy_quant` holding JSON ({"format": ...}), or
lists the layers in `__metadata__["_quantization_metadata"]` ({"layers": {"<L>": {...}}}); the oldest layout is
a `scaled_fp8` marker with `.scale_weight` (comfy/utils.py convert_old_quants). The formats, their storage and
sidecar tensors are ComfyUI's QUANT_ALGOS (comfy/quant_ops.py) and comfy-kitchen's layouts.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Format:
    """One of ComfyUI's quantization formats."""

    storage: str  # the safetensors dtype of `<L>.weight`
    layout: str  # comfy-kitchen's layout class
    label: str  # for messages and docs
    packed: int = 1  # input features per stored column (4-bit formats pack two)
    tpu: bool = False  # kept quantized on a TPU (plain int8/fp8 buffers, dequantized per layer in aten ops)


FORMATS = {
    "float8_e4m3fn": Format("F8_E4M3", "TensorCoreFP8Layout", "fp8 e4m3 (tensorwise scale)", tpu=True),
    "float8_e5m2": Format("F8_E5M2", "TensorCoreFP8Layout", "fp8 e5m2 (tensorwise scale)", tpu=True),
    "int8_tensorwise": Format("I8", "TensorWiseINT8Layout", "int8 (tensorwise or per row, ConvRot)", tpu=True),
    "nvfp4": Format("U8", "TensorCoreNVFP4Layout", "NVFP4 (4-bit, 16-element blocks)", packed=2),
    "mxfp8": Format("F8_E4M3", "TensorCoreMXFP8Layout", "MXFP8 (32-element blocks)"),
    "convrot_w4a4": Format("I8", "TensorCoreConvRotW4A4Layout", "ConvRot W4A4 (4-bit)", packed=2),
    "asym_w4a8_int8": Format("I8", "AsymW4A8Int8Layout", "W4A8 (asymmetric 4-bit, ConvRot)"),
    "awq_w4a16": Format("I8", "TensorCoreAWQW4A16Layout", "AWQ W4A16 (4-bit)", packed=2),
}
SIDECARS = ("weight_scale", "weight_scale_2", "input_scale", "pre_quant_scale", "weight_s_rel", "weight_s_channel",
            "weight_codebook", "weight_correction", "weight_zeros", "comfy_quant", "scale_weight", "scale_input")
MARKER, ATTENTION = ".comfy_quant", ".comfy_attention.config"
REDOWNLOAD = "Download the file again (it is damaged or was written by a broken tool)."


def kept(fmt: str, kind: str) -> bool:
    """Whether a layer of format `fmt` stays quantized in memory on a `kind` device (else dequantized at load)."""
    return kind != "tpu" or FORMATS[fmt].tpu


@dataclass
class Layer:
    """One quantized layer: its marker and what its tensors should be."""

    prefix: str
    conf: dict
    logical: tuple[int, ...] | None = None  # the float weight's shape it stands for
    problems: list[tuple[str, str, str]] = field(default_factory=list)  # (tensor, what is wrong, fix)

    @property
    def format(self) -> str:
        return str(self.conf.get("format"))

    def option(self, name: str, default):
        params = self.conf.get("params") if isinstance(self.conf.get("params"), dict) else {}
        return self.conf.get(name, params.get(name, default))


@dataclass
class Quantized:
    """A file's quantized layers, as its header tells them."""

    layers: dict[str, Layer]
    problems: list[tuple[str, str, str]]  # file-wide and per layer: (tensor, what, fix)

    def formats(self) -> Counter:
        return Counter(layer.format for layer in self.layers.values())

    def describe(self) -> str:
        """'202 int8_tensorwise (ConvRot) layers': what the file holds, for notes."""
        parts = []
        for fmt, n in sorted(self.formats().items(), key=lambda x: -x[1]):
            rot = any(la.option("convrot", False) for la in self.layers.values() if la.format == fmt)
            parts.append(f"{n} {fmt}{' (ConvRot)' if rot else ''}")
        return ", ".join(parts) + " layers"

    def loading_note(self, converted: bool) -> str:
        """The loader's note on a quantized file: what it holds and how it loads (`converted`: every part of it is
        read through a family's converter of plain weights, which dequantizes it while loading)."""
        how = ("dequantized once while loading (the family's converter reads plain weights)" if converted else
               "kept quantized and dequantized layer by layer as they run (docs/quantized.md says which formats a "
               "TPU dequantizes at load)")
        return f"{self.describe()}, {how}"

    def dequantized_at_load(self, kind: str) -> list[str]:
        """The layers a `kind` device cannot keep quantized."""
        return [p for p, la in self.layers.items() if not kept(la.format, kind)]


def roundup(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _conf_of(text: str) -> dict | None:
    try:
        conf = json.loads(text)
    except ValueError:
        return None
    return conf if isinstance(conf, dict) else None


def read(shapes: Mapping[str, tuple], dtypes: Mapping[str, str], metadata: Mapping[str, str],
         markers: Mapping[str, str]) -> Quantized | None:
    """The quantized layers of a safetensors header (`markers`: the marker tensors' JSON text); None when the file
    has none (plain, fp8 or ComfyUI's older scaled fp8, which the loader reads as before)."""
    layers: dict[str, Layer] = {}
    problems: list[tuple[str, str, str]] = []
    for key, text in sorted(markers.items()):
        if key.endswith(ATTENTION):
            continue  # an attention preference (QUANTIZATION.md); the pack runs its own attention
        conf = _conf_of(text)
        if conf is None:
            problems.append((key, "is not a JSON object", REDOWNLOAD))
            continue
        layers[key[:-len(MARKER)]] = Layer(key[:-len(MARKER)], conf)
    raw = metadata.get("_quantization_metadata")
    if raw:
        conf = _conf_of(raw)
        listed = conf.get("layers") if conf else None
        if not isinstance(listed, dict):
            problems.append(("__metadata__._quantization_metadata", "is not a JSON object with 'layers'", REDOWNLOAD))
            listed = {}
        for prefix, c in listed.items():
            c = {"format": c} if isinstance(c, str) else c
            if isinstance(c, dict) and prefix not in layers:
                layers[prefix] = Layer(prefix, c)
    if not layers and not problems:
        return None
    for layer in layers.values():
        _check(layer, shapes, dtypes)
        problems += layer.problems
    for key in shapes:
        for s in ("weight_scale", "weight_scale_2", "weight_s_rel", "weight_zeros"):
            if key.endswith("." + s) and key[:-len(s) - 1] not in layers:
                problems.append((key, "is a quantization scale of a layer that has no comfy_quant marker (the "
                                 "layer would load as raw integers)", REDOWNLOAD))
    return Quantized(layers, problems)


def _check(la: Layer, shapes: Mapping[str, tuple], dtypes: Mapping[str, str]) -> None:
    """`la.logical` and `la.problems` from the stored dtypes and shapes, as ComfyUI's loader (comfy/ops.py
    _load_quantized_module) and comfy-kitchen's layouts expect them."""
    p, fmt = la.prefix, la.format
    weight = f"{p}.weight"
    if weight not in shapes:
        la.problems.append((f"{p}.comfy_quant", "marks a layer that has no weight", REDOWNLOAD))
        return
    if fmt not in FORMATS:
        la.problems.append((f"{p}.comfy_quant", f"names the format {fmt!r}, which ComfyUI-TPU does not know "
                            f"(it reads {', '.join(FORMATS)})", "Use the bf16 or fp8 version of this model, or a "
                            "file in one of these formats."))
        return
    spec, ws, wd = FORMATS[fmt], tuple(shapes[weight]), dtypes[weight]
    experts = la.option("num_experts", 0)
    if experts:
        la.problems.append((weight, "is a bank of MoE experts (num_experts), which ComfyUI-TPU does not read "
                            "quantized yet", "Use the bf16 version of this model."))
        return
    legacy = {"U8"} if fmt in ("float8_e4m3fn", "float8_e5m2", "mxfp8") else set()
    if wd not in {spec.storage} | legacy:
        la.problems.append((weight, f"is {wd}; {fmt} stores {spec.storage}", REDOWNLOAD))
    if len(ws) != 2:
        la.problems.append((weight, f"has the shape {list(ws)}; a quantized Linear weight is 2-D", REDOWNLOAD))
        return
    rows, cols = ws

    def need(suffix: str, allowed: tuple[str, ...], want: list[tuple] | None) -> None:
        key = f"{p}.{suffix}"
        if key not in shapes:
            la.problems.append((key, f"is missing: {fmt} needs it to dequantize '{weight}'", REDOWNLOAD))
            return
        if dtypes[key] not in allowed:
            la.problems.append((key, f"is {dtypes[key]}, {fmt} stores it as {'/'.join(allowed)}", REDOWNLOAD))
        if want is not None and tuple(shapes[key]) not in want:
            la.problems.append((key, f"has the shape {list(shapes[key])}, which does not fit '{weight}' "
                                f"{list(ws)} (expected {' or '.join(str(list(w)) for w in want)})", REDOWNLOAD))

    k = cols * spec.packed
    la.logical = (rows, k)
    if fmt.startswith("float8"):
        need("weight_scale", ("F32",), [(), (1,)])
    elif fmt == "int8_tensorwise":
        # ConvRot rotates each row's groups, so its scale is per row (comfy-kitchen quantizes it per_channel only): a
        # ConvRot marker over a tensorwise scale is a mislabelled plain int8 layer, which would load rotated, wrong
        need("weight_scale", ("F32",), [(rows,), (rows, 1)] if la.option("convrot", False) else
             [(), (1,), (rows,), (rows, 1)])
        if la.option("convrot", False):
            g = int(la.option("convrot_groupsize", 256))
            if g < 4 or math.log(g, 4) % 1 or cols % g:
                la.problems.append((weight, f"has {cols} input features, which ConvRot groups of {g} (a power of "
                                    "4 dividing them) cannot rotate", REDOWNLOAD))
    elif fmt == "convrot_w4a4":
        need("weight_scale", ("F32",), [(rows,)])  # comfy-kitchen's dequantize takes exactly one scale a row, 1-D
        if k % int(la.option("convrot_groupsize", 256)) or k % 64:
            la.problems.append((weight, f"has {k} input features, not a multiple of its ConvRot group and 64",
                                REDOWNLOAD))
    elif fmt == "asym_w4a8_int8":
        gs = int(la.option("group_size", 16))
        rel = shapes.get(f"{p}.weight_s_rel")
        k = (rel[-1] * gs) if rel else 0
        la.logical = (rows, k)
        need("weight_s_rel", ("F8_E4M3", "U8", "F32"), [(rows, rel[-1])] if rel else None)
        need("weight_s_channel", ("F32",), [(rows,)])
        if rel and (k == 0 or cols * 8 % k or cols * 8 // k not in (4, 6) or k % int(la.option("convrot_groupsize",
                                                                                                   256))):
            la.problems.append((weight, f"rows of {cols} bytes fit neither 4 nor 6 bits for {k} input features",
                                REDOWNLOAD))
    elif fmt == "awq_w4a16":
        gs = int(la.option("group_size", 64))
        groups = [(k // gs, rows)] if k % gs == 0 else None
        need("weight_scale", ("BF16", "F16", "F32"), groups)
        need("weight_zeros", ("BF16", "F16", "F32"), groups)
    elif fmt == "nvfp4":
        need("weight_scale_2", ("F32",), [(), (1,)])
        need("weight_scale", ("F8_E4M3", "U8"), [(roundup(rows, 128), roundup(k // 16, 4))])
    elif fmt == "mxfp8":
        need("weight_scale", ("F8_E8M0", "U8"), [(roundup(rows, 128), roundup(cols // 32, 4))])


def logical_shapes(shapes: Mapping[str, tuple], q: Quantized | None) -> dict[str, tuple[int, ...]]:
    """The shapes a float model of the file would have: sidecars and markers left out, packed weights at their
    full width. What family and size detection read."""
    if q is None:
        return dict(shapes)
    drop = {f"{p}.{s}" for p in q.layers for s in SIDECARS}
    out = {k: tuple(v) for k, v in shapes.items() if k not in drop and not k.endswith((MARKER, ATTENTION))}
    for p, la in q.layers.items():
        if la.logical is not None and f"{p}.weight" in out:
            out[f"{p}.weight"] = la.logical
    return out


def float_bytes(shapes: Mapping[str, tuple], q: Quantized, layers: list[str], float_size: int,
                counted: Callable[[str], int] | None = None) -> int:
    """Extra bytes the `layers` take once dequantized at load (their weight in floats of `float_size` bytes, the
    scales gone: AWQ's `pre_quant_scale` folded in), over what was counted for their stored tensors: `counted`
    (the bytes counted for one tensor; by default one per element)."""
    extra = 0
    for p in layers:
        la = q.layers[p]
        if la.logical is None:
            continue
        stored = sum(counted(k) if counted else math.prod(shapes[k])
                     for k in (f"{p}.{s}" for s in ("weight", *SIDECARS)) if k in shapes)
        extra += math.prod(la.logical) * float_size - stored
    return max(extra, 0)
