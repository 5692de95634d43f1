"""Device detection: fast, never starts a TPU runtime, and with the real torch_tpu installed keeps
ComfyUI's process free of the ~10-minute metadata-server hang."""

from __future__ import annotations

import os
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from backend.controller import devices as device

ROOT = Path(__file__).resolve().parent.parent
TPU_VENV = os.environ.get("TPU_VENV")
needs_tpu_venv = pytest.mark.skipif(not TPU_VENV, reason="TPU_VENV (venv with torch-tpu + libtpu) not set")


def _fake_pci(root: Path, vendor: str, dev: str, group: str = "7", vfio: bool = True) -> None:
    d = root / "sys/bus/pci/devices/0000:00:04.0"
    d.mkdir(parents=True)
    (d / "vendor").write_text(vendor + "\n")
    (d / "device").write_text(dev + "\n")
    groups = root / "sys/kernel/iommu_groups" / group
    groups.mkdir(parents=True)
    (d / "iommu_group").symlink_to(groups)
    if vfio:
        (root / "dev/vfio").mkdir(parents=True)
        (root / "dev/vfio" / group).write_text("")


def test_pci_scan_finds_a_tpu_only_when_vfio_can_open_it(tmp_path):
    _fake_pci(tmp_path / "a", "0x1ae0", "0x006f")
    assert device.tpu_chips(str(tmp_path / "a")) == ["v6e"]
    _fake_pci(tmp_path / "b", "0x1ae0", "0x0063", vfio=False)
    assert device.tpu_chips(str(tmp_path / "b")) == []
    _fake_pci(tmp_path / "c", "0x10de", "0x2335")  # an NVIDIA GPU
    assert device.tpu_chips(str(tmp_path / "c")) == []


def test_this_host_has_no_tpu_and_resolves_to_cpu():
    t0 = time.monotonic()
    info = device.detect()
    assert time.monotonic() - t0 < 5
    assert info.kind == "cpu" and info.count == 1
    assert device.resolve_kind("auto") == "cpu"
    assert device.resolve_kind("cpu") == "cpu"


@pytest.mark.parametrize("choice, words", [("tpu", "device 'tpu'"), ("cuda", "device 'cuda'"),
                                           ("gpu", "not one of")])
def test_unavailable_device_names_the_input_and_the_fix(choice, words):
    with pytest.raises(device.DeviceError) as e:
        device.resolve_kind(choice)
    assert words in str(e.value)
    assert "auto" in str(e.value)


def test_dist_backend_per_kind():
    from backend.worker.device import dist_backend

    assert [dist_backend(k) for k in ("tpu", "cuda", "cpu")] == ["tpu_dist", "nccl", "cpu:gloo"]


def _run_in_tpu_venv(code: str, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([f"{TPU_VENV}/bin/python", "-c", textwrap.dedent(code)], cwd=ROOT, timeout=timeout,
                          capture_output=True, text=True, env={**os.environ, **(env or {})})


@needs_tpu_venv
def test_detection_with_real_torch_tpu_installed_is_fast_and_says_no_tpu():
    """Timed inside the child, after `import torch` (which autoloads torch_tpu): process start and imports
    vary with machine load; the detection itself must not wait on anything."""
    out = _run_in_tpu_venv("""
        import time
        import torch
        from backend.controller import devices as device
        t0 = time.monotonic()
        kind = device.detect().kind
        elapsed = time.monotonic() - t0
        print(device.torch_tpu_installed(), device.tpu_present(), kind, elapsed)
    """, timeout=60)
    assert out.returncode == 0, out.stderr
    installed, present, kind, elapsed = out.stdout.split()
    assert [installed, present, kind] == ["True", "False", "cpu"]
    assert float(elapsed) < 1.0


@needs_tpu_venv
def test_prestartup_keeps_torch_tpu_out_and_cpu_backward_takes_seconds():
    """What ComfyUI's process does: the pack's prestartup script, then import torch, then a CPU backward().
    Without the prestartup script the first backward() blocks ~10 minutes on this host (FACTS §6)."""
    t0 = time.monotonic()
    out = _run_in_tpu_venv("""
        import os, runpy, sys
        runpy.run_path("prestartup_script.py")
        import torch
        x = torch.ones(4, requires_grad=True)
        (x * 3).sum().backward()
        print(os.environ["TPU_SKIP_MDS_QUERY"], os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"],
              "torch_tpu" in sys.modules, float(x.grad.sum()))
    """, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "[ComfyUI-TPU] set TPU_SKIP_MDS_QUERY=1, TORCH_DEVICE_BACKEND_AUTOLOAD=0" in out.stdout
    assert out.stdout.strip().splitlines()[-1].split() == ["1", "0", "False", "12.0"]
    assert time.monotonic() - t0 < 60


@needs_tpu_venv
def test_torch_tpu_api_we_call_exists_without_touching_a_device():
    """The names backend.device uses exist in the installed torch_tpu 0.2 (autoloaded, no runtime started)."""
    out = _run_in_tpu_venv("""
        import torch
        import torch_tpu  # noqa
        modes = [m.name for m in torch.tpu.EagerMode if not m.name.startswith('_')]
        print(sorted(modes))
        print(callable(torch.tpu.distributed.set_tpu_launch_env), callable(torch.tpu.set_eager_mode))
        import torch.distributed as dist
        print("tpu_dist" in dist.Backend.backend_list or hasattr(dist.Backend, "TPU_DIST"))
    """, timeout=120, env={"TPU_SKIP_MDS_QUERY": "1"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0] == str(sorted(["DEFER_AND_FUSE", "DEFER_NEVER", "DEFER_NEVER_AND_LAUNCH_BLOCKING"]))
    assert lines[1] == "True True"


@needs_tpu_venv
def test_comfyui_with_torch_tpu_installed_starts_and_runs_the_demo(comfyui_dir, tiny_models, tmp_path):
    from comfy_server import ComfyServer, load_workflow

    srv = ComfyServer(str(comfyui_dir), str(tiny_models), work_dir=str(tmp_path), python=f"{TPU_VENV}/bin/python")
    with srv:
        info = srv.get("/object_info/LoadTPUPipeline").json()
        assert "LoadTPUPipeline" in info
        result = srv.run(load_workflow(ROOT / "workflows/api/tiny_demo.json"), timeout=240)
        assert result["status"] == "success", srv.log_tail()
        assert result["images"] and result["images"][0].exists()
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in srv.log_path.read_text()
