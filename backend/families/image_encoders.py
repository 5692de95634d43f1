"""CLIP vision encoders as ComfyUI keeps them (models/clip_vision): what Wan 2.1 image to video reads the start
image with (clip_vision_h.safetensors, ViT-H/14), and the SigLIP FLUX.1 Redux reads its references with
(sigclip_vision_patch14_384.safetensors: the same layout, without class token and pre-norm). Comfy-Org's files are in transformers' own layout
(CLIPVisionModelWithProjection: `vision_model.*` and `visual_projection.weight`), which ComfyUI's clip_vision.py
loads as it is; diffusers' WanImageToVideoPipeline reads the same keys with transformers' CLIPVisionModel (the
projection unused: it takes the second-to-last hidden state). Sizes come from the tensors; the head count from
the published 80-wide heads, as for the other models."""

from __future__ import annotations

import math

from .base import Shapes, count, head_dim

KEYS = ("vision_model.embeddings.patch_embedding.weight", "vision_model.embeddings.position_embedding.weight",
        "vision_model.encoder.layers.0.layer_norm1.weight", "vision_model.post_layernorm.weight")


def recognise(s: Shapes) -> bool:
    """Whether the shapes are a CLIP vision encoder in transformers' layout."""
    return all(k in s for k in KEYS)


def width(s: Shapes) -> int:
    return s["vision_model.post_layernorm.weight"][0]


def image_size(s: Shapes) -> int:
    """The side of the square image it sees: patches per side (positions less the class token) × patch size."""
    patches = s["vision_model.embeddings.position_embedding.weight"][0] - 1
    return math.isqrt(patches) * s["vision_model.embeddings.patch_embedding.weight"][2]


def sizes(s: Shapes, published: dict) -> dict:
    """CLIPVisionConfig sizes from the tensors."""
    hidden = width(s)
    head = head_dim(hidden, published["hidden_size"] // published["num_attention_heads"])
    found = {"hidden_size": hidden, "intermediate_size": s["vision_model.encoder.layers.0.mlp.fc1.weight"][0],
             "num_hidden_layers": count(s, "vision_model.encoder.layers."), "num_attention_heads": hidden // head,
             "patch_size": s["vision_model.embeddings.patch_embedding.weight"][2], "image_size": image_size(s)}
    if "visual_projection.weight" in s:
        found["projection_dim"] = s["visual_projection.weight"][0]
    return found


def processor_sizes(s: Shapes) -> dict:
    """The image processor's resize and centre crop: the encoder's own image size (224 for ViT-H/14)."""
    side = image_size(s)
    return {"size": {"shortest_edge": side}, "crop_size": {"height": side, "width": side}}


def is_siglip(s: Shapes) -> bool:
    """A SigLIP vision encoder (no class token, no layer norm before the encoder), not a CLIP ViT."""
    return (recognise(s) and "vision_model.embeddings.class_embedding" not in s
            and "vision_model.pre_layrnorm.weight" not in s)


def siglip_sizes(s: Shapes, published: dict) -> dict:
    """SiglipVisionConfig sizes from the tensors; its image size is the published one when the patches per side
    agree (`image_size` // `patch_size`: 384 // 14 = 27), else the side they cover."""
    hidden, patch = width(s), s["vision_model.embeddings.patch_embedding.weight"][2]
    side = math.isqrt(s["vision_model.embeddings.position_embedding.weight"][0])
    head = head_dim(hidden, published["hidden_size"] // published["num_attention_heads"])
    return {"hidden_size": hidden, "intermediate_size": s["vision_model.encoder.layers.0.mlp.fc1.weight"][0],
            "num_hidden_layers": count(s, "vision_model.encoder.layers."), "num_attention_heads": hidden // head,
            "patch_size": patch,
            "image_size": published["image_size"] if side == published["image_size"] // patch else side * patch,
            "vision_use_head": "vision_model.head.probe" in s}
