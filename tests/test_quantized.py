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
QWEN = {**file_fixtures.FILES["qwenimage"], **file_fixtures.FILES["qwenimage-quant"]}
TOLERANCE = 1e-4  # CFG Parallel, Context Parallel and Shard TP sum in another order (tests/test_speed.py)
COMPILE_TOLERANCE = 1e-5  # compiled: the int8 layers as plain buffers, dequantized in aten ops (as tests/test_zimage)


@pytest.fixture(scope="module")
def files(comfyui_files, comfyui_dir, monkeypatch_module):
    monkeypatch_module.syspath_prepend(str(comfyui_dir))  # ComfyUI's bundled tokenizers, as in its process
    return comfyui_files("zimage", "zimage-quant", "qwenimage", "qwenimage-quant", folder="comfyui-quant")


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def roots(files: Path) -> dict[str, list[str]]:
    return {role: [str(files / "models" / folder)] for role, folder in listing.ROLE_FOLDERS.items()}


def spec_of(files: Path, dm: str, te: str = ZIMAGE["qwen3"], **kw) -> api.PipelineSpec:
    choice = assemble.FileChoice(diffusion_model=dm, text_encoders=(te,), vae=ZIMAGE["vae"])
    return api.make_file_spec(choice, roots(files), **kw)


def qwen_spec(files: Path, **kw) -> api.PipelineSpec:
    """Qwen-Image (a tensor- and context-parallel plan in diffusers) from its int8 file."""
    choice = assemble.FileChoice(diffusion_model=QWEN["t2i_int8"], text_encoders=(QWEN["qwen25vl"],),
                                 vae=QWEN["vae"])
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


@pytest.mark.pipelines
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
    assert te_header.quantized.formats() == {"float8_e4m3fn": 4 * (n - 1), "nvfp4": 3 * (n - 1),
                                             "int8_tensorwise": 1}, \
        "markers in _quantization_metadata: attention in fp8, MLP in nvfp4, layer 0 left bf16, the embedding int8"
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


@pytest.mark.pipelines
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


@pytest.mark.pipelines
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
def test_the_controllers_converted_layouts_are_the_families_converters():
    """vaes.CONVERTED (what offload 'auto' and the loader's note read without torch) names exactly the layouts the
    worker reads through a family's converter, dequantizing ComfyUI's quantized layers at load."""
    from backend.families import family_table, vaes

    assert vaes.CONVERTED == set(family_table("VAE_CONVERTERS"))


@pytest.mark.pipelines
def test_shard_tp_counts_the_dequantized_shards_and_sequential_offload_is_refused(files):
    """Shard TP dequantizes the transformer at load (diffusers' plan slices plain weights only), so offload 'auto'
    counts it at its float size; Z-Image has no plan at all, which is what its refusal says. Sequential offload
    stays refused, asked for or chosen by 'auto' (fp8 storage refuses the asked-for one: the same rule)."""
    with pytest.raises(InputError, match="has no tensor-parallel plan in diffusers"):
        layouts.plan_tp(spec_of(files, NAMES["int8_convrot"]), 2)
    qwen = qwen_spec(files)
    tp, text = layouts.plan_tp(qwen, 2)
    assert tp.tp_degree == 2, text
    header = headers.read_header(Path(qwen.source.component("transformer").path))
    q = header.quantized
    whole = sum(la.logical[0] * la.logical[1] * 2 for la in q.layers.values())
    stored = sum(int(np.prod(header.shapes[k])) * (4 if header.dtypes[k] == "F32" else 1) for p in q.layers
                 for k in (f"{p}.weight", f"{p}.weight_scale"))
    assert stored < whole
    extra = offload.dequantized_at_load(tp.with_changes(kind="tpu"), {"transformer": 100}, 2)["transformer"] - 100
    assert extra == quantized_float_bytes(header, 2) and extra > 0.4 * whole, (extra, whole)
    assert offload.dequantized_at_load(qwen.with_changes(kind="tpu"), {"transformer": 100}, 2) == \
        {"transformer": 100}, "unsharded, a TPU keeps int8 quantized"
    spec = spec_of(files, NAMES["int8_convrot"])
    with pytest.raises(InputError, match="sequential offload cannot run.*Choose offload 'model' or 'none'"):
        offload.resolve_offload(spec.with_changes(offload="sequential"))
    assert offload.resolve_offload(spec.with_changes(offload="model")).offload == "model"


@pytest.mark.pipelines
def test_sequential_offload_chosen_by_auto_and_fp8_storage_are_refused_for_quantized_files(files, monkeypatch):
    """docs/quantized.md's rules beside the asked-for sequential offload above: 'auto' may not choose it either
    (a device too small for any part), and fp8 storage would round the quantized weights a second time."""
    from backend.controller import storage

    monkeypatch.setattr(offload.devices, "device_memory_bytes", lambda kind: 1)
    spec = spec_of(files, NAMES["int8_convrot"], offload="auto").with_changes(kind="tpu")
    assert offload.choose_offload(spec).mode == "sequential"
    with pytest.raises(InputError, match="sequential offload cannot run 'z_image_turbo-tiny_int8_convrot"):
        offload.resolve_offload(spec)
    with pytest.raises(InputError, match="float8_e4m3fn storage needs plain weights; 'z_image_turbo-tiny_int8_convrot"
                                         ".*ComfyUI's quantized format.*Choose dtype auto"):
        storage.resolve_storage(spec_of(files, NAMES["int8_convrot"], dtype="float8_e4m3fn"))


