"""MiniMax H3 from ComfyUI's own files (issue 37, "Files"): the fl2va and the ref2va transformers (full and "pruned",
ComfyUI's curve form; the ref2va one as `transformer_ref`, reference images only), the video and audio VAEs in ComfyUI's layouts and Qwen3-VL in ComfyUI's names (tests/file_fixtures.py
writes them from tiny-minimax-h3 with ComfyUI's vocabulary: the reference folder diffusers/ref-minimax-h3), read by
the family's converters (backend/families/minimax_h3/convert.py) into diffusers' MiniMaxH3ModularPipeline: its
frames and waveform equal the reference folder's, in diffusers alone and through Load TPU Pipeline (ComfyUI
files)'s path (the pack's API, a worker); the files are told by their headers; a missing audio VAE is refused."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from backend.controller import api
from backend.controller.files import assemble, listing
from backend.families import text_encoders
from backend.families.minimax_h3 import convert
from backend.families.text_encoders import qwen3vl_keys
from backend.protocol.errors import ModelError
from backend.protocol.spec import SampleRequest

COMFYUI_FILES = ("minimax_h3",)
FRAMES = 124  # the shortest video the model makes (17·7 + 5)


@pytest.fixture(scope="module")
def built(comfyui_files):
    return comfyui_files(*COMFYUI_FILES)


@pytest.fixture(scope="module")
def files(built):
    import file_fixtures

    return built / "models", file_fixtures.FILES["minimax_h3"]


def _roots(models) -> dict[str, list[str]]:
    return {role: [str(models / folder)] for role, folder in listing.ROLE_FOLDERS.items()}


def _choice(names: dict, transformer: str = "diffusion_model", **changes) -> assemble.FileChoice:
    return assemble.FileChoice(**{"diffusion_model": names[transformer], "text_encoders": (names["qwen3vl"],),
                                  "vae": names["vae"], "audio_vae": names["audio_vae"], **changes})


def _t2va(folder, workflow: str = "t2va", inputs: dict | None = None, **components):
    from diffusers.modular_pipelines import ModularPipeline

    pipe = ModularPipeline.from_pretrained(str(folder), workflow=workflow)
    pipe.load_components(dtype=torch.float32)
    if components:
        pipe.update_components(**components)
    state = pipe(prompt="a robot dancing", height=32, width=32, num_frames=FRAMES, num_inference_steps=2,
                 generator=torch.Generator("cpu").manual_seed(5), output_type="np", **(inputs or {}))
    return np.asarray(state.get("videos"), dtype=np.float32), state.get("audio").float().numpy()


def _from_files(pipe_configs: dict, models, names: dict, transformer: str) -> dict:
    """Each component read from its ComfyUI file by the family's converters, under the folder's configs."""
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio, MiniMaxH3Transformer3DModel
    from safetensors.torch import load_file
    from transformers import Qwen3VLForConditionalGeneration

    out = {"transformer": convert.load_transformer(MiniMaxH3Transformer3DModel, load_file(
        models / "diffusion_models" / names[transformer]), dict(pipe_configs["transformer"]))}
    for name, cls, fn in (("vae", AutoencoderKLMiniMaxH3, convert.video_vae),
                          ("audio_vae", AutoencoderKLMiniMaxH3Audio, convert.audio_vae)):
        sd, config = load_file(models / "vae" / names[name]), dict(pipe_configs[name])
        converted = fn(sd, config)
        model = cls.from_config({**config, **convert.latent_statistics(sd)})
        model.load_state_dict(converted, strict=True)
        out[name] = model.eval()
    config = copy.deepcopy(pipe_configs["text_encoder"])
    config.text_config.num_hidden_layers = 50  # ComfyUI's file: cut after layer 50, no final norm, no lm_head
    te = Qwen3VLForConditionalGeneration(config)
    missing, unexpected = te.load_state_dict(qwen3vl_keys(load_file(models / "text_encoders" / names["qwen3vl"]),
                                                          type(te).__name__), strict=False)
    assert not unexpected and sorted(missing) == ["lm_head.weight", "model.language_model.norm.weight"]
    out["text_encoder"] = convert.text_encoder(text_encoders.without_final_norm(te.eval(), "qwen3vl-comfy-truncated"))
    return out


@pytest.mark.pipelines
@pytest.mark.parametrize("transformer", ["diffusion_model", "pruned"])
def test_comfyui_files_make_the_diffusers_folders_video_and_sound(built, files, transformer):
    """t2va with every component read from ComfyUI's files equals the folder's (≤ 1e-4): the full transformer
    through diffusers' converter, the pruned one (its curve table in the time embedder's place, AdaLN without the
    SiLU) within the curve's linear interpolation between its 1025 points (measured: 2e-7)."""
    from diffusers.modular_pipelines import ModularPipeline

    folder = built / "diffusers" / "ref-minimax-h3"
    pipe = ModularPipeline.from_pretrained(str(folder), workflow="t2va")
    pipe.load_components(dtype=torch.float32)
    configs = {n: getattr(pipe, n).config for n in ("transformer", "vae", "audio_vae", "text_encoder")}
    models, names = files
    frames, audio = _t2va(folder)
    got_frames, got_audio = _t2va(folder, **_from_files(configs, models, names, transformer))
    assert got_frames.shape == frames.shape == (1, FRAMES, 32, 32, 3)
    assert got_audio.shape == audio.shape
    assert np.abs(got_frames - frames).max() <= 1e-4
    assert np.abs(got_audio - audio).max() <= 1e-4


