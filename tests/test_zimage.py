"""Z-Image (Turbo and the base model, issue 24): the family as diffusers defines it, equal to plain diffusers on the
same inputs and seed, and what each parallel and compile choice does with it.

The tiny pipeline is backend/tiny_models.py's `tiny-zimage`; ComfyUI's split files are in tests/test_files.py
(CASES "zimage-*"); image to image and inpainting in tests/test_images.py; LoRA formats in tests/test_lora.py.
Turbo is guidance-distilled: used at guidance 0, where ZImagePipeline runs one transformer pass per step (diffusers
runs CFG for any guidance_scale above 0, on a doubled list of latents); the base model is used with CFG.
"""

from __future__ import annotations

import re
import types

import numpy as np
import pytest
import torch
from lora_fixtures import load, make

from backend.controller import api, capacity, layouts, offload
from backend.families import FAMILIES, PIPELINES, config_dir
from backend.protocol.errors import ParallelError
from backend.protocol.messages import Status
from backend.protocol.spec import SampleRequest, read_json

NAME = "tiny-zimage"
FOX, NEG = "a red fox in the snow", "blurry"
CFG_BATCH_TOLERANCE = 1e-4  # as tests/test_speed.py: half of a doubled batch rounds differently
COMPILE_TOLERANCE = 1e-5


def _spec(tiny_models, **kw):
    return api.make_spec(NAME, [str(tiny_models)], **kw)


def _request(**kw) -> SampleRequest:
    return SampleRequest(**{"prompt": FOX, "negative_prompt": NEG, "width": 64, "height": 48, "steps": 3,
                            "guidance": 0.0, "seed": 7, **kw})


def _plain(tiny_models, seed: int, guidance: float, pipe=None, **kw) -> np.ndarray:
    """What a plain diffusers script draws for one image (the worker makes one call per image)."""
    pipe = pipe or load(tiny_models, NAME)
    with torch.inference_mode():
        return pipe(prompt=FOX, negative_prompt=NEG, height=48, width=64, num_inference_steps=3,
                    guidance_scale=guidance, generator=[torch.Generator("cpu").manual_seed(seed)],
                    output_type="np", **kw).images


# ---- the family, held against diffusers itself

@pytest.mark.unit
def test_the_family_says_what_diffusers_has():
    """Repeated blocks yes; no tensor- or context-parallel plan; CFG for any guidance above 0, on one doubled call;
    the prompt padded inside to diffusers' SEQ_MULTI_OF."""
    import diffusers
    from diffusers.models.transformers import transformer_z_image

    family = PIPELINES["ZImagePipeline"]
    assert family.family == "zimage" and FAMILIES["zimage"].pipelines[0].class_name == "ZImagePipeline"
    cls = diffusers.ZImageTransformer2DModel
    assert family.repeated_blocks and cls._repeated_blocks == ["ZImageTransformerBlock"]
    assert not family.tp_plan and getattr(cls, "_tp_plan", None) is None
    assert not family.cp_plan and getattr(cls, "_cp_plan", None) is None
    assert family.prompt_step == transformer_z_image.SEQ_MULTI_OF
    rule = diffusers.ZImagePipeline.do_classifier_free_guidance.fget  # the pipeline's own property
    for guidance, cfg in ((0.0, False), (0.5, True), (1.0, True), (4.0, True)):
        assert rule(types.SimpleNamespace(_guidance_scale=guidance)) is cfg, guidance
        assert (guidance > family.cfg_above) is cfg, guidance
    assert (family.cfg_passes, family.cfg_doubles_batch, family.variable_text) == ("batch", True, True)
    assert (family.img2img, family.inpaint) == ("ZImageImg2ImgPipeline", "ZImageInpaintPipeline")


@pytest.mark.unit
def test_shard_tp_and_context_parallel_are_refused_naming_the_reason(tiny_models):
    spec = _spec(tiny_models)
    with pytest.raises(ParallelError) as e:
        api.shard(spec, 2)
    assert "Z-Image model (ZImagePipeline), which has no tensor-parallel plan" in str(e.value)
    assert "use Data Parallel instead" in str(e.value)
    with pytest.raises(ParallelError) as e:
        api.context_parallel(spec, 2)
    assert "whose transformer has no context-parallel plan" in str(e.value)


