"""MiniMax H3's key conversions (torch; the worker reads them through families.conversions, the controller never):
ComfyUI's files (comfy/ldm/minimax/) in the names of diffusers' classes.

- The transformer: diffusers' own converter (convert_minimax_h3_transformer_checkpoint_to_diffusers). It refuses
  ComfyUI's "pruned" files (minimax_h3_*_pruned_*: the curve form), which replace the time embedder with
  `adaln_t_table` [grid, r] (the time embedding's AdaLN input sampled on a grid of t in [0, 1] and reduced to r
  coordinates) and every AdaLN projection with its r-wide reduction, applied without the SiLU
  (comfy/ldm/minimax/model.py: `use_adaln_curves`). `transformer` converts the rest with diffusers' converter and
  `curve_form` puts the table in the place of diffusers' time embedder (no module of diffusers reads it).
- The video VAE (minimax_h3_video_vae_*): the original MiniMax names, which diffusers 0.42.1 converts only in its
  conversion script (scripts/convert_minimax_h3_to_diffusers.py, not shipped in the wheel): renamed here the same way.
- The audio VAE (minimax_h3_audio_vae_*): diffusers' names already, with ComfyUI's weight norms folded into plain
  `.weight` tensors (comfy/ldm/minimax/audio_vae.py): unfolded back into `weight_g` / `weight_v`.
Both VAE files carry their latent statistics as tensors (`latents_mean`, `latents_std`), which diffusers keeps in
the config: the converters move them into the config they are given (`latent_statistics`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

CURVE_TABLE = "adaln_t_table"
LATENT_STATISTICS = ("latents_mean", "latents_std")


def transformer(sd: dict, config: dict) -> tuple[dict, torch.Tensor | None]:
    """ComfyUI's MiniMax H3 transformer tensors (prefix removed) in diffusers' names, by diffusers' converter;
    and the curve table of a pruned file (None for a full one), which the converter would refuse."""
    from diffusers.loaders.single_file_utils import convert_minimax_h3_transformer_checkpoint_to_diffusers

    sd = dict(sd)
    table = sd.pop(CURVE_TABLE, None)
    return convert_minimax_h3_transformer_checkpoint_to_diffusers(sd, config), table


class CurveTimeEmbedding(nn.Module):
    """The time embedding of a pruned MiniMax H3 file: the AdaLN input at t, linearly interpolated between the
    rows of `adaln_t_table` (t in [0, 1] over its grid, clamped at the ends), as ComfyUI computes it."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("table", table.to(torch.float32))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        table = self.table
        pos = t.to(torch.float32).clamp(0.0, 1.0) * (table.shape[0] - 1)
        low = pos.floor().long().clamp(max=table.shape[0] - 2)
        return torch.lerp(table[low], table[low + 1], (pos - low).unsqueeze(1))


def _linear_no_silu(module: nn.Module, temb: torch.Tensor) -> torch.Tensor:
    return module.linear(temb.to(module.linear.weight.dtype))


