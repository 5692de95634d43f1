"""fp8 storage: the denoiser's weights kept in fp8 and computed in bfloat16 (or the device dtype) layer by layer,
with diffusers' own layerwise casting (`apply_layerwise_casting`, what `enable_layerwise_casting` calls), its skip
patterns less 'norm' (the AdaLN modulation layers are stored in fp8 too, as ComfyUI stores them).

Tolerances: none against plain diffusers with the same layerwise casting (same weights, same casts, same
arithmetic: bit-identical); Shard TP against one worker with fp8 storage: TP_TOLERANCE, as for bfloat16 storage
(a sharded matmul sums in another order).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from lora_fixtures import fuse, load, make

from backend.controller import api, offload, storage
from backend.controller.files import assemble, listing
from backend.protocol.errors import CompileError, ModelError
from backend.protocol.spec import SampleRequest
from backend.worker import storage as worker_storage

TP_TOLERANCE = 1e-4
FOX = "a red fox in the snow"
GIB = 2**30


def _spec(tiny_models, name="tiny-flux", **kw):
    return api.make_spec(name, [str(tiny_models)], **kw)


def _request(**kw) -> SampleRequest:
    return SampleRequest(**{"prompt": FOX, "width": 64, "height": 64, "steps": 2, "guidance": 0.0, "seed": 3, **kw})


def cast_layerwise(module: torch.nn.Module, stored: torch.dtype, compute: torch.dtype) -> None:
    """diffusers' layerwise casting as the worker configures it."""
    from diffusers.hooks import apply_layerwise_casting

    apply_layerwise_casting(module, stored, compute, skip_modules_pattern=worker_storage.skip_patterns(module))


def _plain_fp8(tiny_models, name="tiny-flux", loras=()) -> np.ndarray:
    """What a plain diffusers script makes: bfloat16 weights, then layerwise casting. With LoRAs: fused onto
    the weights as fp8 storage holds them (each cast layer's weights rounded to fp8 and back, which is all an fp8
    file holds too), then layerwise casting rounds the sum to fp8 once."""
    pipe = load(tiny_models, name, torch.bfloat16)
    if loras:
        stored = load(tiny_models, name, torch.bfloat16).transformer
        cast_layerwise(stored, torch.float8_e4m3fn, torch.bfloat16)
        with torch.no_grad():
            for key, value in stored.state_dict().items():
                if value.dtype == torch.float8_e4m3fn:
                    pipe.transformer.get_parameter(key).copy_(value)
    fuse(pipe, loras, ["transformer"])
    if loras:
        pipe.unload_lora_weights()
    cast_layerwise(pipe.transformer, torch.float8_e4m3fn, torch.bfloat16)
    with torch.inference_mode():
        return pipe(prompt=FOX, num_inference_steps=2, height=64, width=64, output_type="np", guidance_scale=0.0,
                    generator=[torch.Generator("cpu").manual_seed(3)]).images


# ---- the controller: what is stored how, and what is refused

@pytest.mark.unit
def test_the_fp8_choice_stores_the_denoiser_in_fp8_and_is_said(tiny_models):
    spec = _spec(tiny_models, dtype="float8_e4m3fn")
    assert spec.storage == "float8_e4m3fn" and storage.compute_dtype(spec) == "bfloat16"
    assert spec.load_key() != _spec(tiny_models, dtype="bfloat16").load_key(), "changing storage reloads"
    assert "stay in float8_e4m3fn" in api.describe_pipeline(spec)
    assert _spec(tiny_models, dtype="bfloat16").storage == "" and _spec(tiny_models).storage == ""


@pytest.mark.unit
def test_fp8_storage_is_refused_where_it_cannot_run(tiny_models):
    spec = _spec(tiny_models, dtype="float8_e4m3fn")
    compiled, _ = api.with_mode(spec, "compiled")
    with pytest.raises(CompileError, match=r"dtype: float8_e4m3fn \(fp8 storage\) cannot be compiled.*eager mode"):
        api.checked(compiled)
    with pytest.raises(ModelError, match=r"offload 'sequential'.*choose offload 'none' or 'model'"):
        _spec(tiny_models, dtype="float8_e4m3fn", offload="sequential")


