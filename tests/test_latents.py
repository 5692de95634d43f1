"""ComfyUI's LATENT out of Sample and into it (issue 23, item 2): the LATENT is what each family's diffusers
pipeline hands its VAE to decode (ComfyUI's own VAE Decode, with the VAE loaded by ComfyUI's VAELoader from the
same file, decodes it to the pack's IMAGE), Sample Latent never runs the VAE, and a LATENT coming in is the
start of image to image as if the pipeline's VAE had encoded it. backend/controller/latents.py and
backend/worker/latents.py say how.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import diffusion_pipeline, tiny_pipelines
from lora_fixtures import load

from backend.controller import api
from backend.protocol.errors import ModelError
from backend.protocol.spec import SampleRequest

PROMPT = "a lighthouse at dusk"
IMAGE_FAMILIES = tiny_pipelines(diffusion_pipeline)  # each image family's tiny DiffusionPipeline


def _request(**kw) -> SampleRequest:
    return SampleRequest(**{"prompt": PROMPT, "width": 64, "height": 64, "steps": 2, "guidance": 0.0, "seed": 7,
                            **kw})


def _spec(tiny_models, name="tiny-flux"):
    return api.make_spec(name, [str(tiny_models)])


def _outputs(spec, req: SampleRequest, latent: np.ndarray | None = None) -> dict[str, np.ndarray]:
    size = api.latent_input(spec, latent) if latent is not None else None
    if size is not None:
        latent, width, height, batch = size
        req = SampleRequest(**{**req.to_dict(), "width": width, "height": height, "batch_size": batch})
    return api.run_sample_outputs(api.prepare_sample(spec, req, latent=latent))


def _decoded(pipe, latent: np.ndarray) -> np.ndarray:
    """The LATENT decoded as each pipeline decodes (FLUX.2: its batch norm and 2x2 packing undone first)."""
    z = torch.from_numpy(latent)
    with torch.inference_mode():
        if hasattr(pipe, "_unpatchify_latents"):
            bn = pipe.vae.bn
            z = pipe._unpatchify_latents(z * torch.sqrt(bn.running_var.view(1, -1, 1, 1) + pipe.vae.config.batch_norm_eps)
                                         + bn.running_mean.view(1, -1, 1, 1))
        image = pipe.vae.decode(z, return_dict=False)[0]
        return pipe.image_processor.postprocess(image[:, :, 0] if image.ndim == 5 else image, output_type="np")


@pytest.mark.unit
def test_latent_inputs_are_checked_and_explained(tiny_models, tiny_controlnets):
    flux, sdxl = _spec(tiny_models), _spec(tiny_models, "tiny-sdxl")
    latent, width, height, batch = api.latent_input(flux, np.zeros((3, 4, 6, 10), np.float32))
    assert (width, height, batch) == (80, 48, 3) and latent.dtype == np.float32
    with pytest.raises(ModelError, match=r"latent: it has 16 channels, but FLUX.1 \('tiny-flux'\) works on 4-channel "
                                         r"latents.*Connect Empty Latent Image"):
        api.latent_input(flux, np.ones((1, 16, 8, 8), np.float32))
    empty = api.latent_input(flux, np.zeros((2, 16, 8, 8), np.float32))[0]  # EmptySD3LatentImage: as KSampler,
    assert empty.shape == (2, 4, 8, 8) and not empty.any()  # an empty latent of any model gives its size
    with pytest.raises(ModelError, match=r"latent: it is 5x8 latent pixels \(40x64 pixels\); FLUX.1 needs multiples "
                                         r"of 16 pixels.*Make it 4x8"):
        api.latent_input(flux, np.zeros((1, 4, 8, 5), np.float32))
    assert api.latent_input(sdxl, np.zeros((1, 4, 8, 5), np.float32))[1:] == (40, 64, 1), "SDXL: multiples of 8"
    with pytest.raises(ModelError, match="latent: it carries a noise mask"):
        api.latent_input(flux, np.zeros((1, 4, 8, 8), np.float32), noise_mask=True)
    with pytest.raises(ModelError, match=r"latent: a LATENT of shape \[4, 8, 8\] cannot be used"):
        api.latent_input(flux, np.zeros((4, 8, 8), np.float32))
    with pytest.raises(ModelError, match="latent: the latent holds values that are not numbers"):
        api.latent_input(flux, np.full((1, 4, 8, 8), np.nan, np.float32))
    qwen = _spec(tiny_models, "tiny-qwenimage")
    z = qwen.component_config("vae")["z_dim"]
    four_d = api.latent_input(qwen, np.zeros((1, z, 8, 8), np.float32))[0]
    assert four_d.shape == (1, z, 1, 8, 8), "Qwen-Image's Wan VAE takes a frame axis: EmptySD3LatentImage's 4D fits"
    assert np.array_equal(api.latent_input(qwen, four_d)[0], four_d)
    flux2 = _spec(tiny_models, "tiny-flux2")
    assert api.latent_input(flux2, np.zeros((1, 4 * flux2.component_config("vae")["latent_channels"], 4, 4),
                                            np.float32))[1:] == (64, 64, 1), "FLUX.2: 2x2 packed, 1/16 of the image"

    latent = np.zeros((2, 4, 8, 8), np.float32)
    req = _request(batch_size=2)
    notes = api.prepare_sample(flux, req, latent=latent, asked=(1024, 1024, 1)).notes
    assert notes[:2] == ("latent 64x64 (batch 2), denoise 1: text to image at its size; its values are not used "
                         "(KSampler starts flow models from pure noise at denoise 1 too)",
                         "width, height and batch_size (1024x1024, 1) follow the latent")
    assert api.prepare_sample(flux, _request(batch_size=2, denoise=0.5), latent=latent).notes[0] == (
        "starts from the latent (64x64, batch 2), denoise 0.5: 2 steps of a 4-step schedule")
    with pytest.raises(ModelError, match="latent: both an image and a latent are connected"):
        api.prepare_sample(flux, req, image=np.zeros((1, 64, 64, 3), np.float32), latent=latent)
    with pytest.raises(ModelError, match="denoise: 0 with a latent changes nothing"):
        api.prepare_sample(flux, _request(denoise=0.0), latent=latent)
    with pytest.raises(ModelError, match=r"denoise: FLUX.2 \[klein\] \('tiny-flux2'\) has no image-to-image pipeline"):
        api.prepare_sample(flux2, _request(denoise=0.5), latent=np.zeros((1, 128, 4, 4), np.float32))
    snapping, _ = api.with_compile(flux, "whole denoiser", "eager", "64x64", True)
    assert api.prepare_sample(snapping, _request(denoise=0.5, batch_size=2), latent=latent).req.width == 64
    with pytest.raises(ModelError, match=r"latent: it is 80x48, not one of the warm-up sizes Compile snaps to \(64x64\)"):
        api.prepare_sample(snapping, _request(denoise=0.5, width=80, height=48), latent=np.zeros((1, 4, 6, 10)))
    controlled, _ = api.with_controlnet(flux, str(tiny_controlnets / "files" / "tiny-flux-union.safetensors"),
                                        np.zeros((1, 64, 64, 3), np.float32), union_mode="canny")
    assert api.prepare_sample(controlled, req, latent=latent).req.batch_size == 2, "denoise 1: size and batch"
    with pytest.raises(ModelError, match="denoise: with a ControlNet a latent sets only the size and the batch"):
        api.prepare_sample(controlled, _request(denoise=0.5, batch_size=2), latent=latent)


def _model_space(pipe, latent: np.ndarray) -> torch.Tensor:
    """What each pipeline makes of its VAE's encoding before it adds noise (diffusers' encode code, written out)."""
    z, config = torch.from_numpy(latent), pipe.vae.config
    if getattr(config, "latents_mean", None) is not None:  # Qwen-Image: per channel (its pipeline adds the frame axis)
        mean, std = (torch.tensor(config[k]).view(1, -1, 1, 1) for k in ("latents_mean", "latents_std"))
        return (z[:, :, 0] - mean) / std
    return (z - (getattr(config, "shift_factor", None) or 0.0)) * config.scaling_factor


@pytest.mark.workers
@pytest.mark.parametrize("name", IMAGE_FAMILIES)
def test_latent_out_is_what_the_pipeline_decodes_and_latent_in_starts_image_to_image(tiny_models, name):
    """Out: the LATENT decodes (as the pipeline decodes) to the IMAGE, taking it changes no pixel, and Sample
    Latent never runs the VAE's decoder, and VAE Decode (TPU) decodes it to the IMAGE. In, below denoise 1: the family's image-to-image pipeline from the
    LATENT equals that pipeline handed the latent in its own scaled space (what it makes of an encoding), image i
    from latent i; an empty latent at denoise 1 is text to image at its size and batch."""
    import diffusers

    spec = _spec(tiny_models, name)
    req = _request(batch_size=2)
    both = _outputs(spec, SampleRequest(**{**req.to_dict(), "outputs": "images+latents"}))
    assert np.array_equal(both["images"], api.sample(spec, req)), "taking the latent leaves the images as they were"
    decoded = _decoded(load(tiny_models, name), both["latents"])[..., :3]  # RGB (Qwen-Image 2.1 decodes RGBA too)
    np.testing.assert_allclose(decoded, both["images"], rtol=0, atol=1e-5)
    decodes = api.worker_info()[0]["vae_decodes"]
    only = _outputs(spec, SampleRequest(**{**req.to_dict(), "outputs": "latents"}))
    assert list(only) == ["latents"] and np.array_equal(only["latents"], both["latents"])
    assert api.worker_info()[0]["vae_decodes"] == decodes, "Sample Latent never runs the VAE's decoder"
    decoded = api.decode(spec, only["latents"])  # VAE Decode (TPU): on the workers, as Sample decodes
    np.testing.assert_allclose(decoded, both["images"], rtol=0, atol=1e-5)  # a batch of 2 vs one by one
    assert api.worker_info()[0]["vae_decodes"] > decodes
    empty = np.zeros_like(both["latents"])
    assert np.array_equal(_outputs(spec, _request(), empty)["images"], both["images"])
    if spec.family.img2img is None:  # FLUX.2: denoise 1 only; below 1 it is refused (the test above)
        return
    ours = _outputs(spec, _request(denoise=0.5, seed=11), both["latents"])["images"]
    pipe = load(tiny_models, name, cls=getattr(diffusers, spec.family.img2img))
    for i in range(2):
        with torch.inference_mode():
            plain = pipe(prompt=PROMPT, image=_model_space(pipe, both["latents"][i:i + 1]), strength=0.5,
                         num_inference_steps=4, guidance_scale=0.0, output_type="np", height=64, width=64,
                         generator=[torch.Generator("cpu").manual_seed(11 + i)]).images
        np.testing.assert_allclose(ours[i:i + 1], plain, rtol=0, atol=1e-6)


@pytest.mark.server
def test_comfyuis_vae_decode_and_a_latent_hires_fix_in_a_real_comfyui(server, comfyui_files):
    """The pack's LATENT decoded by ComfyUI's own VAE Decode, with the VAE ComfyUI's VAELoader reads from the file
    the pack's pipeline decodes with, is the pack's IMAGE (to one level of 255: two float paths, saved as PNG).
    ComfyUI's VAELoader reads only full-size LDM VAEs, so that file has the published layout (tests/file_fixtures:
    flux1-vae). Then a latent hires fix (Sample, Upscale Latent By, Sample) and Empty Latent Image into Sample
    Latent, decoded by ComfyUI's VAE Decode and by VAE Decode (TPU) alike; a latent with a noise mask is refused, naming the input, and ComfyUI stays up."""
    from comfy_server import error_message
    from file_fixtures import FILES
    from helpers import pixels, run_ok

    models = comfyui_files("flux1") / "models"
    vae_models = comfyui_files("flux1-vae", folder="comfyui-vae") / "models"  # not in the other tests' VAE lists
    flux1, vae = FILES["flux1"], FILES["flux1-vae"]["vae"]
    for folder, name, source in (("diffusion_models", flux1["diffusion_model"], models),
                                 ("text_encoders", flux1["clip_l"], models), ("text_encoders", flux1["t5"], models),
                                 ("vae", vae, vae_models)):
        (server.work_dir / "models" / folder).mkdir(parents=True, exist_ok=True)
        if not (link := server.work_dir / "models" / folder / name).exists():
            link.symlink_to(source / folder / name)
    sample = {"prompt": PROMPT, "negative_prompt": "", "width": 16, "height": 16, "steps": 2, "guidance": 0.0,
              "seed": 3, "batch_size": 1}
    prompt = {
        "1": {"class_type": "LoadTPUPipelineFiles", "inputs": {
            "diffusion_model": flux1["diffusion_model"], "text_encoder_1": flux1["clip_l"],
            "text_encoder_2": flux1["t5"], "text_encoder_3": "(none)", "vae": vae, "checkpoint": "(none)",
            "dtype": "auto", "device": "auto", "offload": "none"}},
        "2": {"class_type": "TPUSample", "inputs": {"pipeline": ["1", 0], **sample}},
        "3": {"class_type": "VAELoader", "inputs": {"vae_name": vae}},
        "4": {"class_type": "VAEDecode", "inputs": {"samples": ["2", 1], "vae": ["3", 0]}},
        "5": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "pack"}},
        "6": {"class_type": "SaveImage", "inputs": {"images": ["4", 0], "filename_prefix": "comfy"}},
        "7": {"class_type": "LatentUpscaleBy", "inputs": {"samples": ["2", 1], "upscale_method": "nearest-exact",
                                                          "scale_by": 2.0}},
        "8": {"class_type": "TPUSample", "inputs": {"pipeline": ["1", 0], **sample, "latent": ["7", 0],
                                                    "denoise": 0.5}},
        "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "hires"}},
        "10": {"class_type": "EmptyLatentImage", "inputs": {"width": 32, "height": 16, "batch_size": 2}},
        "11": {"class_type": "TPUSampleLatent", "inputs": {"pipeline": ["1", 0], **sample, "latent": ["10", 0]}},
        "12": {"class_type": "VAEDecode", "inputs": {"samples": ["11", 0], "vae": ["3", 0]}},
        "13": {"class_type": "SaveImage", "inputs": {"images": ["12", 0], "filename_prefix": "empty"}},
        "16": {"class_type": "TPUVAEDecode", "inputs": {"pipeline": ["1", 0], "samples": ["11", 0]}},
        "17": {"class_type": "SaveImage", "inputs": {"images": ["16", 0], "filename_prefix": "tpudecode"}},
    }
    try:
        result = run_ok(server, prompt, timeout=300)
        saved = {p.name.split("_")[0]: [] for p in result["images"]}
        for path in sorted(result["images"]):
            saved[path.name.split("_")[0]].append(pixels(path).astype(int))
        (pack,), (comfy,), (hires,) = saved["pack"], saved["comfy"], saved["hires"]
        assert pack.shape == (16, 16, 3) and pack.std() > 10, "a picture, not a flat one (the comparison means something)"
        assert np.abs(pack - comfy).max() <= 1, "ComfyUI's VAE Decode of the pack's LATENT is the pack's IMAGE"
        assert hires.shape == (32, 32, 3), "Upscale Latent By 2 then Sample: twice the size"
        assert [e.shape for e in saved["empty"]] == [(16, 32, 3)] * 2, "Empty Latent Image sets size and batch"
        assert all(np.abs(a - b).max() <= 1 for a, b in zip(saved["tpudecode"], saved["empty"], strict=True)), \
            "VAE Decode (TPU) decodes as ComfyUI's VAE Decode"

        masked = {**{k: prompt[k] for k in ("1", "10", "12", "3", "13")},
                  "11": {**prompt["11"], "inputs": {**prompt["11"]["inputs"], "latent": ["14", 0]}},
                  "14": {"class_type": "SetLatentNoiseMask", "inputs": {"samples": ["10", 0], "mask": ["15", 0]}},
                  "15": {"class_type": "SolidMask", "inputs": {"value": 1.0, "width": 32, "height": 16}}}
        refused = server.run(masked)
        assert refused["status"] == "error" and "latent: it carries a noise mask" in error_message(refused)
        run_ok(server, {"5": prompt["5"], **{k: prompt[k] for k in ("1", "2")}})  # ComfyUI is still up and sampling
    finally:  # the shared server's VAE list as the other tests know it
        (server.work_dir / "models" / "vae" / vae).unlink()
