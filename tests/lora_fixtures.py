"""Tiny LoRA files made at test time: peft makes one random LoRA per tiny model (denoiser, and the CLIP text
encoders where the family has text-encoder LoRAs), and it is written in the formats people download.

- "diffusers": `Pipeline.save_lora_weights` with peft's adapter metadata (the diffusers/PEFT format).
- "kohya": sd-scripts files. SDXL, Qwen-Image and Z-Image through diffusers' own `convert_state_dict_to_kohya`; FLUX.1
  with sd-scripts' native (BFL) names, fused qkv and `.alpha` keys.
- "xlabs": XLabs' FLUX.1 trainer: 'double_blocks.N.processor.qkv_lora1.down/up' (one down for q, k and v),
  projections, no alpha and no text encoder; its own random factors (`_xlabs`).
- "lightricks": LTX-2's own trainer (the distilled LoRA of the LTX-2.3 templates): native names under
  'diffusion_model.', peft's 'lora_A/lora_B' (alpha folded in).
- "comfy": what ComfyUI's LoraSave writes: 'diffusion_model.<native name>.lora_up/lora_down' (fp16, alpha folded
  in: the layers match to fp16 precision only), 'text_encoders.clip_l/clip_g.transformer.…', and zero `.diff_b`
  entries for biases. Native names come from
  ComfyUI's own key maps (`comfy.utils.flux_to_diffusers`, `unet_to_diffusers`, `z_image_to_diffusers`); FLUX.2 has
  none in ComfyUI
  0.3.75, so its BFL names are the inverse of diffusers' own FLUX.2 converter tables.

Each file comes with the layers it should give: {(component, module): full delta at strength 1}.
rank 4, alpha 8: alpha / rank = 2, so a loader that ignores alpha is caught.

Tiny FLUX.1 files in native names leave out single-block linear1: diffusers' converter hard-codes its split at the
real model's width (3072), so it cannot read a tiny one (a limit of the fixture, not of real files).
"""

from __future__ import annotations

import copy
import os
import re
import sys
from pathlib import Path

import torch

RANK, ALPHA = 4, 8
SCALE = ALPHA / RANK
CLIP_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2"]
TEXT_LORA = {"tiny-flux": ("text_encoder",), "tiny-sd3": ("text_encoder", "text_encoder_2"),
             "tiny-sdxl": ("text_encoder", "text_encoder_2")}
FORMATS = {"tiny-flux": ("diffusers", "kohya", "comfy", "xlabs"), "tiny-flux2": ("diffusers", "comfy"),
           "tiny-sd3": ("diffusers",), "tiny-sdxl": ("diffusers", "kohya", "comfy"),
           "tiny-qwenimage": ("diffusers", "kohya", "comfy"), "tiny-zimage": ("diffusers", "kohya", "comfy"),
           "tiny-qwenimage21": ("diffusers",), "tiny-krea2": ("diffusers",), "tiny-ideogram4": ("diffusers",),
           "tiny-ltx2": ("diffusers", "comfy", "lightricks")}
_SINGLE_LINEAR1 = re.compile(r"^single_transformer_blocks\.\d+\.(attn\.to_[qkv]|proj_mlp)$")
# What trainers target (sd-scripts: the attention blocks' linears of SDXL); every linear elsewhere.
_SKIP = {"tiny-sdxl": re.compile(r"^(?!.*attentions\.\d+\.(proj_in|proj_out|transformer_blocks))")}

Layers = dict[tuple[str, str], torch.Tensor]


def load(models: Path, name: str, dtype: torch.dtype = torch.float32, cls=None):
    """A tiny pipeline in this process, as plain diffusers loads it (inference only)."""
    from diffusers import DiffusionPipeline

    pipe = (cls or DiffusionPipeline).from_pretrained(str(models / name), dtype=dtype, local_files_only=True,
                                                      use_safetensors=True)
    pipe.set_progress_bar_config(disable=True)
    for module in pipe.components.values():
        if isinstance(module, torch.nn.Module):
            module.requires_grad_(False)
    return pipe


def fuse(pipe, loras, components=None) -> None:
    """Fuses `loras` ((path, strength), ...) into `pipe` as a plain diffusers script does: load_lora_weights,
    set_adapters at the strengths, fuse_lora (into `components`; default: every LoRA-loadable module)."""
    names = [f"l{i}" for i in range(len(loras))]
    for name, (path, _) in zip(names, loras, strict=True):
        pipe.load_lora_weights(path, adapter_name=name)
    if loras:
        pipe.set_adapters(names, [s for _, s in loras])
        pipe.fuse_lora(components=components or pipe._lora_loadable_modules, adapter_names=names)


