"""The errors the pack raises on purpose, on both sides of the link.

Nodes catch `TPUError` as one type. Input errors say which input, which value and the fix; the worker-side
errors travel back over the link as text and are raised again in the controller as `WorkerError`.

ComfyUI shows an exception as `module.Class`; the pack's folder is imported under its full path, so each
class names a short module instead (`comfyui_tpu.WorkerError`, not `/…/ComfyUI-TPU.backend….WorkerError`).
"""

from __future__ import annotations

PUBLIC_MODULE = "comfyui_tpu"


class TPUError(Exception):
    """Anything ComfyUI-TPU reports to the user on purpose."""


class InputError(TPUError, ValueError):
    """A choice in the graph cannot work; the message names the input, the value and the fix."""


class ModelError(InputError):
    """A model (folder or file) cannot be used, or a sample request does not fit it."""


class CompileError(InputError):
    """An execution mode or compile setting cannot work here."""


class DeviceError(InputError):
    """A requested device cannot be used here."""


class ParallelError(InputError):
    """A Shard TP / Data Parallel layout cannot run on this model or host."""


class WorkerError(TPUError, RuntimeError):
    """A request failed inside a worker; the group is still usable (or was restarted, as the message says)."""


class WorkerCrashed(TPUError, RuntimeError):
    """A worker died or stopped answering; the group was stopped and the next request starts a fresh one.
    `request_started` is False when no rank had taken the request up, so it can safely run again."""

    def __init__(self, message: str, request_started: bool = True):
        super().__init__(message)
        self.request_started = request_started


class Interrupted(TPUError):
    """The user cancelled; every rank stopped at its next step (or the group was stopped, as the message says).
    Raised in a worker by its step callback (replied as `Stopped`), and in the controller to the node."""

    DEFAULT = "interrupted by the user"


# The input errors a worker may raise; they come back over the link by name and are raised again as such.
INPUT_ERRORS: dict[str, type[InputError]] = {c.__name__: c for c in (InputError, ModelError, CompileError,
                                                                    DeviceError, ParallelError)}

for _cls in (TPUError, InputError, ModelError, CompileError, DeviceError, ParallelError, WorkerError,
             WorkerCrashed, Interrupted):
    _cls.__module__ = PUBLIC_MODULE
