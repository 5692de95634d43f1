"""ComfyUI's quantized files in the worker: each marked layer becomes one comfy-kitchen `QuantizedTensor` (the
library ComfyUI itself uses for these formats), kept in its storage and dequantized layer by layer as it runs.

- `state_dict` reads a file's tensors and wraps each quantized layer, with the same Params ComfyUI's
  comfy/ops.py `_load_quantized_module` builds; the sidecars (scales) leave the dict.
- `RowSplitMode`: while diffusers' single-file converters run, their chunk/split/cat of fused weights (Z-Image's
  qkv, FLUX's qkv) keep the rows quantized where the layout allows; comfy-kitchen's default would dequantize.
  A mode, not comfy-kitchen's global op table, which ComfyUI shares in this process.
- `finish` swaps each Linear (and Embedding) holding a `QuantizedTensor` for one whose forward dequantizes it to
  the input's dtype (weight-only, as ComfyUI runs formats without a fast kernel: `_full_precision_mm`).
- `for_device`: on a TPU, which has no int8 matmul (TorchTPU 0.2.0), the int8 and fp8 layers (and embedding
  tables) become plain int8/fp8 buffers dequantized in aten ops (compilable); the other formats are dequantized
  at load.
- `dequantized` / `sharded`: under Shard TP (and for VAEs read through the pack's converters) the whole component
  is dequantized at load.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ..protocol.quantized import FORMATS, MARKER, kept

EXTRAS = ("input_scale", "pre_quant_scale")  # activation-side tensors: pre_quant_scale is applied, input_scale
# belongs to W8A8 kernels, which weight-only dequantization does not run


def _kitchen():
    import comfy_kitchen  # noqa: F401  (registers the layouts and the eager backend)
    from comfy_kitchen.tensor import QuantizedTensor, get_layout_class

    return QuantizedTensor, get_layout_class


def _qt_type() -> type:
    return _kitchen()[0]


def state_dict(path: str, prefix: str, dtype: torch.dtype) -> tuple[dict, dict]:
    """The tensors under `prefix` (removed; under any of several "a|b" prefixes, the names kept whole), each
    quantized layer one QuantizedTensor computing in `dtype`, and {layer: {"pre_quant_scale": t}} of the layers that
    smooth their input."""
    from safetensors import safe_open

    from .storage import file_tensors

    prefixes, strip = tuple(prefix.split("|")), 0 if "|" in prefix else len(prefix)
    with safe_open(path, "pt") as f:
        metadata = f.metadata() or {}
    # own copies, read a few at a time: the file's pages leave memory as it goes (the load's peak is about the
    # quantized size, not twice it); a view of the file's mapping would keep all of its pages resident
    sd = {k[strip:]: t.clone() for k, t in file_tensors([Path(path)], lambda k: k.startswith(prefixes))}
    listed = json.loads(metadata.get("_quantization_metadata", "{}") or "{}").get("layers", {})
    confs = {k[strip:]: ({"format": v} if isinstance(v, str) else v) for k, v in listed.items()
             if k.startswith(prefixes)}
    for key in [k for k in sd if k.endswith(MARKER)]:
        confs[key[:-len(MARKER)]] = json.loads(sd.pop(key).numpy().tobytes())
    for key in [k for k in sd if k.endswith(".comfy_attention.config")]:
        sd.pop(key)
    extras = {}
    for layer, conf in confs.items():
        sd[f"{layer}.weight"] = make_tensor(layer, conf, sd, dtype)
        found = {n: sd.pop(f"{layer}.{n}") for n in EXTRAS if f"{layer}.{n}" in sd}
        if "pre_quant_scale" in found:
            extras[layer] = found
    for key, value in sd.items():  # the float tensors (norms, biases, embedders) in the compute dtype
        if not isinstance(value, _qt_type()) and value.is_floating_point() and value.dtype != dtype:
            sd[key] = value.to(dtype)
    return sd, extras


def _option(conf: dict, name: str, default: Any) -> Any:
    params = conf.get("params") if isinstance(conf.get("params"), dict) else {}
    return conf.get(name, params.get(name, default))


def make_tensor(layer: str, conf: dict, sd: dict, dtype: torch.dtype) -> Any:
    """One layer's QuantizedTensor from its stored tensors (popped from `sd`), as comfy/ops.py builds it; the
    controller checked every tensor is there (backend/protocol/quantized.py)."""
    QuantizedTensor, get_layout_class = _kitchen()
    fmt = conf["format"]
    layout = FORMATS[fmt].layout
    weight = sd.pop(f"{layer}.weight")

    def take(name: str, view: torch.dtype | None = None) -> torch.Tensor | None:
        v = sd.pop(f"{layer}.{name}", None)
        return v.view(view) if v is not None and view is not None and v.dtype != view else v

    rows, cols = weight.shape
    shape = (rows, cols)
    if fmt.startswith("float8"):
        kw = {"scale": take("weight_scale").float()}
        weight = weight.view(getattr(torch, fmt))
    elif fmt == "mxfp8":
        kw = {"scale": take("weight_scale", torch.float8_e8m0fnu)}
        weight = weight.view(torch.float8_e4m3fn)
    elif fmt == "nvfp4":
        kw = {"scale": take("weight_scale_2"), "block_scale": take("weight_scale", torch.float8_e4m3fn)}
        shape = (rows, cols * 2)
    elif fmt == "int8_tensorwise":
        scale = take("weight_scale")
        kw = {"scale": scale.reshape(rows, 1) if scale.numel() == rows > 1 else scale}  # per row: [N, 1]
        if _option(conf, "convrot", False):
            kw.update(convrot=True, convrot_groupsize=int(_option(conf, "convrot_groupsize", 256)))
    elif fmt == "convrot_w4a4":
        kw = {"scale": take("weight_scale"), "convrot_groupsize": int(_option(conf, "convrot_groupsize", 256)),
              "quant_group_size": 64, "linear_dtype": _option(conf, "linear_dtype", "int4")}
        shape = (rows, cols * 2)
    elif fmt == "asym_w4a8_int8":
        rel = take("weight_s_rel", torch.float8_e4m3fn) if sd[f"{layer}.weight_s_rel"].dtype == torch.uint8 \
            else take("weight_s_rel")
        gs = int(_option(conf, "group_size", 16))
        kw = {"scale": rel, "s_channel": take("weight_s_channel"), "codebook": take("weight_codebook"),
              "group_size": gs, "convrot_groupsize": int(_option(conf, "convrot_groupsize", 256))}
        shape = (rows, rel.shape[-1] * gs)
    else:  # awq_w4a16
        kw = {"scale": take("weight_scale"), "zeros": take("weight_zeros"),
              "group_size": int(_option(conf, "group_size", 64))}
        shape = (rows, cols * 2)
    storage = {"I8": torch.int8, "U8": torch.uint8}.get(FORMATS[fmt].storage, weight.dtype)
    params = get_layout_class(layout).Params(**kw, orig_dtype=dtype, orig_shape=shape)
    return QuantizedTensor(weight.view(storage) if weight.dtype != storage else weight, layout, params)


def dequantized(sd: dict, extras: dict | None = None) -> dict:
    """`sd` with every QuantizedTensor dequantized by comfy-kitchen (a VAE's few layers; a denoiser under Shard
    TP), a layer's `pre_quant_scale` (AWQ smoothing, `extras`) folded into its weight's columns:
    (x * s) W^T = x (W * s)^T."""
    qt, extras = _qt_type(), extras or {}
    out = {k: v.dequantize() if isinstance(v, qt) else v for k, v in sd.items()}
    for layer, extra in extras.items():
        if (s := extra.get("pre_quant_scale")) is not None:
            w = out[f"{layer}.weight"]
            out[f"{layer}.weight"] = (w.float() * s.float().reshape(1, -1)).to(w.dtype)
    return out


def sharded(extra: dict) -> bool:
    """Whether a component is loaded for Shard TP (`extra`: its loading kwargs). diffusers' tensor-parallel plan
    slices each weight with DTensor's `distribute_tensor`, which a QuantizedTensor does not take (comfy-kitchen
    0.2.40 has no DTensor support, and a row-sliced weight must keep its scales' rows): such a denoiser is
    dequantized at load, then sharded, and offload 'auto' counts it so."""
    return type(extra.get("parallel_config")).__name__ == "TensorParallelConfig"


# ---- the converters' row splits and concatenations

ROW_TILE = {"TensorCoreNVFP4Layout": 128, "TensorCoreMXFP8Layout": 128}  # their block scales' swizzled tiles


def _scalar(t: torch.Tensor | None) -> bool:
    return t is None or t.numel() == 1


def split_rows(qt: Any, sizes: list[int]) -> list | None:
    """A quantized [N, K] weight split into row blocks of `sizes`, or None where the layout cannot split there
    without requantizing (the caller dequantizes)."""
    QuantizedTensor = _qt_type()
    p, name, q = qt._params, qt._layout_cls, qt._qdata
    if getattr(p, "transposed", False) or getattr(p, "mma_packed", False) or sum(sizes) != p.orig_shape[0]:
        return None
    tile = ROW_TILE.get(name, 1)
    if any(s % tile for s in sizes[:-1]) or (tile > 1 and q.shape[0] != p.orig_shape[0]):
        return None
    out, start = [], 0
    for s in sizes:
        rows, kw = slice(start, start + s), {}
        if name == "TensorWiseINT8Layout":
            kw["scale"] = p.scale if _scalar(p.scale) else p.scale[rows]
        elif name == "TensorCoreConvRotW4A4Layout":
            kw["scale"] = p.scale[rows]
        elif name == "AsymW4A8Int8Layout":
            kw.update(scale=p.scale[rows], s_channel=p.s_channel[rows])
            if p.correction is not None:
                kw["correction"] = p.correction[:, rows]
        elif name == "TensorCoreAWQW4A16Layout":
            kw.update(scale=p.scale[:, rows], zeros=p.zeros[:, rows])
        elif name == "TensorCoreFP8Layout":
            if not _scalar(p.scale):
                return None
        elif name == "TensorCoreNVFP4Layout" and _scalar(p.scale):
            kw["block_scale"] = p.block_scale[start:start + -(-s // tile) * tile]
        elif name == "TensorCoreMXFP8Layout":
            kw["scale"] = p.scale[start:start + -(-s // tile) * tile]
        else:
            return None
        out.append(QuantizedTensor(q[rows], name, dataclasses.replace(p, orig_shape=(s, p.orig_shape[1]), **kw)))
        start += s
    return out


def cat_rows(parts: list) -> Any:
    """Quantized [n_i, K] weights of one layout joined along the rows, or None where not lossless."""
    QuantizedTensor = _qt_type()
    names = {x._layout_cls for x in parts}
    ps = [x._params for x in parts]
    if len(names) != 1 or len({p.orig_shape[1] for p in ps}) != 1 or len({p.orig_dtype for p in ps}) != 1 \
            or any(getattr(p, "transposed", False) or getattr(p, "mma_packed", False) for p in ps):
        return None
    name, p0 = names.pop(), ps[0]
    same = all(_scalar(p.scale) for p in ps) and all(torch.equal(p.scale.reshape(()), p0.scale.reshape(()))
                                                     for p in ps)
    kw: dict = {}
    if name == "TensorWiseINT8Layout":
        if len({(p.convrot, p.convrot_groupsize) for p in ps}) != 1:
            return None
        if not same:
            if any(_scalar(p.scale) for p in ps):
                return None
            kw["scale"] = torch.cat([p.scale for p in ps])
    elif name == "TensorCoreConvRotW4A4Layout":
        kw["scale"] = torch.cat([p.scale for p in ps])
    elif name == "TensorCoreAWQW4A16Layout":
        kw.update(scale=torch.cat([p.scale for p in ps], 1), zeros=torch.cat([p.zeros for p in ps], 1))
    elif name == "TensorCoreFP8Layout":
        if not same:
            return None
    else:  # W4A8 (codebooks and corrections per layer), nvfp4/mxfp8 (swizzled tiles): dequantized
        return None
    rows = sum(p.orig_shape[0] for p in ps)
    return QuantizedTensor(torch.cat([x._qdata for x in parts]), name,
                           dataclasses.replace(p0, orig_shape=(rows, p0.orig_shape[1]), **kw))


class RowSplitMode(TorchDispatchMode):
    """While active, split/chunk/narrow/cat along dim 0 of QuantizedTensors keep them quantized where the layout
    allows; anything else falls through to comfy-kitchen (which dequantizes), counted in `dequantized`."""

    def __init__(self):
        super().__init__()
        self.kept, self.dequantized = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs, a, qt = kwargs or {}, torch.ops.aten, _qt_type()
        first = args[0] if args else None
        if func in (a.split.Tensor, a.split_with_sizes.default) and isinstance(first, qt) \
                and (args[2] if len(args) > 2 else kwargs.get("dim", 0)) in (0, -2):
            n = first.shape[0]
            sizes = [min(args[1], n - i) for i in range(0, n, args[1])] if func is a.split.Tensor else list(args[1])
            if (parts := split_rows(first, sizes)) is not None:
                self.kept += 1
                return parts
        if func is a.slice.Tensor and isinstance(first, qt):
            dim, start, end, step = (list(args[1:]) + [0, None, None, 1][len(args) - 1:])[:4]
            n = first.shape[0]
            start, end = (start or 0) + (n if (start or 0) < 0 else 0), n if end is None else min(end, n)
            if dim in (0, -2) and step == 1 and 0 <= start < end <= n:
                sizes = [s for s in (start, end - start, n - end) if s]
                parts = split_rows(first, sizes) if len(sizes) > 1 else [first]
                if parts is not None:
                    self.kept += 1
                    return parts[1 if start else 0]
        if func is a.cat.default and all(isinstance(t, qt) for t in first) \
                and (args[1] if len(args) > 1 else kwargs.get("dim", 0)) in (0, -2):
            if (out := cat_rows(list(first))) is not None:
                self.kept += 1
                return out
        if any(isinstance(t, qt) for t in torch.utils._pytree.tree_leaves((args, kwargs))):
            self.dequantized += 1
        return func(*args, **kwargs)


# ---- running: dequantized per layer

class DequantLinear(torch.nn.Linear):
    """An nn.Linear whose weight is a QuantizedTensor: each call dequantizes it to the input's dtype and runs a
    plain F.linear. `lora_delta`: a LoRA's sum of deltas, added to the dequantized weight (the file's weight
    never changes, so removing the LoRA restores it exactly)."""

    pre_quant_scale: torch.Tensor | None = None
    lora_delta: torch.Tensor | None = None

    def dequantized_weight(self, dtype: torch.dtype) -> torch.Tensor:
        w = self.weight.dequantize().to(dtype)
        return w if self.lora_delta is None else w + self.lora_delta.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_quant_scale is not None:  # AWQ-style smoothing (ComfyUI's MixedPrecisionOps.forward)
            x = x * self.pre_quant_scale.to(x)
        return F.linear(x, self.dequantized_weight(x.dtype), None if self.bias is None else self.bias.to(x.dtype))


class DequantEmbedding(torch.nn.Embedding):
    """An nn.Embedding with a quantized table (ComfyUI quantizes text encoders' embeddings in fp8 and int8):
    the table is dequantized as it is read."""

    plain = torch.nn.Embedding  # the class it was (dequant_embedding: a subclass of nn.Embedding)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight.dequantize(), self.padding_idx)


def dequant_embedding(cls: type) -> type:
    """DequantEmbedding for an nn.Embedding; for a subclass with its own forward around the table's read (Gemma's
    scaled embedding, `super().forward(ids) * embed_scale`), the subclass over DequantEmbedding's read."""
    if cls is torch.nn.Embedding:
        return DequantEmbedding
    return type(f"Dequant{cls.__name__}", (cls, DequantEmbedding), {"plain": cls})


