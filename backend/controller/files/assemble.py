"""The files a user chose, checked to make one pipeline of a supported family, and described (`spec.FileSource`):
the pack's configs of the published model (its family folder's configs/) with the sizes read from the files'
tensors laid over them, so that trimmed or variant files load, and every file with how the worker must read it.
What differs between families is read from their modules (backend/families); ComfyUI's own key maps and
tokenizers are used from ComfyUI's process, found without importing torch."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ... import families
from ...families import Configs, ModelFamily, config_dir, count, image_encoders, text_encoders, vaes
from ...families.flux1 import KONTEXT_CHOICES
from ...protocol import quantized
from ...protocol.errors import ModelError
from ...protocol.spec import FileComponent, FileSource, read_index, read_json
from . import comfy_code, experts
from .headers import FLOAT_DTYPES, GGUF, Header, read_header
from .listing import NONE, resolve_file
from .recognise import Contents, Part, file_contents, short_name


@dataclass(frozen=True)
class FileChoice:
    """What the user chose: a file name per input (None or NONE for none)."""

    checkpoint: str | None = None
    diffusion_model: str | None = None
    text_encoders: tuple[str | None, ...] = ()
    vae: str | None = None
    flux_kontext: str = "auto"  # flux1.KONTEXT_CHOICES: whether a FLUX.1 [dev]-shaped file is Kontext
    diffusion_model_2: str | None = None  # the second expert of a two-expert model (Wan 2.2 A14B's low noise)
    clip_vision: str | None = None  # a CLIP vision encoder (models/clip_vision: Wan 2.1 I2V's clip_vision_h)
    audio_vae: str | None = None  # the sound's VAE of a model that makes sound (models/vae: MiniMax H3's audio VAE)

    def chosen(self, value: str | None) -> bool:
        return bool(value) and value.strip() != NONE


@dataclass
class _Chosen:
    """A file the user chose, read once."""

    input: str  # the node input it came from, for messages
    path: Path
    contents: Contents


@dataclass
class _Draft:
    """The pipeline being described from the chosen files: its family, published configs, the files' parts."""

    family: ModelFamily
    configs: Configs
    main: _Chosen  # the checkpoint or diffusion model
    denoiser: Part
    texts: dict[str, tuple[Part, _Chosen]]  # text encoder kind -> its part and file
    vae_file: _Chosen
    kontext: str = "auto"  # the loader's flux_kontext choice
    overrides: dict[str, dict] = field(default_factory=dict)  # component ("" : model_index) -> config keys
    parts: list[FileComponent] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def folder(self) -> Path:
        return config_dir(self.configs.folder)

    def index(self) -> dict:
        """The index the pipeline loads with (model_index.json, a modular pipeline's modular_model_index.json): the
        published one, with the family's variant over it."""
        return {**read_index(self.folder), **self.overrides.get("", {})}

    def override(self, component: str, values: dict) -> None:
        self.overrides[component] = {**self.overrides.get(component, {}), **values}


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
        raise ModelError(_not_a(main, "diffusion model",
                                f"a {families.names(families.FROM_FILES)} diffusion model (or a checkpoint holding one)"))
    family = denoiser.family
    if choice.flux_kontext not in KONTEXT_CHOICES:
        raise ModelError(f"flux_kontext: '{choice.flux_kontext}' is not one of {', '.join(KONTEXT_CHOICES)}.")
    if choice.flux_kontext == "on" and family.variant_input != "flux_kontext":
        raise ModelError(f"flux_kontext: '{main.path.name}' is a {family.name} model; Kontext is a FLUX.1 model "
                         "(flux1-kontext-dev.safetensors). Set flux_kontext to auto, or choose a FLUX.1 Kontext file.")
    if not family.files:
        why = f" ({family.files_refused})" if family.files_refused else ""
        raise ModelError(f"diffusion_model: '{main.path.name}' is {'an' if family.name[0] in 'AEIOU' else 'a'} "
                         f"{family.name} model, which ComfyUI-TPU loads from a diffusers folder only so far{why}: put "
                         "the diffusers version of the model in models/diffusers and choose it in Load TPU Pipeline.")
    texts = _text_encoders(family, chosen)
    second = chosen.get("diffusion_model_2")
    configs = family.published(denoiser.shapes, frozenset(texts))
    if family.pair and main.input == "diffusion_model":  # its two transformers, from two files
        experts.check_pair(family, main.path, second and second.path, second and second.contents, denoiser.shapes)
    elif second:
        configs = _experts(family, main, second, configs)
    elif family.experts.get(configs.folder) is configs:
        raise ModelError(f"diffusion_model_2: '{main.path.name}' is one of the two experts of {configs.name}, which "
                         "run together: choose the high-noise file in diffusion_model and the low-noise one in "
                         "diffusion_model_2.")
    needs = [slot.kind for slot in configs.text_encoders]
    missing = [slot.kind for slot in configs.text_encoders if slot.kind not in texts and not slot.optional]
    if missing:
        have = ", ".join(f"{_wanted(p.kind)} ({c.path.name})" for p, c in texts.values()) or "none"
        raise ModelError(
            f"text_encoder: {family.name} needs {' and '.join(map(_wanted, needs))}; "
            f"{' and '.join(map(_wanted, missing))} {'is' if len(missing) == 1 else 'are'} missing "
            f"(chosen: {have}). Put the file in ComfyUI's models/text_encoders (or models/clip) folder and choose "
            "it in text_encoder_1, _2 or _3.")
    vae_file = chosen.get("vae") or (main if main.contents.vae is not None else None)
    if vae_file is None:
        raise ModelError(f"vae: {family.name} needs a VAE ({configs.vae_hint or family.vae_hint}); '{main.path.name}' holds "
                         "none. Put it in ComfyUI's models/vae folder and choose it in vae.")
    draft = _Draft(family, configs, main, denoiser, texts, vae_file, kontext=choice.flux_kontext)
    _check_fit(draft)
    _add_denoiser(draft, main, family.denoiser_for(main.path.name) if family.denoiser_for else family.denoiser)
    if second:
        _add_denoiser(draft, second, family.pair.component if family.pair else f"{family.denoiser}_2")
    _add_vae(draft)
    _add_family_parts(draft, chosen)
    _add_audio_vae(draft, chosen.get("audio_vae"))
    for slot in configs.text_encoders:
        _add_text_encoder(draft, slot.component, slot.kind)
    _add_image_encoder(draft, chosen.get("clip_vision"))
    if "processor" in draft.index():  # an edit pipeline's: its tokenizer's vocabulary, the pack's image settings
        kind = configs.text_encoders[0].kind
        draft.parts.append(_tokenizer("processor", kind, draft.texts[kind][1]))
    return _described(draft)


