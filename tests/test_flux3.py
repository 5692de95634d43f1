"""FLUX 3 [klein], diffusers' modular pipelines (issue 36): through the pack's API, the pixels of plain diffusers'
Flux3DistilledModularPipeline and Flux3ModularPipeline (text to image, and edit with one reference image), the
layouts its declaration allows or refuses, and its ComfyUI diffusion model recognised (its files load in
tests/test_files.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from backend.controller import api
from backend.protocol.errors import Interrupted, ParallelError
from backend.protocol.messages import Step
from backend.protocol.spec import SampleRequest

BLOCKS = {"tiny-flux3": "Flux3DistilledAutoBlocks", "tiny-flux3-base": "Flux3AutoBlocks"}


def _request(**kw) -> SampleRequest:
    base = dict(prompt="a red fox in the snow", width=64, height=48, steps=2, guidance=2.0, seed=7, batch_size=1)
    return SampleRequest(**{**base, **kw})


def _plain(folder, name: str, req: SampleRequest, **call) -> np.ndarray:
    """What a plain diffusers script gives: the blocks without the prompt upsampler, the folder's components, the
    guidance in the base model's guider."""
    import diffusers.modular_pipelines as modular
    from diffusers.guiders import ClassifierFreeGuidance

    blocks = getattr(modular, BLOCKS[name])()
    blocks.sub_blocks.pop("prompt_upsampler")
    pipe = blocks.init_pipeline(str(folder))
    pipe.load_components(names=["text_encoder", "tokenizer", "transformer", "vae"], dtype=torch.float32,
                         pretrained_model_name_or_path=str(folder))
    if name == "tiny-flux3-base":
        pipe.update_components(guider=ClassifierFreeGuidance(guidance_scale=req.guidance))
    state = pipe(prompt=req.prompt, height=req.height, width=req.width, num_inference_steps=req.steps,
                 generator=torch.Generator("cpu").manual_seed(req.seed), output_type="np", **call)
    return np.asarray(state.values["images"], dtype=np.float32)


def _reference() -> np.ndarray:
    return np.random.RandomState(3).rand(1, 64, 80, 3).astype(np.float32)


@pytest.mark.workers
@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_text_to_image_and_edit_equal_plain_diffusers(tiny_models, name):
    import PIL.Image

    spec = api.make_spec(name, [str(tiny_models)])
    assert spec.class_name == ("Flux3DistilledModularPipeline" if name == "tiny-flux3" else "Flux3ModularPipeline")
    req = _request()
    ours = api.sample(spec, req)
    assert ours.shape == (1, 48, 64, 3)
    assert np.abs(ours - _plain(tiny_models / name, name, req)).max() <= 1e-4
    ref = _reference()
    edited = api.sample(spec, req, image=ref)
    pil = PIL.Image.fromarray((ref[0] * 255).round().astype(np.uint8))
    assert np.abs(edited - _plain(tiny_models / name, name, req, image=[pil])).max() <= 1e-4
    assert np.abs(edited - ours).max() > 1e-3  # the reference changed the image


@pytest.mark.workers
def test_the_base_models_guidance_reaches_its_guider_and_each_step_reports_and_stops(tiny_models):
    """The modular blocks take no step callback: the worker's runs after each scheduler step (progress, Cancel)."""
    spec = api.make_spec("tiny-flux3-base", [str(tiny_models)])
    assert np.abs(api.sample(spec, _request(guidance=1.0)) - api.sample(spec, _request(guidance=4.0))).max() > 1e-3
    seen, stop = [], threading.Event()

    def on_progress(msg):
        if isinstance(msg, Step):
            seen.append(msg.step)
            if msg.step == 3:
                stop.set()

    with pytest.raises(Interrupted):
        api.sample(spec, _request(steps=5000), on_progress, stop.is_set)
    assert seen[:3] == [1, 2, 3] and max(seen) < 50
    assert api.sample(spec, _request()).shape == (1, 48, 64, 3), "the next request works"


