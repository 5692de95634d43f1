"""LTX-2 (Lightricks LTX-2.x, LTX-2.3's layout): video with sound. One DiT over video and audio tokens (each
stream attends to the other) with the Gemma 3 text encoder and LTX-2's text connectors; the video VAE packs 32x32
pixels and 8 frames into a latent (a video has 8k + 1 frames, sides multiples of 32 from 64: its decoder's
reflection padding needs 2 latent pixels a side, as ComfyUI's LTX nodes' minimum of 64), the audio VAE and the
vocoder make the sound, which comes back beside the frames (`.audio` [B, 2, samples] at the vocoder's rate).

CFG is batched ([negative, positive] in one call on a doubled batch). The pack maps Sample's guidance onto
`guidance_scale` and `audio_guidance_scale` alike and switches off what it does not expose: STG
(spatio-temporal guidance, a third pass over perturbed blocks), modality isolation (a fourth) and guidance
rescale, whose published defaults (STG 1 on block 28, modality 3, rescale 0.7, audio CFG 7) are the full-guidance
recipe of LTX-2.3 dev. The templates run the distilled model at CFG 1: one pass per step. Image to video
(Sample Video's start image) runs LTX2ImageToVideoPipeline, made from the loaded pipeline with from_pipe;
image + audio to video (Sample Video's AUDIO, kept as the sound) runs LTX2ConditionPipeline (audio.py).
Sample Video's audio_guidance (LTX-2.5's dual CFG guider) sets audio_guidance_scale apart; its upscale_model runs
the templates' two stages (two_stage.py). LTX-2.5's Gemma 4 text encoder loads in the same pipeline.

Context Parallel splits the video's tokens and the sound's by diffusers' plan, corrected in cp.py (diffusers'
does not fit LTX-2's per-head rotary embeddings and leaves the sound whole on every rank); the video's tokens
must split evenly, checked before any worker starts; the sound's latents (frames / frame_rate seconds of them:
at 25 fps as many as the frames, odd) are split where they split evenly and otherwise stay whole on every rank
(cp.py's whole_sound; the Sample's notes say so); Ulysses only (ring applies the split prompt's mask wrongly). CFG Parallel splits the doubled batch (both predictions, video and audio, are
gathered); Data Parallel runs copies. No tensor-parallel plan.

Artists' files: LTX-2.3's all-in-one checkpoint (ltx-2.3-22b-dev-fp8.safetensors in models/checkpoints: the DiT
with its text connectors, the video VAE, the audio VAE and the vocoder) with ComfyUI's Gemma 3 file
(gemma_3_12B_it*.safetensors in models/text_encoders, its tokenizer inside) load: diffusers' single-file converters
read the DiT (LTX-2.3's prompt AdaLN renamed first: 0.42.1's converter misses it) and both VAEs, the family's own
renaming (convert.py) the connectors and the vocoder, which diffusers has no converter for; sizes from the tensors
(files.py, vaes.py); LTX-2.3's vocoder with bandwidth extension as diffusers' LTX2VocoderWithBWE. LTX-2.5's split
files load too (configs ltx-2.5, told by a DiT without feed-forward biases): the DiT with its connectors' blocks,
Gemma 4 in ComfyUI's names with the connectors' text projection and its tokenizer (text_encoders.py), the video VAE,
and the audio VAE with its vocoder in the loader's audio_vae input.
"""

from __future__ import annotations

from ..base import Configs, ModelFamily, Pipeline, Shapes, TextSlot
from . import files

# Guidance the pack does not expose, switched off: STG 0 with no perturbed blocks (STG > 0 without blocks
# raises), modality isolation 1 (no extra pass), no rescale, for video and audio. The audio values are passed
# explicitly: the pipeline reads `audio_x or x`, so a 0 would silently take the video's value.
OFF = (("stg_scale", 0.0), ("modality_scale", 1.0), ("guidance_rescale", 0.0), ("audio_stg_scale", 0.0),
       ("audio_modality_scale", 1.0), ("audio_guidance_rescale", 0.0), ("spatio_temporal_guidance_blocks", None))
