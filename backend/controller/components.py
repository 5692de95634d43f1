"""What a pipeline's components are, from their configs (no weights read): the transformer's attention heads,
and the text encoders with the head counts a Shard TP degree must divide and whether transformers ships a
tensor-parallel plan for each.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..protocol.spec import PipelineSpec, listed_components


def transformer_heads(spec: PipelineSpec) -> int | None:
    """num_attention_heads of the pipeline's transformer (from its config; no weights are read)."""
    heads = spec.component_config("transformer").get("num_attention_heads")
    return heads if isinstance(heads, int) else None


@dataclass(frozen=True)
class TextEncoder:
    name: str  # component name, e.g. "text_encoder_2"
    class_name: str  # e.g. "T5EncoderModel"
    has_tp_plan: bool  # transformers ships a tensor-parallel plan for it
    heads: tuple[int, ...]  # attention and key/value head counts that a TP degree must divide


def tp_plan(config: dict) -> dict[str, str]:
    """transformers' own tensor-parallel plan for a model config (its config class's `base_model_tp_plan`, or its
    text_config's for a vision-language model: Qwen3-VL, Qwen3.5, Gemma 3, Mistral 3); {} when it has none."""
    try:
        from transformers import CONFIG_MAPPING
    except ImportError:
        return {}
    try:
        cls = CONFIG_MAPPING[config.get("model_type")]
    except KeyError:
        return {}
    if plan := getattr(cls, "base_model_tp_plan", None):
        return dict(plan)
    text = config.get("text_config")
    if isinstance(text, dict):
        sub = getattr(cls, "sub_configs", {}).get("text_config")
        text = {"model_type": getattr(sub, "model_type", None), **text}
        return tp_plan(text) if text.get("model_type") else {}
    return {}


def _tp_plan_of(config: dict) -> bool:
    """Whether transformers' plan shards the model's layers: only then does tensor parallel spread its weights over
    the chips (Qwen3-VL's text model, in transformers 5.24, plans its token embedding alone)."""
    return any(key.startswith("layers.") for key in tp_plan(config))


def text_encoders(spec: PipelineSpec) -> list[TextEncoder]:
    """The pipeline's text encoders and whether each could be sharded (reads configs only)."""
    found = []
    for name, (_, class_name) in sorted(listed_components(spec.model_index()).items()):
        if not name.startswith("text_encoder"):
            continue
        config = spec.component_config(name)
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        heads = tuple(h for h in (text.get("num_attention_heads"), text.get("num_key_value_heads"))
                      if isinstance(h, int))
        found.append(TextEncoder(name, class_name, _tp_plan_of(config), heads))
    return found


class Components:
    """One pipeline's components as the layout checks read them, each read once and only when asked (the text
    encoders' TP plans import transformers, which only Shard TP with shard_text_encoders needs)."""

    def __init__(self, spec: PipelineSpec) -> None:
        self._spec = spec

    @cached_property
    def heads(self) -> int | None:
        return transformer_heads(self._spec)

    @cached_property
    def text_encoders(self) -> tuple[TextEncoder, ...]:
        return tuple(text_encoders(self._spec))

    @property
    def shardable(self) -> tuple[str, ...]:
        """The text encoders transformers can shard (a TP plan)."""
        return tuple(e.name for e in self.text_encoders if e.has_tp_plan)
