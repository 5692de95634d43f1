"""The kinds of text encoder the families read: what artists call each file, how a file of each kind is
recognised from its tensor names, its width, its config sizes and ComfyUI's bundled tokenizer for it.

Several families share a kind (T5-XXL: FLUX.1 and SD3), so kinds live here and a family names them
(`TextSlot.kind`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import Shapes, count, head_dim, scaled


@dataclass(frozen=True)
class TextEncoderKind:
    id: str  # "clip-l"
    wanted: str  # what artists call the file, for messages
    tokenizer: str  # ComfyUI's bundled tokenizer folder (relative to its comfy package); "": the file holds one
    tokenizer_tensor: str = ""  # the tensor of the file that holds its tokenizer (as ComfyUI reads it)
    tokenizer_layout: str = ""  # how the worker makes a tokenizer of that tensor, where not FILE_TOKENIZERS' way
    # accelerate 1.15's layer-by-layer hooks (sequential offload) fail on its tied embedding weights: the input
    # embedding's weight comes back a plain tensor (Gemma's; plain diffusers' enable_sequential_cpu_offload too)
    tied_embeddings_break_sequential_offload: bool = False

    @property
    def short(self) -> str:
        """'CLIP-L': the name without the file names."""
        return self.wanted.split(" (")[0]


KINDS = {k.id: k for k in (
    TextEncoderKind("clip-l", "CLIP-L (clip_l.safetensors)", "sd1_tokenizer"),
    TextEncoderKind("clip-g", "CLIP-G (clip_g.safetensors)", "sd1_tokenizer"),
    TextEncoderKind("t5", "T5-XXL (t5xxl_fp16.safetensors or t5xxl_fp8_e4m3fn.safetensors)",
                    "text_encoders/t5_tokenizer"),
    TextEncoderKind("qwen25vl", "Qwen2.5-VL (qwen_2.5_vl_7b.safetensors)", "text_encoders/qwen25_tokenizer"),
    TextEncoderKind("qwen3", "Qwen3 (qwen_3_4b.safetensors)", "text_encoders/qwen25_tokenizer"),
    # Qwen3-VL (4B: Krea 2, FLUX 3 [klein]; 8B: Qwen-Image 2.1, Ideogram 4): Qwen's vocabulary, as Qwen3's
    TextEncoderKind("qwen3vl", "Qwen3-VL (qwen3vl_4b_*.safetensors or qwen3vl_8b_*.safetensors)",
                    "text_encoders/qwen25_tokenizer"),
    TextEncoderKind("mistral", "Mistral Small 3.1 (mistral_3_small_flux2_bf16.safetensors)", "", "tekken_model"),
    # a SentencePiece model (its serialized bytes), as ComfyUI's Wan text encoder reads it
    TextEncoderKind("umt5", "UMT5-XXL (umt5_xxl_fp16.safetensors or umt5_xxl_fp8_e4m3fn_scaled.safetensors)", "",
                    "spiece_model"),
    # LTX-2.3's: a SentencePiece BPE model in the file too, read as Gemma's (families/ltx2/convert.py)
    TextEncoderKind("gemma3", "Gemma 3 12B (gemma_3_12B_it*.safetensors)", "", "spiece_model", "gemma-spiece",
                    tied_embeddings_break_sequential_offload=True),
    # LTX-2.5's (gemma4-12b-with-proj-ltx-2.5-*: its text projection beside it); its tokenizer is the file's
    # `tokenizer_json` tensor (a tokenizer.json's bytes), as ComfyUI's Gemma4SDTokenizer reads it
    TextEncoderKind("gemma4", "Gemma 4 (gemma4-12b-with-proj-ltx-2.5-*.safetensors)", "", "tokenizer_json",
                    "gemma4-json", tied_embeddings_break_sequential_offload=True),
)}

# the tensors of text-encoder files that hold their tokenizer -> how the worker reads it (loader layout)
FILE_TOKENIZERS = {"tekken_model": "tekken", "spiece_model": "spiece"}
TOKENIZER_LAYOUTS = ("tokenizer", *FILE_TOKENIZERS.values(), *(k.tokenizer_layout for k in KINDS.values()
                                                               if k.tokenizer_layout))  # ComfyUI's bundled folders, and those

# text encoders inside all-in-one checkpoints: SD3 and FLUX.1 as ComfyUI saves them, SDXL as Stability does
CHECKPOINT_PREFIXES = {
    "text_encoders.clip_l.transformer.": "clip-l", "text_encoders.clip_g.transformer.": "clip-g",
    "text_encoders.t5xxl.transformer.": "t5", "conditioner.embedders.0.transformer.": "clip-l",
    "conditioner.embedders.1.model.": "clip-g",  # OpenCLIP layout (diffusers converts it)
}
OPENCLIP_KEY = "transformer.resblocks.0.attn.in_proj_weight"
QWEN3VL_VISION = "visual.deepstack_merger_list.0.linear_fc1.weight"  # Qwen3-VL's vision tower (Qwen2.5-VL has none)  # OpenCLIP's layout (SDXL's CLIP-G in its checkpoint)


def recognise(s: Shapes) -> str | None:
    """The kind of text encoder the shapes hold: a KINDS key, or "clip" (CLIP-L or CLIP-G: told apart by
    width where it is used), "clip-openclip" and "qwen25" (text encoders no family reads); None when
    they hold none."""
    if any(k.endswith("embeddings.token_embedding.weight") for k in s) and (
            "text_model.encoder.layers.0.self_attn.q_proj.weight" in s or "encoder.layers.0.self_attn.q_proj.weight" in s):
        return "clip"
    if OPENCLIP_KEY in s and "token_embedding.weight" in s:
        return "clip-openclip"
    if "encoder.block.0.layer.0.SelfAttention.q.weight" in s:
        if "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight" in s:
            return "umt5"  # Wan's UMT5
        return "t5"
    if "model.layers.0.self_attn.q_proj.weight" in s and "model.embed_tokens.weight" in s:
        if "model.layers.0.pre_feedforward_layernorm.weight" in s:  # Gemma's norms around each MLP
            return "gemma4" if _gemma4(s) else "gemma3"
        if "model.layers.0.self_attn.q_norm.weight" in s:
            return "qwen3vl" if QWEN3VL_VISION in s else "qwen3"
        if "model.layers.0.self_attn.q_proj.bias" in s:
            return "qwen25vl" if any(k.startswith("visual.") for k in s) else "qwen25"
        return "mistral"
    return None


def _gemma4(s: Shapes) -> bool:
    """Gemma 4 rather than Gemma 3: its global layers share K and V (no v_proj), or the file carries LTX-2.5's
    text projection beside it (`…-with-proj-…`)."""
    return any(k.startswith("text_embedding_projection.") for k in s) or any(
        f"model.layers.{i}.self_attn.v_proj.weight" not in s for i in range(count(s, "model.layers.")))


def width(s: Shapes) -> int:
    """The text encoder's hidden size."""
    for key in ("text_model.embeddings.token_embedding.weight", "embeddings.token_embedding.weight",
                "token_embedding.weight", "shared.weight", "encoder.embed_tokens.weight", "model.embed_tokens.weight"):
        if key in s:
            return s[key][1]
    return 0


