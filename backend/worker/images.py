"""Sample's image inputs (worker side): image-to-image, inpainting and reference images.

Each uses the family's own diffusers pipeline made from the loaded one with `from_pipe` (the same modules:
nothing is copied or reloaded, LoRAs and compiled graphs carry over), cached per loaded pipeline. The controller
has checked the inputs and told the user what happens to them (`controller.images`); here the pixels are fitted
to the size being made (stretched, never cropped) and handed to the pipeline.

Denoise works as in ComfyUI: `steps` steps run, over the last part of a schedule of int(steps / denoise) steps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from ..families import Pipeline, vaes
from ..protocol.errors import Interrupted
from ..protocol.spec import PipelineSpec, SampleRequest
from .latents import PLAUSIBLE, _replaced

# LATENT: image to image from a LATENT (Sample's latent input below denoise 1), run by the image-to-image pipeline
TEXT, IMG2IMG, INPAINT, REFERENCE, START, LATENT = "text", "img2img", "inpaint", "reference", "start", "latent"
CONTROL = "control"  # Sample's image as the control image (FLUX.1 Depth/Canny)
AUDIO = "audio"  # Sample Video's AUDIO kept as the video's sound, with any start image (worker/sound.py)


def task(family: Pipeline, arrays: dict, denoise: float = 1.0) -> str:
    """What the request's inputs ask of this family (the controller has checked that it can). A latent at denoise
    1 only sets the size: text to image, as KSampler's pure-noise start on flow models."""
    if "latent" in arrays:
        return LATENT if denoise < 1 else TEXT
    if "audio" in arrays:  # the controller has checked that this model takes one (Pipeline.audio_via)
        return AUDIO
    if "references" in arrays:  # Sample Video's reference images (MiniMax H3's ref2va)
        return REFERENCE
    if "last_image" in arrays:  # an end frame, with or without a start one (MiniMax H3's fl2va)
        return START
    if "image" not in arrays:
        return TEXT
    if family.start_image or family.start_image_via:  # the controller has checked this model takes one
        return START
    if "mask" in arrays:
        return INPAINT
    if family.control_image:
        return CONTROL
    return IMG2IMG if family.img2img else REFERENCE


def schedule(steps: int, denoise: float, strength_floor: bool) -> tuple[int, float]:
    """(num_inference_steps, strength) that run exactly `steps` steps at the end of ComfyUI's schedule of
    int(steps / denoise) steps. diffusers rounds N · strength one way or the other depending on the pipeline,
    so the strength is set half a step inside the bracket both roundings agree on (`strength_floor`: the
    family's pipelines round down, Pipeline.strength_floor)."""
    total = int(steps / denoise)
    if denoise >= 1 or total <= steps:
        return steps, 1.0
    nudge = 0.5 if strength_floor else -0.5
    return total, (steps + nudge) / total


