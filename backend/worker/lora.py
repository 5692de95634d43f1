"""LoRAs written into the loaded weights in place (worker side): W = W_orig + Σ strength · scale · up @ down.

diffusers' own `load_lora_weights` reads the file (every format its converters know: diffusers/PEFT, kohya,
ComfyUI, XLabs, BFL…), but on a weightless copy of the pipeline (a "skeleton": the same classes built on the
meta device, given zero-stride tensors), never on the live model: a bad file leaves the pipeline as it was, and
the live model never gets peft wrapper modules, so its module tree, and any compiled graph of it, never change.
The factors peft read (down = lora_A, up = lora_B, scale = alpha / rank) are kept, not dense deltas (a FLUX LoRA
as dense deltas would be tens of GB), and each touched weight is rewritten from its saved original with peft's
own arithmetic and order (what `fuse_lora(lora_scale=strength)` does), so images equal diffusers' fused LoRA bit
for bit in float32, and strength 0 or removal restores the original weights exactly.

Weights stored in fp8 (fp8 storage, diffusers' layerwise casting) get the LoRA the way diffusers' fused LoRA
followed by `enable_layerwise_casting` would have it: the original fp8 weight in the compute dtype plus the deltas,
rounded to fp8 once; the fp8 originals are kept, so removal restores them exactly.

Layers of ComfyUI's quantized files keep their quantized weight: the LoRA's summed delta is kept beside it (in the
compute dtype, for the layers the LoRA touches) and added to the dequantized weight as the layer runs, so one LoRA
on a quantized file equals it on the same file dequantized, bit for bit, and removal restores it exactly.

Under Shard TP each rank writes its own slice of every delta, cut with diffusers' own TP helpers (so packed
layouts come out right). Data-parallel replicas each apply the LoRAs themselves. On a model of two experts (Wan
2.2 A14B) a LoRA goes to the high-noise expert, the low-noise one or both, as its Load LoRA says (`on_experts`).
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..families import PIPELINES, conversions
from ..protocol.errors import ModelError
from ..protocol.spec import DENOISERS, EXPERT_COMPONENTS, LoraRef
from .storage import compute_dtype_of, compute_dtype_of_model

_DOWN_KEY = re.compile(r"(lora_A|lora[._]down)\.weight$")  # one per LoRA layer, in every converted layout
_LYCORIS = ("lokr_", "hada_", "lycoris_", ".oft_", "lora_mid")
CACHE_SIZE = 8  # resolved files kept beyond the ones in use
_LOCAL = {"local_files_only": True, "use_safetensors": True}  # never the Hub, never pickle


@dataclass(frozen=True)
class Layer:
    """One LoRA layer as peft holds it: delta = (up @ down) · scale, plus up's bias · scale when it has one."""

    down: torch.Tensor  # lora_A weight, on the CPU
    up: torch.Tensor  # lora_B weight, on the CPU
    scale: float  # peft's scaling: alpha / rank
    conv: bool = False  # a Conv2d layer (kohya LoCon)
    bias: torch.Tensor | None = None  # lora_B bias (rare)

    def delta(self, strength: float, dtype: torch.dtype, device: Any) -> torch.Tensor:
        """The full weight delta in `dtype` on `device`, computed like peft's get_delta_weight does on the CPU
        (float32, then cast once)."""
        down = self.down.to(device, torch.float32)
        up = self.up.to(device, torch.float32)
        scale = self.scale * strength  # peft's scale_layer multiplies its scaling by fuse_lora's lora_scale
        if not self.conv:
            out = (up @ down) * scale
        elif down.shape[2:4] == (1, 1):
            out = (up.squeeze(3).squeeze(2) @ down.squeeze(3).squeeze(2)).unsqueeze(2).unsqueeze(3) * scale
        else:
            out = torch.nn.functional.conv2d(down.transpose(0, 1), up).transpose(0, 1) * scale
        return out.to(dtype)


Resolved = dict[tuple[str, str], Layer]  # (component, module name) -> layer


def _quantized(module: torch.nn.Module) -> bool:
    """A layer of ComfyUI's quantized files (worker/quantized.py): its weight stays quantized and the LoRA's
    summed delta is kept beside it, added to the dequantized weight as it runs."""
    return hasattr(module, "dequantized_weight")


# ---- reading a file: the few pre-passes where diffusers 0.42 has a gap, then its own converters

