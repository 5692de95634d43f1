"""Model folders: discovery, path safety and the checks made before any worker loads weights."""

from __future__ import annotations

import json
import shutil

import pytest

from backend.controller import api, models
from backend.protocol.errors import ModelError, OptionError, SampleError

pytestmark = pytest.mark.unit


def _fake_pipeline(path, class_name="FluxPipeline", weights=("diffusion_pytorch_model.safetensors",)):
    path.mkdir(parents=True)
    (path / "model_index.json").write_text(json.dumps({"_class_name": class_name, "transformer": ["diffusers", "X"],
                                                       "scheduler": ["diffusers", "S"]}))
    (path / "transformer").mkdir()
    (path / "scheduler").mkdir()
    for w in weights:
        (path / "transformer" / w).write_bytes(b"")
    return path


def test_find_models_walks_folders_and_skips_components(tmp_path):
    _fake_pipeline(tmp_path / "flux-schnell")
    _fake_pipeline(tmp_path / "vendor" / "sd35")
    (tmp_path / "empty").mkdir()
    assert models.find_models([str(tmp_path), str(tmp_path / "missing")]) == ["flux-schnell", "vendor/sd35"]


def test_paths_cannot_escape_the_model_folders(tmp_path, monkeypatch):
    root = tmp_path / "models"
    _fake_pipeline(root / "ok")
    outside = _fake_pipeline(tmp_path / "outside")
    assert models.resolve_model_path("ok", [str(root)]) == (root / "ok").resolve()
    with pytest.raises(ModelError, match="outside ComfyUI's diffusers folders"):
        models.resolve_model_path("../outside", [str(root)])
    with pytest.raises(ModelError, match="absolute path.*COMFYUI_TPU_ALLOW_ABSOLUTE_PATHS"):
        models.resolve_model_path(str(outside), [str(root)])
    monkeypatch.setenv("COMFYUI_TPU_ALLOW_ABSOLUTE_PATHS", "1")
    assert models.resolve_model_path(str(outside), [str(root)]) == outside.resolve()


def test_missing_model_names_it_and_where_it_was_looked_for(tmp_path):
    with pytest.raises(ModelError) as e:
        models.resolve_model_path("FLUX.1-schnell", [str(tmp_path)])
    assert "'FLUX.1-schnell' was not found" in str(e.value) and str(tmp_path) in str(e.value)
    with pytest.raises(ModelError, match="no model was chosen"):
        models.resolve_model_path("  ", [str(tmp_path)])


def test_inspect_refuses_bad_folders_with_the_fix(tmp_path):
    (tmp_path / "no-index").mkdir()
    with pytest.raises(ModelError, match="has no model_index.json"):
        models.inspect_model(tmp_path / "no-index")
    with pytest.raises(ModelError, match="StableDiffusionPipeline pipeline, which ComfyUI-TPU does not support"):
        models.inspect_model(_fake_pipeline(tmp_path / "sd15", "StableDiffusionPipeline"))
    pickled = _fake_pipeline(tmp_path / "pickled", weights=("diffusion_pytorch_model.bin",))
    with pytest.raises(ModelError, match="only pickle weights.*safetensors"):
        models.inspect_model(pickled)
    assert models.inspect_model(pickled, allow_pickle=True).class_name == "FluxPipeline"
    broken = _fake_pipeline(tmp_path / "broken")
    shutil.rmtree(broken / "transformer")
    with pytest.raises(ModelError, match="component 'transformer'.*incomplete"):
        models.inspect_model(broken)


def test_size_factor_comes_from_the_model_configs(tiny_models):
    assert api.make_spec("tiny-flux", [str(tiny_models)]).size_factor == 16
    assert api.make_spec("tiny-sdxl", [str(tiny_models)]).size_factor == 8


@pytest.mark.parametrize("field, value, kind, words", [
    ("width", 1000, ModelError, "width: 1000 is not a multiple of 16, which FLUX.1 needs; use 992 or 1008"),
    ("height", 8, ModelError, "height: 8 is not a multiple of 16, which FLUX.1 needs; use 16"),
    ("width", 0, ModelError, "width: 0 is out of range"),
    ("height", 100000, ModelError, "height: 100000 is out of range"),
    ("steps", 0, SampleError, "steps: 0 is too small"),
    ("batch_size", 0, SampleError, "batch_size: 0 is too small"),
    ("prompt", "   ", SampleError, "prompt: the prompt is empty"),
    ("seed", 2**64, SampleError, "seed: 18446744073709551616 is out of range"),
    ("guidance", float("nan"), SampleError, "guidance: nan is not a number the pipeline can use"),
])
def test_bad_sample_requests_name_the_input_value_and_fix(tiny_models, field, value, kind, words):
    """Sizes the model cannot make are the model's (ModelError); values no model can use are Sample's."""
    spec = api.make_spec("tiny-flux", [str(tiny_models)])
    base = dict(prompt="x", width=64, height=64, steps=2)
    with pytest.raises(kind) as e:
        api.check_request(spec, api.SampleRequest(**{**base, field: value}))
    assert words in str(e.value)


def test_bad_choices_are_refused_before_anything_starts(tiny_models):
    with pytest.raises(OptionError, match="dtype: 'int8'"):
        api.make_spec("tiny-flux", [str(tiny_models)], dtype="int8")
    with pytest.raises(OptionError, match="offload: 'disk'"):
        api.make_spec("tiny-flux", [str(tiny_models)], offload="disk")
