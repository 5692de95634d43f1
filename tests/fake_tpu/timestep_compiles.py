"""Test-only: the pack's compiled denoiser under TorchTPU's real TpuBackend, its XLA compile swapped for a recorder
(tests/test_tpu_modes.py). Run in the venv that has torch_tpu 0.2.0:

    python tests/fake_tpu/timestep_compiles.py <tiny models folder> '[["tiny-sdxl", {"steps": 4}], ...]'

The worker's own Runtime (on the CPU) compiles each model's whole denoiser with backend "tpu": TpuBackend's
dynamo guards (its storage-offset guard included) and aot_autograd run as on a TPU; only the compiler it makes
(`make_backend_compiler`) is a recorder that keeps the graph's inputs and runs the graph on the CPU. Prints one
JSON line per request: the compiles so far, and the small float inputs the compiled graph was called with.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ["TPU_SKIP_MDS_QUERY"] = "1"  # never let a stray runtime start block for ~10 minutes
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

import torch  # noqa: E402
import torch_tpu  # noqa: E402, F401
from torch._dynamo.backends import registry  # noqa: E402
from torch_tpu._internal.compile import _backend  # noqa: E402

COMPILES: list[dict] = []  # per forward compile: its small float inputs (shape, dtype), its inputs and constants
CALLS: list[list[float]] = []  # per call of a compiled graph: its float32 inputs of one or two numbers


class Recorder:
    """What make_backend_compiler returns, recording instead of compiling with XLA."""

    def execute_pre_grad_passes(self, gm) -> None:
        pass

    def __call__(self, gm, example_inputs, is_fwd, module_name=None):
        inputs = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
        COMPILES.append({"small": [[list(v.shape), str(v.dtype)] for v in inputs if isinstance(v, torch.Tensor)
                                   and v.dtype == torch.float32 and v.numel() <= 2],
                         "inputs": len(inputs), "constants": [n.target for n in gm.graph.nodes if n.op == "get_attr"]})

        def run(*args):
            CALLS.append([float(a.flatten()[0]) for a in args if isinstance(a, torch.Tensor)
                          and a.dtype == torch.float32 and a.numel() <= 2])
            return gm(*args)

        return run


def main(models: str, cases: list) -> None:
    from backend.controller import api
    from backend.protocol.spec import SampleRequest
    from backend.worker.runtime import Runtime

    _backend.make_backend_compiler = lambda *a, **k: Recorder()
    # TpuBackend as TorchTPU registers it, without serialization (which wants XLA's OutputCode, not a graph)
    registry._COMPILER_FNS["tpu"] = _backend.TpuBackend(enable_serialization=False)
    torch.set_num_threads(1)

    class Channel:
        class interrupt:  # noqa: N801
            @staticmethod
            def is_set() -> bool:
                return False

        def send(self, msg) -> None:
            pass

    runtime = Runtime(kind="cpu", device=torch.device("cpu"), rank=0, world_size=1, channel=Channel())
    for name, request in cases:
        # checked on this CPU host with a backend it takes, then handed to the worker with TorchTPU's
        spec, _ = api.with_compile(api.make_spec(name, [models], dtype="float32"), "whole denoiser", "eager", "")
        req = SampleRequest(**{"prompt": "a red fox", "width": 32, "height": 32, "steps": 4, "guidance": 3.0,
                               "seed": 7, **request})
        prepared = api.prepare_sample(spec, req)
        spec = prepared.spec.with_changes(compile=dataclasses.replace(prepared.spec.compile, backend="tpu"))
        runtime.prepare(spec)
        before = len(CALLS)
        with torch.no_grad():
            runtime.sample(spec, prepared.req, prepared.arrays)
        print(json.dumps({"name": name, "request": request, "compiles": len(COMPILES), "inputs": COMPILES[-1:],
                          "calls": CALLS[before:]}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