def _experts(family: ModelFamily, main: _Chosen, second: _Chosen, alone: Configs) -> Configs:
    """The published two-expert model that `main` (high noise) and `second` (low noise) make: both of the
    family, of the same shapes, and of a shape the family's experts have (`alone`: what `main` is alone)."""
    name = f"diffusion_model_2: '{second.path.name}'"
    if not family.experts or main.input != "diffusion_model":
        raise ModelError(f"{name} was chosen as a second diffusion model, which only Wan 2.2 A14B's two experts "
                         f"and Ideogram 4's two transformers use; {family.name} has one ('{main.path.name}'). Set "
                         f"diffusion_model_2 to '{NONE}'.")
    part = second.contents.denoiser
    if part is None or part.kind != family.id:
        raise ModelError(_not_a(second, f"{family.name} diffusion model",
                                f"the low-noise expert that goes with '{main.path.name}' (or '{NONE}')"))
    pair = family.experts.get(alone.folder)
    if pair is None:
        pairs = " and ".join(f"{c.name}'s" for c in dict.fromkeys(family.experts.values()))
        raise ModelError(f"{name}: '{main.path.name}' is {alone.name}, which is one file, not a pair of experts "
                         f"(as {pairs} are). Set diffusion_model_2 to '{NONE}'.")
    if part.shapes != main.contents.denoiser.shapes:
        raise ModelError(f"{name} does not have the shapes of '{main.path.name}': the two experts of "
                         f"{pair.name} are the same model trained for two noise levels. Choose its "
                         "low-noise file (the high-noise one goes in diffusion_model).")
    experts.check_order(pair.name, main.path, second.path)
    return pair


