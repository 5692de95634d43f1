"""Artists' own model files: ComfyUI's checkpoints and split files, symlinked folders, the Hugging Face cache.

The files are written by ComfyUI's own converters and save functions from tiny pipelines (tests/file_fixtures.py,
which says where ComfyUI has no converter). Tolerance of the image comparisons: none. A file holds the same
float32 weights as its reference folder, the pack gives them the same configs, and the pipeline runs the same
operations in the same order, so the same seed gives bit-identical pixels (with MKL's strict mode, which the
workers and conftest set: otherwise a CPU matmul rounds by where its weights sit in memory); fp8 and GGUF files
hold rounded weights and are compared with the rounding, not with the image.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import file_fixtures
import numpy as np
import pytest
import test_ltx2_files
from helpers import pixels
from lora_fixtures import make

from backend.controller import api, devices, layouts, models
from backend.controller.files import assemble, headers, listing
from backend.families import FROM_FILES
from backend.protocol.errors import InputError, ModelError, ParallelError
from backend.protocol.spec import SampleRequest, read_json

ROOT = Path(__file__).resolve().parent.parent
FOX = "a red fox in the snow"
NONE = listing.NONE

# family layout -> (reference diffusers folder, the files chosen, guidance)
CASES = {
    "flux1-split": ("ref-flux1", dict(diffusion_model="flux1-tiny.safetensors", text_encoders=(
        "t5xxl-tiny.safetensors", "clip_l-tiny.safetensors"), vae="ae-tiny.safetensors"), 0.0),
    "flux1-modelsave": ("ref-flux1", dict(diffusion_model="flux1-tiny-comfysave.safetensors", text_encoders=(
        "clip_l-tiny.safetensors", "t5xxl-tiny.safetensors"), vae="ae-tiny.safetensors"), 0.0),
    "flux1-checkpoint": ("ref-flux1", dict(checkpoint="flux1-tiny-checkpoint.safetensors"), 0.0),
    "flux2-klein-split": ("ref-flux2", dict(diffusion_model="flux2-klein-tiny.safetensors", text_encoders=(
        "qwen_3-tiny.safetensors",), vae="flux2-vae-tiny.safetensors"), 1.0),
    "flux2-dev-split": ("ref-flux2dev", dict(diffusion_model="flux2-dev-tiny.safetensors", text_encoders=(
        "mistral_3_small_flux2-tiny.safetensors",), vae="flux2-vae-tiny.safetensors"), 4.0),
    "sd3-split": ("ref-sd3", dict(diffusion_model="sd3-tiny.safetensors", text_encoders=(
        "clip_g-tiny.safetensors", "clip_l-sd3-tiny.safetensors", "t5xxl-sd3-tiny.safetensors"),
        vae="sd3-vae-tiny.safetensors"), 4.5),
    "sd3-checkpoint": ("ref-sd3", dict(checkpoint="sd3-tiny.safetensors"), 4.5),
    "sd3-checkpoint-and-t5": ("ref-sd3", dict(checkpoint="sd3-tiny-noT5.safetensors", text_encoders=(
        "t5xxl-sd3-tiny.safetensors",)), 4.5),
    "sdxl-checkpoint": ("ref-sdxl", dict(checkpoint="sdxl-tiny.safetensors"), 6.0),
    "qwenimage-split": ("ref-qwenimage", dict(diffusion_model="qwen-image-tiny.safetensors", text_encoders=(
        "qwen_2.5_vl-tiny.safetensors",), vae="qwen_image_vae-tiny.safetensors"), 4.0),
    "qwenimage-modelsave": ("ref-qwenimage", dict(diffusion_model="qwen-image-tiny-comfysave.safetensors",
                                                  text_encoders=("qwen_2.5_vl-tiny.safetensors",),
                                                  vae="qwen_image_vae-tiny.safetensors"), 4.0),
    # Z-Image reads FLUX.2 [klein]'s Qwen3 file and FLUX.1's VAE file, as artists share them
    "zimage-split": ("ref-zimage", dict(diffusion_model="z_image_turbo-tiny.safetensors", text_encoders=(
        "qwen_3-tiny.safetensors",), vae="ae-tiny.safetensors"), 0.0),
    "zimage-modelsave": ("ref-zimage", dict(diffusion_model="z_image_turbo-tiny-comfysave.safetensors",
                                            text_encoders=("qwen_3-tiny.safetensors",), vae="ae-tiny.safetensors"),
                         3.0),
    # Krea 2 Turbo as its template names the files (Qwen3-VL-4B in ComfyUI's names), at guidance 0 (one pass) and
    # with guidance (two passes a step)
    "krea2-turbo-split": ("ref-krea2", dict(diffusion_model="krea2_turbo-tiny.safetensors", text_encoders=(
        "qwen3vl_4b-tiny.safetensors",), vae="qwen_image_vae-krea2-tiny.safetensors"), 0.0),
    # Qwen-Image 2.1 as its template names the files (Qwen3-VL-8B, its RGBA VAE), at cfg 1 and with true CFG
    "qwenimage21-split": ("ref-qwenimage21", dict(diffusion_model="qwen_image_2.1-tiny.safetensors", text_encoders=(
        "qwen3vl_8b-tiny.safetensors",), vae="qwen_image_2.1_vae-tiny.safetensors"), 1.0),
    "qwenimage21-true-cfg": ("ref-qwenimage21", dict(diffusion_model="qwen_image_2.1-tiny.safetensors",
                                                     text_encoders=("qwen3vl_8b-tiny.safetensors",),
                                                     vae="qwen_image_2.1_vae-tiny.safetensors"), 4.0),
    # Ideogram 4's two transformers, conditional and unconditional, in two files (both run every step)
    "ideogram4-split": ("ref-ideogram4", dict(diffusion_model="ideogram4-tiny.safetensors",
                                              diffusion_model_2="ideogram4_unconditional-tiny.safetensors",
                                              text_encoders=("qwen3vl_8b-36layers-tiny.safetensors",),
                                              vae="flux2-vae-tiny.safetensors"), 3.0),
    "krea2-turbo-guided": ("ref-krea2", dict(diffusion_model="krea2_turbo-tiny.safetensors", text_encoders=(
        "qwen3vl_4b-tiny.safetensors",), vae="qwen_image_vae-krea2-tiny.safetensors"), 3.5),
    # FLUX 3 [klein] as its templates name the files (Krea 2's Qwen3-VL-4B file, FLUX.2's VAE file), made into its
    # modular pipelines: step-distilled (one pass) and base (CFG through its guider)
    "flux3-klein-split": ("ref-flux3", dict(diffusion_model="flux3-image-klein-tiny.safetensors", text_encoders=(
        "qwen3vl_4b-tiny.safetensors",), vae="flux2-vae-tiny.safetensors"), 1.0),
    "flux3-klein-base-split": ("ref-flux3-base", dict(diffusion_model="flux3-image-klein-base-tiny.safetensors",
                                                      text_encoders=("qwen3vl_4b-tiny.safetensors",),
                                                      vae="flux2-vae-tiny.safetensors"), 4.0),
    # MiniMax H3 as its templates name the files (the fl2va transformer, Qwen3-VL-32B, the video and audio VAEs;
    # frames and sound from them: tests/test_minimax_h3_files.py)
    "minimax_h3-split": ("ref-minimax-h3", dict(diffusion_model="minimax_h3_fl2va-tiny_bf16.safetensors", text_encoders=(
        "qwen3vl_32b_minimax_h3-tiny.safetensors",), vae="minimax_h3_video_vae-tiny.safetensors",
        audio_vae="minimax_h3_audio_vae-tiny_fp32.safetensors"), 1.0),
}
FLUX1 = CASES["flux1-split"][1]
COMFYUI_FILES = (*file_fixtures.FAMILIES, "flux1-3072")  # comfyui_files' families, built from the start (conftest)


@pytest.fixture(scope="module")
def files(comfyui_files, comfyui_dir, monkeypatch_module):
    """All families' files and references, and the FLUX.1 file of the published width; ComfyUI's package
    importable here (its bundled tokenizers and, for FLUX.1 widths diffusers' converter does not read, its key
    map), as it is in ComfyUI's process."""
    monkeypatch_module.syspath_prepend(str(comfyui_dir))
    return comfyui_files(*COMFYUI_FILES)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def roots(files: Path) -> dict[str, list[str]]:
    return {role: [str(files / "models" / folder)] for role, folder in listing.ROLE_FOLDERS.items()}


def file_spec(files: Path, **choice) -> api.PipelineSpec:
    return api.make_file_spec(assemble.FileChoice(**choice), roots(files))


def request(guidance: float = 0.0, **kw) -> SampleRequest:
    base = dict(prompt=FOX, negative_prompt="blurry", width=64, height=64, steps=2, guidance=guidance, seed=5)
    return SampleRequest(**{**base, **kw})


def assert_error(words: list[str], call, *args, **kwargs) -> str:
    with pytest.raises(InputError) as e:
        call(*args, **kwargs)
    text = str(e.value)
    assert all(w in text for w in words), text
    return text


# ---- what the controller reads from the files (headers only)


@pytest.mark.pipelines
def test_each_dropdown_lists_only_the_files_that_fit_its_role(files, tmp_path):
    listed = api.list_files(roots(files))
    assert {"flux1-tiny.safetensors", "flux2-klein-tiny-Q8_0.gguf", "qwen-image-tiny.safetensors",
            "sd3-tiny.safetensors", "krea2_turbo-tiny.safetensors",
            "qwen_image_2.1-tiny.safetensors"} <= set(listed["diffusion_model"])
    assert {"clip_l-tiny.safetensors", "t5xxl-tiny_fp8_e4m3fn_scaled.safetensors", "qwen_3-tiny.safetensors",
            "mistral_3_small_flux2-tiny.safetensors", "qwen3vl_4b-tiny.safetensors",
            "qwen3vl_8b-tiny.safetensors"} <= set(listed["text_encoder"])
    assert set(listed["vae"]) == {"ae-tiny.safetensors", "flux2-vae-tiny.safetensors", "sd3-vae-tiny.safetensors",
                                  "qwen_image_vae-tiny.safetensors", "wan_2.1_vae-tiny.safetensors",
                                  "wan2.2_vae-tiny.safetensors", "qwen_image_vae-krea2-tiny.safetensors",
                                  "qwen_image_2.1_vae-tiny.safetensors", "minimax_h3_video_vae-tiny.safetensors",
                                  "minimax_h3_audio_vae-tiny_fp32.safetensors",
                                  "minimax_h3_video_vae-tiny_int8_convrot.safetensors",
                                  "minimax_h3_video_vae-tiny_int8_convrot-dequantized.safetensors"}
    assert listed["clip_vision"] == ["clip_vision_h-tiny.safetensors"]
    assert {"sdxl-tiny.safetensors", "sd3-tiny-noT5.safetensors"} <= set(listed["checkpoint"])
    assert not set(listed["vae"]) & (set(listed["text_encoder"]) | set(listed["diffusion_model"]))

    # a folder of its own: a misplaced VAE is hidden from the text encoders; files the pack cannot read as
    # safetensors are listed where they are, so that choosing one says what is wrong with it
    te = tmp_path / "text_encoders"
    (te / "sub").mkdir(parents=True)
    shutil.copy(files / "models" / "vae" / "ae-tiny.safetensors", te / "ae-tiny.safetensors")
    shutil.copy(files / "models" / "text_encoders" / "clip_l-tiny.safetensors", te / "sub" / "clip_l.safetensors")
    (te / "t5xxl.ckpt").write_bytes(b"\x80\x02pickle")
    (te / "notes.txt").write_text("not a model")
    assert api.list_files({"text_encoder": [str(te)]})["text_encoder"] == ["sub/clip_l.safetensors", "t5xxl.ckpt"]


SIZES = {"num_layers", "num_single_layers", "attention_head_dim", "num_attention_heads", "in_channels",
         "joint_attention_dim", "pooled_projection_dim", "caption_projection_dim", "pos_embed_max_size",
         "block_out_channels", "layers_per_block", "latent_channels", "hidden_size", "num_hidden_layers",
         "intermediate_size", "d_model", "num_heads", "d_ff", "d_kv", "vocab_size", "cross_attention_dim",
         "transformer_layers_per_block", "projection_class_embeddings_input_dim", "addition_time_embed_dim",
         "base_dim", "z_dim", "axes_dims_rope", "norm_num_groups", "head_dim", "num_key_value_heads",
         "timestep_guidance_channels", "mlp_ratio", "projection_dim", "dual_attention_layers", "qk_norm", "dim",
         "n_layers", "n_refiner_layers", "n_heads", "n_kv_heads", "cap_feat_dim", "axes_dims", "axes_lens",
         "adaln_dim", "llm_features_dim", "mrope_section"}