def _keys(path: str, name: str) -> list[str]:
    """The tensor names of a safetensors file (its header only)."""
    from safetensors import safe_open

    if not name.endswith(".safetensors"):
        raise ModelError(f"lora_name: '{name}' is not a .safetensors file; pickle files (.ckpt, .pt, .bin) can run "
                         "code when loaded and are refused. Use the .safetensors version of this LoRA.")
    try:
        with safe_open(path, "pt") as f:
            return list(f.keys())
    except FileNotFoundError:
        raise ModelError(f"lora_name: '{name}' is gone from the loras folder; pick it again.") from None
    except Exception as e:
        raise ModelError(f"lora_name: '{name}' cannot be read as safetensors ({type(e).__name__}: {e}); the file "
                         "is damaged or incomplete: download it again.") from None


def check_finite(path: str, name: str) -> None:
    """Refuses a file whose tensors hold NaN or infinity (a diverged training run, a broken conversion): written
    into the weights they would turn every image black. Names the file and the first such tensor."""
    from safetensors import safe_open

    bad: list[str] = []
    with safe_open(path, "pt") as f:
        for key in f.keys():  # noqa: SIM118 (a safe_open handle is not a dict)
            t = f.get_tensor(key)
            if t.is_floating_point() and not bool(torch.isfinite(t.float() if t.element_size() == 1 else t).all()):
                bad.append(key)
    if bad:
        more = f" (and {len(bad) - 1} more tensor{'s' if len(bad) > 2 else ''})" if len(bad) > 1 else ""
        raise ModelError(f"lora_name: '{name}' holds values that are not numbers (NaN or infinity) in tensor "
                         f"'{bad[0]}'{more}; applied, they would make every image black. The file is damaged or "
                         "comes from a training run that diverged: download it again or use another LoRA.")


def _drop_zero_diffs(sd: dict, name: str) -> dict:
    """ComfyUI's LoraSave writes a `.diff`/`.diff_b` entry for every 1-D weight and bias (zeros when only the LoRA
    changed); diffusers refuses them ('state_dict should be empty'). Zeros carry nothing: drop them. Non-zero
    ones are full weight differences, not a LoRA."""
    diffs = [k for k in sd if k.endswith((".diff", ".diff_b"))]
    changed = [k for k in diffs if bool(sd[k].abs().max() > 0)]
    if changed:
        raise ModelError(f"lora_name: '{name}' holds full weight differences ({changed[0]}, …), not only LoRA "
                         "layers, which ComfyUI-TPU cannot apply; save the LoRA without bias_diff.")
    return {k: v for k, v in sd.items() if k not in diffs}


def _passes(keys: list[str], formats: dict) -> list[Callable[[dict, Any], dict]]:
    """The pre-passes a file needs (none for the formats diffusers reads as they are)."""
    passes = []
    if any(k.endswith((".diff", ".diff_b")) for k in keys):
        passes.append(_drop_zero_diffs)
    passes += [rewrite for uses, rewrite in formats.values() if uses(keys)]
    return passes


def source(path: str, pipe_cls: Any) -> str | dict:
    """What to hand to diffusers' loader: the file itself (so it reads the file's own LoRA metadata, such as
    lora_alpha), or its tensors after the pre-passes it needs."""
    name = Path(path).name
    keys = _keys(path, name)
    if any(marker in k for k in keys for marker in _LYCORIS):
        raise ModelError(f"lora_name: '{name}' is a LyCORIS file (LoKr/LoHa/OFT), not a LoRA; ComfyUI-TPU applies "
                         "LoRA files only. Use a LoRA version of it.")
    check_finite(path, name)
    pipeline = PIPELINES.get(pipe_cls.__name__)
    convert = conversions(pipeline.family) if pipeline else None
    passes = _passes(keys, getattr(convert, "LORA_FORMATS", {}))
    if not passes:
        return path
    from safetensors.torch import load_file

    sd = load_file(path)
    for step in passes:
        sd = step(sd, name) if step is _drop_zero_diffs else step(sd, pipe_cls)
    return sd


# ---- the weightless skeleton and resolving a file on it

