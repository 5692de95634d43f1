"""LoRAs (issue 13): every format diffusers reads, written into the weights in place, equal to diffusers' own
fused LoRA bit for bit on the CPU in float32 (and bfloat16), never a reload, never a recompile, exact restores,
Shard TP and Data Parallel, and bad files refused with the pipeline left as it was.

LoRA files are made at test time by peft on the tiny models (tests/lora_fixtures.py). The plain-diffusers
reference is `load_lora_weights` + `fuse_lora(lora_scale=strength)`: the unfused peft forward is a different sum
(x·W + x·Aᵀ·Bᵀ), never bit-equal to any fused weight, so it is not the reference.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lora_fixtures import FORMATS, TEXT_LORA, bad_files, components, denoiser_name, fuse, load, make

from backend.controller import api, layouts
from backend.families import PIPELINES
from backend.protocol.errors import ModelError
from backend.protocol.spec import FileComponent, FileSource, LoraRef, SampleRequest
from backend.worker import lora

TP_TOLERANCE = 1e-4  # as tests/test_parallel.py: a sharded transformer sums in another order
PROMPT = "a red fox in the snow"


def _family(pipe) -> str:
    return PIPELINES[type(pipe).__name__].name


def _generate(pipe, seed: int = 3) -> np.ndarray:
    kw = {"prompt": PROMPT, "num_inference_steps": 2, "height": 64, "width": 64, "output_type": "np",
          "generator": torch.Generator("cpu").manual_seed(seed)}
    if denoiser_name(pipe) == "transformer":
        kw["max_sequence_length"] = 32
    with torch.inference_mode():
        return pipe(**kw).images


def _weights(pipe) -> dict[str, torch.Tensor]:
    return {f"{c}.{k}": v.clone() for c in pipe._lora_loadable_modules if getattr(pipe, c, None) is not None
            for k, v in getattr(pipe, c).state_dict().items()}


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("loras")


@pytest.fixture(scope="module")
def pipes(tiny_models):
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = load(tiny_models, name)
        return cache[name]

    return get


# ---- formats: what diffusers' converters (plus the pre-passes) read, layer by layer

CASES = [(name, fmt) for name, formats in FORMATS.items() for fmt in formats]


@pytest.mark.unit
@pytest.mark.parametrize(("name", "fmt"), CASES, ids=[f"{n}-{f}" for n, f in CASES])
def test_each_format_gives_the_layers_peft_made(tiny_models, pipes, lora_dir, name, fmt):
    pipe = pipes(name)
    path, want = make(tiny_models, name, fmt, lora_dir, pipe=pipe)
    got = lora.resolve(lora.skeleton(pipe), str(path), _family(pipe))
    assert set(got) == set(want), (sorted(set(want) - set(got))[:5], sorted(set(got) - set(want))[:5])
    for key, delta in want.items():
        mine = got[key].delta(1.0, torch.float32, "cpu")
        tolerance = 2e-3 * float(delta.abs().max()) if fmt == "comfy" else 1e-6  # comfy: fp16 factors
        assert float((mine - delta).abs().max()) <= tolerance, key
    assert {c for c, _ in got} == components(name, fmt, denoiser_name(pipe))


# ---- the in-place route against diffusers' own fuse_lora, in this process

@pytest.mark.pipelines
@pytest.mark.parametrize(("name", "dtype"), [("tiny-flux", torch.float32), ("tiny-sdxl", torch.float32),
                                             ("tiny-flux", torch.bfloat16)], ids=["flux-fp32", "sdxl-fp32", "flux-bf16"])
def test_in_place_loras_equal_diffusers_fused_loras_bit_for_bit(tiny_models, lora_dir, name, dtype):
    a, _ = make(tiny_models, name, "diffusers", lora_dir / "a", seed=0)
    b, _ = make(tiny_models, name, "kohya" if name == "tiny-sdxl" else "diffusers", lora_dir / "b", seed=5)
    ours = load(tiny_models, name, dtype)
    family = _family(ours)
    original, base = _weights(ours), _generate(ours)
    loras = lora.Loras()

    # one LoRA, the text encoders at another strength than the denoiser
    loras.apply(ours, (LoraRef(str(a), 0.7, 0.3),), family)
    ref = load(tiny_models, name, dtype)
    ref.load_lora_weights(str(a), adapter_name="a")
    ref.fuse_lora(components=[denoiser_name(ref)], lora_scale=0.7)
    ref.fuse_lora(components=list(TEXT_LORA[name]), lora_scale=0.3)
    one = _generate(ours)
    assert np.array_equal(one, _generate(ref))
    assert np.abs(one - base).max() > 0.01, "the LoRA changes the image"

    # two LoRAs, one of them negative: diffusers fuses one adapter after the other, so do we
    loras.apply(ours, (LoraRef(str(a), 0.7, 0.7), LoraRef(str(b), -0.4, -0.4)), family)
    ref = load(tiny_models, name, dtype)
    ref.load_lora_weights(str(a), adapter_name="a")
    ref.load_lora_weights(str(b), adapter_name="b")
    ref.set_adapters(["a", "b"], [0.7, -0.4])
    ref.fuse_lora(components=ref._lora_loadable_modules, adapter_names=["a", "b"])
    assert np.array_equal(_generate(ours), _generate(ref))

    # strength 0 is no LoRA; removal restores every weight bit for bit; a strength change comes back exactly
    loras.apply(ours, (LoraRef(str(a), 0.0, 0.0), LoraRef(str(b), 0.0, 0.0)), family)
    assert np.array_equal(_generate(ours), base)
    for strength in (0.2, 1.5, -1.0, 0.7):
        loras.apply(ours, (LoraRef(str(a), strength, 0.3),), family)
    assert np.array_equal(_generate(ours), one)
    loras.apply(ours, (), family)
    now = _weights(ours)
    assert [k for k, v in original.items() if not torch.equal(v, now[k])] == []
    assert np.array_equal(_generate(ours), base)


@pytest.mark.pipelines
def test_strength_changes_never_recompile_a_compiled_denoiser(tiny_models, lora_dir):
    """The module tree never changes (no peft wrappers in the live model), so the compiled graph is reused:
    any recompile raises under torch.compiler.set_stance('fail_on_recompile')."""
    path, _ = make(tiny_models, "tiny-flux", "diffusers", lora_dir / "compiled", seed=2)
    pipe = load(tiny_models, "tiny-flux")
    eager = lora.Loras()
    eager.apply(pipe, (LoraRef(str(path), 0.8, 1.0),), "FLUX.1")
    want = _generate(pipe)
    eager.apply(pipe, (), "FLUX.1")
    base = _generate(pipe)
    torch._dynamo.reset()
    pipe.transformer.compile(fullgraph=True, dynamic=False, backend="eager")
    try:
        assert np.array_equal(_generate(pipe), base)  # compiles once
        loras = lora.Loras()
        with torch.compiler.set_stance("fail_on_recompile"):
            for strength in (0.8, 0.3, 0.0, -0.5, 0.8):
                loras.apply(pipe, (LoraRef(str(path), strength, 1.0),), "FLUX.1")
                image = _generate(pipe)
            assert np.array_equal(image, want)
            loras.apply(pipe, (), "FLUX.1")
            assert np.array_equal(_generate(pipe), base)
    finally:
        torch._dynamo.reset()


# ---- bad files, caught before any worker sees them

@pytest.mark.unit
def test_bad_files_and_strengths_are_refused_naming_the_file_and_the_fix(tiny_models, lora_dir):
    spec = api.make_spec("tiny-flux", [str(tiny_models)])
    bad = bad_files(lora_dir / "bad")
    cases = [
        (bad["pickle"], 1.0, r"lora_name: 'lora\.ckpt' is a pickle file.*Use the \.safetensors version"),
        (bad["no_lora_keys"], 1.0, r"'not-a-lora\.safetensors' holds no LoRA weights.*Pick a LoRA file"),
        (bad["corrupt"], 1.0, r"'cut-short\.safetensors' cannot be read as safetensors.*download it again"),
        (lora_dir / "gone.safetensors", 1.0, r"'gone\.safetensors' was not found.*models/loras"),
        (bad["no_matching_keys"], float("nan"), r"strength: nan is not a number.*'no-matching-layer\.safetensors'"),
        (bad["no_matching_keys"], float("inf"), r"strength: inf is not a number.*such as 1\.0"),
    ]
    for path, strength, words in cases:
        with pytest.raises(ModelError, match=words):
            api.with_lora(spec, str(path), strength)
    sequential = api.make_spec("tiny-flux", [str(tiny_models)], offload="sequential")
    with pytest.raises(ModelError, match=r"offload 'sequential'.*choose offload 'model' or 'none'"):
        api.with_lora(sequential, str(bad["no_matching_keys"]))
    spec, text = api.with_lora(spec, str(bad["no_matching_keys"]), 0.5)
    assert spec.loras == (LoraRef(str(bad["no_matching_keys"]), 0.5, 1.0),) and spec.load_key() == \
        api.make_spec("tiny-flux", [str(tiny_models)]).load_key(), "LoRAs are not part of the load key"
    assert "1. no-matching-layer.safetensors: strength 0.5, text encoder 1" in text



@pytest.mark.unit
def test_a_gguf_diffusion_model_refuses_loras(tiny_models, lora_dir):
    """A GGUF file's weights stay quantized (diffusers dequantizes them on the fly): nothing to write into."""
    spec = api.make_spec("tiny-flux", [str(tiny_models)])
    gguf = spec.with_changes(source=FileSource("flux1", (FileComponent("transformer", "/m/flux1-dev-Q8_0.gguf", "gguf",
                                                                       quant="gguf"),)))
    lora_file = bad_files(lora_dir / "gguf")["no_matching_keys"]  # a LoRA file; which layers does not matter here
    with pytest.raises(ModelError, match=r"'flux1-dev-Q8_0\.gguf', a GGUF file.*safetensors version"):
        api.with_lora(gguf, str(lora_file))

