"""Sample's image inputs (issue 13): image to image, inpainting and reference images with the family's own
diffusers pipelines (made with from_pipe), equal to those pipelines run by a plain script on the same inputs and
seed; denoise as in ComfyUI; sizes, grey images, masks and batches as documented in backend/controller/images.py.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from helpers import repaints, tiny_pipelines
from lora_fixtures import load

from backend.controller import api
from backend.families import PIPELINES
from backend.protocol.errors import ModelError
from backend.protocol.messages import Step
from backend.protocol.spec import SampleRequest, read_json
from backend.worker import images

PROMPT = "a red fox in the snow"


def _image(h: int = 64, w: int = 64, seed: int = 0, channels: int = 3) -> np.ndarray:
    """A smooth test picture [1, H, W, C] in 0..1 (values a PNG can hold exactly)."""
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([x / max(w - 1, 1), y / max(h - 1, 1), (x + y + 7 * seed) % 64 / 63], -1)
    rgb = np.round(rgb * 255) / 255
    return (rgb[..., :1] if channels == 1 else rgb)[None].astype(np.float32)


def _left_half(h: int = 64, w: int = 64) -> np.ndarray:
    mask = np.zeros((1, h, w), np.float32)
    mask[:, :, : w // 2] = 1.0
    return mask


def _request(**kw) -> SampleRequest:
    return SampleRequest(**{"prompt": PROMPT, "width": 64, "height": 64, "steps": 2, "guidance": 0.0, "seed": 5,
                            "denoise": 0.5, **kw})


def _spec(tiny_models, name="tiny-flux"):
    return api.make_spec(name, [str(tiny_models)])


# ---- denoise: exactly `steps` steps, for every image pipeline the pack uses

@pytest.mark.unit
def test_denoise_runs_exactly_steps_steps_in_every_image_pipeline():
    """diffusers' own get_timesteps, with the (num_inference_steps, strength) the worker passes: always `steps`
    steps, at the end of a schedule of int(steps / denoise), whichever way the pipeline rounds."""
    import diffusers

    classes = sorted({(c, f.strength_floor) for f in PIPELINES.values() for c in (f.img2img, f.inpaint) if c})
    stub = types.SimpleNamespace(scheduler=types.SimpleNamespace(timesteps=torch.arange(5000), order=1))
    for name, floor in classes:
        get_timesteps = getattr(diffusers, name).get_timesteps
        for steps in range(1, 41):
            for denoise in np.round(np.arange(0.01, 1.0001, 0.01), 2):
                total, strength = images.schedule(steps, float(denoise), floor)
                ran = get_timesteps(stub, total, strength, "cpu")[1]
                assert (ran, total) == (steps, max(steps, int(steps / denoise))), (name, steps, denoise, strength)


# ---- what the controller checks and says

@pytest.mark.unit
def test_inputs_are_checked_and_explained(tiny_models):
    flux = _spec(tiny_models)
    cases = [
        (flux, _request(), None, _left_half(), r"mask: a mask needs the image it belongs to"),
        (flux, _request(denoise=1.5), _image(), None, r"denoise: 1\.5 is not between 0 and 1"),
        (flux, _request(), np.zeros((64, 64)), None, r"image: an IMAGE of shape \[64, 64\] cannot be used"),
        (flux, _request(), _image() * np.nan, None, r"image: the image holds values that are not numbers"),
        (_spec(tiny_models, "tiny-flux2"), _request(), _image(), None,
         r"denoise: FLUX\.2 \[klein\] takes the image as a reference.*set denoise to 1 \(it is 0\.5\)"),
        (_spec(tiny_models, "tiny-flux2"), _request(denoise=1.0), _image(32, 80), None,
         r"reference images must be at least 64 pixels.*this one is 80x32"),
        (_spec(tiny_models, "tiny-flux2").with_changes(class_name="Flux2Pipeline"), _request(), _image(),
         _left_half(), r"mask: FLUX\.2 .*Flux2Pipeline.* has no inpainting pipeline"),
        (_spec(tiny_models, "tiny-qwenimage").with_changes(class_name="QwenImageEditPipeline"), _request(), None,
         None, r"is an edit model \(Qwen-Image-Edit\).*Connect an image"),
    ]
    for spec, req, image, mask, words in cases:
        with pytest.raises(ModelError, match=words):
            api.describe_inputs(spec, req, image, mask)
        with pytest.raises(ModelError, match=words):
            api.sample(spec, req, image=image, mask=mask)  # before any worker is asked

    notes = api.describe_inputs(flux, _request(batch_size=3), _image(48, 80, channels=1), _left_half(32, 32))
    assert notes == ["inpainting (mask: white = repaint), denoise 0.5: 2 steps of a 4-step schedule",
                     "image 80x48 stretched to 64x64 (Sample's width and height); turn on size_from_image to keep "
                     "the image's size",
                     "mask 32x32 is not the image's size: stretched to 64x64 like the image",
                     "1 input image for 3 images: image i (seed + i) starts from input image i (cycling: i mod 1)",
                     "the image has one channel (grey): used as RGB"]
    assert api.describe_inputs(flux, _request(denoise=0.0), _image())[1].startswith("denoise 0: nothing is repainted")
    assert api.describe_inputs(flux, _request(denoise=1.0)) == []
    assert api.describe_inputs(flux, _request()) == ["denoise 0.5 is ignored: it applies to an input image or "
                                                     "latent, and none is connected"]
    assert api.size_from_image(flux, _image(40, 72)) == (64, 32, "size_from_image: the image is 72x40; FLUX.1 needs "
                                                                  "multiples of 16, so the size is 64x32 (the image "
                                                                  "is stretched to it)")
    assert api.size_from_image(flux, _image(48, 80)) == (80, 48, None)


@pytest.mark.unit
def test_pixels_are_stretched_never_cropped_and_grey_becomes_rgb():
    picture = _image(48, 80)[0]
    assert np.array_equal(images.fit(picture, 80, 48), picture), "the right size is left as it is"
    stretched = images.fit(picture, 64, 64)
    assert stretched.shape == (64, 64, 3)
    corners = [(0, 0), (0, -1), (-1, 0), (-1, -1)]
    assert all(np.abs(stretched[y, x] - picture[y, x]).max() < 0.05 for y, x in corners), "all of it is still there"
    grey = _image(64, 64, channels=1)[0]
    assert np.array_equal(images.fit(grey, 64, 64), np.repeat(grey, 3, axis=-1))
    assert np.array_equal(images.fit(np.concatenate([picture, np.ones_like(picture[..., :1])], -1), 80, 48), picture)
    assert images.fit_mask(_left_half(32, 32)[0], 64, 64).shape == (64, 64)


@pytest.mark.unit
def test_input_images_travel_through_shm_to_every_rank_or_inline(tmp_path):
    """The controller writes an input once; every rank maps the same file (keep=True) and the controller deletes
    it afterwards. Without a usable /dev/shm the bytes follow the message on the socket."""
    import os
    from multiprocessing import Pipe

    from backend.protocol import handoff

    arrays = {"image": _image(48, 80), "mask": _left_half()}
    prefix = handoff.shm_prefix(f"{os.getpid()}-testinputs") + "in-"
    specs, inline = handoff.pack(arrays, prefix, 1)
    assert inline == [] and all(os.path.exists(s["shm"]) for s in specs)
    ranks = [Pipe() for _ in range(2)]
    for controller, _ in ranks:
        controller.send({"arrays": specs})
    got = [handoff.unpack(worker, worker.recv()["arrays"], keep=True) for _, worker in ranks]
    handoff.remove(specs)
    assert not any(os.path.exists(s["shm"]) for s in specs)
    for received in got:  # still readable: mapped before the files went
        assert all(np.array_equal(received[k], v) for k, v in arrays.items())
    specs, inline = handoff.pack(arrays, str(tmp_path / "no-such-dir" / "x-"), 2)
    assert len(inline) == 2 and not any("shm" in s for s in specs)
    controller, worker = Pipe()
    controller.send({"arrays": specs})
    for a in inline:
        controller.send_bytes(memoryview(a).cast("B"))
    received = handoff.unpack(worker, worker.recv()["arrays"], keep=True)
    assert all(np.array_equal(received[k], v) for k, v in arrays.items())


# ---- in the worker, against diffusers' own pipelines in this process

def _plain(tiny_models, name: str, cls_name: str, req: SampleRequest, **inputs) -> np.ndarray:
    import inspect

    import diffusers

    cls = getattr(diffusers, cls_name)
    pipe = load(tiny_models, name, cls=cls)
    params = inspect.signature(cls.__call__).parameters
    family = PIPELINES[read_json(tiny_models / name / "model_index.json")["_class_name"]]
    kw = {"prompt": req.prompt, "num_inference_steps": int(req.steps / req.denoise), "strength": req.denoise,
          "output_type": "np", "generator": [torch.Generator("cpu").manual_seed(req.seed)],
          family.guidance_arg: req.guidance, **inputs}
    kw.update({k: v for k, v in (("height", req.height), ("width", req.width)) if k in params})
    if "strength" not in params:  # reference images: a plain text-to-image schedule
        kw.pop("strength")
        kw["num_inference_steps"] = req.steps
    with torch.inference_mode():
        return pipe(**kw).images


@pytest.mark.workers
@pytest.mark.parametrize("name", tiny_pipelines(repaints))
def test_img2img_and_inpaint_equal_diffusers_own_pipelines(tiny_models, name):
    spec = _spec(tiny_models, name)
    family = spec.family
    req = _request()  # 2 steps at denoise 0.5: the last 2 of a 4-step schedule
    image, mask = _image(), _left_half()
    steps = []
    ours = api.sample(spec, req, lambda m: steps.append(m) if isinstance(m, Step) else None, image=image)
    assert np.array_equal(ours, _plain(tiny_models, name, family.img2img, req, image=image))
    assert [m.step for m in steps] == [1, 2], "denoise 0.5 runs `steps` steps"
    ours = api.sample(spec, req, image=image, mask=mask)
    assert np.array_equal(ours, _plain(tiny_models, name, family.inpaint, req, image=image,
                                       mask_image=mask[..., None]))
    # ComfyUI's MASK (1 = repaint) goes in as it is: diffusers' convention too (white = repaint)
    assert not np.array_equal(ours, api.sample(spec, req, image=image, mask=1 - mask))


@pytest.mark.workers
def test_denoise_0_and_1_grey_images_masks_of_another_size_and_batches(tiny_models):
    spec = _spec(tiny_models)
    image = _image()
    assert np.array_equal(api.sample(spec, _request(denoise=0.0), image=image), image), "denoise 0: the input back"
    assert np.array_equal(api.sample(spec, _request(denoise=0.0), image=_image(32, 32)),
                          images.fit(_image(32, 32)[0], 64, 64)[None]), "…at the size asked"
    full = api.sample(spec, _request(denoise=1.0), image=image)
    assert np.array_equal(full, _plain(tiny_models, "tiny-flux", "FluxImg2ImgPipeline", _request(denoise=1.0),
                                       image=image))
    text = api.sample(spec, _request())
    assert not np.array_equal(full, text), "denoise 1 is not text to image: the image's encoding draws noise first"
    grey = _image(channels=1)
    assert np.array_equal(api.sample(spec, _request(), image=grey),
                          api.sample(spec, _request(), image=np.repeat(grey, 3, axis=-1)))
    small_mask = _left_half(32, 32)
    assert np.array_equal(api.sample(spec, _request(), image=image, mask=small_mask),
                          api.sample(spec, _request(), image=image, mask=_left_half()))
    two = np.concatenate([_image(seed=0), _image(seed=1)])
    batch = api.sample(spec, _request(batch_size=3), image=two)
    for i in range(3):  # image i (seed + i) starts from input i mod 2
        alone = api.sample(spec, _request(seed=5 + i), image=two[i % 2:i % 2 + 1])
        assert np.array_equal(batch[i], alone[0]), i
    stretched = api.sample(spec, _request(), image=_image(48, 80))
    assert stretched.shape == (1, 64, 64, 3)


def _with_latents(spec, req: SampleRequest, latent: np.ndarray | None = None, outputs="images+latents") -> dict:
    """Sample's images and LATENT (tests/test_latents.py has the rest), from a LATENT when one is given."""
    if latent is not None:
        latent, width, height, batch = api.latent_input(spec, latent)
        req = SampleRequest(**{**req.to_dict(), "width": width, "height": height, "batch_size": batch})
    return api.run_sample_outputs(api.prepare_sample(spec, SampleRequest(**{**req.to_dict(), "outputs": outputs}),
                                                     latent=latent))


