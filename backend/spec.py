"""Immutable descriptions that flow through the node graph and over the worker channel.

Nodes build these; the backend compares them to decide what must really change: a new seed or prompt
reuses everything, a new model reloads, a new device or chip count restarts the worker group.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

DTYPE_CHOICES = ("auto", "bfloat16", "float16", "float32")
OFFLOAD_CHOICES = ("none", "model", "sequential")
MODE_CHOICES = ("strict eager", "defer-and-fuse eager", "compiled", "debug eager (launch blocking)")
COMPILE_TARGETS = ("whole denoiser", "repeated blocks")
COMPILE_BACKENDS = ("auto", "tpu", "inductor", "eager", "aot_eager")


@dataclass(frozen=True)
class CompilePlan:
    """How the denoiser (transformer or UNet) is compiled, and which shapes to compile up front."""

    target: str = "whole denoiser"
    backend: str = "auto"
    warmup: tuple[tuple[int, int, int], ...] = ()  # (width, height, batch) compiled before the first prompt
    snap_to_warmup: bool = False  # round a requested size to the nearest warmed-up one


@dataclass(frozen=True)
class PipelineSpec:
    """What pipeline to run and how. The TPU_PIPELINE value that nodes pass along."""

    model_path: str  # absolute, checked by backend.models
    class_name: str
    size_factor: int
    dtype: str = "auto"
    device: str = "auto"
    offload: str = "none"
    mode: str = "strict eager"
    compile: CompilePlan | None = None
    tp_degree: int = 1  # chips one model is split over (tensor parallel)
    tp_text_encoders: bool = False  # also shard text encoders that have a TP plan
    dp_replicas: int = 1  # copies of the (possibly sharded) model, each drawing different images

    @property
    def world_size(self) -> int:
        return self.tp_degree * self.dp_replicas

    def load_key(self) -> tuple:
        """Changing any of these reloads the weights; mode and compile plan do not."""
        return (self.model_path, self.dtype, self.offload, self.tp_degree, self.tp_text_encoders)

    def with_changes(self, **changes) -> PipelineSpec:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> PipelineSpec:
        plan = data.get("compile")
        if isinstance(plan, dict):
            plan = CompilePlan(**{**plan, "warmup": tuple(tuple(s) for s in plan.get("warmup", ()))})
        return cls(**{**data, "compile": plan})


@dataclass(frozen=True)
class SampleRequest:
    """One Sample call. Each image i of the batch uses its own generator seeded with seed + i."""

    prompt: str
    negative_prompt: str = ""
    width: int = 1024
    height: int = 1024
    steps: int = 20
    guidance: float = 3.5
    seed: int = 0
    batch_size: int = 1
    prompt_per_line: bool = False  # each non-empty line is a prompt; batch_size images each

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GroupConfig:
    """What a worker group is: changing it means stopping the group and starting another."""

    kind: str  # "tpu" | "cuda" | "cpu"
    world_size: int = 1