# ---- in the worker

def _request(**kw) -> SampleRequest:
    return SampleRequest(**{"prompt": PROMPT, "width": 64, "height": 64, "steps": 2, "guidance": 0.0, "seed": 3, **kw})


def _plain(tiny_models, name: str, loras: list[tuple[str, float]]) -> np.ndarray:
    """What a plain diffusers script makes with these LoRAs fused at these strengths."""
    pipe = load(tiny_models, name)
    fuse(pipe, loras)
    kw = {"prompt": PROMPT, "num_inference_steps": 2, "height": 64, "width": 64, "output_type": "np",
          "guidance_scale": 0.0, "generator": [torch.Generator("cpu").manual_seed(3)]}
    with torch.inference_mode():
        return pipe(**kw).images


@pytest.fixture(scope="module")
def flux_loras(tiny_models, lora_dir):
    return {fmt: str(make(tiny_models, "tiny-flux", fmt, lora_dir / "worker", seed=7)[0])
            for fmt in ("diffusers", "comfy")}


@pytest.mark.workers
def test_a_lora_in_the_worker_equals_plain_diffusers_and_never_reloads(tiny_models, flux_loras):
    spec = api.make_spec("tiny-flux", [str(tiny_models)])
    base = api.sample(spec, _request())
    loads = api.worker_info()[0]["loads"]
    with_lora, _ = api.with_lora(spec, flux_loras["diffusers"], 0.8, 0.8)
    image = api.sample(with_lora, _request())
    assert np.array_equal(image, _plain(tiny_models, "tiny-flux", [(flux_loras["diffusers"], 0.8)]))
    info = api.worker_info()[0]
    assert info["loras"] == [{"file": "tiny-flux-diffusers.safetensors", "strength": 0.8, "te_strength": 0.8,
                              "experts": "both"}]
    two, _ = api.with_lora(with_lora, flux_loras["comfy"], 0.5)
    assert not np.array_equal(api.sample(two, _request()), image)
    zero, _ = api.with_lora(spec, flux_loras["diffusers"], 0.0, 0.0)
    assert np.array_equal(api.sample(zero, _request()), base)
    assert np.array_equal(api.sample(with_lora, _request()), image), "a strength comes back exactly"
    assert np.array_equal(api.sample(spec, _request()), base), "removing the LoRA restores the weights"
    assert api.worker_info()[0]["loads"] == loads, "adding, re-weighting and removing LoRAs never reloads"