@pytest.mark.pipelines
def test_a_pruned_files_curve_table_is_what_its_transformer_runs(tiny_models, files):
    """The pruned transformer reads its adaln_t_table (a zeroed table changes its velocity), and equals the
    full file's transformer at timesteps between the table's grid points."""
    from diffusers import MiniMaxH3Transformer3DModel
    from safetensors.torch import load_file

    models, names = files
    config = dict(MiniMaxH3Transformer3DModel.load_config(str(tiny_models / "tiny-minimax-h3"), subfolder="transformer"))
    pruned_sd = load_file(models / "diffusion_models" / names["pruned"])
    assert convert.CURVE_TABLE in pruned_sd and not any(k.startswith("time_embedder.") for k in pruned_sd)
    full = convert.load_transformer(MiniMaxH3Transformer3DModel, load_file(
        models / "diffusion_models" / names["diffusion_model"]), config)
    pruned = convert.load_transformer(MiniMaxH3Transformer3DModel, pruned_sd, config)
    zeroed = convert.load_transformer(MiniMaxH3Transformer3DModel,
                                      {**pruned_sd, convert.CURVE_TABLE: torch.zeros_like(pruned_sd[convert.CURVE_TABLE])},
                                      config)
    g = torch.Generator().manual_seed(0)
    rows = 3 + 8 + 6  # text, video, audio
    args = dict(hidden_states=torch.randn(1, 8, 16, generator=g), audio_hidden_states=torch.randn(1, 6, 4, generator=g),
                encoder_hidden_states=torch.randn(1, 3, 16, generator=g), timestep=torch.tensor([0.3137, 0.7712]),
                timestep_indices=torch.tensor([0] * 11 + [1] * 6), token_tags=torch.tensor([1] * 3 + [0] * 8 + [2] * 6),
                position_ids=torch.randn(rows, 3, generator=g), video_indices=torch.arange(3, 11),
                audio_indices=torch.arange(11, 17), text_indices=torch.arange(3), return_dict=False)
    with torch.no_grad():
        want, got, off = full(**args), pruned(**args), zeroed(**args)
    assert (got[0] - want[0]).abs().max() <= 1e-5 and (got[1] - want[1]).abs().max() <= 1e-5
    assert (off[0] - want[0]).abs().max() > 1e-2


