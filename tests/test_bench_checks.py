"""The benchmark's own checks that run before a figure, on the device kinds this machine lacks (the device
detection is replaced by what it reports on a 1-GPU host, a 2-GPU host and a TPU host whose TorchTPU launches
no group of 2): a figure that needs two workers says why it is not available instead of failing."""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.controller import devices
from bench.common import Ctx, two_workers

pytestmark = pytest.mark.unit


def _ctx(kind: str) -> Ctx:
    return Ctx(quick=True, repeats=1, warmup=0, threads=1, kind=kind, dtype="bfloat16", models_dir=Path("."),
               model="tiny-flux", sizes=("tiny-flux", "tiny-flux"), width=64, height=64, steps=2, work=Path("."),
               comfyui_dir=None)


@pytest.mark.parametrize(("info", "why"), [
    (devices.DeviceInfo("cuda", "NVIDIA H200", 1, 1, 139.0, False), "needs 2 cuda chips; this host has 1"),
    (devices.DeviceInfo("cuda", "NVIDIA H200", 2, 2, 139.0, False), None),
    (devices.DeviceInfo("tpu", "TPU v6e", 8, 8, 31.25, True, (1, 4, 8)),
     "needs a group of 2 tpu workers; TorchTPU launches (1, 4, 8) on this host"),
    (devices.DeviceInfo("tpu", "TPU v6e", 4, 4, 31.25, True, (1, 2, 4)), None),
])
def test_two_worker_figures_say_why_a_host_cannot_run_them(monkeypatch, info, why):
    monkeypatch.setattr(devices, "detect", lambda: info)
    assert two_workers(_ctx(info.kind)) == why


def test_per_round_ratios_and_the_whole_video_at_a_real_share():
    """The noise a row states (median and quartiles of its per-round ratios) and the Amdahl projection of a denoising
    speed-up onto a video that leaves a share whole."""
    from bench.common import spread
    from bench.video import projected

    got = spread([2.0, 3.0, 4.0, 9.0, 1.0], [2.0, 2.0, 2.0, 3.0, 1.0])
    assert got["per_round_ratios"] == [1.0, 1.5, 2.0, 3.0, 1.0]
    assert got["paired_ratio_median"] == 1.5
    assert got["paired_ratio_quartiles"] == [1.0, 2.0]
    assert spread([3.0], [2.0])["paired_ratio_quartiles"] == [1.5, 1.5]
    assert projected(1.6, 0.0) == pytest.approx(1.6)
    assert projected(1.6, 1.0) == pytest.approx(1.0)
    assert projected(2.0, 0.5) == pytest.approx(4 / 3)


def test_a_layout_the_pack_refuses_becomes_a_row_with_its_reason(tiny_models):
    """The 2026 families' layout rows (bench/families26.py): an accepted layout is measured, a refused one gets the
    pack's own refusal as its reason, checked before any worker starts (MiniMax H3's CFG Parallel: guidance
    distilled, one pass); LTX-2's Context Parallel is accepted (its own plan), at the layouts' 25 fps sizes."""
    from backend.controller import api
    from backend.protocol.spec import SampleRequest
    from bench.families26 import _layout_spec

    ltx = api.make_spec("tiny-ltx2", [str(tiny_models)])
    minimax = api.make_spec("tiny-minimax-h3", [str(tiny_models)])
    assert _layout_spec(ltx, "cfg").world_size == 2
    cp = _layout_spec(ltx, "cp")
    assert cp.world_size == 2
    # quick; full: the CFG row's 768x512 x 33 and the Context Parallel row's 768x512 x 121 (LTX-2's default video)
    for shape in (dict(width=64, height=64, frames=9), dict(width=768, height=512, frames=33),
                  dict(width=768, height=512, frames=121)):
        api.check_request(cp, SampleRequest(prompt="a fox", frame_rate=25.0, **shape))
    assert "guidance distilled" in _layout_spec(minimax, "cfg")
