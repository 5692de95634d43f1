"""Sample's image inputs, checked and described before any worker sees them (controller side).

An image alone means image-to-image (or reference images, for FLUX.2 and Qwen-Image-Edit); an image and a mask
mean inpainting (mask 1 = repaint, as ComfyUI's MASK). The worker fits the pixels (`worker.images`); here the
inputs are checked against the model and the request, and the user is told what will happen to them: an image
of another size is stretched to width × height (never cropped), a grey image is used as RGB, and image i of the
run takes input image i (the inputs cycle when there are fewer). On Sample Video the image is the start frame of
each video (image to video). Numpy only: no torch in ComfyUI's process.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .. import families
from ..protocol.errors import ModelError
from ..protocol.spec import PipelineSpec, SampleRequest

MIN_REFERENCE_SIDE = 64  # FLUX.2 refuses smaller reference images


def as_arrays(spec: PipelineSpec, req: SampleRequest, image: np.ndarray | None,
              mask: np.ndarray | None, end_image: np.ndarray | None = None,
              references: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The inputs as the worker takes them (image [B, H, W, C] float32, mask [B, H, W] float32), checked against
    the model and the request; raises ModelError naming the input and the fix. Sample Video's end image and
    reference images (MiniMax H3) travel as "last_image" and "references"."""
    family = spec.family
    if not (math.isfinite(req.denoise) and 0 <= req.denoise <= 1):
        raise ModelError(f"denoise: {req.denoise} is not between 0 and 1; use 1 to repaint the whole image, lower "
                         "to keep more of it.")
    if family.frame_step:
        return {**_start_image(spec, image, mask), **_video_images(spec, image, end_image, references)}
    if image is None:
        if mask is not None:
            raise ModelError("mask: a mask needs the image it belongs to; connect that image to Sample's image "
                             "input too (Load Image gives both).")
        if family.control_image:
            raise ModelError(f"image: '{spec.name}' is a {family.name} model: it follows the structure of a control "
                             "image and cannot run without one. Connect a depth map or an edge image (ComfyUI's "
                             "Canny node on Load Image, or a depth preprocessor) to Sample's image.")
        if family.needs_mask:
            raise ModelError(f"image: '{spec.name}' is {family.name}, an inpainting model: it repaints the masked part "
                             "of an image. Connect the image and its mask to Sample (Load Image after the mask "
                             "editor; to outpaint, Pad Image for Outpainting).")
        if family.needs_image:
            raise ModelError(f"image: '{spec.name}' is an edit model ({family.name}): it changes an image and "
                             "cannot make one from text alone. Connect an image (Load Image) to Sample's image.")
        return {}
    if family.no_image:
        raise ModelError(f"image: '{spec.name}' is {family.name} ({spec.class_name}), which takes no input image: "
                         f"{family.no_image}. Disconnect the image (and any mask) from Sample.")
    image = checked_image(image)
    arrays = {"image": image}
    if mask is None and family.needs_mask:
        raise ModelError(f"mask: '{spec.name}' is {family.name}, an inpainting model: it repaints the white part of "
                         "a mask and needs one beside the image. Connect a mask (Load Image's mask after the mask "
                         "editor; to outpaint, Pad Image for Outpainting gives the padded image and its mask).")
    if mask is not None and family.control_image:
        raise ModelError(f"mask: {family.name} ('{spec.name}') takes Sample's image as its control image and cannot "
                         "inpaint; disconnect the mask (or use FLUX.1 Fill to repaint a masked part).")
    if mask is not None:
        if family.inpaint is None:
            raise ModelError(f"mask: {family.name} ('{spec.name}', {spec.class_name}) has no inpainting pipeline in "
                             "diffusers; disconnect the mask (the image is then used as a reference), or use a "
                             f"model that can inpaint ({families.inpainting_names(' or ')}).")
        arrays["mask"] = _mask(mask)
    elif family.img2img is None:  # the image is a reference, or the control image
        if req.denoise != 1:
            what = "its control image" if family.control_image else "a reference"
            raise ModelError(f"denoise: {family.name} takes the image as {what}, not as a start to repaint, so "
                             f"denoise does not apply; set denoise to 1 (it is {req.denoise}).")
        if family.control_image:
            return arrays
        if family.max_references and len(image) > family.max_references:
            raise ModelError(f"image: {len(image)} reference images; {family.name} takes at most "
                             f"{family.max_references}. Batch fewer (Image Batch of at most {family.max_references}).")
        small = [f"{w}x{h}" for h, w in {i.shape[:2] for i in image} if min(h, w) < MIN_REFERENCE_SIDE]
        if small:
            raise ModelError(f"image: reference images must be at least {MIN_REFERENCE_SIDE} pixels on each side; "
                             f"this one is {small[0]}. Scale it up first (Upscale Image).")
    return arrays