def projection(s: Shapes) -> int:
    """A CLIP's pooled output width: its projection's, else its hidden size."""
    if "text_projection" in s:
        return s["text_projection"][1]
    if "text_projection.weight" in s:
        return s["text_projection.weight"][0]
    return width(s)


def layout(kind: str, s: Shapes, sizes: dict, published: dict) -> str:
    """How the worker reads a text encoder file: in transformers' own layout ("hf"), in OpenCLIP's (SDXL's
    CLIP-G in its checkpoint: diffusers' pipeline loader converts it), or, for a Mistral pruned to fewer layers
    than published (Comfy-Org's 30-layer file), without the final norm, as ComfyUI reads it."""
    if OPENCLIP_KEY in s:
        return "openclip"
    if kind == "mistral" and sizes["num_hidden_layers"] < published["num_hidden_layers"]:
        return "hf-no-final-norm"
    if kind == "gemma4":  # ComfyUI's names: the language model under `model.`, the text projection beside it
        return "gemma4-comfy"
    if kind == "qwen3vl":  # MiniMax H3's (qwen3vl_32b_minimax_h3): 50 of the 64 layers, no final norm, no lm_head
        return "qwen3vl-comfy" if "model.norm.weight" in s else "qwen3vl-comfy-truncated"
    return "hf"


TRUNCATED_LACKS = ("language_model.norm.weight", "lm_head.weight")  # what a cut-short Qwen3-VL file does not hold


def may_lack(layout: str, key: str) -> bool:
    """Whether a text encoder of loader layout `layout` is whole without tensor `key` of its class (a cut-short
    Qwen3-VL: its final norm and lm_head, which without_final_norm replaces)."""
    return layout == "qwen3vl-comfy-truncated" and key.endswith(TRUNCATED_LACKS)


def without_final_norm(model: Any, layout: str) -> Any:
    """A text encoder of a file cut short, as ComfyUI runs it: without the final norm (its last hidden state is
    the last layer's output); a Qwen3-VL also without its lm_head, which nothing reads."""
    import torch

    if layout == "hf-no-final-norm":
        model.model.norm = torch.nn.Identity()
    elif layout == "qwen3vl-comfy-truncated":
        text = getattr(model, "model", model).language_model  # ForConditionalGeneration's, or the bare model's
        text.norm = torch.nn.Identity()
        if hasattr(model, "lm_head"):
            model.lm_head = torch.nn.Identity()
    return model


