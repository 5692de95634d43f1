"""The prompt-embedding cache: the same prompt on the same weights never runs the text encoders twice.

The pipeline's own `encode_prompt` is memoised: every pipeline calls it with everything that decides the
embeddings (prompt or negative prompt, `max_sequence_length`, whether CFG is on, `num_images_per_prompt`, the
LoRA scale, the device, ...), so its arguments are the key, together with the weights (`text_encoder_state`:
the load key and any LoRA the pipeline description carries). A call given tensors (embeddings already made) is
not cached. A hit returns the very tensors the first call made, on the pipeline's execution device; as the
pipeline runs under inference mode, they are what an uncached call computes, bit for bit. Under offload
'model' a hit runs no text encoder and moves none to the chip: accelerate moves a model only in its own
forward.

Bounded by entries and bytes (COMFYUI_TPU_PROMPT_CACHE_ENTRIES, COMFYUI_TPU_PROMPT_CACHE_MB), least recently
used first out; emptied when the model changes (`attach`). Its statistics go to TPU Device Info.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from ..protocol import settings
from ..protocol.spec import PipelineSpec


def text_encoder_state(spec: PipelineSpec) -> tuple:
    """What decides the text encoders' weights: the load key, and every LoRA setting of the description (fields
    whose name mentions 'lora'), since a LoRA may change the text encoders."""
    loras = tuple((f.name, repr(getattr(spec, f.name))) for f in dataclasses.fields(spec) if "lora" in f.name)
    return (spec.load_key(), loras)


def _limit(setting: settings.Setting) -> float:
    return max(0.0, setting.number() or 0.0)


def _plain(value: Any) -> Any:
    """`value` as a hashable key part, or raises TypeError when it is not plain data (a tensor, a generator)."""
    import torch

    if value is None or isinstance(value, (str, int, float, bool, torch.device, torch.dtype)):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _plain(v)) for k, v in sorted(value.items()))
    raise TypeError(type(value).__name__)


def _nbytes(value: Any) -> int:
    import torch

    if torch.is_tensor(value):
        return value.nbytes
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


class PromptCache:
    """One per worker: memoises the loaded pipeline's `encode_prompt`."""

    def __init__(self) -> None:
        self.max_entries = int(_limit(settings.PROMPT_CACHE_ENTRIES))
        self.max_bytes = int(_limit(settings.PROMPT_CACHE_MB) * 2**20)
        self.entries: OrderedDict[tuple, tuple[Any, int]] = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = 0
        self.seconds = 0.0  # time spent in encode_prompt, hits and misses (the latency report's text encoding)
        self.enabled = False
        self.context: tuple = ()

    def attach(self, pipe: Any) -> None:
        """Memoises `pipe.encode_prompt` (a new pipeline: the cache starts empty)."""
        self.clear()
        self.wrap(pipe)

    def wrap(self, pipe: Any) -> None:
        """Memoises `pipe.encode_prompt` into this cache, keyed by the pipeline class too (an image pipeline
        made from the loaded one with from_pipe shares its text encoders); once per pipeline object."""
        original = getattr(pipe, "encode_prompt", None)
        if original is None or getattr(original, "_prompt_cache", None) is self:
            return
        signature, owner = inspect.signature(original), type(pipe).__name__

        def encode_prompt(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                key = self._key(signature, args, kwargs)
                if key is None:
                    return original(*args, **kwargs)
                key = (owner, *key)
                if key in self.entries:
                    self.entries.move_to_end(key)
                    self.hits += 1
                    return self.entries[key][0]
                self.misses += 1
                value = original(*args, **kwargs)
                self._put(key, value)
                return value
            finally:
                self.seconds += time.perf_counter() - t0

        encode_prompt._prompt_cache = self
        pipe.encode_prompt = encode_prompt

    def _key(self, signature: inspect.Signature, args: tuple, kwargs: dict) -> tuple | None:
        if not self.enabled:
            return None
        try:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return (self.context, tuple((name, _plain(v)) for name, v in sorted(bound.arguments.items())))
        except TypeError:  # embeddings passed in, or arguments it does not take: not ours to cache
            return None

    def _put(self, key: tuple, value: Any) -> None:
        size = _nbytes(value)
        if size > self.max_bytes or self.max_entries < 1:
            return
        self.entries[key] = (value, size)
        self.bytes += size
        while len(self.entries) > self.max_entries or self.bytes > self.max_bytes:
            _, (_, dropped) = self.entries.popitem(last=False)
            self.bytes -= dropped

    @contextlib.contextmanager
    def using(self, enabled: bool, context: tuple) -> Iterator[None]:
        """Pipeline calls inside use the cache when `enabled`, for weights `context` (`text_encoder_state`)."""
        self.enabled, self.context = enabled, context
        try:
            yield
        finally:
            self.enabled = False

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0

    def stats(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "entries": len(self.entries), "bytes": self.bytes,
                "max_entries": self.max_entries, "max_bytes": self.max_bytes}