@pytest.mark.workers
def test_loras_and_image_inputs_with_model_offload(tiny_models, flux_loras):
    """diffusers' LoRA loader takes offload hooks off a pipeline's modules and puts them back: the skeleton
    shares none of the live modules, so the live pipeline keeps its hooks (and needs no accelerator here)."""
    plain = api.make_spec("tiny-flux", [str(tiny_models)])
    offload = api.make_spec("tiny-flux", [str(tiny_models)], offload="model")
    picture = np.linspace(0, 1, 64 * 64 * 3, dtype=np.float32).reshape(1, 64, 64, 3)
    want = [api.sample(api.with_lora(plain, flux_loras["comfy"], 0.6)[0], _request(denoise=d), image=picture)
            for d in (1.0, 0.5)]
    for d, image in zip((1.0, 0.5), want, strict=True):
        got = api.sample(api.with_lora(offload, flux_loras["comfy"], 0.6)[0], _request(denoise=d), image=picture)
        assert np.array_equal(got, image)
    assert np.array_equal(api.sample(offload, _request()), api.sample(plain, _request()))


@pytest.mark.workers
def test_compiled_lora_strength_changes_never_recompile(tiny_models, flux_loras):
    spec = api.make_spec("tiny-flux", [str(tiny_models)])
    compiled, _ = api.with_compile(spec, "whole denoiser", "eager", "64x64", False)
    base = api.sample(compiled, _request())
    before = api.compile_stats()
    images = {s: api.sample(api.with_lora(compiled, flux_loras["diffusers"], s, s)[0], _request())
              for s in (0.8, 0.3, 0.0, 1.2)}
    after = api.compile_stats()
    assert after["graphs"] == before["graphs"] and after["unexpected_recompiles"] == 0
    assert after["hits"] == before["hits"] + 4
    assert np.array_equal(images[0.0], base) and not np.array_equal(images[0.8], base)
    assert np.array_equal(api.sample(compiled, _request()), base)