@pytest.mark.pipelines
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_family_and_layout_is_recognised_with_sizes_from_its_tensors(files, case):
    folder, choice, _ = CASES[case]
    spec = file_spec(files, **choice)
    reference = api.make_spec(folder, [str(files / "diffusers")])
    assert spec.class_name == reference.class_name and spec.size_factor == reference.size_factor
    for name in ("transformer", "unconditional_transformer", "unet", "vae", "text_encoder", "text_encoder_2",
                 "text_encoder_3"):
        mine, theirs = spec.component_config(name), reference.component_config(name)
        if not theirs:
            assert not mine, name
            continue
        mine, theirs = {**mine, **mine.get("text_config", {})}, {**theirs, **theirs.get("text_config", {})}
        theirs.update(CUT_SHORT.get((case, name), {}))
        keys = SIZES & set(mine) & set(theirs)  # every size the reference has is the one read from the files
        assert keys, name
        assert {k: mine[k] for k in keys} == {k: theirs[k] for k in keys}, name


# files that hold less than their reference: MiniMax H3's Qwen3-VL is cut after layer 50 as ComfyUI ships it (its
# reference keeps the tiny's 51 layers; the pipeline reads the output of layer 50 either way)
CUT_SHORT = {("minimax_h3-split", "text_encoder"): {"num_hidden_layers": 50}}
VIDEO_CASES = ("minimax_h3-split",)  # their frames and sound from the files: tests/test_minimax_h3_files.py


@pytest.mark.unit
@pytest.mark.parametrize("family", [f.id for f in FROM_FILES])
def test_each_family_that_loads_from_files_has_its_tiny_files_and_cases(family):
    """Each family of the registry whose artists' files load (FROM_FILES) has its tiny files (tests/
    file_fixtures.py) and its cases in the per-family tests (CASES, Wan's WAN_CASES, LTX-2's): a new family folder
    fails this until they are written, rather than passing untested."""
    assert family in file_fixtures.FAMILIES, f"tests/file_fixtures.py builds no files of {family!r}"
    ltx2 = test_ltx2_files.CASES  # LTX-2's video with sound: tests/test_ltx2_files.py
    assert any(case.startswith(family) for case in [*CASES, *WAN_CASES, *ltx2]), f"no case of {family!r} in CASES"


@pytest.mark.pipelines
def test_files_read_without_a_converter_for_their_size_say_how_they_load(files):
    spec = file_spec(files, **FLUX1)
    transformer = spec.source.component("transformer")
    assert transformer.layout == "flux1-comfy-map" and transformer.key_map, "32 wide: ComfyUI's key map"
    assert spec.source.component("tokenizer").path.endswith("sd1_tokenizer")
    assert "schnell" in api.describe_files(spec) and "ae-tiny.safetensors" in api.describe_files(spec)
    assert "offload auto" not in api.describe_files(spec)
    auto = api.make_file_spec(assemble.FileChoice(**FLUX1), roots(files), offload="auto")
    assert "offload auto → none: on the CPU" in api.describe_files(auto), "what auto chose, as Load TPU Pipeline says"
    qwen = file_spec(files, **CASES["qwenimage-split"][1])
    assert qwen.source.component("transformer").layout == "diffusers", "diffusers' own keys: symlinked"
    _, text = layouts.plan_tp(qwen, 2)
    assert "each chip reads only its slices of the file" in text
    _, text = layouts.plan_tp(spec, 2)
    assert "each chip reads the whole file" in text


QWEN = CASES["qwenimage-split"][1]
KREA2 = CASES["krea2-turbo-split"][1]
QWEN21 = CASES["qwenimage21-split"][1]
IDEOGRAM4 = CASES["ideogram4-split"][1]


@pytest.mark.pipelines
def test_qwen_image_21_files_load_as_the_folder(files):
    """Qwen-Image 2.1's files: the transformer through diffusers' converter (ComfyUI's fused gate and up rows split
    back), Qwen3-VL-8B renamed to Qwen3VLForConditionalGeneration's names (its untied lm_head too), the RGBA VAE
    through the family's converter (1-frame convolutions to 2D): every tensor the reference folder's, exactly."""
    import torch

    spec = file_spec(files, **QWEN21)
    assert [(c.name, c.layout) for c in spec.source.components if c.name != "tokenizer"] == [
        ("transformer", "qwenimage21"), ("vae", "qwenimage21-vae"), ("text_encoder", "qwen3vl-comfy"),
        ("processor", "tokenizer")]
    pipe, ref = _load(spec), _reference(files, "ref-qwenimage21")
    for name in ("transformer", "text_encoder", "vae"):
        mine, theirs = getattr(pipe, name).state_dict(), getattr(ref, name).state_dict()
        assert mine.keys() == theirs.keys(), name
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs), name
    assert "lm_head.weight" in pipe.text_encoder.state_dict()


@pytest.mark.pipelines
def test_krea2_files_load_as_the_folder_and_a_renamed_file_as_raw(files):
    """Krea 2's files, read through diffusers' converter (the transformer) and ComfyUI's Qwen3-VL names renamed
    to transformers' (the text encoder): every tensor the reference folder's, exactly; Turbo is told by the file
    name only, so the same tensors under another name load as Raw (no fixed shift), saying so."""
    import torch

    spec = file_spec(files, **KREA2)
    assert spec.source.component("text_encoder").layout == "qwen3vl-comfy"
    assert spec.source.component("transformer").layout == "krea2"
    assert spec.source.index()["is_distilled"] is True and "Krea 2 Turbo (its file name)" in api.describe_files(spec)
    pipe, ref = _load(spec), _reference(files, "ref-krea2")
    for name in ("transformer", "text_encoder", "vae"):
        mine, theirs = getattr(pipe, name).state_dict(), getattr(ref, name).state_dict()
        assert mine.keys() == theirs.keys(), name
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs), name
    raw = file_spec(files, **dict(KREA2, diffusion_model="krea2-tiny.safetensors"))
    assert raw.source.index()["is_distilled"] is False
    assert "read as Krea 2 (Raw): a Turbo file's name says 'turbo'" in api.describe_files(raw)


@pytest.fixture(scope="module")
def krea2_quant(comfyui_files, comfyui_dir, monkeypatch_module):
    """Krea 2 Turbo's int8 ConvRot file and the file dequantized (a folder of their own: the role lists of the
    other tests do not see them)."""
    monkeypatch_module.syspath_prepend(str(comfyui_dir))
    return comfyui_files("krea2", "krea2-quant", folder="comfyui-krea2-quant")


@pytest.mark.pipelines
def test_krea2_int8_convrot_file_stays_quantized_and_equals_comfy_kitchens_dequantized_file(krea2_quant):
    """krea2_turbo_int8_convrot (its template's file): each block's attention and feed-forward layers kept as
    comfy-kitchen QuantizedTensors through diffusers' Krea 2 converter, each equal to the dequantized file's
    weight, and the transformer's output equal to the dequantized one's."""
    import torch
    from comfy_kitchen.tensor import QuantizedTensor

    from backend.worker import quantized

    names = file_fixtures.FILES["krea2-quant"]
    specs = [file_spec(krea2_quant, **dict(KREA2, diffusion_model=names[n]))
             for n in ("int8_convrot", "int8_convrot_dequantized")]
    assert specs[0].source.component("transformer").quant == "comfy-quant"
    assert specs[1].source.component("transformer").quant == ""
    ours, theirs = (_load(s).transformer for s in specs)
    layers = [m for m in ours.modules() if isinstance(m, quantized.DequantLinear)]
    assert len(layers) == 2 * 8 and all(isinstance(m.weight, QuantizedTensor) for m in layers)
    mine = ours.state_dict()
    for key, value in theirs.state_dict().items():
        got = mine[key].dequantize() if isinstance(mine[key], QuantizedTensor) else mine[key]
        assert torch.equal(got, value), key
    g = torch.Generator().manual_seed(0)
    args = dict(hidden_states=torch.randn(1, 16, 16, generator=g),
                encoder_hidden_states=torch.randn(1, 7, 12, 32, generator=g), timestep=torch.tensor([0.5]),
                position_ids=torch.zeros(16 + 7, 3, dtype=torch.long), return_dict=False)
    with torch.no_grad():
        assert torch.equal(ours(**args)[0], theirs(**args)[0])


@pytest.mark.pipelines
def test_quantized_qwen_image_21_and_qwen3vl_files_stay_quantized_through_their_converters(files, tmp_path):
    """Qwen-Image 2.1's transformer and Qwen3-VL-8B in ComfyUI's quantized layout (int8 per row, quantized by
    comfy-kitchen; ConvRot needs 256 input features, wider than these tiny models): ComfyUI's fused gate-and-up rows
    are split still quantized by diffusers' converter, Qwen3-VL's names renamed with its layers quantized, and every
    weight equals the same file dequantized by comfy-kitchen."""
    import torch
    from comfy_kitchen.tensor import QuantizedTensor
    from safetensors.torch import load_file

    from backend.worker import quantized

    models = tmp_path / "models"
    for sub in listing.ROLE_FOLDERS.values():
        (models / sub).mkdir(parents=True)
    names = file_fixtures.FILES["qwenimage21"]
    shutil.copy(files / "models" / "vae" / names["vae"], models / "vae")
    for folder, name, layers in (("diffusion_models", names["diffusion_model"], "transformer_blocks."),
                                 ("text_encoders", names["qwen3vl"], "model.layers.")):
        sd = load_file(str(files / "models" / folder / name))
        plan = {k[: -len(".weight")]: "int8_rowwise" for k, v in sd.items()
                if k.startswith(layers) and k.endswith(".weight") and v.ndim == 2}
        q, _, deq = file_fixtures.quantize_comfy(sd, plan)
        file_fixtures._save(q, models / folder / f"int8-{name}")
        file_fixtures._save(deq, models / folder / f"deq-{name}")
    where = {role: [str(models / sub)] for role, sub in listing.ROLE_FOLDERS.items()}
    ours, theirs = (_load(api.make_file_spec(assemble.FileChoice(
        diffusion_model=f"{kind}-{names['diffusion_model']}", text_encoders=(f"{kind}-{names['qwen3vl']}",),
        vae=names["vae"]), where)) for kind in ("int8", "deq"))
    for name, count in (("transformer", 2 * 7), ("text_encoder", 2 * 7)):
        assert quantized.count(getattr(ours, name)) == count, name
        mine = getattr(ours, name).state_dict()
        for key, value in getattr(theirs, name).state_dict().items():
            got = mine[key].dequantize() if isinstance(mine[key], QuantizedTensor) else mine[key]
            assert torch.equal(got, value), (name, key)


FLUX3 = CASES["flux3-klein-split"][1]
FLUX3_BASE = CASES["flux3-klein-base-split"][1]


@pytest.mark.pipelines
def test_flux3_files_make_its_modular_pipelines_with_every_tensor_of_the_folder(files, tmp_path):
    """FLUX 3 [klein]'s files, the transformer through diffusers' converter (BFL's layout), Qwen3-VL-4B renamed to
    Qwen3VLForConditionalGeneration's names, FLUX.2's VAE: the family's modular pipeline (its blocks given the
    parts), every tensor the reference folder's, exactly. Step-distilled or base is told by the file's tensors (the
    flow map's ref_time_in), so a renamed file is what its header says."""
    import torch

    from backend.worker import modular

    for choice, folder, class_name in ((FLUX3, "ref-flux3", "Flux3DistilledModularPipeline"),
                                       (FLUX3_BASE, "ref-flux3-base", "Flux3ModularPipeline")):
        spec = file_spec(files, **choice)
        assert spec.class_name == class_name and spec.family.modular is not None
        assert [(c.name, c.layout) for c in spec.source.components if c.name != "tokenizer"] == [
            ("transformer", "flux3"), ("vae", "flux2-vae"), ("text_encoder", "qwen3vl-comfy")]
        pipe = _load(spec)
        reference = api.make_spec(folder, [str(files / "diffusers")])
        ref = modular.load(reference.model_path, reference.family, torch.float32, lambda text: None)
        assert type(pipe) is type(ref) and type(pipe.tokenizer).__name__ == "Qwen3VLProcessor"
        for name in ("transformer", "text_encoder", "vae"):
            mine, theirs = getattr(pipe, name).state_dict(), getattr(ref, name).state_dict()
            assert mine.keys() == theirs.keys(), name
            assert all(torch.equal(mine[k], theirs[k]) for k in theirs), name
        assert dict(pipe.scheduler.config) == dict(ref.scheduler.config), "the blocks' own scheduler, as the folder's"
    # in bfloat16 the QK norms stay float32 (the class's _keep_in_fp32_modules), as from the folder
    mine = _load(file_spec(files, **FLUX3_BASE), "bfloat16").transformer.state_dict()
    theirs = modular.load(reference.model_path, reference.family, torch.bfloat16, lambda text: None).transformer
    assert {k: v.dtype for k, v in mine.items()} == {k: v.dtype for k, v in theirs.state_dict().items()}
    assert mine["single_transformer_blocks.0.attn.norm_q.weight"].dtype == torch.float32
    renamed = tmp_path / "diffusion_models"
    renamed.mkdir()
    for name, source in (("my-klein.safetensors", FLUX3_BASE), ("flux3-base-distilled.safetensors", FLUX3)):
        (renamed / name).symlink_to(files / "models" / "diffusion_models" / source["diffusion_model"])
    where = {**roots(files), "diffusion_model": [str(renamed)]}
    assert api.make_file_spec(assemble.FileChoice(**dict(FLUX3_BASE, diffusion_model="my-klein.safetensors")),
                              where).class_name == "Flux3ModularPipeline"
    spec = api.make_file_spec(assemble.FileChoice(**dict(FLUX3, diffusion_model="flux3-base-distilled.safetensors")),
                              where)
    assert spec.class_name == "Flux3DistilledModularPipeline", "the tensors tell it, not the name"
    assert "the file holds the flow map's ref_time_in" in api.describe_files(spec)
    with pytest.raises(InputError, match=r"offload: 'model' is not available for FLUX 3 \[klein\].*modular"):
        api.make_file_spec(assemble.FileChoice(**FLUX3), roots(files), offload="model")