def _wanted(kind: str) -> str:
    return text_encoders.KINDS[kind].wanted if kind in text_encoders.KINDS else kind


def _read_choice(choice: FileChoice, roots: Mapping[str, Iterable[str]]) -> dict[str, _Chosen]:
    chosen: dict[str, _Chosen] = {}
    inputs = [("checkpoint", "checkpoint", choice.checkpoint), ("diffusion_model", "diffusion_model", choice.diffusion_model),
              ("diffusion_model_2", "diffusion_model", choice.diffusion_model_2), ("vae", "vae", choice.vae),
              ("clip_vision", "clip_vision", choice.clip_vision), ("audio_vae", "vae", choice.audio_vae)]
    inputs += [(f"text_encoder_{i}", "text_encoder", v) for i, v in enumerate(choice.text_encoders, 1)]
    for name, role, value in inputs:
        if not choice.chosen(value):
            continue
        path = resolve_file(value, role, roots.get(role, ()))
        if path.suffix.lower() in GGUF and role != "diffusion_model":
            raise ModelError(f"{name}: '{path.name}' is a GGUF file; ComfyUI-TPU reads GGUF diffusion models only "
                             f"(through diffusers). Use the .safetensors version of this {role.replace('_', ' ')}.")
        chosen[name] = _Chosen(name, path, file_contents(path, name))
    return chosen


def _not_a(c: _Chosen, what: str, wanted: str) -> str:
    return (f"{c.input}: '{c.path.name}' is not {'an' if what[:1].lower() in 'aeiou' else 'a'} {what} ComfyUI-TPU "
            f"can use ({c.contents.describe()}); choose {wanted}.")


def _text_encoders(family: ModelFamily, chosen: dict[str, _Chosen]) -> dict[str, tuple[Part, _Chosen]]:
    """The text encoders by kind ("clip-l", "t5", ...): the checkpoint's, then the chosen files' (which win; one
    file a kind). Two CLIPs are told apart by width (CLIP-L is the narrower, as in every model)."""
    wanted = family.text_kinds()
    found: dict[str, tuple[Part, _Chosen]] = {}
    ckpt = chosen.get("checkpoint")
    if ckpt is not None:  # named by their prefix in the checkpoint
        found.update({part.kind: (part, ckpt) for part in ckpt.contents.text_encoders})
    clips: list[tuple[Part, _Chosen]] = []
    for name in sorted(k for k in chosen if k.startswith("text_encoder_")):
        c = chosen[name]
        part = c.contents.text_encoders[0] if c.contents.text_encoders else None
        if part is None or c.contents.denoiser is not None or (part.kind != "clip"
                                                                and part.kind not in text_encoders.KINDS):
            raise ModelError(_not_a(c, "text encoder", " or ".join(map(_wanted, wanted))))
        if part.kind != "clip" and (o := found.get(part.kind, (0, ckpt))[1]) is not ckpt:  # the same kind twice
            raise ModelError(f"{c.input}: '{c.path.name}' is a {short_name(part.kind)} text encoder, as {o.input} "
                             f"('{o.path.name}') is; a model reads one of each kind. Set {c.input} to '{NONE}'.")
        if part.kind == "clip":
            clips.append((part, c))
        else:
            found[part.kind] = (part, c)
    if len(clips) > 2:
        raise ModelError(f"{clips[2][1].input}: three CLIP text encoders were chosen; models use at most two (CLIP-L and CLIP-G).")
    clips.sort(key=lambda pc: pc[0].width)
    if len(clips) == 2:
        found["clip-l"], found["clip-g"] = clips
    elif clips:  # one CLIP: CLIP-G is 1280 wide, CLIP-L 768 (narrower test models count as CLIP-L)
        found["clip-g" if "clip-g" in wanted and clips[0][0].width >= 1024 else "clip-l"] = clips[0]
    needs = " or ".join(dict.fromkeys(" and ".join(_wanted(s.kind) for s in c.text_encoders) for c in family.configs))
    for kind, (_, c) in found.items():
        if kind not in wanted and c.input != "checkpoint":
            raise ModelError(
                f"{c.input}: '{c.path.name}' is a {short_name(kind)} text encoder, which {family.name} does not "
                f"use; it needs {needs}.")
    return found


# ---- the chosen parts fit each other


