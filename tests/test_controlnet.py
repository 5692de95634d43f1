"""ControlNets (issues 26 and 24): FLUX.1 (union), SD3, SDXL (plain and union), Qwen-Image and Z-Image ControlNets
from diffusers folders and single files, equal to plain diffusers' ControlNet pipelines bit for bit on the CPU;
chained, with image to image and inpainting; strength, start, end and the control image never reload or recompile;
Shard TP, Data Parallel and CFG Parallel equal one worker; offload 'auto' counts them; bad input refused before
anything runs.

The tiny ControlNets (backend/tiny_models.py: CONTROLNETS) have every weight drawn at random, so each changes the
image. The plain-diffusers reference builds the family's ControlNet pipeline from the tiny pipeline's components.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from backend.controller import api, controlnets, layouts, offload
from backend.families import PIPELINES
from backend.protocol.errors import ModelError
from backend.protocol.spec import SampleRequest
from backend.tiny_models import CONTROLNETS
from backend.worker.controlnets import fit_control
from backend.worker.images import schedule

PROMPT = "a red fox in the snow"
TOLERANCE = 1e-4  # Shard TP and CFG Parallel sum in another order (tests/test_parallel.py)
MODELS = {"flux": "tiny-flux", "sd3": "tiny-sd3", "sdxl": "tiny-sdxl", "qwenimage": "tiny-qwenimage",
          "zimage": "tiny-zimage"}
GUIDANCE = {"flux": 0.0, "sd3": 4.0, "sdxl": 5.0, "qwenimage": 1.0, "zimage": 0.0}


def _image(seed: int, h: int = 64, w: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).random((1, h, w, 3), dtype=np.float32)


def _request(family: str = "flux", **changes) -> SampleRequest:
    return SampleRequest(**{"prompt": PROMPT, "width": 64, "height": 64, "steps": 2, "guidance": GUIDANCE[family],
                            "seed": 3, **changes})


def _path(controlnets_dir, name: str, file: bool) -> str:
    return str(controlnets_dir / "files" / f"tiny-{name}.safetensors" if file else controlnets_dir / f"tiny-{name}")


def _plain(tiny_models, controlnets_dir, pipeline: str, nets: list[tuple[str, float, float, float, int]],
           controls: list[np.ndarray], family: str, **call) -> np.ndarray:
    """Plain diffusers: `pipeline` built from the tiny pipeline's components and the ControlNets (name, strength,
    start, end, union mode), called with one value per ControlNet (a list for several) as its docs show."""
    import diffusers

    base = diffusers.DiffusionPipeline.from_pretrained(str(tiny_models / MODELS[family]), dtype=torch.float32)
    models = [getattr(diffusers, CONTROLNETS[n][1]).from_pretrained(str(controlnets_dir / f"tiny-{n}"),
                                                                    dtype=torch.float32) for n, *_ in nets]
    cls = getattr(diffusers, pipeline)
    expected, _ = cls._get_signature_keys(cls)
    pipe = cls(**{k: v for k, v in base.components.items() if k in expected},
               controlnet=models[0] if len(models) == 1 else models)
    pipe.set_progress_bar_config(disable=True)

    def each(values):
        return values if len(nets) > 1 else values[0]

    union = [m for *_, m in nets]
    kw = {"prompt": PROMPT, "height": 64, "width": 64, "num_inference_steps": 2, "num_images_per_prompt": 1,
          "generator": [torch.Generator("cpu").manual_seed(3)], "output_type": "np",
          "controlnet_conditioning_scale": each([s for _, s, *_ in nets]),
          "control_guidance_start": each([b for _, _, b, _, _ in nets]),
          "control_guidance_end": each([e for _, _, _, e, _ in nets]),
          ("true_cfg_scale" if family == "qwenimage" else "guidance_scale"): GUIDANCE[family], **call}
    image_arg = "image" if pipeline == "StableDiffusionXLControlNetPipeline" else "control_image"
    if "Union" in pipeline:
        kw["control_image"], kw["control_mode"] = each([[c] for c in controls]), each([[m] for m in union])
    else:
        kw[image_arg] = each(controls)
        if any(m >= 0 for m in union):
            kw["control_mode"] = each(union)
    takes = inspect.signature(pipe.__call__).parameters  # Z-Image's: no strength, start or end (checked: 0 and 1)
    kw = {k: v for k, v in kw.items() if k in takes or k not in ("strength", "control_guidance_start",
                                                                  "control_guidance_end")}
    torch.manual_seed(3)  # SD3's ControlNet pipeline draws the control latents from the global RNG
    with torch.inference_mode():
        return pipe(**kw).images


# ---- recognised from their files, refused when they do not fit (controller only: nothing runs)


@pytest.mark.unit
def test_single_files_give_the_config_their_folder_has(tiny_models, tiny_controlnets, tmp_path):
    """What no tensor holds (rotary axes, SDXL's time embedding, where Z-Image's control layers sit) comes from the
    pipeline's denoiser. Z-Image's releases: 1.0 (plain refiner blocks), 2.1 (control refiner blocks) and 2.0, whose
    files hold the refiner blocks zeroed (the control layers refine instead), as diffusers' loader tells them."""
    for name, (family, cls, _) in CONTROLNETS.items():
        spec = api.make_spec(MODELS[family], [str(tiny_models)])
        found = controlnets.read(_path(tiny_controlnets, name, file=True), spec)
        assert found.kind.model == cls
        saved = json.loads((tiny_controlnets / f"tiny-{name}" / "config.json").read_text())
        from_file = {k: list(v) if isinstance(v, tuple) else v for k, v in found.config.items()}
        assert from_file == {k: saved[k] for k in from_file}, name
    from safetensors.torch import load_file, save_file

    tensors = load_file(_path(tiny_controlnets, "zimage", file=True))
    tensors["control_noise_refiner.0.before_proj.weight"] = torch.zeros_like(
        tensors["control_noise_refiner.0.before_proj.weight"]) * -1  # -0.0 counts as zero, as in diffusers
    save_file(tensors, str(tmp_path / "z-image-2.0.safetensors"))
    two = controlnets.read(str(tmp_path / "z-image-2.0.safetensors"), api.make_spec("tiny-zimage", [str(tiny_models)]))
    assert two.config["add_control_noise_refiner"] == "control_layers"
    assert two.config["control_refiner_layers_places"] == [0], "the first control layers' hints go to the refiner"


