"""Artists' own model files, as ComfyUI keeps them: checkpoints, diffusion models, text encoders and VAEs.

Lists the files of ComfyUI's folders that fit each role, recognises what a file holds from its safetensors
header alone (key names and shapes; no tensor is read), checks that the chosen files make one pipeline of a
supported family, and describes it (`spec.FileSource`): the pack's configs of the published model
(backend/configs) with the sizes read from the files' tensors laid over them, so that trimmed or variant
files load, and every file with how the worker must read it.

Controller side: reads file headers and JSON, never imports torch (ComfyUI's own key maps are imported on
demand, inside ComfyUI's process, only for the FLUX.1 widths diffusers' converter cannot read).
"""

from __future__ import annotations

import importlib.util
import json
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from ..protocol.errors import ModelError
from ..protocol.messages import pickle_allowed
from ..protocol.spec import CONFIGS_DIR, FileComponent, FileSource, read_json
from .models import ALLOW_ABSOLUTE_ENV

# ComfyUI's model folders per role (folder_paths names; "unet" and "clip" are its legacy second folders)
ROLE_FOLDERS = {"checkpoint": "checkpoints", "diffusion_model": "diffusion_models",
                "text_encoder": "text_encoders", "vae": "vae"}
NONE = "(none)"  # the dropdown entry for "no file"
SAFETENSORS = (".safetensors", ".sft")
GGUF = (".gguf",)
PICKLE = (".ckpt", ".pt", ".pth", ".bin", ".pkl")
LISTED = SAFETENSORS + GGUF + PICKLE
MAX_HEADER = 256 * 2**20  # a safetensors header larger than this is not one
DENOISER_PREFIXES = ("model.diffusion_model.", "diffusion_model.", "")
VAE_PREFIXES = ("first_stage_model.", "vae.", "")
FLUX1_CONVERTER_WIDTH = 3072  # diffusers' FLUX.1 single-file converter hard-codes the published width
ZIMAGE_DIFFUSERS_IN = "all_x_embedder.2-1.weight"  # a Z-Image file with diffusers' keys (ComfyUI: x_embedder.weight)

# what artists call the files each family needs (for messages)
WANTED = {
    "clip-l": "CLIP-L (clip_l.safetensors)",
    "clip-g": "CLIP-G (clip_g.safetensors)",
    "t5": "T5-XXL (t5xxl_fp16.safetensors or t5xxl_fp8_e4m3fn.safetensors)",
    "qwen25vl": "Qwen2.5-VL (qwen_2.5_vl_7b.safetensors)",
    "qwen3": "Qwen3 (qwen_3_4b.safetensors)",
    "mistral": "Mistral Small 3.1 (mistral_3_small_flux2_bf16.safetensors)",
}
FAMILY_NAMES = {"flux1": "FLUX.1", "flux2": "FLUX.2", "sd3": "SD3/SD3.5", "sdxl": "SDXL", "qwenimage": "Qwen-Image",
                "zimage": "Z-Image"}
VAE_HINT = {"flux1": "FLUX.1's ae.safetensors", "flux2": "FLUX.2's flux2-vae.safetensors",
            "sd3": "SD3.5's VAE (or a checkpoint that holds one)", "sdxl": "sdxl_vae.safetensors",
            "qwenimage": "qwen_image_vae.safetensors", "zimage": "FLUX.1's ae.safetensors"}


# ---- reading headers


@dataclass(frozen=True)
class Header:
    """What a weights file holds, from its header: tensor names, shapes and dtypes, and its metadata."""

    path: Path
    format: str  # "safetensors" | "gguf"
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]
    metadata: dict
    size: int

    def strip(self, prefix: str) -> dict[str, tuple[int, ...]]:
        """Shapes of the keys under `prefix`, with the prefix removed."""
        n = len(prefix)
        return {k[n:]: v for k, v in self.shapes.items() if k.startswith(prefix)}


def _problem(path: Path, role: str, what: str) -> ModelError:
    return ModelError(f"{role}: '{path.name}' {what}")


def read_header(path: Path, role: str = "model") -> Header:
    """The header of a safetensors or GGUF file; a pickle file, a truncated or a foreign file raises a
    ModelError that names the file and the fix."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as e:
        raise _problem(path, role, f"cannot be read ({e.strerror}).") from None
    return _read_header(str(path), stat.st_mtime_ns, stat.st_size, role)


@lru_cache(maxsize=1024)
def _read_header(path_text: str, mtime_ns: int, size: int, role: str) -> Header:
    path = Path(path_text)
    suffix = path.suffix.lower()
    if suffix in PICKLE:
        allowed = " (COMFYUI_TPU_ALLOW_PICKLE does not change this: files are read by their safetensors header)" \
            if pickle_allowed() else ""
        raise _problem(path, role, f"is a pickle file ({suffix}), which can run arbitrary code when loaded and "
                       f"which ComfyUI-TPU does not read{allowed}. Use the .safetensors version of this model "
                       "(most models are published as .safetensors), or convert it.")
    if suffix in GGUF:
        return _read_gguf(path, size, role)
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise _problem(path, role, "is empty or truncated: the download did not finish. Download it again.")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, MAX_HEADER):
                raise _problem(path, role, "is not a safetensors file (or is truncated): its first bytes do not "
                               "describe a header. Download it again, or use a .safetensors file.")
            raw = f.read(n)
    except OSError as e:
        raise _problem(path, role, f"cannot be read ({e.strerror}).") from None
    try:
        table = json.loads(raw)
        metadata = table.pop("__metadata__", None) or {}
        shapes = {key: tuple(int(d) for d in entry["shape"]) for key, entry in table.items()}
        dtypes = {key: str(entry["dtype"]) for key, entry in table.items()}
        end = max((int(entry["data_offsets"][1]) for entry in table.values()), default=0)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError):
        raise _problem(path, role, "is not a safetensors file (or is truncated): its header is not readable. "
                       "Download it again.") from None
    if 8 + n + end > size:
        raise _problem(path, role, f"is truncated: it has {size:,} bytes but its header describes {8 + n + end:,}. "
                       "The download did not finish: download it again.")
    return Header(path, "safetensors", shapes, dtypes, metadata, size)


def _read_gguf(path: Path, size: int, role: str) -> Header:
    try:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        shapes = {t.name: tuple(int(d) for d in reversed(t.shape.tolist())) for t in reader.tensors}
        dtypes = {t.name: t.tensor_type.name for t in reader.tensors}
    except ImportError:
        raise _problem(path, role, "is a GGUF file, and the gguf package is not installed: pip install gguf "
                       "(ComfyUI-TPU's requirements list it).") from None
    except Exception as e:  # the reader raises ValueError/KeyError/IndexError on truncated or foreign files
        raise _problem(path, role, f"could not be read as a GGUF file ({type(e).__name__}: {e}); it may be "
                       "truncated. Download it again.") from None
    return Header(path, "gguf", shapes, dtypes, {}, size)


# ---- recognising what a file holds


@dataclass(frozen=True)
class Part:
    """One model inside a file: a denoiser, a VAE or a text encoder."""

    role: str  # "diffusion_model" | "vae" | "text_encoder"
    kind: str  # denoiser: family key; vae: "vae-ldm" | "vae-flux2" | "vae-wan"; text encoder: WANTED key
    prefix: str
    shapes: dict[str, tuple[int, ...]] = field(repr=False)

    @property
    def width(self) -> int:
        """A text encoder's hidden size; a VAE's latent channels; a denoiser's input channels."""
        return _width(self)


