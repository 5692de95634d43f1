"""The kinds of VAE the families decode with: how a VAE file of each kind is recognised, its latent channels,
its config sizes and how the worker reads it (the loader layout: worker/loading.py)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Shapes, count, groups, head_dim


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
    # LTX-2's audio VAE (2D causal convolutions over mel frames), read as a family part (ltx2/files.py): LTX-2.5's
    # file of it (`audio_vae.`, its vocoder beside it) is recognised so that the vae lists offer it
    VaeKind("vae-ltx2-audio", "ltx2-audio-vae"),
    # MiniMax H3's video VAE (a causal 3D encoder, a ViT decoder: MiniMax's names) and its audio VAE (ComfyUI's
    # layout: diffusers' names with the weight norms folded): families/minimax_h3/convert.py reads both
    VaeKind("vae-minimax-h3", "minimax-h3-vae"),
    VaeKind("vae-minimax-h3-audio", "minimax-h3-audio-vae"),
)}
# The loader layouts that the families' convert.py read themselves (their VAE_CONVERTERS; torch, worker only): plain
# float weights in, so the worker dequantizes ComfyUI's quantized layers in them at load (MiniMax H3's int8 ConvRot
# video VAE), and offload 'auto' counts them at that size. tests/test_quantized.py checks it is that table's keys.
CONVERTED = frozenset({"flux2-vae", "wan-vae", "wan22-vae", "qwenimage21-vae", "ltx2-connectors", "ltx2-vocoder",
                       "ltx2-audio-vae", "minimax-h3-vae", "minimax-h3-audio-vae"})
MINIMAX_H3_VIDEO = "decoder.register_tokens"  # the ViT decoder's register tokens: MiniMax H3's video VAE
MINIMAX_H3_AUDIO = ("pre_block.attn.q_bias", "dec_in_proj.weight")  # its audio VAE's attention projection
MINIMAX_H3_LATENTS_PER_SECOND = 40  # both released audio VAEs (32 kHz with hop 800; the tiny 8 kHz with hop 200)
# The decode's peak memory above the loaded VAE, in bytes per output pixel in float32 (about half in bfloat16 and
# float16): bench/vae_memory.py, each published config with random weights on the CPU, the slope of the peak RSS
# through three small sizes (bench/README.md has the table). By layout: "ldm-vae" is the largest of FLUX.1's ae,
# SD3's and SDXL's (one decoder design, blocks of 128-512 channels); Wan's one frame (Qwen-Image's and Krea 2's
# images; FLUX.3 and Ideogram 4 decode with FLUX.2's VAE); Qwen-Image 2.1's RGBA images. LTX-2's one frame and
# MiniMax H3's are the largest point's peak per pixel (their lines lie under fixed costs or scatter); MiniMax H3
# decodes no single frame: its figure is a frame's in a tiled clip (Sample Video's tiles), its untiled one below.
DECODE_BYTES = {"ldm-vae": 3_700, "flux2-vae": 3_300, "wan-vae": 8_300, "wan22-vae": 7_600, "qwenimage21-vae": 13_000,
                "ltx2-vae": 600, "minimax-h3-vae": 2_000}
# A video's decode, per pixel of one frame, whatever the frame count: Wan's decodes one latent frame (4 frames) at
# a time, its causal convolutions keeping 2 frames of their input; MiniMax H3's one clip of 7 latent frames
# (17 frames and the overlap the next clip blends) at a time.
VIDEO_DECODE_BYTES = {"wan-vae": 18_500, "wan22-vae": 21_100, "minimax-h3-vae": 8_100}
# LTX-2's video VAE decodes every latent frame at once (diffusers' framewise decoding is off): its figure is per
# pixel of every frame, so a frame costs more the more frames there are (decode_bytes multiplies).
WHOLE_VIDEO_DECODE_BYTES = {"ltx2-vae": 350}
# diffusers' tile sizes when tiled (tile_sample_min_height / _width; Wan's 256 every 192 where not listed): LTX-2's
# 512 every 448, and its frame-wise decode (use_framewise_decoding, which the worker turns on with its tiles) takes
# tile_sample_min_num_frames (16) and the one frame it blends at a time, so its tiles hold 17 frames, not all.
VIDEO_TILE, VIDEO_TILES, FRAME_TILES = 256, {"ltx2-vae": 512}, {"ltx2-vae": 16}
# The sound's decode (LTX-2: its audio VAE, then the vocoder; MiniMax H3: its audio VAE), bytes per second of
# sound in float32, by the class that makes the waveform: LTX-2's vocoder (24 kHz), LTX-2.3's files' vocoder with
# bandwidth extension (48 kHz), MiniMax H3's audio VAE (32 kHz, stereo as a batch of 2).
SOUND_DECODE_BYTES = {"LTX2Vocoder": 95_000_000, "LTX2VocoderWithBWE": 210_000_000, "AutoencoderKLMiniMaxH3Audio": 70_000_000}
LTX2_KEY = "decoder.conv_in.conv.weight"
WAN22_KEY = "encoder.downsamples.0.downsamples.0.residual.0.gamma"  # Wan 2.2's VAE: residual down/up blocks


def recognise(s: Shapes) -> str | None:
    """The VAE kind the shapes hold, None when they hold none."""
    if MINIMAX_H3_VIDEO in s and "decoder.x_embedder.weight" in s and "encoder.down.0.block.0.conv1.weight" in s:
        return "vae-minimax-h3"
    if all(k in s for k in MINIMAX_H3_AUDIO):
        return "vae-minimax-h3-audio"
    if "encoder.conv_in.weight" in s and "decoder.conv_out.weight" in s and "encoder.down.0.block.0.conv1.weight" in s:
        return "vae-flux2" if "bn.running_mean" in s else "vae-ldm"
    if "encoder.conv1.weight" in s and "decoder.head.2.weight" in s and "conv2.weight" in s:
        return "vae-qwenimage21" if WAN22_KEY in s and s["encoder.conv1.weight"][2] == 1 else "vae-wan"
    if len(s.get(LTX2_KEY, ())) == 5 and "per_channel_statistics.mean-of-means" in s:  # causal 3D convolutions
        return "vae-ltx2"
    if len(s.get(LTX2_KEY, ())) == 4 and "encoder.conv_in.conv.weight" in s:
        return "vae-ltx2-audio"
    return None


def layout(kind: str, s: Shapes) -> str:
    """How the worker reads the file: its kind's layout; Wan 2.2's VAE (nested residual blocks, 12 channels of
    2x2 patched pixels) has a layout of its own."""
    return "wan22-vae" if kind == "vae-wan" and WAN22_KEY in s else KINDS[kind].layout


def width(kind: str, s: Shapes) -> int:
    """The VAE's latent channels."""
    if kind in ("vae-wan", "vae-qwenimage21"):
        return s["conv2.weight"][0]
    if kind in ("vae-ltx2", "vae-ltx2-audio"):
        return s[LTX2_KEY][1]
    if kind == "vae-minimax-h3":
        return s["post_quant_conv.weight"][0]
    if kind == "vae-minimax-h3-audio":
        return s["dec_in_proj.weight"][1]
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
    if kind == "vae-minimax-h3":
        return _minimax_h3_sizes(s, published)
    if kind == "vae-minimax-h3-audio":
        return _minimax_h3_audio_sizes(s, published)
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


