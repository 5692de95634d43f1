"""Sampling Options' sigmas: a noise schedule of the artist's own, as ComfyUI's ManualSigmas writes it (Qwen-Image
2.1 Turbo's templates: "1.0, 0.978453, ..., 0.414568, 0"), handed to the diffusers pipeline as its `sigmas=`
argument (controller side; no torch).

ComfyUI's list ends with the final sigma 0; diffusers' `sigmas` excludes it (the scheduler appends it), so a
trailing 0 is dropped and the steps are the sigmas left. The pipeline's scheduler treats them as its own
`set_timesteps(sigmas=...)` does (Qwen-Image 2.1 and Krea 2 still apply their timestep shift where their
scheduler config shifts: the same as plain diffusers called with these sigmas). LTX-2 runs them as given, as
ComfyUI's ManualSigmas does (Pipeline.sigmas_as_given: its scheduler without the dynamic shift, as diffusers' own
two-stage recipe runs stage 2; the shift by the token count would warp the templates' distilled schedule).
"""

from __future__ import annotations

import dataclasses
import math
import re

from .. import families
from ..protocol.errors import OptionError, SampleError
from ..protocol.spec import PipelineSpec, SampleRequest

MAX_SIGMAS = 1000  # more steps than any schedule an artist writes by hand


def parse(text: str) -> tuple[float, ...]:
    """The sigmas of Sampling Options' `sigmas` text (numbers separated by commas or spaces, as ManualSigmas takes
    them), the final 0 dropped; () for an empty text (the pipeline's own schedule). Raises an OptionError naming
    the input, the value and the fix."""
    parts = [p for p in re.split(r"[,\s]+", str(text).strip()) if p]
    if not parts:
        return ()
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise OptionError(f"sigmas: {text!r:.80} is not a list of numbers; write them as ComfyUI's ManualSigmas "
                          "does, e.g. '1.0, 0.9, 0.6, 0.3, 0', or leave it empty for the model's own "
                          "schedule.") from None
    if len(values) > 1 and values[-1] == 0:
        values = values[:-1]  # ComfyUI's final sigma: diffusers' scheduler appends it
    if not all(math.isfinite(v) and v > 0 for v in values):
        raise OptionError(f"sigmas: {text!r:.80} holds a value that is not a positive number (only the last may "
                          "be 0, ComfyUI's final sigma); fix the list or leave it empty.")
    if any(b >= a for a, b in zip(values[:-1], values[1:], strict=True)):
        raise OptionError(f"sigmas: {text!r:.80} does not fall from each value to the next; a noise schedule "
                          "starts high (1.0 for flow models) and falls to 0.")
    if len(values) > MAX_SIGMAS:
        raise OptionError(f"sigmas: {len(values)} values; at most {MAX_SIGMAS} (one per step).")
    return tuple(values)


def takes_them() -> str:
    """'Qwen-Image 2.1 and Krea 2': the pipelines whose call takes sigmas (Pipeline.sigmas_arg)."""
    return families.pipeline_names(lambda p: p.sigmas_arg)


def check(spec: PipelineSpec) -> None:
    """Sigmas only where the pipeline's call takes them."""
    if spec.sigmas and not spec.family.sigmas_arg:
        raise OptionError(f"sigmas: {spec.family.name} ('{spec.name}') takes no schedule of its own in diffusers' "
                          f"{spec.family.class_name}; sigmas work with {takes_them()}. Leave sigmas empty "
                          "(Sample's steps and scheduler set the schedule).")


def describe(spec: PipelineSpec) -> str:
    """What the sigmas do, for Sampling Options' text ('' without)."""
    if not spec.sigmas:
        return ""
    given = " (as given: its scheduler's shift off, as ComfyUI's ManualSigmas)" if spec.family.sigmas_as_given else ""
    return (f"sigmas: {len(spec.sigmas)} steps on your schedule ({', '.join(f'{s:g}' for s in spec.sigmas)}, then "
            f"0), handed to the pipeline as diffusers' sigmas{given}; Sample's steps follow it.")


def apply(spec: PipelineSpec, req: SampleRequest, starts_from_image: bool) -> tuple[SampleRequest, str]:
    """The request with its steps following the sigmas, and a note ('' when the spec has none); refuses what
    cannot take them (an image-to-image start, which cuts a schedule by strength)."""
    if not spec.sigmas:
        return req, ""
    check(spec)
    if starts_from_image:
        raise SampleError(f"denoise: {req.denoise:g} starts from an image or latent, which diffusers cuts from a "
                          "schedule by strength; Sampling Options' sigmas are a whole schedule. Set denoise to 1, "
                          "or leave sigmas empty.")
    note = (f"steps follow Sampling Options' sigmas: {len(spec.sigmas)}" + (f" (not {req.steps})"
                                                                            if req.steps != len(spec.sigmas) else ""))
    return dataclasses.replace(req, steps=len(spec.sigmas)), note
