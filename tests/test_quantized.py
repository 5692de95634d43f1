"""ComfyUI's quantized files (int8 ConvRot, nvfp4 + fp8 "mixed", issue 33): told apart by their header, refused
with the tensor and the fix when damaged, kept quantized in memory, and giving the images of the same files
dequantized by comfy-kitchen.

The fixtures are quantized by comfy-kitchen's own quantize (tests/file_fixtures.py `quantize_comfy`), each beside
the same file dequantized by comfy-kitchen. Tolerance of the image comparisons: none. On the CPU the pipeline
computes in float32, each quantized layer is dequantized to float32 by comfy-kitchen as it runs, and the
reference file holds exactly those float32 weights, so the same seed gives the same pixels.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import file_fixtures
import numpy as np
import pytest

from backend.controller import api, layouts, offload
from backend.controller.files import assemble, headers, listing
from backend.protocol.errors import InputError
from backend.protocol.spec import LoraRef, SampleRequest

NAMES = file_fixtures.FILES["zimage-quant"]
ZIMAGE = file_fixtures.FILES["zimage"]


@pytest.fixture(scope="module")
def files(comfyui_files, comfyui_dir, monkeypatch_module):
    monkeypatch_module.syspath_prepend(str(comfyui_dir))  # ComfyUI's bundled tokenizers, as in its process
    return comfyui_files("zimage", "zimage-quant", folder="comfyui-quant")


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def roots(files: Path) -> dict[str, list[str]]:
    return {role: [str(files / "models" / folder)] for role, folder in listing.ROLE_FOLDERS.items()}


def spec_of(files: Path, dm: str, te: str = ZIMAGE["qwen3"], **kw) -> api.PipelineSpec:
    choice = assemble.FileChoice(diffusion_model=dm, text_encoders=(te,), vae=ZIMAGE["vae"])
    return api.make_file_spec(choice, roots(files), **kw)


def request(**kw) -> SampleRequest:
    return SampleRequest(**{**dict(prompt="a red fox in the snow", width=64, height=64, steps=2, guidance=0.0,
                                   seed=5), **kw})


def _load(spec):
    import torch

    from backend.worker import loading

    notes = []
    return loading.load_files(spec.source, torch.float32, notes.append), notes


# ---- the controller: headers only


@pytest.mark.unit
def test_quantized_files_are_listed_and_recognised_by_their_header(files, tmp_path):
    listed = api.list_files(roots(files))
    assert {NAMES["int8_convrot"], NAMES["fp4_mixed"]} <= set(listed["diffusion_model"])
    assert NAMES["qwen3_fp8_mixed"] in listed["text_encoder"]
    spec = spec_of(files, NAMES["int8_convrot"], NAMES["qwen3_fp8_mixed"])
    parts = {c.name: c for c in spec.source.components}
    assert (parts["transformer"].layout, parts["transformer"].quant) == ("zimage", "comfy-quant")
    assert parts["text_encoder"].quant == "comfy-quant"
    assert spec.component_config("transformer")["dim"] == 256
    q = headers.read_header(Path(parts["transformer"].path)).quantized
    assert set(q.formats()) == {"int8_tensorwise"} and not q.problems
    rowwise = {p for p, la in q.layers.items() if not la.option("convrot", False)}
    assert rowwise and all(p.endswith("feed_forward.w2") for p in rowwise), "w2 reads 682 features: no ConvRot"
    te_header = headers.read_header(Path(parts["text_encoder"].path))
    n = len({k.split(".")[2] for k in te_header.shapes if k.startswith("model.layers.")})
    assert te_header.quantized.formats() == {"float8_e4m3fn": 4 * (n - 1), "nvfp4": 3 * (n - 1)}, \
        "markers in _quantization_metadata: attention in fp8, MLP in nvfp4, layer 0 left bf16"
    assert any("kept quantized" in n and "int8_tensorwise (ConvRot)" in n for n in spec.source.notes)
    # a renamed file is the same file: the header tells it, not the name
    renamed = tmp_path / "models" / "diffusion_models"
    renamed.mkdir(parents=True)
    shutil.copy(files / "models" / "diffusion_models" / NAMES["fp4_mixed"], renamed / "my_model.safetensors")
    r = {**roots(files), "diffusion_model": [str(renamed)]}
    choice = assemble.FileChoice(diffusion_model="my_model.safetensors", text_encoders=(ZIMAGE["qwen3"],),
                                 vae=ZIMAGE["vae"])
    spec = api.make_file_spec(choice, r)
    assert spec.source.component("transformer").quant == "comfy-quant"
    assert spec.component_config("transformer")["dim"] == 256, "nvfp4 packs two per byte: read at full width"


def _rewrite(src: Path, dst: Path, change) -> Path:
    """A copy of the file with `change(tensors, metadata)` applied (safetensors' own writer)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(src), "pt") as f:
        sd, meta = {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
    change(sd, meta)
    dst.parent.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(dst), metadata=meta or None)
    return dst


@pytest.mark.unit
def test_damaged_quantized_files_are_refused_naming_the_file_the_tensor_and_the_fix(files, tmp_path):
    import torch

    src = files / "models" / "diffusion_models" / NAMES["int8_convrot"]
    layer = "layers.0.attention.qkv"
    folder = tmp_path / "models" / "diffusion_models"

    def no_scale(sd, meta):
        del sd[f"{layer}.weight_scale"]

    def unknown(sd, meta):
        sd[f"{layer}.comfy_quant"] = torch.tensor(list(b'{"format": "int3_magic"}'), dtype=torch.uint8)

    def wrong_shape(sd, meta):
        sd[f"{layer}.weight_scale"] = sd[f"{layer}.weight_scale"][:7]

    def no_marker(sd, meta):
        del sd[f"{layer}.comfy_quant"]

    cases = {"no_scale": (no_scale, [f"'{layer}.weight_scale' is missing", "Download"]),
             "unknown": (unknown, [f"'{layer}.comfy_quant'", "int3_magic", "bf16 or fp8 version"]),
             "wrong_shape": (wrong_shape, [f"'{layer}.weight_scale' has the shape [7, 1]", "Download"]),
             "no_marker": (no_marker, [f"'{layer}.weight_scale'", "no comfy_quant marker"])}
    for name, (change, words) in cases.items():
        _rewrite(src, folder / f"{name}.safetensors", change)
        choice = assemble.FileChoice(diffusion_model=f"{name}.safetensors", text_encoders=(ZIMAGE["qwen3"],),
                                     vae=ZIMAGE["vae"])
        with pytest.raises(InputError) as e:
            api.make_file_spec(choice, {**roots(files), "diffusion_model": [str(folder)]})
        text = str(e.value)
        assert f"'{name}.safetensors'" in text and all(w in text for w in words), (name, text)
    data = src.read_bytes()
    (folder / "truncated.safetensors").write_bytes(data[: len(data) - 1000])
    (n,) = struct.unpack("<Q", data[:8])
    assert json.loads(data[8:8 + n])  # the header is whole: what is lost is tensor data
    choice = assemble.FileChoice(diffusion_model="truncated.safetensors", text_encoders=(ZIMAGE["qwen3"],),
                                 vae=ZIMAGE["vae"])
    with pytest.raises(InputError, match="'truncated.safetensors' is truncated.*download it again"):
        api.make_file_spec(choice, {**roots(files), "diffusion_model": [str(folder)]})


@pytest.mark.unit
def test_offload_auto_counts_what_a_tpu_dequantizes_at_load(files):
    spec = spec_of(files, NAMES["fp4_mixed"])
    stored = offload.dequantized_at_load(spec, {"transformer": 100}, 2)
    assert stored == {"transformer": 100}, "the CPU keeps every format quantized"
    tpu = offload.dequantized_at_load(spec.with_changes(kind="tpu"), {"transformer": 100}, 2)
    header = headers.read_header(Path(spec.source.component("transformer").path))
    nvfp4 = [la for la in header.quantized.layers.values() if la.format == "nvfp4"]
    assert tpu["transformer"] - 100 >= sum(la.logical[0] * la.logical[1] * 2 * 0.7 for la in nvfp4)
    int8 = spec_of(files, NAMES["int8_convrot"]).with_changes(kind="tpu")
    assert offload.dequantized_at_load(int8, {"transformer": 100}, 2) == {"transformer": 100}, "int8 stays"


@pytest.mark.unit
def test_shard_tp_and_sequential_offload_are_refused_for_quantized_files_with_the_way_out(files):
    spec = spec_of(files, NAMES["int8_convrot"])
    with pytest.raises(InputError, match=f"'{NAMES['int8_convrot']}' is one of ComfyUI's quantized.*Data Parallel"):
        layouts.plan_tp(spec, 2)
    with pytest.raises(InputError, match="sequential offload cannot run.*Choose offload 'model' or 'none'"):
        offload.resolve_offload(spec.with_changes(offload="sequential"))
    assert offload.resolve_offload(spec.with_changes(offload="model")).offload == "model"


# ---- the worker's loading, in this process


@pytest.mark.unit
@pytest.mark.parametrize("name", ["int8_convrot", "fp4_mixed"])
def test_quantized_layers_stay_quantized_and_equal_comfy_kitchens_dequantized_file(files, name):
    import torch
    from comfy_kitchen.tensor import QuantizedTensor

    from backend.worker import quantized

    pipe, notes = _load(spec_of(files, NAMES[name], NAMES["qwen3_fp8_mixed"]))
    ref, _ = _load(spec_of(files, NAMES[f"{name}_dequantized"], NAMES["qwen3_fp8_mixed_dequantized"]))
    for component in ("transformer", "text_encoder"):
        ours, theirs = getattr(pipe, component), getattr(ref, component)
        layers = [m for m in ours.modules() if isinstance(m, quantized.DequantLinear)]
        assert layers and all(isinstance(m.weight, QuantizedTensor) for m in layers)
        assert any(f"{component}: {len(layers)} layers kept quantized" in n for n in notes), notes
        mine = ours.state_dict()
        for key, value in theirs.state_dict().items():  # same keys; each weight comfy-kitchen's dequantized
            got = mine[key].dequantize() if isinstance(mine[key], QuantizedTensor) else mine[key]
            assert torch.equal(got, value), (component, key)
    t = pipe.transformer
    qkv = [m for n, m in t.named_modules() if n.endswith("attention.to_q")]
    assert all(isinstance(m, quantized.DequantLinear) for m in qkv), "the fused qkv was split still quantized"
    x = [torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0))]
    cap = [torch.randn(7, 32, generator=torch.Generator().manual_seed(1))]
    with torch.no_grad():
        y = t(x, torch.tensor([0.5]), cap, return_dict=False)[0][0]
        assert torch.equal(y, ref.transformer(x, torch.tensor([0.5]), cap, return_dict=False)[0][0])
        if name == "int8_convrot":  # a TPU's plain int8 buffers: the same weights, in aten ops only
            before = quantized.count(t)
            quantized.for_device(t, "tpu", torch.float32, notes.append, "transformer")
            plain = [m for m in t.modules() if isinstance(m, quantized.PlainQuantLinear)]
            assert len(plain) == before and quantized.count(t) == before
            z = t(x, torch.tensor([0.5]), cap, return_dict=False)[0][0]
            assert float((z - y).abs().max()) <= 1e-5 * float(y.abs().max())


