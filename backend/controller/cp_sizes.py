"""Context Parallel's sequences for a request's size, and the check that each splits evenly over the context ranks
(TorchTPU's all-to-all takes equal splits only), before any worker starts. Controller side: reads configs, never
imports torch.

What is split comes from the pipeline's declaration (`Pipeline.cp_tokens`): image tokens, a video's latent frames
× the image's, and a video's sound (LTX-2's audio latents, split apart from the video's). A count that does not
split is refused naming the input that sets it (width/height and frames for the video; frames and frame_rate for
the sound) and the nearest values that split evenly, except a sequence the plan leaves whole on every rank where
it does not split (`Pipeline.cp_whole_if_uneven`: LTX-2's sound, odd at 25 fps), which `note` says for the
Sample. diffusers' plans pad nothing (their sharder asserts an even split); prompt-length text is padded in the
worker (`parallel.even_text`), where reference images' tokens are checked too.
"""

from __future__ import annotations

from collections.abc import Callable

from ..protocol.errors import ParallelError
from ..protocol.spec import PipelineSpec
from ..protocol.units import or_list
from . import sound_input

MAX_FRAME_RATE = 240  # Sample Video's frame_rate range (resolve._check_values): 1 to 240
SEARCH = 64  # how many steps either way the nearest even values are looked for


def cp_sequence(spec: PipelineSpec, width: int, height: int, frames: int = 0,
                frame_rate: float = 24.0) -> dict[str, int]:
    """The token counts Context Parallel splits for this size, by what they are, as the pipeline declares them
    (`Pipeline.cp_tokens`): the image's tokens, a video's (its latent frames × the image's), and any audio (the
    sound's latents for frames / frame_rate seconds, `sound_input.audio_latents`; LTX-2's is left whole where it
    does not split: `must_split`)."""
    family = spec.family
    latent_frames = (frames - 1) // family.frame_step + 1 if family.frame_step and frames else 1
    tokens = latent_frames * (width // spec.size_factor) * (height // spec.size_factor)
    if family.cp_tokens is not None:
        return dict(family.cp_tokens(frames, tokens, sound_input.audio_latents(spec, frames, frame_rate)))
    return {"video" if family.frame_step else "image": tokens}


def must_split(spec: PipelineSpec, width: int, height: int, frames: int = 0,
               frame_rate: float = 24.0) -> dict[str, int]:
    """`cp_sequence` less what the plan may leave whole on every rank (`Pipeline.cp_whole_if_uneven`): the
    sequences that must split evenly."""
    whole = spec.family.cp_whole_if_uneven
    return {what: t for what, t in cp_sequence(spec, width, height, frames, frame_rate).items() if what not in whole}


def note(spec: PipelineSpec, width: int, height: int, frames: int = 0, frame_rate: float = 24.0) -> str | None:
    """What Context Parallel leaves whole on every rank for this size, for the Sample's notes (LTX-2's sound where
    its audio latents do not split evenly: cp_whole_if_uneven); None where everything is split."""
    degree, whole = spec.cp_degree, spec.family.cp_whole_if_uneven
    uneven = [f"{t} {what} latents" for what, t in cp_sequence(spec, width, height, frames, frame_rate).items()
              if degree > 1 and what in whole and t % degree]
    if not uneven:
        return None
    return (f"Context Parallel {degree}: {frames} frames at {frame_rate:g} fps make {' and '.join(uneven)}, which "
            f"{degree} ranks cannot split evenly, so the sound runs whole on every rank (its attention repeated on "
            "each; the video's tokens are split); the result is the same as on one rank.")


def check_cp_size(spec: PipelineSpec, width: int, height: int, frames: int = 0, frame_rate: float = 24.0,
                  upscale: bool = False) -> None:
    """Every sequence Context Parallel must split (`must_split`) splits evenly over the context ranks, or a
    ParallelError names the input, the count and the nearest values at which every such sequence splits. With
    `upscale` (LTX-2's two stages, Sample Video's upscale_model) the first stage, at half the width and height, is
    checked too."""
    degree = spec.cp_degree
    if degree == 1:
        return
    halves = (2, 1) if upscale else (1,)  # the stages' sizes: the first at half the width and height

    def fits(w: int = width, h: int = height, n: int = frames, rate: float = frame_rate) -> bool:
        return all(t % degree == 0 for d in halves for t in must_split(spec, w // d, h // d, n, rate).values())

    for d in halves:
        for what, tokens in must_split(spec, width // d, height // d, frames, frame_rate).items():
            if tokens % degree:
                _refuse(spec, width, height, frames, frame_rate, what, tokens, d, fits)


def _refuse(spec: PipelineSpec, width: int, height: int, frames: int, frame_rate: float, what: str, tokens: int,
            half: int, fits: Callable[..., bool]) -> None:
    """The ParallelError for `tokens` of `what` that do not split, with the nearest values that do."""
    degree, f, step = spec.cp_degree, spec.size_factor, spec.family.frame_step
    near_frames = _nearest(lambda n: fits(n=n), frames, step, 1) if step and frames else []
    if what == "audio":  # the sound's latents: frames / frame_rate seconds of them
        rates = _nearest(lambda r: fits(rate=r), round(frame_rate), 1, 1, MAX_FRAME_RATE)
        fixes = ([f"frames {or_list(near_frames)} at {frame_rate:g} fps"] if near_frames else []) + (
            [f"frame_rate {or_list(rates)} at {frames} frames"] if rates else [])
        raise ParallelError(
            f"frames: {frames} frames at {frame_rate:g} fps make a sound of {tokens} audio latents (its tokens, "
            f"as many as the seconds take), which Context Parallel degree {degree} cannot split evenly; use "
            f"{' or '.join(fixes) or 'another frame count or frame rate'}, or another degree.")
    latent = f" × {(frames - 1) // step + 1} latent frames ((frames - 1)/{step} + 1)" if step and frames > 1 else ""
    stage = (f" (with upscale_model its first stage runs at {width // 2}x{height // 2}: (width/{2 * f}) × "
             f"(height/{2 * f}){latent} tokens)" if half == 2 else "")
    widths = _nearest(lambda w: fits(w=w), width, half * f, half * f)
    heights = _nearest(lambda h: fits(h=h), height, half * f, half * f)
    fixes = [f"width {or_list(widths)}" if widths else "", f"height {or_list(heights)}" if heights else "",
             f"frames {or_list(near_frames)}" if near_frames else ""]
    raise ParallelError(f"width/height: {width}x{height}{f' at {frames} frames' if frames else ''} makes "
                        f"{tokens} {what} tokens{stage}, which Context Parallel degree {degree} cannot split evenly; "
                        f"choose a size where (width/{half * f}) × (height/{half * f}){latent} is a multiple of "
                        f"{degree} (the nearest: {', '.join(x for x in fixes if x) or 'none near'}), or another "
                        "degree.")


def _nearest(fits: Callable[[int], bool], value: int, step: int, least: int, most: int | None = None) -> list[int]:
    """The nearest values below and above `value`, in steps of `step` within least..most, at which every sequence
    splits evenly (none either way where none does within SEARCH steps)."""
    found = []
    for sign in (-1, 1):
        for k in range(1, SEARCH + 1):
            v = value + sign * k * step
            if v < least or (most is not None and v > most):
                break
            if fits(v):
                found.append(v)
                break
    return found