@pytest.mark.workers
def test_image_inputs_compiled_and_on_two_replicas(tiny_models):
    """The image pipelines share the loaded modules: the compiled denoiser serves them without a new graph (from a
    LATENT too); two data-parallel replicas each get the inputs (one /dev/shm file both map, deleted after the
    request), and hand back their slices' LATENTs in image order, none decoding for Sample Latent."""
    import glob

    from backend.controller import group, layouts
    from backend.protocol import handoff

    spec = _spec(tiny_models)
    image, mask = np.concatenate([_image(seed=0), _image(seed=1)]), _left_half()
    want = [api.sample(spec, _request(batch_size=2), image=image), api.sample(spec, _request(), image=image,
                                                                                mask=mask)]
    start = _with_latents(spec, _request(denoise=1.0, batch_size=2))
    from_latent = _with_latents(spec, _request(), start["latents"])
    compiled, _ = api.with_compile(spec, "whole denoiser", "eager", "64x64", False)
    api.sample(compiled, _request(denoise=1.0))
    before = api.compile_stats()
    assert np.array_equal(api.sample(compiled, _request(batch_size=2), image=image), want[0])
    assert np.array_equal(api.sample(compiled, _request(), image=image, mask=mask), want[1])
    got = _with_latents(compiled, _request(), start["latents"])
    assert all(np.array_equal(got[k], from_latent[k]) for k in ("images", "latents"))
    after = api.compile_stats()
    assert after["graphs"] == before["graphs"] and after["unexpected_recompiles"] == 0
    dp, _ = layouts.plan_dp(spec, 2)
    assert np.array_equal(api.sample(dp, _request(batch_size=2), image=image), want[0])
    for req, latent, expected in ((_request(denoise=1.0, batch_size=2), None, start),
                                  (_request(), start["latents"], from_latent)):
        got = _with_latents(dp, req, latent)
        assert all(np.array_equal(got[k], expected[k]) for k in ("images", "latents"))
    decodes = [w["vae_decodes"] for w in api.worker_info()]
    only = _with_latents(dp, _request(denoise=1.0, batch_size=2), outputs="latents")
    assert list(only) == ["latents"] and np.array_equal(only["latents"], start["latents"])
    assert [w["vae_decodes"] for w in api.worker_info()] == decodes, "Sample Latent: no replica decodes"
    inputs = handoff.shm_prefix(group.current_group().group_id) + "in-"
    assert glob.glob(glob.escape(inputs) + "*") == [], "the input files are gone after the request"