def denoiser_name(pipe) -> str:
    return "unet" if getattr(pipe, "unet", None) is not None else "transformer"


def _linears(module, skip=None) -> list[str]:
    return [n for n, m in module.named_modules() if isinstance(m, torch.nn.Linear) and not (skip and skip.match(n))]


def peft_lora(module, targets: list[str], seed: int):
    """A random LoRA made by peft on a copy of `module`: (peft state dict, LoraConfig). lora_B is not zero."""
    from peft import LoraConfig, get_peft_model_state_dict, inject_adapter_in_model
    from peft.tuners.tuners_utils import BaseTunerLayer

    work = copy.deepcopy(module)
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=targets, init_lora_weights=False)
    inject_adapter_in_model(config, work, adapter_name="default")
    g = torch.Generator().manual_seed(seed)
    for layer in work.modules():
        if isinstance(layer, BaseTunerLayer):
            for part in ("lora_A", "lora_B"):
                weight = getattr(layer, part)["default"].weight
                weight.data.copy_(torch.randn(weight.shape, generator=g) * 0.3)
    state = get_peft_model_state_dict(work, adapter_name="default")
    return {k: v.detach().clone().contiguous() for k, v in state.items()}, config


def _deltas(state: dict, component: str, scale: float = SCALE) -> Layers:
    return {(component, k[: -len(".lora_A.weight")]): scale * (state[k.replace("lora_A", "lora_B")] @ a)
            for k, a in state.items() if k.endswith(".lora_A.weight")}