@pytest.mark.pipelines
def test_flux3_int8_convrot_file_stays_quantized_and_equals_comfy_kitchens_dequantized_file(files):
    """flux3-image-klein-base-int8-convrot (its templates' file): every block's attention and feed-forward layers
    kept as comfy-kitchen QuantizedTensors through diffusers' FLUX 3 converter, each equal to the dequantized file's
    weight, and the transformer's output equal to the dequantized one's."""
    import torch
    from comfy_kitchen.tensor import QuantizedTensor

    from backend.worker import quantized

    names = file_fixtures.FILES["flux3"]
    specs = [file_spec(files, **dict(FLUX3_BASE, diffusion_model=names[n]))
             for n in ("int8_convrot", "int8_convrot_dequantized")]
    assert [s.source.component("transformer").quant for s in specs] == ["comfy-quant", ""]
    assert specs[0].class_name == "Flux3ModularPipeline" and specs[0].component_config("transformer")[
        "num_attention_heads"] * specs[0].component_config("transformer")["attention_head_dim"] == 256
    ours, theirs = (_load(s).transformer for s in specs)
    layers = [m for m in ours.modules() if isinstance(m, quantized.DequantLinear)]
    assert len(layers) == 4 * 6 and all(isinstance(m.weight, QuantizedTensor) for m in layers)
    mine = ours.state_dict()
    for key, value in theirs.state_dict().items():
        got = mine[key].dequantize() if isinstance(mine[key], QuantizedTensor) else mine[key]
        assert torch.equal(got, value), key
    g = torch.Generator().manual_seed(0)
    ids = torch.zeros(16, 4, dtype=torch.long)
    args = dict(hidden_states=torch.randn(1, 16, 16, generator=g), encoder_hidden_states=torch.randn(
        1, 7, 256, generator=g), timestep=torch.tensor([0.5]), img_ids=ids, txt_ids=torch.zeros(7, 4, dtype=torch.long),
        return_dict=False)
    with torch.no_grad():
        assert torch.equal(ours(**args)[0], theirs(**args)[0])


@pytest.mark.pipelines
def test_flux3_reads_a_quantized_qwen3vl_4b_with_its_tied_lm_head(files, tmp_path):
    """The templates' qwen3vl_4b_int8_convrot for FLUX 3 (Qwen3VLForConditionalGeneration, whose lm_head Qwen3-VL-4B
    ties to the embeddings, which the file does not repeat): quantized by comfy-kitchen (int8 per row: ConvRot's
    256-wide groups are wider than this tiny model), its layers stay quantized, each equal to the file dequantized,
    and lm_head is the embeddings again."""
    import torch
    from comfy_kitchen.tensor import QuantizedTensor
    from safetensors.torch import load_file

    from backend.worker import quantized

    models = tmp_path / "models"
    for sub in listing.ROLE_FOLDERS.values():
        (models / sub).mkdir(parents=True)
    shutil.copy(files / "models" / "vae" / FLUX3_BASE["vae"], models / "vae")
    shutil.copy(files / "models" / "diffusion_models" / FLUX3_BASE["diffusion_model"], models / "diffusion_models")
    sd = load_file(str(files / "models" / "text_encoders" / FLUX3_BASE["text_encoders"][0]))
    assert "lm_head.weight" not in sd
    plan = {k[: -len(".weight")]: "int8_rowwise" for k, v in sd.items()
            if k.startswith("model.layers.") and k.endswith(".weight") and v.ndim == 2}
    q, _, deq = file_fixtures.quantize_comfy(sd, plan)
    file_fixtures._save(q, models / "text_encoders" / "int8-qwen3vl_4b.safetensors")
    file_fixtures._save(deq, models / "text_encoders" / "deq-qwen3vl_4b.safetensors")
    where = {role: [str(models / sub)] for role, sub in listing.ROLE_FOLDERS.items()}
    ours, theirs = (_load(api.make_file_spec(assemble.FileChoice(**dict(
        FLUX3_BASE, text_encoders=(f"{kind}-qwen3vl_4b.safetensors",))), where)).text_encoder for kind in ("int8", "deq"))
    assert quantized.count(ours) == len(plan)
    assert ours.lm_head.weight is ours.model.language_model.embed_tokens.weight
    mine = ours.state_dict()
    for key, value in theirs.state_dict().items():
        got = mine[key].dequantize() if isinstance(mine[key], QuantizedTensor) else mine[key]
        assert torch.equal(got, value), key


@pytest.mark.pipelines
def test_ideogram4_files_load_as_the_folder_both_transformers_through_the_familys_converter(files, tmp_path):
    """Ideogram 4's two files (its template's ideogram4_* and ideogram4_unconditional_*, ComfyUI's layout: fused
    attention.qkv, attention.o) through the family's converter (diffusers 0.42.1 has none), Qwen3-VL-8B renamed to
    Qwen3VLModel's names: every tensor the reference folder's, exactly. The files are told by their headers, so
    renamed ones load the same (which one is which is then the inputs' order: their keys are the same)."""
    import torch

    spec = file_spec(files, **IDEOGRAM4)
    assert [(c.name, c.layout) for c in spec.source.components if c.name != "tokenizer"] == [
        ("transformer", "ideogram4"), ("unconditional_transformer", "ideogram4"), ("vae", "flux2-vae"),
        ("text_encoder", "qwen3vl-comfy")]
    pipe, ref = _load(spec), _reference(files, "ref-ideogram4")
    for name in ("transformer", "unconditional_transformer", "text_encoder", "vae"):
        mine, theirs = getattr(pipe, name).state_dict(), getattr(ref, name).state_dict()
        assert mine.keys() == theirs.keys(), name
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs), name
    assert not torch.equal(pipe.transformer.layers[0].attention.to_q.weight,
                           pipe.unconditional_transformer.layers[0].attention.to_q.weight), "two models"
    dm = tmp_path / "diffusion_models"
    dm.mkdir()
    for name, new in ((IDEOGRAM4["diffusion_model"], "a.safetensors"), (IDEOGRAM4["diffusion_model_2"], "b.sft")):
        shutil.copy(files / "models" / "diffusion_models" / name, dm / new)
    where = {**roots(files), "diffusion_model": [str(dm)]}
    renamed = api.make_file_spec(assemble.FileChoice(**dict(IDEOGRAM4, diffusion_model="a.safetensors",
                                                            diffusion_model_2="b.sft")), where)
    assert renamed.class_name == "Ideogram4Pipeline"
    assert [(c.name, Path(c.path).name) for c in renamed.source.components][:2] == [
        ("transformer", "a.safetensors"), ("unconditional_transformer", "b.sft")]


@pytest.mark.pipelines
def test_quantized_ideogram4_files_stay_quantized_through_the_familys_converter(files, tmp_path):
    """Both of Ideogram 4's tiny transformers in ComfyUI's quantized layout, int8 per row (quantized by
    comfy-kitchen; ConvRot's 256-wide groups: the test below): the fused qkv rows are split still quantized by the
    family's converter, and every weight equals the same files dequantized by comfy-kitchen."""
    import torch
    from comfy_kitchen.tensor import QuantizedTensor
    from safetensors.torch import load_file

    from backend.worker import quantized

    dm = tmp_path / "diffusion_models"
    dm.mkdir()
    for name in (IDEOGRAM4["diffusion_model"], IDEOGRAM4["diffusion_model_2"]):
        sd = load_file(str(files / "models" / "diffusion_models" / name))
        plan = {k[: -len(".weight")]: "int8_rowwise" for k, v in sd.items()
                if k.startswith("layers.") and k.endswith(".weight") and v.ndim == 2}
        q, _, deq = file_fixtures.quantize_comfy(sd, plan)
        file_fixtures._save(q, dm / f"int8-{name}")
        file_fixtures._save(deq, dm / f"deq-{name}")
    where = {**roots(files), "diffusion_model": [str(dm)]}
    ours, theirs = (_load(api.make_file_spec(assemble.FileChoice(**dict(
        IDEOGRAM4, diffusion_model=f"{kind}-{IDEOGRAM4['diffusion_model']}",
        diffusion_model_2=f"{kind}-{IDEOGRAM4['diffusion_model_2']}")), where)) for kind in ("int8", "deq"))
    for name in ("transformer", "unconditional_transformer"):
        model = getattr(ours, name)
        assert quantized.count(model) == 2 * 8, name  # per block: to_q, to_k, to_v, to_out, w1-w3, adaLN
        assert isinstance(model.layers[0].attention.to_k.weight, QuantizedTensor), "split still quantized"
        mine = model.state_dict()
        for key, value in getattr(theirs, name).state_dict().items():
            got = mine[key].dequantize() if isinstance(mine[key], QuantizedTensor) else mine[key]
            assert torch.equal(got, value), (name, key)



@pytest.mark.pipelines
def test_ideogram4_scaled_fp8_files_load_within_fp8s_rounding(files):
    """The template's files are ComfyUI's scaled fp8 (ideogram4_fp8_scaled, ideogram4_unconditional_fp8_scaled):
    dequantized with their scales before the family's converter splits the fused qkv, so every weight of both
    transformers is within fp8's rounding of the reference (at most 1/16 of the layer's largest value)."""
    names = file_fixtures.FILES["ideogram4"]
    spec = file_spec(files, **dict(IDEOGRAM4, diffusion_model=names["fp8_scaled"],
                                   diffusion_model_2=names["unconditional_fp8_scaled"]))
    assert [spec.source.component(n).quant for n in ("transformer", "unconditional_transformer")] == ["scaled-fp8"] * 2
    pipe, ref = _load(spec), _reference(files, "ref-ideogram4")
    for name in ("transformer", "unconditional_transformer"):
        mine, theirs = getattr(pipe, name).state_dict(), getattr(ref, name).state_dict()
        assert mine.keys() == theirs.keys(), name
        for key, value in theirs.items():
            error = float((mine[key] - value).abs().max() / value.abs().max())
            assert error < 1 / 16, (name, key, error)
        assert not (mine["layers.0.attention.to_k.weight"] == theirs["layers.0.attention.to_k.weight"]).all(), "fp8"



@pytest.fixture(scope="module")
def ideogram4_quant(comfyui_files, comfyui_dir, monkeypatch_module):
    """Ideogram 4's int8 ConvRot pair and the pair dequantized (a folder of their own: the role lists of the other
    tests do not see them)."""
    monkeypatch_module.syspath_prepend(str(comfyui_dir))
    return comfyui_files("ideogram4", "ideogram4-quant", folder="comfyui-ideogram4-quant")


@pytest.mark.pipelines
def test_ideogram4_int8_convrot_files_stay_quantized_and_equal_comfy_kitchens_dequantized_files(ideogram4_quant):
    """ideogram4_int8_convrot and ideogram4_unconditional_int8_convrot (its template's files, on 256-wide tiny
    transformers): every block's matrices kept as comfy-kitchen QuantizedTensors in ConvRot through the family's
    converter (the fused qkv split still quantized), each equal to the dequantized file's weight, and each
    transformer's output equal to the dequantized one's."""
    import torch
    from comfy_kitchen.tensor import QuantizedTensor

    from backend.worker import quantized

    names = file_fixtures.FILES["ideogram4-quant"]
    specs = [file_spec(ideogram4_quant, **dict(IDEOGRAM4, diffusion_model=names[n],
                                               diffusion_model_2=names[f"unconditional_{n}"]))
             for n in ("int8_convrot", "int8_convrot_dequantized")]
    assert [c.quant for c in specs[0].source.components[:2]] == ["comfy-quant"] * 2
    assert [c.quant for c in specs[1].source.components[:2]] == [""] * 2
    ours, theirs = (_load(s) for s in specs)
    g = torch.Generator().manual_seed(0)
    args = dict(hidden_states=torch.randn(1, 8, 16, generator=g), timestep=torch.tensor([0.5]),
                encoder_hidden_states=torch.randn(1, 8, 13 * 32, generator=g),
                position_ids=torch.arange(8).reshape(1, 8, 1).expand(1, 8, 3), segment_ids=torch.ones(1, 8).long(),
                indicator=torch.tensor([[3, 3, 3, 3, 2, 2, 2, 2]]), return_dict=False)
    for name in ("transformer", "unconditional_transformer"):
        mine, deq = getattr(ours, name), getattr(theirs, name)
        layers = [m for m in mine.modules() if isinstance(m, quantized.DequantLinear)]
        assert len(layers) == 2 * 8 and all(isinstance(m.weight, QuantizedTensor) for m in layers), name
        assert mine.layers[0].attention.to_v.weight._params.convrot, "ConvRot, split still quantized"
        state = mine.state_dict()
        for key, value in deq.state_dict().items():
            got = state[key].dequantize() if isinstance(state[key], QuantizedTensor) else state[key]
            assert torch.equal(got, value), (name, key)
        with torch.no_grad():
            assert torch.equal(mine(**args)[0], deq(**args)[0]), name


