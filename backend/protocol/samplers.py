"""ComfyUI's sampler and scheduler names on Sample, mapped onto diffusers' own schedulers and their options.

Both sides read this table: the controller refuses a choice a pipeline cannot take before anything runs; the
worker builds the scheduler for one call (`diffusers.<class>.from_config(scheduler_config(...))`) without touching
the weights or the compiled denoiser. Pure data: no torch, no diffusers.

Two tables, chosen by the pipeline's own scheduler: flow-matching pipelines (FLUX.1, FLUX.2, SD3/3.5, Qwen-Image:
`FlowMatchEulerDiscreteScheduler`) take the flow variants, or the multistep solvers on flow sigmas with the
pipeline's own shift; noise-prediction pipelines (SDXL) take the classic schedulers; any other (Wan's UniPC on flow
sigmas) only `default`. What a pipeline does with its scheduler (passes sigmas of its own, hands it the generators)
is its family's (`families.base.Pipeline.sigmas`, `.seeded_steps`). A name maps to the diffusers
scheduler that implements the same method (the table in diffusers' scheduler docs for k-diffusion names). The
steps are diffusers' own: the pixels equal plain diffusers with that scheduler configured, not ComfyUI's KSampler
(whose step code and sigma tables differ in details).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..families.base import Pipeline
from .errors import InputError
from .spec import PipelineSpec, SampleRequest

DEFAULT = "default"  # the pipeline's own scheduler, as it ships


@dataclass(frozen=True)
class Method:
    """One ComfyUI sampler name as a diffusers scheduler class and the options that make it that method."""

    scheduler: str  # diffusers class name
    options: dict = field(default_factory=dict)
    stochastic: bool = False  # draws fresh noise at each step (reproducible only where the pipeline gives the
    #                            scheduler the call's generators: SDXL does, the flow pipelines do not)
    image_input: bool = True  # diffusers' image-to-image and inpainting pipelines can start with it (scale_noise)
    takes_sigmas: bool = True  # its set_timesteps takes the sigmas FLUX.1, FLUX.2 and Qwen-Image pass


# Classic schedules: a spacing of the timesteps (diffusers' names for ComfyUI's), or a sigma schedule.
_SPACING = {"normal": "linspace", "simple": "trailing", "sgm_uniform": "trailing", "ddim_uniform": "leading"}
_SIGMAS = {"karras": "use_karras_sigmas", "exponential": "use_exponential_sigmas", "beta": "use_beta_sigmas"}

# Which schedule options each class's constructor takes (tests/test_samplers.py holds this against the installed
# diffusers): "spacing" = timestep_spacing, "sigmas" = use_karras/exponential/beta_sigmas.
SCHEDULE_OPTIONS: dict[str, frozenset[str]] = {
    "EulerDiscreteScheduler": frozenset({"spacing", "sigmas"}),
    "EulerAncestralDiscreteScheduler": frozenset({"spacing"}),
    "HeunDiscreteScheduler": frozenset({"spacing", "sigmas"}),
    "KDPM2DiscreteScheduler": frozenset({"spacing", "sigmas"}),
    "KDPM2AncestralDiscreteScheduler": frozenset({"spacing", "sigmas"}),
    "LMSDiscreteScheduler": frozenset({"spacing", "sigmas"}),
    "DPMSolverMultistepScheduler": frozenset({"spacing", "sigmas"}),
    "DPMSolverSDEScheduler": frozenset({"spacing", "sigmas"}),
    "UniPCMultistepScheduler": frozenset({"spacing", "sigmas"}),
    "DEISMultistepScheduler": frozenset({"spacing", "sigmas"}),
    "DDIMScheduler": frozenset({"spacing"}),
    "DDPMScheduler": frozenset({"spacing"}),
    "LCMScheduler": frozenset({"spacing"}),
    "FlowMatchEulerDiscreteScheduler": frozenset({"sigmas"}),
    "FlowMatchHeunDiscreteScheduler": frozenset(),
    "FlowMatchLCMScheduler": frozenset({"sigmas"}),
}

_DPMPP = "DPMSolverMultistepScheduler"
# diffusers' UniPC bh1 gives NaN when it ends at sigma 0: it ends at the smallest training sigma instead
_BH1 = {"solver_type": "bh1", "final_sigmas_type": "sigma_min"}
CLASSIC: dict[str, Method] = {
    "euler": Method("EulerDiscreteScheduler"),
    "euler_ancestral": Method("EulerAncestralDiscreteScheduler", stochastic=True),
    "heun": Method("HeunDiscreteScheduler"),
    "dpm_2": Method("KDPM2DiscreteScheduler"),
    "dpm_2_ancestral": Method("KDPM2AncestralDiscreteScheduler", stochastic=True),
    "lms": Method("LMSDiscreteScheduler"),
    "dpmpp_sde": Method("DPMSolverSDEScheduler", stochastic=True),
    "dpmpp_2m": Method(_DPMPP, {"algorithm_type": "dpmsolver++", "solver_order": 2}),
    "dpmpp_2m_sde": Method(_DPMPP, {"algorithm_type": "sde-dpmsolver++", "solver_order": 2}, stochastic=True),
    "dpmpp_3m_sde": Method(_DPMPP, {"algorithm_type": "sde-dpmsolver++", "solver_order": 3}, stochastic=True),
    "ddpm": Method("DDPMScheduler", stochastic=True),
    "lcm": Method("LCMScheduler", stochastic=True),
    "deis": Method("DEISMultistepScheduler"),
    "ddim": Method("DDIMScheduler"),
    "uni_pc": Method("UniPCMultistepScheduler", _BH1),
    "uni_pc_bh2": Method("UniPCMultistepScheduler", {"solver_type": "bh2"}),
}

# Flow matching: diffusers' flow variants, or the multistep solvers on flow sigmas (`use_flow_sigmas`) with the
# pipeline's own shift as their `flow_shift` (with dynamic shifting, the shift follows the image size as it does
# for the pipeline's own scheduler). Those solvers take only the shifted linear schedule: diffusers applies
# karras/exponential/beta to its noise-prediction sigmas instead of the flow ones.
_FLOW = {"prediction_type": "flow_prediction", "use_flow_sigmas": True}
FLOW: dict[str, Method] = {
    "euler": Method("FlowMatchEulerDiscreteScheduler"),
    "heun": Method("FlowMatchHeunDiscreteScheduler", takes_sigmas=False),
    "dpmpp_2m": Method(_DPMPP, {**_FLOW, "algorithm_type": "dpmsolver++", "solver_order": 2}, image_input=False,
                       takes_sigmas=False),
    "deis": Method("DEISMultistepScheduler", _FLOW, image_input=False, takes_sigmas=False),
    "uni_pc": Method("UniPCMultistepScheduler", {**_FLOW, **_BH1}, image_input=False),
    "uni_pc_bh2": Method("UniPCMultistepScheduler", {**_FLOW, "solver_type": "bh2"}, image_input=False),
    "lcm": Method("FlowMatchLCMScheduler", stochastic=True),  # re-noises each step without a generator
}

SAMPLER_CHOICES = (DEFAULT, *dict.fromkeys([*CLASSIC, *FLOW]))
SCHEDULER_CHOICES = (DEFAULT, "normal", "simple", "karras", "exponential", "beta", "sgm_uniform", "ddim_uniform")


def table(own: dict) -> str:
    """Which table a pipeline's own scheduler config (with its `_class_name`) takes: "flow" (FLUX.1, FLUX.2, SD3,
    Qwen-Image), "classic" (a noise-prediction scheduler: SDXL), or "" (another, e.g. Wan's UniPC on flow sigmas
    with its own flow_shift: only `default`)."""
    name = own.get("_class_name", "")
    if name == "FlowMatchEulerDiscreteScheduler":
        return "flow"
    if (name in SCHEDULE_OPTIONS and not name.startswith("FlowMatch") and not own.get("use_flow_sigmas")
            and own.get("prediction_type", "epsilon") in ("epsilon", "v_prediction")):
        return "classic"
    return ""


def _methods(own: dict) -> dict[str, Method]:
    return {"flow": FLOW, "classic": CLASSIC}.get(table(own), {})


def _method(own: dict, sampler: str) -> Method:
    return Method(own.get("_class_name", "")) if sampler == DEFAULT else _methods(own)[sampler]


def _passes_sigmas(pipeline: Pipeline, method: Method) -> bool:
    """Whether the pipeline hands set_timesteps sigmas of its own with this method's scheduler (the family says)."""
    return pipeline.sigmas == "always" or (pipeline.sigmas == "unless flow sigmas"
                                           and not method.options.get("use_flow_sigmas"))