@pytest.mark.unit
def test_the_layouts_it_has_no_plan_or_second_pass_for_are_refused(tiny_models):
    distilled = api.make_spec("tiny-flux3", [str(tiny_models)])
    base = api.make_spec("tiny-flux3-base", [str(tiny_models)])
    with pytest.raises(ParallelError, match=r"FLUX 3 \[klein\].*no tensor-parallel plan"):
        api.shard(distilled, 2)
    with pytest.raises(ParallelError, match=r"FLUX 3 \[klein\].*no context-parallel plan"):
        api.context_parallel(distilled, 2)
    with pytest.raises(ParallelError, match=r"one denoiser pass per step"):
        api.cfg_parallel(distilled)
    with pytest.raises(ParallelError, match=r"modular pipeline whose guider runs both CFG passes"):
        api.cfg_parallel(base)


@pytest.mark.unit
def test_load_tpu_pipeline_lists_and_recognises_a_modular_folder(tiny_models, tmp_path):
    from backend.controller import models

    assert not (tiny_models / "tiny-flux3" / "model_index.json").exists()
    assert {"tiny-flux3", "tiny-flux3-base", "tiny-flux"} <= set(models.find_models([str(tiny_models)]))
    info = models.inspect_model(tiny_models / "tiny-flux3")
    assert (info.class_name, info.family.modular.blocks) == ("Flux3DistilledModularPipeline",
                                                             "Flux3DistilledAutoBlocks")
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match=r"no model_index\.json \(nor modular_model_index\.json\)"):
        models.inspect_model(tmp_path / "empty")


@pytest.mark.workers
def test_data_parallel_draws_the_same_images_as_one_worker(tiny_models):
    spec = api.make_spec("tiny-flux3", [str(tiny_models)])
    one = api.sample(spec, _request(batch_size=2))
    replicated, _ = api.replicate(spec, 2)
    assert replicated.dp_replicas == 2
    assert np.abs(api.sample(replicated, _request(batch_size=2)) - one).max() <= 1e-6


@pytest.mark.unit
def test_offload_is_refused_naming_why_and_auto_keeps_the_weights_on_the_device(tiny_models):
    from backend.protocol.errors import OptionError

    for offload in ("model", "sequential"):
        with pytest.raises(OptionError, match=rf"offload: '{offload}' is not available for FLUX 3 \[klein\].*modular"):
            api.make_spec("tiny-flux3", [str(tiny_models)], offload=offload)
    from backend.controller import offload as offloads

    auto = api.make_spec("tiny-flux3", [str(tiny_models)], offload="auto").with_changes(kind="tpu")
    with pytest.MonkeyPatch.context() as mp:  # counted from its headers, on a 16 GiB chip (v5e)
        mp.setattr(offloads.devices, "device_memory_bytes", lambda kind: 16 * 2**30)
        choice = offloads.choose_offload(auto)
    assert choice.mode == "none" and "transformer" in choice.reason and "within" in choice.reason


@pytest.mark.unit
def test_compiled_mode_compiles_the_modular_pipelines_transformer(tiny_models):
    """The plan of any other pipeline: the whole transformer (tests/test_compile.py runs it, 0 recompiles)."""
    spec = api.make_spec("tiny-flux3", [str(tiny_models)])
    compiled = api.with_mode(spec, "compiled")[0]
    assert compiled.mode == "compiled" and compiled.compile.target == "whole denoiser"
    assert api.with_mode(spec, "strict eager")[0].mode == "strict eager"


@pytest.mark.server
def test_a_workflow_in_comfyui_saves_the_pixels_of_plain_diffusers(server, tiny_models):
    """Load TPU Pipeline lists tiny-flux3 (a modular folder) and Sample (TPU) runs it: the saved PNG is plain
    diffusers' image as ComfyUI's Save Image writes it (8 bits, truncated)."""
    from helpers import pixels, prompt, run_ok

    req = _request()
    wf = prompt("tiny-flux3", prompt=req.prompt, width=req.width, height=req.height, steps=req.steps,
                guidance=req.guidance, seed=req.seed)
    saved = pixels(run_ok(server, wf)["images"][0]).astype(int)
    plain = np.clip(255.0 * _plain(tiny_models / "tiny-flux3", "tiny-flux3", req)[0], 0, 255).astype(np.uint8)
    assert saved.shape == (48, 64, 3)
    assert np.abs(saved - plain.astype(int)).max() <= 1  # float noise at an 8-bit boundary at most


