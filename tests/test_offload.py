"""offload 'auto': the controller picks none / model / sequential from the weights' size and one device's
memory, says why, and the worker only ever sees the choice."""

from __future__ import annotations

import json

import pytest

from backend.controller import api, capacity, components, layouts, models, offload
from backend.protocol.errors import CompileError, ParallelError

pytestmark = pytest.mark.unit
GIB = 2**30


def _spec(tiny_models, name="tiny-flux", **kw):
    return api.make_spec(name, [str(tiny_models)], **kw)


def _data_bytes(path) -> int:
    """Bytes of tensor data in one safetensors file: its size less the 8-byte length and the header."""
    with open(path, "rb") as f:
        header = int.from_bytes(f.read(8), "little")
    return path.stat().st_size - 8 - header


def test_weight_sizes_come_from_the_safetensors_headers(tiny_models):
    folder = tiny_models / "tiny-flux"
    index = json.loads((folder / "model_index.json").read_text())
    spec = _spec(tiny_models)
    f32 = models.weight_bytes(spec, 4)
    assert list(f32) == [n for n in index if n in ("transformer", "text_encoder", "text_encoder_2", "vae")]
    for name, size in f32.items():  # the tiny models are saved in float32
        assert size == sum(_data_bytes(p) for p in (folder / name).glob("*.safetensors")), name
    bf16 = models.weight_bytes(spec, 2)
    assert all(bf16[n] < f32[n] for n in f32) and sum(bf16.values()) * 2 >= sum(f32.values())


def test_on_the_cpu_auto_is_none_and_the_worker_gets_the_choice(tiny_models):
    spec = _spec(tiny_models, offload="auto")
    assert spec.offload == "auto"
    ready = api.checked(spec)
    assert ready.offload == "none"
    assert ready.load_key() == ready.with_changes(offload="none").load_key() != ready.with_changes(offload="model").load_key()
    text = api.describe_pipeline(spec)
    assert "tiny-flux (FLUX.1) on the CPU" in text and "offload auto → none: on the CPU" in text


# FLUX.1-dev/schnell in bfloat16, from the published parameter counts (2 bytes each): 11.9 B transformer,
# 4.76 B T5-XXL encoder, 123 M CLIP-L, 84 M VAE. Its transformer has 24 attention heads.
FLUX1_BF16 = {"text_encoder": 246_144_352, "text_encoder_2": 9_524_621_312, "transformer": 23_802_943_488,
              "vae": 167_666_902}
HOSTS = {"v5e": (16 * GIB, (1, 4, 8)), "v6e": (32 * GIB, (1, 4, 8)), "v7x": (96 * GIB, (2, 4, 8))}


@pytest.fixture
def flux1_on(monkeypatch, tiny_models):
    """tiny-flux dressed as FLUX.1 (its weight sizes and heads) on an 8-device TPU host of a generation."""

    def on(gen: str):
        memory, sizes = HOSTS[gen]
        monkeypatch.setattr(offload.devices, "device_memory_bytes", lambda kind: memory)
        monkeypatch.setattr(capacity, "host_capacity", lambda kind: capacity.Capacity("tpu", 8, sizes, f"8 {gen} chips", True))
        monkeypatch.setattr(offload.models, "weight_bytes", lambda path, float_bytes: dict(FLUX1_BF16))
        monkeypatch.setattr(components, "transformer_heads", lambda path: 24)
        return _spec(tiny_models, offload="auto").with_changes(kind="tpu")

    return on


def test_flux1_gets_sequential_with_a_shard_tp_hint_on_v5e_model_on_v6e_none_on_v7x(flux1_on):
    v5e = offload.choose_offload(flux1_on("v5e"))
    assert v5e.mode == "sequential", v5e
    assert "the weights take 31.4 GiB in bfloat16" in v5e.reason and "even transformer (22.2 GiB)" in v5e.reason
    assert "Shard TP degree 8 would fit (about 12.0 GiB per device)" in v5e.reason, v5e
    v6e = offload.choose_offload(flux1_on("v6e"))
    assert v6e.mode == "model" and "more than 25.6 GiB of the 32.0 GiB per device" in v6e.reason, v6e
    assert "the largest part (transformer, 22.2 GiB) fits" in v6e.reason
    v7x = offload.choose_offload(flux1_on("v7x"))
    assert v7x.mode == "none" and "within 76.8 GiB of the 96.0 GiB per device" in v7x.reason, v7x


def test_sequential_cannot_be_compiled_and_auto_says_why(flux1_on):
    spec = flux1_on("v5e").with_changes(mode="compiled")
    with pytest.raises(CompileError, match=r"offload: 'auto' has to choose 'sequential' here \(the weights take "
                                           r"31\.4 GiB.*cannot be compiled\. Use Shard TP, or an eager mode"):
        offload.resolve_offload(spec)


