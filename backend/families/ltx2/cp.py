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
and sound against one worker).

The sound has 25 audio latents a second, so at 25 fps (the LTX-2.3 templates') its latents are as many as the
frames, 8k + 1: odd, which no degree splits. Nothing can pad them (the transformer masks no audio keys), so for
such a call the sound's tokens and rotary tables stay whole on every rank and its output is not gathered
(`whole_sound`), chosen from the call's shapes as the transformer is entered (`follow_sound`). Ulysses still
all-to-alls the sound's attentions (diffusers wraps every attention alike and has no switch per module), which
stays exact: a stream whole on every rank comes to each rank's heads as one identical copy per rank, whose
repeated keys leave the softmax as it is (the all-to-all's all-gather of a key mask repeats the mask with them),
and the all-to-all back hands each rank its own copy of the queries' rows. The sound's attention is repeated on
every rank (its tokens are few next to the video's); the video's tokens are split as ever.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# the plan's entries that differ when the sound stays whole: the sound's tokens (an input of the transformer), its
# two rotary tables (self-attention, and the attention between the streams) and its output
SOUND_INPUT, SOUND_ROPES, SOUND_OUTPUT = "audio_hidden_states", ("audio_rope", "cross_attn_audio_rope"), "audio_proj_out"


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
        "": {**diffusers_plan[""], SOUND_INPUT: tokens, "audio_encoder_hidden_states": tokens,
             "audio_encoder_attention_mask": ContextParallelInput(split_dim=1, expected_dims=2, split_output=False),
             "timestep": ContextParallelInput(split_dim=1, expected_dims=2, split_output=False)},
        "rope": rope, "audio_rope": rope, "cross_attn_rope": rope, "cross_attn_audio_rope": rope,
        SOUND_OUTPUT: ContextParallelOutput(gather_dim=1, expected_dims=3),
    }


def whole_sound(split: dict) -> dict:
    """`split` with the sound's tokens and rotary tables whole on every rank and its output not gathered, as the
    hooks of `split` hold their entries (a gather hook's as a list, None: not gathered); its prompt stays split
    (1024 tokens: even), which Ulysses gathers for every query as the video's."""
    return {"": {k: v for k, v in split[""].items() if k != SOUND_INPUT}, **{rope: {} for rope in SOUND_ROPES},
            SOUND_OUTPUT: [None]}


def follow_sound(model: Any, split: dict) -> None:
    """Once diffusers has applied `split` to `model`: at each call of the model its plan's hooks take the split
    plan's entries where the sound's tokens split evenly over the context ranks, `whole_sound`'s where they do not.
    Decided in this one place, from the shape the model is given (the same at every step of a Sample)."""
    from diffusers.hooks.context_parallel import (
        _CONTEXT_PARALLEL_INPUT_HOOK_TEMPLATE,
        _CONTEXT_PARALLEL_OUTPUT_HOOK_TEMPLATE,
    )

    def hook(module_id: str) -> Any:
        template = _CONTEXT_PARALLEL_OUTPUT_HOOK_TEMPLATE if module_id == SOUND_OUTPUT else \
            _CONTEXT_PARALLEL_INPUT_HOOK_TEMPLATE
        return model.get_submodule(module_id)._diffusers_hook.get_hook(template.format(module_id))

    hooks = {module_id: hook(module_id) for module_id in ("", *SOUND_ROPES, SOUND_OUTPUT)}
    entries = {False: {m: h.metadata for m, h in hooks.items()}, True: whole_sound(split)}
    degree = hooks[""].parallel_config._flattened_mesh.size()

    def choose(module: Any, args: tuple, kwargs: dict) -> None:
        sound = kwargs.get(SOUND_INPUT)
        want = entries[sound is not None and sound.shape[1] % degree != 0]
        for module_id, h in hooks.items():
            if h.metadata is not want[module_id]:
                h.metadata = want[module_id]

    model.register_forward_pre_hook(choose, with_kwargs=True)


# the denoiser classes whose diffusers plan this family replaces, each with its plan by config
PLANS: dict[str, Callable[[Any], dict]] = {"LTX2VideoTransformer3DModel": plan}
# and what follows the call's shapes once the plan is applied (parallel.planned_cp_config)
FOLLOW: dict[str, Callable[[Any, dict], None]] = {"LTX2VideoTransformer3DModel": follow_sound}