@pytest.mark.workers
def test_latent_out_decodes_to_the_image_and_an_empty_latent_in_sets_size_and_batch(tiny_models):
    """ComfyUI's LATENT of a modular pipeline, as every image family's (tests/test_latents.py): what the blocks
    hand the VAE to decode, in FLUX.2's packed layout (FLUX 3 runs on FLUX.2's VAE); Sample Latent never decodes,
    VAE Decode (TPU) gives the image; an empty latent at denoise 1 is text to image at its size and batch; below 1
    refused naming the pipelines that can start from a latent."""
    from backend.families import pipeline_names
    from backend.protocol.errors import ModelError

    spec = api.make_spec("tiny-flux3", [str(tiny_models)])
    req = _request(batch_size=2)
    both = api.run_sample_outputs(api.prepare_sample(spec, SampleRequest(**{**req.to_dict(),
                                                                            "outputs": "images+latents"})))
    channels = 4 * spec.component_config("vae")["latent_channels"]
    assert both["latents"].shape == (2, channels, 3, 4), "2x2 packed: 1/16 of 48x64"
    assert np.array_equal(both["images"], api.sample(spec, req))
    decodes = api.worker_info()[0]["vae_decodes"]
    only = api.run_sample_outputs(api.prepare_sample(spec, SampleRequest(**{**req.to_dict(), "outputs": "latents"})))
    assert np.array_equal(only["latents"], both["latents"])
    assert api.worker_info()[0]["vae_decodes"] == decodes, "Sample Latent never runs the VAE's decoder"
    np.testing.assert_allclose(api.decode(spec, only["latents"]), both["images"], rtol=0, atol=1e-5)
    latent, width, height, batch = api.latent_input(spec, np.zeros((2, 16, 3, 4), np.float32))  # EmptyLatentImage
    assert (width, height, batch) == (64, 48, 2)
    sized = SampleRequest(**{**_request().to_dict(), "width": width, "height": height, "batch_size": batch})
    assert np.array_equal(api.run_sample(api.prepare_sample(spec, sized, latent=latent)), both["images"])
    with pytest.raises(ModelError) as e:
        api.prepare_sample(spec, SampleRequest(**{**sized.to_dict(), "denoise": 0.5}), latent=latent)
    assert "has no image-to-image pipeline" in str(e.value)
    assert f"works with {pipeline_names(lambda p: p.img2img is not None)}." in str(e.value)


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_its_comfyui_diffusion_model_is_recognised_by_its_keys_and_asks_for_its_text_encoder(tiny_models, tmp_path,
                                                                                          name):
    """The tiny transformer in BFL's layout (what diffusers' FLUX 3 converter reads; under ComfyUI's
    model.diffusion_model prefix, as its model save writes it) is recognised as FLUX 3 [klein], step-distilled or
    base by its tensors, and alone the loader asks for its Qwen3-VL text encoder (tests/test_files.py loads the
    whole set)."""
    from diffusers.models.transformers.transformer_flux3 import Flux3Transformer2DModel
    from file_fixtures import flux3_transformer_file
    from safetensors.torch import save_file

    from backend.controller.files import assemble, listing, recognise
    from backend.protocol.errors import ModelError

    models = tmp_path / "models"
    for sub in listing.ROLE_FOLDERS.values():
        (models / sub).mkdir(parents=True, exist_ok=True)
    transformer = Flux3Transformer2DModel.from_pretrained(str(tiny_models / name / "transformer"))
    path = models / "diffusion_models" / "tiny-comfy.safetensors"
    save_file({f"model.diffusion_model.{k}": v.contiguous() for k, v in flux3_transformer_file(transformer).items()},
              str(path))
    part = recognise.file_contents(path, "diffusion_model").denoiser
    assert (part.kind, part.prefix) == ("flux3", "model.diffusion_model.")
    assert ("ref_time_in.in_layer.weight" in part.shapes) is (name == "tiny-flux3")
    roots = {role: [str(models / sub)] for role, sub in listing.ROLE_FOLDERS.items()}
    with pytest.raises(ModelError) as e:
        api.make_file_spec(assemble.FileChoice(diffusion_model=path.name), roots)
    assert "text_encoder: FLUX 3 [klein] needs Qwen3-VL (qwen3vl_4b_*.safetensors" in str(e.value)
    assert "is missing" in str(e.value)
