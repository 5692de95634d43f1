"""Sample's sampler and scheduler: ComfyUI's names, diffusers' schedulers (backend/protocol/samplers.py).

The table is held against the installed diffusers (constructor options) and ComfyUI (the names); each choice a
family takes runs in plain diffusers; through the worker, chosen schedulers give the pixels of plain diffusers
configured by hand, never reload the weights and never recompile the compiled denoiser.
"""

from __future__ import annotations

import ast
import inspect
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import diffusion_pipeline, tiny_pipelines

from backend.controller import api
from backend.protocol import samplers, settings
from backend.protocol.errors import InputError
from backend.protocol.messages import Step
from backend.protocol.spec import SampleRequest

FAMILIES = tiny_pipelines(diffusion_pipeline)  # each image family's tiny DiffusionPipeline, from the registry


def _request(**kw) -> SampleRequest:
    base = dict(prompt="a red fox in the snow", width=64, height=64, steps=3, guidance=5.0, seed=7, batch_size=1)
    return SampleRequest(**{**base, **kw})


def _spec(tiny_models, name="tiny-sdxl", **kw):
    return api.make_spec(name, [str(tiny_models)], **kw)


def _image() -> np.ndarray:
    return np.random.default_rng(0).random((1, 64, 64, 3), dtype=np.float32)


# ---- the table against diffusers and ComfyUI

@pytest.mark.unit
def test_the_table_uses_options_the_installed_diffusers_classes_take():
    import diffusers

    for name, takes in samplers.SCHEDULE_OPTIONS.items():
        params = inspect.signature(getattr(diffusers, name).__init__).parameters
        assert ("timestep_spacing" in params) == ("spacing" in takes), name
        assert all(p in params for p in ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas")) == (
            "sigmas" in takes), name
    for method in [*samplers.CLASSIC.values(), *samplers.FLOW.values()]:
        params = inspect.signature(getattr(diffusers, method.scheduler).__init__).parameters
        assert set(method.options) <= set(params), method
    for method in samplers.FLOW.values():  # what the flow table says of image inputs and sigmas, the classes do
        cls = getattr(diffusers, method.scheduler)
        assert method.image_input == hasattr(cls, "scale_noise"), method
        assert method.takes_sigmas == ("sigmas" in inspect.signature(cls.set_timesteps).parameters), method


@pytest.mark.unit
def test_the_names_are_comfyuis_own(comfyui_dir):
    """Every sampler and scheduler name offered is one ComfyUI's KSampler offers (read from its source)."""
    tree = ast.parse((Path(comfyui_dir) / "comfy" / "samplers.py").read_text())
    values = {t.id: node.value for node in tree.body if isinstance(node, ast.Assign)
              for t in node.targets if isinstance(t, ast.Name)}
    names = set(ast.literal_eval(values["KSAMPLER_NAMES"])) | {"ddim", "uni_pc", "uni_pc_bh2"}
    schedulers = {k.value for k in values["SCHEDULER_HANDLERS"].keys}
    assert set(samplers.SAMPLER_CHOICES) - {"default"} <= names
    assert set(samplers.SCHEDULER_CHOICES) - {"default"} <= schedulers