def qwen3vl_keys(sd: dict, class_name: str) -> dict:
    """A Qwen3-VL file in ComfyUI's layout (`model.layers.*`, `visual.*`: the original Qwen3 names) under the
    names of the transformers class that reads it (Qwen3VLModel: `language_model.*`, `visual.*`;
    Qwen3VLForConditionalGeneration: `model.language_model.*`, `model.visual.*`, `lm_head.*`). transformers 5.24
    maps `visual.*` but not the language model's names (its conversion mapping has no Qwen3-VL entry: a
    from_pretrained of the file leaves every text weight unloaded), so both are renamed here."""
    outer = "model." if class_name.endswith("ForConditionalGeneration") else ""
    out = {}
    for key, value in sd.items():
        if key.startswith("model."):
            out[f"{outer}language_model.{key[len('model.'):]}"] = value
        elif key.startswith("visual."):
            out[f"{outer}{key}"] = value
        elif outer:  # lm_head: the generation class's own (the bare model has none)
            out[key] = value
    return out


def gemma4_keys(sd: dict, class_name: str) -> dict:
    """A Gemma 4 file in ComfyUI's layout (comfy/text_encoders/gemma4.py: transformers' language-model names under
    `model.`, LTX-2.5's `text_embedding_projection.` beside them, which the connectors read) under the names of
    Gemma4UnifiedForConditionalGeneration (`model.language_model.*`); its lm_head is tied to the embedding
    (tie_word_embeddings), which the file does not hold."""
    outer = "model." if class_name.endswith("ForConditionalGeneration") else ""
    return {f"{outer}language_model.{k[len('model.'):]}": v for k, v in sd.items()
            if k.startswith(("model.embed_tokens.", "model.layers.", "model.norm."))}


# the loader layouts (layout()) read in transformers' classes under ComfyUI's names -> how each renames its keys
# (a Qwen3-VL cut short: without its final norm and lm_head)
RENAMED = {**dict.fromkeys(("qwen3vl-comfy", "qwen3vl-comfy-truncated"), qwen3vl_keys), "gemma4-comfy": gemma4_keys}


# ---- config sizes from the tensors (laid over the published text encoder's config)


def sizes(kind: str, s: Shapes, published: dict) -> dict:
    if kind in ("clip-l", "clip-g"):
        return _clip_sizes(s)
    if kind in ("t5", "umt5"):
        return _t5_sizes(s)
    if kind == "gemma4":
        return _gemma4_sizes(s, published)
    return _llm_sizes(s, published)