def quantized_float_bytes(header, float_size: int) -> int:
    from backend.protocol import quantized

    return quantized.float_bytes(header.shapes, header.quantized, list(header.quantized.layers), float_size,
                                 lambda k: header.tensor_bytes(k, float_size))


# ---- the worker's loading, in this process


@pytest.mark.pipelines
@pytest.mark.parametrize("name", ["int8_convrot", "fp4_mixed"])
def test_quantized_layers_stay_quantized_and_equal_comfy_kitchens_dequantized_file(files, name):
    import torch
    from comfy_kitchen.tensor import QuantizedTensor

    from backend.worker import quantized

    pipe, notes = _load(spec_of(files, NAMES[name], NAMES["qwen3_fp8_mixed"]))
    ref, _ = _load(spec_of(files, NAMES[f"{name}_dequantized"], NAMES["qwen3_fp8_mixed_dequantized"]))
    for component in ("transformer", "text_encoder"):
        ours, theirs = getattr(pipe, component), getattr(ref, component)
        layers = [m for m in ours.modules() if isinstance(m, (quantized.DequantLinear, quantized.DequantEmbedding))]
        assert layers and all(isinstance(m.weight, QuantizedTensor) for m in layers)
        if component == "text_encoder":  # its int8 embedding table, read as ComfyUI quantizes it
            assert isinstance(ours.get_input_embeddings(), quantized.DequantEmbedding)
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
            te, ids = pipe.text_encoder, torch.tensor([[1, 5, 9, 2]])
            want = te(input_ids=ids)[0]
            quantized.for_device(te, "tpu", torch.float32, notes.append, "text_encoder")
            assert isinstance(te.get_input_embeddings(), quantized.PlainQuantEmbedding), "int8: plain buffers"
            assert any(n.startswith("text_encoder: ") and "dequantized at load" in n for n in notes), "nvfp4"
            got = te(input_ids=ids)[0]
            assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())


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
    other = quantized.PlainQuantLinear(qt._qdata, qt._params.scale, None, 256)  # one rotation for all layers
    assert other.hadamard is layer.hadamard and "hadamard" not in dict(other.named_buffers())
    assert other.to("meta").hadamard is quantized.shared_hadamard(256, torch.device("meta")), "moved: that device's"
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


@pytest.mark.workers
def test_cfg_context_parallel_and_shard_tp_of_a_quantized_file_give_one_workers_images(files):
    """Qwen-Image's int8 file: CFG Parallel and Context Parallel keep the layers quantized (they split the
    batch and the tokens, not the weights); Shard TP dequantizes the transformer at load and shards it, saying so."""
    spec = qwen_spec(files)
    req = request(prompt="a cat", negative_prompt="blurry", guidance=4.0)
    one = api.sample(spec, req)
    assert one.shape == (1, 64, 64, 3) and one.std() > 0
    for name, (split, _) in {"cfg": api.cfg_parallel(spec), "cp": api.context_parallel(spec, 2)}.items():
        images = api.sample(split, req)
        assert np.abs(images - one).max() <= TOLERANCE, (name, float(np.abs(images - one).max()))
    said: list[str] = []
    tp, _ = layouts.plan_tp(spec, 2)
    images = api.sample(tp, req, lambda m: said.append(getattr(m, "text", "")))
    assert np.abs(images - one).max() <= TOLERANCE, float(np.abs(images - one).max())
    assert any("transformer: dequantized at load by comfy-kitchen for Shard TP" in t for t in said), said


@pytest.mark.workers
def test_the_prompt_cache_and_compiled_mode_with_quantized_files(files):
    """The prompt cache keeps the quantized text encoder's output (a seed sweep encodes once); compiled mode runs
    the int8 layers as plain buffers and dequantizes the text encoder's nvfp4 layers at load, saying so, within
    COMPILE_TOLERANCE of the eager images."""
    spec = spec_of(files, NAMES["int8_convrot"], NAMES["qwen3_fp8_mixed"])
    first = api.sample(spec, request(seed=1))
    before = api.worker_info()[0]["prompt_cache"]
    for seed in (2, 3, 1):
        images = api.sample(spec, request(seed=seed))
    after = api.worker_info()[0]["prompt_cache"]
    assert after["hits"] - before["hits"] == 3 and after["misses"] == before["misses"], after
    assert np.array_equal(images, first), "the cached prompt gives the image it gave encoded"
    said: list[str] = []
    compiled, _ = api.with_compile(spec, "repeated blocks", "eager", "64x64")
    images = api.sample(compiled, request(seed=1), lambda m: said.append(getattr(m, "text", "")))
    assert np.abs(images - first).max() <= COMPILE_TOLERANCE, float(np.abs(images - first).max())
    assert any(t.startswith("text_encoder: ") and "quantized layers dequantized at load" in t for t in said), said
    assert not any(t.startswith("transformer: ") and "dequantized at load" in t for t in said), "int8 stays"
    stats = api.compile_stats()
    assert stats["graphs"] > 0 and stats["unexpected_recompiles"] == 0, stats
    assert np.array_equal(api.sample(spec, request(seed=1)), first), "eager again: comfy-kitchen's tensors, reloaded"


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


