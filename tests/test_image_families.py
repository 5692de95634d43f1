"""Qwen-Image 2.1, Krea 2 and Ideogram 4 (issue 36): each family as diffusers defines it, its layouts, its ComfyUI
files recognised and refused naming the way that works, and its images equal to plain diffusers on the same inputs
and seed through the pack's API.

The tiny pipelines are backend/tiny_models.py's tiny-qwenimage21, tiny-krea2 and tiny-ideogram4; their sampling,
loading and LoRA formats also run in the parametrised family tests (tests/test_tiny_models.py, test_backend.py,
test_lora.py).
"""

from __future__ import annotations

import json
import shutil
import types

import numpy as np
import pytest
import torch
from lora_fixtures import fuse, load, make

from backend.controller import api
from backend.controller.files import assemble, listing
from backend.families import FAMILIES, PIPELINES
from backend.protocol.errors import InputError, ModelError, OptionError, ParallelError, SampleError
from backend.protocol.spec import SampleRequest

FOX, NEG = "a red fox in the snow", "blurry"
TOLERANCE = 1e-4
# pipeline class -> (tiny folder, its transformer class in diffusers)
NEW = {"QwenImage21Pipeline": ("tiny-qwenimage21", "QwenImage21Transformer2DModel"),
       "Krea2Pipeline": ("tiny-krea2", "Krea2Transformer2DModel"),
       "Ideogram4Pipeline": ("tiny-ideogram4", "Ideogram4Transformer2DModel")}


def _spec(tiny_models, name: str):
    return api.make_spec(name, [str(tiny_models)])


def _request(**kw) -> SampleRequest:
    return SampleRequest(**{"prompt": FOX, "negative_prompt": NEG, "width": 64, "height": 32, "steps": 3,
                            "guidance": 0.0, "seed": 7, **kw})


def _plain(pipe, seed: int, **kw) -> np.ndarray:
    """What a plain diffusers script draws for one image, RGB (the worker makes one call per image)."""
    with torch.inference_mode():
        images = pipe(prompt=FOX, height=32, width=64, num_inference_steps=3, output_type="np",
                      generator=[torch.Generator("cpu").manual_seed(seed)], **kw).images
    return np.asarray(images)[..., :3]


# ---- the families, held against diffusers itself

@pytest.mark.unit
@pytest.mark.parametrize("class_name", sorted(NEW))
def test_each_family_says_what_diffusers_has(class_name):
    """Plans, repeated blocks and LoRA as diffusers' classes have them; ComfyUI's files load (tests/test_files.py);
    Ideogram 4's through the family's own converter, which diffusers 0.42.1 lacks (its single-file loader has no
    entry for Ideogram4Transformer2DModel), the tapped Qwen3-VL layers diffusers' own."""
    import diffusers
    from diffusers.models import transformers

    family = PIPELINES[class_name]
    cls = getattr(transformers, NEW[class_name][1])
    assert family.tp_plan is bool(getattr(cls, "_tp_plan", None)), class_name
    assert family.cp_plan is bool(getattr(cls, "_cp_plan", None)), class_name
    assert family.repeated_blocks is bool(cls._repeated_blocks), class_name
    assert hasattr(getattr(diffusers, class_name), "load_lora_weights"), class_name
    assert FAMILIES[family.family].files
    if class_name == "Ideogram4Pipeline":
        from diffusers.loaders.single_file_model import SINGLE_FILE_LOADABLE_CLASSES
        from diffusers.pipelines.ideogram4.pipeline_ideogram4 import QWEN3_VL_ACTIVATION_LAYERS

        from backend.families import converters, ideogram4

        assert NEW[class_name][1] not in SINGLE_FILE_LOADABLE_CLASSES and "ideogram4" in converters("DENOISER")
        assert ideogram4.TAPPED_LAYERS == len(QWEN3_VL_ACTIVATION_LAYERS)


