"""Sample's positive/negative CONDITIONING (backend/controller/conditioning.py): ComfyUI's encodings in place of the
prompt text.

What is proved, and under which conditions:
- ComfyUI's own encoder code (comfy.sd.load_clip as DualCLIPLoader calls it, its tokenizers, FluxClipModel, CLIP Text
  Encode) gives FLUX.1 embeddings equal to the pack's text path (diffusers' encode_prompt) for the same tokens, within
  1e-5, and Sample's pixels with ComfyUI's conditioning equal Sample's pixels with the pack's embeddings within 1e-4.
  Conditions: the tiny encoders load through load_clip only with ComfyUI's own config overrides (model_options) set
  to their sizes, in float32 (as --fp32-text-enc; ComfyUI's default float16 weights differ by about 1e-3) (ComfyUI's loaders build the published sizes from fixed configs, so CLIPLoader/DualCLIPLoader
  refuse them, which the test also checks), and the comparison is at ComfyUI's T5 length (256 tokens): the pack's
  text path gives 512 (no T5 mask: the padding changes every token), and Sample zero-pads ComfyUI's 256 to 512.
  SD3's and SDXL's ComfyUI encoders cannot run at tiny sizes (tests/comfy_conditioning.py says why): for them the
  layout (diffusers' own, read in ComfyUI's code: families/sd3.py, sdxl.py) is held by the worker test below.
- Through the workers, Sample with the pipeline's own embeddings as CONDITIONING gives exactly the pixels of Sample
  with the prompt text (FLUX.1 under Shard TP, SD3 with a negative under CFG Parallel, SDXL with a negative under
  Data Parallel),
  and in compiled mode conditionings of different lengths share one graph.
- What cannot be mapped is refused before anything runs, naming the input and the fix. Qwen-Image 2.1, Krea 2,
  Ideogram 4 and FLUX 3 [klein] are encoded in ComfyUI's templates by Qwen3-VL encoders (CLIPLoader types krea2,
  ideogram4, flux3; TextEncodeQwenImage21) that the installed ComfyUI (0.3.75) does not have (read from the real
  server's /object_info): the refusal says so, naming the families whose CONDITIONING maps.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from backend.controller import api
from backend.protocol.errors import InputError
from backend.protocol.spec import SampleRequest

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "a red fox in the snow"


def _request(**kw) -> SampleRequest:
    base = dict(prompt="", width=64, height=64, steps=2, guidance=3.5, seed=5, batch_size=1)
    return SampleRequest(**{**base, **kw})


def _cond(tokens: int, width: int, pooled: int, **extras) -> list:
    rng = np.random.default_rng(tokens)
    return [[rng.standard_normal((1, tokens, width), dtype=np.float32),
             {"pooled_output": rng.standard_normal((1, pooled), dtype=np.float32), **extras}]]


def _refused(spec, req, positive, negative=None) -> str:
    with pytest.raises(InputError) as e:
        api.describe_inputs(spec, req, positive=positive, negative=negative)
    return str(e.value)


def _encoded(pipe, name: str, negative: bool) -> tuple[list, list | None]:
    """The pipeline's own embeddings for PROMPT (and no negative prompt, as Sample's text path encodes it) as
    ComfyUI's CONDITIONING."""
    with torch.no_grad():
        if name == "tiny-flux":
            embeds, pooled, _ = pipe.encode_prompt(PROMPT, None, max_sequence_length=512)
            return [[embeds.numpy(), {"pooled_output": pooled.numpy()}]], None
        args = (PROMPT, None, None) if name == "tiny-sd3" else (PROMPT,)
        pe, ne, pp, npp = pipe.encode_prompt(*args, negative_prompt=None, do_classifier_free_guidance=negative)
    return ([[pe.numpy(), {"pooled_output": pp.numpy()}]],
            [[ne.numpy(), {"pooled_output": npp.numpy()}]] if negative else None)