def _check_fit(p: _Draft) -> None:
    """The chosen parts fit each other (widths, channels): a file of another family is named with the fix."""
    family, main, s = p.family, p.main, p.denoiser.shapes
    vae = p.vae_file.contents.vae
    if vae is None:
        raise ModelError(_not_a(p.vae_file, "VAE", p.configs.vae_hint or family.vae_hint))
    _check_own_shapes(p)
    latent = family.latent_channels(s)
    if vae.kind != family.vae or vae.width != latent:
        raise ModelError(
            f"{p.vae_file.input}: '{p.vae_file.path.name}' is a VAE with {vae.width} latent channels"
            f"{' of another kind' if vae.kind != family.vae else ''}; this {family.name} model "
            f"('{main.path.name}') needs {p.configs.vae_hint or family.vae_hint} ({latent} channels). Choose the "
            "matching VAE.")
    if family.clip_pair and "clip-l" in p.texts and "clip-g" in p.texts:
        width = family.clip_pair(s, p.texts["clip-l"][0].shapes, p.texts["clip-g"][0].shapes)
        if width is not None:
            names = ", ".join(f"'{p.texts[k][1].path.name}' ({p.texts[k][0].width} wide)" for k in ("clip-l", "clip-g"))
            raise ModelError(f"text_encoder: the CLIP text encoders {names} do not fit this {family.name} model "
                             f"('{main.path.name}'), which reads {width}-wide CLIP features. Choose its CLIP-L and "
                             "CLIP-G.")
    for kind, width in family.text_widths(s, frozenset(p.texts)).items():
        if kind in p.texts and p.texts[kind][0].width != width:
            part, c = p.texts[kind]
            raise ModelError(f"{c.input}: '{c.path.name}' is a {short_name(kind)} text encoder "
                             f"{part.width} wide; this {family.name} model ('{main.path.name}') reads "
                             f"{width}-wide text features. Choose {_wanted(kind)} made for it.")
    for kind, least in family.text_layers:
        if kind in p.texts and (layers := count(p.texts[kind][0].shapes, "model.layers.")) < least:
            c = p.texts[kind][1]
            raise ModelError(f"{c.input}: '{c.path.name}' is a {short_name(kind)} text encoder of {layers} layers; "
                             f"{family.name} reads the hidden states of fixed layers, as deep as its layer {least}, "
                             f"so it needs at least {least}. Choose {_wanted(kind)} made for it (the whole model, "
                             "not a pruned one).")


def _check_own_shapes(p: _Draft) -> None:
    """The denoiser's first layer agrees with its other layers: a file whose tensor is stored the wrong way
    round is named as the damaged file (not blamed on the VAE it then seems not to fit)."""
    key, dim = p.family.width_agrees
    s = p.denoiser.shapes
    if s[p.family.width_key][0] != s[key][dim]:
        raise ModelError(f"{p.main.input}: '{p.main.path.name}' is damaged: its tensor "
                         f"'{p.denoiser.prefix}{p.family.width_key}' has the shape {list(s[p.family.width_key])}, "
                         f"which does not fit its other layers ('{p.denoiser.prefix}{key}': {list(s[key])}). "
                         "Download it again.")


# ---- how each file is read


def _quant(header: Header, prefix: str | tuple[str, ...] = "") -> str:
    """How the part under `prefix` stores its weights: "gguf", "comfy-quant" (ComfyUI's quantized layers,
    marked by comfy_quant tensors or _quantization_metadata: backend/protocol/quantized.py), "scaled-fp8"
    (ComfyUI's older fp8 with per-layer scales), or "" (plain floats, fp8 included: upcast on load)."""
    if header.format == "gguf":
        return "gguf"
    q = header.quantized
    if q is not None and any(p.startswith(prefix) for p in q.layers):
        return "comfy-quant"
    if any(k.startswith(prefix) and k.endswith((".scale_weight", ".weight_scale")) for k in header.shapes):
        return "scaled-fp8"
    return ""