def make(models: Path, name: str, fmt: str, out_dir: Path, seed: int = 0, pipe=None) -> tuple[Path, Layers]:
    """Writes `name`'s LoRA in format `fmt` to out_dir/<name>-<fmt>.safetensors; returns it and its layers."""
    from safetensors.torch import save_file

    pipe = pipe or load(models, name)
    den_name = denoiser_name(pipe)
    den = getattr(pipe, den_name)
    skip = _SINGLE_LINEAR1 if name == "tiny-flux" and fmt != "diffusers" else _SKIP.get(name)
    den_sd, den_cfg = peft_lora(den, _linears(den, skip), seed + 1)
    te = {c: peft_lora(getattr(pipe, c), CLIP_TARGETS, seed + 10 + i) for i, c in enumerate(TEXT_LORA.get(name, ()))}
    layers = {**_deltas(den_sd, den_name), **{k: v for c, (sd, _) in te.items() for k, v in _deltas(sd, c).items()}}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}-{fmt}.safetensors"
    if fmt == "xlabs":
        return _xlabs(den, den_name, path, seed)
    if fmt == "diffusers":
        kw = {f"{den_name}_lora_layers": den_sd, f"{den_name}_lora_adapter_metadata": den_cfg.to_dict()}
        for comp, (sd, cfg) in te.items():
            kw.update({f"{comp}_lora_layers": sd, f"{comp}_lora_adapter_metadata": cfg.to_dict()})
        tmp = out_dir / f".{path.stem}"
        type(pipe).save_lora_weights(str(tmp), **kw)
        os.replace(tmp / "pytorch_lora_weights.safetensors", path)
        tmp.rmdir()
        return path, layers
    if fmt == "kohya" and name != "tiny-flux":
        from diffusers.utils import convert_state_dict_to_kohya

        peft_all = {f"unet.{k}": v for k, v in den_sd.items()}  # the converter knows 'unet.' and 'text_encoder'
        for comp, (sd, _) in te.items():
            peft_all.update({f"{comp}.{_text_model(k)}": v for k, v in sd.items()})
        kohya = convert_state_dict_to_kohya(peft_all)  # writes alpha = rank: set the real one
        save_file({k: torch.tensor(float(ALPHA)) if k.endswith(".alpha") else v for k, v in kohya.items()}, str(path))
        return path, layers
    native = _native_names(name, pipe)
    pairs = _native_pairs(den_sd, native)
    out = {}
    if fmt == "kohya":  # FLUX.1 sd-scripts: native names with underscores, raw factors and alpha
        for nat, (down, up) in pairs.items():
            key = "lora_unet_" + nat.replace(".", "_")
            out.update({f"{key}.lora_down.weight": down, f"{key}.lora_up.weight": up,
                        f"{key}.alpha": torch.tensor(float(ALPHA * down.shape[0] // RANK))})
        for comp, (sd, _) in te.items():
            for mod, (down, up) in _pairs(sd).items():
                key = {"text_encoder": "lora_te1_", "text_encoder_2": "lora_te2_"}[comp] + _text_model(mod).replace(".", "_")
                out.update({f"{key}.lora_down.weight": down, f"{key}.lora_up.weight": up,
                            f"{key}.alpha": torch.tensor(float(ALPHA))})
    elif fmt == "lightricks":  # LTX-2's trainer: native names under diffusion_model., peft's lora_A / lora_B
        for nat, (down, up) in pairs.items():
            out.update({f"diffusion_model.{nat}.lora_A.weight": down,
                        f"diffusion_model.{nat}.lora_B.weight": up * SCALE})
    else:  # ComfyUI LoraSave: alpha folded into up, fp16, zero .diff_b for the biases of the touched layers
        for nat, (down, up) in pairs.items():
            out.update({f"diffusion_model.{nat}.lora_up.weight": (up * SCALE).half(),
                        f"diffusion_model.{nat}.lora_down.weight": down.half(),
                        f"diffusion_model.{nat}.diff_b": torch.zeros(up.shape[0], dtype=torch.float16)})
        for comp, (sd, _) in te.items():
            clip = {"text_encoder": "clip_l", "text_encoder_2": "clip_g"}[comp]
            for mod, (down, up) in _pairs(sd).items():
                base = f"text_encoders.{clip}.transformer.{_text_model(mod)}"
                out.update({f"{base}.lora_up.weight": (up * SCALE).half(), f"{base}.lora_down.weight": down.half()})
    save_file(out, str(path))
    return path, layers


def _text_model(key: str) -> str:
    """LoRA files name CLIP modules 'text_model.…' (transformers 5's CLIPTextModel has no text_model level)."""
    return key if key.startswith("text_model.") else "text_model." + key


def components(name: str, fmt: str, denoiser: str) -> set[str]:
    """The pipeline components a LoRA file of this format carries layers for."""
    return {denoiser} if fmt == "xlabs" else {denoiser, *TEXT_LORA.get(name, ())}


def _xlabs(den, den_name: str, path: Path, seed: int) -> tuple[Path, Layers]:
    """An XLabs FLUX.1 LoRA: a block's q, k and v share one down (the up is split by rows), projections have
    their own; no alpha (scale 1). diffusers reads these with its own XLabs converter."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed + 100)
    out: dict[str, torch.Tensor] = {}
    layers: Layers = {}

    def put(key: str, modules: list[str]) -> None:
        linears = [den.get_submodule(m) for m in modules]
        down = torch.randn(RANK, linears[0].in_features, generator=gen) * 0.1
        ups = [torch.randn(lin.out_features, RANK, generator=gen) * 0.1 for lin in linears]
        out[f"{key}.down.weight"], out[f"{key}.up.weight"] = down, torch.cat(ups)
        layers.update({(den_name, m): up @ down for m, up in zip(modules, ups, strict=True)})

    for i in range(len(den.transformer_blocks)):
        attn = f"transformer_blocks.{i}.attn."
        put(f"double_blocks.{i}.processor.qkv_lora1", [attn + "to_q", attn + "to_k", attn + "to_v"])
        put(f"double_blocks.{i}.processor.proj_lora1", [attn + "to_out.0"])
        put(f"double_blocks.{i}.processor.qkv_lora2", [attn + "add_q_proj", attn + "add_k_proj", attn + "add_v_proj"])
        put(f"double_blocks.{i}.processor.proj_lora2", [attn + "to_add_out"])
    for i in range(len(den.single_transformer_blocks)):
        block = f"single_transformer_blocks.{i}."
        put(f"single_blocks.{i}.processor.qkv_lora", [block + "attn.to_q", block + "attn.to_k", block + "attn.to_v"])
        put(f"single_blocks.{i}.processor.proj_lora", [block + "proj_out"])
    save_file(out, str(path))
    return path, layers


def _pairs(state: dict) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {k[: -len(".lora_A.weight")]: (a, state[k.replace("lora_A", "lora_B")])
            for k, a in state.items() if k.endswith(".lora_A.weight")}


def _native_pairs(state: dict, native: dict) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per-diffusers-module LoRAs grouped into native (possibly fused) modules: a fused qkv gets
    down = cat(A_q, A_k, A_v) and a block-diagonal up (exact; diffusers splits such ups again)."""
    groups: dict[str, list] = {}
    for mod, (a, b) in _pairs(state).items():
        if mod in native:
            nat, rows, transform = native[mod]
            groups.setdefault(nat, []).append((rows, transform, a, b))
    out = {}
    for nat, members in groups.items():
        if len(members) == 1 and members[0][0] is None:
            rows, transform, a, b = members[0]
            out[nat] = (a.clone(), transform(b) if transform else b.clone())
            continue
        total = max(start + size for start, size in (r for r, *_ in members))
        up = torch.zeros(total, sum(a.shape[0] for _, _, a, _ in members))
        col = 0
        for (start, size), _, a, b in members:
            up[start:start + size, col:col + a.shape[0]] = b
            col += a.shape[0]
        out[nat] = (torch.cat([a for *_, a, _ in members]), up)
    return out


def _native_names(name: str, pipe) -> dict[str, tuple[str, tuple[int, int] | None, object]]:
    """diffusers module → (native module, (first row, rows) of a fused weight or None, transform of up or None)."""
    den = getattr(pipe, denoiser_name(pipe))
    if name == "tiny-qwenimage":
        return {m: (m, None, None) for m in _linears(den)}
    if name == "tiny-flux2":
        return _flux2_native_names(den.config)
    if name == "tiny-ltx2":
        return _ltx2_native_names(den)
    comfy_utils = _comfy_utils()
    c = den.config
    if name == "tiny-flux":
        keymap = comfy_utils.flux_to_diffusers({"depth": c.num_layers, "depth_single_blocks": c.num_single_layers,
                                                "hidden_size": c.num_attention_heads * c.attention_head_dim})
    elif name == "tiny-zimage":  # fused qkv, 'out', 'final_layer.', 'x_embedder.'
        keymap = comfy_utils.z_image_to_diffusers({"n_layers": c.n_layers, "dim": c.dim,
                                                   "n_refiner_layers": c.n_refiner_layers})
    else:  # tiny-sdxl: ComfyUI's UNet config of this diffusers UNet
        levels = len(c.block_out_channels)
        depth = [layers if "CrossAttn" in kind else 0 for kind, layers in
                 zip(c.down_block_types, c.transformer_layers_per_block, strict=True)]
        keymap = comfy_utils.unet_to_diffusers({
            "num_res_blocks": [c.layers_per_block] * levels,
            "channel_mult": [ch // c.block_out_channels[0] for ch in c.block_out_channels],
            "transformer_depth": depth,
            "transformer_depth_output": [d for d in depth for _ in range(c.layers_per_block + 1)],
            "transformer_depth_middle": c.transformer_layers_per_block[-1]})
    out = {}
    for key, value in keymap.items():
        if not key.endswith(".weight"):
            continue
        mod = key[: -len(".weight")]
        if isinstance(value, str):
            out[mod] = (value[: -len(".weight")], None, None)
        elif value[1] is None:
            out[mod] = (value[0][: -len(".weight")], None, value[2])
        else:
            _, start, size = value[1]
            out[mod] = (value[0][: -len(".weight")], (int(start), int(size)), None)
    return out


def _flux2_native_names(c) -> dict:
    from diffusers.loaders.lora_conversion_utils import swap_scale_shift

    h = c.num_attention_heads * c.attention_head_dim
    out = {}
    for i in range(c.num_layers):
        for j, p in enumerate(("to_q", "to_k", "to_v")):
            out[f"transformer_blocks.{i}.attn.{p}"] = (f"double_blocks.{i}.img_attn.qkv", (j * h, h), None)
        for j, p in enumerate(("add_q_proj", "add_k_proj", "add_v_proj")):
            out[f"transformer_blocks.{i}.attn.{p}"] = (f"double_blocks.{i}.txt_attn.qkv", (j * h, h), None)
        for a, b in (("attn.to_out.0", "img_attn.proj"), ("attn.to_add_out", "txt_attn.proj"),
                     ("ff.linear_in", "img_mlp.0"), ("ff.linear_out", "img_mlp.2"),
                     ("ff_context.linear_in", "txt_mlp.0"), ("ff_context.linear_out", "txt_mlp.2")):
            out[f"transformer_blocks.{i}.{a}"] = (f"double_blocks.{i}.{b}", None, None)
    for i in range(c.num_single_layers):
        out[f"single_transformer_blocks.{i}.attn.to_qkv_mlp_proj"] = (f"single_blocks.{i}.linear1", None, None)
        out[f"single_transformer_blocks.{i}.attn.to_out"] = (f"single_blocks.{i}.linear2", None, None)
    for a, b in (("x_embedder", "img_in"), ("context_embedder", "txt_in"),
                 ("time_guidance_embed.timestep_embedder.linear_1", "time_in.in_layer"),
                 ("time_guidance_embed.timestep_embedder.linear_2", "time_in.out_layer"),
                 ("proj_out", "final_layer.linear"), ("single_stream_modulation.linear", "single_stream_modulation.lin"),
                 ("double_stream_modulation_img.linear", "double_stream_modulation_img.lin"),
                 ("double_stream_modulation_txt.linear", "double_stream_modulation_txt.lin")):
        out[a] = (b, None, None)
    out["norm_out.linear"] = ("final_layer.adaLN_modulation.1", None, swap_scale_shift)  # BFL: (shift, scale)
    return out


# LTX-2's native (ComfyUI, Lightricks) module names against diffusers': the inverse of diffusers' own LoRA converter
# (_convert_non_diffusers_ltx2_lora_to_diffusers), LTX-2.3's prompt AdaLN included
_LTX2_NATIVE = (("audio_proj_in", "audio_patchify_proj"), ("proj_in", "patchify_proj"),
                ("av_cross_attn_video_scale_shift", "av_ca_video_scale_shift_adaln_single"),
                ("av_cross_attn_video_a2v_gate", "av_ca_a2v_gate_adaln_single"),
                ("av_cross_attn_audio_scale_shift", "av_ca_audio_scale_shift_adaln_single"),
                ("av_cross_attn_audio_v2a_gate", "av_ca_v2a_gate_adaln_single"),
                ("audio_prompt_adaln", "audio_prompt_adaln_single"), ("prompt_adaln", "prompt_adaln_single"))


def _ltx2_native_names(den) -> dict:
    """Each linear of tiny-ltx2's transformer under its native name; diffusers' converter gives it back (checked)."""
    from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_ltx2_lora_to_diffusers

    out = {}
    for mod in _linears(den):
        nat = mod
        for ours, theirs in _LTX2_NATIVE:
            if nat.startswith(ours + ".") or f".{ours}." in nat:
                nat = nat.replace(ours, theirs, 1)
                break
        if nat.startswith(("time_embed.", "audio_time_embed.")):
            nat = nat.replace("time_embed.", "adaln_single.", 1)
        back = _convert_non_diffusers_ltx2_lora_to_diffusers({f"diffusion_model.{nat}.w": None})
        assert list(back) == [f"transformer.{mod}.w"], (mod, nat, list(back))
        out[mod] = (nat, None, None)
    return out


def _comfy_utils():
    comfyui = os.environ.get("COMFYUI_DIR")
    if not comfyui:
        import pytest

        pytest.skip("COMFYUI_DIR is not set: ComfyUI's key maps write the ComfyUI-format fixtures")
    if comfyui not in sys.path:
        sys.path.append(comfyui)
    import comfy.utils

    return comfy.utils


def bad_files(out_dir: Path) -> dict[str, Path]:
    """Files that are not usable LoRAs: a pickle, no LoRA keys, keys for no layer of the model, a corrupt file."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"pickle": out_dir / "lora.ckpt", "no_lora_keys": out_dir / "not-a-lora.safetensors",
             "no_matching_keys": out_dir / "no-matching-layer.safetensors", "corrupt": out_dir / "cut-short.safetensors"}
    torch.save({"transformer.x.lora_A.weight": torch.zeros(4, 4)}, files["pickle"])
    save_file({"model.diffusion_model.weight": torch.zeros(2, 2)}, str(files["no_lora_keys"]))
    save_file({"transformer.no_such_layer.lora_A.weight": torch.zeros(4, 32),
               "transformer.no_such_layer.lora_B.weight": torch.zeros(32, 4)}, str(files["no_matching_keys"]))
    files["corrupt"].write_bytes(files["no_matching_keys"].read_bytes()[:100])
    return files