@pytest.mark.unit
def test_compiled_whole_is_turned_into_repeated_blocks_and_says_why(tiny_models):
    spec, notes = api.with_compile(_spec(tiny_models), "whole denoiser", "eager", "64x64")
    assert spec.compile.target == "repeated blocks"
    assert any("pads it to a multiple of 32 tokens inside" in n and "one compile per 32-token step" in n
               for n in notes), notes
    cfg, text = api.cfg_parallel(_spec(tiny_models))
    assert cfg.cfg_parallel == 2 and "guidance above 0; at 0 or below both run the whole call" in text


# the published Z-Image-Turbo's weights in bfloat16, counted from the shipped configs (backend/configs/zimage)
def _published_bytes() -> dict[str, int]:
    import diffusers
    import transformers

    folder = config_dir("zimage")
    sizes = {}
    with torch.device("meta"):
        for name, make_model in (
                ("transformer", lambda c: diffusers.ZImageTransformer2DModel.from_config(c)),
                ("vae", lambda c: diffusers.AutoencoderKL.from_config(c)),
                ("text_encoder", lambda c: transformers.Qwen3Model(transformers.Qwen3Config.from_dict(c)))):
            model = make_model(read_json(folder / name / "config.json"))
            sizes[name] = 2 * sum(p.numel() for p in model.parameters())
    return sizes


@pytest.mark.unit
def test_offload_auto_fits_the_published_model_per_tpu_generation(tiny_models, monkeypatch):
    """Z-Image-Turbo in bfloat16: a 6.15 B transformer (12.3 GB) and Qwen3-4B (8.0 GB) are 20.5 GB. A 16 GB v5e
    chip holds either alone: offload auto chooses 'model' (each part on the chip while it runs); 32 GB (v6e) holds
    both: 'none'. So one chip runs the 6B model, and Shard TP and Context Parallel are not needed for it."""
    sizes = _published_bytes()
    assert round(sizes["transformer"] / 1e9, 1) == 12.3 and round(sizes["text_encoder"] / 1e9, 1) == 8.0
    monkeypatch.setattr(offload.models, "weight_bytes", lambda path, float_bytes: dict(sizes))
    monkeypatch.setattr(capacity, "host_capacity", lambda kind: capacity.Capacity("tpu", 8, (1, 4, 8), "8 chips", True))
    for memory, mode in ((16 * 2**30, "model"), (32 * 2**30, "none")):
        monkeypatch.setattr(offload.devices, "device_memory_bytes", lambda kind, m=memory: m)
        choice = offload.choose_offload(_spec(tiny_models, offload="auto").with_changes(kind="tpu"))
        assert choice.mode == mode, choice.reason


# ---- in the worker, against plain diffusers

@pytest.mark.workers
def test_turbo_and_base_text_to_image_equal_plain_diffusers(tiny_models):
    """Guidance 0 (Turbo: one pass per step) and 4 with a negative prompt (the base model's CFG): each image of a
    batch equals a plain diffusers call with its own seed, bit for bit."""
    spec, pipe = _spec(tiny_models), load(tiny_models, NAME)
    for guidance in (0.0, 4.0):
        ours = api.sample(spec, _request(guidance=guidance, batch_size=2))
        assert ours.shape == (2, 48, 64, 3)
        for i in range(2):
            assert np.array_equal(ours[i:i + 1], _plain(tiny_models, 7 + i, guidance, pipe)), (guidance, i)
    assert not np.array_equal(api.sample(spec, _request(guidance=0.0)), api.sample(spec, _request(guidance=4.0)))


@pytest.mark.workers
def test_lora_in_the_worker_equals_diffusers_fused_lora(tiny_models, tmp_path):
    path = str(make(tiny_models, NAME, "diffusers", tmp_path, seed=4)[0])  # the one plain diffusers reads too
    spec = _spec(tiny_models)
    ours = api.sample(api.with_lora(spec, path, 0.8)[0], _request())
    pipe = load(tiny_models, NAME)
    pipe.load_lora_weights(path, adapter_name="a")
    pipe.fuse_lora(components=["transformer"], lora_scale=0.8)
    assert np.array_equal(ours, _plain(tiny_models, 7, 0.0, pipe))
    assert not np.array_equal(ours, api.sample(spec, _request()))