def _unsupported_quant(c: _Chosen) -> None:
    """ComfyUI's quantized layers are checked against their format (every scale there, of its dtype and shape):
    a bad one is refused naming the file, the tensor and the fix, before any worker starts. Integer or packed
    weights without ComfyUI's markers are refused by name; a few integer tensors that are not weights
    (tekken_model, position ids) are fine."""
    header = c.contents.header
    if header.format != "safetensors":
        return
    q = header.quantized
    if q is not None:
        if q.problems:
            tensor, what, fix = q.problems[0]
            more = f" ({len(q.problems) - 1} more problems like it)" if len(q.problems) > 1 else ""
            raise ModelError(f"{c.input}: '{c.path.name}' is a quantized file whose tensor '{tensor}' {what}"
                             f"{more}. {fix}")
        return
    odd = sorted({d for k, d in header.dtypes.items() if k.endswith(".weight") and d not in FLOAT_DTYPES})
    if odd:
        raise ModelError(f"{c.input}: '{c.path.name}' holds weights in {', '.join(odd)} without ComfyUI's "
                         "quantization markers (comfy_quant), so ComfyUI-TPU cannot tell how to read them. Supported: "
                         "float32, float16, bfloat16 and fp8 safetensors, ComfyUI's scaled fp8 and quantized files "
                         f"({', '.join(quantized.FORMATS)}), and GGUF diffusion models on CPU and CUDA.")


def _add_denoiser(p: _Draft, main: _Chosen, component: str) -> None:
    """The denoiser file `main` as pipeline component `component`, its sizes over the published config."""
    family, denoiser = p.family, main.contents.denoiser
    header = main.contents.header
    _unsupported_quant(main)
    quant = _quant(header, denoiser.prefix)
    if quant == "gguf" and main.input not in ("diffusion_model", "diffusion_model_2"):
        raise ModelError(f"{main.input}: GGUF files are read as diffusion models only; put '{main.path.name}' in "
                         "models/diffusion_models (or models/unet).")
    published = read_json(p.folder / component / "config.json")
    sizes = family.sizes(denoiser.shapes, published, {kind: part.shapes for kind, (part, _) in p.texts.items()})
    p.override(component, sizes)
    if family.variant:
        overrides, notes = family.variant(sizes, main.path.name, p.configs, p.kontext)
        for name, values in overrides.items():
            p.override(name, values)
        p.notes += notes
    layout = family.layout(denoiser.shapes, denoiser.prefix, quant, main.path.name)
    key_map = comfy_code.flux1_key_map(denoiser.shapes) if layout == "flux1-comfy-map" else ()
    p.parts.append(FileComponent(component, str(main.path), layout, denoiser.prefix, quant, header.size, key_map))


def _add_vae(p: _Draft) -> None:
    vae_file = p.vae_file
    vae = vae_file.contents.vae
    p.override("vae", vaes.sizes(vae.kind, vae.shapes, read_json(p.folder / "vae" / "config.json")))
    _unsupported_quant(vae_file)
    p.parts.append(FileComponent("vae", str(vae_file.path), vaes.layout(vae.kind, vae.shapes), vae.prefix,
                                 _quant(vae_file.contents.header, vae.prefix), vae_file.contents.header.size))


def _add_family_parts(p: _Draft, chosen: dict[str, _Chosen]) -> None:
    """The components the family reads from its files beyond the denoiser, VAE and text encoders
    (ModelFamily.file_parts: LTX-2's text connectors, audio VAE and vocoder), each from the first chosen file that
    holds it (the main file first); one that no chosen file holds is refused, naming the file that has it."""
    if (family := p.family).file_parts is None:
        return
    shapes = {"denoiser": p.denoiser.shapes, **{kind: part.shapes for kind, (part, _) in p.texts.items()}}
    found: dict[str, tuple[_Chosen, tuple[str, str, dict]]] = {}
    for c in sorted(chosen.values(), key=lambda c: c is not p.main):
        try:
            for name, part in family.file_parts(c.contents.header.logical, lambda n: read_json(
                    p.folder / n / "config.json"), shapes).items():
                found.setdefault(name, (c, part))
        except ValueError as e:
            raise ModelError(f"{c.input}: '{c.path.name}' cannot be read: {e}.") from None
    missing = [n for n in family.file_parts_needed if n not in found]
    if missing:
        raise ModelError(f"{p.main.input}: {family.name} also needs its {', '.join(missing)}, which none of the "
                         f"chosen files holds ('{p.main.path.name}' is its diffusion model alone). Choose "
                         f"{family.file_parts_hint[p.configs.folder]}.")
    for name, (c, (prefix, layout, sizes)) in found.items():  # a "_class_name" among the sizes: another class
        p.override(name, {k: v for k, v in sizes.items() if not k.startswith("_")})  # "_also": a second file's kind
        if "_class_name" in sizes:
            p.override("", {name: [p.index()[name][0], sizes["_class_name"]]})
        _unsupported_quant(c)
        more = (str(p.texts[sizes["_also"]][1].path),) if "_also" in sizes else ()
        p.parts.append(FileComponent(name, str(c.path), layout, prefix, _quant(c.contents.header, tuple(prefix.split("|"))), c.contents.header.size, more=more))