@pytest.mark.workers
def test_flux2_takes_the_images_as_references(tiny_models):
    import PIL.Image

    spec = _spec(tiny_models, "tiny-flux2")
    req = _request(denoise=1.0)
    refs = np.concatenate([_image(seed=0), _image(seed=1)])
    ours = api.sample(spec, req, image=refs)
    pil = [PIL.Image.fromarray((r * 255).round().astype(np.uint8)) for r in refs]
    assert np.array_equal(ours, _plain(tiny_models, "tiny-flux2", "Flux2KleinPipeline", req, image=pil))
    assert not np.array_equal(ours, api.sample(spec, req))


@pytest.fixture(scope="module")
def qwen_edit(tiny_models, tmp_path_factory):
    """A tiny Qwen-Image-Edit folder: the tiny Qwen-Image with a Qwen2-VL processor, saved by diffusers."""
    from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    root = tmp_path_factory.mktemp("edit-models")
    base = load(tiny_models, "tiny-qwenimage")
    sizes = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2}
    processor = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor(**sizes), tokenizer=base.tokenizer,
                                 video_processor=Qwen2VLVideoProcessor(**sizes))
    QwenImageEditPipeline.from_pipe(base, processor=processor).save_pretrained(root / "tiny-qwenimage-edit")
    # Qwen-Image-Edit-2509 and -2511 are Edit Plus pipelines (several reference images) over the same transformer
    # tensors; 2511 sets zero_cond_t (the reference images' tokens modulated at timestep 0), a config flag only
    plus = QwenImageEditPlusPipeline.from_pipe(base, processor=processor)
    plus.save_pretrained(root / "tiny-qwenimage-edit-2509")
    t = base.transformer
    zero = type(t).from_config({**t.config, "zero_cond_t": True})
    zero.load_state_dict(t.state_dict(), strict=True)
    QwenImageEditPlusPipeline.from_pipe(plus, transformer=zero.eval()).save_pretrained(root / "tiny-qwenimage-edit-2511")
    return root


