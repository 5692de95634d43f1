"""The messages between the controller and its workers (the environment a worker starts with: `settings`).

On the wire every message is a plain dict (pickled by `multiprocessing.connection` after the HMAC handshake);
arrays travel beside it (`handoff`). Both sides build messages with the constructors here and read them with
`read_request` / `read_reply`, so the format lives in this one file.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from .spec import PipelineSpec, SampleRequest

HEARTBEAT_S = 2.0  # a busy worker says it is alive this often


# ---- controller → worker
LOAD, SAMPLE, DECODE, INFO, INTERRUPT, SHUTDOWN = "load", "sample", "decode", "info", "interrupt", "shutdown"


@dataclass(frozen=True)
class Request:
    op: str
    id: int | None = None
    spec: PipelineSpec | None = None
    request: SampleRequest | None = None
    arrays: dict[str, Any] = field(default_factory=dict)  # input images of a sample (numpy, by handoff)


def load_request(rid: int, spec: PipelineSpec) -> dict:
    return {"op": LOAD, "id": rid, "spec": spec.to_dict()}


def sample_request(rid: int, spec: PipelineSpec, req: SampleRequest) -> dict:
    return {"op": SAMPLE, "id": rid, "spec": spec.to_dict(), "request": req.to_dict()}


def decode_request(rid: int, spec: PipelineSpec) -> dict:
    """VAE Decode (TPU): the LATENT travels beside it (arrays["latent"])."""
    return {"op": DECODE, "id": rid, "spec": spec.to_dict()}


def info_request(rid: int) -> dict:
    return {"op": INFO, "id": rid}


def interrupt(rid: int) -> dict:
    return {"op": INTERRUPT, "id": rid}


def shutdown() -> dict:
    return {"op": SHUTDOWN}


def read_request(msg: dict, arrays: dict[str, Any] | None = None) -> Request:
    spec, req = msg.get("spec"), msg.get("request")
    return Request(op=msg["op"], id=msg.get("id"), spec=PipelineSpec.from_dict(spec) if spec else None,
                   request=SampleRequest.from_dict(req) if req else None, arrays=arrays or {})


# ---- worker → controller


@dataclass(frozen=True)
class Hello:
    """A rank joined torch.distributed and is ready for requests."""

    rank: int
    local_rank: int
    world_size: int
    pid: int
    device: str


@dataclass(frozen=True)
class Accepted:
    """A rank took the request off its queue: from here on, a crash is the request's failure."""

    id: int | None


@dataclass(frozen=True)
class Status:
    """A line of text for the user (shown next to the node that asked)."""

    id: int | None
    text: str


@dataclass(frozen=True)
class Step:
    """A denoising step finished: `step` of `total` steps of this rank's share; `step_s` is its duration."""

    id: int | None
    step: int
    total: int
    step_s: float
    rank: int = 0


def steps_per_image(req: SampleRequest) -> int:
    """The denoising steps each image (video) of `req` takes, as Step messages count them: with LTX-2's two-stage
    upscale (upscale_model) stage 1's steps, then one per stage-2 sigma."""
    return req.steps + (len(req.upscale_sigmas) if req.upscale_model else 0)


@dataclass(frozen=True)
class Heartbeat:
    """A busy rank is alive (sent every HEARTBEAT_S while it serves a request)."""


@dataclass(frozen=True)
class Result:
    id: int | None
    value: dict = field(default_factory=dict)
    arrays: dict[str, Any] = field(default_factory=dict)  # numpy arrays, carried by handoff


@dataclass(frozen=True)
class Failure:
    id: int | None
    message: str
    traceback: str = ""
    input_error: str = ""  # the InputError subclass the worker raised (e.g. "ModelError"), raised again as such


@dataclass(frozen=True)
class Stopped:
    """The request was interrupted at a step boundary."""

    id: int | None


Reply = Hello | Accepted | Status | Step | Heartbeat | Result | Failure | Stopped
_REPLIES: dict[str, type] = {cls.__name__.lower(): cls for cls in (Hello, Accepted, Status, Step, Heartbeat,
                                                                  Result, Failure, Stopped)}
FINAL = (Result, Failure, Stopped)  # the replies that end a request


def encode_reply(msg: Reply) -> tuple[dict, dict[str, Any]]:
    """The wire dict of a reply, and the arrays that travel beside it."""
    data = {f.name: getattr(msg, f.name) for f in fields(msg) if f.name != "arrays"}
    return {"type": type(msg).__name__.lower(), **data}, getattr(msg, "arrays", {}) or {}


def read_reply(msg: dict, arrays: dict[str, Any] | None = None) -> Reply:
    data = dict(msg)
    cls = _REPLIES[data.pop("type")]
    if cls is Result:
        data["arrays"] = arrays or {}
    return cls(**data)


def as_dict(msg: Reply) -> dict:
    """A reply as a plain dict (for logs and the benchmark's records)."""
    return asdict(msg)