def _add_audio_vae(p: _Draft, c: _Chosen | None) -> None:
    """The sound's VAE (ModelFamily.audio_vae: MiniMax H3's), fitting the denoiser's sound; refused where none is."""
    model = f"{p.family.name} ('{p.main.path.name}')"
    if not p.family.audio_vae:  # LTX-2's audio VAE and vocoder: family parts, found in that file too
        if c is not None and not any(part.path == str(c.path) for part in p.parts):
            own = next((Path(part.path).name for part in p.parts if part.name == "audio_vae"), "")
            reads = f"reads its audio VAE from '{own}'" if own else "reads no audio VAE from files"
            raise ModelError(f"audio_vae: '{c.path.name}' was chosen, but {model} {reads}. Set audio_vae to '{NONE}'.")
        return
    kind, wanted = p.family.audio_vae
    if c is None:
        raise ModelError(f"audio_vae: {model} makes its video with sound, which its audio VAE decodes; none was "
                         f"chosen. Put {wanted} in ComfyUI's models/vae folder and choose it in audio_vae.")
    vae = c.contents.vae
    if vae is None or vae.kind != kind:
        raise ModelError(_not_a(c, "audio VAE", f"{p.family.name}'s audio VAE ({wanted})"))
    if vae.width != (channels := p.overrides.get(p.family.denoiser, {}).get("audio_in_channels")):
        raise ModelError(f"audio_vae: '{c.path.name}' is an audio VAE with {vae.width} latent channels; {model} "
                         f"reads {channels}. Choose its audio VAE ({wanted}).")
    _unsupported_quant(c)
    p.override("audio_vae", vaes.sizes(kind, vae.shapes, read_json(p.folder / "audio_vae" / "config.json")))
    p.parts.append(FileComponent("audio_vae", str(c.path), vaes.layout(kind, vae.shapes), vae.prefix,
                                 _quant(c.contents.header, vae.prefix), c.contents.header.size))


def _add_image_encoder(p: _Draft, c: _Chosen | None) -> None:
    """The CLIP vision encoder (`image_encoder`, transformers' layout read as it is) and its image processor
    (the pack's settings at the encoder's image size) of a model that reads the start image through one."""
    wants = bool(p.index().get("image_encoder", [None])[0])
    model = f"{p.configs.name or p.family.name} ('{p.main.path.name}')"
    if c is None:
        if wants:
            raise ModelError(f"clip_vision: {model} also reads the start image through a CLIP vision encoder; "
                             "choose clip_vision_h.safetensors (ComfyUI's models/clip_vision folder) in clip_vision.")
        return
    if not wants:
        raise ModelError(f"clip_vision: '{c.path.name}' was chosen, but {model} reads no CLIP vision encoder (Wan "
                         f"2.1 image to video does). Set clip_vision to '{NONE}'.")
    part = c.contents.image_encoder
    if part is None:
        raise ModelError(_not_a(c, "CLIP vision encoder", "clip_vision_h.safetensors (models/clip_vision)"))
    reads = p.overrides.get(p.family.denoiser, {}).get("image_dim")
    if part.width != reads:
        raise ModelError(f"clip_vision: '{c.path.name}' is a CLIP vision encoder {part.width} wide; {model} reads "
                         f"{reads}-wide image features. Choose clip_vision_h.safetensors (ViT-H, 1280 wide).")
    _unsupported_quant(c)
    p.override("image_encoder", image_encoders.sizes(part.shapes, read_json(p.folder / "image_encoder" / "config.json")))
    p.override("image_processor", image_encoders.processor_sizes(part.shapes))
    p.parts.append(FileComponent("image_encoder", str(c.path), "hf", "", _quant(c.contents.header),
                                 c.contents.header.size))