IDEOGRAM4_WRONG = {
    "no unconditional transformer": (dict(IDEOGRAM4, diffusion_model_2=NONE), [
        "diffusion_model_2: Ideogram 4 runs two transformers every step, the conditional transformer "
        "(diffusion_model) and the unconditional transformer (diffusion_model_2, "
        "ideogram4_unconditional_*.safetensors); only 'ideogram4-tiny.safetensors' was chosen. Choose the "
        "unconditional transformer in diffusion_model_2."]),
    "the unconditional transformer alone": (dict(IDEOGRAM4, diffusion_model=IDEOGRAM4["diffusion_model_2"],
                                                 diffusion_model_2=NONE), [
        "only 'ideogram4_unconditional-tiny.safetensors' was chosen. Choose the conditional transformer in "
        "diffusion_model, and 'ideogram4_unconditional-tiny.safetensors' in diffusion_model_2."]),
    "the two swapped": (dict(IDEOGRAM4, diffusion_model=IDEOGRAM4["diffusion_model_2"],
                             diffusion_model_2=IDEOGRAM4["diffusion_model"]), [
        "diffusion_model, diffusion_model_2: 'ideogram4_unconditional-tiny.safetensors' and "
        "'ideogram4-tiny.safetensors' are in each other's place", "Swap them."]),
    "one file twice": (dict(IDEOGRAM4, diffusion_model_2=IDEOGRAM4["diffusion_model"]), [
        "diffusion_model_2: 'ideogram4-tiny.safetensors' holds the same weights as diffusion_model"]),
    "another model second": (dict(IDEOGRAM4, diffusion_model_2="krea2_turbo-tiny.safetensors"), [
        "diffusion_model_2: 'krea2_turbo-tiny.safetensors' is not the unconditional transformer of Ideogram 4 "
        "(it holds a Krea 2 diffusion model)"]),
    "Qwen-Image's VAE": (dict(IDEOGRAM4, vae="qwen_image_vae-tiny.safetensors"), [
        "vae: 'qwen_image_vae-tiny.safetensors'", "of another kind", "this Ideogram 4 model "
        "('ideogram4-tiny.safetensors') needs flux2-vae.safetensors (4 channels). Choose the matching VAE."]),
    "no text encoder": (dict(IDEOGRAM4, text_encoders=()), ["Ideogram 4 needs Qwen3-VL", "is missing"]),
}


@pytest.mark.pipelines
@pytest.mark.parametrize("case", sorted(IDEOGRAM4_WRONG))
def test_ideogram4_files_that_do_not_make_its_pipeline_are_named_with_the_fix(files, case):
    choice, words = IDEOGRAM4_WRONG[case]
    assert_error(words, file_spec, files, **choice)


KREA2_WRONG = {
    "Qwen3 in place of Qwen3-VL": (dict(KREA2, text_encoders=("qwen_3-tiny.safetensors",)),
                                   ["text_encoder_1: 'qwen_3-tiny.safetensors' is a Qwen3 text encoder",
                                    "Krea 2 does not use", "Qwen3-VL (qwen3vl_4b_*.safetensors"]),
    "FLUX.2's VAE": (dict(KREA2, vae="flux2-vae-tiny.safetensors"),
                     ["vae: 'flux2-vae-tiny.safetensors'", "of another kind", "Krea 2 model",
                      "'krea2_turbo-tiny.safetensors'", "qwen_image_vae.safetensors"]),
    "no text encoder": (dict(KREA2, text_encoders=()), ["Krea 2 needs Qwen3-VL", "is missing"]),
    "Qwen-Image's VAE for FLUX 3": (dict(FLUX3_BASE, vae="qwen_image_vae-tiny.safetensors"),
                                    ["vae: 'qwen_image_vae-tiny.safetensors'", "of another kind",
                                     "FLUX 3 [klein] model ('flux3-image-klein-base-tiny.safetensors')",
                                     "FLUX.2's flux2-vae.safetensors", "Choose the matching VAE"]),
    "Qwen3 for FLUX 3": (dict(FLUX3, text_encoders=("qwen_3-tiny.safetensors",)),
                         ["text_encoder_1: 'qwen_3-tiny.safetensors' is a Qwen3 text encoder",
                          "FLUX 3 [klein] does not use", "Qwen3-VL (qwen3vl_4b_*.safetensors"]),
    "Qwen-Image's VAE for Qwen-Image 2.1": (dict(QWEN21, vae="qwen_image_vae-tiny.safetensors"),
                                             ["vae: 'qwen_image_vae-tiny.safetensors'", "of another kind",
                                              "Qwen-Image 2.1 model", "qwen_image_2.1_vae_bf16.safetensors"]),
    "Qwen-Image 2.1's VAE for Qwen-Image": (dict(QWEN, vae="qwen_image_2.1_vae-tiny.safetensors"),
                                             ["vae: 'qwen_image_2.1_vae-tiny.safetensors'", "of another kind",
                                              "qwen_image_vae.safetensors"]),
    "Qwen3-VL for Qwen-Image": (dict(QWEN, text_encoders=("qwen3vl_4b-tiny.safetensors",)),
                                ["text_encoder_1: 'qwen3vl_4b-tiny.safetensors' is a Qwen3-VL text encoder",
                                 "Qwen-Image does not use", "Qwen2.5-VL"]),
}


@pytest.mark.pipelines
@pytest.mark.parametrize("case", sorted(KREA2_WRONG))
def test_qwen3vl_families_files_that_do_not_make_their_pipeline_are_named_with_the_fix(files, case):
    choice, words = KREA2_WRONG[case]
    assert_error(words, file_spec, files, **choice)


@pytest.mark.pipelines
def test_qwen_image_releases_load_as_their_comfyui_template_files_say(files):
    """Comfy-Org's Qwen-Image files hold one layout: 2511 tells itself by its marker tensor (zero_cond_t), the
    edit releases by their file names (Edit Plus, with the processor); 2512 is Qwen-Image (families/qwenimage.py
    says why)."""
    plain = file_spec(files, **QWEN)
    for name, pipeline, zero in (("qwen_image_edit_2509-tiny_fp8_e4m3fn.safetensors", "QwenImageEditPlusPipeline", False),
                                 ("qwen_image_edit_2511-tiny_bf16.safetensors", "QwenImageEditPlusPipeline", True),
                                 ("qwen_image_2512-tiny_fp8_e4m3fn.safetensors", "QwenImagePipeline", False)):
        spec = file_spec(files, **dict(QWEN, diffusion_model=name))
        assert (spec.class_name, spec.component_config("transformer")["zero_cond_t"]) == (pipeline, zero), name
        assert {k: v for k, v in spec.component_config("transformer").items() if k != "zero_cond_t"} == {
            k: v for k, v in plain.component_config("transformer").items() if k != "zero_cond_t"}, name
        processor = spec.source.component("processor")
        assert (processor is not None) == (pipeline != "QwenImagePipeline"), name
        assert pipeline in api.describe_files(spec), name
    assert processor is None and "read as Qwen-Image (text to image)" in api.describe_files(spec)
    assert "the file's __index_timestep_zero__ tensor" in api.describe_files(
        file_spec(files, **dict(QWEN, diffusion_model="qwen_image_edit_2511-tiny_bf16.safetensors")))
    # a 2511 file without the marker (another converter's): its name says 2511, and zero_cond_t follows
    renamed = files / "models" / "diffusion_models" / "Qwen-Image-Edit-2511-tiny-Q8_0.safetensors"
    renamed.unlink(missing_ok=True)
    renamed.symlink_to(files / "models" / "diffusion_models" / "qwen_image_edit_2509-tiny_fp8_e4m3fn.safetensors")
    try:
        spec = file_spec(files, **dict(QWEN, diffusion_model=renamed.name))
    finally:
        renamed.unlink()
    assert (spec.class_name, spec.component_config("transformer")["zero_cond_t"]) == ("QwenImageEditPlusPipeline", True)
    assert spec.component_config("transformer")["use_additional_t_cond"] is False


@pytest.mark.pipelines
def test_a_qwen_image_layered_file_is_refused_by_name(files):
    """Qwen-Image's tensors plus Layered's addition_t_embedding: refused, not loaded as Qwen-Image without it."""
    from safetensors.torch import load_file, save_file

    models_dir = files / "models" / "diffusion_models"
    tensors = load_file(str(models_dir / "qwen_image_2512-tiny_fp8_e4m3fn.safetensors"))
    width = tensors["img_in.weight"].shape[0]
    layered = models_dir / "qwen_image_layered-tiny_bf16.safetensors"
    save_file({**tensors, "time_text_embed.addition_t_embedding.weight": tensors["img_in.weight"].new_zeros(2, width)},
              str(layered))
    try:
        with pytest.raises(ModelError) as e:
            file_spec(files, **dict(QWEN, diffusion_model=layered.name))
    finally:
        layered.unlink()
    assert str(e.value) == (
        "diffusion_model: 'qwen_image_layered-tiny_bf16.safetensors' is Qwen-Image-Layered (its "
        "time_text_embed.addition_t_embedding.* tensors), which ComfyUI-TPU does not run: it splits an image into "
        "RGBA layers (diffusers' QwenImageLayeredPipeline), and Sample returns images. Choose a Qwen-Image (2512 "
        "included) or Qwen-Image-Edit (2509, 2511) file.")


WRONG = {
    "missing text encoder": (dict(FLUX1, text_encoders=("clip_l-tiny.safetensors",)),
                             ["text_encoder", "FLUX.1 needs", "T5-XXL", "is missing", "models/text_encoders"]),
    "VAE of another family": (dict(FLUX1, vae="qwen_image_vae-tiny.safetensors"),
                              ["vae: 'qwen_image_vae-tiny.safetensors'", "flux1-tiny.safetensors",
                               "ae.safetensors"]),
    "text encoder of another family": (dict(FLUX1, text_encoders=("clip_l-tiny.safetensors",
                                                                   "qwen_3-tiny.safetensors")),
                                       ["text_encoder_2: 'qwen_3-tiny.safetensors'", "does not use", "T5-XXL"]),
    "text encoder of another width": (dict(FLUX1, text_encoders=("clip_l-sd3-tiny.safetensors",
                                                                  "t5xxl-tiny.safetensors")),
                                      ["text_encoder_1: 'clip_l-sd3-tiny.safetensors'", "8 wide", "32-wide"]),
    "VAE chosen as the diffusion model": (dict(FLUX1, diffusion_model="../vae/ae-tiny.safetensors"),
                                          ["'../vae/ae-tiny.safetensors'", "no '..'"]),
    "checkpoint and diffusion model": (dict(FLUX1, checkpoint="sdxl-tiny.safetensors"),
                                       ["both a checkpoint and a diffusion model", NONE]),
    "nothing chosen": (dict(diffusion_model=NONE, text_encoders=(NONE, NONE, NONE), vae=NONE),
                       ["no model was chosen"]),
    "GGUF text encoder": (dict(FLUX1, text_encoders=("clip_l-tiny.safetensors", "t5.gguf")),
                          ["'t5.gguf' is a GGUF file", "diffusion models only"]),
    "one text encoder chosen twice": (dict(FLUX1, text_encoders=("clip_l-tiny.safetensors", "t5xxl-tiny.safetensors",
                                                                  "t5xxl-tiny.safetensors")),
                                      ["text_encoder_3: 't5xxl-tiny.safetensors' is a T5", "as text_encoder_2 "
                                       "('t5xxl-tiny.safetensors') is", "one of each kind", "Set text_encoder_3 to"]),
}


@pytest.mark.pipelines
@pytest.mark.parametrize("case", sorted(WRONG))
def test_files_that_do_not_make_a_pipeline_are_named_with_the_fix(files, case):
    choice, words = WRONG[case]
    if case == "GGUF text encoder":
        gguf = files / "models" / "text_encoders" / "t5.gguf"
        shutil.copy(files / "models" / "diffusion_models" / "flux2-klein-tiny-Q8_0.gguf", gguf)
    try:
        assert_error(words, file_spec, files, **choice)
    finally:
        (files / "models" / "text_encoders" / "t5.gguf").unlink(missing_ok=True)