@pytest.mark.workers
def test_bad_loras_fail_clearly_and_leave_the_pipeline_as_it_was(tiny_models, lora_dir, flux_loras):
    spec = api.make_spec("tiny-flux", [str(tiny_models)])
    base = api.sample(spec, _request())
    good, _ = api.with_lora(spec, flux_loras["diffusers"], 0.8)
    with_good = api.sample(good, _request())
    loads = api.worker_info()[0]["loads"]  # the worker may have loaded other specs in earlier tests
    sdxl, _ = make(tiny_models, "tiny-sdxl", "diffusers", lora_dir / "other")
    no_match = bad_files(lora_dir / "bad-worker")["no_matching_keys"]
    cases = [(str(sdxl), r"lora_name: diffusers cannot apply 'tiny-sdxl-diffusers\.safetensors' to this FLUX\.1 "
                         r"model.*Pick a LoRA made for this model"),
             (str(no_match), r"cannot apply 'no-matching-layer\.safetensors' to this FLUX\.1 model.*\{'no_such_layer'\} "
                             r"not found in the base model.*Pick a LoRA")]
    for path, words in cases:
        for start, image in ((spec, base), (good, with_good)):
            with pytest.raises(ModelError, match=words):
                api.sample(api.with_lora(start, path)[0], _request())
            assert np.array_equal(api.sample(start, _request()), image), "the pipeline is as it was"
    assert api.worker_info()[0]["loads"] == loads, "a refused LoRA never reloads the model"