@pytest.mark.unit
def test_an_int8_convrot_layer_on_a_tpu_compiles_to_plain_aten_ops():
    """What a TPU runs (no int8 matmul in TorchTPU 0.2.0): the int8 weight and its scale as buffers, dequantized
    in a cast, a multiply and ConvRot's group matmul; torch.compile traces it whole, with no custom op."""
    import comfy_kitchen as ck
    import torch
    from comfy_kitchen.tensor import QuantizedTensor

    from backend.worker import quantized

    w = torch.randn(64, 512)
    with ck.use_backend("eager"):
        qt = QuantizedTensor.from_float(w, "TensorWiseINT8Layout", per_channel=True, convrot=True,
                                        convrot_groupsize=256)
        exact = qt.dequantize()
    layer = quantized.PlainQuantLinear(qt._qdata, qt._params.scale, None, 256)
    assert torch.equal(layer.dequantized_weight(torch.float32), exact)
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    x = torch.randn(3, 512)
    out = torch.compile(layer, backend=backend, fullgraph=True)(x)
    assert torch.allclose(out, x @ exact.T, atol=1e-4)
    ops = {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}
    assert ops and not any("comfy_kitchen" in o for o in ops), ops


# ---- through the workers: images, LoRA, Data Parallel


@pytest.mark.workers
@pytest.mark.parametrize("name", ["int8_convrot", "fp4_mixed"])
def test_quantized_files_give_the_images_of_the_files_dequantized_by_comfy_kitchen(files, name):
    quant = spec_of(files, NAMES[name], NAMES["qwen3_fp8_mixed"])
    deq = spec_of(files, NAMES[f"{name}_dequantized"], NAMES["qwen3_fp8_mixed_dequantized"])
    mine, theirs = api.sample(quant, request()), api.sample(deq, request())
    assert mine.shape == (1, 64, 64, 3) and mine.std() > 0
    assert np.array_equal(mine, theirs), float(np.abs(mine - theirs).max())