def _add_text_encoder(p: _Draft, name: str, kind: str) -> None:
    """Text encoder `name` (a pipeline component) of kind `kind`, and its tokenizer."""
    tok_name = name.replace("text_encoder", "tokenizer")
    if kind not in p.texts:  # optional (SD3 without T5)
        p.override("", {name: [None, None], tok_name: [None, None]})
        p.notes.append(f"no {short_name(kind)} text encoder: {name} is left out")
        return
    part, c = p.texts[kind]
    published = read_json(p.folder / name / "config.json")
    sizes = text_encoders.sizes(kind, part.shapes, published)
    p.override(name, sizes)
    header = c.contents.header
    _unsupported_quant(c)
    p.parts.append(_tokenizer(tok_name, kind, c))
    if c.input == "checkpoint" and not p.family.single_file:
        raise ModelError(f"checkpoint: '{c.path.name}' holds {p.family.name} text encoders; diffusers "
                         f"reads all-in-one files of {families.single_file_names()} only. Choose its parts "
                         "(diffusion model, text encoders, VAE) as separate files instead.")
    layout = text_encoders.layout(kind, part.shapes, sizes, published)
    if layout == "hf-no-final-norm":
        p.notes.append(f"{c.path.name}: {sizes['num_hidden_layers']} of {short_name(kind)}'s {published['num_hidden_layers']} "
                       "layers, read without the final norm as ComfyUI does")  # the one pruned text encoder
    quant = _quant(header, part.prefix)
    if layout == "openclip" and quant:
        raise ModelError(f"checkpoint: '{c.path.name}' holds a scaled-fp8 OpenCLIP text encoder, which "
                         "ComfyUI-TPU cannot read; use a checkpoint with plain weights.")
    p.parts.append(FileComponent(name, str(c.path), layout, part.prefix, quant, header.size))


def _tokenizer(tok_name: str, kind: str, c: _Chosen) -> FileComponent:
    """ComfyUI's bundled tokenizer for a text encoder kind; Mistral's and UMT5's from the file itself."""
    folder, tensor = text_encoders.KINDS[kind].tokenizer, text_encoders.KINDS[kind].tokenizer_tensor
    if tensor:
        if tensor not in c.contents.header.shapes:
            raise ModelError(f"{c.input}: '{c.path.name}' carries no tokenizer (the '{tensor}' tensor that "
                             f"Comfy-Org's {short_name(kind)} files hold); use one of those files.")
        layout = text_encoders.KINDS[kind].tokenizer_layout or text_encoders.FILE_TOKENIZERS[tensor]
        return FileComponent(tok_name, str(c.path), layout)
    comfy = comfy_code.comfy_package_dir()
    if comfy is None:
        raise ModelError("ComfyUI's bundled tokenizers (its comfy package) were not found: files from "
                         "ComfyUI's folders are read inside ComfyUI.")
    return FileComponent(tok_name, str(comfy / folder), "tokenizer")


def _described(p: _Draft) -> tuple[str, str, FileSource]:
    denoiser = p.parts[0]
    if p.main.input == "checkpoint" and p.family.single_file:
        p.parts.append(FileComponent("checkpoint", str(p.main.path), "checkpoint", "", denoiser.quant,
                                     denoiser.size_bytes))
    if any(part.quant == "scaled-fp8" for part in p.parts):
        p.notes.append("scaled fp8 weights are dequantized once while loading")
    for path in dict.fromkeys(part.path for part in p.parts if part.quant == "comfy-quant"):  # each file once
        if (q := read_header(Path(path)).quantized) is not None:
            converted = all(part.layout in vaes.CONVERTED for part in p.parts if part.path == path)
            p.notes.append(f"{Path(path).name}: {q.loading_note(converted)}")
    overrides = {k: v for k, v in p.overrides.items() if v}
    source = FileSource(configs=p.configs.folder, components=tuple(p.parts),
                        overrides=json.dumps(overrides, sort_keys=True), notes=tuple(p.notes))
    return p.index()["_class_name"], str(p.main.path), source