@pytest.mark.unit
def test_the_denoiser_is_read_straight_into_fp8_storage(tiny_models):
    """Read tensor by tensor into storage: the same weights as diffusers' load in bfloat16 then layerwise casting,
    the modulation layers in fp8 too, and every tensor in its own memory (no view of the file's mapping)."""
    from diffusers import FluxTransformer2DModel

    folder = tiny_models / "tiny-flux" / "transformer"
    ours = worker_storage.load_stored(FluxTransformer2DModel, folder, torch.float8_e4m3fn, torch.bfloat16)
    plain = FluxTransformer2DModel.from_pretrained(folder, dtype=torch.bfloat16)
    cast_layerwise(plain, torch.float8_e4m3fn, torch.bfloat16)
    want = plain.state_dict()
    assert ours.state_dict().keys() == want.keys()
    for key, value in ours.state_dict().items():
        assert value.dtype == want[key].dtype and torch.equal(value.float(), want[key].float()), key
        assert value.untyped_storage().nbytes() == value.numel() * value.element_size(), key
    assert ours.transformer_blocks[0].norm1.linear.weight.dtype == torch.float8_e4m3fn, "modulation in fp8"
    assert ours.proj_out.weight.dtype == torch.bfloat16 and worker_storage.compute_dtype_of(ours.proj_out) is None
    assert worker_storage.load_stored(FluxTransformer2DModel, folder.parent / "tokenizer", torch.float8_e4m3fn,
                                      torch.bfloat16) is None, "no safetensors weights: loaded whole, then cast"


