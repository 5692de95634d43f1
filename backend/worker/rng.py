"""Random numbers: every draw of a pipeline call comes from a CPU generator the pack made (worker side).

TorchTPU's random generator crashes libtpu on an unaligned dynamic-update-slice, so diffusers' own TorchTPU work
draws on the CPU and moves the numbers (huggingface/diffusers#14039, utils/torch_utils.py: "TPU RNG has an
unaligned DUS (dynamic-update-slice) bug — generate on CPU"). diffusers already does that for every draw given a
CPU generator (`randn_tensor`), and the worker hands the pipeline one per image (`generator`). Two draws of the
pipelines the pack runs take no generator of the call: DPM++ SDE's Brownian tree (torchsde makes a generator of
its own on the latents' device) and SD3 ControlNet's control-image latents (`latent_dist.sample()`, the global
generator on the VAE's device). `cpu_draws` points both at CPU generators the pack makes, seeded as before, so
the numbers on the CPU are bit for bit the ones plain diffusers draws (tests/test_rng.py).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch

# Device kinds whose draws the pack makes on the CPU: the TPU (the bug), and the CPU itself, where the numbers are
# the same as drawing without the pack (so the CPU tests run the TPU's code). CUDA keeps its own generators.
CPU_DRAWS = ("cpu", "tpu")

# Every generator the worker made (held weakly): tests/test_rng.py fails on any draw from another.
PACK_GENERATORS: weakref.WeakSet = weakref.WeakSet()


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with `seed`, known to be the pack's."""
    made = torch.Generator("cpu").manual_seed(int(seed))
    PACK_GENERATORS.add(made)
    return made


def _brownian_randn(size, dtype, device, seed) -> torch.Tensor:
    """torchsde's `_randn` (brownian_interval.py: a new generator on `device` seeded with `seed` per draw), drawn
    on a CPU generator instead and moved: the CPU numbers are torchsde's own."""
    return torch.randn(size, dtype=dtype, generator=generator(seed)).to(device)


@contextlib.contextmanager
def cpu_draws(kind: str, seed: int) -> Iterator[None]:
    """Around one pipeline call on `kind`: DPM++ SDE's Brownian noise and a VAE posterior sampled without a
    generator (SD3 ControlNet's control image) draw on CPU generators the pack made; `seed` is the image's (the
    global generator's stream after `torch.manual_seed(seed)`, which the pack seeded for SD3 ControlNet before)."""
    if kind not in CPU_DRAWS:
        yield
        return
    from diffusers.models.autoencoders.vae import DiagonalGaussianDistribution

    with contextlib.ExitStack() as undo:
        if brownian := _brownian_interval():
            undo.enter_context(_replaced(brownian, "_randn", _brownian_randn))
        default = generator(seed)
        own_sample = DiagonalGaussianDistribution.sample

        def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
            return own_sample(self, default if generator is None else generator)

        undo.enter_context(_replaced(DiagonalGaussianDistribution, "sample", sample))
        yield


def _brownian_interval() -> Any:
    """torchsde's brownian_interval module, as diffusers' DPMSolverSDEScheduler imports it (torchsde is diffusers'
    optional dependency for that scheduler, which ComfyUI installs); None without it (then nothing draws there)."""
    try:
        from diffusers.schedulers import scheduling_dpmsolver_sde
    except ImportError:
        return None
    return scheduling_dpmsolver_sde.torchsde._brownian.brownian_interval


@contextlib.contextmanager
def _replaced(owner: object, name: str, value: object) -> Iterator[None]:
    own = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, own)
