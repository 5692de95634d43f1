"""Every random number of a pipeline call comes from a CPU generator the pack made (backend/worker/rng.py).

On a TPU a draw from any other generator (a TPU one, or the global generator on the device) would run TorchTPU's
random generator, which diffusers' own TorchTPU work avoids (PR #14039: "TPU RNG has an unaligned DUS bug —
generate on CPU"). On the CPU every device is the CPU, so checking where the numbers land proves nothing: the test
checks whose generator each draw uses instead, in the worker's own Runtime (in this process, on the CPU, which
runs the TPU's code path: rng.CPU_DRAWS). Two recorders: a TorchFunctionMode sees each draw with its generator
object; a TorchDispatchMode counts every aten op tagged nondeterministic_seeded, so that no draw goes unseen.
The pixels stay plain diffusers' (tests/test_samplers.py, tests/test_controlnet.py -k sd3).
"""

from __future__ import annotations

import traceback
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from backend.controller import api
from backend.protocol import samplers
from backend.protocol.spec import SampleRequest
from backend.worker import rng
from backend.worker.runtime import Runtime

RANDOM = {torch.randn, torch.rand, torch.randint, torch.randperm, torch.normal, torch.randn_like, torch.rand_like,
          torch.randint_like, torch.bernoulli, torch.multinomial, torch.poisson, torch.Tensor.normal_,
          torch.Tensor.uniform_, torch.Tensor.bernoulli_, torch.Tensor.random_, torch.Tensor.exponential_,
          torch.Tensor.cauchy_, torch.Tensor.log_normal_, torch.Tensor.geometric_}


class Draws(TorchFunctionMode):
    """Each random function called: (name, generator, where)."""

    def __init__(self):
        super().__init__()
        self.draws: list[tuple[str, object, str]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in RANDOM:
            here = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(traceback.extract_stack()[:-1])
                         if "torch" not in Path(f.filename).parts[-3:-1] and f.filename != __file__), "?")
            self.draws.append((func.__name__, kwargs.get("generator"), here))
        return func(*args, **kwargs)


class SeededOps(TorchDispatchMode):
    """Every aten op that draws (tagged nondeterministic_seeded), however it was reached."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags and _draws_numbers(func, args, kwargs):
            self.ops.append(str(func))
        return func(*args, **kwargs)


def _draws_numbers(func, args: tuple, kwargs: dict) -> bool:
    """Attention and dropout carry the tag for their dropout, which draws only with p > 0 (and in training)."""
    name = func.overloadpacket.__name__
    if "scaled_dot_product" in name:
        return kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0) > 0
    if "dropout" in name:
        return bool(args[2] if len(args) > 2 else kwargs.get("train", True)) and args[1] > 0
    return True


class _Channel:
    """The worker's channel, as far as the Runtime uses it here: status lines, and no interrupt."""

    class _Never:
        @staticmethod
        def is_set() -> bool:
            return False

    interrupt = _Never()

    def send(self, msg) -> None:
        pass


def _draws(runtime: Runtime, spec, req: SampleRequest, image: np.ndarray | None = None) -> list:
    prepared = api.prepare_sample(spec, req, image=image)
    runtime.prepare(prepared.spec)
    draws, ops = Draws(), SeededOps()
    with draws, ops:
        runtime.sample(prepared.spec, prepared.req, prepared.arrays)
    assert draws.draws, "the recorder saw no draw at all"
    assert len(ops.ops) == len(draws.draws), (ops.ops, draws.draws)
    return [(name, where) for name, g, where in draws.draws if not any(g is ours for ours in rng.PACK_GENERATORS)]


def _request(**kw) -> SampleRequest:
    base = dict(prompt="a red fox in the snow", width=64, height=64, steps=3, guidance=5.0, seed=7, batch_size=1)
    return SampleRequest(**{**base, **kw})


STOCHASTIC = [name for name, method in samplers.CLASSIC.items() if method.stochastic]


@pytest.fixture(scope="module")
def runtime():
    return Runtime(kind="cpu", device=torch.device("cpu"), rank=0, world_size=1, channel=_Channel())


@pytest.mark.workers
def test_the_stochastic_samplers_and_image_to_image_draw_only_from_the_packs_generators(tiny_models, runtime):
    assert "cpu" in rng.CPU_DRAWS and "tpu" in rng.CPU_DRAWS
    assert {"euler_ancestral", "dpmpp_sde", "dpmpp_2m_sde", "lcm", "ddpm"} <= set(STOCHASTIC)
    spec = api.make_spec("tiny-sdxl", [str(tiny_models)], dtype="float32")
    for sampler in STOCHASTIC:
        assert _draws(runtime, spec, _request(sampler=sampler)) == [], sampler
    picture = np.random.default_rng(0).random((1, 64, 64, 3), dtype=np.float32)
    for sampler in ("euler_ancestral", "dpmpp_sde"):  # image to image: the VAE posterior and the start noise too
        assert _draws(runtime, spec, _request(sampler=sampler, denoise=0.6), image=picture) == [], sampler


@pytest.mark.workers
def test_sd3_controlnet_draws_its_control_latents_from_the_packs_generator(tiny_models, tiny_controlnets, runtime):
    control = np.random.default_rng(1).random((1, 64, 64, 3), dtype=np.float32)
    spec = api.make_spec("tiny-sd3", [str(tiny_models)], dtype="float32")
    spec, _ = api.with_controlnet(spec, str(tiny_controlnets / "tiny-sd3"), control, 0.7)
    assert _draws(runtime, spec, _request(guidance=4.0, steps=2)) == []


@pytest.mark.workers
def test_the_recorder_catches_the_draws_plain_diffusers_makes_on_other_generators(tiny_models, tiny_controlnets,
                                                                                    runtime, monkeypatch):
    """Without the pack's redirection (as on CUDA, outside CPU_DRAWS), torchsde's own generator (DPM++ SDE) and the
    global one (SD3 ControlNet) are seen: the two draws that would run on a TPU."""
    monkeypatch.setattr(rng, "CPU_DRAWS", ())
    spec = api.make_spec("tiny-sdxl", [str(tiny_models)], dtype="float32")
    caught = _draws(runtime, spec, _request(sampler="dpmpp_sde"))
    assert caught and {where for _, where in caught} == {"brownian_interval.py:32"}, caught
    control = np.random.default_rng(1).random((1, 64, 64, 3), dtype=np.float32)
    sd3, _ = api.with_controlnet(api.make_spec("tiny-sd3", [str(tiny_models)], dtype="float32"),
                                 str(tiny_controlnets / "tiny-sd3"), control, 0.7)
    assert [where for _, where in _draws(runtime, sd3, _request(guidance=4.0, steps=2))] == ["torch_utils.py:110"]