@pytest.mark.unit
def test_offload_auto_counts_the_stored_size(tiny_models, monkeypatch):
    """FLUX.1's published sizes on a v6e chip (32 GiB, 25.6 usable): in bfloat16 the transformer and T5 do not
    fit together (offload model); with the transformer stored in fp8 they do (offload none)."""
    bf16 = {"text_encoder": 246_144_352, "text_encoder_2": 9_524_621_312, "transformer": 23_802_943_488,
            "vae": 167_666_902}
    monkeypatch.setattr(offload.devices, "device_memory_bytes", lambda kind: 32 * GIB)
    monkeypatch.setattr(offload.models, "weight_bytes",
                        lambda spec, float_bytes: {n: b * float_bytes // 2 for n, b in bf16.items()})
    as_bf16 = offload.choose_offload(_spec(tiny_models, dtype="bfloat16", offload="auto").with_changes(kind="tpu"))
    assert as_bf16.mode == "model", as_bf16
    fp8 = offload.choose_offload(_spec(tiny_models, dtype="float8_e4m3fn", offload="auto").with_changes(kind="tpu"))
    assert fp8.mode == "none", fp8
    assert "in bfloat16 (float8_e4m3fn denoiser)" in fp8.reason and "transformer 11.1 GiB" in fp8.reason


COMFYUI_FILES = ("flux1", "flux2")  # comfyui_files' families, built from the start (conftest)


@pytest.fixture(scope="module")
def fp8_files(comfyui_files, comfyui_dir, monkeypatch_module):
    """ComfyUI-layout files (a plain fp8 FLUX.1 transformer, a scaled-fp8 FLUX.2 [klein] one), ComfyUI importable
    as in its process."""
    monkeypatch_module.syspath_prepend(str(comfyui_dir))
    return comfyui_files(*COMFYUI_FILES)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _file_spec(files: Path, dtype="auto", **chosen):
    roots = {role: [str(files / "models" / folder)] for role, folder in listing.ROLE_FOLDERS.items()}
    return api.make_file_spec(assemble.FileChoice(**chosen), roots, dtype, "cpu")


@pytest.mark.pipelines
def test_an_fp8_file_keeps_its_fp8_dtype_and_scaled_fp8_is_refused(fp8_files):
    flux = dict(text_encoders=("t5xxl-tiny.safetensors", "clip_l-tiny.safetensors"), vae="ae-tiny.safetensors")
    fp8 = _file_spec(fp8_files, diffusion_model="flux1-tiny-fp8-e5m2.safetensors", **flux)
    assert fp8.storage == "float8_e5m2", "auto keeps the file's own fp8"
    assert api.checked(api.with_mode(fp8, "compiled")[0]).storage == "", "compiled mode: upcast as before"
    assert _file_spec(fp8_files, "bfloat16", diffusion_model="flux1-tiny-fp8-e5m2.safetensors", **flux).storage == ""
    assert _file_spec(fp8_files, diffusion_model="flux1-tiny.safetensors", **flux).storage == ""
    klein = dict(text_encoders=("qwen_3-tiny.safetensors",), vae="flux2-vae-tiny.safetensors")
    with pytest.raises(ModelError, match=r"'flux2-klein-tiny-fp8scaled\.safetensors' is ComfyUI's scaled fp8.*auto"):
        _file_spec(fp8_files, "float8_e4m3fn", diffusion_model="flux2-klein-tiny-fp8scaled.safetensors", **klein)


# ---- in the worker

@pytest.mark.workers
def test_fp8_storage_equals_diffusers_layerwise_casting_and_loras_keep_the_originals(tiny_models,
                                                                                     tmp_path_factory):
    spec = _spec(tiny_models, dtype="float8_e4m3fn")
    image = api.sample(spec, _request())
    assert np.array_equal(image, _plain_fp8(tiny_models))
    info = api.worker_info()[0]
    assert info["storage"] == "float8_e4m3fn"
    lora = str(make(tiny_models, "tiny-flux", "diffusers", tmp_path_factory.mktemp("loras"), seed=7)[0])
    with_lora, _ = api.with_lora(spec, lora, 0.8, 0.0)
    assert np.array_equal(api.sample(with_lora, _request()), _plain_fp8(tiny_models, loras=[(lora, 0.8)]))
    assert np.array_equal(api.sample(spec, _request()), image), "removing the LoRA restores the fp8 originals"
    assert api.worker_info()[0]["loads"] == info["loads"], "LoRAs never reload"


@pytest.mark.workers
def test_fp8_storage_under_shard_tp_matches_one_worker(tiny_models):
    one = api.sample(_spec(tiny_models, dtype="float8_e4m3fn"), _request(batch_size=2))
    tp, _ = api.shard(_spec(tiny_models, dtype="float8_e4m3fn"), 2)
    images = api.sample(tp, _request(batch_size=2))
    assert np.abs(images - one).max() <= TP_TOLERANCE
    assert [w["storage"] for w in api.worker_info()] == ["float8_e4m3fn"] * 2


@pytest.mark.workers
def test_an_fp8_file_runs_from_its_fp8_weights(fp8_files):
    """dtype auto on an fp8 FLUX.1 file (float8_e5m2): the worker keeps the file's fp8 weights and computes in the
    device dtype (float32 on the CPU): the image equals diffusers' layerwise casting on the same files."""
    from backend.worker import loading

    flux = dict(text_encoders=("t5xxl-tiny.safetensors", "clip_l-tiny.safetensors"), vae="ae-tiny.safetensors")
    spec = _file_spec(fp8_files, diffusion_model="flux1-tiny-fp8-e5m2.safetensors", **flux)
    image = api.sample(spec, _request())
    assert api.worker_info()[0]["storage"] == "float8_e5m2"
    pipe = loading.load_files(spec.source, torch.float32, lambda text: None)
    pipe.set_progress_bar_config(disable=True)
    cast_layerwise(pipe.transformer, torch.float8_e5m2, torch.float32)
    with torch.inference_mode():
        want = pipe(prompt=FOX, num_inference_steps=2, height=64, width=64, output_type="np", guidance_scale=0.0,
                    generator=[torch.Generator("cpu").manual_seed(3)]).images
    assert np.array_equal(image, want)


@pytest.mark.workers
def test_both_of_ideogram4s_transformers_are_stored_in_fp8(tiny_models):
    """Ideogram 4 runs a conditional and an unconditional transformer every step (spec.DENOISERS holds both): fp8
    storage keeps the same layers of each in fp8 as diffusers' layerwise casting of a plain copy, and the image
    is another than bfloat16's."""
    image = api.sample(_spec(tiny_models, "tiny-ideogram4", dtype="float8_e4m3fn"), _request(guidance=3.0))
    info = api.worker_info()[0]
    assert info["storage"] == "float8_e4m3fn"
    plain = load(tiny_models, "tiny-ideogram4", torch.bfloat16)
    for name in ("transformer", "unconditional_transformer"):
        cast_layerwise(getattr(plain, name), torch.float8_e4m3fn, torch.bfloat16)
    want = sum(worker_storage.compute_dtype_of(m) is not None for m in plain.unconditional_transformer.modules())
    assert want > 0 and info["experts"]["unconditional_transformer"]["fp8_layers"] == want
    assert info["experts"]["denoiser"]["fp8_layers"] == want, "the two transformers have the same layers"
    bf16 = api.sample(_spec(tiny_models, "tiny-ideogram4", dtype="bfloat16"), _request(guidance=3.0))
    assert np.abs(image - bf16).max() > 1e-3