def test_under_shard_tp_auto_is_none_and_says_the_weights_per_device(flux1_on):
    spec = flux1_on("v5e")
    tp, text = layouts.plan_tp(spec, 8)
    assert tp.offload == "auto" and "offload auto → none (a sharded model cannot be offloaded): about 12.0 GiB" in text
    assert offload.resolve_offload(tp).offload == "none"
    _, four = layouts.plan_tp(spec, 4)
    assert "more than 12.8 GiB of the 16.0 GiB per device" in four and "use a larger Shard TP degree" in four
    with pytest.raises(ParallelError, match=r"offload: 'model' cannot be combined with Shard TP"):
        layouts.plan_tp(spec.with_changes(offload="model"), 2)


def test_a_sample_is_resolved_once_and_its_headers_read_once(flux1_on, monkeypatch):
    """What the Sample node does (prepare_sample for its notes, then run_sample) resolves the description once:
    offload auto reads the weights' headers once, and the input image is copied once."""
    import numpy as np

    from backend.controller import group, images, resolve
    from backend.protocol.messages import Result
    from backend.protocol.spec import SampleRequest

    spec = flux1_on("v6e")
    counts = {"resolve": 0, "headers": 0, "copies": 0}

    def counted(name, real):
        def call(*args, **kwargs):
            counts[name] += 1
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(resolve, "resolve", counted("resolve", resolve.resolve))
    monkeypatch.setattr(offload.models, "weight_bytes", counted("headers", offload.models.weight_bytes))
    monkeypatch.setattr(images, "as_arrays", counted("copies", images.as_arrays))
    sent = []
    out = np.zeros((1, 64, 64, 3), np.float32)
    monkeypatch.setattr(group, "run", lambda config, call, on_status=None, should_interrupt=None: sent.append(config) or
                        [Result(1, {}, {"images": out})])

    req = SampleRequest(prompt="a red fox", width=64, height=64, steps=2, denoise=0.5)
    prepared = api.prepare_sample(spec, req, np.ones((1, 64, 64, 3), np.float32))
    assert prepared.spec.offload == "model" and prepared.notes  # what the node shows before it runs
    assert api.run_sample(prepared) is out and len(sent) == 1
    assert counts == {"resolve": 1, "headers": 1, "copies": 1}, counts


# Wan 2.2 A14B from the published configs (backend/configs/wan22-t2v-a14b, counted on the meta device): two
# 14.29 B experts, the 5.68 B UMT5-XXL encoder, Wan 2.1's 127 M VAE; 57 GB of experts in bfloat16.
WAN22_A14B = {"text_encoder": 5_680_910_336, "transformer": 14_288_491_584, "transformer_2": 14_288_491_584,
              "vae": 126_892_531}


@pytest.mark.parametrize("gen, fp8, mode, words", [
    ("v6e", False, "sequential", "even transformer (26.6 GiB) is more than 25.6 GiB"),
    ("v6e", True, "model", "the largest part (transformer, 13.3 GiB) fits"),
    ("v7x", False, "none", "the weights take 64.0 GiB in bfloat16"),
])
def test_wan22_a14b_counts_both_experts_and_fp8_storage_halves_them(monkeypatch, tiny_models, gen, fp8, mode, words):
    memory, _ = HOSTS[gen]
    monkeypatch.setattr(offload.devices, "device_memory_bytes", lambda kind: memory)
    monkeypatch.setattr(offload.models, "weight_bytes",
                        lambda spec, float_bytes: {n: p * float_bytes for n, p in WAN22_A14B.items()})
    spec = _spec(tiny_models, "tiny-wan", offload="auto").with_changes(kind="tpu", storage="float8_e4m3fn" if fp8 else "")
    choice = offload.choose_offload(spec)
    assert choice.mode == mode and words in choice.reason, choice
    assert ("transformer_2 13.3 GiB" if fp8 else "transformer_2 26.6 GiB") in choice.reason


# LTX-2.3 and MiniMax H3 from docs/tpu.md's parameter counts (billions of parameters): each text encoder as the
# bf16 folders hold it (Gemma 3 12B, Qwen3-VL 32B), the denoiser, connectors, VAEs and vocoder
LTX23 = {"text_encoder": 12.2e9, "connectors": 1.87e9, "transformer": 18.99e9, "vae": 1.22e9, "audio_vae": 0.05e9,
         "vocoder": 0.06e9}
MINIMAX_H3 = {"text_encoder": 33.35e9, "transformer": 33.12e9, "vae": 2.60e9, "audio_vae": 0.15e9}