@pytest.mark.unit
def test_a_choice_a_family_cannot_take_is_refused_naming_the_ones_it_can(tiny_models):
    flux, qwen, sdxl = _spec(tiny_models, "tiny-flux"), _spec(tiny_models, "tiny-qwenimage"), _spec(tiny_models)
    refused = [
        (flux, dict(sampler="euler_ancestral"), None,
         "sampler: 'euler_ancestral' has no flow-matching scheduler in diffusers. FLUX.1 takes: default, euler, "
         "dpmpp_2m, deis, uni_pc, uni_pc_bh2."),
        (flux, dict(sampler="heun"), None, "sampler: 'heun' cannot take the sigmas this pipeline passes"),
        (flux, dict(sampler="dpmpp_2m"), _image(),
         "sampler: 'dpmpp_2m' cannot start from an image in diffusers' image-to-image and inpainting pipelines. "
         "FLUX.1 from an image takes: default, euler."),
        (qwen, dict(sampler="dpmpp_2m"), None, "Qwen-Image takes: default, euler, uni_pc, uni_pc_bh2."),
        (qwen, dict(sampler="lcm"), None,
         "sampler: 'lcm' draws fresh noise at every step, and this pipeline gives its scheduler no generator"),
        (flux, dict(sampler="ddim"), None, "sampler: 'ddim' has no flow-matching scheduler in diffusers"),
        (flux, dict(sampler="uni_pc_bh2", scheduler="karras"), None,
         "scheduler: 'karras' cannot be used with sampler 'uni_pc_bh2' on FLUX.1 (UniPCMultistepScheduler); it "
         "takes: default, normal, simple."),
        (sdxl, dict(sampler="ddim", scheduler="karras"), None,
         "it takes: default, normal, simple, sgm_uniform, ddim_uniform."),
        (sdxl, dict(sampler="euler_a"), None, "sampler: 'euler_a' is not one of the sampler names. SDXL takes: "),
        (sdxl, dict(scheduler="cosine"), None, "scheduler: 'cosine' cannot be used"),
    ]
    for spec, change, image, words in refused:
        with pytest.raises(InputError) as e:
            api.describe_inputs(spec, _request(**change), image)
        assert words in str(e.value), (change, str(e.value))
    # a pipeline whose own scheduler the table does not cover (Wan: UniPC on flow sigmas with its own flow_shift)
    wan = _spec(tiny_models, "tiny-wan")
    with pytest.raises(InputError, match="sampler: 'euler' has no mapping for Wan, whose own scheduler is "
                                         "UniPCMultistepScheduler. Wan takes: default."):
        samplers.check(wan, _request(sampler="euler"), False)
    with pytest.raises(InputError, match="scheduler: 'karras' cannot be used with sampler 'default' on Wan "
                                         r"\(UniPCMultistepScheduler\); it takes: default."):
        samplers.check(wan, _request(scheduler="karras"), False)
    assert samplers.check(wan, _request(), False) is None
    # what runs is said next to the node
    notes = api.describe_inputs(sdxl, _request(sampler="dpmpp_2m", scheduler="karras"))
    assert ("sampler dpmpp_2m, scheduler karras: diffusers' DPMSolverMultistepScheduler (algorithm_type=dpmsolver++, "
            "solver_order=2, use_karras_sigmas=True)") in notes
    assert api.describe_inputs(sdxl, _request()) == []