@pytest.mark.pipelines
def test_unreadable_files_are_named_with_the_fix(files, tmp_path, monkeypatch):
    good = files / "models" / "diffusion_models" / "flux1-tiny.safetensors"
    dm = tmp_path / "diffusion_models"
    dm.mkdir()
    (dm / "flux1-dev.ckpt").write_bytes(b"\x80\x02}q\x00.")
    (dm / "flux1-truncated.safetensors").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    (dm / "flux1-dev.safetensors.html").write_text("<html>")
    (dm / "not-safetensors.safetensors").write_bytes(b"<!DOCTYPE html><html>rate limited</html>" * 10)
    local = {**roots(files), "diffusion_model": [str(dm)]}
    choice = dict(FLUX1)
    for name, words in (("flux1-dev.ckpt", ["'flux1-dev.ckpt' is a pickle file", "arbitrary code", ".safetensors"]),
                        ("flux1-truncated.safetensors", ["'flux1-truncated.safetensors' is truncated",
                                                         "download it again"]),
                        ("not-safetensors.safetensors", ["'not-safetensors.safetensors' is not a safetensors file"])):
        assert_error(["diffusion_model: ", *words], api.make_file_spec,
                     assemble.FileChoice(**{**choice, "diffusion_model": name}), local)
    monkeypatch.setenv("COMFYUI_TPU_ALLOW_ABSOLUTE_PATHS", "0")
    assert_error(["absolute path", "COMFYUI_TPU_ALLOW_ABSOLUTE_PATHS"], file_spec, files,
                 **{**choice, "diffusion_model": str(good)})
    monkeypatch.setenv("COMFYUI_TPU_ALLOW_ABSOLUTE_PATHS", "1")
    assert file_spec(files, **{**choice, "diffusion_model": str(good)}).model_path == str(good)


def _rewritten(src: Path, out: Path, change) -> Path:
    """A copy of the safetensors file `src` whose header `change` edits (the tensor data kept as it is)."""
    raw = src.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    table = json.loads(raw[8:8 + n])
    change(table)
    header = json.dumps(table).encode()
    out.write_bytes(len(header).to_bytes(8, "little") + header + raw[8 + n:])
    return out


@pytest.mark.pipelines
def test_a_header_that_does_not_match_its_tensors_names_the_model_file(files, tmp_path):
    """Shapes that do not match the bytes stored, and a tensor stored the wrong way round (the right number of
    bytes): the diffusion model file is named as damaged, before any worker reads it, and the VAE is not blamed."""
    good = files / "models" / "diffusion_models" / "flux1-tiny.safetensors"
    dm = tmp_path / "diffusion_models"
    dm.mkdir()
    key = next(k for k in json.loads(good.read_bytes()[8:8 + int.from_bytes(good.read_bytes()[:8], "little")])
               if k.endswith("img_in.weight"))

    def wider(table):
        table[key]["shape"][1] += 1

    def transposed(table):
        table[key]["shape"].reverse()

    _rewritten(good, dm / "flux1-wider.safetensors", wider)
    _rewritten(good, dm / "flux1-transposed.safetensors", transposed)
    local = {**roots(files), "diffusion_model": [str(dm)]}
    assert_error(["diffusion_model: 'flux1-wider.safetensors' is damaged", f"'{key}'", "does not match",
                  "Download it again"], api.make_file_spec,
                 assemble.FileChoice(**{**FLUX1, "diffusion_model": "flux1-wider.safetensors"}), local)
    text = assert_error(["diffusion_model: 'flux1-transposed.safetensors' is damaged", f"'{key}'",
                         "does not fit its other layers", "Download it again"], api.make_file_spec,
                        assemble.FileChoice(**{**FLUX1, "diffusion_model": "flux1-transposed.safetensors"}), local)
    assert "ae-tiny" not in text and "latent channels" not in text
    # a file damaged after it was checked is named by the worker too (safetensors' own error names no file)
    shutil.copy(good, dm / "flux1-later.safetensors")
    spec = api.make_file_spec(assemble.FileChoice(**{**FLUX1, "diffusion_model": "flux1-later.safetensors"}), local)
    _rewritten(good, dm / "flux1-later.safetensors", wider)
    import torch

    from backend.worker import loading

    with pytest.raises(OSError, match="component 'transformer' from 'flux1-later.safetensors': SafetensorError"):
        loading.load_files(spec.source, torch.float32, lambda text: None)


def _huge_header(path: Path) -> Path:
    """A legal safetensors file whose header is twice the size the pack reads: one tensor, the header padded
    with spaces as the format allows, the data a hole."""
    n = 2 * headers.MAX_HEADER
    with open(path, "wb") as f:
        f.write(n.to_bytes(8, "little"))
        f.write(json.dumps({"w": {"dtype": "F32", "shape": [2**20], "data_offsets": [0, 2**22]}}).encode().ljust(n))
        f.truncate(8 + n + 2**22)
    return path


@pytest.mark.pipelines
def test_one_huge_header_or_a_symlink_loop_neither_stalls_nor_empties_the_lists(files, tmp_path, monkeypatch):
    """A legal header far larger than any model's is refused from its first 8 bytes (listed, so that choosing
    it says why), a `loop -> .` link is followed once, each file is read once for every role and every
    refresh, and the other files are listed as before."""
    dm = tmp_path / "diffusion_models"
    (tmp_path / "elsewhere").mkdir(parents=True)
    dm.mkdir()
    shutil.copy(files / "models" / "diffusion_models" / "flux1-tiny.safetensors", dm / "flux1.safetensors")
    shutil.copy(files / "models" / "diffusion_models" / "sd3-tiny.safetensors", tmp_path / "elsewhere" / "sd3.safetensors")
    (dm / "loop").symlink_to(".")
    (dm / "linked").symlink_to(tmp_path / "elsewhere")
    _huge_header(dm / "huge-header.safetensors")
    loads = []
    real_load = listing.load
    monkeypatch.setattr(listing, "load", lambda path, size: loads.append(path.name) or real_load(path, size))
    local = {"diffusion_model": [str(dm)], "checkpoint": [str(dm)]}
    for _ in range(2):
        listed = api.list_files(local)
        assert listed["diffusion_model"] == listed["checkpoint"] == [
            "flux1.safetensors", "huge-header.safetensors", "linked/sd3.safetensors"]
    assert sorted(loads) == ["flux1.safetensors", "huge-header.safetensors", "sd3.safetensors"]
    assert_error(["diffusion_model: 'huge-header.safetensors' has a header of 16,777,216 bytes",
                  f"more than the {headers.MAX_HEADER:,}", "under 1 MB"], api.make_file_spec,
                 assemble.FileChoice(**{**FLUX1, "diffusion_model": "huge-header.safetensors"}),
                 {**roots(files), "diffusion_model": [str(dm)]})


@pytest.mark.pipelines
def test_listing_past_its_time_lists_the_unread_files_where_they_are(files, tmp_path, monkeypatch, caplog):
    te = tmp_path / "text_encoders"
    te.mkdir()
    shutil.copy(files / "models" / "vae" / "ae-tiny.safetensors", te / "ae-tiny.safetensors")
    shutil.copy(files / "models" / "text_encoders" / "clip_l-tiny.safetensors", te / "clip_l.safetensors")
    assert api.list_files({"text_encoder": [str(te)]})["text_encoder"] == ["clip_l.safetensors"]
    monkeypatch.setattr(listing, "LIST_SECONDS", 0.0)
    (te / "t5xxl.safetensors").write_bytes(b"")  # new: not read in time, so listed unread
    with caplog.at_level("WARNING", logger=listing.__name__):
        listed = api.list_files({"text_encoder": [str(te)]})["text_encoder"]
    assert listed == ["ae-tiny.safetensors", "clip_l.safetensors", "t5xxl.safetensors"]
    assert "listed 3 model files without reading them" in caplog.text


@pytest.mark.pipelines
def test_gguf_is_refused_on_tpu_and_with_shard_tp(files, monkeypatch):
    choice = dict(CASES["flux2-klein-split"][1], diffusion_model="flux2-klein-tiny-Q8_0.gguf")
    spec = file_spec(files, **choice)
    assert spec.source.component("transformer").quant == "gguf"
    with pytest.raises(ParallelError, match=r"'flux2-klein-tiny-Q8_0.gguf' is a GGUF file.*cannot be sharded"):
        layouts.plan_tp(spec, 2)
    monkeypatch.setattr(devices, "resolve_kind", lambda choice: "tpu")
    assert_error(["'flux2-klein-tiny-Q8_0.gguf' is a GGUF file", "TorchTPU", ".safetensors version"], api.make_file_spec,
                 assemble.FileChoice(**choice), roots(files), device_choice="tpu")


# ---- diffusers folders as people keep them


def _pipeline_copy(tiny_models: Path, target: Path, variant: str = "") -> Path:
    """tiny-sdxl saved again (with only `variant` weights when given)."""
    import torch
    from diffusers import StableDiffusionXLPipeline

    pipe = StableDiffusionXLPipeline.from_pretrained(str(tiny_models / "tiny-sdxl"), dtype=torch.float32,
                                                     local_files_only=True)
    pipe.save_pretrained(str(target), safe_serialization=True, variant=variant or None)
    return target


def _hub_cache(snapshot_source: Path, cache: Path, repo: str) -> Path:
    """`hf download`'s layout: blobs by hash, snapshots/<rev>/ of relative symlinks, refs/main."""
    repo_dir = cache / f"models--{repo.replace('/', '--')}"
    rev = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo_dir / "snapshots" / rev
    (repo_dir / "blobs").mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(rev)
    for file in snapshot_source.rglob("*"):
        if file.is_file():
            data = file.read_bytes()
            blob = repo_dir / "blobs" / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            link = snapshot / file.relative_to(snapshot_source)
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(blob, link.parent), link)
    return snapshot


@pytest.fixture(scope="module")
def kept_folders(tiny_models, tmp_path_factory):
    """A diffusers root holding a symlink to a model folder kept elsewhere, and a hub cache holding a
    variant-only (fp16 file names) copy of tiny-sdxl."""
    base = tmp_path_factory.mktemp("kept")
    root = base / "diffusers"
    root.mkdir()
    os.symlink(tiny_models / "tiny-flux", root / "flux-on-big-disk")
    _hub_cache(_pipeline_copy(tiny_models, base / "staging", variant="fp16"), base / "hub", "acme/tiny-sdxl")
    return root, base / "hub"


@pytest.mark.unit
def test_a_symlinked_folder_and_the_hub_cache_are_listed_and_resolved(kept_folders, monkeypatch):
    root, hub = kept_folders
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert api.list_models([str(root)]) == ["flux-on-big-disk", "acme/tiny-sdxl"]
    spec = api.make_spec("flux-on-big-disk", [str(root)])
    assert spec.model_path == str(root / "flux-on-big-disk") and spec.class_name == "FluxPipeline"
    cached = api.make_spec("acme/tiny-sdxl", [str(root)])
    assert cached.variant == "fp16" and cached.class_name == "StableDiffusionXLPipeline"
    assert "/snapshots/" in cached.model_path
    # typed names still cannot leave the diffusers folders
    assert_error(["outside ComfyUI's diffusers folders", "no '..'"], api.make_spec, "../diffusers/flux-on-big-disk",
                 [str(root)])
    assert_error(["absolute path", "COMFYUI_TPU_ALLOW_ABSOLUTE_PATHS"], api.make_spec, str(root / "flux-on-big-disk"),
                 [str(root)])