@pytest.mark.unit
def test_nvfp4_pads_layers_whose_sizes_are_not_multiples_of_16_and_the_file_holds_only_the_padded_size(tmp_path):
    """comfy-kitchen's nvfp4 quantize pads a [24, 40] weight to [32, 48] storage (16x16 blocks) and keeps the
    true size in its Params only; ComfyUI's loader takes it from its module (comfy/ops.py). The file holds the
    padded storage, so the header, and the pack, read [32, 48]; the padding dequantizes to exact zeros and the
    true block is comfy-kitchen's own dequantized weight (docs/quantized.md: such a layer then loads only where
    the model's config reads the padded size too, else diffusers refuses it naming the tensor)."""
    import comfy_kitchen as ck
    import torch
    from comfy_kitchen.tensor import QuantizedTensor
    from safetensors.torch import save_file

    from backend.worker import quantized

    w = torch.randn(24, 40, generator=torch.Generator().manual_seed(0))
    with ck.use_backend("eager"):
        qt = QuantizedTensor.from_float(w, "TensorCoreNVFP4Layout")
        assert qt.shape == (24, 40) and qt._qdata.shape == (32, 24), "padded to 32 x 48, two per byte"
        tensors = qt.layout_cls.state_dict_tensors(qt._qdata, qt._params)
        sd = {f"proj.weight{s}": t.contiguous() for s, t in tensors.items()}
        sd["proj.comfy_quant"] = torch.tensor(list(b'{"format": "nvfp4"}'), dtype=torch.uint8)
        save_file(sd, str(tmp_path / "odd.safetensors"))
        header = headers.read_header(tmp_path / "odd.safetensors")
        assert not header.quantized.problems and header.logical["proj.weight"] == (32, 48)
        mine = quantized.state_dict(str(tmp_path / "odd.safetensors"), "", torch.float32)[0]["proj.weight"]
        full = mine.dequantize()
    assert full.shape == (32, 48) and torch.equal(full[:24, :40], qt.dequantize())
    assert not full[24:].any() and not full[:, 40:].any()


@pytest.mark.unit
def test_dequantizing_at_load_folds_awq_smoothing_into_the_weight(tmp_path):
    """What Shard TP and a quantized VAE read (worker/quantized.py `dequantized`): comfy-kitchen's dequantized
    weights, a layer's `pre_quant_scale` (ComfyUI's AWQ-smoothed nvfp4, as qwen3vl_32b_minimax_h3_nvfp4_awq) folded
    into its columns, so the plain layer computes what the kept one does with the smoothing applied to x."""
    import comfy_kitchen as ck
    import torch
    from safetensors.torch import save_file

    from backend.worker import quantized

    g = torch.Generator().manual_seed(0)
    w, s = torch.randn(32, 64, generator=g), torch.rand(64, generator=g) + 0.5
    with ck.use_backend("eager"):
        tensors, _, _ = file_fixtures.quantize_comfy({"proj.weight": w}, {"proj": "nvfp4"})
        save_file({**tensors, "proj.pre_quant_scale": s}, str(tmp_path / "awq.safetensors"))
        sd, extras = quantized.state_dict(str(tmp_path / "awq.safetensors"), "", torch.float32)
        assert set(sd) == {"proj.weight"} and torch.equal(extras["proj"]["pre_quant_scale"], s)
        kept = torch.nn.Linear(64, 32, bias=False)
        kept.weight = torch.nn.Parameter(sd["proj.weight"], requires_grad=False)
        model = torch.nn.ModuleDict({"proj": kept})
        quantized.finish(model, extras)
        plain = quantized.dequantized(sd, extras)["proj.weight"]
        x = torch.randn(5, 64, generator=g)
        with torch.no_grad():
            want = kept(x)
            assert torch.allclose(want, x @ plain.T, atol=1e-5), "smoothing kept either way"
            assert not torch.allclose(x @ sd["proj.weight"].dequantize().T, x @ plain.T, atol=1e-3)
            notes: list[str] = []
            quantized.for_device(model, "tpu", torch.float32, notes.append, "proj")  # a TPU: nvfp4 at load
            assert type(model["proj"]) is torch.nn.Linear and torch.allclose(model["proj"](x), want, atol=1e-5)
            assert notes and "1 quantized layers dequantized at load" in notes[0], notes