@pytest.mark.workers
def test_a_lora_on_a_quantized_denoiser_equals_it_on_the_dequantized_file(files, tmp_path):
    from lora_fixtures import make

    ref_spec = spec_of(files, NAMES["int8_convrot_dequantized"])
    pipe, _ = _load(ref_spec)
    path, _ = make(files, "tiny-zimage", "diffusers", tmp_path, seed=3, pipe=pipe)
    lora = (LoraRef(str(path), 0.8, 0.8),)
    quant = spec_of(files, NAMES["int8_convrot"])
    plain = api.sample(quant, request())
    mine = api.sample(quant.with_changes(loras=lora), request())
    theirs = api.sample(ref_spec.with_changes(loras=lora), request())
    assert np.abs(mine - plain).max() > 0.01, "the LoRA changes the image"
    assert np.array_equal(mine, theirs), float(np.abs(mine - theirs).max())
    assert np.array_equal(api.sample(quant, request()), plain), "removing it restores the file's weights"


@pytest.mark.workers
def test_data_parallel_replicas_of_a_quantized_file_give_one_workers_images(files):
    spec = spec_of(files, NAMES["int8_convrot"], NAMES["qwen3_fp8_mixed"])
    one = api.sample(spec, request(batch_size=2))
    dp, _ = layouts.plan_dp(spec, 2)
    assert np.array_equal(api.sample(dp, request(batch_size=2)), one)


