"""MiniMax H3 (MiniMax): video with sound, which diffusers runs only as a modular pipeline
(`modular_pipelines/minimax_h3`): one folder (modular_model_index.json) serves text to video with audio (t2va),
first/last frame (fl2va) and reference (ref2va) workflows; joint video and audio latents in one transformer call,
guidance distilled (one pass per step), 24 fps, 5 to 15 s. From a diffusers folder, or from ComfyUI's files (the
transformer full or "pruned", Qwen3-VL, the video VAE and the audio VAE: convert.py reads them). Sample Video's inputs
pick the workflow: text alone t2va, a start and/or end image fl2va (the `transformer` partition, loaded with the
pipeline), reference images ref2va (`transformer_ref`, loaded the first time a request has reference images; from
files, the ref2va file alone is that partition, and runs reference images only)."""

from __future__ import annotations

from collections.abc import Mapping

from ..base import Configs, ModelFamily, Modular, Pipeline, Shapes, TextSlot, count


def sizes(s: Shapes, published: dict, texts: Mapping[str, Shapes]) -> dict:
    """The transformer's sizes from ComfyUI's tensors (comfy/ldm/minimax/model.py's names): widths, depths, heads
    (the fused qkv over the per-head q_norm), the AdaLN input (a pruned file's curve width) and, in a full file,
    the time embedder's."""
    head = s["blocks.0.attn.q_norm.weight"][0]
    patch = published["patch_size"][0] * published["patch_size"][1] * published["patch_size"][2]
    out = {"hidden_size": s["video_patch_proj.weight"][0], "num_layers": count(s, "blocks."),
           "num_refiner_layers": count(s, "token_refiner.blocks."), "attention_head_dim": head,
           "num_attention_heads": s["blocks.0.attn.qkv_proj.weight"][0] // (3 * head),
           "ffn_dim": s["blocks.0.mlp.fc2.weight"][1], "in_channels": s["video_patch_proj.weight"][1] // patch,
           "audio_in_channels": s["audio_patch_proj.weight"][1], "text_dim": s["condition_proj.weight"][1],
           "time_embed_dim": s["blocks.0.adaln_proj.linear.weight"][1]}
    if "rope.inv_freq" in s:
        out["rope_freq_dim"] = s["rope.inv_freq"][0]
    if "time_embedder.proj_in.weight" in s:
        out["time_embed_hidden_dim"], out["freq_dim"] = s["time_embedder.proj_in.weight"]
    return out


def text_widths(s: Shapes, kinds: frozenset[str]) -> dict[str, int]:
    return {"qwen3vl": s["condition_proj.weight"][1]}


def denoiser_for(file_name: str) -> str:
    """The ref2va transformer holds the same tensors as the fl2va one (ComfyUI tells them by the node that runs
    them, not by their tensors): its name (minimax_h3_ref2va_*, the r2v template's file) tells it, and it loads as
    the `transformer_ref` partition that diffusers' ref2va blocks run; any other as `transformer` (t2va, fl2va)."""
    return "transformer_ref" if "ref2v" in file_name.lower() else "transformer"


def variant(sizes: dict, file_name: str, configs: Configs, kontext: str) -> tuple[dict[str, dict], tuple[str, ...]]:
    """A ref2va file's sizes under `transformer` too (the same model): what the controller reads of the denoiser
    (heads, frames, sound channels) reads that config; no `transformer` loads without its file."""
    if denoiser_for(file_name) == "transformer_ref":
        return {"transformer": sizes}, ()
    return {}, ()


def files_task(files: Mapping[str, str], references: bool) -> str:
    """Why the files cannot run the request ("" where they can): from ComfyUI's files the transformer is one of two
    files, the fl2va one (`transformer`: text, first / last frame) or the ref2va one (`transformer_ref`: reference
    images), each running its own tasks. `files`: the file name of each component the files hold."""
    name = files.get("transformer_ref") or files.get("transformer", "")
    if references and "transformer_ref" not in files:
        return (f"'{name}' is MiniMax H3's fl2va transformer (text, first / last frame to video); reference images run "
                "its ref2va transformer, another file. Choose minimax_h3_ref2va_* as the diffusion_model of Load TPU "
                "Pipeline (ComfyUI files) (as the video_minimax_h3_r2v template does), or disconnect the "
                "reference_images.")
    if not references and "transformer" not in files:
        return (f"'{name}' is MiniMax H3's ref2va transformer, which makes video from reference images only. Connect "
                f"them (up to {VIDEO_REFERENCES}) to Sample Video's reference_images, or choose minimax_h3_fl2va_* as "
                "the diffusion_model of Load TPU Pipeline (ComfyUI files) for text or a first / last frame.")
    return ""