@pytest.mark.unit
def test_control_images_are_resized_as_comfyui_resizes_them(comfyui_dir, tmp_path):
    """comfy.utils.common_upscale(..., 'nearest-exact', 'center'), as ComfyUI's ControlNets call it."""
    image = np.random.default_rng(0).random((50, 70, 3), dtype=np.float32)
    sizes = ((64, 32), (32, 64), (48, 48), (70, 50))
    np.save(tmp_path / "in.npy", image)
    code = ("import sys, numpy as np, torch; import comfy.utils as u; x = torch.from_numpy(np.load(sys.argv[1]))"
            ".movedim(-1, 0)[None]; np.savez(sys.argv[2], *[u.common_upscale(x, w, h, 'nearest-exact', 'center')[0]"
            ".movedim(0, -1).numpy() for w, h in SIZES])").replace("SIZES", repr(sizes))
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "in.npy"), str(tmp_path / "out.npz")],
                   cwd=comfyui_dir, check=True, timeout=120, env={**os.environ, "PYTHONPATH": str(comfyui_dir)})
    want = np.load(tmp_path / "out.npz")
    for i, (w, h) in enumerate(sizes):
        assert np.array_equal(fit_control(image, w, h)[0], want[f"arr_{i}"]), (w, h)


@pytest.mark.unit
def test_bad_controlnets_are_refused_naming_the_input_and_the_fix(tiny_models, tiny_controlnets, tmp_path):
    flux = api.make_spec("tiny-flux", [str(tiny_models)])
    sdxl = api.make_spec("tiny-sdxl", [str(tiny_models)])
    zimage = api.make_spec("tiny-zimage", [str(tiny_models)])
    union = _path(tiny_controlnets, "flux-union", file=True)
    image = _image(0)
    lora = tmp_path / "lora.safetensors"
    from safetensors.torch import save_file

    save_file({"lora_unet_x.lora_down.weight": torch.zeros(2, 2)}, str(lora))
    xlabs = tmp_path / "xlabs.safetensors"
    save_file({"double_blocks.0.img_attn.qkv.weight": torch.zeros(2, 2),
               "controlnet_blocks.0.weight": torch.zeros(2, 2)}, str(xlabs))
    cases = [
        (lambda: api.with_controlnet(flux, _path(tiny_controlnets, "sdxl", True), image),
         r"controlnet_name: 'tiny-sdxl\.safetensors' is a SDXL ControlNet \(ControlNetModel\); this pipeline is FLUX\.1"
         r".*Pick a FLUX\.1 ControlNet"),
        (lambda: api.with_controlnet(sdxl, _path(tiny_controlnets, "qwenimage", False), image),
         r"'tiny-qwenimage' is a Qwen-Image ControlNet.*Pick a SDXL ControlNet"),
        (lambda: api.with_controlnet(flux, union, image[..., 0]),
         r"image: an IMAGE of shape \[1, 1, 64, 64\] cannot be used; it must be \[batch, height, width, channels\]"),
        (lambda: api.with_controlnet(flux, union, image, union_mode="none"),
         r"union_mode: 'tiny-flux-union\.safetensors' is a union ControlNet.*it is 'none'\. Choose one of: canny, "
         r"tile, depth, blur, pose, gray, lq"),
        (lambda: api.with_controlnet(flux, union, image, union_mode="openpose"),
         r"union_mode: .*'openpose' is not one of its modes\. Choose one of: canny"),
        (lambda: api.with_controlnet(flux, _path(tiny_controlnets, "flux", True), image, union_mode="canny"),
         r"union_mode: 'tiny-flux\.safetensors' is not a union ControlNet.*set union_mode to none"),
        (lambda: api.with_controlnet(flux, union, image, 1.0, 0.6, 0.4, "canny"),
         r"start_percent, end_percent: 0\.6 and 0\.4 .*0 ≤ start < end ≤ 1"),
        (lambda: api.with_controlnet(flux, union, image, float("nan"), 0, 1, "canny"),
         r"strength: nan is not between 0 and 10"),
        (lambda: api.with_controlnet(flux, str(lora), image),
         r"controlnet_name: 'lora\.safetensors' holds no ControlNet ComfyUI-TPU recognises.*diffusers' layout"),
        (lambda: api.with_controlnet(flux, str(xlabs), image),
         r"'xlabs\.safetensors' is an XLabs FLUX\.1 ControlNet, a layout diffusers has no converter for"),
        (lambda: api.with_controlnet(api.with_controlnet(sdxl, _path(tiny_controlnets, "sdxl", True), image)[0],
                                     _path(tiny_controlnets, "sdxl-union", True), image, union_mode="depth"),
         r"diffusers runs SDXL's union ControlNets and its other ControlNets in different pipelines"),
        (lambda: api.with_controlnet(api.make_spec("tiny-flux2", [str(tiny_models)]), union, image),
         r"controlnet_name: FLUX\.2 .* takes no ControlNet in diffusers; the pipelines that do: FLUX\.1, SD3, SDXL, "
         r"Qwen-Image, Z-Image"),
        (lambda: api.with_controlnet(flux, _path(tiny_controlnets, "zimage", True), image),
         r"'tiny-zimage\.safetensors' is a Z-Image ControlNet \(ZImageControlNetModel\); this pipeline is FLUX\.1.*"
         r"Pick a FLUX\.1 ControlNet"),
        (lambda: api.with_controlnet(zimage, union, image, union_mode="canny"),
         r"'tiny-flux-union\.safetensors' is a FLUX\.1 ControlNet .*this pipeline is Z-Image.*Pick a Z-Image"),
        (lambda: api.with_controlnet(zimage, _path(tiny_controlnets, "zimage", False), image, union_mode="canny"),
         r"union_mode: 'tiny-zimage' is not a union ControlNet with modes \(a Z-Image ControlNet Union reads the kind "
         r"of control from the image itself\), so it has no mode 'canny'; set union_mode to none"),
        (lambda: api.with_controlnet(zimage, _path(tiny_controlnets, "zimage", True), image, 1.0, 0.0, 0.5),
         r"start_percent, end_percent: 0 and 0\.5 \('tiny-zimage\.safetensors'\): diffusers' Z-Image ControlNet "
         r"pipelines apply the ControlNet at every step; set 0 and 1"),
        (lambda: api.with_controlnet(api.with_controlnet(zimage, _path(tiny_controlnets, "zimage", True), image)[0],
                                     _path(tiny_controlnets, "zimage-1.0", True), image),
         r"'tiny-zimage-1\.0\.safetensors' is a second Z-Image ControlNet, and diffusers' ZImageControlNetPipeline "
         r"runs one; remove one of the chained Apply ControlNet nodes"),
        (lambda: api.with_controlnet(flux.with_changes(offload="sequential"), union, image, union_mode="canny"),
         r"cannot run with offload 'sequential'"),
    ]
    for call, words in cases:
        with pytest.raises(ModelError, match=words):
            call()
    # checked again when the whole spec is resolved: layouts and options added after the ControlNet
    controlled, text = api.with_controlnet(flux, union, image, 0.5, 0.0, 0.8, "depth")
    assert "1. tiny-flux-union.safetensors: strength 0.5, steps 0-0.8, union mode depth; control image 64x64" in text
    with pytest.raises(ModelError, match=r"cannot run under Context Parallel"):
        api.checked(layouts.plan_cp(controlled, 2, "ulysses")[0])
    with pytest.raises(ModelError, match=r"step_cache: 'first block' is not used with ControlNets"):
        api.checked(controlled.with_changes(step_cache="first block"))
    sd3, _ = api.with_controlnet(api.make_spec("tiny-sd3", [str(tiny_models)]), _path(tiny_controlnets, "sd3", True),
                                 image)
    with pytest.raises(ModelError, match=r"image: diffusers has no image to image pipeline for SD3 with a "
                                         r"ControlNet \(SD3ControlNetModel\); disconnect Sample's image"):
        api.prepare_sample(sd3, _request("sd3", denoise=0.5), image=image)
    mask = np.ones((1, 64, 64), np.float32)
    one, _ = api.with_controlnet(zimage, _path(tiny_controlnets, "zimage-1.0", True), image)
    with pytest.raises(ModelError, match=r"mask: 'tiny-zimage-1\.0\.safetensors' cannot inpaint: it reads the control "
                                         r"image only \(Z-Image-Turbo-Fun-Controlnet-Union 1\.0\).*2\.0 or later"):
        api.prepare_sample(one, _request("zimage"), image=image, mask=mask)
    two, _ = api.with_controlnet(zimage, _path(tiny_controlnets, "zimage", False), image)
    with pytest.raises(ModelError, match=r"denoise: 0\.5 with a mask and 'tiny-zimage'.*only denoise 1 works"):
        api.prepare_sample(two, _request("zimage", denoise=0.5), image=image, mask=mask)
    with pytest.raises(ModelError, match=r"image: diffusers has no image to image pipeline for Z-Image with a "
                                         r"ControlNet \(ZImageControlNetModel\)"):
        api.prepare_sample(two, _request("zimage", denoise=0.5), image=image)
    assert not controlled.to_dict()["controlnets"][0]["image"], "the image travels beside the spec, not in it"