@pytest.mark.unit
def test_guidance_follows_each_pipelines_own_rule():
    """Qwen-Image 2.1: true CFG above 1 with a negative prompt, named branches; Krea 2: CFG for any guidance above
    0, unnamed; Ideogram 4: a constant guidance_scale with guidance_schedule=None, as its default schedule holds
    48 entries and any other step count needs one of its own length."""
    import inspect

    import diffusers

    from backend.worker.cfg_parallel import named_branches, two_passes

    qi21, krea, ideogram = (PIPELINES[c] for c in ("QwenImage21Pipeline", "Krea2Pipeline", "Ideogram4Pipeline"))
    assert (qi21.guidance_arg, qi21.cfg_passes, qi21.alpha, qi21.references) == ("true_cfg_scale", "branches", True, True)
    assert named_branches(object.__new__(diffusers.QwenImage21Pipeline))
    rule = diffusers.Krea2Pipeline.do_classifier_free_guidance.fget
    # Turbo (is_distilled: the shift only; CFG still runs when asked), under its own class name (CFG Parallel finds
    # its declaration by it)
    turbo = type("Krea2Pipeline", (diffusers.Krea2Pipeline,), {"config": types.SimpleNamespace(is_distilled=True)})
    pipe = object.__new__(turbo)
    assert not named_branches(pipe) and krea.unnamed_branches
    for guidance in (0.0, 0.5, 4.5):
        cfg = rule(types.SimpleNamespace(_guidance_scale=guidance))
        assert (guidance > krea.cfg_above) is cfg
        assert two_passes(pipe, krea.cfg_passes, {"guidance_scale": guidance}, krea.cfg_above,
                          krea.distilled_key) is cfg, guidance
    default = inspect.signature(diffusers.Ideogram4Pipeline.__call__).parameters["guidance_schedule"].default
    assert len(default) == 48 and dict(ideogram.call_args) == {"guidance_schedule": None}
    assert ideogram.guidance_arg == "guidance_scale" and ideogram.cfg_passes == "models"


@pytest.mark.unit
@pytest.mark.parametrize("class_name", sorted(NEW))
def test_layouts_follow_the_declarations(tiny_models, class_name):
    """Shard TP only with diffusers' plan (Qwen-Image 2.1); Context Parallel refused (no plan); CFG Parallel where
    one denoiser runs the two passes, refused for Ideogram 4's two models."""
    family, spec = PIPELINES[class_name], _spec(tiny_models, NEW[class_name][0])
    if family.tp_plan:
        sharded, _ = api.shard(spec, 2)
        assert sharded.tp_degree == 2
    else:
        with pytest.raises(ParallelError, match="which has no tensor-parallel plan"):
            api.shard(spec, 2)
    with pytest.raises(ParallelError, match="whose transformer has no context-parallel plan"):
        api.context_parallel(spec, 2)
    if family.cfg_passes == "models":
        with pytest.raises(ParallelError, match="two models .* which CFG Parallel does not split yet"):
            api.cfg_parallel(spec)
    else:
        cfg, text = api.cfg_parallel(spec)
        assert cfg.cfg_parallel == 2 and f"guidance above {family.cfg_above:g}" in text


def _comfy_layout(class_name: str, sd: dict) -> dict:
    """The tiny transformer's weights in ComfyUI's layout (what its converters undo): Qwen-Image 2.1's fused
    gate_up, Krea 2's own names, Ideogram 4's fused qkv and `o` (file_fixtures.ideogram4_transformer_file checks
    those against ComfyUI's module names); under model.diffusion_model."""
    out = {}
    for key, value in sd.items():
        if class_name == "QwenImage21Pipeline" and key.endswith("img_mlp.gate_layer.weight"):
            key, value = key.replace("gate_layer", "gate_up"), torch.cat([value, sd[key.replace("gate_layer", "proj")]])
        elif class_name == "QwenImage21Pipeline" and key.endswith("img_mlp.proj.weight"):
            continue
        elif class_name == "Ideogram4Pipeline" and ".attention.to_q." in key:
            parts = [sd[key.replace("to_q", n)] for n in ("to_q", "to_k", "to_v")]
            key, value = key.replace("to_q", "qkv"), torch.cat(parts)
        elif class_name == "Ideogram4Pipeline" and (".attention.to_k." in key or ".attention.to_v." in key):
            continue
        elif class_name == "Ideogram4Pipeline":
            key = key.replace(".attention.to_out.0.", ".attention.o.")
        elif class_name == "Krea2Pipeline":
            for old, new in (("img_in.", "first."), ("text_fusion.", "txtfusion."), ("transformer_blocks.", "blocks."),
                             (".attn.to_q.", ".attn.wq."), (".attn.to_k.", ".attn.wk."), (".attn.to_v.", ".attn.wv."),
                             (".attn.to_out.0.", ".attn.wo."), (".attn.to_gate.", ".attn.gate.")):
                key = key.replace(old, new)
        out[f"model.diffusion_model.{key}"] = value.contiguous()
    return out