def _weightless(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Every parameter and buffer replaced by a zero-stride CPU tensor of its shape: no memory, but a real device
    and dtype (peft moves LoRA weights to the base weight's device; on meta they would be lost)."""
    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is not None:
                t = torch.zeros((), dtype=dtype if p.is_floating_point() else p.dtype).expand(p.shape)
                sub._parameters[name] = torch.nn.Parameter(t, requires_grad=False)
        for name, b in list(sub._buffers.items()):
            if b is not None:
                sub._buffers[name] = torch.zeros((), dtype=b.dtype).expand(b.shape)
    return module.eval()


def skeleton(pipe: Any) -> Any:
    """The same pipeline class with every model replaced by a weightless copy (same module names and shapes,
    unsharded); tokenizers and scheduler are shared. No live module is shared: diffusers' LoRA loader takes
    offload hooks off the pipeline's modules and puts them back (which would also need an accelerator). A modular
    pipeline (no from_pipe: MiniMax H3) is its blocks made into a new one holding the weightless models alone."""
    weightless = {}
    for name, module in pipe.components.items():
        if not isinstance(module, torch.nn.Module):
            continue
        dtype = compute_dtype_of_model(module)  # fp8 storage: LoRA factors in the compute dtype
        with torch.device("meta"):
            copy = type(module)._from_config(module.config) if hasattr(module, "_from_config") else \
                type(module).from_config(module.config)
        weightless[name] = _weightless(copy, dtype)
        if name == "transformer_ref" and getattr(pipe, "transformer", None) is None:  # MiniMax H3's ref2va file
            # alone: diffusers reads a LoRA onto `transformer` (the same module names), on_partitions moves it
            with torch.device("meta"):
                twin = type(module).from_config(module.config)
            weightless["transformer"] = _weightless(twin, dtype)
    if not hasattr(type(pipe), "from_pipe"):
        skel = pipe.blocks.init_pipeline()
        skel.update_components(**weightless)
        return skel
    return type(pipe).from_pipe(pipe, **weightless, dtype=pipe.dtype)


class _Warnings(logging.Handler):
    """diffusers' warnings while it loads a LoRA: a partial load (keys the model lacks) is only a warning."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self) -> _Warnings:
        logger = logging.getLogger("diffusers")
        self.saved_level = logger.level
        logger.setLevel(min(logger.getEffectiveLevel(), logging.WARNING))  # seen even if diffusers is quieted
        logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logger = logging.getLogger("diffusers")
        logger.removeHandler(self)
        logger.setLevel(self.saved_level)


def resolve(skel: Any, path: str, family: str) -> Resolved:
    """The LoRA layers of the file at `path`, read by diffusers onto `skel`. Raises ModelError naming the file
    and the fix when the file is not a LoRA for this model (nothing of the live pipeline is touched)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    name = Path(path).name
    other = (f"Is '{name}' a LoRA for {family}? Pick a LoRA made for this model (or load the model it was made "
             f"for); a {family} LoRA in a layout diffusers cannot read needs converting to the diffusers format.")
    adapter = "comfyui_tpu_resolve"
    with _Warnings() as warnings:
        try:
            src = source(path, type(skel))
            converted = type(skel).lora_state_dict(src if isinstance(src, str) else dict(src), **_LOCAL)
            converted = converted[0] if isinstance(converted, tuple) else converted
            skel.load_lora_weights(src, adapter_name=adapter, low_cpu_mem_usage=True, **_LOCAL)
        except ModelError:
            raise
        except Exception as e:
            _unload(skel, adapter)
            text = str(e).strip().splitlines()[0][:300] if str(e).strip() else "no message"
            raise ModelError(f"lora_name: diffusers cannot apply '{name}' to this {family} model "
                             f"({type(e).__name__}: {text}). {other}") from None
    try:
        layers: Resolved = {}
        for component in skel._lora_loadable_modules:
            module = getattr(skel, component, None)
            if not isinstance(module, torch.nn.Module):
                continue
            for mod_name, mod in module.named_modules():
                if isinstance(mod, BaseTunerLayer) and adapter in getattr(mod, "lora_A", {}):
                    layers[(component, mod_name)] = _layer(mod, adapter, name)
    finally:
        _unload(skel, adapter)
    expected = sum(1 for k in converted if _DOWN_KEY.search(k))
    partial = [m for m in warnings.messages if "unexpected keys" in m or "Unsupported keys" in m]
    if not layers:
        raise ModelError(f"lora_name: no layer of this {family} model matches '{name}' ({len(converted)} tensors, "
                         f"none for this model's layers). {other}")
    if partial:
        raise ModelError(f"lora_name: diffusers could read only part of '{name}' for this {family} model "
                         f"({partial[0][:240]}…), so it was not applied. {other}")
    if len(layers) < expected:
        raise ModelError(f"lora_name: only {len(layers)} of the {expected} layers in '{name}' match this {family} "
                         f"model, so it was not applied. {other}")
    return layers


def _layer(mod: Any, adapter: str, name: str) -> Layer:
    base = mod.get_base_layer()
    if not isinstance(base, (torch.nn.Linear, torch.nn.Conv2d)) or getattr(mod, "fan_in_fan_out", False):
        raise ModelError(f"lora_name: '{name}' has a LoRA on a {type(base).__name__} layer, which ComfyUI-TPU "
                         "cannot apply (it applies LoRAs on linear and 2-D convolution layers).")
    if getattr(mod, "use_dora", {}).get(adapter, False):
        raise ModelError(f"lora_name: '{name}' is a DoRA, which ComfyUI-TPU cannot apply; use a plain LoRA.")
    up = mod.lora_B[adapter]
    bias = up.bias.detach().clone() if getattr(up, "bias", None) is not None else None
    return Layer(mod.lora_A[adapter].weight.detach().clone(), up.weight.detach().clone(),
                 float(mod.scaling[adapter]), isinstance(base, torch.nn.Conv2d), bias)


def _unload(skel: Any, adapter: str) -> None:
    """Takes the adapter and peft's wrappers out of the skeleton again (it is reused for the next file)."""
    try:
        skel.delete_adapters(adapter)
    except Exception:
        pass
    skel.unload_lora_weights()


# ---- applying: the live weights rewritten in place

def on_experts(layers: Resolved, experts: str) -> Resolved:
    """A LoRA on a model of two experts (Wan 2.2 A14B): diffusers reads a Wan LoRA onto `transformer`; its layers
    go to the experts chosen (spec.EXPERT_COMPONENTS). The experts have the same module names, so this is what
    load_lora_weights(..., load_into_transformer_2=True) reads for the low-noise one."""
    out = {key: layer for key, layer in layers.items() if key[0] != "transformer"}
    for component in EXPERT_COMPONENTS[experts]:
        out.update({(component, module): layer for (c, module), layer in layers.items() if c == "transformer"})
    return out


def on_partitions(layers: Resolved, pipe: Any) -> Resolved:
    """A LoRA on MiniMax H3, whose one folder holds two partitions of the same module names: diffusers reads it onto
    `transformer` (t2va, fl2va); it goes to `transformer_ref` (ref2va) too once that is loaded, as ComfyUI's Load
    LoRA goes onto whichever of its two model files is loaded (what load_lora_weights(...,
    load_into_transformer_ref=True) reads for it); only there when it is the one loaded (its ref2va file alone)."""
    if getattr(pipe, "transformer_ref", None) is None:
        return layers
    kept = layers if getattr(pipe, "transformer", None) is not None else {
        key: layer for key, layer in layers.items() if key[0] != "transformer"}
    return {**kept, **{("transformer_ref", m): layer for (c, m), layer in layers.items() if c == "transformer"}}


class Loras:
    """The LoRAs written into one loaded pipeline: resolved files (cached by path, size and mtime), the saved
    originals of every touched weight (host memory), and what is applied now."""

    def __init__(self, status: Callable[[str], None] = lambda text: None):
        self.status = status
        self.pipe: Any = None
        self._skeleton: Any = None
        self._cache: dict[tuple, Resolved] = {}
        self._originals: dict[tuple[str, str, str], torch.Tensor] = {}  # (component, module, param) -> CPU copy
        self._beside: set[tuple[str, str, str]] = set()  # quantized weights whose LoRA delta is kept beside them
        self._applied: tuple | None = ()  # (file key, strength, te strength, experts, on transformer_ref) per LoRA; None: unknown
        self._tp: tuple[Any, str, dict] | None = None  # (mesh, component, shard specs) of a sharded denoiser
        self.apply_s: float | None = None  # how long the last rewrite of the weights took

    def forget(self) -> None:
        """The pipeline is being unloaded: drop everything that refers to it."""
        self.__init__(self.status)

    def apply(self, pipe: Any, refs: tuple[LoraRef, ...], family: str, tp: tuple[Any, str] | None = None) -> None:
        """Makes `pipe`'s weights its originals plus `refs`, in order. Every file is resolved first, so a bad one
        raises before any weight changes. `tp` = (mesh, component) when that component is sharded."""
        if pipe is not self.pipe:
            self.forget()
            self.pipe = pipe
        pair = getattr(pipe, "transformer_2", None) is not None
        resolved = [(ref, (key, on_partitions(on_experts(layers, ref.experts) if pair else layers, pipe)))
                    for ref in refs for key, layers in [self._resolve(ref, family)]]
        # with the partitions they go to: a MiniMax H3 transformer_ref loaded later gets them then
        partitions = getattr(pipe, "transformer_ref", None) is not None
        want = tuple((key, ref.strength, ref.te_strength, ref.experts, partitions) for ref, (key, _) in resolved)
        if want == self._applied:
            return
        started = time.perf_counter()
        if tp is not None and self._tp is None:
            from diffusers.hooks.tensor_parallel import resolve_tp_shard_specs

            mesh, component = tp
            module = getattr(pipe, component)
            self._tp = (mesh, component, resolve_tp_shard_specs(module, module._tp_plan, mesh.size()))
        touched = {(c, m, p) for _, (_, layers) in resolved for (c, m), layer in layers.items()
                   for p in (("weight", "bias") if layer.bias is not None else ("weight",))}
        self._applied = None  # until the rewrite is complete: a failure midway is redone from the originals
        # Weights stored in fp8 (layerwise casting): summed in their compute dtype, then rounded to fp8 once
        sums: dict[tuple[str, str, str], torch.Tensor] = {}
        with torch.no_grad():
            for key in [k for k in self._originals if k not in touched]:  # LoRAs removed: originals back
                self._local(key).copy_(self._originals.pop(key))
            for key in [k for k in self._beside if k not in touched]:
                self._beside.discard(key)
                self._module(key).lora_delta = None
            for key in touched:
                if _quantized(self._module(key)) and key[2] == "weight":  # kept beside: worker/quantized.py
                    self._beside.add(key)
                    module = self._module(key)
                    dtype = getattr(getattr(module, "weight", None), "dtype", None) or self.pipe.dtype
                    sums[key] = torch.zeros(module.out_features, module.in_features, dtype=dtype)
                    continue
                target = self._local(key)
                if key not in self._originals:
                    self._originals[key] = target.detach().to("cpu", copy=True)
                if (compute := compute_dtype_of(self._module(key))) is not None:
                    sums[key] = self._originals[key].to(target.device, compute)
                else:
                    target.copy_(self._originals[key])
            for ref, (_, layers) in resolved:  # peft's order: one LoRA after the other, each rounded once
                for (component, module), layer in layers.items():
                    strength = ref.strength if component in DENOISERS else ref.te_strength
                    if strength == 0:
                        continue
                    key = (component, module, "weight")
                    weight = sums.get(key, self._local(key))
                    self._add(key, layer.delta(strength, weight.dtype, weight.device), sums)
                    if layer.bias is not None:
                        bias = (layer.bias.to(weight.device, torch.float32) * (layer.scale * strength))
                        self._add((component, module, "bias"), bias.to(weight.dtype), sums)
            for key, value in sums.items():
                if key in self._beside:
                    self._module(key).lora_delta = value
                else:
                    self._local(key).copy_(value)  # rounded to the storage dtype
        self._applied = want
        self.apply_s = time.perf_counter() - started
        gc_keys = {key for key, *_ in want}
        for key in list(self._cache)[: max(0, len(self._cache) - CACHE_SIZE)]:
            if key not in gc_keys:
                del self._cache[key]

    def _resolve(self, ref: LoraRef, family: str) -> tuple[tuple, Resolved]:
        try:
            st = os.stat(ref.path)
        except OSError:
            raise ModelError(f"lora_name: '{ref.name}' is gone from the loras folder; pick it again.") from None
        key = (ref.path, st.st_size, st.st_mtime_ns)
        if key not in self._cache:
            self.status(f"reading LoRA {ref.name}")
            if self._skeleton is None:
                self._skeleton = skeleton(self.pipe)
            try:
                self._cache[key] = resolve(self._skeleton, ref.path, family)
            except BaseException:
                self._skeleton = None  # a failed load may leave it half-changed: the next file gets a fresh one
                raise
        else:
            self._cache[key] = self._cache.pop(key)  # most recently used last
        return key, self._cache[key]

    def _module(self, key: tuple[str, str, str]) -> torch.nn.Module:
        component, module, _ = key
        return getattr(self.pipe, component).get_submodule(module)

    def _param(self, key: tuple[str, str, str]) -> torch.Tensor:
        return getattr(self._module(key), key[2])

    def _local(self, key: tuple[str, str, str]) -> torch.Tensor:
        """The tensor this rank holds for a parameter (its shard under tensor parallelism)."""
        p = self._param(key)
        return p.to_local() if hasattr(p, "to_local") else p

    def _add(self, key: tuple[str, str, str], delta: torch.Tensor, sums: dict) -> None:
        target = sums[key] if key in sums else self._local(key)
        if self._tp is not None and key[0] == self._tp[1]:
            from diffusers.hooks.tensor_parallel import _local_shard

            mesh, _, specs = self._tp
            spec = specs.get(f"{key[1]}.{key[2]}")
            if spec is not None and spec.dim is not None:
                delta = _local_shard(delta, spec.dim, spec.block_sizes, mesh)
        target.add_(delta)

    def info(self) -> list[dict]:
        return [{"file": Path(path).name, "strength": s, "te_strength": t, "experts": e}
                for (path, _, _), s, t, e, _ in self._applied or ()]


