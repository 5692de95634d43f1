"""TPU execution modes on the CPU, with only the hardware faked.

Strict eager: the UNets' `time_proj` runs on the CPU on a TPU, as diffusers' TorchTPU work does (PR #14039,
unet_2d_condition.py: "torch.cat([sin, cos], dim=-1) inside time_proj lands at an unaligned offset in the XLA DUS
fusion emitter → crash"): installed for a TPU worker only, exactly there, and it changes no pixels.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from backend.protocol.spec import MODE_CHOICES, UNGUIDED_TPU_MODES, mode_note
from backend.worker import device

ROOT = Path(__file__).resolve().parent.parent


class _CpuCalls(TorchFunctionMode):
    """Counts `Tensor.cpu` calls made by the detour (backend/worker/device.py)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.cpu and traceback.extract_stack()[-2].filename == device.__file__:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _sdxl_controlnet(tiny_models, tiny_controlnets):
    import diffusers

    controlnet = diffusers.ControlNetModel.from_pretrained(str(tiny_controlnets / "tiny-sdxl"), dtype=torch.float32)
    pipe = diffusers.StableDiffusionXLControlNetPipeline.from_pretrained(
        str(tiny_models / "tiny-sdxl"), controlnet=controlnet, dtype=torch.float32, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _run(pipe) -> np.ndarray:
    control = np.random.default_rng(1).random((64, 64, 3), dtype=np.float32)
    with torch.inference_mode():
        return pipe(prompt="a red fox", image=control[None], num_inference_steps=3, guidance_scale=5.0,
                    height=64, width=64, generator=[torch.Generator("cpu").manual_seed(7)], output_type="np").images


@pytest.mark.workers
def test_the_time_proj_detour_is_installed_on_a_tpu_only_where_the_pr_puts_it_and_changes_no_pixels(
        tiny_models, tiny_controlnets, monkeypatch):
    pipe = _sdxl_controlnet(tiny_models, tiny_controlnets)
    plain = _run(pipe)
    assert device.eager_workarounds("cpu", pipe) == device.eager_workarounds("cuda", pipe) == 0
    assert device.eager_workarounds("tpu", pipe) == 2
    assert device.eager_workarounds("tpu", pipe) == 0, "installed once"
    detoured = sorted(f"{key}.{name}" for key, c in pipe.components.items() if isinstance(c, torch.nn.Module)
                      for name, m in c.named_modules() if getattr(m, "_cpu_detour", False))
    assert detoured == ["controlnet.time_proj", "unet.time_proj"]  # not add_time_proj, not the text encoders
    with _CpuCalls() as idle:
        assert np.array_equal(_run(pipe), plain)
    assert idle.count == 0, "timesteps on the CPU take no detour"
    monkeypatch.setattr(device, "DETOUR_DEVICES", ("cpu",))  # the CPU stands in for the TPU: the detour runs
    with _CpuCalls() as calls:
        assert np.array_equal(_run(pipe), plain)
    assert calls.count == 3 * 2, "once per step in the UNet and in the ControlNet"
    compiled = torch.compile(pipe.unet, backend="eager", fullgraph=True, dynamic=False)
    sample = torch.randn(2, 4, 8, 8)
    embeds, added = torch.randn(2, 77, pipe.unet.config.cross_attention_dim), {
        "text_embeds": torch.randn(2, pipe.text_encoder_2.config.projection_dim), "time_ids": torch.zeros(2, 6)}
    with torch.inference_mode():  # compiled (fullgraph): no detour, no graph break
        out = compiled(sample, torch.tensor([500.0]), embeds, added_cond_kwargs=added).sample
    assert torch.allclose(out, pipe.unet(sample, torch.tensor([500.0]), embeds,
                                                               added_cond_kwargs=added).sample, atol=1e-5)


# ---- compiled: the timestep is a graph input under TorchTPU's own backend, one compile for every step count

TIMESTEP_CASES = {  # per model: Sample requests run one after another on one compiled denoiser
    "tiny-sdxl": [{"steps": 4}, {"steps": 6}, {"steps": 5, "sampler": "euler_ancestral"},
                  {"steps": 3, "sampler": "heun"}, {"steps": 4, "sampler": "dpmpp_2m"}],
    "tiny-sd3": [{"steps": 4}, {"steps": 6}],
    "tiny-flux": [{"steps": 4, "guidance": 0.0}, {"steps": 6, "guidance": 0.0}],
    "tiny-qwenimage": [{"steps": 4}, {"steps": 6}],
    "tiny-zimage": [{"steps": 4, "guidance": 0.0}, {"steps": 6, "guidance": 0.0}],
    "tiny-wan": [{"steps": 3, "frames": 5}, {"steps": 5, "frames": 5}],
}
BLOCK_GRAPHS = {"tiny-zimage": 3}  # compiled as its repeated blocks (compile_plan: its prompt steps), a graph per kind


@pytest.mark.workers
@pytest.mark.skipif(not os.environ.get("TPU_VENV"), reason="TPU_VENV (venv with torch-tpu) not set")
def test_the_compiled_denoiser_takes_the_timestep_as_an_input_and_compiles_once_for_every_step_count(tiny_models):
    """TorchTPU's TpuBackend (its dynamo guards, its storage-offset guard, aot_autograd) on the worker's compiled
    denoiser, only the XLA compile a recorder (tests/fake_tpu/timestep_compiles.py): one compile per model over
    several step counts and samplers; the timestep is a graph input whose value changes at every step; the weights
    are inputs too (no constants), as LoRAs need. Before the copy in worker/compiler.py, SDXL compiled once a step."""
    cases = [[name, request] for name, requests in TIMESTEP_CASES.items() for request in requests]
    proc = subprocess.run([f"{os.environ['TPU_VENV']}/bin/python", str(ROOT / "tests/fake_tpu/timestep_compiles.py"),
                           str(tiny_models), json.dumps(cases)], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [[r["name"], r["request"]] for r in lines] == cases
    before = 0  # the recorder's compiles, counted over the whole run
    for name, requests in TIMESTEP_CASES.items():
        runs = [r for r in lines if r["name"] == name]
        graphs = BLOCK_GRAPHS.get(name, 1)
        assert [r["compiles"] - before for r in runs] == [graphs] * len(requests), (name, graphs, runs[-1]["compiles"])
        before = runs[-1]["compiles"]
        for r in runs:
            (compiled,) = r["inputs"]
            assert compiled["constants"] == [] and compiled["inputs"] > 10, (name, compiled)
            if name in BLOCK_GRAPHS:  # its blocks take the timestep's embedding, computed outside them
                assert compiled["small"] == [], compiled
                continue
            assert len(compiled["small"]) == 1, compiled  # the timestep, an input...
            values = {call[0] for call in r["calls"]}
            assert len(values) == r["request"]["steps"], (name, r["request"], r["calls"])  # ...new at each step


@pytest.mark.unit
@pytest.mark.skipif(not os.environ.get("TPU_VENV"), reason="TPU_VENV (venv with torch-tpu) not set")
def test_every_saved_mode_maps_to_a_torch_tpu_eager_mode_and_a_tpu_says_which_ones_its_guide_keeps():
    """Saved workflows keep their mode (the choices and their order are unchanged); each maps to a member of
    TorchTPU 0.2.0's own EagerMode (read from its source); on a TPU the two its diffusers guide dropped say so."""
    source = next(Path(os.environ["TPU_VENV"]).glob(
        "lib/python3*/site-packages/torch_tpu/_internal/execution_mode/__init__.py"))
    tree = ast.parse(source.read_text())
    enum = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "EagerMode")
    members = {t.id for n in enum.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    assert MODE_CHOICES == ("strict eager", "defer-and-fuse eager", "compiled", "debug eager (launch blocking)")
    assert set(device.TPU_EAGER_MODES) == set(MODE_CHOICES) and set(device.TPU_EAGER_MODES.values()) <= members
    assert mode_note("tpu", "strict eager") is None and mode_note("tpu", "compiled") is None
    for mode in UNGUIDED_TPU_MODES:
        assert mode_note("tpu", mode).startswith(f"{mode}: TorchTPU's own mode") and "use strict eager or compiled" \
            in mode_note("tpu", mode)
    assert mode_note("cpu", "debug eager (launch blocking)") is None  # elsewhere as before