@pytest.mark.unit
def test_what_cannot_be_mapped_is_refused_naming_the_input_and_the_fix(tiny_models):
    flux = api.make_spec("tiny-flux", [str(tiny_models)])
    sd3 = api.make_spec("tiny-sd3", [str(tiny_models)])
    good = _cond(256, 32, 32)
    two = [*good, *_cond(256, 32, 32)]
    assert "ConditioningCombine" in _refused(flux, _request(), two)
    assert "Conditioning (Set Area)" in _refused(flux, _request(), _cond(256, 32, 32, area=(8, 8, 0, 0)))
    assert "ConditioningSetTimestepRange" in _refused(flux, _request(), _cond(256, 32, 32, start_percent=0.2))
    # SDXL's published widths into FLUX: named as SDXL's, with the encoders FLUX needs
    text = _refused(flux, _request(), _cond(77, 2048, 1280))
    assert "positive" in text and "SDXL's text encoders" in text and "T5-XXL" in text, text
    text = _refused(sd3, _request(guidance=5.0), _cond(154, 32, 32))
    assert "negative" in text and "ConditioningZeroOut" in text, text
    assert "positive" in _refused(flux, _request(), None, good)
    assert "prompt_per_line" in _refused(flux, _request(prompt_per_line=True), good)
    assert "at most 512" in _refused(flux, _request(), _cond(600, 32, 32))
    nan = _cond(256, 32, 32)
    nan[0][0][0, 0, 0] = np.nan
    assert "not numbers" in _refused(flux, _request(), nan)
    batch = [[np.zeros((2, 256, 32), np.float32), {"pooled_output": np.zeros((2, 32), np.float32)}]]
    assert "batch of 2" in _refused(flux, _request(), batch)
    assert "pooled" in _refused(flux, _request(), [[good[0][0], {}]])
    for other in ("tiny-qwenimage", "tiny-zimage", "tiny-flux2"):
        text = _refused(api.make_spec(other, [str(tiny_models)]), _request(), good)
        assert "FLUX.1, SD3 and SDXL" in text and "takes no CONDITIONING" in text, text
    # what is taken: FluxGuidance's guidance replaces the widget; padded to the text path's length; the text unused
    prepared = api.prepare_sample(flux, _request(prompt="(ignored:1.2)"), positive=_cond(256, 32, 32, guidance=2.0,
                                                                                          strength=1.0))
    assert prepared.req.guidance == 2.0 and prepared.arrays["prompt_embeds"].shape == (1, 512, 32)
    assert any("FluxGuidance" in n for n in prepared.notes) and any("not used" in n for n in prepared.notes)
    assert not any("prompt-weight" in n for n in prepared.notes)  # the text is not read at all
    sdxl = api.prepare_sample(api.make_spec("tiny-sdxl", [str(tiny_models)]), _request(guidance=5.0),
                              positive=_cond(154, 48, 32), negative=_cond(77, 48, 32))
    assert sdxl.arrays["prompt_embeds"].shape == sdxl.arrays["negative_prompt_embeds"].shape == (1, 154, 48)