@pytest.mark.workers
def test_qwen_image_edit_takes_the_image_and_needs_one(qwen_edit):
    import PIL.Image

    spec = api.make_spec("tiny-qwenimage-edit", [str(qwen_edit)])
    req = _request(denoise=1.0)
    ours = api.sample(spec, req, image=_image())
    pil = PIL.Image.fromarray((_image()[0] * 255).round().astype(np.uint8))
    assert np.array_equal(ours, _plain(qwen_edit, "tiny-qwenimage-edit", "QwenImageEditPipeline", req, image=pil,
                                       negative_prompt=""))
    with pytest.raises(ModelError, match=r"edit model \(Qwen-Image-Edit\).*Connect an image"):
        api.sample(spec, req)


@pytest.mark.workers
def test_qwen_image_edit_2509_and_2511_take_several_images(qwen_edit):
    """Edit Plus folders (2509; 2511 with zero_cond_t in its transformer config) load as diffusers saved them and
    take every input image as a reference, equal to QwenImageEditPlusPipeline on the same images and seed."""
    import PIL.Image

    req = _request(denoise=1.0, guidance=2.0, negative_prompt="blurry")
    refs = np.concatenate([_image(seed=0), _image(seed=1)])
    pil = [PIL.Image.fromarray((r * 255).round().astype(np.uint8)) for r in refs]
    images = {}
    for name in ("tiny-qwenimage-edit-2509", "tiny-qwenimage-edit-2511"):
        spec = api.make_spec(name, [str(qwen_edit)])
        assert spec.class_name == "QwenImageEditPlusPipeline"
        images[name] = api.sample(spec, req, image=refs)
        assert np.array_equal(images[name], _plain(qwen_edit, name, "QwenImageEditPlusPipeline", req, image=pil,
                                                   negative_prompt="blurry")), name
    assert not np.array_equal(*images.values()), "zero_cond_t changes the image"