def _clip_sizes(s: Shapes) -> dict:
    if OPENCLIP_KEY in s:  # OpenCLIP layout (SDXL checkpoints)
        hidden = s["token_embedding.weight"][1]
        return {"hidden_size": hidden, "vocab_size": s["token_embedding.weight"][0],
                "max_position_embeddings": s["positional_embedding"][0],
                "num_hidden_layers": count(s, "transformer.resblocks."),
                "intermediate_size": s["transformer.resblocks.0.mlp.c_fc.weight"][0],
                "num_attention_heads": hidden // head_dim(hidden, 64),
                "projection_dim": s["text_projection"][1]}
    pre = "text_model." if "text_model.encoder.layers.0.self_attn.q_proj.weight" in s else ""
    hidden = s[f"{pre}embeddings.token_embedding.weight"][1]
    out = {"hidden_size": hidden, "vocab_size": s[f"{pre}embeddings.token_embedding.weight"][0],
           "max_position_embeddings": s[f"{pre}embeddings.position_embedding.weight"][0],
           "num_hidden_layers": count(s, f"{pre}encoder.layers."),
           "intermediate_size": s[f"{pre}encoder.layers.0.mlp.fc1.weight"][0],
           "num_attention_heads": hidden // head_dim(hidden, 64)}
    out["projection_dim"] = s["text_projection.weight"][0] if "text_projection.weight" in s else hidden
    return out


def _t5_sizes(s: Shapes) -> dict:
    bias = s["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
    embed = s.get("shared.weight") or s["encoder.embed_tokens.weight"]
    return {"d_model": embed[1], "vocab_size": embed[0], "num_layers": count(s, "encoder.block."),
            "num_heads": bias[1], "relative_attention_num_buckets": bias[0],
            "d_kv": s["encoder.block.0.layer.0.SelfAttention.q.weight"][0] // bias[1],
            "d_ff": s["encoder.block.0.layer.1.DenseReluDense.wi_0.weight"][0]}


def _llm_sizes(s: Shapes, published: dict) -> dict:
    """A decoder-only text encoder (Qwen2.5-VL's language model, Qwen3, Mistral): counts and widths from the
    tensors, head size from q_norm where the model has one, else the published one (fitted to the width)."""
    text = published.get("text_config", published)
    hidden = s["model.embed_tokens.weight"][1]
    q, k = s["model.layers.0.self_attn.q_proj.weight"][0], s["model.layers.0.self_attn.k_proj.weight"][0]
    if "model.layers.0.self_attn.q_norm.weight" in s:
        head = s["model.layers.0.self_attn.q_norm.weight"][0]
    else:
        head = head_dim(q, text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"])
    out = {"hidden_size": hidden, "vocab_size": s["model.embed_tokens.weight"][0],
           "num_hidden_layers": count(s, "model.layers."),
           "intermediate_size": s["model.layers.0.mlp.gate_proj.weight"][0],
           "num_attention_heads": q // head, "num_key_value_heads": k // head}
    if "head_dim" in text:
        out["head_dim"] = head
    rope = dict(text.get("rope_parameters") or {})
    if "mrope_section" in rope:
        rope["mrope_section"] = scaled(rope["mrope_section"], head // 2, even=False)
        out["rope_parameters"] = rope
    if "text_config" not in published:
        return out
    vision = {}
    if QWEN3VL_VISION in s:
        vision = _qwen3vl_vision(s, published["vision_config"])
    elif "visual.patch_embed.proj.weight" in s:
        embed, _, temporal, patch, _ = s["visual.patch_embed.proj.weight"]
        merge = int(round((s["visual.merger.mlp.0.weight"][1] / embed) ** 0.5))
        vision = {"hidden_size": embed, "depth": count(s, "visual.blocks."), "patch_size": patch,
                  "temporal_patch_size": temporal, "spatial_merge_size": merge,
                  "intermediate_size": s["visual.blocks.0.mlp.gate_proj.weight"][0],
                  "out_hidden_size": s["visual.merger.mlp.2.weight"][0],
                  # 80-wide heads (1280 / 16); a narrower tower runs one head (halving 80 reaches widths
                  # too narrow for its 2D rotary)
                  "num_heads": embed // 80 if embed % 80 == 0 else 1}
        published_blocks = published["vision_config"]["fullatt_block_indexes"]
        vision["fullatt_block_indexes"] = [b for b in published_blocks if b < vision["depth"]] or [vision["depth"] - 1]
    return {"text_config": {**text, **out}, "vision_config": {**published["vision_config"], **vision}}


def _gemma4_sizes(s: Shapes, published: dict) -> dict:
    """Gemma 4's text tower (Gemma4UnifiedTextConfig) from its tensors: the sliding layers' sizes as any decoder's,
    the global layers' (every `pattern`-th, the last always: the published 5:1) head size from their q_norm, their
    K/V heads from k_proj, and whether they share K and V (no v_proj). The window is in no tensor: the published
    one. No vision or audio tower: the pipeline runs none."""
    text = published["text_config"]
    out = _llm_sizes(s, text)
    layers, pattern = out["num_hidden_layers"], 6
    types = ["sliding_attention" if (i + 1) % pattern and i < layers - 1 else "full_attention" for i in range(layers)]
    first = f"model.layers.{types.index('full_attention')}.self_attn."
    head = s[first + "q_norm.weight"][0]
    return {**{k: v for k, v in published.items() if k not in ("vision_config", "audio_config")},
            "vision_config": None, "audio_config": None,
            "text_config": {**text, **out, "layer_types": types, "global_head_dim": head,
                            "num_global_key_value_heads": s[first + "k_proj.weight"][0] // head,
                            "attention_k_eq_v": first + "v_proj.weight" not in s}}


def _qwen3vl_vision(s: Shapes, published: dict) -> dict:
    """Qwen3-VL's vision tower from its tensors. Head counts and the blocks the deepstack mergers read are stored
    in no tensor: the published head size (fitted to the width), and the published blocks where the tower has
    the published depth and merger count, else blocks spaced evenly over the tower."""
    embed, _, temporal, patch, _ = s["visual.patch_embed.proj.weight"]
    depth, stacks = count(s, "visual.blocks."), count(s, "visual.deepstack_merger_list.")
    head = head_dim(embed, published["hidden_size"] // published["num_heads"])
    indexes = published["deepstack_visual_indexes"]
    if depth != published["depth"] or stacks != len(indexes):
        indexes = [(i + 1) * depth // (stacks + 1) for i in range(stacks)]
    return {"hidden_size": embed, "depth": depth, "patch_size": patch, "temporal_patch_size": temporal,
            "spatial_merge_size": int(round((s["visual.merger.linear_fc1.weight"][1] / embed) ** 0.5)),
            "intermediate_size": s["visual.blocks.0.mlp.linear_fc1.weight"][0],
            "out_hidden_size": s["visual.merger.linear_fc2.weight"][0],
            "num_position_embeddings": s["visual.pos_embed.weight"][0], "num_heads": embed // head,
            "deepstack_visual_indexes": indexes}