@pytest.mark.workers
def test_comfyuis_own_flux_encoding_equals_the_pack_text_path_and_samples(comfyui_files, comfyui_dir, tmp_path):
    from diffusers import FluxPipeline
    from file_fixtures import FILES
    from safetensors.torch import save_file
    from transformers import T5Config, T5EncoderModel

    files = comfyui_files("flux1")
    pipe = FluxPipeline.from_pretrained(str(files / "diffusers" / "ref-flux1"), local_files_only=True)
    config = T5Config(**{**pipe.text_encoder_2.config.to_dict(), "relative_attention_num_buckets": 32})
    torch.manual_seed(0)
    pipe.text_encoder_2 = T5EncoderModel(config).eval()  # ComfyUI's T5 has 32 buckets built in
    folder = tmp_path / "flux-t5-32"
    pipe.save_pretrained(str(folder), safe_serialization=True)
    t5_file = tmp_path / "t5xxl-32.safetensors"
    save_file({k: v.detach().clone() for k, v in pipe.text_encoder_2.state_dict().items()}, str(t5_file))
    out = tmp_path / "conditionings.pkl"
    subprocess.run([sys.executable, str(ROOT / "tests" / "comfy_conditioning.py"), str(comfyui_dir),
                    str(files / "models" / "text_encoders" / FILES["flux1"]["clip_l"]), str(t5_file), str(out),
                    PROMPT], check=True, timeout=300, capture_output=True)
    with open(out, "rb") as f:
        conds = pickle.load(f)
    assert "size mismatch" in conds["_refused"]  # DualCLIPLoader's load as such refuses tiny encoders

    with torch.no_grad():
        embeds, pooled, _ = pipe.encode_prompt(PROMPT, None, max_sequence_length=256)  # ComfyUI's T5 length
    (comfy_embeds, extras), = conds["plain"]
    assert comfy_embeds.shape == tuple(embeds.shape) and extras["pooled_output"].shape == tuple(pooled.shape)
    assert np.abs(comfy_embeds - embeds.numpy()).max() < 1e-5
    assert np.abs(extras["pooled_output"] - pooled.numpy()).max() < 1e-5

    spec = api.make_spec(folder.name, [str(tmp_path)])
    ours = [[embeds.numpy(), {"pooled_output": pooled.numpy()}]]
    reference = api.sample(spec, _request(), positive=ours)
    assert np.abs(api.sample(spec, _request(), positive=conds["plain"]) - reference).max() < 1e-4
    # weights, FluxGuidance, ConditioningConcat and ConditioningAverage: taken and sampled; the others refused
    assert np.abs(conds["weighted"][0][0] - comfy_embeds).max() > 1e-2  # (text:1.3) weighed by ComfyUI
    for name in ("weighted", "concat"):  # ConditioningConcat: 512 tokens, the text path's length
        assert api.sample(spec, _request(), positive=conds[name]).shape == reference.shape
    assert api.prepare_sample(spec, _request(), positive=conds["guidance"]).req.guidance == 2.5
    assert api.prepare_sample(spec, _request(), positive=conds["average"]).arrays["prompt_embeds"].shape == (1, 512, 32)
    for name, says in (("combine", "ConditioningCombine"), ("timestep_range", "ConditioningSetTimestepRange"),
                       ("area", "Set Area")):
        assert says in _refused(spec, _request(), conds[name]), name


@pytest.mark.workers
def test_conditionings_of_any_length_share_one_compiled_graph(tiny_models):
    spec = api.make_spec("tiny-flux", [str(tiny_models)])
    spec, _ = api.with_compile(spec, "whole denoiser", "eager", "")
    for tokens in (256, 300, 512):  # ComfyUI's shortest FLUX encoding, a longer prompt, ConditioningConcat's
        api.sample(spec, _request(), positive=_cond(tokens, 32, 32))
    stats = api.compile_stats()
    assert stats["compiles"] == 1 and stats["hits"] == 2 and stats["unexpected_recompiles"] == 0, stats