@pytest.mark.unit
def test_offload_auto_counts_the_controlnets(tiny_models, tiny_controlnets, monkeypatch):
    spec = api.make_spec("tiny-flux", [str(tiny_models)], offload="auto").with_changes(kind="cuda")
    controlled, _ = api.with_controlnet(spec, _path(tiny_controlnets, "flux-union", True), _image(0),
                                        union_mode="canny")
    sizes = controlnets.weight_bytes(controlled, 2)["controlnet"]
    pipeline = sum(offload.models.weight_bytes(spec, 2).values())
    monkeypatch.setattr(offload.devices, "device_memory_bytes", lambda kind: (pipeline + sizes / 2) / offload.OFFLOAD_HEADROOM)
    assert offload.choose_offload(spec).mode == "none"
    chosen = offload.choose_offload(controlled)
    assert chosen.mode == "model" and "controlnet" in chosen.reason, chosen.reason


# ---- in the workers


@pytest.mark.workers
def test_each_family_equals_plain_diffusers_controlnet_pipeline(tiny_models, tiny_controlnets):
    """One worker, files and folders, one ControlNet or two chained, text to image, image to image and inpainting."""
    control, other, picture = _image(1), _image(2), _image(5)
    mask = np.zeros((1, 64, 64), np.float32)
    mask[:, 16:48, 16:48] = 1
    cases = [  # (family, [(ControlNet, file, strength, start, end, union mode)], plain pipeline, Sample inputs)
        ("flux", [("flux-union", True, 0.7, 0.0, 1.0, "canny")], "FluxControlNetPipeline", {}),
        ("flux", [("flux", False, 0.9, 0.0, 1.0, "none")], "FluxControlNetImg2ImgPipeline", {"denoise": 0.5}),
        ("sd3", [("sd3", True, 0.7, 0.0, 1.0, "none")], "StableDiffusion3ControlNetPipeline", {}),
        ("sdxl", [("sdxl", True, 0.6, 0.0, 1.0, "none"), ("sdxl", False, 0.4, 0.0, 0.5, "none")],
         "StableDiffusionXLControlNetPipeline", {}),
        ("sdxl", [("sdxl-union", True, 0.7, 0.0, 1.0, "depth")], "StableDiffusionXLControlNetUnionPipeline", {}),
        ("sdxl", [("sdxl-union", False, 0.7, 0.0, 1.0, "canny/lineart/anime_lineart/mlsd")],
         "StableDiffusionXLControlNetUnionInpaintPipeline", {"denoise": 1.0, "mask": True}),
        ("qwenimage", [("qwenimage", True, 0.7, 0.0, 1.0, "none")], "QwenImageControlNetPipeline", {}),
        ("zimage", [("zimage", True, 0.7, 0.0, 1.0, "none")], "ZImageControlNetPipeline", {}),
        ("zimage", [("zimage", False, 0.8, 0.0, 1.0, "none")], "ZImageControlNetInpaintPipeline",
         {"denoise": 1.0, "mask": True}),
    ]
    texts: list[tuple[str, str, np.ndarray]] = []
    for family, nets, pipeline, inputs in cases:
        spec = api.make_spec(MODELS[family], [str(tiny_models)])
        images = [control, other][:len(nets)]
        for (name, file, strength, start, end, mode), image in zip(nets, images, strict=True):
            spec, _ = api.with_controlnet(spec, _path(tiny_controlnets, name, file), image, strength, start, end, mode)
        req = _request(family, denoise=inputs.get("denoise", 1.0))
        call = {}
        start_image = picture if "denoise" in inputs else None
        if start_image is not None:
            steps, strength = schedule(req.steps, req.denoise, PIPELINES[spec.class_name].strength_floor)
            call.update(image=picture, strength=strength, num_inference_steps=steps)
        if inputs.get("mask"):
            call["mask_image"] = mask[..., None]
        got = api.sample(spec, req, image=start_image, mask=mask if inputs.get("mask") else None)
        kinds = PIPELINES[spec.class_name].controlnets
        modes = [next(k.modes.index(m) for k in kinds if m in k.modes) if m != "none" else -1 for *_, m in nets]
        want = _plain(tiny_models, tiny_controlnets, pipeline, [(n, s, b, e, m) for (n, _, s, b, e, _), m in
                                                               zip(nets, modes, strict=True)], images, family, **call)
        assert np.array_equal(got, want), (family, pipeline, float(np.abs(got - want).max()))
        texts.extend([(family, pipeline, got)] if not inputs else [])
    for family in {f for f, _, _ in texts}:  # text to image: each ControlNet changes the image
        plain = api.sample(api.make_spec(MODELS[family], [str(tiny_models)]), _request(family))
        assert all(np.abs(got - plain).max() > 0.02 for f, _, got in texts if f == family), family