@pytest.mark.workers
def test_load_tpu_pipeline_files_makes_the_reference_video_and_sound(built, files, comfyui_dir, monkeypatch):
    """Load TPU Pipeline (ComfyUI files)'s path: the four files described from their headers (the configs of the
    published model with the files' sizes over them), loaded in a worker into the modular pipeline; t2va with the
    full and then the pruned transformer, and fl2va (a start frame) with the pruned one (the released file is
    the fl2va transformer), equal the reference folder's frames and waveform (≤ 1e-4)."""
    import PIL.Image

    monkeypatch.syspath_prepend(str(comfyui_dir))  # ComfyUI's bundled tokenizers, as in ComfyUI's process
    models, names = files
    want_frames, want_audio = _t2va(built / "diffusers" / "ref-minimax-h3")
    req = SampleRequest(prompt="a robot dancing", width=32, height=32, frames=FRAMES, steps=2, guidance=1.0, seed=5,
                        batch_size=1)
    for transformer in ("diffusion_model", "pruned"):
        spec = api.make_file_spec(_choice(names, transformer), _roots(models), "float32", "cpu")
        assert spec.class_name == "MiniMaxH3ModularPipeline"
        assert spec.component_config("transformer")["num_layers"] == 2
        assert spec.component_config("audio_vae")["sampling_rate"] == 8000  # 40 latents a second, hop 200
        out = api.run_sample_outputs(api.prepare_sample(spec, req))
        assert out["images"].shape == (FRAMES, 32, 32, 3)
        assert np.abs(out["images"] - want_frames[0]).max() <= 1e-4
        assert out["audio"].shape == want_audio.shape
        assert np.abs(out["audio"] - want_audio).max() <= 1e-4
        assert int(out["audio_rate"][0]) == 8000
    first = np.random.default_rng(1).random((1, 32, 32, 3), dtype=np.float32)
    want_frames, want_audio = _t2va(built / "diffusers" / "ref-minimax-h3", "fl2va",
                                    {"image": PIL.Image.fromarray((first[0] * 255).round().astype(np.uint8))})
    out = api.run_sample_outputs(api.prepare_sample(spec, req, first))
    assert np.abs(out["images"] - want_frames[0]).max() <= 1e-4
    assert np.abs(out["audio"] - want_audio).max() <= 1e-4


@pytest.mark.pipelines
def test_renamed_files_are_told_by_their_headers(files, tmp_path, comfyui_dir, monkeypatch):
    """Each file under a name that says nothing is recognised from its tensors: the transformer (full or pruned)
    as MiniMax H3's, the two VAEs apart, the text encoder as Qwen3-VL; listed in the right dropdowns."""
    import shutil

    monkeypatch.syspath_prepend(str(comfyui_dir))
    models, names = files
    renamed = {}
    for key, role in (("diffusion_model", "diffusion_models"), ("pruned", "diffusion_models"), ("vae", "vae"),
                      ("audio_vae", "vae"), ("qwen3vl", "text_encoders")):
        (tmp_path / role).mkdir(exist_ok=True)
        renamed[key] = f"model_{key}.safetensors"
        shutil.copy(models / role / names[key], tmp_path / role / renamed[key])
    listed = listing.list_files(_roots(tmp_path))
    assert {renamed["diffusion_model"], renamed["pruned"]} <= set(listed["diffusion_model"])
    assert {renamed["vae"], renamed["audio_vae"]} <= set(listed["vae"])
    assert renamed["qwen3vl"] in listed["text_encoder"]
    spec = api.make_file_spec(_choice(renamed, "pruned"), _roots(tmp_path), "float32", "cpu")
    assert spec.family.name == "MiniMax H3"
    layouts = {c.name: c.layout for c in spec.source.components}
    assert (layouts["audio_vae"], layouts["vae"], layouts["text_encoder"]) == (
        "minimax-h3-audio-vae", "minimax-h3-vae", "qwen3vl-comfy-truncated")
    assert spec.component_config("text_encoder")["text_config"]["num_hidden_layers"] == 50
    assert spec.component_config("transformer")["time_embed_dim"] == 16  # the curve's width