def curve_form(model: Any, table: torch.Tensor) -> Any:
    """A diffusers MiniMaxH3Transformer3DModel built with `time_embed_dim` = the table's width made to run a
    pruned file: the table in the place of its time embedder (diffusers' sinusoid bypassed: the table is indexed
    by t itself), and its AdaLN projections fed the curve without the SiLU. Their forwards are diffusers' but for
    that one call (MiniMaxH3AdaLayerNormModulation, MiniMaxH3AdaLayerNormOut)."""
    from diffusers.models.transformers.transformer_minimax_h3 import (
        MiniMaxH3AdaLayerNormModulation,
        MiniMaxH3AdaLayerNormOut,
    )

    class Modulation(MiniMaxH3AdaLayerNormModulation):
        def forward(self, temb: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return _linear_no_silu(self, temb).view(-1, 6 * self.hidden_size).chunk(6, dim=-1)

    class Out(MiniMaxH3AdaLayerNormOut):
        def forward(self, hidden_states: torch.Tensor, temb: torch.Tensor, timestep_indices: torch.Tensor) -> torch.Tensor:
            shift, scale = _linear_no_silu(self, temb).chunk(2, dim=-1)
            hidden_states = self.norm(hidden_states)
            return hidden_states * (1.0 + scale.index_select(0, timestep_indices)) + shift.index_select(
                0, timestep_indices)

    model.time_proj = nn.Identity()
    model.time_embedder = CurveTimeEmbedding(table)
    for module in model.modules():
        if type(module) is MiniMaxH3AdaLayerNormModulation:
            module.__class__ = Modulation
        elif type(module) is MiniMaxH3AdaLayerNormOut:
            module.__class__ = Out
    return model


def load_transformer(cls: type, sd: dict, config: dict) -> Any:
    """A MiniMaxH3Transformer3DModel from ComfyUI's tensors (full or pruned; comfy-kitchen QuantizedTensors kept
    as they are), loaded strictly, its tensors as the file (or comfy-kitchen) gives them."""
    from accelerate import init_empty_weights

    converted, table = transformer(sd, config)
    if table is not None:
        config = {**config, "time_embed_dim": table.shape[1]}
    with init_empty_weights(include_buffers=False):  # its computed buffers (the rotary table) real
        model = cls.from_config(config)
    if table is not None:
        curve_form(model, table)
        converted = {**converted, "time_embedder.table": table.to(torch.float32)}
    model.load_state_dict(converted, strict=True, assign=True)
    return model.eval()


def latent_statistics(sd: dict) -> dict:
    """A VAE file's latent statistics as config values ({} where the file has none)."""
    return {k: [float(x) for x in sd[k].reshape(-1)] for k in LATENT_STATISTICS if k in sd}


def _qkv_per_head(tensor: torch.Tensor, heads: int) -> list[torch.Tensor]:
    """The video VAE decoder's fused qkv (rows per head: [q k v] of head 0, of head 1, ...) as q, k and v."""
    grouped = tensor.reshape(heads, 3, tensor.shape[0] // (3 * heads), *tensor.shape[1:])
    return [grouped[:, i].reshape(-1, *tensor.shape[1:]).contiguous() for i in range(3)]


def video_vae(sd: dict, config: dict) -> dict:
    """MiniMax H3's video VAE (ComfyUI's layout: MiniMax's names) in diffusers' AutoencoderKLMiniMaxH3 names: the
    encoder's `down.{i}.block.{j}` as `down_blocks.{i}.resnets.{j}` (`nin_shortcut` as `conv_shortcut`,
    `downsample` as `downsamplers.0`), the ViT decoder's `x_embedder` as `proj_in`, its fused per-head `to_qkv`
    split, `to_out` as `to_out.0`, the gated feed-forward's `w1` ([gate; up]) as `ff.net.0.proj` ([up; gate]) and
    `w2` as `ff.net.2`; the unused `mask_token` dropped, the latent statistics moved into `config`."""
    heads = config["decoder_num_attention_heads"]
    config.update(latent_statistics(sd))
    out = {}
    for key, value in sd.items():
        if key in LATENT_STATISTICS or key == "decoder.mask_token":
            continue
        if ".attn.to_qkv." in key:
            prefix, suffix = key.split(".attn.to_qkv.")
            for name, part in zip(("to_q", "to_k", "to_v"), _qkv_per_head(value, heads), strict=True):
                out[f"{prefix}.attn.{name}.{suffix}"] = part
            continue
        if key.startswith("encoder.down."):
            level, rest = key[len("encoder.down."):].split(".", 1)
            rest = rest.replace("block.", "resnets.", 1).replace("nin_shortcut.", "conv_shortcut.", 1)
            key = f"encoder.down_blocks.{level}.{rest.replace('downsample.', 'downsamplers.0.', 1)}"
        key = key.replace("decoder.x_embedder.", "decoder.proj_in.").replace(".attn.to_out.", ".attn.to_out.0.")
        if ".ff.w1." in key:
            gate, up = value.chunk(2, dim=0)
            key, value = key.replace(".ff.w1.", ".ff.net.0.proj."), torch.cat([up, gate], dim=0)
        out[key.replace(".ff.w2.", ".ff.net.2.")] = value
    return out


def audio_vae(sd: dict, config: dict) -> dict:
    """MiniMax H3's audio VAE (ComfyUI's layout) in diffusers' AutoencoderKLMiniMaxH3Audio names: every
    convolution of its encoder and decoder (3D weights there) back as torch's weight norm (`weight_v` the
    folded weight, `weight_g` its norm over all but the first axis: the same weight), the latent statistics
    moved into `config`."""
    config.update(latent_statistics(sd))
    out = {}
    for key, value in sd.items():
        if key in LATENT_STATISTICS:
            continue
        if key.startswith(("encoder.", "decoder.")) and key.endswith(".weight") and value.ndim == 3:
            base = key[: -len(".weight")]
            out[f"{base}.weight_v"] = value
            out[f"{base}.weight_g"] = value.norm(dim=(1, 2), keepdim=True)
            continue
        out[key] = value
    return out


def text_encoder(model: Any) -> Any:
    """The Qwen3-VL of ComfyUI's qwen3vl_32b_minimax_h3 file: the published 64-layer model cut after layer 50,
    without its final norm (worker/loading.py reads it so: text_encoders.without_final_norm), whose last hidden
    state is then the published model's hidden_states[50], what MiniMax H3 reads. diffusers' text step reads
    hidden_states[50] too and refuses a text encoder whose config counts 50 layers or fewer (for a full model the
    last one would be post-norm): the config counts one more, the layer whose input that state is."""
    text = getattr(model, "model", model).language_model
    if isinstance(text.norm, nn.Identity) and model.config.text_config.num_hidden_layers == len(text.layers):
        model.config.text_config.num_hidden_layers += 1
    return model


# What the worker does to a component after loading it from a file, by component (worker/modular_files.py)
FINISH: dict[str, Callable[[Any], Any]] = {"text_encoder": text_encoder}

# The VAE layouts (families/vaes.py) this family's converters read, by loader layout
VAE_CONVERTERS: dict[str, Callable[[dict, dict], dict]] = {"minimax-h3-vae": video_vae,
                                                          "minimax-h3-audio-vae": audio_vae}