@pytest.mark.workers
def test_image_inputs_with_cfg_and_context_parallel_batched_and_the_prompt_cache(tiny_models, qwen_edit):
    """Image inputs compose with the one-image-faster modes: the image pipelines (made with from_pipe) share the
    denoiser that CFG Parallel and Context Parallel split; batched calls are for text to image only (image i
    still takes input i); the prompt cache serves the image pipelines too."""
    image, mask, two = _image(), _left_half(), np.concatenate([_image(seed=0), _image(seed=1)])
    sd3, flux = _spec(tiny_models, "tiny-sd3"), _spec(tiny_models)
    edit = api.make_spec("tiny-qwenimage-edit", [str(qwen_edit)])
    sd3_req, edit_req = _request(guidance=3.0), _request(guidance=2.0, negative_prompt="blurry", denoise=1.0)
    # one worker
    flux_want = api.sample(flux, _request(), image=image, mask=mask)
    hits = api.worker_info()[0]["prompt_cache"]["hits"]
    api.sample(flux, _request(seed=77), image=image, mask=mask)
    assert api.worker_info()[0]["prompt_cache"]["hits"] > hits, "a new seed reuses the prompt's embeddings"
    batched = api.sampling_options(flux, batched=True)[0]
    assert np.array_equal(api.sample(batched, _request(batch_size=3), image=two),
                          api.sample(flux, _request(batch_size=3), image=two))
    sd3_want = api.sample(sd3, sd3_req, image=image, mask=mask)
    edit_want = api.sample(edit, edit_req, image=image)
    sd3_start = _with_latents(sd3, _request(denoise=1.0), outputs="latents")["latents"]
    sd3_latent = _with_latents(sd3, sd3_req, sd3_start)
    # two workers: CFG on a doubled batch within 1e-4 of one worker (from a LATENT too), as two branches bit-identical
    sd3_cfg = api.sample(api.cfg_parallel(sd3)[0], sd3_req, image=image, mask=mask)
    assert np.abs(sd3_cfg - sd3_want).max() <= 1e-4
    got = _with_latents(api.cfg_parallel(sd3)[0], sd3_req, sd3_start)
    assert all(np.abs(got[k] - sd3_latent[k]).max() <= 1e-4 for k in ("images", "latents"))
    assert np.array_equal(api.sample(api.cfg_parallel(edit)[0], edit_req, image=image), edit_want)
    flux_cp = api.sample(api.context_parallel(flux, 2)[0], _request(), image=image, mask=mask)
    assert np.abs(flux_cp - flux_want).max() <= 1e-4