@pytest.mark.pipelines
@pytest.mark.parametrize(("changes", "message"), [
    ({"audio_vae": None}, r"audio_vae: MiniMax H3 .* none was chosen\. Put minimax_h3_audio_vae_fp32\.safetensors "
                          r"in ComfyUI's models/vae folder and choose it in audio_vae"),
    ({"audio_vae": "vae"}, r"audio_vae: 'minimax_h3_video_vae-tiny\.safetensors' is not an audio VAE .* choose "
                           r"MiniMax H3's audio VAE"),
    ({"vae": "audio_vae"}, r"vae: 'minimax_h3_audio_vae-tiny_fp32\.safetensors' is a VAE with 4 latent channels of "
                           r"another kind; .*minimax_h3_video_vae"),
])
def test_a_missing_or_misplaced_vae_is_refused_naming_the_fix(files, comfyui_dir, monkeypatch, changes, message):
    monkeypatch.syspath_prepend(str(comfyui_dir))
    models, names = files
    changes = {k: names[v] if v else None for k, v in changes.items()}
    with pytest.raises(ModelError, match=message):
        api.make_file_spec(_choice(names, **changes), _roots(models), "float32", "cpu")


@pytest.mark.pipelines
@pytest.mark.parametrize(("transformer", "references", "message"), [
    ("pruned", np.zeros((1, 64, 64, 3), np.float32),
     r"reference_images: 'minimax_h3_fl2va_pruned-tiny\.safetensors' is MiniMax H3's fl2va transformer .* Choose "
     r"minimax_h3_ref2va_\* as the diffusion_model of Load TPU Pipeline \(ComfyUI files\)"),
    ("ref2va", None, r"reference_images: 'minimax_h3_ref2va_pruned-tiny\.safetensors' is MiniMax H3's ref2va "
                     r"transformer, which makes video from reference images only\. Connect them .* choose "
                     r"minimax_h3_fl2va_\*"),
])
def test_each_transformer_file_refuses_the_others_task(files, comfyui_dir, monkeypatch, transformer, references,
                                                        message):
    """The fl2va file does not run reference images, nor the ref2va file text alone (each is one partition of
    MiniMax H3: `transformer`, `transformer_ref`): refused before any worker starts, naming the file that does."""
    monkeypatch.syspath_prepend(str(comfyui_dir))
    models, names = files
    spec = api.make_file_spec(_choice(names, transformer), _roots(models), "float32", "cpu")
    req = SampleRequest(prompt="a robot", width=32, height=32, frames=FRAMES, steps=2, guidance=1.0, seed=5,
                        batch_size=1)
    with pytest.raises(ModelError, match=message):
        api.prepare_sample(spec, req, references=references)


@pytest.mark.workers
def test_the_templates_quantized_files_equal_themselves_dequantized(built, files, comfyui_dir, monkeypatch):
    """The templates' layout: the pruned int8 ConvRot transformer, the int8 ConvRot video VAE and the nvfp4 AWQ
    Qwen3-VL (comfy-kitchen's own quantize), read through comfy-kitchen (the transformer's and the text encoder's
    layers kept quantized, each dequantized as it runs; the VAE dequantized at load): t2va equals the same files
    dequantized by comfy-kitchen, loaded the same way (≤ 1e-3: the AWQ smoothing multiplies the input where the
    dequantized file has it folded into the weight, a float32 rounding apart through 51 layers; measured 1.0e-4)."""
    monkeypatch.syspath_prepend(str(comfyui_dir))
    models, names = files
    req = SampleRequest(prompt="a robot dancing", width=32, height=32, frames=FRAMES, steps=2, guidance=1.0, seed=5,
                        batch_size=1)
    outs = {}
    for case, suffix in (("quantized", ""), ("dequantized", "_dequantized")):
        choice = _choice(names, f"int8{suffix}", vae=names[f"vae_int8{suffix}"],
                         text_encoders=(names[f"qwen3vl_nvfp4{suffix}"],))
        spec = api.make_file_spec(choice, _roots(models), "float32", "cpu")
        quant = {c.name: c.quant for c in spec.source.components}
        assert (quant["transformer"], quant["vae"], quant["text_encoder"]) == (
            ("comfy-quant",) * 3 if case == "quantized" else ("",) * 3)
        outs[case] = api.run_sample_outputs(api.prepare_sample(spec, req))
    want, got = outs["dequantized"], outs["quantized"]
    assert np.abs(got["images"] - want["images"]).max() <= 1e-3
    assert np.abs(got["audio"] - want["audio"]).max() <= 1e-3