# ---- every format of ComfyUI's QUANT_ALGOS: header check, loading, row splits (one layer each)

# format -> (comfy-kitchen layout, quantize kwargs, comfy_quant); AWQ has no quantizer in comfy-kitchen (it needs
# offline calibration): its storage is written by round to nearest below
FORMATS = {
    "int8_tensorwise": ("TensorWiseINT8Layout", {}, {}),
    "int8_convrot": ("TensorWiseINT8Layout", {"per_channel": True, "convrot": True, "convrot_groupsize": 256},
                     {"convrot": True, "convrot_groupsize": 256}),
    "convrot_w4a4": ("TensorCoreConvRotW4A4Layout", {"convrot_groupsize": 256}, {"convrot_groupsize": 256}),
    "asym_w4a8_int8": ("AsymW4A8Int8Layout", {"group_size": 16, "convrot_groupsize": 256},
                       {"group_size": 16, "convrot_groupsize": 256}),
    "nvfp4": ("TensorCoreNVFP4Layout", {}, {}),
    "mxfp8": ("TensorCoreMXFP8Layout", {}, {}),
    "float8_e4m3fn": ("TensorCoreFP8Layout", {}, {}),
    "awq_w4a16": (None, {}, {"group_size": 64}),
}


def _awq_rtn(w, group: int = 64) -> dict:
    """AWQ W4A16 storage (comfy-kitchen's awq_w4a16 layout docstring): uint4 pairs, even column in the low nibble;
    scale and zeros [K/G, N]; W = (q - 8) * scale + zeros."""
    import torch

    n, k = w.shape
    g = w.reshape(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-8)
    q = ((g - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32).reshape(n, k)
    return {"": (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8).view(torch.int8),
            "_scale": scale.t().contiguous().to(torch.bfloat16), "_zeros": (lo + 8 * scale).t().contiguous().to(torch.bfloat16)}


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_is_checked_from_its_header_and_loads_as_comfy_kitchen_dequantizes_it(name, tmp_path):
    import comfy_kitchen as ck
    import torch
    from comfy_kitchen.tensor import QuantizedTensor
    from safetensors.torch import save_file

    from backend.worker import quantized

    layout, kwargs, extra = FORMATS[name]
    fmt = "int8_tensorwise" if name == "int8_convrot" else name
    w = torch.randn(256, 512, generator=torch.Generator().manual_seed(0))
    with ck.use_backend("eager"):
        if layout is None:
            tensors = _awq_rtn(w)
        else:
            qt = QuantizedTensor.from_float(w, layout, **kwargs)
            tensors = qt.layout_cls.state_dict_tensors(qt._qdata, qt._params)
        sd = {f"blk.proj.weight{s}": t.contiguous() for s, t in tensors.items()}
        sd["blk.proj.comfy_quant"] = torch.tensor(list(json.dumps({"format": fmt, **extra}).encode()),
                                                  dtype=torch.uint8)
        sd["blk.norm.weight"] = torch.ones(512)
        path = tmp_path / f"{name}.safetensors"
        save_file(sd, str(path))
        header = headers.read_header(path)
        q = header.quantized
        assert not q.problems and q.formats() == {fmt: 1}
        assert header.logical["blk.proj.weight"] == (256, 512), "the float model's shape, packed or not"
        assert set(header.logical) == {"blk.proj.weight", "blk.norm.weight"}, "sidecars are not model tensors"
        loaded, _ = quantized.state_dict(str(path), "", torch.float32)
        mine = loaded["blk.proj.weight"]
        assert isinstance(mine, QuantizedTensor) and set(loaded) == {"blk.proj.weight", "blk.norm.weight"}
        full = mine.dequantize()
        if layout is not None:
            assert torch.equal(full, qt.dequantize())
        assert float((full - w).norm() / w.norm()) < 0.2, "dequantizes to the weight it stands for"
        with quantized.RowSplitMode() as mode:  # what diffusers' converters do to fused weights
            parts = torch.chunk(mine, 2, dim=0)
        rows = torch.cat([p.dequantize() for p in parts])
        assert torch.equal(rows, full) and (mode.kept == 1 or fmt in ("nvfp4", "mxfp8")), mode.kept
    # one scale gone: refused by the header check, naming the tensor
    scale = next(k for k in sd if k.endswith(("_scale", "_s_rel")))
    save_file({k: v for k, v in sd.items() if k != scale}, str(tmp_path / "bad.safetensors"))
    problems = headers.read_header(tmp_path / "bad.safetensors").quantized.problems
    assert problems and problems[0][0] == scale and "missing" in problems[0][1]
