"""The kinds of VAE the families decode with: how a VAE file of each kind is recognised, its latent channels,
its config sizes and how the worker reads it (the loader layout: worker/loading.py)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Shapes, count, groups


@dataclass(frozen=True)
class VaeKind:
    id: str  # "vae-ldm"
    layout: str  # how the worker reads its files


KINDS = {k.id: k for k in (
    VaeKind("vae-ldm", "ldm-vae"),  # AutoencoderKL in the LDM layout (SD3, SDXL, FLUX.1)
    VaeKind("vae-flux2", "flux2-vae"),  # the LDM layout plus batch-norm statistics of the latents
    VaeKind("vae-wan", "wan-vae"),  # Wan's causal 3D VAE: Wan 2.1's (Qwen-Image, Wan 2.2 A14B), Wan 2.2 5B's
    # Qwen-Image 2.1's 16x RGBA VAE: Wan 2.2's residual layout, one more level, 1-frame (2D) convolutions
    VaeKind("vae-qwenimage21", "qwenimage21-vae"),
    VaeKind("vae-ltx2", "ltx2-vae"),  # LTX-2's video VAE (32x spatial, 8x temporal), in Lightricks' names
    VaeKind("vae-minimax-h3", "minimax-h3-vae"),  # MiniMax H3's video VAE (diffusers folders only for now)
)}
# The decode's peak memory above the loaded VAE, in bytes per output pixel in float32 (about half in bfloat16 and
# float16): bench/vae_memory.py, each published config with random weights on the CPU, the slope of the peak RSS
# through three small sizes (bench/README.md has the table). By layout: "ldm-vae" is the largest of FLUX.1's ae,
# SD3's and SDXL's (one decoder design, blocks of 128-512 channels); Wan's one frame (Qwen-Image's images).
DECODE_BYTES = {"ldm-vae": 3_700, "flux2-vae": 3_300, "wan-vae": 8_300, "wan22-vae": 7_600}
# Wan's video decode, per pixel of one frame, whatever the frame count (it decodes one latent frame, 4 frames, at
# a time, its causal convolutions keeping 2 frames of their input).
VIDEO_DECODE_BYTES = {"wan-vae": 18_500, "wan22-vae": 21_100}
LTX2_KEY = "decoder.conv_in.conv.weight"
WAN22_KEY = "encoder.downsamples.0.downsamples.0.residual.0.gamma"  # Wan 2.2's VAE: residual down/up blocks


def recognise(s: Shapes) -> str | None:
    """The VAE kind the shapes hold, None when they hold none."""
    if "encoder.conv_in.weight" in s and "decoder.conv_out.weight" in s and "encoder.down.0.block.0.conv1.weight" in s:
        return "vae-flux2" if "bn.running_mean" in s else "vae-ldm"
    if "encoder.conv1.weight" in s and "decoder.head.2.weight" in s and "conv2.weight" in s:
        return "vae-qwenimage21" if WAN22_KEY in s and s["encoder.conv1.weight"][2] == 1 else "vae-wan"
    if len(s.get(LTX2_KEY, ())) == 5 and "per_channel_statistics.mean-of-means" in s:  # causal 3D convolutions
        return "vae-ltx2"
    return None


def layout(kind: str, s: Shapes) -> str:
    """How the worker reads the file: its kind's layout; Wan 2.2's VAE (nested residual blocks, 12 channels of
    2x2 patched pixels) has a layout of its own."""
    return "wan22-vae" if kind == "vae-wan" and WAN22_KEY in s else KINDS[kind].layout


def width(kind: str, s: Shapes) -> int:
    """The VAE's latent channels."""
    if kind in ("vae-wan", "vae-qwenimage21"):
        return s["conv2.weight"][0]
    if kind == "vae-ltx2":
        return s[LTX2_KEY][1]
    return s["decoder.conv_in.weight"][1]


def sizes(kind: str, s: Shapes, published: dict) -> dict:
    """Config sizes from the tensors, laid over the published VAE's config."""
    if kind == "vae-wan":
        z = s["conv2.weight"][0]
        out = {"base_dim": s["encoder.conv1.weight"][0], "z_dim": z}
        if WAN22_KEY in s:  # Wan 2.2's: its decoder has its own width (256 where the encoder has 160)
            out.update(is_residual=True, decoder_base_dim=s["decoder.head.0.gamma"][0])
        if z != published["z_dim"]:  # the published latent statistics are for its own channels
            out.update(latents_mean=[0.0] * z, latents_std=[1.0] * z)
        return out
    if kind == "vae-qwenimage21":
        return _qwenimage21_sizes(s, published)
    if kind == "vae-ltx2":
        return _ltx2_sizes(s, published)
    levels = count(s, "encoder.down.")
    channels = [s[f"encoder.down.{i}.block.0.conv2.weight"][0] for i in range(levels)]
    return {"block_out_channels": channels, "layers_per_block": count(s, "encoder.down.0.block."),
            "latent_channels": s["decoder.conv_in.weight"][1], "norm_num_groups": groups(channels),
            "down_block_types": ["DownEncoderBlock2D"] * levels, "up_block_types": ["UpDecoderBlock2D"] * levels,
            "use_quant_conv": "quant_conv.weight" in s, "use_post_quant_conv": "post_quant_conv.weight" in s,
            "mid_block_add_attention": "encoder.mid.attn_1.q.weight" in s}


