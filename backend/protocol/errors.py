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
    """A model (folder, file or LoRA) cannot be used, or cannot do what is asked of it (a size, an image)."""


class OptionError(InputError):
    """A loader's option cannot be used as chosen: a dtype or offload that is not one of its choices, or does not
    fit the device."""


class SampleError(InputError):
    """A value given to Sample cannot work, whatever the model: steps, batch size, seed, the prompt, a number that
    is not finite."""


class CompileError(InputError):
    """An execution mode or compile setting cannot work here."""


class DeviceError(InputError):
    """A requested device cannot be used here."""


class ParallelError(InputError):
    """A Shard TP / Data Parallel layout cannot run on this model or host."""


class RankError(TPUError):
    """An error that names a worker process: which `rank`, its `pid`, and its `host` (None: this host) as fields,
    beside the same words in the message ("rank 1 (pid 123 on host 10.0.0.2)"). Fields are None where no one
    rank is the cause."""

    def __init__(self, message: str, *, rank: int | None = None, pid: int | None = None, host: str | None = None):
        super().__init__(message)
        self.rank, self.pid, self.host = rank, pid, host


class WorkerError(RankError, RuntimeError):
    """A request failed inside a worker; the group is still usable (or was restarted, as the message says)."""


class WorkerCrashed(RankError, RuntimeError):
    """A worker died, stopped answering or could not start (here or on another host); the group was stopped and
    the next request starts a fresh one. `request_started` is False when no rank had taken the request up, so it
    can safely run again."""

    def __init__(self, message: str, request_started: bool = True, **where):
        super().__init__(message, **where)
        self.request_started = request_started


class Interrupted(RankError):
    """The user cancelled; every rank stopped at its next step (or the group was stopped, as the message says).
    Raised in a worker by its step callback (replied as `Stopped`), and in the controller to the node."""

    DEFAULT = "interrupted by the user"


# The input errors a worker may raise; they come back over the link by name and are raised again as such.
INPUT_ERRORS: dict[str, type[InputError]] = {c.__name__: c for c in (InputError, ModelError, OptionError,
                                                                    SampleError, CompileError, DeviceError,
                                                                    ParallelError)}

for _cls in (TPUError, InputError, ModelError, OptionError, SampleError, CompileError, DeviceError, ParallelError,
             RankError, WorkerError, WorkerCrashed, Interrupted):
    _cls.__module__ = PUBLIC_MODULE