@pytest.mark.unit
def test_variants_are_detected_only_where_plain_weights_are_missing(tmp_path):
    index = {"_class_name": "FluxPipeline", "transformer": ["diffusers", "X"], "vae": ["diffusers", "Y"]}
    for component, names in (("transformer", ["diffusion_pytorch_model.fp16.safetensors"]),
                             ("vae", ["diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.fp16.safetensors"])):
        (tmp_path / component).mkdir()
        for n in names:
            (tmp_path / component / n).write_bytes(b"")
    assert models.detect_variant(tmp_path, index) == "fp16"
    (tmp_path / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    assert models.detect_variant(tmp_path, index) == ""
    (tmp_path / "transformer" / "diffusion_pytorch_model.safetensors").unlink()
    (tmp_path / "transformer" / "diffusion_pytorch_model.bf16.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match="several kinds"):
        models.detect_variant(tmp_path, index)


# ---- Wan (video): Wan 2.1, Wan 2.2 A14B's two experts, Wan 2.2 TI2V 5B (48 latent channels, Wan 2.2's VAE)

UMT5 = "umt5_xxl-tiny.safetensors"
WAN21 = dict(diffusion_model="wan2.1_t2v-tiny_fp16.safetensors", text_encoders=(UMT5,),
             vae="wan_2.1_vae-tiny.safetensors")
WAN = {  # case -> (reference diffusers folder, the files chosen, published configs, size factor)
    "wan21": ("ref-wan21", WAN21, "wan21-t2v-1.3b", 16),
    "wan22-a14b": ("ref-wan22-a14b", dict(WAN21, diffusion_model="wan2.2_t2v_high_noise-tiny.safetensors",
                                          diffusion_model_2="wan2.2_t2v_low_noise-tiny.safetensors"),
                   "wan22-t2v-a14b", 16),
    "wan22-5b": ("ref-wan22-5b", dict(WAN21, diffusion_model="wan2.2_ti2v-tiny.safetensors",
                                      vae="wan2.2_vae-tiny.safetensors"), "wan22-ti2v-5b", 32),
}
WAN_I2V = dict(WAN21, diffusion_model="wan2.2_i2v_high_noise-tiny.safetensors",
               diffusion_model_2="wan2.2_i2v_low_noise-tiny.safetensors")
WAN21_I2V = dict(WAN21, diffusion_model="wan2.1_i2v-tiny_fp16.safetensors", clip_vision="clip_vision_h-tiny.safetensors")
WAN_CASES = {**WAN, "wan22-i2v-a14b": ("ref-wan22-i2v-a14b", WAN_I2V, "wan22-i2v-a14b", 16),
             "wan21-i2v": ("ref-wan21-i2v", WAN21_I2V, "wan21-i2v-14b", 16)}
WAN_SIZES = {"in_channels", "out_channels", "num_layers", "attention_head_dim", "num_attention_heads", "ffn_dim",
             "text_dim", "freq_dim", "base_dim", "decoder_base_dim", "z_dim", "is_residual", "d_model", "num_heads",
             "d_ff", "d_kv", "vocab_size", "relative_attention_num_buckets", "latents_mean", "latents_std",
             "image_dim", "added_kv_proj_dim", "hidden_size", "intermediate_size", "num_hidden_layers",
             "patch_size", "image_size", "projection_dim"}


@pytest.mark.pipelines
def test_wan_files_make_the_published_pipelines_with_sizes_from_their_tensors(files):
    """Each choice makes its published model (configs, experts, Wan 2.2's VAE and its 32-pixel size step) with
    the reference's sizes, and takes a start image where the model does (Wan 2.2 TI2V 5B by its expand_timesteps,
    Wan 2.2 I2V A14B's experts, Wan 2.1 I2V with ComfyUI's clip_vision_h as its image encoder and the image
    processor at that encoder's size); ComfyUI's scaled fp8 (UMT5 and the diffusion model) is read with its scales."""
    import torch

    for case, (folder, choice, configs, factor) in WAN_CASES.items():
        spec = file_spec(files, **choice)
        reference = api.make_spec(folder, [str(files / "diffusers")])
        i2v = case in ("wan22-i2v-a14b", "wan21-i2v")
        assert (spec.class_name, spec.source.configs, spec.size_factor) == (
            "WanImageToVideoPipeline" if i2v else "WanPipeline", configs, factor), case
        assert (spec.class_name, spec.size_factor) == (reference.class_name, reference.size_factor), case
        assert spec.start_image == reference.start_image == (i2v or case == "wan22-5b"), case
        index = spec.model_index()
        assert (index.get("boundary_ratio"), index.get("expand_timesteps", False)) == {
            "wan21": (None, False), "wan22-a14b": (0.875, False), "wan22-5b": (None, True),
            "wan22-i2v-a14b": (0.9, False), "wan21-i2v": (None, False)}[case]
        assert spec.component_config("scheduler")["flow_shift"] == reference.component_config("scheduler")[
            "flow_shift"] == {"wan21": 3.0, "wan22-a14b": 12.0, "wan22-5b": 5.0, "wan22-i2v-a14b": 5.0,
                                                          "wan21-i2v": 3.0}[case]
        for name in ("transformer", "transformer_2", "vae", "text_encoder", "image_encoder"):
            mine, theirs = spec.component_config(name), reference.component_config(name)
            assert bool(mine) == bool(theirs) == {"transformer_2": "a14b" in case,
                                                  "image_encoder": case == "wan21-i2v"}.get(name, True), (case, name)
            assert not mine or WAN_SIZES & set(mine), (case, name)
            keys = WAN_SIZES & set(theirs) & set(mine)  # every size both state (the rest: the class defaults)
            assert {k: mine[k] for k in keys} == {k: theirs[k] for k in keys}, (case, name)
        if case == "wan21-i2v":
            processor = read_json(files / "diffusers" / folder / "image_processor" / "preprocessor_config.json")
            mine = spec.component_config("image_processor")
            assert {k: mine[k] for k in ("size", "crop_size", "image_mean", "image_std", "resample")} == {
                k: processor[k] for k in ("size", "crop_size", "image_mean", "image_std", "resample")}
        layouts_ = {c.name: c.layout for c in spec.source.components}
        assert layouts_["tokenizer"] == "spiece" and layouts_["vae"] == ("wan22-vae" if case == "wan22-5b"
                                                                          else "wan-vae")
    fp8 = file_spec(files, **dict(WAN21, diffusion_model="wan2.1_t2v-tiny_fp8_scaled.safetensors",
                                  text_encoders=("umt5_xxl-tiny_fp8_e4m3fn_scaled.safetensors",)))
    assert {c.name: c.quant for c in fp8.source.components if c.quant} == {"transformer": "scaled-fp8",
                                                                          "text_encoder": "scaled-fp8"}
    pipe, ref = _load(fp8), _reference(files, "ref-wan21")
    for name in ("transformer", "text_encoder"):
        mine, theirs = getattr(pipe, name).state_dict(), getattr(ref, name).state_dict()
        assert mine.keys() == theirs.keys(), name
        for key, value in theirs.items():  # within fp8's rounding (3 mantissa bits) of each layer's largest value
            assert torch.allclose(mine[key], value, rtol=0, atol=float(value.abs().max()) / 16), (name, key)


@pytest.mark.pipelines
def test_umt5_tokenizer_from_the_file_encodes_as_sentencepiece_does(files, tmp_path):
    """The tokenizer the worker makes of the `spiece_model` tensor gives SentencePiece's own ids (plus the end
    token T5 appends), normalization included (full-width letters, accents, repeated spaces)."""
    import sentencepiece
    from safetensors.torch import load_file
    from transformers import T5TokenizerFast

    from backend.families import config_dir
    from backend.worker import loading

    loading._spiece_tokenizer(files / "models" / "text_encoders" / UMT5, config_dir("wan21-t2v-1.3b") / "tokenizer",
                              tmp_path / "tokenizer")
    ours = T5TokenizerFast.from_pretrained(str(tmp_path / "tokenizer"))
    data = load_file(files / "models" / "text_encoders" / UMT5)["spiece_model"].numpy().tobytes()
    sp = sentencepiece.SentencePieceProcessor(model_proto=data)
    for text in (FOX, "a photo of a cat  riding   a horse", "ＡＢＣ café naïve 123", "zebra Quokka!", ""):
        assert ours(text).input_ids == sp.encode(text) + [1], text
    assert loading.protobuf_field(b"\x08\x96\x01\x1a\x03abc", 3) == b"abc" and loading.protobuf_field(b"", 3) is None


WAN_WRONG = {
    "second model for a one-model family": (dict(FLUX1, diffusion_model_2="flux1-tiny.safetensors"),
                                            ["diffusion_model_2: 'flux1-tiny.safetensors'", "Wan 2.2 A14B",
                                             "FLUX.1 has one", NONE]),
    "experts of different shapes": (dict(WAN["wan22-a14b"][1], diffusion_model_2="wan2.2_ti2v-tiny.safetensors"),
                                    ["diffusion_model_2: 'wan2.2_ti2v-tiny.safetensors'", "shapes",
                                     "low-noise file"]),
    "5B as a pair": (dict(WAN["wan22-5b"][1], diffusion_model_2="wan2.2_ti2v-tiny.safetensors"),
                     ["Wan 2.2 TI2V 5B, which is one file", NONE]),
    "Wan 2.1 I2V without its CLIP vision file": (dict(WAN21_I2V, clip_vision=None),
                                                 ["clip_vision: Wan 2.1 I2V ('wan2.1_i2v-tiny_fp16.safetensors') "
                                                  "also reads the start image", "clip_vision_h.safetensors"]),
    "a CLIP vision file for a model without one": (dict(WAN_I2V, clip_vision="clip_vision_h-tiny.safetensors"),
                                                   ["clip_vision: 'clip_vision_h-tiny.safetensors' was chosen",
                                                    "Wan 2.2 I2V A14B", "reads no CLIP vision encoder", NONE]),
    "one image-to-video expert alone": (dict(WAN_I2V, diffusion_model_2=None),
                                        ["diffusion_model_2: 'wan2.2_i2v_high_noise-tiny.safetensors' is one of the "
                                         "two experts of Wan 2.2 I2V A14B", "low-noise one in diffusion_model_2"]),
    "text- and image-to-video experts mixed": (dict(WAN_I2V, diffusion_model_2="wan2.2_t2v_low_noise-tiny.safetensors"),
                                               ["diffusion_model_2: 'wan2.2_t2v_low_noise-tiny.safetensors' does not "
                                                "have the shapes", "Wan 2.2 I2V A14B"]),
    "experts swapped": (dict(WAN["wan22-a14b"][1], diffusion_model="wan2.2_t2v_low_noise-tiny.safetensors",
                             diffusion_model_2="wan2.2_t2v_high_noise-tiny.safetensors"),
                        ["diffusion_model, diffusion_model_2: 'wan2.2_t2v_low_noise-tiny.safetensors' and "
                         "'wan2.2_t2v_high_noise-tiny.safetensors' are in each other's place", "Swap them"]),
    "one expert twice": (dict(WAN["wan22-a14b"][1], diffusion_model_2="wan2.2_t2v_high_noise-tiny.safetensors"),
                         ["diffusion_model_2: 'wan2.2_t2v_high_noise-tiny.safetensors' holds the same weights as "
                          "diffusion_model", "the high-noise one in diffusion_model"]),
    "Wan 2.1 VAE for the 5B": (dict(WAN["wan22-5b"][1], vae="wan_2.1_vae-tiny.safetensors"),
                               ["vae: 'wan_2.1_vae-tiny.safetensors'", "4 latent channels",
                                "needs wan2.2_vae.safetensors (48 channels)"]),
    "UMT5 without its tokenizer": (dict(WAN21, text_encoders=("umt5-no-tokenizer.safetensors",)),
                                   ["text_encoder_1: 'umt5-no-tokenizer.safetensors' carries no tokenizer",
                                    "spiece_model"]),
}


@pytest.mark.pipelines
@pytest.mark.parametrize("case", sorted(WAN_WRONG))
def test_wan_files_that_do_not_make_a_pipeline_are_named_with_the_fix(files, case):
    choice, words = WAN_WRONG[case]
    bare = files / "models" / "text_encoders" / "umt5-no-tokenizer.safetensors"
    if case == "UMT5 without its tokenizer":
        from safetensors.torch import load_file, save_file

        save_file({k: v for k, v in load_file(files / "models" / "text_encoders" / UMT5).items()
                   if k != "spiece_model"}, str(bare))
    try:
        assert_error(words, file_spec, files, **choice)
    finally:
        bare.unlink(missing_ok=True)


# ---- precisions (loaded in this process: the weights are what is checked)


def _load(spec, dtype_name: str = "float32"):
    import torch

    from backend.worker import loading

    return loading.load_files(spec.source, getattr(torch, dtype_name), lambda text: None)


def _reference(files: Path, folder: str, dtype_name: str = "float32"):
    import torch

    from backend.worker import loading

    return loading.load_pipeline(str(files / "diffusers" / folder), getattr(torch, dtype_name), lambda text: None)


@pytest.mark.pipelines
def test_fp8_files_load_upcast_to_the_compute_dtype(files):
    """Plain fp8 files (float8_e5m2 transformer, float8_e4m3fn T5) load as their fp8 values in bfloat16,
    exactly: the transformer through ComfyUI's key map, T5 through transformers."""
    import torch

    spec = file_spec(files, **dict(FLUX1, diffusion_model="flux1-tiny-fp8-e5m2.safetensors",
                                   text_encoders=("clip_l-tiny.safetensors", "t5xxl-tiny_fp8_e4m3fn.safetensors")))
    pipe, ref = _load(spec, "bfloat16"), _reference(files, "ref-flux1", "float32")
    for name, fp8 in (("transformer", torch.float8_e5m2), ("text_encoder_2", torch.float8_e4m3fn)):
        mine, theirs = getattr(pipe, name).state_dict(), getattr(ref, name).state_dict()
        assert mine.keys() == theirs.keys()
        for key, value in theirs.items():
            rounded = value.to(fp8) if value.ndim >= 2 else value
            assert mine[key].dtype == torch.bfloat16, key
            assert torch.equal(mine[key], rounded.to(torch.bfloat16)), key


@pytest.mark.pipelines
def test_comfyui_scaled_fp8_is_dequantized_with_its_scales(files):
    """ComfyUI's scaled fp8 (weights quantized by ComfyUI's own quantizer, per-layer scales): each weight is the
    fp8 value times its scale, i.e. the original within fp8's rounding (3 mantissa bits: relative error below
    1/16 of the layer's largest value); with the scales dropped, as a plain loader would, it is far off."""
    from safetensors.torch import load_file

    spec = file_spec(files, **dict(CASES["flux2-klein-split"][1], diffusion_model="flux2-klein-tiny-fp8scaled.safetensors"))
    assert spec.source.component("transformer").quant == "scaled-fp8"
    mine = _load(spec).transformer.state_dict()
    theirs = _reference(files, "ref-flux2").transformer.state_dict()
    raw = load_file(str(files / "models" / "diffusion_models" / "flux2-klein-tiny-fp8scaled.safetensors"))
    scaled = [k for k in raw if k.endswith(".scale_weight")]
    assert scaled and mine.keys() == theirs.keys()
    for key, value in theirs.items():
        error = float((mine[key] - value).abs().max() / value.abs().max())
        assert error < 1 / 16, (key, error)
    unscaled = raw[scaled[0].replace("scale_weight", "weight")].float()
    original = load_file(str(files / "models" / "diffusion_models" / "flux2-klein-tiny.safetensors"))
    reference = original[scaled[0].replace("scale_weight", "weight")]
    assert float((unscaled - reference).abs().max() / reference.abs().max()) > 0.5


@pytest.mark.pipelines
def test_zimage_bf16_fp8_and_scaled_fp8_files_load_as_their_rounding(files):
    """Z-Image's diffusion model as artists download it in bf16 and fp8 (ComfyUI's layout, through diffusers'
    converter): every weight is the reference's rounded to the file's precision (fp8: matrices only), exactly;
    ComfyUI's scaled fp8 is within fp8's rounding of the reference after its scales."""
    import torch

    choice = CASES["zimage-split"][1]
    theirs = _reference(files, "ref-zimage").transformer.state_dict()
    for name, rounded in (("z_image_turbo-tiny_bf16.safetensors", lambda v: v.to(torch.bfloat16)),
                          ("z_image_turbo-tiny_fp8_e4m3fn.safetensors",
                           lambda v: v.to(torch.float8_e4m3fn) if v.ndim >= 2 else v)):
        spec = file_spec(files, **dict(choice, diffusion_model=name))
        assert spec.source.component("transformer").layout == "zimage"
        mine = _load(spec, "bfloat16").transformer.state_dict()
        assert mine.keys() == theirs.keys()
        for key, value in theirs.items():
            assert torch.equal(mine[key], rounded(value).to(torch.bfloat16)), (name, key)
    spec = file_spec(files, **dict(choice, diffusion_model="z_image_turbo-tiny_fp8_scaled.safetensors"))
    assert spec.source.component("transformer").quant == "scaled-fp8"
    mine = _load(spec).transformer.state_dict()
    for key, value in theirs.items():
        error = float((mine[key] - value).abs().max() / value.abs().max().clamp(min=1e-12))
        assert error < 1 / 16, (key, error)


@pytest.mark.pipelines
def test_flux1_at_the_published_width_goes_through_diffusers_own_converter(files):
    """FLUX.1 files of the published width (3072) are read by diffusers' single-file converter, which
    hard-codes it: a 3072-wide transformer with 1 double and 1 single block (about 1 GB) loads exactly."""
    import torch

    spec = file_spec(files, **dict(FLUX1, diffusion_model=file_fixtures.FILES["flux1-3072"]["diffusion_model"]))
    assert spec.source.component("transformer").layout == "flux1", "3072 wide: diffusers' converter"
    config = spec.component_config("transformer")
    assert (config["num_attention_heads"], config["attention_head_dim"], config["axes_dims_rope"],
            config["guidance_embeds"]) == (24, 128, [16, 56, 56], True), "the published FLUX.1-dev values"
    loaded = _load(spec, "bfloat16").transformer.state_dict()
    original = file_fixtures.flux1_published_width().state_dict()
    assert loaded.keys() == original.keys()
    assert all(torch.equal(loaded[k], original[k]) for k in original)
    assert scheduler_is_dev(spec)


def scheduler_is_dev(spec) -> bool:
    return spec.component_config("scheduler")["use_dynamic_shifting"] is True


# ---- the same seed gives the same image from the files as from the diffusers folder (worker processes)


@pytest.mark.workers
@pytest.mark.parametrize("case", sorted(c for c in CASES if c not in VIDEO_CASES))
def test_same_seed_same_image_from_the_files_as_from_the_folder(files, case):
    folder, choice, guidance = CASES[case]
    req = request(guidance)
    from_folder = api.sample(api.make_spec(folder, [str(files / "diffusers")]), req)
    from_files = api.sample(file_spec(files, **choice), req)
    assert from_files.shape == (1, 64, 64, 3) and from_files.std() > 0
    assert np.array_equal(from_files, from_folder), float(np.abs(from_files - from_folder).max())


@pytest.mark.workers
def test_flux3_edit_and_its_int8_convrot_file_from_its_files_equal_the_folder_and_the_dequantized_file(files):
    """FLUX 3 [klein] editing from its files, as its image_edit template runs it (one reference image), gives the
    folder's pixels, step-distilled and base (through its guider); the base model's int8 ConvRot file draws the
    image of the same file dequantized by comfy-kitchen."""
    reference = np.linspace(0, 1, 64 * 80 * 3, dtype=np.float32).reshape(1, 64, 80, 3)
    for choice, folder, guidance in ((FLUX3, "ref-flux3", 1.0), (FLUX3_BASE, "ref-flux3-base", 4.0)):
        req = request(guidance)
        ours = api.sample(file_spec(files, **choice), req, image=reference)
        theirs = api.sample(api.make_spec(folder, [str(files / "diffusers")]), req, image=reference)
        assert ours.shape == (1, 64, 64, 3) and ours.std() > 0
        assert np.array_equal(ours, theirs), (folder, float(np.abs(ours - theirs).max()))
        assert np.abs(ours - api.sample(file_spec(files, **choice), req)).max() > 1e-3, "the reference counts"
    names = file_fixtures.FILES["flux3"]
    quant, deq = (api.sample(file_spec(files, **dict(FLUX3_BASE, diffusion_model=names[n])), request(4.0))
                  for n in ("int8_convrot", "int8_convrot_dequantized"))
    assert quant.std() > 0 and np.array_equal(quant, deq), float(np.abs(quant - deq).max())


def plain_wan(pipeline_class: type, folder: Path, steps: int, **inputs) -> tuple[np.ndarray, bool]:
    """Plain diffusers' frames for the Wan tests' request (FOX, 32x32, 5 frames, guidance 5, seed 3) from a
    reference folder, and whether the low-noise expert (transformer_2, where there is one) ran."""
    import torch

    pipe = pipeline_class.from_pretrained(str(folder), dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    low_noise_calls = []
    if pipe.transformer_2 is not None:
        pipe.transformer_2.register_forward_hook(lambda *_: low_noise_calls.append(1))
    with torch.inference_mode():
        frames = pipe(prompt=FOX, negative_prompt="blurry", height=32, width=32, num_frames=5,
                      num_inference_steps=steps, guidance_scale=5.0, output_type="np",
                      generator=[torch.Generator("cpu").manual_seed(3)], **inputs).frames[0]
    return frames, bool(low_noise_calls)


@pytest.mark.workers
def test_wan_frames_from_the_files_equal_plain_diffusers(files):
    """Wan 2.1, Wan 2.2 A14B (4 steps: the last is below the boundary, so the low-noise expert runs) and Wan 2.2
    TI2V 5B from ComfyUI's files through a worker: the frames of plain diffusers' WanPipeline from the reference
    folder, same inputs and seed, bit for bit."""
    from diffusers import WanPipeline

    for case, (folder, choice, _, _) in WAN.items():
        steps = 4 if case == "wan22-a14b" else 2
        req = SampleRequest(prompt=FOX, negative_prompt="blurry", width=32, height=32, frames=5, steps=steps,
                            guidance=5.0, seed=3)
        got = api.sample(file_spec(files, **choice), req)
        plain, low_noise_ran = plain_wan(WanPipeline, files / "diffusers" / folder, steps)
        assert got.shape == (5, 32, 32, 3) and got.std() > 0, case
        assert np.array_equal(got, plain), (case, float(np.abs(got - plain).max()))
        assert low_noise_ran == (case == "wan22-a14b"), case


@pytest.mark.workers
def test_wan_image_to_video_from_files_and_folders_equals_plain_diffusers(files):
    """Image to video: Wan 2.2 TI2V 5B from ComfyUI's file and from its diffusers folder (a WanPipeline: the start
    image runs on WanImageToVideoPipeline made from it with from_pipe, which expand_timesteps makes keep the
    image's latents as the first latent frame), Wan 2.2 I2V A14B's two experts from ComfyUI's files (4 steps: the
    last is below the boundary, so the low-noise expert runs), and Wan 2.1 I2V from its file with ComfyUI's
    clip_vision_h (its CLIP image encoder). Each equals plain diffusers' WanImageToVideoPipeline from the
    reference folder with that image and seed, bit for bit."""
    import PIL.Image
    from diffusers import WanImageToVideoPipeline

    start = (np.random.default_rng(7).integers(0, 256, (1, 32, 32, 3)) / 255).astype(np.float32)
    runs = {"wan22-5b file": (file_spec(files, **WAN["wan22-5b"][1]), "ref-wan22-5b", 2),
            "wan22-5b folder": (api.make_spec("ref-wan22-5b", [str(files / "diffusers")]), "ref-wan22-5b", 2),
            "wan22-i2v-a14b files": (file_spec(files, **WAN_I2V), "ref-wan22-i2v-a14b", 4),
            "wan21-i2v files": (file_spec(files, **WAN21_I2V), "ref-wan21-i2v", 2)}
    frames = {}
    for case, (spec, folder, steps) in runs.items():
        req = SampleRequest(prompt=FOX, negative_prompt="blurry", width=32, height=32, frames=5, steps=steps,
                            guidance=5.0, seed=3)
        got = frames[case] = api.sample(spec, req, image=start)
        plain, low_noise_ran = plain_wan(WanImageToVideoPipeline, files / "diffusers" / folder, steps,
                                         image=PIL.Image.fromarray((start[0] * 255).round().astype(np.uint8)))
        assert got.shape == (5, 32, 32, 3) and got.std() > 0, case
        assert np.array_equal(got, plain), (case, float(np.abs(got - plain).max()))
        assert low_noise_ran == (case == "wan22-i2v-a14b files"), case
    text_only = api.sample(runs["wan22-5b file"][0], SampleRequest(
        prompt=FOX, negative_prompt="blurry", width=32, height=32, frames=5, steps=2, guidance=5.0, seed=3))
    assert not np.array_equal(text_only, frames["wan22-5b file"]), "without a start image the 5B is text to video"


@pytest.mark.workers
def test_gguf_runs_on_the_cpu_through_diffusers(files):
    """A Q8_0 GGUF FLUX.2 transformer (city96's layout): diffusers dequantizes on the fly, so the image is
    the float one up to Q8_0's rounding."""
    folder, choice, guidance = CASES["flux2-klein-split"]
    gguf = api.sample(file_spec(files, **dict(choice, diffusion_model="flux2-klein-tiny-Q8_0.gguf")), request(guidance))
    plain = api.sample(file_spec(files, **choice), request(guidance))
    assert not np.array_equal(gguf, plain) and np.abs(gguf - plain).max() < 0.05


@pytest.mark.workers
def test_files_run_with_offload_compile_and_from_kept_folders(files, kept_folders, tiny_models, monkeypatch):
    root, hub = kept_folders
    reference = api.sample(file_spec(files, **FLUX1), request())
    offloaded = api.make_file_spec(assemble.FileChoice(**FLUX1), roots(files), offload="model")
    assert np.array_equal(api.sample(offloaded, request()), reference)
    compiled, _ = api.with_compile(file_spec(files, **FLUX1), "whole denoiser", "eager", "64x64")
    assert np.abs(api.sample(compiled, request()) - reference).max() <= 1e-5
    # a symlinked folder loads; a variant-only hub snapshot loads under its repo id
    linked = api.sample(api.make_spec("flux-on-big-disk", [str(root)]), request())
    assert np.array_equal(linked, api.sample(api.make_spec("tiny-flux", [str(tiny_models)]), request()))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert api.sample(api.make_spec("acme/tiny-sdxl", [str(root)]), request(5.0)).shape == (1, 64, 64, 3)


@pytest.mark.workers
def test_shard_tp_and_data_parallel_with_files(files):
    """Tolerance as in test_parallel.py: a sharded transformer sums in another order (<= 1e-4); data parallel
    is bit-identical. Qwen-Image's file is read per rank (its slices); FLUX.1's is read whole, then sharded."""
    refs = {case: api.sample(file_spec(files, **CASES[case][1]), request(CASES[case][2], batch_size=2))
            for case in ("flux1-split", "qwenimage-split")}
    for case, reference in refs.items():
        sharded, text = api.shard(file_spec(files, **CASES[case][1]), 2)
        assert "sharded over 2 chips" in text
        assert np.abs(api.sample(sharded, request(CASES[case][2], batch_size=2)) - reference).max() <= 1e-4, case
    replicated, _ = api.replicate(file_spec(files, **FLUX1), 2)
    assert np.array_equal(api.sample(replicated, request(batch_size=2)), refs["flux1-split"])



@pytest.mark.workers
def test_loras_and_image_inputs_on_files_as_on_the_folder(files, tmp_path):
    """Load LoRA and Sample's image input on a pipeline made of files: the same pixels as on its folder."""
    lora_file = str(make(files / "diffusers", "ref-flux1", "diffusers", tmp_path, seed=7)[0])
    picture = np.linspace(0, 1, 64 * 64 * 3, dtype=np.float32).reshape(1, 64, 64, 3)
    folder, from_files = api.make_spec("ref-flux1", [str(files / "diffusers")]), file_spec(files, **FLUX1)
    want = api.sample(api.with_lora(folder, lora_file, 0.8)[0], request(denoise=0.6), image=picture)
    got = api.sample(api.with_lora(from_files, lora_file, 0.8)[0], request(denoise=0.6), image=picture)
    assert np.array_equal(got, want), float(np.abs(got - want).max())
    assert not np.array_equal(got, api.sample(from_files, request(denoise=0.6), image=picture))

@pytest.mark.workers
def test_qwen_image_edit_2511_files_give_diffusers_edit_plus_pixels_from_several_images(files):
    """Edit-2511 from ComfyUI's file (its marker: zero_cond_t): Sample's image batch is the reference images,
    and the pixels are those of diffusers' QwenImageEditPlusPipeline from the same weights on the same images and
    seed. (One release only: Edit Plus VAE-encodes each reference at about 1024x1024, whatever its size, which
    costs seconds even on the tiny VAE; 2509 loads the same way without the flag, as the unit test above shows.)"""
    import PIL.Image
    import torch
    from diffusers import QwenImageEditPlusPipeline

    req = request(2.0)
    refs = np.stack([np.linspace(0, 1, 64 * 64 * 3, dtype=np.float32).reshape(64, 64, 3),
                     np.linspace(1, 0, 64 * 64 * 3, dtype=np.float32).reshape(64, 64, 3)])
    ours = api.sample(file_spec(files, **dict(QWEN, diffusion_model="qwen_image_edit_2511-tiny_bf16.safetensors")), req,
                      image=refs)
    plain = QwenImageEditPlusPipeline.from_pretrained(str(files / "diffusers" / "ref-qwenimage-edit-2511"),
                                                      local_files_only=True)
    with torch.inference_mode():
        want = plain(image=[PIL.Image.fromarray((r * 255).round().astype(np.uint8)) for r in refs],
                     prompt=req.prompt, negative_prompt=req.negative_prompt, true_cfg_scale=req.guidance, height=64,
                     width=64, num_inference_steps=req.steps, output_type="np",
                     generator=[torch.Generator("cpu").manual_seed(req.seed)]).images
    assert np.array_equal(ours, want), float(np.abs(ours - want).max())


@pytest.mark.workers
def test_qwen_image_21_edit_from_its_files_equals_the_folder_with_the_same_references(files):
    """Qwen-Image 2.1 editing from ComfyUI's files, as its image_edit template runs it (two references, cfg 1):
    the processor laid out from ComfyUI's vocabulary and the pack's Qwen3-VL settings reads the references as the
    folder's does, and the RGBA VAE encodes them: the same pixels as the diffusers folder."""
    req = request(1.0)
    refs = np.stack([np.linspace(0, 1, 64 * 64 * 3, dtype=np.float32).reshape(64, 64, 3),
                     np.linspace(1, 0, 64 * 64 * 3, dtype=np.float32).reshape(64, 64, 3)])
    ours = api.sample(file_spec(files, **QWEN21), req, image=refs)
    theirs = api.sample(api.make_spec("ref-qwenimage21", [str(files / "diffusers")]), req, image=refs)
    assert ours.shape == (1, 64, 64, 3) and ours.std() > 0
    assert np.array_equal(ours, theirs), float(np.abs(ours - theirs).max())


# ---- through a real ComfyUI server (the files come from extra_model_paths.yaml roots and its own folders)


@pytest.fixture(scope="module")
def files_server(files, comfyui_dir, tmp_path_factory):
    from comfy_server import ComfyServer

    models = files / "models"
    extra = {folder: str(models / folder) for folder in listing.ROLE_FOLDERS.values()}
    srv = ComfyServer(str(comfyui_dir), str(files / "diffusers"), work_dir=str(tmp_path_factory.mktemp("files")),
                      extra_paths=extra)
    srv.start()
    yield srv
    srv.stop()


def files_prompt(seed: int, **files) -> dict:
    inputs = {"diffusion_model": NONE, "text_encoder_1": NONE, "text_encoder_2": NONE, "text_encoder_3": NONE,
              "vae": NONE, "checkpoint": NONE, "dtype": "auto", "device": "auto", "offload": "none", **files}
    return {"1": {"class_type": "LoadTPUPipelineFiles", "inputs": inputs},
            "2": {"class_type": "TPUSample", "inputs": {"pipeline": ["1", 0], "prompt": FOX, "negative_prompt": "",
                                                       "width": 64, "height": 64, "steps": 2, "guidance": 0.0,
                                                       "seed": seed, "batch_size": 1}},
            "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "files"}}}


FLUX1_NODE = {"diffusion_model": "flux1-tiny.safetensors", "text_encoder_1": "clip_l-tiny.safetensors",
              "text_encoder_2": "t5xxl-tiny.safetensors", "vae": "ae-tiny.safetensors"}


@pytest.mark.server
def test_the_files_node_makes_flux3_klein_base_from_its_templates_files_with_the_folders_image(files_server):
    """Load TPU Pipeline (ComfyUI files) with FLUX 3 [klein] base's files (as its templates name them) runs its
    modular pipeline in the web server's worker: the saved image is the diffusers folder's, CFG through its guider."""
    from comfy_server import error_message

    node = {"diffusion_model": FLUX3_BASE["diffusion_model"], "text_encoder_1": FLUX3_BASE["text_encoders"][0],
            "vae": FLUX3_BASE["vae"]}
    runs = []
    for loader in ({"class_type": "LoadTPUPipelineFiles", "inputs": files_prompt(0, **node)["1"]["inputs"]},
                   {"class_type": "LoadTPUPipeline", "inputs": {"model": "ref-flux3-base", "dtype": "auto",
                                                                "device": "auto", "offload": "none"}}):
        wf = files_prompt(78)
        wf["1"], wf["2"]["inputs"]["guidance"] = loader, 4.0
        runs.append(files_server.run(wf, timeout=180))
        assert runs[-1]["status"] == "success", error_message(runs[-1])
    texts = [m["data"]["text"] for m in runs[0]["messages"] if m["type"] == "progress_text"]
    assert any(t.startswith("FLUX 3 [klein] base (Flux3ModularPipeline)") for t in texts), texts
    assert np.array_equal(pixels(runs[0]["images"][0]), pixels(runs[1]["images"][0]))


@pytest.mark.server
def test_the_files_node_lists_by_role_and_makes_the_folders_image(files_server):
    from comfy_server import error_message

    info = files_server.get("/object_info/LoadTPUPipelineFiles").json()["LoadTPUPipelineFiles"]
    required = info["input"]["required"]
    assert "flux1-tiny.safetensors" in required["diffusion_model"][0]
    assert "ae-tiny.safetensors" in required["vae"][0] and "ae-tiny.safetensors" not in required["text_encoder_1"][0]
    assert required["checkpoint"][0][0] == NONE and "sdxl-tiny.safetensors" in required["checkpoint"][0]
    from_files = files_server.run(files_prompt(77, **FLUX1_NODE), timeout=180)
    assert from_files["status"] == "success", error_message(from_files)
    texts = [m["data"]["text"] for m in from_files["messages"] if m["type"] == "progress_text"]
    assert any(t.startswith("FLUX.1 (FluxPipeline)") and "t5xxl-tiny.safetensors" in t for t in texts), texts
    folder = files_prompt(77)
    folder["1"] = {"class_type": "LoadTPUPipeline", "inputs": {"model": "ref-flux1", "dtype": "auto",
                                                              "device": "auto", "offload": "none"}}
    from_folder = files_server.run(folder, timeout=180)
    assert from_folder["status"] == "success", error_message(from_folder)
    assert np.array_equal(pixels(from_files["images"][0]), pixels(from_folder["images"][0]))



@pytest.mark.server
def test_the_files_node_makes_ideogram4s_image_from_its_two_transformer_files(files_server):
    """Ideogram 4 as its template loads it, through a real ComfyUI: the conditional file in diffusion_model, the
    unconditional one in the node's diffusion_model_2, Qwen3-VL-8B and FLUX.2's VAE; the same pixels as its
    diffusers folder with both transformers running (guidance 3)."""
    from comfy_server import error_message

    node = {"diffusion_model": IDEOGRAM4["diffusion_model"], "diffusion_model_2": IDEOGRAM4["diffusion_model_2"],
            "text_encoder_1": IDEOGRAM4["text_encoders"][0], "vae": IDEOGRAM4["vae"]}
    prompts = [files_prompt(78, **node), files_prompt(78)]
    prompts[1]["1"] = {"class_type": "LoadTPUPipeline", "inputs": {"model": "ref-ideogram4", "dtype": "auto",
                                                                   "device": "auto", "offload": "none"}}
    for prompt in prompts:
        prompt["2"]["inputs"]["guidance"] = 3.0
    from_files, from_folder = (files_server.run(prompt, timeout=300) for prompt in prompts)
    assert from_files["status"] == "success", error_message(from_files)
    assert from_folder["status"] == "success", error_message(from_folder)
    texts = [m["data"]["text"] for m in from_files["messages"] if m["type"] == "progress_text"]
    assert any(t.startswith("Ideogram 4 (Ideogram4Pipeline)") and IDEOGRAM4["diffusion_model_2"] in t
               for t in texts), texts
    assert np.array_equal(pixels(from_files["images"][0]), pixels(from_folder["images"][0]))


@pytest.mark.server
def test_object_info_answers_beside_a_huge_header_and_a_symlink_loop(files_server):
    """ComfyUI's `GET /object_info` (every node's lists) answers within the client's 30 s with a `loop -> .`
    link and a file whose header is too large in ComfyUI's own diffusion_models folder (before, with ComfyUI
    reading that folder 41 times through the loop, it did not answer in 120 s), and lists the other files."""
    own = files_server.work_dir / "models" / "diffusion_models"
    own.mkdir(parents=True, exist_ok=True)
    huge, loop = _huge_header(own / "huge-header.safetensors"), own / "loop"
    loop.symlink_to(".")
    try:
        for _ in range(2):  # the second answer comes from the per-file cache
            required = files_server.get("/object_info").json()["LoadTPUPipelineFiles"]["input"]["required"]
            listed = required["diffusion_model"][0]
            assert "huge-header.safetensors" in listed and "flux1-tiny.safetensors" in listed
            assert not [name for name in listed if name.startswith("loop/")]
            assert "ae-tiny.safetensors" in required["vae"][0]
    finally:
        loop.unlink()
        huge.unlink()


BAD_FILES = {  # what the node is given -> words the error must hold
    "missing text encoder": ({**FLUX1_NODE, "text_encoder_2": NONE},
                             ["text_encoder", "T5-XXL", "is missing", "models/text_encoders"]),
    "file of another family": ({**FLUX1_NODE, "vae": "sd3-vae-tiny.safetensors", "text_encoder_2":
                                "qwen_3-tiny.safetensors"}, ["'qwen_3-tiny.safetensors'", "does not use", "FLUX.1"]),
    "pickle checkpoint": ({**FLUX1_NODE, "diffusion_model": "flux1-dev.ckpt"},
                          ["'flux1-dev.ckpt' is a pickle file", ".safetensors"]),
    "truncated file": ({**FLUX1_NODE, "diffusion_model": "flux1-dev-truncated.safetensors"},
                       ["'flux1-dev-truncated.safetensors' is truncated", "download it again"]),
}


@pytest.mark.server
@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_files_are_named_through_the_server_and_it_stays_up(files_server, files, case):
    from comfy_server import error_message

    own = files_server.work_dir / "models" / "diffusion_models"  # ComfyUI's own folder, beside the extra roots
    own.mkdir(parents=True, exist_ok=True)
    (own / "flux1-dev.ckpt").write_bytes(b"\x80\x02}q\x00.")
    good = (files / "models" / "diffusion_models" / "flux1-tiny.safetensors").read_bytes()
    (own / "flux1-dev-truncated.safetensors").write_bytes(good[: len(good) - 1000])
    inputs, words = BAD_FILES[case]
    result = files_server.run(files_prompt(5, **inputs), timeout=60)  # checked as the loader runs: one message
    errors = [m["data"] for m in result["messages"] if m["type"] == "execution_error"]
    assert result["status"] == "error" and [e["node_id"] for e in errors] == ["1"], errors
    message = error_message(result)
    assert all(w in message for w in words), message
    assert files_server.proc.poll() is None
    result = files_server.run(files_prompt(6, **FLUX1_NODE), timeout=120)
    assert result["status"] == "success", error_message(result)
