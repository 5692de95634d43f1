"""Where a request's time went in this worker: loading, text encoding, denoising, VAE decode.

Cheap by design: timestamps around each pipeline call, the step callback's time of the last step, and the time
spent in `encode_prompt` (counted by the prompt cache). Seconds as the host sees them, without syncing the
device: work the chip still queues at a boundary counts in the next phase.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any


class Latency:
    """One request's phases, in seconds; `call` times one pipeline call, `step_end` marks the end of a step."""

    def __init__(self) -> None:
        self.parts = {"load_s": 0.0, "text_s": 0.0, "denoise_s": 0.0, "vae_s": 0.0}
        self._last_step: float | None = None

    def step_end(self) -> None:
        self._last_step = time.perf_counter()

    @contextlib.contextmanager
    def call(self, encoder: Any) -> Iterator[None]:
        """Times one pipeline call; `encoder.seconds` counts the time spent encoding prompts."""
        t0, text0, self._last_step = time.perf_counter(), encoder.seconds, None
        try:
            yield
        finally:
            end = time.perf_counter()
            text = encoder.seconds - text0
            last = self._last_step if self._last_step is not None else end
            self.parts["text_s"] += text
            self.parts["denoise_s"] += max(0.0, last - t0 - text)  # latents, steps (and a compile in the first)
            self.parts["vae_s"] += end - last  # after the last step: VAE decode, image conversion, offload hooks

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 4) for k, v in self.parts.items()}