def _count(shapes: Mapping[str, tuple], prefix: str) -> int:
    found = {k[len(prefix):].split(".", 1)[0] for k in shapes if k.startswith(prefix)}
    return len([i for i in found if i.isdigit()])


def _denoiser(header: Header) -> Part | None:
    for prefix in DENOISER_PREFIXES:
        s = header.strip(prefix)
        kind = None
        if "double_blocks.0.img_attn.qkv.weight" in s and "img_in.weight" in s:
            kind = "flux1" if "vector_in.in_layer.weight" in s else "flux2"
        elif "joint_blocks.0.x_block.attn.qkv.weight" in s and "x_embedder.proj.weight" in s:
            kind = "sd3"
        elif "input_blocks.0.0.weight" in s and "label_emb.0.0.weight" in s and "middle_block.1.proj_in.weight" in s:
            kind = "sdxl"
        elif "transformer_blocks.0.img_mod.1.weight" in s and "txt_norm.weight" in s and "img_in.weight" in s:
            kind = "qwenimage"
        elif "cap_embedder.1.weight" in s and "layers.0.adaLN_modulation.0.weight" in s and (
                "x_embedder.weight" in s or ZIMAGE_DIFFUSERS_IN in s):  # ComfyUI's layout, or diffusers' own keys
            kind = "zimage"
        if kind:
            return Part("diffusion_model", kind, prefix, s)
    return None


def _vae(header: Header) -> Part | None:
    for prefix in VAE_PREFIXES:
        s = header.strip(prefix)
        if "encoder.conv_in.weight" in s and "decoder.conv_out.weight" in s and "encoder.down.0.block.0.conv1.weight" in s:
            return Part("vae", "vae-flux2" if "bn.running_mean" in s else "vae-ldm", prefix, s)
        if "encoder.conv1.weight" in s and "decoder.head.2.weight" in s and "conv2.weight" in s:
            return Part("vae", "vae-wan", prefix, s)
    return None


# text encoders inside all-in-one checkpoints: SD3 and FLUX.1 as ComfyUI saves them, SDXL as Stability does
CHECKPOINT_TEXT_PREFIXES = {
    "text_encoders.clip_l.transformer.": "clip-l", "text_encoders.clip_g.transformer.": "clip-g",
    "text_encoders.t5xxl.transformer.": "t5", "conditioner.embedders.0.transformer.": "clip-l",
    "conditioner.embedders.1.model.": "clip-g",  # OpenCLIP layout (diffusers converts it)
}


def _text_encoder(shapes: Mapping[str, tuple], prefix: str = "") -> Part | None:
    s = {k[len(prefix):]: v for k, v in shapes.items() if k.startswith(prefix)}
    if any(k.endswith("embeddings.token_embedding.weight") for k in s) and (
            "text_model.encoder.layers.0.self_attn.q_proj.weight" in s or "encoder.layers.0.self_attn.q_proj.weight" in s):
        return Part("text_encoder", "clip", prefix, s)
    if "transformer.resblocks.0.attn.in_proj_weight" in s and "token_embedding.weight" in s:
        return Part("text_encoder", "clip-openclip", prefix, s)
    if "encoder.block.0.layer.0.SelfAttention.q.weight" in s:
        if "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight" in s:
            return Part("text_encoder", "umt5", prefix, s)  # Wan's UMT5: not a text encoder we use
        return Part("text_encoder", "t5", prefix, s)
    if "model.layers.0.self_attn.q_proj.weight" in s and "model.embed_tokens.weight" in s:
        if "model.layers.0.self_attn.q_norm.weight" in s:
            return Part("text_encoder", "qwen3", prefix, s)
        if "model.layers.0.self_attn.q_proj.bias" in s:
            return Part("text_encoder", "qwen25vl" if any(k.startswith("visual.") for k in s) else "qwen25",
                        prefix, s)
        return Part("text_encoder", "mistral", prefix, s)
    return None


def _width(part: Part) -> int:
    s = part.shapes
    if part.role == "text_encoder":
        for key in ("text_model.embeddings.token_embedding.weight", "embeddings.token_embedding.weight",
                    "token_embedding.weight", "shared.weight", "encoder.embed_tokens.weight",
                    "model.embed_tokens.weight"):
            if key in s:
                return s[key][1]
        return 0
    if part.role == "vae":
        if part.kind == "vae-wan":
            return s["conv2.weight"][0]
        return s["decoder.conv_in.weight"][1]
    key = {"flux1": "img_in.weight", "flux2": "img_in.weight", "qwenimage": "img_in.weight",
           "sd3": "x_embedder.proj.weight", "sdxl": "input_blocks.0.0.weight",
           "zimage": ZIMAGE_DIFFUSERS_IN if ZIMAGE_DIFFUSERS_IN in s else "x_embedder.weight"}[part.kind]
    return s[key][1]


@dataclass(frozen=True)
class Contents:
    """Everything a file holds that the pack could use."""

    header: Header
    denoiser: Part | None = None
    vae: Part | None = None
    text_encoders: tuple[Part, ...] = ()

    def fits(self, role: str) -> bool:
        if role in ("checkpoint", "diffusion_model"):
            return self.denoiser is not None
        if role == "vae":
            return self.vae is not None
        return any(p.kind in WANTED or p.kind == "clip" for p in self.text_encoders) and self.denoiser is None


