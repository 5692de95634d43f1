"""The full-size FLUX.1 transformer the MFU figure runs with random weights (no download): shapes only.

Shared by the plain baseline (bench/plain.py, which must stay free of this pack's code) and bench/mfu.py.
torch is passed in, so importing this module imports nothing.
"""

from __future__ import annotations

import json
import os

# FLUX.1-schnell's transformer/config.json (FLUX.1-dev differs only by guidance_embeds=True): 11.9 B parameters.
FLUX1_CONFIG = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "guidance_embeds": False,
    "axes_dims_rope": (16, 56, 56),
}

# Dense bf16 tensor-core peak (TFLOP/s, no sparsity) by a word of torch.cuda.get_device_name(); first match wins.
PEAK_BF16_TFLOPS = (
    ("H200", 989.4), ("H100 PCIe", 756.0), ("H100", 989.4), ("GH200", 989.4), ("B200", 2250.0),
    ("A100", 312.0), ("L40S", 362.1), ("L4", 121.0), ("A10G", 70.0), ("RTX 4090", 165.2), ("RTX 6000 Ada", 364.2),
)


def flux1_config() -> dict:
    """FLUX1_CONFIG, with BENCH_MFU_CONFIG_OVERRIDE (JSON) applied: only to check the code path with a small
    transformer on a machine without a GPU (BENCH_MFU_FORCE=1); never set for real figures."""
    return {**FLUX1_CONFIG, **json.loads(os.environ.get("BENCH_MFU_CONFIG_OVERRIDE") or "{}")}


def peak_tflops(device_name: str) -> float | None:
    return next((peak for word, peak in PEAK_BF16_TFLOPS if word in device_name), None)


def flux_inputs(torch, width: int, height: int, text_tokens: int, dtype, device) -> dict:
    """The transformer's inputs for one denoising step at width x height, as FluxPipeline builds them."""
    h, w = height // 16, width // 16  # VAE factor 8, then 2x2 packing
    image_ids = torch.zeros(h, w, 3)
    image_ids[..., 1] = torch.arange(h)[:, None]
    image_ids[..., 2] = torch.arange(w)[None, :]
    cfg = flux1_config()
    return {
        "hidden_states": torch.randn(1, h * w, cfg["in_channels"], dtype=dtype, device=device),
        "encoder_hidden_states": torch.randn(1, text_tokens, cfg["joint_attention_dim"], dtype=dtype, device=device),
        "pooled_projections": torch.randn(1, cfg["pooled_projection_dim"], dtype=dtype, device=device),
        "timestep": torch.tensor([1.0], dtype=dtype, device=device),
        "img_ids": image_ids.reshape(h * w, 3).to(device=device, dtype=dtype),
        "txt_ids": torch.zeros(text_tokens, 3, dtype=dtype, device=device),
        "return_dict": False,
    }
