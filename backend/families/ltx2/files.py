"""What ComfyUI's LTX-2 files hold, from their shapes alone (torch-free: the controller reads it): the DiT's config
sizes, and the parts of an LTX-AV checkpoint beyond the DiT and the video VAE (the text connectors, the audio VAE,
the vocoder) with theirs. The names are Lightricks', which ComfyUI keeps (comfy/ldm/lightricks/av_model.py,
embeddings_connector.py, vae/audio_vae.py, vocoders/vocoder.py, text_encoders/lt.py): the DiT under
`model.diffusion_model.` with the two connectors inside it, the per-modality text projections under
`text_embedding_projection.`, then `vae.`, `audio_vae.` and `vocoder.`.

Head counts: LTX-2.3's gated attention has one gate per head (to_gate_logits); without it, the published head sizes
fitted to the widths (base.head_dim).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from ..base import Shapes, count, head_dim

# the connectors' keys lie under two prefixes, read with their names whole (worker/loading.py's "a|b" prefixes)
CONNECTORS = "model.diffusion_model.|text_embedding_projection."
_VIDEO = "model.diffusion_model.video_embeddings_connector."
_AUDIO = "model.diffusion_model.audio_embeddings_connector."
_PROJECTION = "text_embedding_projection."
PARTS = ("connectors", "audio_vae", "vocoder")  # what the pipeline needs beyond the DiT, the VAE and Gemma
LTX23_CHECKPOINT = "LTX-2.3's all-in-one checkpoint (ltx-2.3-22b-dev-fp8.safetensors, in models/checkpoints)"
# LTX-2.5's split files as its templates (video_ltx2_5_t2v, _i2v) name them: the DiT with its two connectors
# (diffusion_models), Gemma 4 with the connectors' text projection beside it (text_encoders, CLIPLoader "ltxv"), the
# video VAE and the audio VAE with its vocoder (vae, two VAELoaders: here vae and audio_vae)
LTX25_FILES = ("gemma4-12b-with-proj-ltx-2.5-*.safetensors (Gemma 4 with the connectors' text projection, "
               "models/text_encoders) in text_encoder_1 and ltx-2.5-audio-vae-*.safetensors (the audio VAE with its "
               "vocoder, models/vae) in audio_vae")
TEXTS = ("gemma3", "gemma4")  # LTX-2.3's text encoder, LTX-2.5's


def _heads(s: Shapes, attention: str, width: int, published_head: int) -> int:
    """An attention's head count: its gates' (one per head), else the published head size fitted to the width."""
    gates = s.get(f"{attention}.to_gate_logits.weight")
    return gates[0] if gates else width // head_dim(width, published_head)


def transformer_sizes(s: Shapes, published: dict, texts: Mapping[str, Shapes]) -> dict:
    """LTX2VideoTransformer3DModel's sizes from the DiT's tensors (under `model.diffusion_model.`)."""
    b = "transformer_blocks.0."
    inner, a_inner = s["patchify_proj.weight"][0], s["audio_patchify_proj.weight"][0]
    heads = _heads(s, b + "attn1", inner, published["attention_head_dim"])
    a_heads = _heads(s, b + "audio_attn1", a_inner, published["audio_attention_head_dim"])
    out = dict(in_channels=s["patchify_proj.weight"][1], out_channels=s["proj_out.weight"][0],
               num_attention_heads=heads, attention_head_dim=inner // heads,
               cross_attention_dim=s[b + "attn2.to_k.weight"][1], num_layers=count(s, "transformer_blocks."),
               audio_in_channels=s["audio_patchify_proj.weight"][1], audio_out_channels=s["audio_proj_out.weight"][0],
               audio_num_attention_heads=a_heads, audio_attention_head_dim=a_inner // a_heads,
               audio_cross_attention_dim=s[b + "audio_attn2.to_k.weight"][1],
               gated_attn=b + "attn1.to_gate_logits.weight" in s,
               audio_gated_attn=b + "audio_attn1.to_gate_logits.weight" in s,
               cross_attn_mod=b + "prompt_scale_shift_table" in s,
               audio_cross_attn_mod=b + "audio_prompt_scale_shift_table" in s,
               ff_bias=b + "ff.net.0.proj.bias" in s, audio_ff_bias=b + "audio_ff.net.0.proj.bias" in s,
               use_prompt_adaln_single="prompt_adaln_single.linear.weight" in s,
               use_prompt_embeddings="caption_projection.linear_1.weight" in s)
    if out["use_prompt_embeddings"]:  # LTX-2.0's caption projection (LTX-2.3 projects per modality before)
        out["caption_channels"] = s["caption_projection.linear_1.weight"][1]
    elif text := next((texts[k] for k in TEXTS if k in texts), None):
        out["caption_channels"] = text["model.embed_tokens.weight"][1]
    return out


def _under(shapes: Shapes, prefix: str) -> dict[str, tuple[int, ...]]:
    return {k[len(prefix):]: v for k, v in shapes.items() if k.startswith(prefix)}


def _connectors(s: Shapes, published: dict, text: Shapes | None) -> dict:
    """LTX2TextConnectors' sizes: each connector's width, layers and registers, the projections' input (the text
    encoder's hidden size times its layers + 1, which it stacks)."""
    video, audio = _under(s, _VIDEO), _under(s, _AUDIO)
    per_modality = _PROJECTION + "video_aggregate_embed.weight" in s
    projection = _PROJECTION + ("video_aggregate_embed" if per_modality else "aggregate_embed")
    stacked = s[projection + ".weight"][1]
    hidden = text["model.embed_tokens.weight"][1] if text else published["caption_channels"]
    if stacked % hidden:
        raise ValueError(f"its text projection reads {stacked} features, which is no number of layers of the "
                         f"{hidden}-wide text encoder chosen: choose the Gemma text encoder made for it")
    out = dict(caption_channels=hidden, text_proj_in_factor=stacked // hidden, per_modality_projections=per_modality,
               proj_bias=projection + ".bias" in s)
    for name, part, published_head in (("video", video, published["video_connector_attention_head_dim"]),
                                       ("audio", audio, published["audio_connector_attention_head_dim"])):
        width = part["transformer_1d_blocks.0.attn1.to_q.weight"][0]
        heads = _heads(part, "transformer_1d_blocks.0.attn1", width, published_head)
        out.update({f"{name}_connector_num_attention_heads": heads,
                    f"{name}_connector_attention_head_dim": width // heads,
                    f"{name}_connector_num_layers": count(part, "transformer_1d_blocks."),
                    f"{name}_connector_num_learnable_registers": part.get("learnable_registers", (None,))[0],
                    f"{name}_gated_attn": "transformer_1d_blocks.0.attn1.to_gate_logits.weight" in part})
        if per_modality:
            out[f"{name}_hidden_dim"] = s[f"{_PROJECTION}{name}_aggregate_embed.weight"][0]
    return out