def contents(header: Header) -> Contents:
    denoiser = _denoiser(header)
    vae = _vae(header)
    texts: list[Part] = []
    if denoiser is not None or vae is not None:  # a checkpoint: text encoders under known prefixes
        for prefix, kind in CHECKPOINT_TEXT_PREFIXES.items():
            part = _text_encoder(header.shapes, prefix)
            if part is not None:
                texts.append(Part("text_encoder", kind, prefix, part.shapes))
    else:
        part = _text_encoder(header.shapes)
        if part is not None:
            texts.append(part)
    return Contents(header, denoiser, vae, tuple(texts))


def file_contents(path: Path, role: str) -> Contents:
    return contents(read_header(path, role))


# ---- listing ComfyUI's folders


def _walk(root: Path) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.lower().endswith(LISTED) and not name.startswith("."):
                yield Path(dirpath) / name


def list_files(roots: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """For each role, the files of its folders (names relative to the folder, as ComfyUI shows them) that fit
    it: what the pack recognises for that role, plus files it cannot read as safetensors (pickle, truncated,
    GGUF text encoders), so that choosing one explains what is wrong instead of the file being missing."""
    found: dict[str, list[str]] = {}
    for role in ROLE_FOLDERS:
        names: set[str] = set()
        for root in roots.get(role, ()):
            base = Path(root)
            if not base.is_dir():
                continue
            for path in _walk(base):
                try:
                    fits = file_contents(path, role).fits(role)
                except ModelError:
                    fits = True  # listed: choosing it says what is wrong with it
                if fits:
                    names.add(path.relative_to(base).as_posix())
        found[role] = sorted(names, key=str.lower)
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
        if os.environ.get(ALLOW_ABSOLUTE_ENV) != "1":
            raise ModelError(f"{role}: '{name}' is an absolute path, which is refused by default. Put the file in "
                             f"ComfyUI's models/{folder} folder and choose it from the list, or start ComfyUI with "
                             f"{ALLOW_ABSOLUTE_ENV}=1.")
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


# ---- sizes from the files' tensors (laid over the published configs)


def _head_dim(width: int, published: int) -> int:
    """The published head size where it divides the width; for narrower (trimmed or test) models the largest
    power-of-two fraction of it that does. Head counts are not stored in the weights."""
    head = published
    while head > 1 and width % head:
        head //= 2
    return head


def _groups(channels: Iterable[int], published: int = 32) -> int:
    """GroupNorm groups: the published count where it divides every width, else the largest fraction of it."""
    groups = published
    while groups > 1 and any(c % groups for c in channels):
        groups //= 2
    return groups


def _scaled(published: list[int], total: int, even: bool) -> list[int]:
    """A split of `total` in the proportions of `published` (rotary axes; even sizes where rotary pairs
    need them), the remainder on the last."""
    if sum(published) == total:
        return list(published)
    step = 2 if even else 1
    out = [max(step, step * round(a * total / sum(published) / step)) for a in published]
    out[-1] += total - sum(out)
    return out


def _flux1_sizes(s: Mapping[str, tuple], published: dict) -> dict:
    hidden, head = s["img_in.weight"][0], s["double_blocks.0.img_attn.norm.query_norm.scale"][0]
    return {"in_channels": s["img_in.weight"][1], "num_layers": _count(s, "double_blocks."),
            "num_single_layers": _count(s, "single_blocks."), "attention_head_dim": head,
            "num_attention_heads": hidden // head, "joint_attention_dim": s["txt_in.weight"][1],
            "pooled_projection_dim": s["vector_in.in_layer.weight"][1],
            "guidance_embeds": "guidance_in.in_layer.weight" in s,
            "axes_dims_rope": _scaled(published["axes_dims_rope"], head, even=True)}


def _flux2_sizes(s: Mapping[str, tuple], published: dict) -> dict:
    hidden, head = s["img_in.weight"][0], s["double_blocks.0.img_attn.norm.query_norm.scale"][0]
    out = s["final_layer.linear.weight"][0]
    return {"in_channels": s["img_in.weight"][1], "out_channels": None if out == s["img_in.weight"][1] else out,
            "num_layers": _count(s, "double_blocks."), "num_single_layers": _count(s, "single_blocks."),
            "attention_head_dim": head, "num_attention_heads": hidden // head,
            "joint_attention_dim": s["txt_in.weight"][1],
            "timestep_guidance_channels": s["time_in.in_layer.weight"][1],
            "mlp_ratio": s["double_blocks.0.img_mlp.0.weight"][0] / 2 / hidden,
            "guidance_embeds": "guidance_in.in_layer.weight" in s,
            "axes_dims_rope": _scaled(published["axes_dims_rope"], head, even=True)}


def _sd3_sizes(s: Mapping[str, tuple], published: dict) -> dict:
    hidden, _, patch, _ = s["x_embedder.proj.weight"]
    qk_norm = "joint_blocks.0.x_block.attn.ln_q.weight" in s
    head = s["joint_blocks.0.x_block.attn.ln_q.weight"][0] if qk_norm else 64  # without qk-norm, as ComfyUI
    return {"in_channels": s["x_embedder.proj.weight"][1], "patch_size": patch,
            "out_channels": s["final_layer.linear.weight"][0] // (patch * patch), "num_layers": _count(s, "joint_blocks."),
            "attention_head_dim": head, "num_attention_heads": hidden // head,
            "joint_attention_dim": s["context_embedder.weight"][1],
            "caption_projection_dim": s["context_embedder.weight"][0],
            "pooled_projection_dim": s["y_embedder.mlp.0.weight"][1],
            "pos_embed_max_size": int(round(s["pos_embed"][1] ** 0.5)), "qk_norm": "rms_norm" if qk_norm else None,
            "dual_attention_layers": sorted(int(k.split(".")[1]) for k in s if k.endswith("x_block.attn2.qkv.weight"))}


def _qwenimage_sizes(s: Mapping[str, tuple], published: dict) -> dict:
    hidden, head = s["img_in.weight"][0], s["transformer_blocks.0.attn.norm_q.weight"][0]
    patch = published["patch_size"]
    return {"in_channels": s["img_in.weight"][1], "out_channels": s["proj_out.weight"][0] // (patch * patch),
            "num_layers": _count(s, "transformer_blocks."), "attention_head_dim": head,
            "num_attention_heads": hidden // head, "joint_attention_dim": s["txt_norm.weight"][0],
            "guidance_embeds": any(k.startswith("time_text_embed.guidance_embedder.") for k in s),
            "axes_dims_rope": _scaled(published["axes_dims_rope"], head, even=True)}


def _zimage_sizes(s: Mapping[str, tuple], published: dict) -> dict:
    """ComfyUI's layout (fused qkv) or diffusers' own keys: widths and counts from the tensors, the head size from
    the q-norm; rotary axes scaled from the published ones. The patch sizes are the published (2, 1)."""
    diffusers = ZIMAGE_DIFFUSERS_IN in s
    dim, head = s["cap_embedder.1.weight"][0], s["layers.0.attention." + ("norm_q" if diffusers else "q_norm")
                                                 + ".weight"][0]
    kv = s["layers.0.attention.to_k.weight"][0] // head if diffusers else \
        (s["layers.0.attention.qkv.weight"][0] // head - dim // head) // 2
    patch = published["all_patch_size"][0] ** 2 * published["all_f_patch_size"][0]
    return {"in_channels": s[ZIMAGE_DIFFUSERS_IN if diffusers else "x_embedder.weight"][1] // patch, "dim": dim,
            "n_layers": _count(s, "layers."), "n_refiner_layers": _count(s, "noise_refiner."), "n_heads": dim // head,
            "n_kv_heads": kv, "cap_feat_dim": s["cap_embedder.1.weight"][1],
            "axes_dims": _scaled(published["axes_dims"], head, even=True)}


def _sdxl_sizes(s: Mapping[str, tuple], published: dict, pooled_width: int | None) -> dict:
    """The UNet's layout from the LDM keys (input_blocks: resnets, attention and downsamplers in order)."""
    levels: list[list[tuple[int, int]]] = [[]]  # per level: (channels, attention depth) of each resnet
    i = 1
    while f"input_blocks.{i}.0.op.weight" in s or f"input_blocks.{i}.0.out_layers.3.weight" in s:
        if f"input_blocks.{i}.0.op.weight" in s:
            levels.append([])
        else:
            levels[-1].append((s[f"input_blocks.{i}.0.out_layers.3.weight"][0],
                               _count(s, f"input_blocks.{i}.1.transformer_blocks.")))
        i += 1
    channels = [lvl[0][0] for lvl in levels]
    depth = [lvl[0][1] for lvl in levels]
    key = next(k for k in s if k.endswith("attn2.to_k.weight"))
    adm = s["label_emb.0.0.weight"][1]
    time_dim = published["addition_time_embed_dim"]
    if pooled_width and (adm - pooled_width) % 6 == 0:
        time_dim = (adm - pooled_width) // 6
    down = ["CrossAttnDownBlock2D" if d else "DownBlock2D" for d in depth]
    return {"in_channels": s["input_blocks.0.0.weight"][1], "out_channels": s["out.2.weight"][0],
            "block_out_channels": channels, "layers_per_block": len(levels[0]),
            "transformer_layers_per_block": [max(d, 1) for d in depth],
            "down_block_types": down,
            "up_block_types": [t.replace("Down", "Up") for t in reversed(down)],
            "attention_head_dim": [c // _head_dim(c, 64) for c in channels],
            "cross_attention_dim": s[key][1], "projection_class_embeddings_input_dim": adm,
            "addition_time_embed_dim": time_dim, "norm_num_groups": _groups(channels),
            "use_linear_projection": len(s["middle_block.1.proj_in.weight"]) == 2}


def _vae_sizes(part: Part, published: dict) -> dict:
    s = part.shapes
    if part.kind == "vae-wan":
        z = s["conv2.weight"][0]
        sizes = {"base_dim": s["encoder.conv1.weight"][0], "z_dim": z}
        if z != published["z_dim"]:  # the published latent statistics are for 16 channels
            sizes.update(latents_mean=[0.0] * z, latents_std=[1.0] * z)
        return sizes
    levels = _count(s, "encoder.down.")
    channels = [s[f"encoder.down.{i}.block.0.conv2.weight"][0] for i in range(levels)]
    sizes = {"block_out_channels": channels, "layers_per_block": _count(s, "encoder.down.0.block."),
             "latent_channels": s["decoder.conv_in.weight"][1], "norm_num_groups": _groups(channels),
             "down_block_types": ["DownEncoderBlock2D"] * levels, "up_block_types": ["UpDecoderBlock2D"] * levels,
             "use_quant_conv": "quant_conv.weight" in s, "use_post_quant_conv": "post_quant_conv.weight" in s,
             "mid_block_add_attention": "encoder.mid.attn_1.q.weight" in s}
    return sizes


def _clip_sizes(part: Part, published: dict) -> dict:
    s = part.shapes
    if "transformer.resblocks.0.attn.in_proj_weight" in s:  # OpenCLIP layout (SDXL checkpoints)
        hidden = s["token_embedding.weight"][1]
        return {"hidden_size": hidden, "vocab_size": s["token_embedding.weight"][0],
                "max_position_embeddings": s["positional_embedding"][0],
                "num_hidden_layers": _count(s, "transformer.resblocks."),
                "intermediate_size": s["transformer.resblocks.0.mlp.c_fc.weight"][0],
                "num_attention_heads": hidden // _head_dim(hidden, 64),
                "projection_dim": s["text_projection"][1]}
    pre = "text_model." if "text_model.encoder.layers.0.self_attn.q_proj.weight" in s else ""
    hidden = s[f"{pre}embeddings.token_embedding.weight"][1]
    sizes = {"hidden_size": hidden, "vocab_size": s[f"{pre}embeddings.token_embedding.weight"][0],
             "max_position_embeddings": s[f"{pre}embeddings.position_embedding.weight"][0],
             "num_hidden_layers": _count(s, f"{pre}encoder.layers."),
             "intermediate_size": s[f"{pre}encoder.layers.0.mlp.fc1.weight"][0],
             "num_attention_heads": hidden // _head_dim(hidden, 64)}
    sizes["projection_dim"] = s["text_projection.weight"][0] if "text_projection.weight" in s else hidden
    return sizes


def _t5_sizes(part: Part, published: dict) -> dict:
    s = part.shapes
    bias = s["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
    embed = s.get("shared.weight") or s["encoder.embed_tokens.weight"]
    return {"d_model": embed[1], "vocab_size": embed[0], "num_layers": _count(s, "encoder.block."),
            "num_heads": bias[1], "relative_attention_num_buckets": bias[0],
            "d_kv": s["encoder.block.0.layer.0.SelfAttention.q.weight"][0] // bias[1],
            "d_ff": s["encoder.block.0.layer.1.DenseReluDense.wi_0.weight"][0]}


def _llm_sizes(part: Part, published: dict) -> dict:
    """A decoder-only text encoder (Qwen2.5-VL's language model, Qwen3, Mistral): counts and widths from the
    tensors, head size from q_norm where the model has one, else the published one (fitted to the width)."""
    s = part.shapes
    text = published.get("text_config", published)
    hidden = s["model.embed_tokens.weight"][1]
    q, k = s["model.layers.0.self_attn.q_proj.weight"][0], s["model.layers.0.self_attn.k_proj.weight"][0]
    if "model.layers.0.self_attn.q_norm.weight" in s:
        head = s["model.layers.0.self_attn.q_norm.weight"][0]
    else:
        head = _head_dim(q, text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"])
    sizes = {"hidden_size": hidden, "vocab_size": s["model.embed_tokens.weight"][0],
             "num_hidden_layers": _count(s, "model.layers."),
             "intermediate_size": s["model.layers.0.mlp.gate_proj.weight"][0],
             "num_attention_heads": q // head, "num_key_value_heads": k // head}
    if "head_dim" in text:
        sizes["head_dim"] = head
    rope = dict(text.get("rope_parameters") or {})
    if "mrope_section" in rope:
        rope["mrope_section"] = _scaled(rope["mrope_section"], head // 2, even=False)
        sizes["rope_parameters"] = rope
    if "text_config" not in published:
        return sizes
    vision = {}
    if "visual.patch_embed.proj.weight" in s:
        embed, _, temporal, patch, _ = s["visual.patch_embed.proj.weight"]
        merge = int(round((s["visual.merger.mlp.0.weight"][1] / embed) ** 0.5))
        vision = {"hidden_size": embed, "depth": _count(s, "visual.blocks."), "patch_size": patch,
                  "temporal_patch_size": temporal, "spatial_merge_size": merge,
                  "intermediate_size": s["visual.blocks.0.mlp.gate_proj.weight"][0],
                  "out_hidden_size": s["visual.merger.mlp.2.weight"][0],
                  "num_heads": embed // _head_dim(embed, 80)}
        published_blocks = published["vision_config"]["fullatt_block_indexes"]
        vision["fullatt_block_indexes"] = [b for b in published_blocks if b < vision["depth"]] or [vision["depth"] - 1]
    return {"text_config": {**text, **sizes}, "vision_config": {**published["vision_config"], **vision}}


# ---- describing a pipeline made of files


@dataclass(frozen=True)
class FileChoice:
    """What the user chose: a file name per input (None or NONE for none)."""

    checkpoint: str | None = None
    diffusion_model: str | None = None
    text_encoders: tuple[str | None, ...] = ()
    vae: str | None = None

    def chosen(self, value: str | None) -> bool:
        return bool(value) and value.strip() != NONE


@dataclass
class _Chosen:
    """A file the user chose, read once."""

    input: str  # the node input it came from, for messages
    path: Path
    contents: Contents


# family -> (config folder, the text encoders it needs in order, the ones it can do without)
NEEDS = {
    "flux1": ("flux1", ("clip-l", "t5"), ()),
    "flux2": ("flux2", ("mistral",), ()),  # or klein: ("qwen3",), chosen by the text encoder given
    "sd3": ("sd3", ("clip-l", "clip-g", "t5"), ("t5",)),
    "sdxl": ("sdxl", ("clip-l", "clip-g"), ()),
    "qwenimage": ("qwenimage", ("qwen25vl",), ()),
    "zimage": ("zimage", ("qwen3",), ()),
}
TEXT_NAMES = {"flux1": ("text_encoder", "text_encoder_2"), "flux2": ("text_encoder",),
              "sd3": ("text_encoder", "text_encoder_2", "text_encoder_3"),
              "sdxl": ("text_encoder", "text_encoder_2"), "qwenimage": ("text_encoder",), "zimage": ("text_encoder",)}
DENOISER_NAME = {"sdxl": "unet"}
PIPELINE_CHECKPOINTS = ("sd3", "sdxl", "flux1")  # diffusers reads all-in-one checkpoints of these families


def comfy_package_dir() -> Path | None:
    """ComfyUI's `comfy` package folder (its bundled tokenizers live there), without importing it."""
    spec = importlib.util.find_spec("comfy")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


TOKENIZERS = {  # text encoder kind -> ComfyUI's bundled tokenizer folder (relative to the comfy package)
    "clip-l": "sd1_tokenizer", "clip-g": "sd1_tokenizer", "t5": "text_encoders/t5_tokenizer",
    "qwen25vl": "text_encoders/qwen25_tokenizer", "qwen3": "text_encoders/qwen25_tokenizer",
}


def describe_files(choice: FileChoice, roots: Mapping[str, Iterable[str]]) -> tuple[str, str, FileSource]:
    """Reads the chosen files' headers, checks they make one pipeline, and describes it: (pipeline class,
    main file path, FileSource). Raises ModelError naming the input, the file and the fix."""
    chosen = _read_choice(choice, roots)
    main = chosen.get("checkpoint") or chosen.get("diffusion_model")
    if main is None:
        raise ModelError("diffusion_model: no model was chosen. Choose a diffusion model (models/diffusion_models "
                         "or models/unet) with its text encoders and VAE, or a checkpoint (models/checkpoints).")
    if "checkpoint" in chosen and "diffusion_model" in chosen:
        raise ModelError("checkpoint: both a checkpoint and a diffusion model were chosen; set one of them to "
                         f"'{NONE}' (a checkpoint holds its diffusion model).")
    denoiser = main.contents.denoiser
    if denoiser is None:
        raise ModelError(_not_a(main, "diffusion model", "a FLUX.1, FLUX.2, SD3/3.5, SDXL, Qwen-Image or Z-Image "
                                "diffusion model (or a checkpoint holding one)"))
    family = denoiser.kind
    texts = _text_encoders(family, chosen)
    if family == "flux2":  # dev reads Mistral, klein reads Qwen3: the text encoder decides the pipeline
        kinds = {p.kind for p, _ in texts.values()}  # without one, dev's text width (3 x 5120) decides
        klein = "qwen3" in kinds or ("mistral" not in kinds and denoiser.shapes["txt_in.weight"][1] != 15360)
        configs = "flux2-klein" if klein else "flux2"
        needs: tuple[str, ...] = ("qwen3",) if klein else ("mistral",)
    else:
        configs, needs = NEEDS[family][0], NEEDS[family][1]
    missing = [k for k in needs if k not in texts and k not in NEEDS[family][2]]
    if missing:
        have = ", ".join(f"{WANTED.get(p.kind, p.kind)} ({c.path.name})" for p, c in texts.values()) or "none"
        raise ModelError(
            f"text_encoder: {FAMILY_NAMES[family]} needs {' and '.join(WANTED[k] for k in needs)}; "
            f"{' and '.join(WANTED[k] for k in missing)} {'is' if len(missing) == 1 else 'are'} missing "
            f"(chosen: {have}). Put the file in ComfyUI's models/text_encoders (or models/clip) folder and choose "
            "it in text_encoder_1, _2 or _3.")
    vae_file = chosen.get("vae") or (main if main.contents.vae is not None else None)
    if vae_file is None:
        raise ModelError(f"vae: {FAMILY_NAMES[family]} needs a VAE ({VAE_HINT[family]}); '{main.path.name}' holds "
                         "none. Put it in ComfyUI's models/vae folder and choose it in vae.")
    _check_fit(family, main, denoiser, texts, vae_file)
    return _source(family, configs, main, denoiser, texts, vae_file, chosen)


def _read_choice(choice: FileChoice, roots: Mapping[str, Iterable[str]]) -> dict[str, _Chosen]:
    chosen: dict[str, _Chosen] = {}
    inputs = [("checkpoint", "checkpoint", choice.checkpoint), ("diffusion_model", "diffusion_model",
                                                                 choice.diffusion_model),
              ("vae", "vae", choice.vae)]
    inputs += [(f"text_encoder_{i}", "text_encoder", v) for i, v in enumerate(choice.text_encoders, 1)]
    for name, role, value in inputs:
        if not choice.chosen(value):
            continue
        path = resolve_file(value, role, roots.get(role, ()))
        if path.suffix.lower() in GGUF and role != "diffusion_model":
            raise ModelError(f"{name}: '{path.name}' is a GGUF file; ComfyUI-TPU reads GGUF diffusion models only "
                             "(through diffusers). Use the .safetensors version of this "
                             f"{role.replace('_', ' ')}.")
        chosen[name] = _Chosen(name, path, file_contents(path, name))
    return chosen


def _not_a(c: _Chosen, what: str, wanted: str) -> str:
    found = _describe_contents(c.contents)
    return (f"{c.input}: '{c.path.name}' is not a {what} ComfyUI-TPU can use ({found}); choose {wanted}.")


def _describe_contents(c: Contents) -> str:
    if c.denoiser is not None:
        return f"it holds a {FAMILY_NAMES[c.denoiser.kind]} diffusion model"
    if c.vae is not None:
        return f"it is a VAE with {c.vae.width} latent channels"
    if c.text_encoders:
        p = c.text_encoders[0]
        return f"it is a {WANTED.get(p.kind, p.kind).split(' (')[0]} text encoder ({p.width} wide)"
    if any(k.startswith(("input_blocks.", "model.diffusion_model.input_blocks.")) for k in c.header.shapes):
        return "it looks like an SD1.x/SD2.x model, which is not supported"
    return "its tensors are not a model ComfyUI-TPU knows"


def _text_encoders(family: str, chosen: dict[str, _Chosen]) -> dict[str, tuple[Part, _Chosen]]:
    """The text encoders by kind ("clip-l", "clip-g", "t5", ...): from the checkpoint, then the chosen
    files (which win). Two CLIPs are told apart by width (CLIP-L is the narrower, as in every model)."""
    found: dict[str, tuple[Part, _Chosen]] = {}
    ckpt = chosen.get("checkpoint")
    if ckpt is not None:  # named by their prefix in the checkpoint
        found.update({part.kind: (part, ckpt) for part in ckpt.contents.text_encoders})
    clips: list[tuple[Part, _Chosen]] = []
    for name in sorted(k for k in chosen if k.startswith("text_encoder_")):
        c = chosen[name]
        if not c.contents.text_encoders or c.contents.denoiser is not None:
            raise ModelError(_not_a(c, "text encoder", " or ".join(WANTED[k] for k in _family_texts(family))))
        part = c.contents.text_encoders[0]
        if part.kind == "clip":
            clips.append((part, c))
        elif part.kind not in WANTED:
            raise ModelError(_not_a(c, "text encoder", " or ".join(WANTED[k] for k in _family_texts(family))))
        else:
            found[part.kind] = (part, c)
    if len(clips) > 2:
        raise ModelError(f"{clips[2][1].input}: three CLIP text encoders were chosen; models use at most two "
                         "(CLIP-L and CLIP-G).")
    clips.sort(key=lambda pc: pc[0].width)
    if len(clips) == 2:
        found["clip-l"], found["clip-g"] = clips
    elif clips:  # one CLIP: CLIP-G is 1280 wide, CLIP-L 768 (narrower test models count as CLIP-L)
        found["clip-g" if family in ("sd3", "sdxl") and clips[0][0].width >= 1024 else "clip-l"] = clips[0]
    for kind, (_, c) in found.items():
        if kind not in _family_texts(family) and c.input != "checkpoint":
            raise ModelError(
                f"{c.input}: '{c.path.name}' is a {WANTED[kind].split(' (')[0]} text encoder, which "
                f"{FAMILY_NAMES[family]} does not use; it needs {' and '.join(WANTED[k] for k in _family_texts(family))}.")
    return found


def _family_texts(family: str) -> tuple[str, ...]:
    return ("mistral", "qwen3") if family == "flux2" else NEEDS[family][1]


def _check_fit(family: str, main: _Chosen, denoiser: Part, texts: dict, vae_file: _Chosen) -> None:
    """The chosen parts fit each other (widths, channels): a file of another family is named with the fix."""
    s = denoiser.shapes
    vae = vae_file.contents.vae
    if vae is None:
        raise ModelError(_not_a(vae_file, "VAE", VAE_HINT[family]))
    want_kind = {"flux2": "vae-flux2", "qwenimage": "vae-wan"}.get(family, "vae-ldm")
    latent = denoiser.width if family in ("sd3", "sdxl") else denoiser.width // 4  # 2x2 packed latents
    if vae.kind != want_kind or vae.width != latent:
        raise ModelError(
            f"{vae_file.input}: '{vae_file.path.name}' is a VAE with {vae.width} latent channels"
            f"{' of another kind' if vae.kind != want_kind else ''}; this {FAMILY_NAMES[family]} model "
            f"('{main.path.name}') needs {VAE_HINT[family]} ({latent} channels). Choose the matching VAE.")
    wanted = {}  # text encoder kind -> the width the denoiser expects
    if family == "flux1":
        wanted = {"clip-l": s["vector_in.in_layer.weight"][1], "t5": s["txt_in.weight"][1]}
    elif family == "flux2":
        kind = "qwen3" if "qwen3" in texts else "mistral"
        if s["txt_in.weight"][1] % 3 == 0:
            wanted = {kind: s["txt_in.weight"][1] // 3}
    elif family == "sd3":
        wanted = {"t5": s["context_embedder.weight"][1]}
        if "clip-l" in texts and "clip-g" in texts:
            pooled = _projection(texts["clip-l"][0]) + _projection(texts["clip-g"][0])
            if pooled != s["y_embedder.mlp.0.weight"][1]:
                raise ModelError(_clip_mismatch(family, main, texts, s["y_embedder.mlp.0.weight"][1]))
    elif family == "sdxl":
        key = next(k for k in s if k.endswith("attn2.to_k.weight"))
        if texts["clip-l"][0].width + texts["clip-g"][0].width != s[key][1]:
            raise ModelError(_clip_mismatch(family, main, texts, s[key][1]))
    elif family == "qwenimage":
        wanted = {"qwen25vl": s["txt_norm.weight"][0]}
    elif family == "zimage":
        wanted = {"qwen3": s["cap_embedder.1.weight"][1]}
    for kind, width in wanted.items():
        if kind in texts and texts[kind][0].width != width:
            part, c = texts[kind]
            raise ModelError(f"{c.input}: '{c.path.name}' is a {WANTED[kind].split(' (')[0]} text encoder "
                             f"{part.width} wide; this {FAMILY_NAMES[family]} model ('{main.path.name}') reads "
                             f"{width}-wide text features. Choose {WANTED[kind]} made for it.")


def _projection(part: Part) -> int:
    s = part.shapes
    if "text_projection" in s:
        return s["text_projection"][1]
    if "text_projection.weight" in s:
        return s["text_projection.weight"][0]
    return part.width


def _clip_mismatch(family: str, main: _Chosen, texts: dict, width: int) -> str:
    names = ", ".join(f"'{texts[k][1].path.name}' ({texts[k][0].width} wide)" for k in ("clip-l", "clip-g"))
    return (f"text_encoder: the CLIP text encoders {names} do not fit this {FAMILY_NAMES[family]} model "
            f"('{main.path.name}'), which reads {width}-wide CLIP features. Choose its CLIP-L and CLIP-G.")


FLOAT_DTYPES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}


def _quant(header: Header, prefix: str = "") -> str:
    """How the part under `prefix` stores its weights: "gguf", "scaled-fp8" (ComfyUI's fp8 with per-layer
    scales, old or new layout), or "" (plain floats, fp8 included: upcast on load)."""
    if header.format == "gguf":
        return "gguf"
    if any(k.startswith(prefix) and k.endswith((".scale_weight", ".weight_scale")) for k in header.shapes):
        return "scaled-fp8"
    return ""


def _unsupported_quant(header: Header, c: _Chosen) -> None:
    """Weights in integer or packed formats (int8, nvfp4, ... layers of ComfyUI's mixed-precision files) are
    refused by name; a few integer tensors that are not weights (tekken_model, position ids) are fine."""
    if header.format != "safetensors":
        return
    odd = sorted({d for k, d in header.dtypes.items() if k.endswith(".weight") and d not in FLOAT_DTYPES})
    formats = json.loads(header.metadata.get("_quantization_metadata", "{}") or "{}")
    layers = formats.get("layers", {}) if isinstance(formats, dict) else {}
    odd += sorted({str(v.get("format")) for v in layers.values()
                   if isinstance(v, dict) and not str(v.get("format", "")).startswith("float8")})
    if odd:
        raise ModelError(f"{c.input}: '{c.path.name}' holds weights in {', '.join(odd)}, a quantized format "
                         "ComfyUI-TPU cannot read. Supported: float32, float16, bfloat16 and fp8 (float8_e4m3fn, "
                         "float8_e5m2, ComfyUI's scaled fp8) safetensors, and GGUF diffusion models on CPU and "
                         "CUDA.")


def _flux1_key_map(shapes: Mapping[str, tuple]) -> tuple[tuple, ...]:
    """ComfyUI's own FLUX.1 key map (diffusers key -> BFL key, slice, transform), inverted by the worker: for
    widths diffusers' converter does not read. Needs ComfyUI (`comfy.utils`), present in ComfyUI's process."""
    try:
        import comfy.utils
    except ImportError:
        raise ModelError("diffusion_model: this FLUX.1 file is not 3072 wide, which diffusers' converter needs; "
                         "reading other widths uses ComfyUI's own key map, and ComfyUI is not importable here. "
                         "Run it from ComfyUI.") from None
    key_map = comfy.utils.flux_to_diffusers({"depth": _count(shapes, "double_blocks."),
                                             "depth_single_blocks": _count(shapes, "single_blocks."),
                                             "hidden_size": shapes["img_in.weight"][0]})
    entries = []
    for target, src in sorted(key_map.items()):
        if isinstance(src, str):
            src = (src, None)
        name, offset = src[0], src[1]
        transform = src[2] if len(src) > 2 else None
        if name not in shapes:
            continue
        if transform not in (None, comfy.utils.swap_scale_shift):
            raise ModelError(f"diffusion_model: ComfyUI's FLUX.1 key map uses a transform ({transform}) ComfyUI-TPU "
                             "does not know; this ComfyUI version is not supported for FLUX.1 files of this width.")
        dim, start, length = offset if offset is not None else (-1, 0, 0)
        entries.append((target, name, dim, start, length, "swap_scale_shift" if transform else ""))
    return tuple(entries)


def _source(family: str, configs: str, main: _Chosen, denoiser: Part, texts: dict, vae_file: _Chosen,
            chosen: dict[str, _Chosen]) -> tuple[str, str, FileSource]:
    folder = CONFIGS_DIR / configs
    index = read_json(folder / "model_index.json")
    denoiser_name = DENOISER_NAME.get(family, "transformer")
    published = read_json(folder / denoiser_name / "config.json")
    overrides: dict[str, dict] = {}
    parts: list[FileComponent] = []
    notes: list[str] = []
    header = main.contents.header
    _unsupported_quant(header, main)
    quant = _quant(header, denoiser.prefix)
    if quant == "gguf" and main.input != "diffusion_model":
        raise ModelError(f"{main.input}: GGUF files are read as diffusion models only; put '{main.path.name}' in "
                         "models/diffusion_models (or models/unet).")

    # the denoiser
    s = denoiser.shapes
    if family == "sdxl":
        pooled = _projection(texts["clip-g"][0]) if "clip-g" in texts else None
        overrides[denoiser_name] = _sdxl_sizes(s, published, pooled)
    else:
        sizes = {"flux1": _flux1_sizes, "flux2": _flux2_sizes, "sd3": _sd3_sizes,
                 "qwenimage": _qwenimage_sizes, "zimage": _zimage_sizes}[family](s, published)
        overrides[denoiser_name] = sizes
    layout, key_map = family, ()
    if family == "flux1" and s["img_in.weight"][0] != FLUX1_CONVERTER_WIDTH:
        if quant == "gguf":
            raise ModelError(f"diffusion_model: '{main.path.name}' is a GGUF FLUX.1 file {s['img_in.weight'][0]} wide; "
                             "diffusers reads GGUF FLUX.1 files of the published width (3072) only.")
        layout, key_map = "flux1-comfy-map", _flux1_key_map(s)
    if family == "flux1" and not overrides[denoiser_name]["guidance_embeds"]:  # schnell: its own schedule
        overrides["scheduler"] = {"shift": 1.0, "use_dynamic_shifting": False}
        notes.append("FLUX.1 [schnell] (no guidance embedding): 4 steps, guidance 0")
    if configs == "flux2-klein" and "base" in main.path.name.lower():
        overrides[""] = {"is_distilled": False}
    if family == "qwenimage" and denoiser.prefix == "" and quant == "":
        layout = "diffusers"  # ComfyUI's Qwen-Image files hold diffusers' own keys
    if family == "zimage" and ZIMAGE_DIFFUSERS_IN in s:
        layout = "diffusers"  # diffusers' own keys, which its single-file converter (ComfyUI's layout) would rename
    parts.append(FileComponent(denoiser_name, str(main.path), layout, denoiser.prefix, quant, header.size, key_map))

    # the VAE
    vae = vae_file.contents.vae
    overrides["vae"] = _vae_sizes(vae, read_json(folder / "vae" / "config.json"))
    _unsupported_quant(vae_file.contents.header, vae_file)
    parts.append(FileComponent("vae", str(vae_file.path), {"vae-ldm": "ldm-vae", "vae-flux2": "flux2-vae",
                                                           "vae-wan": "wan-vae"}[vae.kind], vae.prefix,
                               _quant(vae_file.contents.header, vae.prefix), vae_file.contents.header.size))

    # the text encoders and their tokenizers
    comfy = comfy_package_dir()
    names = TEXT_NAMES[family]
    order = {"flux1": ("clip-l", "t5"), "sd3": ("clip-l", "clip-g", "t5"), "sdxl": ("clip-l", "clip-g"),
             "qwenimage": ("qwen25vl",), "flux2": ("qwen3",) if configs == "flux2-klein" else ("mistral",),
             "zimage": ("qwen3",)}[family]
    for name, kind in zip(names, order, strict=True):
        tok_name = name.replace("text_encoder", "tokenizer")
        if kind not in texts:  # optional (SD3 without T5)
            overrides[""] = {**overrides.get("", {}), name: [None, None], tok_name: [None, None]}
            notes.append(f"no {WANTED[kind].split(' (')[0]} text encoder: {name} is left out")
            continue
        part, c = texts[kind]
        published_te = read_json(folder / name / "config.json")
        sizes = {"clip-l": _clip_sizes, "clip-g": _clip_sizes, "t5": _t5_sizes}.get(kind, _llm_sizes)
        overrides[name] = sizes(part, published_te)
        te_header = c.contents.header
        _unsupported_quant(te_header, c)
        if kind == "mistral":
            if "tekken_model" not in te_header.shapes:
                raise ModelError(f"{c.input}: '{c.path.name}' carries no tokenizer (the 'tekken_model' tensor of "
                                 "Comfy-Org's mistral_3_small_flux2 files); use one of those files.")
            parts.append(FileComponent(tok_name, str(c.path), "tekken"))
        elif comfy is None:
            raise ModelError("ComfyUI's bundled tokenizers (its comfy package) were not found: files from "
                             "ComfyUI's folders are read inside ComfyUI.")
        else:
            parts.append(FileComponent(tok_name, str(comfy / TOKENIZERS[kind]), "tokenizer"))
        if c.input == "checkpoint" and family not in PIPELINE_CHECKPOINTS:
            raise ModelError(f"checkpoint: '{c.path.name}' holds {FAMILY_NAMES[family]} text encoders; diffusers "
                             "reads all-in-one files of SDXL, SD3/3.5 and FLUX.1 only. Choose its parts "
                             "(diffusion model, text encoders, VAE) as separate files instead.")
        layout = "hf"
        if "transformer.resblocks.0.attn.in_proj_weight" in part.shapes:
            layout = "openclip"  # SDXL's CLIP-G in its checkpoint: diffusers' pipeline loader converts it
        elif kind == "mistral" and overrides[name]["num_hidden_layers"] < published_te["num_hidden_layers"]:
            layout = "hf-no-final-norm"  # pruned (Comfy-Org's 30-layer file): ComfyUI drops the final norm
            notes.append(f"{c.path.name}: {overrides[name]['num_hidden_layers']} of Mistral's "
                         f"{published_te['num_hidden_layers']} layers, read without the final norm as ComfyUI does")
        te_quant = _quant(te_header, part.prefix)
        if layout == "openclip" and te_quant:
            raise ModelError(f"checkpoint: '{c.path.name}' holds a scaled-fp8 OpenCLIP text encoder, which "
                             "ComfyUI-TPU cannot read; use a checkpoint with plain weights.")
        parts.append(FileComponent(name, str(c.path), layout, part.prefix, te_quant, te_header.size))
    if main.input == "checkpoint" and family in PIPELINE_CHECKPOINTS:
        parts.append(FileComponent("checkpoint", str(main.path), "checkpoint", "", quant, header.size))
    if quant == "scaled-fp8" or any(p.quant == "scaled-fp8" for p in parts):
        notes.append("scaled fp8 weights are dequantized once while loading")
    overrides = {k: v for k, v in overrides.items() if v}
    source = FileSource(configs=configs, components=tuple(parts), overrides=json.dumps(overrides, sort_keys=True),
                        notes=tuple(notes))
    return index["_class_name"], str(main.path), source