def finish(model: torch.nn.Module, extras: dict) -> int:
    """Every Linear and Embedding of `model` holding a QuantizedTensor made to dequantize it as it runs (a class
    swap: names, state_dict keys and hooks unchanged); the number of layers."""
    qt, n = _qt_type(), 0
    for name, m in model.named_modules():
        if isinstance(getattr(m, "weight", None), qt):
            if type(m) is torch.nn.Linear:
                m.__class__ = DequantLinear
                m.pre_quant_scale = extras.get(name, {}).get("pre_quant_scale")
            elif isinstance(m, torch.nn.Embedding):
                m.__class__ = dequant_embedding(type(m))
            else:
                raise ValueError(f"layer '{name}' ({type(m).__name__}) is quantized in the file; ComfyUI quantizes "
                                 "Linear and Embedding layers only")
            n += 1
    return n


def count(model: torch.nn.Module) -> int:
    return sum(isinstance(m, (DequantLinear, DequantEmbedding, PlainQuantLinear)) for m in model.modules())


# ---- TPU: plain buffers, aten ops

def hadamard(size: int) -> torch.Tensor:
    """comfy-kitchen's ConvRot rotation (int8_utils `_build_hadamard`): Kronecker powers of a regular 4x4 Hadamard
    matrix over sqrt(size); symmetric and orthogonal."""
    h4 = torch.tensor([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=torch.float32)
    h = h4
    while h.shape[0] < size:
        h = torch.kron(h, h4)
    return h / size ** 0.5


_HADAMARDS: dict[tuple[int, str], torch.Tensor] = {}


def shared_hadamard(size: int, device: torch.device) -> torch.Tensor:
    """One rotation per group size and device, shared by every layer (as comfy-kitchen caches its own): a copy
    per layer costs 256 KB at a group of 256, and diffusers splits a fused qkv into three layers."""
    key = (size, str(device))
    if key not in _HADAMARDS:
        _HADAMARDS[key] = hadamard(size).to(device)
    return _HADAMARDS[key]


class PlainQuantLinear(torch.nn.Module):
    """An int8 (ConvRot included) or fp8 Linear held as plain buffers (`qweight`, `wscale` in float32) and
    dequantized per call in aten ops only (a cast, a multiply, ConvRot's group matmul), which any device and
    torch.compile run: TorchTPU 0.2.0 has no int8 matmul, so the matmul is the compute dtype's."""

    lora_delta: torch.Tensor | None = None

    def __init__(self, qweight: torch.Tensor, wscale: torch.Tensor, bias: torch.nn.Parameter | None,
                 group: int = 0, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.out_features, self.in_features = qweight.shape
        self.dtype = dtype  # the compute dtype, what `weight` says
        self.register_buffer("qweight", qweight)
        self.register_buffer("wscale", wscale.float())
        self.bias = bias
        self.group = group
        self.hadamard = shared_hadamard(group, qweight.device) if group else None  # not a buffer: see _apply

    def _apply(self, fn: Callable, recurse: bool = True) -> PlainQuantLinear:
        """Moved (`.to(device)`), the layer takes the new device's shared rotation; a buffer would be copied
        once per layer."""
        super()._apply(fn, recurse)
        if self.group:
            self.hadamard = shared_hadamard(self.group, self.qweight.device)
        return self

    @classmethod
    def of(cls, linear: DequantLinear) -> PlainQuantLinear:
        p = linear.weight._params
        group = int(p.convrot_groupsize) if getattr(p, "convrot", False) else 0
        return cls(linear.weight._qdata, p.scale, getattr(linear, "bias", None), group, p.orig_dtype)

    @property
    def weight(self) -> torch.Tensor:
        """A stand-in of the float weight's shape, dtype and device, one element in memory: models read
        `layer.weight.dtype` to cast their input (transformers' T5 feed-forward, diffusers' timestep embedders),
        as they read it off comfy-kitchen's tensor before; never its values."""
        return self.wscale.new_zeros((), dtype=self.dtype).expand(self.out_features, self.in_features)

    def dequantized_weight(self, dtype: torch.dtype) -> torch.Tensor:
        w = self.qweight.to(torch.float32) * self.wscale
        if self.group:
            n, k = w.shape
            w = torch.matmul(w.reshape(n, k // self.group, self.group), self.hadamard.T).reshape(n, k)
        w = w.to(dtype)
        return w if self.lora_delta is None else w + self.lora_delta.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantized_weight(x.dtype), None if self.bias is None else self.bias.to(x.dtype))


class PlainQuantEmbedding(PlainQuantLinear):
    """An int8 or fp8 embedding table as PlainQuantLinear's plain buffers, dequantized to `dtype` as it is read
    (what DequantEmbedding does with comfy-kitchen's tensor)."""

    def __init__(self, linear: PlainQuantLinear, padding_idx: int | None, dtype: torch.dtype):
        super().__init__(linear.qweight, linear.wscale, None, linear.group, dtype)
        self.padding_idx = padding_idx

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.dequantized_weight(self.dtype), self.padding_idx)


def for_device(model: torch.nn.Module, kind: str, dtype: torch.dtype, status: Callable[[str], None],
               name: str) -> None:
    """The quantized layers of `model` as a `kind` device runs them ("tpu" also for compiled mode anywhere): as
    they are on the CPU and CUDA; on a TPU plain int8/fp8 buffers (PlainQuantLinear, PlainQuantEmbedding) for the
    formats that allow it and dequantized weights for the others, which the loader's text says."""
    if kind != "tpu":
        return
    fmt_of = {"TensorWiseINT8Layout": "int8_tensorwise", "TensorCoreFP8Layout": "float8_e4m3fn"}
    dequant = 0
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if not isinstance(child, (DequantLinear, DequantEmbedding)):
                continue
            layout = child.weight._layout_cls
            scalar_or_rows = layout in fmt_of and not getattr(child.weight._params, "transposed", False)
            plain = scalar_or_rows and kept(fmt_of[layout], kind) and getattr(child, "pre_quant_scale", None) is None
            if plain and isinstance(child, DequantLinear):
                setattr(parent, child_name, PlainQuantLinear.of(child))
            elif plain and type(child) is DequantEmbedding:  # an int8 or fp8 embedding table (ComfyUI's text encoders)
                setattr(parent, child_name, PlainQuantEmbedding(PlainQuantLinear.of(child), child.padding_idx, dtype))
            else:
                w = child.weight.dequantize().float()
                if (s := getattr(child, "pre_quant_scale", None)) is not None:  # AWQ smoothing, folded in
                    w = w * s.float().reshape(1, -1)
                w = w.to(dtype)
                child.__class__ = torch.nn.Linear if isinstance(child, DequantLinear) else child.plain
                child.weight = torch.nn.Parameter(w, requires_grad=False)
                dequant += 1
    if dequant:
        status(f"{name}: {dequant} quantized layers dequantized at load to {str(dtype).split('.')[-1]} (a TPU, and "
               "compiled mode, keep only int8 and fp8 layers quantized; offload 'auto' counted them at that size)")