@pytest.mark.workers
def test_the_pipelines_own_embeddings_give_the_text_paths_pixels_across_layouts(tiny_models):
    """Bit for bit: the embeddings travel unchanged (float32 on the CPU) and enter the pipeline where its own text
    path puts them. SD3 and SDXL with a negative (CFG on a doubled batch); FLUX.1 under Shard TP, SD3 under CFG
    Parallel, SDXL under Data Parallel (one group of two workers for all)."""
    from diffusers import DiffusionPipeline

    for name, guidance, layout in (("tiny-flux", 3.5, "tp"), ("tiny-sd3", 5.0, "cfg"), ("tiny-sdxl", 5.0, "dp")):
        spec = api.make_spec(name, [str(tiny_models)])
        if layout == "tp":
            spec, _ = api.shard(spec, 2)
        elif layout == "dp":
            spec, _ = api.replicate(spec, 2)
        elif layout == "cfg":
            spec, _ = api.cfg_parallel(spec)
        pipe = DiffusionPipeline.from_pretrained(str(tiny_models / name), local_files_only=True)
        positive, negative = _encoded(pipe, name, negative=name != "tiny-flux")
        req = _request(guidance=guidance, batch_size=2 if layout == "dp" else 1)
        text = api.sample(spec, _request(prompt=PROMPT, guidance=guidance, batch_size=req.batch_size))
        conditioned = api.sample(spec, req, positive=positive, negative=negative)
        assert conditioned.shape == text.shape
        assert np.array_equal(conditioned, text), (name, np.abs(conditioned - text).max())


# the 2026 image families: ComfyUI's templates encode them with Qwen3-VL encoders, which ComfyUI 0.3.75 lacks
QWEN3VL = [f"tiny-{f.tiny[0]}" for f in __import__("backend.families", fromlist=["FAMILIES"]).FAMILIES.values()
           if f.tiny and any(p.comfy_encoder for p in f.pipelines)]


def _comfy_nodes(object_info: dict):
    """A stand-in for ComfyUI's `nodes` module from a real server's /object_info: its node names, and CLIPLoader's
    inputs as INPUT_TYPES gives them."""
    import types

    def node(info: dict) -> type:
        inputs = {section: {k: tuple(v) for k, v in info["input"].get(section, {}).items()}
                  for section in ("required", "optional")}
        return type("Node", (), {"INPUT_TYPES": classmethod(lambda cls: inputs)})

    return types.SimpleNamespace(NODE_CLASS_MAPPINGS={name: node(info) for name, info in object_info.items()})


@pytest.mark.unit
@pytest.mark.parametrize("name", QWEN3VL)
def test_a_conditioning_for_the_qwen3_vl_families_is_refused_naming_their_encoder_and_the_families_that_take_one(
        tiny_models, name, monkeypatch):
    """Outside ComfyUI the pack cannot tell whether ComfyUI has the encoder: the templates' encoder is named, and
    the families whose CONDITIONING maps (from the registry)."""
    from backend import families

    monkeypatch.delitem(sys.modules, "nodes", raising=False)
    spec = api.make_spec(name, [str(tiny_models)])
    clip_type, node = spec.family.comfy_encoder
    text = _refused(spec, _request(), _cond(16, 32, 32))
    assert text.startswith(f"positive: {spec.family.name} ('{name}') takes no CONDITIONING")
    assert f"CLIPLoader type '{clip_type}' and {node}" in text and "not mapped" in text
    assert f"CONDITIONING works with {families.conditioned_names()}" in text and "Sample's prompt" in text


@pytest.mark.server
def test_the_installed_comfyui_has_no_encoder_for_them_and_the_refusal_says_so(server, tiny_models, monkeypatch):
    """The real ComfyUI (0.3.75) lists neither CLIPLoader's types for these families nor TextEncodeQwenImage21:
    their CONDITIONING cannot be made there, and the refusal says that (not "not mapped yet"). When a ComfyUI with
    them is installed, this fails: map their encodings then (Pipeline.embeddings)."""
    info = server.get("/object_info").json()
    monkeypatch.setitem(sys.modules, "nodes", _comfy_nodes(info))
    clip_types = info["CLIPLoader"]["input"]["required"]["type"][0]
    for name in QWEN3VL:
        spec = api.make_spec(name, [str(tiny_models)])
        clip_type, node = spec.family.comfy_encoder
        assert not (clip_type in clip_types and node in info), (name, clip_type, node)
        text = _refused(spec, _request(), _cond(16, 32, 32))
        assert "this ComfyUI has no text encoder for it" in text and "a later ComfyUI brings" in text, text
