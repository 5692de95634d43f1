"""The VAE decode's peak host memory per output pixel, for the pixel budget (backend/families/vaes.py DECODE_BYTES).

Each VAE is built at its published size (backend/families/*/configs/*/vae/config.json) with random weights, in
float32 on the CPU, in a fresh process per measurement; one image (or video) is decoded at three small sizes and
the peak RSS above the resident set just before the decode is read from the kernel (VmHWM, reset through
/proc/self/clear_refs). A line through the three points gives the bytes per pixel (its slope) and the fixed cost.
Run: python -m bench.vae_memory (about 2 minutes on one core; at most about 4 GB at once).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (name, config, pixel sides, frames): the sides keep each decode well under 4 GB.
CASES = (
    ("FLUX.1 (ae)", "flux1/configs/flux1", (256, 384, 512), 1),
    ("FLUX.2", "flux2/configs/flux2", (256, 384, 512), 1),
    ("SD3", "sd3/configs/sd3", (256, 384, 512), 1),
    ("SDXL", "sdxl/configs/sdxl", (256, 384, 512), 1),
    ("Qwen-Image / Wan 2.1 (one frame)", "qwenimage/configs/qwenimage", (256, 384, 512), 1),
    ("Wan 2.1 (5 frames)", "wan/configs/wan21-t2v-1.3b", (128, 192, 256), 5),
    ("Wan 2.2 5B (one frame)", "wan/configs/wan22-ti2v-5b", (256, 384, 512), 1),
    ("Wan 2.2 5B (5 frames)", "wan/configs/wan22-ti2v-5b", (128, 192, 256), 5),
)


def _kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024


def one(config: str, side: int, frames: int) -> int:
    """Peak bytes above the resident set of one decode of a `side`² image (or `frames` frames), in this process."""
    import diffusers
    import torch

    torch.set_num_threads(1)
    folder = ROOT / "backend" / "families" / config / "vae"
    cls = getattr(diffusers, json.loads((folder / "config.json").read_text())["_class_name"])
    torch.manual_seed(0)
    vae = cls.from_config(cls.load_config(str(folder))).eval()
    cfg = vae.config
    if "z_dim" in cfg:  # Wan's causal 3D VAE: [B, C, 1 + (F - 1) / 4, h, w]
        scale = cfg.get("scale_factor_spatial", 8)
        z = torch.randn(1, cfg.z_dim, 1 + (frames - 1) // 4, side // scale, side // scale)
    else:
        scale = 2 ** (len(cfg.block_out_channels) - 1)
        z = torch.randn(1, cfg.latent_channels, side // scale, side // scale)
    with torch.inference_mode():
        vae.decode(z[..., :8, :8] if z.ndim == 4 else z[..., :2, :2])  # first-call allocations, not the decode's
        Path("/proc/self/clear_refs").write_text("5")
        before = _kib("VmRSS")
        vae.decode(z)
    return _kib("VmHWM") - before


def main() -> None:
    """Measures every case in fresh processes and prints a Markdown table."""
    print("| VAE | sizes | peak above resident (MB) | bytes per pixel | fixed (MB) |")
    print("|---|---|---|---|---|")
    for name, config, sides, frames in CASES:
        peaks = []
        for side in sides:
            out = subprocess.run([sys.executable, "-m", "bench.vae_memory", config, str(side), str(frames)],
                                 cwd=ROOT, capture_output=True, text=True, check=True)
            peaks.append(int(out.stdout.split()[-1]))
        pixels = [s * s * frames for s in sides]
        n = len(pixels)
        mx, my = sum(pixels) / n, sum(peaks) / n
        slope = sum((x - mx) * (y - my) for x, y in zip(pixels, peaks, strict=True)) / sum((x - mx) ** 2 for x in pixels)
        print(f"| {name} | {', '.join(f'{s}²' for s in sides)}{f' × {frames} frames' if frames > 1 else ''} | "
              f"{', '.join(f'{p / 1e6:.0f}' for p in peaks)} | {slope:,.0f} | {(my - slope * mx) / 1e6:.0f} |",
              flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 4:
        print(one(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
    else:
        main()