@pytest.mark.workers
def test_data_parallel_2_equals_one_worker(tiny_models):
    spec = _spec(tiny_models)
    one = api.sample(spec, _request(guidance=4.0, batch_size=3))
    dp, _ = layouts.plan_dp(spec, 2)
    assert np.array_equal(api.sample(dp, _request(guidance=4.0, batch_size=3)), one)
    workers = api.worker_info()
    assert len(workers) == 2


@pytest.mark.workers
def test_cfg_parallel_splits_the_base_models_cfg_and_runs_turbo_whole(tiny_models):
    spec = _spec(tiny_models)
    base, turbo = api.sample(spec, _request(guidance=4.0)), api.sample(spec, _request(guidance=0.0))
    cfg, _ = api.cfg_parallel(spec)
    assert np.abs(api.sample(cfg, _request(guidance=4.0)) - base).max() <= CFG_BATCH_TOLERANCE
    said: list[str] = []
    images = api.sample(cfg, _request(guidance=0.0), lambda m: said.append(getattr(m, "text", "")))
    assert np.array_equal(images, turbo), "guidance 0: one pass per step, both ranks run the whole call"
    assert any("runs one denoiser pass per step (guidance ≤ 0" in t for t in said), said


def _control(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((1, 48, 64, 3), dtype=np.float32)


@pytest.mark.workers
def test_compiled_repeated_blocks_compile_once_per_prompt_step(tiny_models, tiny_controlnets):
    """The blocks see the prompt padded to 32 tokens: prompts within one step reuse the graphs, a longer one is
    announced as a new shape; the images are the eager ones. A ControlNet (which runs the transformer's compiled
    refiner blocks too) compiles nothing more, whatever its strength and image."""
    spec = _spec(tiny_models)
    eager = {g: api.sample(spec, _request(guidance=g)) for g in (0.0, 4.0)}
    compiled, _ = api.with_compile(spec, "repeated blocks", "eager", "64x48")
    warm = api.load(compiled)["compile"]
    for g in (0.0, 4.0):
        assert np.abs(api.sample(compiled, _request(guidance=g)) - eager[g]).max() <= COMPILE_TOLERANCE
    stats = api.compile_stats()
    for prompt in ("a cat", "a red fox in the snow at night"):  # the same 32-token step as FOX
        api.sample(compiled, _request(prompt=prompt, guidance=4.0))
    after = api.compile_stats()
    assert after["graphs"] == stats["graphs"] and after["unexpected_recompiles"] == 0
    assert after["compiles"] >= warm["compiles"]
    net = str(tiny_controlnets / "files" / "tiny-zimage.safetensors")
    controlled = [api.sample(api.with_controlnet(compiled, net, _control(1), 0.7)[0], _request(guidance=4.0))]
    before = api.compile_stats()  # (the ControlNet's shape compiled once)
    controlled += [api.sample(api.with_controlnet(compiled, net, image, strength)[0], _request(guidance=4.0))
                   for image, strength in ((_control(1), 0.3), (_control(2), 0.7))]
    after = api.compile_stats()
    assert after["graphs"] == before["graphs"] and after["unexpected_recompiles"] == 0, after
    assert not np.array_equal(controlled[0], controlled[1]) and not np.array_equal(controlled[0], controlled[2])
    said: list = []
    api.sample(compiled, _request(prompt="a red fox in the snow " * 8), said.append)
    steps = [int(m.group(1)) for t in (m.text for m in said if isinstance(m, Status))
             if (m := re.fullmatch(r"compiling 64x48 \(batch 1, prompt ≤ (\d+) tokens\) for the first time…", t))]
    assert len(steps) == 1 and steps[0] > 32 and steps[0] % 32 == 0, said
    assert api.compile_stats()["unexpected_recompiles"] == 0