def _refusal(method: Method, pipeline: Pipeline, image_input: bool, name: str) -> str | None:
    """Why the pipeline cannot take `method` (None: it can)."""
    if method.stochastic and not pipeline.seeded_steps:
        return ("draws fresh noise at every step, and this pipeline gives its scheduler no generator: the image "
                "would not follow the seed (and sharded ranks would disagree)")
    if image_input and not method.image_input:
        return "cannot start from an image in diffusers' image-to-image and inpainting pipelines"
    if _passes_sigmas(pipeline, method) and not method.takes_sigmas:
        return "cannot take the sigmas this pipeline passes to its scheduler"
    if name in pipeline.unfit_samplers:
        return f"fails in diffusers' own {pipeline.class_name} with its scheduler ({method.scheduler})"
    return None


def _schedule_options(method: Method, schedule: str, flow: bool) -> dict | None:
    """The config options of `schedule` for `method`'s class; None when that class cannot take it."""
    if schedule == DEFAULT or (flow and schedule in ("simple", "normal")):
        return {}
    takes = SCHEDULE_OPTIONS.get(method.scheduler, frozenset())
    if schedule in _SIGMAS and "sigmas" in takes and not method.options.get("use_flow_sigmas"):
        return {_SIGMAS[schedule]: True}
    if not flow and schedule in _SPACING and "spacing" in takes:
        return {"timestep_spacing": _SPACING[schedule]}
    return None


