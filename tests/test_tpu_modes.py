"""TPU execution modes on the CPU, with only the hardware faked.

Strict eager: the UNets' `time_proj` runs on the CPU on a TPU, as diffusers' TorchTPU work does (PR #14039,
unet_2d_condition.py: "torch.cat([sin, cos], dim=-1) inside time_proj lands at an unaligned offset in the XLA DUS
fusion emitter → crash"): installed for a TPU worker only, exactly there, and it changes no pixels.
"""

from __future__ import annotations

import traceback

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from backend.worker import device


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