@pytest.mark.unit
@pytest.mark.parametrize("class_name", sorted(NEW))
def test_comfyui_files_are_recognised_and_load_or_are_refused_naming_why(tiny_models, tmp_path, class_name):
    """Each family's diffusion model is recognised under ComfyUI's checkpoint prefix and loads: alone, the loader
    asks for its Qwen3-VL text encoder, and Ideogram 4's conditional transformer first for its unconditional one
    (tests/test_files.py loads them whole)."""
    from safetensors.torch import load_file, save_file

    folder = tiny_models / NEW[class_name][0] / "transformer"
    sd = load_file(str(next(folder.glob("*.safetensors"))))
    models = tmp_path / "models"
    for sub in listing.ROLE_FOLDERS.values():
        (models / sub).mkdir(parents=True, exist_ok=True)
    save_file(_comfy_layout(class_name, sd), str(models / "diffusion_models" / "tiny-comfy.safetensors"))
    roots = {role: [str(models / sub)] for role, sub in listing.ROLE_FOLDERS.items()}
    name = PIPELINES[class_name].name
    with pytest.raises((InputError, ModelError)) as e:
        api.make_file_spec(assemble.FileChoice(diffusion_model="tiny-comfy.safetensors"), roots)
    if class_name == "Ideogram4Pipeline":
        assert str(e.value) == (
            "diffusion_model_2: Ideogram 4 runs two transformers every step, the conditional transformer "
            "(diffusion_model) and the unconditional transformer (diffusion_model_2, "
            "ideogram4_unconditional_*.safetensors); only 'tiny-comfy.safetensors' was chosen. Choose the "
            "unconditional transformer in diffusion_model_2.")
    else:
        assert f"text_encoder: {name} needs Qwen3-VL" in str(e.value) and "is missing" in str(e.value)


@pytest.mark.unit
@pytest.mark.parametrize("class_name", ["Krea2Pipeline", "Ideogram4Pipeline"])
def test_an_input_image_is_refused_naming_why(tiny_models, class_name):
    """Krea 2's style reference is not in diffusers (no image input, no reference tokens); Ideogram 4 is text only."""
    spec = _spec(tiny_models, NEW[class_name][0])
    with pytest.raises(ModelError) as e:
        api.prepare_sample(spec, _request(), np.full((1, 64, 64, 3), 0.5, np.float32), None)
    text = str(e.value)
    assert f"is {PIPELINES[class_name].name} ({class_name}), which takes no input image" in text
    assert "Disconnect the image" in text
    assert class_name != "Krea2Pipeline" or "style LoRA" in text


# ---- in the worker, against plain diffusers

def _references() -> np.ndarray:
    """Two 64x64 reference images whose values are 8-bit exact (the worker hands the pipeline 8-bit PIL images)."""
    rng = np.random.RandomState(3)
    return (rng.randint(0, 256, (2, 64, 64, 3)) / 255).astype(np.float32)