def _start_image(spec: PipelineSpec, image: np.ndarray | None, mask: np.ndarray | None) -> dict[str, np.ndarray]:
    """Sample Video's start image: needed by image-to-video models, refused by text-to-video ones."""
    family = spec.family
    if mask is not None:
        raise ModelError("mask: Sample Video takes no mask; disconnect it (a start image alone makes image to "
                         "video).")
    if image is None:
        if family.needs_image:
            raise ModelError(f"start_image: '{spec.name}' is an image-to-video model ({family.name}, "
                             f"{spec.class_name}): it makes a video from a start image. Connect one (Load Image) "
                             "to Sample Video's start_image.")
        return {}
    if not spec.start_image:
        raise ModelError(f"start_image: '{spec.name}' ({family.name}, {spec.class_name}) makes video from text "
                         "only. Disconnect the start image, or load an image-to-video model in Load TPU Pipeline "
                         "(Wan 2.2 TI2V 5B, Wan 2.2 I2V A14B's two experts, or a Wan 2.1 I2V folder).")
    return {"image": checked_image(image, "start_image")}


def _video_images(spec: PipelineSpec, image: np.ndarray | None, end_image: np.ndarray | None,
                  references: np.ndarray | None) -> dict[str, np.ndarray]:
    """Sample Video's end image and reference images, for the models that take them (MiniMax H3)."""
    family, arrays = spec.family, {}
    _files_task(spec, references)
    if end_image is not None:
        if not family.end_image:
            raise ModelError(f"end_image: '{spec.name}' ({family.name}, {spec.class_name}) takes no end image; "
                             "disconnect it, or load a model that ends on a given frame "
                             f"({families.family_names(lambda p: p.end_image)}).")
        arrays["last_image"] = checked_image(end_image, "end_image")
    if references is not None:
        if not family.video_references:
            raise ModelError(f"reference_images: '{spec.name}' ({family.name}, {spec.class_name}) takes no reference "
                             "images; disconnect them, or load a model that does "
                             f"({families.family_names(lambda p: bool(p.video_references))}).")
        arrays["references"] = refs = checked_image(references, "reference_images")
        aspect = family.modular.reference_aspect if family.modular else 0.0
        if aspect and (wide := [f"{w}x{h}" for h, w in {r.shape[:2] for r in refs}
                                if max(w, h) > aspect * min(w, h)]):
            raise ModelError(f"reference_images: {', '.join(sorted(wide))}: {family.name} takes reference images "
                             f"whose sides differ by at most {aspect:g}:1 (its blocks refuse others). Crop it nearer a "
                             "square (ComfyUI's ImageCrop), or pad it.")
        if len(refs) > family.video_references:
            raise ModelError(f"reference_images: {len(refs)} images, and {family.name} takes at most "
                             f"{family.video_references}; batch fewer (Image Batch of at most "
                             f"{family.video_references}).")
        if image is not None or end_image is not None:
            raise ModelError(f"reference_images: {family.name} makes a video from reference images or from a "
                             "start / end image, not both at once; disconnect the start_image and end_image, or "
                             "the reference_images.")
    return arrays


def _files_task(spec: PipelineSpec, references: np.ndarray | None) -> None:
    """Refused before any worker: a request the files cannot run (the family's files_task: MiniMax H3's fl2va and
    ref2va transformer files each run their own tasks)."""
    check = families.family_of(spec.family).files_task if spec.source is not None else None
    why = check({c.name: Path(c.path).name for c in spec.source.components}, references is not None) if check else ""
    if why:
        raise ModelError(f"reference_images: {why}")


def starts_from_image(spec: PipelineSpec, arrays: dict[str, np.ndarray]) -> bool:
    """Whether the request runs the family's inpainting or image-to-image pipeline (made from the loaded one),
    rather than the loaded one (text to image, reference images)."""
    return "mask" in arrays or ("image" in arrays and spec.family.img2img is not None)


def checked_image(image: np.ndarray, name: str = "image") -> np.ndarray:
    """An IMAGE as float32 [B, H, W, C]; a ModelError naming input `name` when it is not one."""
    a = np.asarray(image)
    if a.ndim == 3:
        a = a[None]
    if a.ndim != 4 or a.shape[0] < 1 or a.shape[-1] not in (1, 3, 4) or min(a.shape[1:3]) < 1:
        raise ModelError(f"{name}: an IMAGE of shape {list(a.shape)} cannot be used; it must be [batch, height, "
                         "width, channels] with 1, 3 or 4 channels (connect Load Image or another IMAGE output).")
    a = np.ascontiguousarray(a, dtype=np.float32)
    if not np.isfinite(a).all():
        raise ModelError(f"{name}: the image holds values that are not numbers (NaN or infinity); check the nodes "
                         "that made it.")
    return a


def _mask(mask: np.ndarray) -> np.ndarray:
    m = np.asarray(mask)
    if m.ndim == 2:
        m = m[None]
    if m.ndim == 4 and m.shape[-1] == 1:
        m = m[..., 0]
    if m.ndim != 3 or m.shape[0] < 1 or min(m.shape[1:]) < 1:
        raise ModelError(f"mask: a MASK of shape {list(m.shape)} cannot be used; it must be [batch, height, width] "
                         "(connect Load Image's mask output or another MASK).")
    m = np.ascontiguousarray(m, dtype=np.float32)
    if not np.isfinite(m).all():
        raise ModelError("mask: the mask holds values that are not numbers (NaN or infinity); check the nodes "
                         "that made it.")
    return m


