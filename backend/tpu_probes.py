"""The code `tpu-check` runs in processes of their own (a failure or an abort there ends them alone): each prints
its findings on its last line. Kept apart from tpu_check.py so that module stays readable."""

# A seeded draw of an unaligned shape on the device and on the CPU.
_RNG_PROBE = """
import sys, torch
shape = (1, 4, 13, 13)
cpu = torch.randn(shape, generator=torch.Generator("cpu").manual_seed(7))
dev = torch.randn(shape, generator=torch.Generator(sys.argv[1]).manual_seed(7), device=sys.argv[1]).cpu()
print(float((dev - cpu).abs().max()), bool(torch.isfinite(dev).all()))
"""

# SDXL's time_proj (Timesteps(320, flip_sin_to_cos=True, freq_shift=0)) in one TorchTPU eager mode, against the CPU.
_CAT_PROBE = """
import sys, torch
from diffusers.models.embeddings import get_timestep_embedding
torch.tpu.eager_mode = getattr(torch.tpu.EagerMode, sys.argv[2])
t = torch.tensor([999.0, 999.0])
want = get_timestep_embedding(t, 320, flip_sin_to_cos=True, downscale_freq_shift=0)
got = get_timestep_embedding(t.to(sys.argv[1]), 320, flip_sin_to_cos=True, downscale_freq_shift=0).cpu()
print(float((got - want).abs().max()))
"""

# cos of 4096 float64 values on the device, against the CPU in float64, and float32's own error for scale.
_FLOAT64_PROBE = """
import sys, torch
x = torch.linspace(0, 4096, 4096, dtype=torch.float64)
want = torch.cos(x * 1.0001)
got = torch.cos(x.to(sys.argv[1]) * 1.0001).cpu()
print(got.dtype, float((got.double() - want).abs().max()), float((torch.cos(x.float() * 1.0001).double() - want).abs().max()))
"""

# ComfyUI's quantized layers on the device (issue 33): tiny FLUX's T5 encoder (argv[2]) written as ComfyUI writes a
# quantized file (comfy_quant markers), its layers quantized by comfy-kitchen's own quantize (attention int8 per
# row, feed-forward in nvfp4, its output in fp8); read back by the pack's reader, made ready for the device
# (worker/quantized.py: finish, for_device) and run there, against the same weights dequantized by comfy-kitchen on
# the CPU; and one int8 ConvRot layer (256 input features) as a TPU runs it (plain buffers). Prints both relative
# errors and how many layers stayed quantized as comfy-kitchen tensors, as plain buffers, and were dequantized.
_QUANT_PROBE = """
import json, sys, tempfile, torch
sys.path.insert(0, sys.argv[4])  # the pack
import comfy_kitchen as ck
from comfy_kitchen.tensor import QuantizedTensor
from safetensors.torch import save_file
from transformers import T5EncoderModel
from backend.worker import quantized
device, folder, kind = sys.argv[1], sys.argv[2], sys.argv[3]
model = T5EncoderModel.from_pretrained(folder, dtype=torch.float32).eval()
plan = {"float8_e4m3fn": ("TensorCoreFP8Layout", {}), "nvfp4": ("TensorCoreNVFP4Layout", {}),
        "int8_tensorwise": ("TensorWiseINT8Layout", {"per_channel": True})}
sd = {}
with ck.use_backend("eager"):
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            fmt = "nvfp4" if ".wi" in name else "float8_e4m3fn" if name.endswith(".wo") else "int8_tensorwise"
            qt = QuantizedTensor.from_float(m.weight.detach(), plan[fmt][0], **plan[fmt][1])
            for suffix, t in qt.layout_cls.state_dict_tensors(qt._qdata, qt._params).items():
                sd[f"{name}.weight{suffix}"] = t.contiguous()
            sd[f"{name}.comfy_quant"] = torch.tensor(list(json.dumps({"format": fmt}).encode()), dtype=torch.uint8)
    path = tempfile.mkdtemp() + "/t5_quantized.safetensors"
    save_file(sd, path)
    read, extras = quantized.state_dict(path, "", torch.float32)
    ref = T5EncoderModel.from_pretrained(folder, dtype=torch.float32).eval()
    ref.load_state_dict(quantized.dequantized(read, extras), strict=False)
    model.load_state_dict(read, strict=False, assign=True)
    quantized.finish(model, extras)
    kept = quantized.count(model)
    said = []
    quantized.for_device(model, kind, torch.float32, said.append, "t5")
    plain = sum(isinstance(m, quantized.PlainQuantLinear) for m in model.modules())
    ids = torch.tensor([[5, 17, 42, 99, 1]])
    with torch.no_grad():
        want = ref(input_ids=ids)[0]
        got = model.to(device)(input_ids=ids.to(device))[0].cpu()
        w, x = torch.randn(64, 256), torch.randn(3, 256)
        rot = QuantizedTensor.from_float(w, "TensorWiseINT8Layout", per_channel=True, convrot=True, convrot_groupsize=256)
        layer = quantized.PlainQuantLinear(rot._qdata, rot._params.scale, None, 256).to(device)
        exact = x @ rot.dequantize().T
        rot_err = float((layer(x.to(device)).cpu() - exact).abs().max() / exact.abs().max())
err = float((got - want).abs().max() / want.abs().max())
dequantized = sum(int(s.split(":")[1].split()[0]) for s in said)
print(err, rot_err, kept - plain - dequantized, plain, dequantized)
"""

QUANT_TOLERANCE = 1e-2  # the quantized step's relative error: float32 matmuls on a TPU may run in bfloat16 passes


def quant_report(where: str, found: list[str], why: str) -> str:
    """The quantized step's line from _QUANT_PROBE's words; fails (AssertionError) beyond QUANT_TOLERANCE."""
    if len(found) != 5 or not max(map(float, found[:2])) <= QUANT_TOLERANCE:
        raise AssertionError(f"on {where}: {' '.join(found) or why} (relative errors: T5, ConvRot)")
    return (f"tiny FLUX's T5 in int8 + nvfp4 + fp8 and an int8 ConvRot layer on {where}: {found[2]} layers kept as "
            f"comfy-kitchen tensors, {found[3]} as plain buffers, {found[4]} dequantized at load; within "
            f"{max(map(float, found[:2])):.1g} of comfy-kitchen's dequantized weights")