@pytest.mark.workers
def test_shard_tp_and_data_parallel_carry_the_lora(tiny_models, flux_loras):
    spec = api.make_spec("tiny-flux", [str(tiny_models)])
    one = api.sample(api.with_lora(spec, flux_loras["diffusers"], 0.8)[0], _request(batch_size=2))
    base = api.sample(spec, _request(batch_size=2))
    tp, _ = layouts.plan_tp(spec, 2)
    sharded = api.sample(api.with_lora(tp, flux_loras["diffusers"], 0.8)[0], _request(batch_size=2))
    assert np.abs(sharded - one).max() <= TP_TOLERANCE < np.abs(one - base).max()
    assert np.abs(api.sample(tp, _request(batch_size=2)) - base).max() <= TP_TOLERANCE, "removed on every shard"
    dp, _ = layouts.plan_dp(spec, 2)
    assert np.array_equal(api.sample(api.with_lora(dp, flux_loras["diffusers"], 0.8)[0], _request(batch_size=2)),
                          one), "each replica applies it: image 1 comes from the second replica"


# ---- through a real ComfyUI

def _prompt(lora_name: str | None, strength: float = 1.0, seed: int = 3) -> dict:
    nodes = {"1": {"class_type": "LoadTPUPipeline", "inputs": {"model": "tiny-flux", "dtype": "auto", "device": "auto",
                                                                "offload": "none"}},
             "2": {"class_type": "TPUSample", "inputs": {"pipeline": ["1", 0], "prompt": PROMPT, "negative_prompt": "",
                                                         "width": 64, "height": 64, "steps": 2, "guidance": 0.0,
                                                         "seed": seed, "batch_size": 1}},
             "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "lora"}}}
    if lora_name:
        nodes["4"] = {"class_type": "TPULoadLoRA", "inputs": {"pipeline": ["1", 0], "lora_name": lora_name,
                                                               "strength": strength, "strength_text_encoder": strength}}
        nodes["2"]["inputs"]["pipeline"] = ["4", 0]
    return nodes


@pytest.mark.server
def test_load_lora_node_in_comfyui(server, tiny_models, flux_loras, lora_dir):
    from comfy_server import error_message
    from PIL import Image

    folder = server.work_dir / "models" / "loras" / "flux"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fox.safetensors").write_bytes(open(flux_loras["diffusers"], "rb").read())
    (folder / "fox.ckpt").write_bytes(b"pickle")
    (folder / "other.safetensors").write_bytes(make(tiny_models, "tiny-sdxl", "diffusers", lora_dir / "s")[0].read_bytes())
    info = server.get("/object_info/TPULoadLoRA").json()["TPULoadLoRA"]
    choices = info["input"]["required"]["lora_name"][0]
    assert "flux/fox.safetensors" in choices and not [c for c in choices if c.endswith(".ckpt")]

    def pixels(result: dict) -> np.ndarray:
        assert result["status"] == "success", error_message(result)
        with Image.open(result["images"][0]) as im:
            return np.asarray(im)

    base = pixels(server.run(_prompt(None)))
    strong = server.run(_prompt("flux/fox.safetensors", 1.0))
    texts = [m["data"]["text"] for m in strong["messages"] if m["type"] == "progress_text" and m["data"]["node"] == "4"]
    assert any("1. fox.safetensors: strength 1, text encoder 1" in t for t in texts), texts
    assert not np.array_equal(pixels(strong), base)
    assert np.array_equal(pixels(server.run(_prompt("flux/fox.safetensors", 0.0))), base)
    failed = server.run(_prompt("flux/other.safetensors"))
    assert failed["status"] == "error"
    assert "'other.safetensors'" in error_message(failed) and "Pick a LoRA made for this model" in error_message(failed)
    assert np.array_equal(pixels(server.run(_prompt(None, seed=3))), base), "ComfyUI up, pipeline as it was"