def _published(built, tmp_path):
    """The reference folder at the published reference size (the tiny folder lowers it to 64)."""
    import json
    import shutil

    shutil.copytree(built / "diffusers" / "ref-minimax-h3", tmp_path / "ref-published")
    index = tmp_path / "ref-published" / "modular_model_index.json"
    index.write_text(json.dumps({**json.loads(index.read_text()), "reference_image_short_edge": 2048}))
    return api.make_spec("ref-published", [str(tmp_path)])


@pytest.mark.workers
def test_the_ref2va_file_makes_the_reference_folders_ref2va(built, files, comfyui_dir, monkeypatch, tmp_path):
    """The r2v template's files (the ref2va transformer, told by its name, as `transformer_ref`, the only denoiser
    of the pipeline: no `transformer` loads) with a reference image, at the published reference size (a 2048-pixel
    short edge, which the pack's configs keep and the tiny folder lowers to 64): the full file and the pruned one
    (the template's) equal the reference folder at that size through the same worker (≤ 1e-5; measured 0 and
    2e-7), and plain diffusers' ref2va within 1e-5, as the folder does through a worker: the worker keeps the video
    VAE's tiling, which diffusers' MiniMax H3 VAE has on by default, so the 2048-pixel reference encodes in blended
    256-pixel tiles as in diffusers (with the tiling turned off, as the worker did before, 1.5e-4 apart)."""
    import PIL.Image
    from diffusers.modular_pipelines.minimax_h3 import MiniMaxH3ImageReference

    monkeypatch.syspath_prepend(str(comfyui_dir))
    models, names = files
    refs = np.random.default_rng(3).random((1, 64, 64, 3), dtype=np.float32)
    pictures = [MiniMaxH3ImageReference(PIL.Image.fromarray((r * 255).round().astype(np.uint8))) for r in refs]
    plain_frames, plain_audio = _t2va(built / "diffusers" / "ref-minimax-h3", "ref2va", {"references": pictures},
                                      reference_image_short_edge=2048)
    req = SampleRequest(prompt="a robot dancing", width=32, height=32, frames=FRAMES, steps=2, guidance=1.0, seed=5,
                        batch_size=1)
    want = api.run_sample_outputs(api.prepare_sample(_published(built, tmp_path), req, references=refs))
    for transformer in ("ref2va_full", "ref2va"):
        spec = api.make_file_spec(_choice(names, transformer), _roots(models), "float32", "cpu")
        assert [c.name for c in spec.source.components if c.name.startswith("transformer")] == ["transformer_ref"]
        assert spec.component_config("transformer_ref")["num_layers"] == 2
        out = api.run_sample_outputs(api.prepare_sample(spec, req, references=refs))
        assert out["images"].shape == want["images"].shape == (FRAMES, 32, 32, 3)
        assert out["audio"].shape == want["audio"].shape == plain_audio.shape
        assert np.abs(out["images"] - want["images"]).max() <= 1e-5
        assert np.abs(out["audio"] - want["audio"]).max() <= 1e-5
        assert np.abs(out["images"] - plain_frames[0]).max() <= 1e-5
        assert np.abs(out["audio"] - plain_audio).max() <= 1e-5


