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