def _minimax_h3_sizes(s: Shapes, published: dict) -> dict:
    """MiniMax H3's video VAE: its encoder's widths and blocks, its ViT decoder's width, depth and feed-forward
    from the tensors; head counts and GroupNorm groups are in no tensor: the published head size and groups,
    fitted to narrower widths. (Its latent statistics are tensors of the file: the worker reads them.)"""
    levels = count(s, "encoder.down.")
    channels = [s[f"encoder.down.{i}.block.0.conv2.weight"][0] for i in range(levels)]
    dim = s["decoder.x_embedder.weight"][0]
    head = head_dim(dim, published["decoder_attention_head_dim"]) if dim != published["decoder_num_attention_heads"] \
        * published["decoder_attention_head_dim"] else published["decoder_attention_head_dim"]
    return {"block_out_channels": channels, "layers_per_block": count(s, "encoder.down.0.block."),
            "latent_channels": s["post_quant_conv.weight"][0], "in_channels": s["encoder.conv_in.weight"][1],
            "norm_num_groups": groups(channels, published["norm_num_groups"]),
            "decoder_num_layers": count(s, "decoder.transformer_blocks."), "decoder_attention_head_dim": head,
            "decoder_num_attention_heads": dim // head,
            "decoder_num_register_tokens": s[MINIMAX_H3_VIDEO][1],
            "decoder_ffn_mult": s["decoder.transformer_blocks.0.ff.w1.weight"][0] // (2 * dim)}


def _minimax_h3_audio_sizes(s: Shapes, published: dict) -> dict:
    """MiniMax H3's audio VAE: its encoder's and decoder's widths and strides from the tensors (each encoder
    block's last kernel is twice its stride; BigVGAN pairs a rate u with a kernel of 2u - u % 2), its sample rate
    from its 40 latents a second; the attention heads are in no tensor (the published head size, fitted)."""
    blocks = count(s, "encoder.block.") - 3  # the first convolution, then the strided blocks, then Snake and the last
    rates = [s[f"encoder.block.{i + 1}.block.4.weight"][2] // 2 for i in range(blocks)]
    ups = [s[f"decoder.ups.{i}.0.weight"][2] for i in range(count(s, "decoder.ups."))]
    kernels = count(s, "decoder.resblocks.") // len(ups)
    latent_dim = s["dec_in_proj.weight"][0]
    head = head_dim(latent_dim, published["latent_dim"] // published["num_attention_heads"])
    hop = 1
    for r in rates:
        hop *= r
    return {"encoder_dim": s["encoder.block.0.weight"][0], "encoder_rates": rates, "latent_dim": latent_dim,
            "latent_channels": s["dec_in_proj.weight"][1], "num_attention_heads": latent_dim // head,
            "decoder_dim": s["decoder.conv_pre.weight"][0], "decoder_rates": [(k + 1) // 2 for k in ups],
            "decoder_kernel_sizes": ups,
            "resblock_kernel_sizes": [s[f"decoder.resblocks.{j}.convs1.0.weight"][2] for j in range(kernels)],
            "resblock_dilation_sizes": published["resblock_dilation_sizes"][:kernels],
            "sampling_rate": MINIMAX_H3_LATENTS_PER_SECOND * hop}


def config_layout(config: dict) -> str:
    """A VAE's layout from its config.json (its diffusers class; Wan 2.2's residual blocks)."""
    cls = config.get("_class_name", "AutoencoderKL")
    if cls in _OWN_LAYOUT:
        return _OWN_LAYOUT[cls]
    if "z_dim" in config:
        return "wan22-vae" if config.get("is_residual") else "wan-vae"
    return "flux2-vae" if cls == "AutoencoderKLFlux2" else "ldm-vae"


_OWN_LAYOUT = {"AutoencoderKLQwenImage21": "qwenimage21-vae", "AutoencoderKLLTX2Video": "ltx2-vae",
               "AutoencoderKLMiniMaxH3": "minimax-h3-vae"}
# the VAE classes whose decode was measured (bench/vae_memory.py): every registered family's (a test holds it)
MEASURED = frozenset({"AutoencoderKL", "AutoencoderKLFlux2", "AutoencoderKLWan", "AutoencoderKLQwenImage",
                      *_OWN_LAYOUT})


def video_tile(config: dict) -> int:
    """The side of the VAE's square tiles in pixels when it decodes a video in tiles (diffusers' default)."""
    return VIDEO_TILES.get(config_layout(config), VIDEO_TILE)


def frame_tile(config: dict) -> int | None:
    """The frames one tile of a tiled decode holds where the VAE decodes them frame-wise (LTX-2's), else None."""
    found = FRAME_TILES.get(config_layout(config))
    return None if found is None else found + 1


def decode_bytes(config: dict, video: bool = False, frames: int = 1, tiled: bool = False) -> int:
    """The decode's peak bytes per output pixel in float32 for the VAE of `config` (a video's of `frames`: per
    frame pixel; `tiled`: of a tile's frames where they are fewer). A VAE class not measured (none of the
    registered families' is: a test holds it) counts as the largest measured one, so the budget errs on the side
    of a refusal rather than of the OOM killer."""
    if config.get("_class_name", "AutoencoderKL") not in MEASURED:
        return max(VIDEO_DECODE_BYTES.values()) if video else max(DECODE_BYTES.values())
    found = config_layout(config)
    if video and found in WHOLE_VIDEO_DECODE_BYTES:
        held = min(frames, frame_tile(config) or frames) if tiled else frames
        return WHOLE_VIDEO_DECODE_BYTES[found] * max(1, held)
    return (VIDEO_DECODE_BYTES.get(found) if video else None) or DECODE_BYTES[found]


def sound_decode_bytes(config: dict) -> int:
    """The sound decode's peak bytes per second of sound in float32, from the config of the part that makes the
    waveform (the vocoder, or the audio VAE); a class not measured counts as the largest measured."""
    return SOUND_DECODE_BYTES.get(config.get("_class_name", ""), max(SOUND_DECODE_BYTES.values()))