@pytest.mark.workers
def test_strength_start_end_and_image_never_reload_or_recompile(tiny_models, tiny_controlnets):
    spec = api.make_spec("tiny-flux", [str(tiny_models)])
    compiled, _ = api.with_compile(spec, "whole denoiser", "eager", "", False)
    union = _path(tiny_controlnets, "flux-union", True)
    base = api.sample(compiled, _request())
    first = api.sample(api.with_controlnet(compiled, union, _image(1), 0.7, 0.0, 1.0, "canny")[0], _request())
    loads, before = api.worker_info()[0]["loads"], api.compile_stats()
    changes = [(_image(1), 0.3, 0.0, 1.0, "canny"), (_image(1), 0.7, 0.5, 0.9, "canny"),
               (_image(2), 0.7, 0.0, 1.0, "depth"), (_image(1), 0.0, 0.0, 1.0, "canny"),
               (_image(2), 0.0, 0.0, 1.0, "canny")]
    images = [api.sample(api.with_controlnet(compiled, union, *c)[0], _request()) for c in changes]
    after = api.compile_stats()
    assert after["graphs"] == before["graphs"] and after["unexpected_recompiles"] == 0, after
    assert after["hits"] == before["hits"] + len(changes)
    assert api.worker_info()[0]["loads"] == loads, "a ControlNet never reloads the model"
    assert all(not np.array_equal(i, first) for i in images[:-2]), "each change changes the image"
    assert np.array_equal(images[-1], images[-2]), "at strength 0 the control image does nothing"
    assert any("ControlNet tiny-flux-union.safetensors" in s["shape"] for s in after["shapes"])
    assert np.array_equal(api.sample(compiled, _request()), base), "removing it gives the pipeline back"