@pytest.mark.workers
def test_qwen_image_21_text_to_image_and_edit_with_two_references_equal_plain_diffusers(tiny_models):
    """True CFG off (1) and on (4, negative prompt); editing with two references (Sample's image batch, every one a
    reference of every image). Its RGBA images come back RGB."""
    import PIL.Image

    spec, pipe = _spec(tiny_models, "tiny-qwenimage21"), load(tiny_models, "tiny-qwenimage21")
    for guidance in (1.0, 4.0):
        ours = api.sample(spec, _request(guidance=guidance, batch_size=2))
        assert ours.shape == (2, 32, 64, 3)
        for i in range(2):
            plain = _plain(pipe, 7 + i, true_cfg_scale=guidance, negative_prompt=NEG)
            assert np.abs(ours[i:i + 1] - plain).max() <= TOLERANCE, (guidance, i)
    refs = _references()
    ours = api.sample(spec, _request(guidance=1.0), image=refs)
    pictures = [PIL.Image.fromarray((r * 255).round().astype(np.uint8)) for r in refs]
    plain = _plain(pipe, 7, true_cfg_scale=1.0, negative_prompt=NEG, image=pictures)
    assert np.abs(ours - plain).max() <= TOLERANCE
    assert np.abs(ours - api.sample(spec, _request(guidance=1.0))).max() > 1e-3, "the references change the image"


@pytest.mark.workers
def test_krea_2_base_and_turbo_equal_plain_diffusers(tiny_models, tmp_path):
    """Guidance 2 (two passes, the Krea convention) and 0 (Turbo: one pass; is_distilled fixes the shift)."""
    spec, pipe = _spec(tiny_models, "tiny-krea2"), load(tiny_models, "tiny-krea2")
    ours = api.sample(spec, _request(guidance=2.0))
    assert np.abs(ours - _plain(pipe, 7, guidance_scale=2.0, negative_prompt=NEG)).max() <= TOLERANCE
    turbo = tmp_path / "tiny-krea2-turbo"
    shutil.copytree(tiny_models / "tiny-krea2", turbo)
    index = json.loads((turbo / "model_index.json").read_text())
    (turbo / "model_index.json").write_text(json.dumps({**index, "is_distilled": True}))
    fast = api.sample(api.make_spec(turbo.name, [str(tmp_path)]), _request(guidance=0.0))
    plain = _plain(load(tmp_path, turbo.name), 7, guidance_scale=0.0)
    assert np.abs(fast - plain).max() <= TOLERANCE
    assert np.abs(fast - _plain(pipe, 7, guidance_scale=0.0)).max() > 1e-4, "the Turbo shift changes the image"


@pytest.mark.workers
def test_ideogram_4_equals_plain_diffusers_at_any_step_count(tiny_models):
    """Both transformers each step; Sample's guidance as a constant scale, at 3 and 5 steps (neither fits the
    pipeline's 48-entry default schedule)."""
    spec, pipe = _spec(tiny_models, "tiny-ideogram4"), load(tiny_models, "tiny-ideogram4")
    for steps in (3, 5):
        ours = api.sample(spec, _request(guidance=3.0, steps=steps, negative_prompt=""))
        with torch.inference_mode():
            plain = pipe(prompt=FOX, height=32, width=64, num_inference_steps=steps, guidance_scale=3.0,
                         guidance_schedule=None, generator=[torch.Generator("cpu").manual_seed(7)],
                         output_type="np").images
        assert np.abs(ours - plain).max() <= TOLERANCE, steps


# guidance of each family's LoRA check, in Sample's terms and as the plain call's arguments
_ONE_PASS = {"QwenImage21Pipeline": (1.0, {"true_cfg_scale": 1.0, "negative_prompt": NEG}),
             "Krea2Pipeline": (0.0, {"guidance_scale": 0.0}),
             "Ideogram4Pipeline": (1.0, {"guidance_scale": 1.0, "guidance_schedule": None})}