# TaylorSeer extrapolates both streams: each block's self-attention, cross-attention to the prompt, feed-forward
# (video and audio), and the attention of each stream to the other (diffusers' default, "^transformer_blocks.*attn",
# would take only the last two: the others are attn1, attn2, ff)
TAYLORSEER_MODULES = (r"transformer_blocks\.\d+\.(audio_)?(attn1|attn2|ff)",
                      r"transformer_blocks\.\d+\.(audio_to_video|video_to_audio)_attn")
NO_CACHE = ("first block: diffusers' FirstBlockCache finds a model's blocks through its TransformerBlockRegistry, "
            "which has no entry for LTX2VideoTransformerBlock; magcache: diffusers ships magnitude ratios for "
            "FLUX.1 only")


def _cp_tokens(frames: int, video: int, audio: int) -> dict[str, int]:
    """Context Parallel splits the video's tokens and the sound's (its audio latents) apart (cp.py's plan); the
    sound stays whole where it does not split (cp_whole_if_uneven)."""
    return {"video": video, "audio": audio}


_VIDEO = dict(cfg_doubles_batch=True, cfg_passes="batch", cp_plan=True, cp_plan_module="cp", cp_masked_text=True,
              text_tokens=1024, cp_tokens=_cp_tokens, cp_whole_if_uneven=("audio",),
              frame_step=8, sigmas="always", sigmas_arg=True, sigmas_as_given=True, min_size_multiples=2,
              sound=("audio_vae", "vocoder"), sound_rate="vocoder.output_sampling_rate", frame_rate_arg="frame_rate",
              guidance_also=("audio_guidance_scale",), call_args=OFF, check_kind="video with sound",
              step_caches=("taylorseer",), taylorseer_modules=TAYLORSEER_MODULES, no_step_cache=NO_CACHE,
              latent_upscale="two_stage", audio_via="LTX2ConditionPipeline", audio_module="audio",
              audio_min_steps=2)  # diffusers 0.42.1's LTX2ConditionPipeline finds no step index for 1 step


def _configs(s: Shapes, kinds: frozenset[str]) -> Configs:
    """LTX-2.5 for a DiT without feed-forward biases (as LTX-2.5's published config), else LTX-2.3."""
    return FAMILY.configs[0 if "transformer_blocks.0.ff.net.0.proj.bias" in s else 1]


def text_widths(s: Shapes, kinds: frozenset[str]) -> dict[str, int]:
    """None from the DiT: its connectors read the text encoder's stacked layers (checked in files.parts)."""
    return {}


FAMILY = ModelFamily(
    id="ltx2", order=80, tiny=("ltx2", "ltx25"), name="LTX-2",
    pipelines=(Pipeline("LTX2Pipeline", "LTX-2", 1, "guidance_scale", False, **_VIDEO,
                        start_image_via="LTX2ImageToVideoPipeline"),
               Pipeline("LTX2ImageToVideoPipeline", "LTX-2", 1, "guidance_scale", False, **_VIDEO,
                        start_image=True, needs_image=True)),
    configs=(Configs("ltx-2.3", (TextSlot("text_encoder", "gemma3"),), name="LTX-2.3"),
             Configs("ltx-2.5", (TextSlot("text_encoder", "gemma4"),), name="LTX-2.5",
                     vae_hint="its video VAE: ltx-2.5-video-vae-*.safetensors, in models/vae"),), configs_for=_configs,
    # ComfyUI's layout of an LTX-AV (LTX-2.x) DiT: LTX's timestep AdaLN plus the audio stream's
    denoiser_keys=("adaln_single.emb.timestep_embedder.linear_1.bias", "audio_adaln_single.linear.weight"),
    width_key="patchify_proj.weight", width_agrees=("adaln_single.emb.timestep_embedder.linear_1.weight", 0),
    sizes=files.transformer_sizes, text_widths=text_widths, vae="vae-ltx2", vae_hint="the LTX-2 checkpoint's own VAE",
    latent_packing=1, file_parts=files.parts, file_parts_needed=files.PARTS,
    file_parts_hint={"ltx-2.3": f"{files.LTX23_CHECKPOINT} in checkpoint, which holds them",
                     "ltx-2.5": files.LTX25_FILES},
)
