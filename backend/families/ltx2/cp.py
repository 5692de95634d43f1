"""LTX-2's context-parallel plan (worker only, torch): diffusers' own `LTX2VideoTransformer3DModel._cp_plan` with
the least changed that makes it fit the model, which the family declares in its place (Pipeline.cp_plan_module;
the worker hands it to diffusers' enable_parallelism, parallel.py).

diffusers 0.42.1's plan splits the video tokens (and the prompt, with its mask) and gathers the video output, but
its rotary entries expect [batch, tokens, dims] tables, which LTX-2's split rotary embeddings (rope_type "split",
as published) are not: they are per head, [batch, heads, tokens, dims], so the split was skipped and the split
attention failed. It also leaves the sound whole on every rank and the per-token timestep of image to video
(LTX2ImageToVideoPipeline: [batch, video tokens]) unsplit. Changed here:
- every rotary table split on its token dimension (2 per head, 1 interleaved): the video's, the sound's, and
  the two of the attention between the streams;
- the sound's tokens split too, and its prompt (with its mask) as the video's is; the sound's output gathered;
- the video's timestep split where it has one per token (a [batch] timestep is left whole: diffusers skips a
  tensor whose dimensions differ from the plan's).

Each stream attends to the other through diffusers' attention dispatcher, which enable_parallelism wraps for
every attention module of the model: Ulysses gives each rank all the tokens of both streams for its heads, so
each rank's video queries meet all the sound's keys and the other way round (tests/test_video.py checks frames
and sound against one worker)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def plan(config: Any) -> dict:
    """The plan for a transformer of this config (its rope_type sets the rotary tables' token dimension)."""
    from diffusers import LTX2VideoTransformer3DModel
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    diffusers_plan = LTX2VideoTransformer3DModel._cp_plan
    per_head = config.rope_type == "split"
    table = ContextParallelInput(split_dim=2 if per_head else 1, expected_dims=4 if per_head else 3,
                                 split_output=True)
    rope = {0: table, 1: table}
    tokens = ContextParallelInput(split_dim=1, expected_dims=3, split_output=False)
    return {
        **diffusers_plan,
        "": {**diffusers_plan[""], "audio_hidden_states": tokens, "audio_encoder_hidden_states": tokens,
             "audio_encoder_attention_mask": ContextParallelInput(split_dim=1, expected_dims=2, split_output=False),
             "timestep": ContextParallelInput(split_dim=1, expected_dims=2, split_output=False)},
        "rope": rope, "audio_rope": rope, "cross_attn_rope": rope, "cross_attn_audio_rope": rope,
        "audio_proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3),
    }


# the denoiser classes whose diffusers plan this family replaces, each with its plan by config
PLANS: dict[str, Callable[[Any], dict]] = {"LTX2VideoTransformer3DModel": plan}