@pytest.mark.workers
def test_a_lora_goes_onto_the_ref2va_file(built, files, comfyui_dir, monkeypatch, tmp_path):
    """A turbo-style LoRA in ComfyUI's names (Load LoRA, as the r2v template's LoraLoaderModelOnly) on the ref2va
    file, the pipeline's only transformer (`transformer_ref`; diffusers reads the LoRA onto `transformer`): equal
    to the reference folder at the published reference size with the same LoRA, whose worker writes it onto its
    `transformer_ref` (tests/test_minimax_h3.py checks that against diffusers' own load and fuse), ≤ 1e-5; and
    not the video without it."""
    from test_minimax_h3 import _comfy_lora

    monkeypatch.syspath_prepend(str(comfyui_dir))
    models, names = files
    lora = tmp_path / "minimax_h3_ref2v_turbo_4step_tiny_comfyui.safetensors"
    _comfy_lora(built / "diffusers" / "ref-minimax-h3", lora)
    refs = np.random.default_rng(3).random((1, 64, 64, 3), dtype=np.float32)
    req = SampleRequest(prompt="a robot dancing", width=32, height=32, frames=FRAMES, steps=2, guidance=1.0, seed=5,
                        batch_size=1)
    folder, _ = api.with_lora(_published(built, tmp_path), str(lora), 0.8)
    want = api.run_sample_outputs(api.prepare_sample(folder, req, references=refs))
    spec, _ = api.with_lora(api.make_file_spec(_choice(names, "ref2va_full"), _roots(models), "float32", "cpu"),
                            str(lora), 0.8)
    out = api.run_sample_outputs(api.prepare_sample(spec, req, references=refs))
    assert np.abs(out["images"] - want["images"]).max() <= 1e-5
    assert np.abs(out["audio"] - want["audio"]).max() <= 1e-5
    without = api.run_sample_outputs(api.prepare_sample(api.make_file_spec(
        _choice(names, "ref2va_full"), _roots(models), "float32", "cpu"), req, references=refs))
    assert np.abs(without["images"] - out["images"]).max() > 1e-3  # the LoRA changed the video


@pytest.mark.pipelines
def test_a_files_pipeline_loads_what_its_files_hold_and_no_partition_later(files, comfyui_dir, monkeypatch):
    """A files pipeline is made of its files up front (the folder they were laid out in is gone after): the fl2va
    file's holds `transformer` and no `transformer_ref`, and asking it for ref2va names what is missing rather
    than read the gone folder; the ref2va file's holds `transformer_ref` alone, its one denoiser."""
    from backend.worker import compiler, modular
    from backend.worker.modular_files import load_files

    monkeypatch.syspath_prepend(str(comfyui_dir))
    models, names = files
    spec = api.make_file_spec(_choice(names, "pruned"), _roots(models), "float32", "cpu")
    pipe = load_files(spec.source, spec.family, torch.float32, lambda text: None)
    assert pipe.transformer is not None and pipe.transformer_ref is None
    assert modular.for_task(pipe, spec.family, "start", lambda text: None) is pipe  # fl2va: its own transformer
    with pytest.raises(ValueError, match=r"MiniMax H3 ref2va needs transformer_ref, which the chosen files do not "
                                         r"hold \(.*minimax_h3_fl2va_pruned-tiny\.safetensors"):
        modular.for_task(pipe, spec.family, "reference", lambda text: None)
    spec = api.make_file_spec(_choice(names, "ref2va"), _roots(models), "float32", "cpu")
    pipe = load_files(spec.source, spec.family, torch.float32, lambda text: None)
    assert pipe.transformer is None and pipe.transformer_ref is not None
    assert compiler.denoiser(pipe) == ("transformer_ref", pipe.transformer_ref)
    assert compiler.experts(pipe) == (pipe.transformer_ref,)


def _templates(names: dict, suffix: str = "", transformer: str = "int8") -> assemble.FileChoice:
    """The templates' files (the pruned int8 ConvRot transformer, the int8 ConvRot video VAE, the nvfp4 AWQ
    Qwen3-VL), or with `suffix` "_dequantized" the same files dequantized by comfy-kitchen."""
    return _choice(names, f"{transformer}{suffix}", vae=names[f"vae_int8{suffix}"],
                   text_encoders=(names[f"qwen3vl_nvfp4{suffix}"],))