VIDEO_REFERENCES = 9  # reference images diffusers' ref2va takes at most


# seen on tiny-minimax-h3 (diffusers 0.42.1, MiniMaxH3LoopDenoiser): dynamo's recompile guards named
# `encoder_hidden_states` (size 7 for one prompt, 28 for another) and `timestep` (size 1 at one step, 2 at the next)
NO_STATIC_SHAPES = ("its transformer reads the prompt's rows inside one packed sequence with no attention mask "
                    "(their number follows the prompt, and padding them would change the video) and a timestep "
                    "tensor whose size changes from step to step (the row timestep plan), so a static-shape graph "
                    "would compile again for every prompt length and at every step")


def _packed(frames: int, tokens: int, audio: int) -> dict[str, int]:
    """Nothing the controller can count alone: Context Parallel splits one packed sequence whose length follows
    the prompt (checked in the worker, Pipeline.cp_packed)."""
    return {}


FAMILY = ModelFamily(
    id="minimax_h3", order=85, tiny=("minimax-h3",), name="MiniMax H3",
    pipelines=(
        # x16 VAE, 2x2 patches: sizes are multiples of 32 (the pack reads 2^5 = 32 off the VAE's six blocks, of
        # which two do not downscale: so 1 on top); 17-frame chunks: 17n + 5 frames, 124 to 345 (5-15 s)
        # Context Parallel by diffusers' _cp_plan: the packed sequence (prompt, images, sound, video rows) split at
        # the first block (and its rotary table); its length follows the prompt, so the worker checks it
        # (cp_packed) and the controller has no text length to check (text_tokens 0)
        Pipeline("MiniMaxH3ModularPipeline", "MiniMax H3", 1, "guidance_scale", False,
                 frame_step=17, frame_first=5, frames_range=(124, 345), min_steps=2, sound=("audio_vae",),
                 sound_rate="audio_vae.sampling_rate", start_image=True, end_image=True, video_references=VIDEO_REFERENCES,
                 cp_plan=True, cp_packed="position_ids", text_tokens=0,
                 cp_tokens=_packed,
                 modular=Modular("MiniMaxH3Blocks", workflow="t2va", outputs=("videos", "audio"),
                                 components=("text_encoder", "transformer", "vae", "audio_vae"),
                                 tasks=(("start", "fl2va"), ("reference", "ref2va")),
                                 image_reference="minimax_h3.MiniMaxH3ImageReference", decode="decode",
                                 reference_aspect=4.0,  # diffusers' before_encoder: "within 1:4 and 4:1"
                                 # diffusers' ref2va: at most 3 reference sounds, cut to the video's length at its
                                 # 24 fps (MINIMAX_H3_FPS)
                                 audio_reference="minimax_h3.MiniMaxH3AudioReference", audio_references=3, fps=24.0),
                 compile_refused=NO_STATIC_SHAPES,
                 no_step_cache="diffusers' modular MiniMax H3 blocks call the transformer without the cache "
                               "contexts that diffusers' cache hooks keep their state by"),
    ),
    configs=(Configs("minimax_h3", (TextSlot("text_encoder", "qwen3vl"),)),),
    # ComfyUI's detection keys (comfy/model_detection.py): the video and the audio patch projections
    denoiser_keys=("video_patch_proj.weight", "audio_patch_proj.weight"),
    width_key="video_patch_proj.weight", width_agrees=("condition_proj.weight", 0), sizes=sizes,
    text_widths=text_widths, variant=variant, denoiser_for=denoiser_for, files_task=files_task, vae="vae-minimax-h3",
    vae_hint="MiniMax H3's minimax_h3_video_vae",
    audio_vae=("vae-minimax-h3-audio", "minimax_h3_audio_vae_fp32.safetensors"),
)