@pytest.mark.workers
@pytest.mark.parametrize("class_name", sorted(NEW))
def test_a_diffusers_lora_equals_plain_diffusers_load_lora_weights(tiny_models, tmp_path, class_name):
    """A LoRA in diffusers' format (peft, save_lora_weights) through Load LoRA equals diffusers' own
    load_lora_weights + fuse_lora at the same strength; removing it gives the image without it back."""
    name = NEW[class_name][0]
    path, _ = make(tiny_models, name, "diffusers", tmp_path, seed=4)
    guidance, plain_kw = _ONE_PASS[class_name]
    spec = _spec(tiny_models, name)
    base = api.sample(spec, _request(guidance=guidance))
    with_lora, _ = api.with_lora(spec, str(path), 0.8, 0.8)
    ours = api.sample(with_lora, _request(guidance=guidance))
    pipe = load(tiny_models, name)
    fuse(pipe, [(str(path), 0.8)])
    assert np.abs(ours - _plain(pipe, 7, **plain_kw)).max() <= TOLERANCE
    assert np.abs(ours - base).max() > 1e-3, "the LoRA changes the image"
    assert np.array_equal(api.sample(spec, _request(guidance=guidance)), base)


@pytest.mark.workers
def test_qwen_image_21_edit_under_cfg_parallel_is_bit_identical(tiny_models):
    """Editing with true CFG on two ranks: the prediction is the joint sequence at the first step (longer than the
    input: prompt tokens first) and the target's tokens alone after it (shorter: the references are in the KV
    cache); the ranks exchange its tail (tests/test_speed.py holds text to image of every two-branch family)."""
    spec, refs = _spec(tiny_models, "tiny-qwenimage21"), _references()
    one = api.sample(spec, _request(guidance=4.0), image=refs)
    cfg, _ = api.cfg_parallel(spec)
    assert np.array_equal(api.sample(cfg, _request(guidance=4.0), image=refs), one)
    workers = api.worker_info()
    assert len(workers) == 2 and workers[0]["steps"] == workers[1]["steps"]


@pytest.mark.workers
def test_qwen_image_21_shard_tp_2_equals_one_worker(tiny_models):
    """Shard TP over diffusers' own plan of its transformer (to_q/k/v and the MLP column-wise, the outputs row-wise),
    with true CFG: within tests/test_parallel.py's TP tolerance (a split matmul sums in another order)."""
    spec = _spec(tiny_models, "tiny-qwenimage21")
    one = api.sample(spec, _request(guidance=4.0))
    tp, text = api.shard(spec, 2)
    assert "transformer: sharded over 2 chips, 1 of 2 heads per chip" in text
    assert np.abs(api.sample(tp, _request(guidance=4.0)) - one).max() <= TOLERANCE
    assert [w["rank"] for w in api.worker_info()] == [0, 1]


# ---- Sampling Options' sigmas (Qwen-Image 2.1 Turbo's ManualSigmas)

TURBO_SIGMAS = "1.0, 0.978453, 0.95418, 0.926626, 0.89508, 0.845148, 0.704534, 0.414568, 0"  # the templates'


@pytest.mark.unit
def test_sigmas_are_parsed_as_manual_sigmas_writes_them_and_refused_where_the_call_takes_none(tiny_models):
    """ComfyUI's final 0 dropped (diffusers' scheduler appends it); bad text named; a pipeline whose call takes no
    `sigmas=` refused naming the ones that do (the declaration held to diffusers' signatures)."""
    import inspect

    import diffusers

    from backend.controller import sigmas

    assert sigmas.parse(TURBO_SIGMAS) == (1.0, 0.978453, 0.95418, 0.926626, 0.89508, 0.845148, 0.704534, 0.414568)
    assert sigmas.parse("  ") == () and sigmas.parse("1 0.5") == (1.0, 0.5)
    for bad, why in (("1, a", "not a list of numbers"), ("1, 0, 0.5", "not a positive number"),
                     ("0.5, 0.9, 0", "does not fall")):
        with pytest.raises(OptionError, match=f"sigmas: .*{why}"):
            sigmas.parse(bad)
    for name, p in PIPELINES.items():
        if not p.modular:
            assert p.sigmas_arg <= ("sigmas" in inspect.signature(getattr(diffusers, name).__call__).parameters), name
    spec = _spec(tiny_models, "tiny-qwenimage21")
    turbo, text = api.sampling_options(spec, sigmas=TURBO_SIGMAS)
    assert turbo.sigmas == sigmas.parse(TURBO_SIGMAS) and "sigmas: 8 steps on your schedule" in text
    prepared = api.prepare_sample(turbo, _request(steps=25))
    assert prepared.req.steps == 8 and "steps follow Sampling Options' sigmas: 8 (not 25)" in prepared.notes
    with pytest.raises(SampleError, match="denoise: 0.5 starts from an image or latent.*Set denoise to 1"):
        sigmas.apply(turbo, _request(denoise=0.5), starts_from_image=True)  # (none of these has image to image yet)
    with pytest.raises(OptionError) as e:
        api.sampling_options(_spec(tiny_models, "tiny-ideogram4"), sigmas=TURBO_SIGMAS)
    assert "Ideogram 4 ('tiny-ideogram4') takes no schedule of its own" in str(e.value)
    assert f"sigmas work with {sigmas.takes_them()}" in str(e.value) and "Qwen-Image 2.1" in sigmas.takes_them()