# ---- through a real ComfyUI: Load Image (with its mask) into Sample

@pytest.mark.server
def test_sample_with_comfyuis_load_image_and_its_mask(server):
    from comfy_server import error_message
    from PIL import Image

    rgba = np.concatenate([_image(48, 80)[0], np.ones((48, 80, 1), np.float32)], -1)
    rgba[:, :40, 3] = 0.0  # transparent left half: Load Image's mask is 1 there (repaint)
    (server.work_dir / "input").mkdir(exist_ok=True)
    Image.fromarray((rgba * 255).round().astype(np.uint8), "RGBA").save(server.work_dir / "input" / "fox.png")
    prompt = {
        "1": {"class_type": "LoadTPUPipeline", "inputs": {"model": "tiny-flux", "dtype": "auto", "device": "auto",
                                                           "offload": "none"}},
        "2": {"class_type": "LoadImage", "inputs": {"image": "fox.png"}},
        "3": {"class_type": "TPUSample", "inputs": {"pipeline": ["1", 0], "prompt": PROMPT, "negative_prompt": "",
                                                     "width": 64, "height": 64, "steps": 2, "guidance": 0.0,
                                                     "seed": 5, "batch_size": 1, "image": ["2", 0], "mask": ["2", 1],
                                                     "denoise": 0.6, "size_from_image": True}},
        "4": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "inpaint"}},
    }
    result = server.run(prompt)
    assert result["status"] == "success", error_message(result)
    with Image.open(result["images"][0]) as im:
        assert im.size == (80, 48), "size_from_image: the output has the image's size"
    texts = "\n".join(m["data"]["text"] for m in result["messages"]
                      if m["type"] == "progress_text" and m["data"]["node"] == "3")
    assert "size 80x48, from the image" in texts and "inpainting (mask: white = repaint), denoise 0.6" in texts
    prompt["3"]["inputs"].update(denoise=1.5)
    rejected = server.post("/prompt", json={"prompt": prompt})
    assert rejected.status_code == 400 and "denoise" in rejected.text