def _audio_vae(s: Shapes, published: dict, dit: Shapes) -> dict:
    """AutoencoderKLLTX2Audio's sizes; its mel bins from the DiT, which reads latent channels x the mel bins left
    after the encoder's downsamples."""
    levels, base = count(s, "encoder.down."), s["encoder.conv_in.conv.weight"][0]
    latent = s["decoder.conv_in.conv.weight"][1]
    return dict(base_channels=base, in_channels=s["encoder.conv_in.conv.weight"][1],
                output_channels=s["decoder.conv_out.conv.weight"][0], latent_channels=latent,
                ch_mult=[s[f"encoder.down.{i}.block.0.conv2.conv.weight"][0] // base for i in range(levels)],
                num_res_blocks=count(s, "encoder.down.0.block."), double_z=s["encoder.conv_out.conv.weight"][0] == 2 * latent,
                mid_block_add_attention=any(k.startswith("encoder.mid.attn_1.") for k in s),
                norm_type="group" if "encoder.norm_out.weight" in s else "pixel",
                mel_bins=dit["audio_patchify_proj.weight"][1] // latent * 2 ** (levels - 1))


# diffusers 0.42.1's LTX2VocoderWithBWE defaults (LTX-2.3's published vocoder with bandwidth extension): what its
# tensors do not say (strides where the kernels are the published ones, the mel hop, the rates, activations)
BWE = dict(upsample_kernel_sizes=[11, 4, 4, 4, 4, 4], upsample_factors=[5, 2, 2, 2, 2, 2],
           resnet_dilations=[[1, 3, 5]] * 3, act_fn="snakebeta", antialias=True, antialias_ratio=2, final_act_fn=None,
           bwe_upsample_kernel_sizes=[12, 11, 4, 4, 4], bwe_upsample_factors=[6, 5, 2, 2, 2],
           bwe_resnet_dilations=[[1, 3, 5]] * 3, bwe_act_fn="snakebeta", bwe_antialias=True, bwe_antialias_ratio=2,
           bwe_final_act_fn=None, hop_length=80, input_sampling_rate=16000, output_sampling_rate=48000)


def _stage(s: Shapes, published: dict, pre: str = "") -> dict:
    """One HiFi-GAN stage's sizes (a vocoder, or the bandwidth extension's generator: `pre` "bwe_"). Its strides are
    in no tensor: the published ones where the kernels are the published kernels, else half of each kernel
    (HiFi-GAN's rule)."""
    ups = count(s, "ups.")
    kernels = [s[f"ups.{i}.weight"][2] for i in range(ups)]
    factors = published[pre + "upsample_factors"] if kernels == published[pre + "upsample_kernel_sizes"] \
        else [k // 2 for k in kernels]
    per = count(s, "resblocks.") // ups
    dilations = published[pre + "resnet_dilations"]
    act = "resblocks.0.acts1.0."
    out = dict(in_channels=s["conv_pre.weight"][1], hidden_channels=s["conv_pre.weight"][0],
               out_channels=s["conv_post.weight"][0], upsample_kernel_sizes=kernels, upsample_factors=factors,
               resnet_kernel_sizes=[s[f"resblocks.{j}.convs1.0.weight"][2] for j in range(per)],
               resnet_dilations=dilations if len(dilations) == per else [dilations[0]] * per,
               final_bias="conv_post.bias" in s, antialias=act + "upsample.filter" in s,
               act_fn="snakebeta" if act + "act.beta" in s else "snake" if act + "act.alpha" in s else "leaky_relu")
    if out["antialias"]:
        out["antialias_kernel_size"] = s[act + "upsample.filter"][2]
    return {pre + k: v for k, v in out.items()}


def _vocoder(s: Shapes, published: dict, audio: dict) -> dict:
    """LTX2Vocoder's sizes, or LTX2VocoderWithBWE's (a `bwe_generator`: LTX-2.3's bandwidth extension, with its
    `_class_name`); the rates follow from the strides and the audio VAE's mel hop."""
    if not any(k.startswith("bwe_generator.") for k in s):
        out = _stage(s, published)
        return {**out, "output_sampling_rate": audio["sample_rate"] * math.prod(out["upsample_factors"])
                // audio["mel_hop_length"]}
    first, extension = _stage(_under(s, "vocoder."), BWE), _stage(_under(s, "bwe_generator."), BWE, "bwe_")
    rate = audio["sample_rate"] * math.prod(first["upsample_factors"]) // audio["mel_hop_length"]
    basis = s["mel_stft.stft_fn.forward_basis"][2]
    return {"_class_name": "LTX2VocoderWithBWE", **BWE, **first, **extension, "filter_length": basis,
            "window_length": basis, "num_mel_channels": s["mel_stft.mel_basis"][0], "input_sampling_rate": rate,
            "output_sampling_rate": rate * math.prod(extension["bwe_upsample_factors"]) // BWE["hop_length"]}


def parts(s: Shapes, published: Callable[[str], dict], chosen: Mapping[str, Shapes]) -> dict[str, tuple[str, str, dict]]:
    """The parts of PARTS a file holds (`s`: every key of it), each as (key prefix, loader layout, config sizes);
    `chosen`: the denoiser's shapes ("denoiser") and the text encoders' by kind. The connectors' blocks lie in the
    DiT, their text projection beside them (LTX-2.3's checkpoint) or in Gemma 4's file (LTX-2.5's split files:
    "_also" names that text encoder kind, whose file the part is read from too). Raises ValueError saying what
    does not fit."""
    found: dict[str, tuple[str, str, dict]] = {}
    text = next((chosen[k] for k in TEXTS if k in chosen), None)
    if _VIDEO + "transformer_1d_blocks.0.attn1.to_q.weight" in s:
        if any(k.startswith(_PROJECTION) for k in s):
            found["connectors"] = (CONNECTORS, "ltx2-connectors", _connectors(s, published("connectors"), text))
        elif "gemma4" in chosen and any(k.startswith(_PROJECTION) for k in chosen["gemma4"]):
            both = {**s, **{k: v for k, v in chosen["gemma4"].items() if k.startswith(_PROJECTION)}}
            found["connectors"] = (CONNECTORS, "ltx2-connectors",
                                   {**_connectors(both, published("connectors"), text), "_also": "gemma4"})
    audio = _under(s, "audio_vae.")
    audio_config = None
    if "decoder.conv_in.conv.weight" in audio and "denoiser" in chosen:
        sizes = _audio_vae(audio, published("audio_vae"), chosen["denoiser"])
        found["audio_vae"] = ("audio_vae.", "ltx2-audio-vae", sizes)
        audio_config = {**published("audio_vae"), **sizes}
    vocoder = _under(s, "vocoder.")
    if "conv_pre.weight" in vocoder or any(k.startswith("bwe_generator.") for k in vocoder):
        found["vocoder"] = ("vocoder.", "ltx2-vocoder",
                            _vocoder(vocoder, published("vocoder"), audio_config or published("audio_vae")))
    return found