@pytest.mark.workers
def test_qwen_image_21_turbo_sigmas_equal_plain_diffusers_called_with_them(tiny_models):
    """Sampling Options' sigmas (the Turbo templates' ManualSigmas) reach QwenImage21Pipeline as `sigmas=`, its
    final 0 dropped: the pixels of plain diffusers called with the same sigmas, and not those of its own schedule."""
    from backend.controller import sigmas

    spec, pipe = _spec(tiny_models, "tiny-qwenimage21"), load(tiny_models, "tiny-qwenimage21")
    turbo, _ = api.sampling_options(spec, sigmas=TURBO_SIGMAS)
    ours = api.sample(turbo, _request(guidance=1.0, steps=25))
    with torch.inference_mode():
        plain = pipe(prompt=FOX, negative_prompt=NEG, true_cfg_scale=1.0, height=32, width=64,
                     sigmas=list(sigmas.parse(TURBO_SIGMAS)), output_type="np",
                     generator=[torch.Generator("cpu").manual_seed(7)]).images
    assert np.abs(ours - np.asarray(plain)[..., :3]).max() <= TOLERANCE
    assert np.abs(ours - api.sample(spec, _request(guidance=1.0, steps=8))).max() > 1e-3, "its own 8 steps differ"


KREA_SIGMAS = "1.0, 0.92, 0.8, 0.6, 0.3, 0"  # a ManualSigmas list (Krea 2's Turbo template runs KSampler's own)


@pytest.mark.workers
def test_krea_2_sigmas_equal_plain_diffusers_called_with_them(tiny_models):
    """Sampling Options' sigmas reach Krea2Pipeline as `sigmas=`, the final 0 dropped, with CFG (guidance 2, two
    passes): the pixels of plain diffusers called with the same sigmas, and not those of its own 5-step schedule."""
    from backend.controller import sigmas

    spec, pipe = _spec(tiny_models, "tiny-krea2"), load(tiny_models, "tiny-krea2")
    manual, text = api.sampling_options(spec, sigmas=KREA_SIGMAS)
    assert "sigmas: 5 steps on your schedule" in text
    ours = api.sample(manual, _request(guidance=2.0, steps=20))
    with torch.inference_mode():
        plain = pipe(prompt=FOX, negative_prompt=NEG, guidance_scale=2.0, height=32, width=64,
                     sigmas=list(sigmas.parse(KREA_SIGMAS)), output_type="np",
                     generator=[torch.Generator("cpu").manual_seed(7)]).images
    assert len(pipe.scheduler.sigmas) == 6, "5 steps and the final 0 (shifted as the scheduler config says)"
    assert np.abs(ours - np.asarray(plain)[..., :3]).max() <= TOLERANCE
    assert np.abs(ours - api.sample(spec, _request(guidance=2.0, steps=5))).max() > 1e-3, "its own 5 steps differ"