def allowed_samplers(own: dict, pipeline: Pipeline, image_input: bool = False) -> list[str]:
    return [DEFAULT, *(name for name, m in _methods(own).items() if _refusal(m, pipeline, image_input, name) is None)]


def allowed_schedules(own: dict, sampler: str) -> list[str]:
    method, flow = _method(own, sampler), table(own) == "flow"
    if not table(own):
        return [DEFAULT]
    return [s for s in SCHEDULER_CHOICES if _schedule_options(method, s, flow) is not None]


def resolve(own: dict, pipeline: Pipeline, sampler: str, schedule: str,
            image_input: bool = False) -> tuple[str, dict] | None:
    """(diffusers class, config options) for Sample's sampler and scheduler on `pipeline` (the family's entry),
    whose own scheduler config is `own`; None = the pipeline's own scheduler unchanged. Raises InputError naming
    the input, the value and the choices this pipeline takes."""
    flow, known, family = table(own) == "flow", _methods(own), pipeline.name
    if sampler != DEFAULT:
        if sampler not in known:
            why = ("is not one of the sampler names" if sampler not in SAMPLER_CHOICES else
                   f"has no mapping for {family}, whose own scheduler is {own.get('_class_name')}" if not known else
                   f"has no {'flow-matching ' if flow else ''}scheduler in diffusers")
        else:
            why = _refusal(known[sampler], pipeline, image_input, sampler)
        if why:
            raise InputError(f"sampler: '{sampler}' {why}. {family}{' from an image' if image_input else ''} takes: "
                             f"{', '.join(allowed_samplers(own, pipeline, image_input))}.")
    method = _method(own, sampler)
    options = None
    if schedule in SCHEDULER_CHOICES and (table(own) or schedule == DEFAULT):
        options = _schedule_options(method, schedule, flow)
    if options is None:
        raise InputError(f"scheduler: '{schedule}' cannot be used with sampler '{sampler}' on {family} "
                         f"({method.scheduler}); it takes: {', '.join(allowed_schedules(own, sampler))}.")
    if sampler == DEFAULT and schedule == DEFAULT:
        return None
    return method.scheduler, {**method.options, **options}


def scheduler_config(base: dict, name: str, options: dict, seed: int) -> dict:
    """The config a chosen scheduler is built from: the pipeline's own (betas, shift, dynamic shifting) with the
    method's options. A solver on flow sigmas takes the pipeline's shift as its flow_shift; where the pipeline's
    shift is fixed it is given as a constant dynamic shift (mu = log(shift)), because FLUX.1, FLUX.2 and
    Qwen-Image pass a mu whatever their scheduler's config says, and diffusers' solvers take a mu only with
    dynamic shifting. DPM++ SDE's Brownian noise is seeded with the call's seed (else it draws its own)."""
    config = {k: v for k, v in base.items() if k != "_class_name"}
    if options.get("use_flow_sigmas"):
        shift = float(base.get("shift", 1.0))
        config["flow_shift"] = shift
        if not base.get("use_dynamic_shifting"):
            config.update(use_dynamic_shifting=True, time_shift_type="exponential", base_shift=math.log(shift),
                          max_shift=math.log(shift))
    if name == "DPMSolverSDEScheduler":
        config["noise_sampler_seed"] = seed
    return {**config, **options}


def own_scheduler(spec: PipelineSpec) -> dict:
    """The config of the scheduler the pipeline ships with (with its `_class_name`), as the worker will load it."""
    return spec.component_config("scheduler")


def check(spec: PipelineSpec, req: SampleRequest, image_input: bool) -> str | None:
    """Controller side, before anything runs: refuses a sampler or scheduler the pipeline (or, with `image_input`,
    its image-to-image or inpainting pipeline) cannot take; returns what will run, in words (None for the
    pipeline's own scheduler)."""
    chosen = resolve(own_scheduler(spec), spec.family, req.sampler, req.scheduler, image_input)
    if chosen is None:
        return None
    name, options = chosen
    shown = ", ".join(f"{k}={v}" for k, v in options.items() if k not in ("prediction_type",))
    return f"sampler {req.sampler}, scheduler {req.scheduler}: diffusers' {name}" + (f" ({shown})" if shown else "")