@pytest.mark.workers
def test_shard_tp_data_parallel_and_cfg_parallel_equal_one_worker(tiny_models, tiny_controlnets):
    """FLUX.1 sharded (the ControlNet replicated) and with two replicas; SDXL's CFG batch split with the residuals;
    Z-Image with two replicas."""
    flux, _ = api.with_controlnet(api.make_spec("tiny-flux", [str(tiny_models)]),
                                  _path(tiny_controlnets, "flux-union", True), _image(1), 0.7, 0.0, 1.0, "canny")
    sdxl, _ = api.with_controlnet(api.make_spec("tiny-sdxl", [str(tiny_models)]),
                                  _path(tiny_controlnets, "sdxl", True), _image(1), 0.7)
    zimage, _ = api.with_controlnet(api.make_spec("tiny-zimage", [str(tiny_models)]),
                                    _path(tiny_controlnets, "zimage", True), _image(1), 0.7)
    one, whole = api.sample(flux, _request(batch_size=2)), api.sample(sdxl, _request("sdxl"))  # one worker
    turbo = api.sample(zimage, _request("zimage", batch_size=2))
    sharded = api.sample(layouts.plan_tp(flux, 2)[0], _request(batch_size=2))  # then one group of two
    assert np.abs(sharded - one).max() <= TOLERANCE
    assert np.array_equal(api.sample(layouts.plan_dp(flux, 2)[0], _request(batch_size=2)), one)
    assert np.array_equal(api.sample(layouts.plan_dp(zimage, 2)[0], _request("zimage", batch_size=2)), turbo)
    split = api.sample(layouts.plan_cfg(sdxl)[0], _request("sdxl"))
    assert np.abs(split - whole).max() <= TOLERANCE