def _ltx2_sizes(s: Shapes, published: dict) -> dict:
    """LTX-2's video VAE (AutoencoderKLLTX2Video) from Lightricks' flat stages, as diffusers' converter maps them:
    the encoder's down_blocks 0, 2, 4, 6 are res groups, 1, 3, 5, 7 their downsamplers, 8 the middle; the
    decoder's up_blocks 0 is the middle, then an upsampler and a res group for each level. A downsampler's conv
    gives its level's width over the space-to-depth factor (8: spatiotemporal, 4: spatial, 2: temporal); an
    upsampler's gives the next group's width times that factor. The decoder's lists are in the encoder's order
    (diffusers reverses them), but for upsample_type."""
    def first_in(stage: str) -> int:  # the input width of a stage: its first conv's
        res = f"{stage}.res_blocks.0.conv1.conv.weight"
        return s[res if res in s else f"{stage}.conv.conv.weight"][1]

    kinds = {8: "spatiotemporal", 4: "spatial", 2: "temporal"}
    widths, layers, scaling, down = [], [], [], list(published["downsample_type"])
    for i in range(4):
        layers.append(count(s, f"encoder.down_blocks.{2 * i}.res_blocks."))
        width = first_in(f"encoder.down_blocks.{2 * i + 2}")
        conv = s.get(f"encoder.down_blocks.{2 * i + 1}.conv.conv.weight")
        scaling.append(conv is not None)
        if conv is not None:
            down[i] = kinds[width // conv[0]]
        widths.append(width)
    up_widths, up_layers, up_scaling, up_types, factors = [], [count(s, "decoder.up_blocks.0.res_blocks.")], [], \
        list(published["upsample_type"]), []
    for j in range(3):
        res = s[f"decoder.up_blocks.{2 * j + 2}.res_blocks.0.conv1.conv.weight"][0]
        conv = s.get(f"decoder.up_blocks.{2 * j + 1}.conv.conv.weight")
        up_scaling.append(conv is not None)
        factor = conv[1] // res if conv is not None else 1
        if conv is not None:
            up_types[j] = kinds[conv[0] * factor // conv[1]]
        up_widths.append(res * factor)
        factors.append(factor)
        up_layers.append(count(s, f"decoder.up_blocks.{2 * j + 2}.res_blocks."))
    patch = int(round((s["encoder.conv_in.conv.weight"][1] // 3) ** 0.5))
    return {"latent_channels": s[LTX2_KEY][1], "patch_size": patch, "block_out_channels": widths,
            "layers_per_block": [*layers, count(s, "encoder.down_blocks.8.res_blocks.")],
            "spatio_temporal_scaling": scaling, "downsample_type": down,
            "decoder_block_out_channels": up_widths[::-1], "decoder_layers_per_block": up_layers[::-1],
            "decoder_spatio_temporal_scaling": up_scaling[::-1], "upsample_type": up_types,  # decoder order
            "upsample_factor": factors[::-1],
            "timestep_conditioning": "decoder.timestep_scale_multiplier" in s}


def _qwenimage21_sizes(s: Shapes, published: dict) -> dict:
    """Qwen-Image 2.1's VAE (ComfyUI's layout: Wan 2.2's nested blocks): widths, levels, blocks per level and
    which levels halve time (those with a time_conv) from the tensors."""
    base, z, levels = s["encoder.conv1.weight"][0], s["conv2.weight"][0], count(s, "encoder.downsamples.")
    first = "encoder.downsamples.{}.downsamples.0.residual.2.weight"
    out = {"base_dim": base, "decoder_base_dim": s["decoder.head.0.gamma"][0], "z_dim": z,
           "in_channels": s["encoder.conv1.weight"][1], "out_channels": s["decoder.head.2.weight"][0],
           "dim_mult": [s[first.format(i)][0] // base for i in range(levels)],
           "num_res_blocks": sum(f"encoder.downsamples.0.downsamples.{j}.residual.2.weight" in s for j in range(8)),
           "temperal_downsample": [any(k.startswith(f"encoder.downsamples.{i}.") and ".time_conv." in k for k in s)
                                   for i in range(levels - 1)]}
    if z != published["z_dim"]:  # the published latent statistics are for its own channels
        out.update(latents_mean=[0.0] * z, latents_std=[1.0] * z)
    return out


def config_layout(config: dict) -> str:
    """A VAE's layout from its config.json (its diffusers class; Wan 2.2's residual blocks)."""
    if "z_dim" in config:
        return "wan22-vae" if config.get("is_residual") else "wan-vae"
    return "flux2-vae" if config.get("_class_name") == "AutoencoderKLFlux2" else "ldm-vae"


# the VAE classes whose decode was measured (bench/vae_memory.py), by the layout config_layout gives them
MEASURED = {"AutoencoderKL": "ldm-vae", "AutoencoderKLFlux2": "flux2-vae", "AutoencoderKLWan": "wan-vae",
            "AutoencoderKLQwenImage": "wan-vae"}


def decode_bytes(config: dict, video: bool = False) -> int:
    """The decode's peak bytes per output pixel in float32 for the VAE of `config` (a video's: per frame pixel).
    A VAE class not measured yet (LTX-2's, Qwen-Image 2.1's, MiniMax H3's) counts as the largest measured one, so
    the budget errs on the side of a refusal rather than of the OOM killer."""
    cls = config.get("_class_name", "AutoencoderKL")
    if cls not in MEASURED:
        return max(VIDEO_DECODE_BYTES.values()) if video else max(DECODE_BYTES.values())
    found = config_layout(config)
    return (VIDEO_DECODE_BYTES.get(found) if video else None) or DECODE_BYTES[found]
