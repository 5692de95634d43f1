"""FLUX.1 Redux on a pipeline description (Apply Redux): the style model file (models/style_models) and the SigLIP
vision file (models/clip_vision) recognised from their headers (no weight is read), checked against the pipeline,
and added with the reference images. The worker runs diffusers' FluxPriorReduxPipeline with them and the loaded
text encoders, and hands its prompt_embeds and pooled_prompt_embeds to the pipeline (worker/redux.py).

The files are the ones ComfyUI's Load Style Model and Load CLIP Vision read: flux1-redux-dev.safetensors holds
diffusers' ReduxImageEncoder keys as they are (redux_up, redux_down); sigclip_vision_patch14_384.safetensors holds
transformers' SiglipVisionModel keys (vision_model.*; the attention-pooling head, if present, is not used).
Their sizes come from the tensors (families/image_encoders.py reads the SigLIP's); what no tensor holds (the head
count) from the published config, as for the other files.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..families import PIPELINES, config_dir, family_of, image_encoders
from ..families.flux1 import REDUX_CONFIGS
from ..protocol.errors import ModelError
from ..protocol.spec import PipelineSpec, ReduxRef, read_json, redux_key
from .files import headers
from .images import checked_image

MAX_SCALE = 10.0  # the range of ComfyUI's Apply Style Model strength
TEXT_CHOICES = ("prompt and image", "image only")  # Apply Redux's text: Sample's prompt with the images, or none
REDUX_TOKENS = "redux_down.weight"


def _published(part: str) -> dict:
    return read_json(config_dir(REDUX_CONFIGS) / part / "config.json")


def _safetensors(path: str, input_name: str, folder: str) -> headers.Header:
    p = Path(path)
    if not p.is_file():
        raise ModelError(f"{input_name}: '{p.name}' was not found ({path}). Put it in ComfyUI's models/{folder} "
                         "folder and pick it from the list (press R to refresh it).")
    if p.suffix not in headers.SAFETENSORS:
        raise ModelError(f"{input_name}: '{p.name}' is not a .safetensors file; pickle files can run code when "
                         "loaded and are refused. Use the .safetensors version.")
    return headers.read_header(p, input_name)


def embedder_config(path: str) -> dict:
    """ReduxImageEncoder's config from a style model file's shapes; raises ModelError naming the input and fix."""
    shapes = _safetensors(path, "style_model_name", "style_models").shapes
    name = Path(path).name
    if REDUX_TOKENS not in shapes or "redux_up.weight" not in shapes:
        if "style_embedding" in shapes:
            what = "a T2I-Adapter style model (SD1.5), not FLUX.1 Redux"
        elif image_encoders.recognise(shapes):
            what = "a vision model: it goes in clip_vision_name"
        else:
            what = f"not a FLUX.1 Redux style model ({len(shapes)} tensors, no redux_up / redux_down)"
        raise ModelError(f"style_model_name: '{name}' is {what}. Pick FLUX.1 Redux's style model "
                         "(flux1-redux-dev.safetensors in ComfyUI's models/style_models).")
    return {"redux_dim": shapes["redux_up.weight"][1], "txt_in_features": shapes[REDUX_TOKENS][0]}


def vision_config(path: str) -> dict:
    """SiglipVisionConfig's sizes from a SigLIP vision file's shapes (the head count from the published config
    where it divides the width); raises ModelError naming the input and the fix."""
    header = _safetensors(path, "clip_vision_name", "clip_vision")
    shapes, name = header.shapes, Path(path).name
    fix = ("Pick the SigLIP vision model FLUX.1 Redux was trained with (sigclip_vision_patch14_384.safetensors in "
           "ComfyUI's models/clip_vision).")
    if not image_encoders.recognise(shapes):
        what = ("a FLUX.1 Redux style model: it goes in style_model_name" if REDUX_TOKENS in shapes else
                "an OpenCLIP vision model" if any(k.startswith("visual.") for k in shapes) else
                f"not a vision model ComfyUI's Load CLIP Vision reads ({len(shapes)} tensors)")
        raise ModelError(f"clip_vision_name: '{name}' is {what}. {fix}")
    if not image_encoders.is_siglip(shapes):
        raise ModelError(f"clip_vision_name: '{name}' is a CLIP ViT vision model (CLIP Vision G, H or L), not SigLIP. "
                         f"{fix}")
    published = _published("image_encoder")
    sizes, size = image_encoders.siglip_sizes(shapes, published), published["image_size"]
    if sizes["image_size"] != size:  # the image processor makes `size`-pixel images
        raise ModelError(f"clip_vision_name: '{name}' is a SigLIP for {sizes['image_size']}-pixel images; FLUX.1 "
                         f"Redux reads {size}-pixel ones (its image processor's size). {fix}")
    return sizes


def add(spec: PipelineSpec, style_model: str, clip_vision: str, image: np.ndarray, prompt_embeds_scale: float = 1.0,
        pooled_prompt_embeds_scale: float = 1.0, text: str = TEXT_CHOICES[0]) -> tuple[PipelineSpec, str]:
    """`spec` with one more Redux reference, checked; and what Redux does, for the node's text. Never reloads the
    model: the worker loads the image encoder and embedder beside it."""
    if text not in TEXT_CHOICES:
        raise ModelError(f"text: '{text}' is not one of {', '.join(TEXT_CHOICES)}.")
    style, vision = str(Path(style_model).resolve()), str(Path(clip_vision).resolve())
    _check_family(spec, Path(style).name)
    ref = ReduxRef(style_model=style, clip_vision=vision, vision_config=json.dumps(vision_config(vision)),
                   embedder_config=json.dumps(embedder_config(style)), prompt_embeds_scale=prompt_embeds_scale,
                   pooled_prompt_embeds_scale=pooled_prompt_embeds_scale, text=text == TEXT_CHOICES[0],
                   size_bytes=sum(Path(p).stat().st_size for p in (style, vision)),
                   image=checked_image(image, "image"))
    spec = spec.with_changes(redux=(*spec.redux, ref))
    check(spec, ref)
    return spec, describe(spec)


def describe(spec: PipelineSpec) -> str:
    refs = spec.redux
    references = sum(len(r.image) for r in refs if r.image is not None)
    lines = [f"{i}. {r.name} + {Path(r.clip_vision).name}: {len(r.image) if r.image is not None else 0} image(s), "
             f"prompt_embeds_scale {r.prompt_embeds_scale:g}, pooled_prompt_embeds_scale "
             f"{r.pooled_prompt_embeds_scale:g}" for i, r in enumerate(refs, 1)]
    text = ("the prompt's tokens (Sample's prompt or positive) followed by each reference's image tokens" if refs[0].text
            else "zeros for the prompt's tokens (Sample's prompt is not used) followed by each reference's image "
                 "tokens")
    summed = (f"; the {references} references are summed, each with its scales, as FluxPriorReduxPipeline sums a list "
              "of images (the prompt's tokens count once per image)") if references > 1 else ""
    return ("FLUX.1 Redux: Sample's prompt embeddings are FluxPriorReduxPipeline's: " + text + summed +
            ". Each reference is stretched to 384x384 (diffusers' SiglipImageProcessor).\n" + "\n".join(lines))


def _check_family(spec: PipelineSpec, name: str) -> None:
    if not spec.family.redux:
        takes = ", ".join(dict.fromkeys(p.name for p in PIPELINES.values() if p.redux))
        raise ModelError(f"style_model_name: '{name}' is FLUX.1 Redux, which conditions FLUX.1 ({takes}); this "
                         f"pipeline is {spec.family.name} ('{spec.name}'). Load a FLUX.1 model, or remove Apply Redux.")


def check(spec: PipelineSpec, ref: ReduxRef) -> None:
    """A Redux reference this pipeline can run with these settings; raises ModelError naming the input and fix."""
    name = ref.name
    _check_family(spec, name)
    embedder, vision = json.loads(ref.embedder_config), json.loads(ref.vision_config)
    den = spec.component_config(family_of(spec.family).denoiser)
    if embedder["txt_in_features"] != den.get("joint_attention_dim"):
        raise ModelError(f"style_model_name: '{name}' makes tokens {embedder['txt_in_features']} wide, and "
                         f"'{spec.name}' reads text tokens {den.get('joint_attention_dim')} wide: pick the Redux model "
                         "made for this FLUX.1 model.")
    if embedder["redux_dim"] != vision["hidden_size"]:
        raise ModelError(f"clip_vision_name: '{Path(ref.clip_vision).name}' gives features {vision['hidden_size']} "
                         f"wide, and '{name}' reads {embedder['redux_dim']}: pick the SigLIP vision model Redux was "
                         "made with (sigclip_vision_patch14_384.safetensors).")
    for scale in ("prompt_embeds_scale", "pooled_prompt_embeds_scale"):
        value = getattr(ref, scale)
        if not (math.isfinite(value) and 0 <= value <= MAX_SCALE):
            raise ModelError(f"{scale}: {value} is not between 0 and {MAX_SCALE:g} ('{name}'); 1 uses the "
                             "reference as diffusers does by default, 0 leaves it out.")
    first = spec.redux[0]
    if (first.style_model, first.clip_vision, first.text) != (ref.style_model, ref.clip_vision, ref.text):
        raise ModelError(f"style_model_name, clip_vision_name, text: chained Apply Redux nodes run as one "
                         f"FluxPriorReduxPipeline call, so they take the same files and text ('{first.name}', "
                         f"'{Path(first.clip_vision).name}', text '{TEXT_CHOICES[0] if first.text else TEXT_CHOICES[1]}'); set them "
                         "alike, or put the images in one batch (Batch Images).")
    if spec.cp_degree > 1:
        raise ModelError(f"style_model_name: '{name}' cannot run under Context Parallel: the Redux tokens make the "
                         "text 512 + 729 tokens, which do not split evenly over the ranks. Remove Context Parallel "
                         "(Shard TP and Data Parallel work with Redux).")


def arrays(spec: PipelineSpec) -> dict[str, np.ndarray]:
    """The reference images as the workers take them, by `redux_key`."""
    return {redux_key(i): r.image for i, r in enumerate(spec.redux)}


def weight_bytes(spec: PipelineSpec, float_bytes: int) -> dict[str, int]:
    """What the image encoder and embedder take once loaded (offload 'auto'), from their headers."""
    if not spec.redux:
        return {}
    ref = spec.redux[0]  # chained references share the files (check)
    try:
        return {"redux": sum(headers.read_header(Path(p), "style_model_name").loaded_bytes(float_bytes)
                             for p in (ref.style_model, ref.clip_vision))}
    except ModelError:
        return {"redux": ref.size_bytes}
