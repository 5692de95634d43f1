"""The VAE decode's peak host memory per output pixel, for the pixel budget (backend/families/vaes.py DECODE_BYTES),
and the sound decode's per second of sound (vaes.SOUND_DECODE_BYTES).

Each VAE is built at its published size (backend/families/*/configs/*/vae/config.json) with random weights, in
float32 on the CPU, in a fresh process per measurement; one image (or video, or sound) is decoded at three small
sizes and the peak RSS above the resident set just before the decode is read from the kernel (VmHWM, reset through
/proc/self/clear_refs). A line through the three points gives the bytes per pixel (or per second; its slope) and
the fixed cost. The 2026 VAEs (LTX-2's, MiniMax H3's, Qwen-Image 2.1's, the sound decoders) are built without their
encoders, which a decode never runs, on the meta device first with their weights then drawn (std 0.02), so that
only the decoder's weights take memory; MiniMax H3's ViT decoder keeps 2 of its 36 layers (each layer's
activations are freed before the next, so the peak above the resident set does not depend on the depth; the 36
would take 9.7 GB).
Run: python -m bench.vae_memory [NAME] (the cases whose name holds NAME; all: about half an hour on the shared
2-core host; at most about 4 GB at once).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (name, config, points, what): each point a (side, latent frames or 0) of a decode (or seconds of sound for
# "sound"), kept well under 4 GB and a minute. `what`: "image", "video" (per pixel of every frame), "sound".
_SIDES = ((256, 0), (384, 0), (512, 0))
_SECONDS = ((0.4, 0), (0.8, 0), (1.2, 0))  # whole latents at LTX-2's 25 and MiniMax H3's 40 a second
CASES = (
    ("FLUX.1 (ae)", "flux1/configs/flux1", _SIDES, "image"),
    ("FLUX.2 (FLUX.3's, Ideogram 4's)", "flux2/configs/flux2", _SIDES, "image"),
    ("SD3", "sd3/configs/sd3", _SIDES, "image"),
    ("SDXL", "sdxl/configs/sdxl", _SIDES, "image"),
    ("Qwen-Image (Krea 2's) / Wan 2.1 (one frame)", "qwenimage/configs/qwenimage", _SIDES, "image"),
    ("Wan 2.1 (5 frames)", "wan/configs/wan21-t2v-1.3b", ((128, 2), (192, 2), (256, 2)), "video"),
    ("Wan 2.2 5B (one frame)", "wan/configs/wan22-ti2v-5b", _SIDES, "image"),
    ("Wan 2.2 5B (5 frames)", "wan/configs/wan22-ti2v-5b", ((128, 2), (192, 2), (256, 2)), "video"),
    ("Qwen-Image 2.1", "qwenimage21/configs/qwenimage21", _SIDES, "image"),
    # LTX-2's: larger, as its largest conv's weights (1024 -> 4096 channels, 453 MB) are copied into the CPU
    # kernel's layout for the call, which at 512² is more than the activations
    ("LTX-2 (one frame)", "ltx2/configs/ltx-2.3", ((768, 0), (896, 0), (1024, 0)), "image"),
    ("LTX-2 (9, 17, 25 frames)", "ltx2/configs/ltx-2.3", ((256, 2), (256, 3), (256, 4)), "video"),
    ("MiniMax H3 (one clip, 22 frames)", "minimax_h3/configs/minimax_h3", ((96, 7), (128, 7), (160, 7)), "video"),
    ("MiniMax H3 (1, 2, 3 clips)", "minimax_h3/configs/minimax_h3", ((96, 7), (96, 12), (96, 17)), "video"),
    # tiled as Sample Video tiles it, its 256² tiles with 64 pixels of overlap scaled to 64² and 16 (the same
    # share of overlap; a tile's own decode is then a fixed cost, as diffusers' tiles are)
    ("MiniMax H3 tiled (one clip)", "minimax_h3/configs/minimax_h3:tiled", ((128, 7), (160, 7), (192, 7)), "video"),
    ("LTX-2 sound (audio VAE + vocoder)", "ltx2/configs/ltx-2.3", _SECONDS, "sound"),
    ("LTX-2.3 sound (vocoder with BWE)", "ltx2/configs/ltx-2.3:bwe", _SECONDS, "sound"),
    ("MiniMax H3 sound (audio VAE)", "minimax_h3/configs/minimax_h3", _SECONDS, "sound"),
)
ENCODERLESS = ("AutoencoderKLQwenImage21", "AutoencoderKLLTX2Video", "AutoencoderKLMiniMaxH3")


def _kib(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024


def _build(cls, folder: Path, **changes):
    """A model of `folder`'s config (with `changes`) without its encoder: built on the meta device, then its
    weights drawn on the CPU (buffers stay as built: they are computed tables, not weights)."""
    import accelerate
    import torch

    with accelerate.init_empty_weights(include_buffers=False):
        model = cls.from_config({**cls.load_config(str(folder)), **changes})
    for name in ("encoder", "quant_conv"):
        if isinstance(getattr(model, name, None), torch.nn.Module):
            setattr(model, name, torch.nn.Identity())
    for module in model.modules():
        for key, p in list(module._parameters.items()):
            if p is not None and p.is_meta:
                module._parameters[key] = torch.nn.Parameter(torch.empty(p.shape).normal_(0, 0.02),
                                                             requires_grad=False)
    return model.eval()


def _sound(config: str, seconds: float):
    """The sound decode of `seconds` of sound: its latents and the decode (LTX-2: audio VAE then vocoder)."""
    import diffusers
    import torch

    folder = ROOT / "backend" / "families" / config.split(":")[0]
    if "ltx2" in config:
        audio = _build(diffusers.AutoencoderKLLTX2Audio, folder / "audio_vae")
        if config.endswith(":bwe"):  # LTX-2.3's vocoder with bandwidth extension: diffusers' defaults are its
            vocoder = _build(diffusers.pipelines.ltx2.LTX2VocoderWithBWE, folder / "vocoder",
                             **{"_class_name": "LTX2VocoderWithBWE", **_bwe()})
        else:
            vocoder = _build(diffusers.pipelines.ltx2.LTX2Vocoder, folder / "vocoder")
        c = audio.config
        latents = c.sample_rate // c.mel_hop_length // audio.temporal_compression_ratio  # 25 a second
        z = torch.randn(1, c.latent_channels, round(latents * seconds), c.mel_bins // audio.mel_compression_ratio)
        return z, lambda z: vocoder(audio.decode(z, return_dict=False)[0])
    audio = _build(diffusers.AutoencoderKLMiniMaxH3Audio, folder / "audio_vae")
    z = torch.randn(2, audio.config.latent_channels, round(40 * seconds))  # 40 latents a second; stereo as a batch of 2
    return z, lambda z: audio.decode(z, return_dict=False)[0]


def _bwe() -> dict:
    """diffusers' LTX2VocoderWithBWE defaults (LTX-2.3's published vocoder), as families/ltx2/files.py has them."""
    sys.path.insert(0, str(ROOT))
    from backend.families.ltx2.files import BWE

    return {"hidden_channels": 1536, **BWE}


def one(config: str, side: float, frames: int) -> tuple[int, float]:
    """Peak bytes above the resident set of one decode of a `side`² image (or of `frames` latent frames; of `side`
    seconds of sound for a "sound" config), in this process, and the decode's output size: its pixels (every
    frame's) or seconds."""
    import diffusers
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    sound = config.startswith("sound:")
    if sound:
        z, decode = _sound(config.removeprefix("sound:"), side)
        small = z[..., :4, :] if z.ndim == 4 else z[..., :4]
    else:
        side, tiled = int(side), config.endswith(":tiled")
        folder = ROOT / "backend" / "families" / config.removesuffix(":tiled") / "vae"
        cls = getattr(diffusers, json.loads((folder / "config.json").read_text())["_class_name"])
        if cls.__name__ in ENCODERLESS:
            vae = _build(cls, folder, **({"decoder_num_layers": 2} if "minimax" in config else {}))
        else:
            vae = cls.from_config(cls.load_config(str(folder))).eval()
        if tiled:
            vae.enable_tiling(64, 64, 16, 16)
        elif hasattr(vae, "disable_tiling"):  # as the worker decodes a video it does not tile
            vae.disable_tiling()
        cfg = vae.config
        if cls.__name__ in ("AutoencoderKLLTX2Video", "AutoencoderKLMiniMaxH3"):  # [B, C, F, h, w]
            # LTX-2's 32x: its patches and its spatial upsamplers (diffusers' spatial_compression_ratio says 64)
            scale = cfg.patch_size * 2 ** sum(cfg.decoder_spatio_temporal_scaling) if "patch_size" in cfg \
                else vae.spatial_compression_ratio
            z = torch.randn(1, cfg.latent_channels, max(1, frames), side // scale, side // scale)
        elif "z_dim" in cfg:  # Wan's causal 3D VAE: [B, C, 1 + (F - 1) / 4, h, w]
            scale = cfg.get("scale_factor_spatial", 8)
            z = torch.randn(1, cfg.z_dim, max(1, frames), side // scale, side // scale)
        else:
            scale = 2 ** (len(cfg.block_out_channels) - 1)
            z = torch.randn(1, cfg.latent_channels, side // scale, side // scale)
        small = z[..., :8, :8] if z.ndim == 4 else z[..., :2, :2]

        def decode(z):
            return vae.decode(z, return_dict=False)[0]
    with torch.inference_mode():
        decode(small)  # first-call allocations, not the decode's
        Path("/proc/self/clear_refs").write_text("5")
        before = _kib("VmRSS")
        out = decode(z)
    size = side if sound else out.shape[-1] * out.shape[-2] * (out.shape[2] if out.ndim == 5 else 1)
    return _kib("VmHWM") - before, size


def main(only: str = "") -> None:
    """Measures every case (or those whose name has `only`) in fresh processes and prints a Markdown table."""
    print("| VAE | sizes | peak above resident (MB) | bytes per pixel (per second of sound) | fixed (MB) |")
    print("|---|---|---|---|---|")
    for name, config, points, what in CASES:
        if only not in name:
            continue
        peaks, sizes = [], []
        for side, frames in points:
            out = subprocess.run([sys.executable, "-m", "bench.vae_memory",
                                  f"sound:{config}" if what == "sound" else config, str(side), str(frames)],
                                 cwd=ROOT, capture_output=True, text=True, check=True)
            peak, size = out.stdout.split()[-2:]
            peaks.append(int(peak))
            sizes.append(float(size))
        n = len(sizes)
        mx, my = sum(sizes) / n, sum(peaks) / n
        slope = sum((x - mx) * (y - my) for x, y in zip(sizes, peaks, strict=True)) / sum((x - mx) ** 2 for x in sizes)
        shown = (", ".join(f"{s} s" for s, _ in points) if what == "sound" else
                 ", ".join(f"{s}²" + (f" × {f}" if what == "video" else "") for s, f in points))
        print(f"| {name} | {shown}{' latent frames' if what == 'video' else ''} | "
              f"{', '.join(f'{p / 1e6:.0f}' for p in peaks)} | {slope:,.0f} | {(my - slope * mx) / 1e6:.0f} |",
              flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 4:
        print(*one(sys.argv[1], float(sys.argv[2]), int(sys.argv[3])))
    else:
        main(sys.argv[1] if len(sys.argv) == 2 else "")