def fit(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """One IMAGE [H, W, C] as float32 RGB [height, width, 3]: grey expanded, alpha dropped, and stretched to the
    size (bilinear, antialiased) when it differs. Never cropped."""
    t = torch.from_numpy(np.ascontiguousarray(image, dtype=np.float32)).permute(2, 0, 1)[None]
    t = t.expand(-1, 3, -1, -1) if t.shape[1] == 1 else t[:, :3]
    if t.shape[2:] != (height, width):
        t = torch.nn.functional.interpolate(t, size=(height, width), mode="bilinear", antialias=True,
                                            align_corners=False).clamp(0, 1)
    return t[0].permute(1, 2, 0).contiguous().numpy()


def fit_mask(mask: np.ndarray, width: int, height: int) -> np.ndarray:
    """One MASK [H, W] (1 = repaint) as float32 [height, width], stretched like the image."""
    t = torch.from_numpy(np.ascontiguousarray(mask, dtype=np.float32))[None, None]
    if t.shape[2:] != (height, width):
        t = torch.nn.functional.interpolate(t, size=(height, width), mode="bilinear", antialias=True,
                                            align_corners=False).clamp(0, 1)
    return t[0, 0].numpy()


def pil(image: np.ndarray) -> Any:
    """One IMAGE [H, W, C] as an RGB PIL image (rounded to 8 bits), for the pipelines that take PIL images."""
    import PIL.Image

    rgb = fit(image, image.shape[1], image.shape[0])
    return PIL.Image.fromarray((rgb * 255).round().astype(np.uint8))


class ImagePipelines:
    """The image pipelines made from one loaded pipeline (with from_pipe), cached until it is unloaded."""

    def __init__(self, status: Callable[[str], None] = print):
        self.status = status
        self.pipe: Any = None
        self.derived: dict[str, Any] = {}

    def forget(self) -> None:
        self.pipe, self.derived = None, {}

    def for_task(self, pipe: Any, family: Pipeline, kind: str) -> Any:
        """The pipeline that runs `kind` (the loaded one for text and reference images)."""
        if pipe is not self.pipe:
            self.forget()
            self.pipe = pipe
        if family.modular is not None:  # a modular pipeline's blocks pick the workflow on the inputs
            from .modular import for_task

            return for_task(pipe, family, kind, self.status)
        name = {IMG2IMG: family.img2img, LATENT: family.img2img, INPAINT: family.inpaint,
                START: family.start_image_via, AUDIO: family.audio_via}.get(kind)
        if not name or name == family.class_name:  # the loaded one takes them itself (FLUX.1 Fill)
            return pipe
        if name not in self.derived:
            self.derived[name] = derive(pipe, name)
        return self.derived[name]


def derive(pipe: Any, name: str, **extra: Any) -> Any:
    """diffusers' pipeline class `name` made from `pipe` with from_pipe (its modules shared, none copied), plus
    `extra` components (a ControlNet)."""
    import diffusers

    # dtype: from_pipe casts every shared module to it (float32 when not given). The modules are passed by name:
    # from_pipe shares a model only when its type is exactly the one the new class names, and CFG Parallel makes
    # the denoiser an instance of a subclass
    target = getattr(diffusers, name)
    expected, _ = target._get_signature_keys(target)
    shared = {k: v for k, v in pipe.components.items() if k in expected and v is not None}
    derived = target.from_pipe(pipe, dtype=pipe.dtype, **{**shared, **extra})
    derived.set_progress_bar_config(disable=True)
    return derived


def add_inputs(pipe: Any, family: Pipeline, kind: str, kwargs: dict, arrays: dict, index: int, req: SampleRequest) -> None:
    """Puts image `index`'s inputs into the call (image i of the batch goes with image i of the run, cycling),
    at the size the call makes (after any snapping to a compiled size), and drops the size arguments the
    pipeline does not take (SDXL's image-to-image keeps the image's size; Z-Image's ControlNet inpainting makes
    the whole image, checked to be at denoise 1)."""
    from .modular import parameters

    params = parameters(pipe, family)
    width, height = kwargs["width"], kwargs["height"]
    images = arrays.get("image")
    if kind == LATENT:  # the image its VAE encodes: the LATENT comes back instead (worker/latents.py)
        kwargs["image"] = np.full((1, height, width, 3), 0.5, np.float32)
    if kind in (IMG2IMG, INPAINT):
        kwargs["image"] = fit(images[index % len(images)], width, height)[None]
    if kind in (IMG2IMG, INPAINT, LATENT):
        steps, strength = schedule(req.steps, req.denoise, family.strength_floor)
        kwargs["num_inference_steps"], kwargs["strength"] = steps, strength
    if kind == INPAINT:
        masks = arrays["mask"]
        kwargs["mask_image"] = fit_mask(masks[index % len(masks)], width, height)[None, :, :, None]
    if kind == CONTROL:
        kwargs["control_image"] = fit(images[index % len(images)], width, height)[None]
    if "max_area" in params:  # Kontext makes max_area pixels at the aspect of width × height: Sample's size
        kwargs["max_area"] = width * height
    if kind == START and images is not None:  # the first frame, at its size (CLIP vision sees its centre square)
        kwargs["image"] = pil(fit(images[index % len(images)], width, height))
    if kind == START and "last_image" in arrays:  # the last frame, as it is: the pipeline fits it (MiniMax H3 crops)
        kwargs["last_image"] = pil(arrays["last_image"][index % len(arrays["last_image"])])
    if kind == REFERENCE and "references" in arrays:  # every reference image with every video, in batch order
        from .modular import audio_references, image_references

        # then the reference sounds (MiniMax H3: <Audio 1>, ...), as ComfyUI's node orders its sockets
        kwargs["references"] = (image_references(family, [pil(image) for image in arrays["references"]])
                                + audio_references(family, arrays.get("reference_audio", ())))
    elif kind == REFERENCE:
        if family.reference_mode == "kontext":
            kwargs["image"] = kontext_reference(pipe, pil(images[index % len(images)]))
        elif family.reference_mode == "one":
            kwargs["image"] = pil(images[index % len(images)])
        else:
            kwargs["image"] = [pil(image) for image in images]
    for name in ("width", "height", "strength"):  # Z-Image's ControlNet inpainting takes no strength (denoise 1)
        if name not in params:
            kwargs.pop(name, None)


def kontext_resolution(width: int, height: int) -> tuple[int, int]:
    """The Kontext resolution (width, height) nearest the picture's exact aspect ratio, as ComfyUI's
    FluxKontextImageScale picks it. FluxKontextPipeline picks from the sides rounded down to 16 first, so pictures
    of one aspect could get different resolutions (a compiled graph each), and one under 16 pixels fails."""
    from diffusers.pipelines.flux.pipeline_flux_kontext import PREFERRED_KONTEXT_RESOLUTIONS

    _, w, h = min((abs(width / height - w / h), w, h) for w, h in PREFERRED_KONTEXT_RESOLUTIONS)
    return w, h


def kontext_reference(pipe: Any, picture: Any) -> Any:
    """The reference resized by the pipeline's own resize (Lanczos, stretched) to `kontext_resolution`: the
    pipeline then picks that resolution itself and its resize changes nothing; where both picks agree (sides of
    16 or more, rounding that keeps the nearest aspect) the pixels are those of the pipeline given the picture."""
    width, height = kontext_resolution(*picture.size)
    return pipe.image_processor.resize(picture, height, width)


def input_latent(arrays: dict, index: int) -> np.ndarray:
    """Image `index`'s LATENT (the latent batch cycles, as input images do)."""
    latent = arrays["latent"]
    return latent[index % len(latent)]


def input_image(arrays: dict, index: int, width: int, height: int) -> np.ndarray:
    """Denoise 0: the input image itself (at the size asked), [1, height, width, 3]."""
    images = arrays["image"]
    return fit(images[index % len(images)], width, height)[None]


# Values no VAE latent nor text encoding holds (FLUX, SD3, SDXL, Wan latents stay within tens; text encoders' last
# hidden states within hundreds): a run that made NaN from inputs beyond them was overflowed by its inputs.
OUTSIZED = {"latent": PLAUSIBLE, "prompt_embeds": 1e4, "pooled_prompt_embeds": 1e4, "negative_prompt_embeds": 1e4,
            "negative_pooled_prompt_embeds": 1e4}
INPUT_OF = {"latent": "latent", "prompt_embeds": "positive", "pooled_prompt_embeds": "positive",
            "negative_prompt_embeds": "negative", "negative_pooled_prompt_embeds": "negative"}


def outsized(arrays: dict) -> dict[str, float]:
    """Sample's inputs (`latent`, `positive`, `negative`) holding values beyond OUTSIZED: each one's largest."""
    found: dict[str, float] = {}
    for key, limit in OUTSIZED.items():
        if key in arrays and np.asarray(arrays[key]).size:
            largest = float(np.abs(np.asarray(arrays[key], dtype=np.float64)).max())
            if largest > limit:
                name = INPUT_OF[key]
                found[name] = max(found.get(name, 0.0), largest)
    return found


@contextlib.contextmanager
def decode_progress(vae: Any, say: Callable[[str], None], stop: Callable[[], bool]) -> Iterator[None]:
    """A video VAE's decode in the block says how far it is and stops on Cancel between its pieces: Wan's VAE
    runs its decoder once per latent frame (4 frames), of each tile when tiled (diffusers' tiled_decode), so a
    pre-hook on the decoder sees each piece begin. Untiled, a 70 s decode would otherwise show nothing and keep
    Cancel waiting to its end."""
    state = {"frames": 1, "tiles": 1, "done": 0}

    def sized(name: str, tiled: bool) -> Callable[..., Any]:
        original = getattr(vae, name)

        def run(z: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            tiles = 1
            if tiled:
                ratio = vae.spatial_compression_ratio
                rows = -(-z.shape[-2] // max(1, vae.tile_sample_stride_height // ratio))
                tiles = rows * -(-z.shape[-1] // max(1, vae.tile_sample_stride_width // ratio))
            state.update(frames=z.shape[2], tiles=tiles, done=0)
            return original(z, *args, **kwargs)

        return run

    def before(module: Any, args: Any) -> None:
        if stop():
            raise Interrupted(Interrupted.DEFAULT)
        frames, tiles, done = state["frames"], state["tiles"], state["done"]
        state["done"] = done + 1
        if tiles > 1 and done % frames == 0:
            say(f"VAE: decoding tile {done // frames + 1}/{tiles}…")
        elif tiles == 1 and frames > 1:
            say(f"VAE: decoding latent frame {done + 1}/{frames}…")

    hook = vae.decoder.register_forward_pre_hook(before)
    try:
        with _replaced(vae, "tiled_decode", sized("tiled_decode", True)), _replaced(vae, "_decode", sized("_decode", False)):
            yield
    finally:
        hook.remove()


def tile_vae(vae: Any, tiled: bool, by_default: bool = False) -> None:
    """A video VAE decodes in diffusers' tiles when the controller says (controller.pixels.video_tiling) or where it
    tiles `by_default` as loaded (MiniMax H3's), and frame-wise too when asked where it would otherwise decode every
    frame at once (LTX-2's: use_framewise_decoding, tiles of vaes.frame_tile frames), so that its tiles do not each
    hold the whole video."""
    vae.enable_tiling() if tiled or by_default else vae.disable_tiling()
    if vaes.frame_tile({**vae.config, "_class_name": type(vae).__name__}) is not None:
        vae.use_framewise_decoding = tiled


def decode_note(spec: PipelineSpec, req: SampleRequest) -> str:
    """What a video's VAE decode is, said when its steps are done: it takes a while and no step counts it."""
    if not spec.family.frame_step:
        return ""
    tiles = " in tiles" if req.tiled_vae else ""
    sound = " and its sound (audio VAE and vocoder)" if spec.family.sound else ""
    return f"VAE: decoding the video's {req.frames} frames of {req.width}x{req.height}{tiles}{sound}…"


def pixels_of(result: Any, alpha: bool = False) -> np.ndarray:
    """A pipeline call's images [B, H, W, C], or its videos' frames one video after another [B·F, H, W, C]
    (ComfyUI's IMAGE batch, which its video nodes read), float32 in 0..1; RGB where the pipeline's images carry
    alpha too (Pipeline.alpha: ComfyUI's IMAGE has three channels)."""
    if hasattr(result, "frames"):
        frames = np.asarray(result.frames, dtype=np.float32)  # [B, F, H, W, C]
        return frames.reshape(-1, *frames.shape[2:])
    pixels = np.asarray(result.images, dtype=np.float32)
    return np.ascontiguousarray(pixels[..., :3]) if alpha else pixels


def joined(parts: list[np.ndarray]) -> np.ndarray:
    """The call's outputs as one contiguous array for the hand-off, copied only where there are several (one video
    is most calls: its 124 frames of float32 were copied once more for nothing, ~1 % of a small video's CPU)."""
    return np.ascontiguousarray(parts[0] if len(parts) == 1 else np.concatenate(parts))