@pytest.mark.workers
@pytest.mark.parametrize(("transformer", "lora_name"), [("int8", "minimax_h3_fl2v_turbo_8step_tiny_comfyui"),
                                                        ("ref2va_int8", "minimax_h3_ref2v_turbo_4step_tiny_comfyui")])
def test_a_lora_on_a_quantized_transformer_file_equals_it_on_the_file_dequantized(built, files, comfyui_dir,
                                                                                  monkeypatch, tmp_path, transformer,
                                                                                  lora_name):
    """The i2v template's transformer (the pruned int8 ConvRot fl2va file; fl2va from a start frame) and the r2v
    template's (the int8 ref2va file, `transformer_ref`; a reference image at the published 2048-pixel short edge)
    with a turbo-style LoRA in ComfyUI's names, as the templates' LoraLoaderModelOnly loads it (on exactly the
    layers the files keep int8: qkv, out, fc1, fc2): the LoRA's delta kept beside each quantized weight
    (docs/quantized.md) gives the video of the same LoRA on the same file dequantized by comfy-kitchen (≤ 1e-5;
    measured 0), and not the video without it. The text encoder and the VAE are the plain files: with the
    templates' nvfp4 AWQ Qwen3-VL too, the LoRA's large random deltas carry its float32 rounding (1e-4 without the
    LoRA) to 1.1e-3 on fl2va."""
    from test_minimax_h3 import _comfy_lora

    monkeypatch.syspath_prepend(str(comfyui_dir))
    models, names = files
    lora = tmp_path / f"{lora_name}.safetensors"
    _comfy_lora(built / "diffusers" / "ref-minimax-h3", lora)
    inputs = ({"references": np.random.default_rng(3).random((1, 64, 64, 3), dtype=np.float32)}
              if transformer.startswith("ref2va") else
              {"image": np.random.default_rng(1).random((1, 32, 32, 3), dtype=np.float32)})
    req = SampleRequest(prompt="a robot dancing", width=32, height=32, frames=FRAMES, steps=2, guidance=1.0, seed=5,
                        batch_size=1)
    outs = {}
    for case in (transformer, f"{transformer}_dequantized"):
        spec = api.make_file_spec(_choice(names, case), _roots(models), "float32", "cpu")
        assert [c.quant for c in spec.source.components if c.name.startswith("transformer")] == [
            "comfy-quant" if case == transformer else ""]
        spec, text = api.with_lora(spec, str(lora), 0.8)
        assert lora.name in text
        outs[case] = api.run_sample_outputs(api.prepare_sample(spec, req, inputs.get("image"),
                                                               references=inputs.get("references")))
    got, want = outs[transformer], outs[f"{transformer}_dequantized"]
    assert got["images"].shape == (FRAMES, 32, 32, 3)
    assert np.abs(got["images"] - want["images"]).max() <= 1e-5
    assert np.abs(got["audio"] - want["audio"]).max() <= 1e-5
    without = api.run_sample_outputs(api.prepare_sample(api.make_file_spec(
        _choice(names, transformer), _roots(models), "float32", "cpu"), req, inputs.get("image"),
        references=inputs.get("references")))
    assert np.abs(without["images"] - got["images"]).max() > 1e-2  # the LoRA changed the video