def size_from_image(spec: PipelineSpec, image: np.ndarray) -> tuple[int, int, str | None]:
    """(width, height) of the first input image, rounded down to the model's size factor; and a note when the
    image is not already such a size (it is then stretched by those few pixels)."""
    h, w = checked_image(image).shape[1:3]
    f = spec.size_factor
    width, height = max(f, w // f * f), max(f, h // f * f)
    if (width, height) == (w, h):
        return width, height, None
    return width, height, (f"size_from_image: the image is {w}x{h}; {spec.family.name} needs multiples of {f}, so "
                           f"the size is {width}x{height} (the image is stretched to it)")


def describe(spec: PipelineSpec, req: SampleRequest, arrays: dict[str, np.ndarray]) -> list[str]:
    """What will happen to the inputs, in words, for the text next to Sample."""
    notes = _video_notes(spec, arrays)
    if "image" not in arrays:
        ignored = [f"denoise {req.denoise:g} is ignored: it applies to an input image or latent, and none is "
                   "connected"] if req.denoise != 1 else []
        return notes + ignored
    family, image = spec.family, arrays["image"]
    count, inputs = len(req.images()), len(image)
    if spec.start_image:
        sizes = ", ".join(sorted({f"{i.shape[1]}x{i.shape[0]}" for i in image}))
        notes.append(f"image to video: the start image ({sizes}) is the first frame, stretched to "
                     f"{req.width}x{req.height} where it differs")
        if inputs > 1 or count > inputs:
            notes.append(f"{inputs} start image{'s' if inputs > 1 else ''} for {count} video{'s' if count > 1 else ''}"
                         f": video i (seed + i) starts from image i" + (f" (cycling: i mod {inputs})"
                                                                       if count > inputs else ""))
    elif family.control_image:
        sizes = {(i.shape[1], i.shape[0]) for i in image}
        notes.append(f"control image{'s' if inputs > 1 else ''} ({inputs}) for {family.name}: the output follows "
                     "its structure" + "".join(f"; {w}x{h} stretched to {req.width}x{req.height}"
                                               for w, h in sorted(sizes) if (w, h) != (req.width, req.height)))
    elif "mask" not in arrays and family.img2img is None:
        sizes = ", ".join(sorted({f"{i.shape[1]}x{i.shape[0]}" for i in image}))
        notes.append(f"reference image{'s' if inputs > 1 else ''} ({inputs}, {sizes}) given to {family.name} with "
                     f"every image it makes; the output is {req.width}x{req.height}")
        if family.image_note:
            notes.append(family.image_note)
    else:
        what = "inpainting (mask: white = repaint)" if "mask" in arrays else "image to image"
        notes.append(f"{what}, denoise {req.denoise:g}: {req.steps} steps of a {_total(req)}-step schedule"
                     if 0 < req.denoise < 1 else f"{what}, denoise {req.denoise:g}")
        if req.denoise == 0:
            notes.append("denoise 0: nothing is repainted; the input image comes back as it is (at the size asked)")
        sizes = {(i.shape[1], i.shape[0]) for i in image}
        for w, h in sorted(sizes):
            if (w, h) != (req.width, req.height):
                notes.append(f"image {w}x{h} stretched to {req.width}x{req.height} (Sample's width and height); turn "
                             "on size_from_image to keep the image's size")
        if "mask" in arrays:
            for mh, mw in sorted({m.shape for m in arrays["mask"]}):
                if (mw, mh) not in sizes:
                    notes.append(f"mask {mw}x{mh} is not the image's size: stretched to {req.width}x{req.height} "
                                 "like the image")
        if inputs > 1 or count > inputs:
            notes.append(f"{inputs} input image{'s' if inputs > 1 else ''} for {count} image{'s' if count > 1 else ''}:"
                         f" image i (seed + i) starts from input image i"
                         + (f" (cycling: i mod {inputs})" if count > inputs else ""))
    channels = image.shape[-1]
    if channels == 1:
        notes.append("the image has one channel (grey): used as RGB")
    elif channels == 4:
        notes.append("the image has an alpha channel: it is ignored")
    return notes


def _video_notes(spec: PipelineSpec, arrays: dict[str, np.ndarray]) -> list[str]:
    """What a video model does with the end image and reference images, in words."""
    notes = []
    if "last_image" in arrays:
        sizes = ", ".join(sorted({f"{i.shape[1]}x{i.shape[0]}" for i in arrays["last_image"]}))
        notes.append(f"end image ({sizes}): the last frame of each video ({spec.family.name} crops it to the "
                     "video's aspect, without stretching)")
    if "references" in arrays:
        refs = arrays["references"]
        sizes = ", ".join(sorted({f"{i.shape[1]}x{i.shape[0]}" for i in refs}))
        notes.append(f"reference images ({len(refs)}, {sizes}), in batch order, given to {spec.family.name} with "
                     "every video (the prompt can name them: <Picture 1>, <Picture 2>, ...)")
    return notes


def _total(req: SampleRequest) -> int:
    return int(req.steps / req.denoise)
