"""Which text encoders Shard TP can shard, judged by transformers' own tensor-parallel plans (the config classes'
`base_model_tp_plan`, or their text_config's), for the encoders of today's families and of the coming ones."""

from __future__ import annotations

import pytest

from backend.controller import components

# (config class, what transformers 5.24's plan shards): the layers, or nothing that spreads the weights
CASES = [
    ("Qwen3VLConfig", False),  # Qwen-Image 2.1, Krea 2, FLUX 3, MiniMax H3: its text plan is embed_tokens alone
    ("Qwen3_5Config", True),  # FLUX 3's prompt upsampler (Qwen3.5 9B)
    ("Gemma3Config", True),  # LTX-2 (Gemma 3 12B)
    ("Gemma4Config", True),
    ("Qwen3Config", True),  # Z-Image, FLUX.2 klein
    ("Qwen2_5_VLConfig", True),  # Qwen-Image
    ("Mistral3Config", True),  # FLUX.2 dev: its text_config is a Mistral's
    ("T5Config", False),  # FLUX.1, SD3
    ("UMT5Config", False),  # Wan
    ("CLIPTextConfig", False),
]


@pytest.mark.unit
@pytest.mark.parametrize("config_class, shards", CASES, ids=[c for c, _ in CASES])
def test_text_encoders_are_judged_by_transformers_own_tp_plans(config_class, shards):
    import transformers

    cls = getattr(transformers, config_class)
    config = cls().to_dict()  # what a saved text_encoder/config.json holds
    own = getattr(cls, "base_model_tp_plan", None)
    if own is None and "text_config" in config:  # a vision-language model: its text model's plan
        text = transformers.CONFIG_MAPPING[config["text_config"]["model_type"]]
        own = getattr(text, "base_model_tp_plan", None)
    assert components.tp_plan(config) == dict(own or {})
    assert components._tp_plan_of(config) is shards