@pytest.mark.workers
def test_context_parallel_2_with_the_templates_files_equals_one_worker(built, files, comfyui_dir, monkeypatch):
    """Context Parallel 2 (two CPU ranks, gloo; diffusers' _cp_plan on the converted transformer, its int8 layers
    kept quantized: the ranks split the packed rows, never the weights) with the templates' quantized files: t2va
    and fl2va with the t2v / i2v templates' fl2va file, ref2va with the r2v template's ref2va file
    (`transformer_ref`, the pipeline's only denoiser; a reference image at the published 2048-pixel short edge:
    8654 rows). The frames and waveform equal one worker's within 1e-4. Each prompt makes an even number of rows
    (fl2va's start frame adds 73)."""
    monkeypatch.syspath_prepend(str(comfyui_dir))
    models, names = files
    first = np.random.default_rng(1).random((1, 32, 32, 3), dtype=np.float32)
    refs = np.random.default_rng(3).random((1, 64, 64, 3), dtype=np.float32)
    for choice, prompt, image, references in ((_templates(names), "a robot dancing", None, None),
                                              (_templates(names), "a robot dancing!", first, None),
                                              (_templates(names, transformer="ref2va_int8"), "a robot dancing",
                                               None, refs)):
        req = SampleRequest(prompt=prompt, width=32, height=32, frames=FRAMES, steps=2, guidance=1.0, seed=5,
                            batch_size=1)
        one = api.make_file_spec(choice, _roots(models), "float32", "cpu")
        cp, text = api.context_parallel(one, 2)
        assert cp.cp_degree == 2, text
        want = api.run_sample_outputs(api.prepare_sample(one, req, image, references=references))
        got = api.run_sample_outputs(api.prepare_sample(cp, req, image, references=references))
        assert got["images"].shape == want["images"].shape == (FRAMES, 32, 32, 3)
        assert np.abs(got["images"] - want["images"]).max() <= 1e-4, prompt
        assert np.abs(got["audio"] - want["audio"]).max() <= 1e-4, prompt


@pytest.mark.pipelines
def test_offload_auto_counts_the_templates_files_as_the_worker_loads_them(files, comfyui_dir, monkeypatch):
    """Offload 'auto' with the templates' quantized files counts each at the size the worker holds it in
    (docs/quantized.md), in bfloat16: the int8 transformer kept (its stored size) on a GPU and a TPU alike; the int8
    video VAE at its dequantized size everywhere (the family's converter reads plain weights: the size of the file
    dequantized by comfy-kitchen); the nvfp4 AWQ text encoder kept on a GPU and dequantized at load on a TPU (the
    dequantized file's size: the smoothing folded in). So with memory between the two totals a GPU runs it as it
    is and a TPU cannot: a modular pipeline has no offload to fall back on, and the refusal does not offer fp8
    storage, which these files refuse. The loader's note says the VAE is dequantized at load."""
    from backend.controller import offload
    from backend.controller.files import headers

    monkeypatch.syspath_prepend(str(comfyui_dir))
    models, names = files

    def size(role: str, key: str) -> int:
        return headers.read_header(models / role / names[key]).loaded_bytes(2)

    spec = api.make_file_spec(_templates(names), _roots(models), "bfloat16", "cpu")
    assert any(n.startswith(names["vae_int8"]) and "dequantized once while loading" in n for n in spec.source.notes)
    counted = {kind: offload.dequantized_at_load(spec.with_changes(kind=kind), offload.models.weight_bytes(spec, 2), 2)
               for kind in ("cuda", "tpu")}
    audio = size("vae", "audio_vae")
    assert counted["cuda"] == {"transformer": size("diffusion_models", "int8"), "vae": size("vae", "vae_int8_dequantized"),
                               "audio_vae": audio, "text_encoder": size("text_encoders", "qwen3vl_nvfp4")}
    assert counted["tpu"] == {**counted["cuda"], "text_encoder": size("text_encoders", "qwen3vl_nvfp4_dequantized")}
    assert size("vae", "vae_int8") < counted["cuda"]["vae"]  # the count before: the VAE as if kept int8
    gpu, tpu = (sum(counted[k].values()) for k in ("cuda", "tpu"))
    assert gpu < tpu
    memory = int((gpu + tpu) / 2 / offload.OFFLOAD_HEADROOM)
    monkeypatch.setattr(offload.devices, "device_memory_bytes", lambda kind: memory)
    assert offload.resolve_offload(spec.with_changes(kind="cuda", offload="auto")).offload == "none"
    with pytest.raises(ModelError, match=r"offload: auto cannot fit MiniMax H3 on one tpu device: .* text_encoder "
                                         r".* no CPU offload hooks .*\. Use a device with more memory\.$"):
        offload.resolve_offload(spec.with_changes(kind="tpu", offload="auto"))