@pytest.mark.workers
@pytest.mark.parametrize("name", FAMILIES)
def test_every_choice_a_family_takes_runs_in_plain_diffusers(tiny_models, name):
    """Each (sampler, scheduler) the table lets through runs in diffusers' own pipeline and gives finite pixels,
    from text and (where the family repaints images) from an image."""
    import diffusers

    spec = _spec(tiny_models, name)
    pipe = diffusers.DiffusionPipeline.from_pretrained(str(tiny_models / name), local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    own_scheduler = pipe.scheduler
    own = {**own_scheduler.config, "_class_name": type(own_scheduler).__name__}
    pipes = {pipe: False}
    if spec.family.img2img:
        derived = getattr(diffusers, spec.family.img2img).from_pipe(pipe)
        derived.set_progress_bar_config(disable=True)
        pipes[derived] = True
    ran = 0
    for p, image_input in pipes.items():
        for sampler in samplers.allowed_samplers(own, spec.family, image_input):
            # from an image: each sampler with its own schedule (the schedules are the same code either way)
            for schedule in ["default"] if image_input else samplers.allowed_schedules(own, sampler):
                chosen = samplers.resolve(own, spec.family, sampler, schedule, image_input)
                p.scheduler = own_scheduler if chosen is None else getattr(diffusers, chosen[0]).from_config(
                    samplers.scheduler_config(own, *chosen, seed=1))
                kw = dict(prompt="a fox", num_inference_steps=3, generator=torch.Generator().manual_seed(1),
                          output_type="np", height=64, width=64)
                if image_input:
                    kw.update(image=_image(), strength=0.7)
                params = inspect.signature(p.__call__).parameters
                if "max_sequence_length" in params:
                    kw["max_sequence_length"] = 32
                kw[spec.family.guidance_arg] = 2.0  # as the pack always passes it, with its fixed arguments
                kw.update({k: v for k, v in spec.family.call_args if k in params})  # (Ideogram 4's schedule)
                with torch.inference_mode():
                    out = p(**kw).images
                assert np.isfinite(out).all(), (name, sampler, schedule, image_input)
                ran += 1
    assert ran >= 10  # every family takes at least ten sampler and schedule choices


# ---- through the worker

def _plain(tiny_models, name: str, req: SampleRequest, scheduler, pipeline_class: str | None = None, **inputs):
    """Plain diffusers with `scheduler(config)` configured by hand."""
    import diffusers

    pipe = diffusers.DiffusionPipeline.from_pretrained(str(tiny_models / name), dtype=torch.float32,
                                                       local_files_only=True)
    if pipeline_class:
        pipe = getattr(diffusers, pipeline_class).from_pipe(pipe)
    pipe.set_progress_bar_config(disable=True)
    pipe.scheduler = scheduler(dict(pipe.scheduler.config))
    kw = dict(prompt=req.prompt, num_inference_steps=req.steps, guidance_scale=req.guidance, output_type="np",
              generator=[torch.Generator("cpu").manual_seed(req.seed)], height=req.height, width=req.width,
              **inputs)
    if name == "tiny-qwenimage":  # its guidance is true CFG against the (empty) negative prompt
        kw.update(true_cfg_scale=kw.pop("guidance_scale"), negative_prompt="")
    params = inspect.signature(pipe.__call__).parameters
    with torch.inference_mode():
        return pipe(**{k: v for k, v in kw.items() if k in params}).images


def _flow_solver(cls_name: str, **options):
    """A multistep solver on flow sigmas, for a fixed-shift pipeline, configured by hand: the pipeline's shift as
    flow_shift, given as a constant dynamic shift too (base_shift and max_shift are read by the pipeline from the
    config, so they go into the config itself: from_config drops keyword arguments its class does not take)."""
    import diffusers

    def build(config):
        shift = config.get("shift", 1.0)
        return getattr(diffusers, cls_name).from_config(
            {**config, "base_shift": math.log(shift), "max_shift": math.log(shift)},
            prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift, use_dynamic_shifting=True,
            time_shift_type="exponential", **options)
    return build


@pytest.mark.workers
def test_chosen_schedulers_equal_plain_diffusers_and_never_reload(tiny_models):
    import diffusers as d

    def by(cls, **options):
        return lambda config: cls.from_config(config, **options)

    cases = [
        ("tiny-sdxl", dict(sampler="dpmpp_2m", scheduler="karras"),
         by(d.DPMSolverMultistepScheduler, algorithm_type="dpmsolver++", solver_order=2, use_karras_sigmas=True)),
        ("tiny-sdxl", dict(sampler="euler_ancestral", scheduler="normal"),
         by(d.EulerAncestralDiscreteScheduler, timestep_spacing="linspace")),
        ("tiny-sdxl", dict(sampler="dpmpp_2m_sde", scheduler="exponential"),
         by(d.DPMSolverMultistepScheduler, algorithm_type="sde-dpmsolver++", use_exponential_sigmas=True)),
        ("tiny-sdxl", dict(sampler="dpmpp_sde", scheduler="karras"),
         by(d.DPMSolverSDEScheduler, use_karras_sigmas=True, noise_sampler_seed=7)),
        ("tiny-sdxl", dict(sampler="heun", scheduler="sgm_uniform"),
         by(d.HeunDiscreteScheduler, timestep_spacing="trailing")),
        ("tiny-sdxl", dict(sampler="ddim", scheduler="ddim_uniform"),
         by(d.DDIMScheduler, timestep_spacing="leading")),
        ("tiny-sdxl", dict(sampler="default", scheduler="beta"), by(d.EulerDiscreteScheduler, use_beta_sigmas=True)),
        ("tiny-sd3", dict(sampler="heun", scheduler="simple"), by(d.FlowMatchHeunDiscreteScheduler)),
        ("tiny-sd3", dict(sampler="dpmpp_2m"), _flow_solver("DPMSolverMultistepScheduler", solver_order=2)),
        ("tiny-flux", dict(sampler="uni_pc_bh2"), _flow_solver("UniPCMultistepScheduler", solver_type="bh2")),
        ("tiny-flux", dict(sampler="euler", scheduler="karras"),
         by(d.FlowMatchEulerDiscreteScheduler, use_karras_sigmas=True)),
        ("tiny-qwenimage", dict(sampler="euler", scheduler="beta"),
         by(d.FlowMatchEulerDiscreteScheduler, use_beta_sigmas=True)),
        ("tiny-qwenimage", dict(sampler="uni_pc_bh2"), by(
            d.UniPCMultistepScheduler, prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=1.0,
            solver_type="bh2")),
    ]
    previous, loads = None, 0
    for name, change, scheduler in cases:
        spec = _spec(tiny_models, name)
        steps: list[int] = []
        ours = api.sample(spec, _request(**change), steps.append)
        steps = [m.step for m in steps if isinstance(m, Step)]
        plain = _plain(tiny_models, name, _request(**change), scheduler)
        assert np.array_equal(ours, plain), (name, change, np.abs(ours - plain).max())
        assert steps == [1, 2, 3], (name, change, steps)  # second-order schedulers' two calls count as one step
        if name == previous:
            assert api.worker_info()[0]["loads"] == loads, f"{change} reloaded {name}"
        previous, loads = name, api.worker_info()[0]["loads"]
    # and back to the pipeline's own scheduler: its own pixels
    spec = _spec(tiny_models)
    assert np.array_equal(api.sample(spec, _request()), _plain(tiny_models, "tiny-sdxl", _request(),
                                                               by(d.EulerDiscreteScheduler)))

    # from an image: SDXL's image-to-image pipeline with a multistep solver, denoise 0.5 (3 of 6 steps)
    spec = _spec(tiny_models)
    req = _request(sampler="uni_pc", scheduler="simple", denoise=0.5)
    ours = api.sample(spec, req, image=_image())
    plain = _plain(tiny_models, "tiny-sdxl", _request(steps=6), by(
        d.UniPCMultistepScheduler, solver_type="bh1", final_sigmas_type="sigma_min", timestep_spacing="trailing"),
        "StableDiffusionXLImg2ImgPipeline", image=_image(), strength=3.5 / 6)
    assert np.array_equal(ours, plain)


@pytest.mark.workers
def test_changing_the_sampler_never_recompiles_the_denoiser(tiny_models, tmp_path, monkeypatch):
    """Compiled (whole denoiser): schedulers whose timesteps are int64 (DPM-Solver, DDIM, UniPC) or float64
    (DPM++ SDE) reuse the graph the pipeline's own float32 timesteps compiled; the pixels stay plain diffusers'."""
    monkeypatch.setenv(settings.COMPILE_CACHE.name, str(tmp_path))
    api.shutdown()
    try:
        for name, choices in (("tiny-sdxl", [dict(sampler="dpmpp_2m", scheduler="karras"), dict(sampler="ddim"),
                                              dict(sampler="dpmpp_sde"), dict(sampler="heun")]),
                              ("tiny-sd3", [dict(sampler="dpmpp_2m"), dict(sampler="heun"),
                                            dict(sampler="uni_pc", scheduler="normal")])):
            spec, _ = api.with_compile(_spec(tiny_models, name), "whole denoiser", "eager", "64x64", False)
            warm = api.load(spec)["compile"]
            loads = api.worker_info()[0]["loads"]
            for change in choices:
                assert np.isfinite(api.sample(spec, _request(**change))).all()
            stats = api.compile_stats()
            assert (stats["graphs"], stats["compiles"], stats["unexpected_recompiles"]) == (
                warm["graphs"], warm["compiles"], 0), (name, stats)
            assert stats["hits"] == warm["hits"] + len(choices)
            assert api.worker_info()[0]["loads"] == loads
        compiled = api.sample(spec, _request(sampler="dpmpp_2m"))
        assert np.abs(compiled - _plain(tiny_models, "tiny-sd3", _request(), _flow_solver(
            "DPMSolverMultistepScheduler", solver_order=2))).max() <= 1e-5
    finally:
        api.shutdown()


@pytest.mark.workers
def test_samplers_with_cfg_parallel_data_parallel_and_shard_tp(tiny_models):
    """A seeded stochastic sampler (SDXL) and a flow solver (FLUX.1) across the layouts: CFG Parallel (SDXL's
    doubled batch split over 2 ranks: within 1e-4, as without a sampler), Data Parallel (bit for bit) and Shard
    TP (within 1e-4, as without a sampler); every rank runs every step."""
    sdxl, flux = _spec(tiny_models), _spec(tiny_models, "tiny-flux")
    sde = _request(sampler="dpmpp_2m_sde", scheduler="karras", batch_size=2)
    solver = _request(sampler="dpmpp_2m", guidance=0.0, batch_size=2)
    api.shutdown()
    one_sde, one_solver = api.sample(sdxl, sde), api.sample(flux, solver)
    assert not np.array_equal(one_sde, api.sample(sdxl, _request(batch_size=2)))
    layouts = [(api.cfg_parallel(sdxl)[0], sde, one_sde, 1e-4), (api.replicate(sdxl, 2)[0], sde, one_sde, 0.0),
               (api.shard(flux, 2)[0], solver, one_solver, 1e-4)]
    for spec, req, want, tolerance in layouts:
        images = api.sample(spec, req)
        assert np.abs(images - want).max() <= tolerance, (spec.cfg_parallel, spec.dp_replicas, spec.tp_degree)
        workers = api.worker_info()
        assert len(workers) == 2
        if spec.dp_replicas == 1:
            assert workers[0]["steps"] == workers[1]["steps"], "both ranks ran every step"
    api.shutdown()


@pytest.mark.unit
def test_comfyui_prompt_weights_are_read_literally_and_said(tiny_models):
    """Item 4's decision: the pack's own prompt text is read as diffusers reads it; ComfyUI's weight syntax in it
    is named next to the node, with where weights can be had."""
    spec = _spec(tiny_models, "tiny-flux")
    for prompt, negative, found in (("a cabin, (golden hour:1.3), snow", "", "prompt: '(golden hour:1.3)'"),
                                    ("a cabin at ((dusk))", "", "prompt: '(dusk)'"),
                                    ("a cabin", "(blurry)", "negative_prompt: '(blurry)'")):
        notes = api.describe_inputs(spec, _request(prompt=prompt, negative_prompt=negative))
        assert len(notes) == 1 and notes[0].startswith(found), notes
        assert "reads its prompts literally" in notes[0] and "CLIP Text Encode" in notes[0]
    for literal in ("a cabin at dusk", r"a sign reading \(open\)", "a [red] cabin", "a smiley :)"):
        assert api.describe_inputs(spec, _request(prompt=literal)) == [], literal
