"""FLUX.2 (Black Forest Labs): dev (Mistral Small 3.1 text encoder) and klein (Qwen3; base models run CFG,
distilled ones do not), the FLUX.2 VAE, 2x2 packed latents; both take reference images."""

from __future__ import annotations

from collections.abc import Mapping

from ..base import Configs, ModelFamily, Pipeline, Shapes, TextSlot, count, scaled

DEV = Configs("flux2", (TextSlot("text_encoder", "mistral"),), "FLUX.2 [dev]")
KLEIN = Configs("flux2-klein", (TextSlot("text_encoder", "qwen3"),), "FLUX.2 [klein]")
DEV_TEXT_WIDTH = 3 * 5120  # dev reads three of Mistral's layers, 5120 wide


def sizes(s: Shapes, published: dict, texts: Mapping[str, Shapes]) -> dict:
    hidden, head = s["img_in.weight"][0], s["double_blocks.0.img_attn.norm.query_norm.scale"][0]
    out = s["final_layer.linear.weight"][0]
    return {"in_channels": s["img_in.weight"][1], "out_channels": None if out == s["img_in.weight"][1] else out,
            "num_layers": count(s, "double_blocks."), "num_single_layers": count(s, "single_blocks."),
            "attention_head_dim": head, "num_attention_heads": hidden // head,
            "joint_attention_dim": s["txt_in.weight"][1],
            "timestep_guidance_channels": s["time_in.in_layer.weight"][1],
            "mlp_ratio": s["double_blocks.0.img_mlp.0.weight"][0] / 2 / hidden,
            "guidance_embeds": "guidance_in.in_layer.weight" in s,
            "axes_dims_rope": scaled(published["axes_dims_rope"], head, even=True)}


def text_widths(s: Shapes, kinds: frozenset[str]) -> dict[str, int]:
    """Both read three hidden layers of their text encoder, concatenated."""
    if s["txt_in.weight"][1] % 3:
        return {}
    return {"qwen3" if "qwen3" in kinds else "mistral": s["txt_in.weight"][1] // 3}


def configs_for(s: Shapes, kinds: frozenset[str]) -> Configs:
    """dev reads Mistral, klein reads Qwen3: the text encoder decides; without one, dev's text width does."""
    klein = "qwen3" in kinds or ("mistral" not in kinds and s["txt_in.weight"][1] != DEV_TEXT_WIDTH)
    return KLEIN if klein else DEV


def variant(sizes: dict, file_name: str, configs: Configs,
            kontext: str = "auto") -> tuple[dict[str, dict], tuple[str, ...]]:
    if configs is KLEIN and "base" in file_name.lower():
        return {"": {"is_distilled": False}}, ()
    return {}, ()


FAMILY = ModelFamily(
    id="flux2", order=20, tiny=("flux2",), name="FLUX.2",
    pipelines=(
        Pipeline("Flux2Pipeline", "FLUX.2", 2, "guidance_scale", True, cp_plan=True, references=True,
                 sigmas="unless flow sigmas", latent_patch=2),
        # FLUX.2 [klein] base models (not distilled) run CFG as two branches; distilled ones run one pass
        Pipeline("Flux2KleinPipeline", "FLUX.2 [klein]", 2, "guidance_scale", True, cfg_passes="branches", cp_plan=True,
                 sigmas="unless flow sigmas", latent_patch=2, distilled_key="is_distilled",
                 references=True, inpaint="Flux2KleinInpaintPipeline", step_caches=("taylorseer",)),
    ),
    configs=(DEV, KLEIN),
    denoiser_keys=("double_blocks.0.img_attn.qkv.weight", "img_in.weight"),
    absent_keys=("vector_in.in_layer.weight",),  # FLUX.1's pooled CLIP input
    width_key="img_in.weight", width_agrees=("txt_in.weight", 0), sizes=sizes, text_widths=text_widths,
    vae="vae-flux2", vae_hint="FLUX.2's flux2-vae.safetensors",
    configs_for=configs_for, variant=variant,
)