@pytest.mark.parametrize("name, parts, gen, fp8, outcome", [
    ("tiny-ltx2", LTX23, "v5e", True, "offload: sequential offload cannot run LTX-2's gemma3 text encoder"),
    ("tiny-ltx2", LTX23, "v6e", False, "offload: sequential offload cannot run LTX-2's gemma3 text encoder"),
    ("tiny-ltx2", LTX23, "v6e", True, "model"),
    ("tiny-ltx2", LTX23, "v7x", False, "none"),
    ("tiny-minimax-h3", MINIMAX_H3, "v6e", True, "offload: auto cannot fit MiniMax H3 on one tpu device"),
    ("tiny-minimax-h3", MINIMAX_H3, "v7x", True, "offload: auto cannot fit MiniMax H3 on one tpu device"),
])
def test_the_video_families_text_encoders_per_chip_generation_as_docs_tpu_says(monkeypatch, tiny_models, name,
                                                                               parts, gen, fp8, outcome):
    """docs/tpu.md's text-encoder answer, held to the code: neither family can be sharded (no TP plan for its
    transformer, so no shard_text_encoders either); LTX-2's Gemma runs alone on the chip under offload model,
    which needs a v6e and the denoiser in fp8 storage (its 24.4 GB is the largest part then), and never layer by
    layer; MiniMax H3 (a modular pipeline: no offload) fits no single device, a v7x's 96 GiB included."""
    from backend.protocol.errors import ModelError

    memory, _ = HOSTS[gen]
    monkeypatch.setattr(offload.devices, "device_memory_bytes", lambda kind: memory)
    monkeypatch.setattr(offload.models, "weight_bytes",
                        lambda spec, float_bytes: {n: int(p * float_bytes) for n, p in parts.items()})
    spec = _spec(tiny_models, name, offload="auto").with_changes(kind="tpu", storage="float8_e4m3fn" if fp8 else "")
    if outcome in ("model", "none"):
        assert offload.resolve_offload(spec).offload == outcome
    else:
        with pytest.raises(ModelError, match=outcome):
            offload.resolve_offload(spec)
    with pytest.raises(ParallelError, match=r"has no tensor-parallel plan in diffusers, so it cannot be sharded"):
        layouts.plan_tp(_spec(tiny_models, name), 2, shard_text_encoders=True)


# ---- the 2026 families, from the tiny models' own headers: the components each loads (MiniMax H3's t2va leaves
# its folder's ref2va transformer out), both of Ideogram 4's transformers as denoisers, LTX-2's sound components
NEW_FAMILIES = {
    "tiny-qwenimage21": ("text_encoder", "transformer", "vae"),
    "tiny-krea2": ("text_encoder", "transformer", "vae"),
    "tiny-ideogram4": ("text_encoder", "transformer", "unconditional_transformer", "vae"),
    "tiny-flux3": ("text_encoder", "transformer", "vae"),
    "tiny-ltx2": ("text_encoder", "connectors", "transformer", "vae", "audio_vae", "vocoder"),
    "tiny-minimax-h3": ("text_encoder", "transformer", "vae", "audio_vae"),
}


@pytest.mark.parametrize("name", list(NEW_FAMILIES))
def test_new_families_count_what_they_load_and_fp8_storage_halves_every_denoiser(tiny_models, name):
    from backend.controller import storage
    from backend.protocol.spec import DENOISERS

    spec = _spec(tiny_models, name)
    f32 = models.weight_bytes(spec, 4)
    assert sorted(f32) == sorted(NEW_FAMILIES[name])
    for part, size in f32.items():  # the tiny models are saved in float32
        assert size == sum(_data_bytes(p) for p in (tiny_models / name / part).glob("*.safetensors")), part
    bf16 = models.weight_bytes(spec, 2)
    stored = storage.stored_bytes(spec.with_changes(storage="float8_e4m3fn"), bf16, models.weight_bytes(spec, 1))
    for part in f32:  # each denoiser (every float in it) at one byte, the rest as computed
        assert stored[part] == (f32[part] // 4 if part in DENOISERS else bf16[part]), part
    assert any(part in DENOISERS for part in f32)


def test_a_modular_pipeline_that_does_not_fit_is_refused_naming_why_and_one_that_fits_runs_whole(tiny_models,
                                                                                                monkeypatch):
    from backend.protocol.errors import ModelError

    spec = _spec(tiny_models, "tiny-minimax-h3", offload="auto").with_changes(kind="tpu")
    total = sum(models.weight_bytes(spec, 2).values())
    monkeypatch.setattr(offload.devices, "device_memory_bytes", lambda kind: int(total / offload.OFFLOAD_HEADROOM) + 1)
    choice = offload.choose_offload(spec)
    assert choice.mode == "none" and "text_encoder" in choice.reason and "transformer_ref" not in choice.reason
    monkeypatch.setattr(offload.devices, "device_memory_bytes", lambda kind: int(total / offload.OFFLOAD_HEADROOM) - 1)
    with pytest.raises(ModelError, match=r"offload: auto cannot fit MiniMax H3 on one tpu device: .*modular pipeline, "
                                         r"which has no CPU offload hooks.*float8_e4m3fn"):
        offload.choose_offload(spec)
