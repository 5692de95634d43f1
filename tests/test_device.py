"""Device detection: fast, never starts a TPU runtime, and with the real torch_tpu installed keeps
ComfyUI's process free of the ~10-minute metadata-server hang."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from backend.controller import devices as device
from backend.controller import process_env
from backend.protocol import settings

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


@pytest.mark.unit
def test_pci_scan_finds_a_tpu_only_when_vfio_can_open_it(tmp_path):
    _fake_pci(tmp_path / "a", "0x1ae0", "0x006f")
    assert device.tpu_devices(str(tmp_path / "a")) == ["v6e"]
    _fake_pci(tmp_path / "b", "0x1ae0", "0x0063", vfio=False)
    assert device.tpu_devices(str(tmp_path / "b")) == []
    assert "cannot open through VFIO" in device.scan_pci(str(tmp_path / "b")).problem()
    _fake_pci(tmp_path / "c", "0x10de", "0x2335")  # an NVIDIA GPU
    assert device.tpu_devices(str(tmp_path / "c")) == [] and device.scan_pci(str(tmp_path / "c")).problem() is None


@pytest.mark.unit
@pytest.mark.parametrize("gen, vfio, accel", [("v4", False, True), ("v4", True, False), ("v5e", False, True)],
                         ids=["v4 through /dev/accel", "v4 even with VFIO", "another id through /dev/accel"])
def test_a_tpu_v4_host_is_named_as_unsupported_not_as_no_tpu(tmp_path, monkeypatch, gen, vfio, accel):
    from fake_tpu.hosts import make_root

    monkeypatch.setattr(device, "SYS_ROOT", make_root(tmp_path, gen, 4, vfio=vfio, accel=accel))
    assert device.tpu_devices() == []
    for choice in ("tpu", "auto"):
        with pytest.raises(device.DeviceError, match=rf"device '{choice}': .*TPU v4 is not supported by TorchTPU "
                                                     r"0\.2\.0.*Choose device 'cpu'"):
            device.resolve_kind(choice)
    info = device.detect()
    assert info.kind == "cpu" and any(device.V4_UNSUPPORTED in note for note in info.notes), info
    assert device.resolve_kind("cpu") == "cpu"


@pytest.mark.unit
def test_a_pod_host_is_refused_at_once_and_a_local_group_drops_the_pod_variables(monkeypatch):
    pod = {"TPU_WORKER_HOSTNAMES": "h0,h1,h2,h3", "JOB_COMPLETION_INDEX": "2", "TPU_WORKER_ID": "2"}
    assert device.pod_hosts({}) is None and device.pod_hosts({"TPU_WORKER_HOSTNAMES": "h0"}) is None
    assert device.pod_hosts(pod) == ["h0", "h1", "h2", "h3"]
    assert device.pod_hosts({"JOB_COMPLETION_INDEX": "0"}) == []  # TorchTPU takes the multi-host path too
    with pytest.raises(device.DeviceError, match=r"multi-host slice \(TPU_WORKER_HOSTNAMES lists 4 hosts\).*"
                                                 r"COMFYUI_TPU_HOSTS.*backend join.*COMFYUI_TPU_LOCAL_GROUP=1"):
        device.check_single_host(pod)
    device.check_single_host({**pod, settings.LOCAL_GROUP.name: "1"})
    assert [k for k in pod if k in process_env.worker_env("tpu", pod)] == list(pod), "no local group: left alone"
    local = process_env.worker_env("tpu", {**pod, settings.LOCAL_GROUP.name: "1", "PATH": "/bin"})
    assert [k for k in pod if k in local] == [] and local["PATH"] == "/bin"


@pytest.mark.unit
def test_this_host_has_no_tpu_and_resolves_to_cpu():
    info = device.detect()
    assert info.kind == "cpu" and (info.chips, info.devices) == (1, 1) and info.notes == ()
    assert device.resolve_kind("auto") == "cpu"
    assert device.resolve_kind("cpu") == "cpu"


@pytest.mark.unit
@pytest.mark.parametrize("choice, words", [("tpu", "device 'tpu'"), ("cuda", "device 'cuda'"),
                                           ("gpu", "not one of")])
def test_unavailable_device_names_the_input_and_the_fix(choice, words):
    with pytest.raises(device.DeviceError) as e:
        device.resolve_kind(choice)
    assert words in str(e.value)
    assert "auto" in str(e.value)


@pytest.mark.unit
def test_dist_backend_per_kind():
    from backend.worker.device import dist_backend

    assert [dist_backend(k) for k in ("tpu", "cuda", "cpu")] == ["tpu_dist", "nccl", "cpu:gloo"]


def _run_in_tpu_venv(code: str, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([f"{TPU_VENV}/bin/python", "-c", textwrap.dedent(code)], cwd=ROOT, timeout=timeout,
                          capture_output=True, text=True, env={**os.environ, **(env or {})})


@pytest.mark.workers
@needs_tpu_venv
def test_detection_with_real_torch_tpu_installed_says_no_tpu():
    """Detection after `import torch` (which autoloads torch_tpu) must not start the TPU runtime: on a host
    without a TPU that start waits about 10 minutes on the cloud metadata server, far past the child's 60 s."""
    out = _run_in_tpu_venv("""
        import torch
        from backend.controller import devices as device
        kind = device.detect().kind
        print(device.torch_tpu_installed(), device.tpu_present(), kind)
    """, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False", "cpu"]


@pytest.mark.workers
@needs_tpu_venv
def test_prestartup_keeps_torch_tpu_out_and_cpu_backward_does_not_hang():
    """What ComfyUI's process does: the pack's prestartup script, then import torch, then a CPU backward().
    Without the prestartup script, with torch_tpu installed and no TPU, the first backward() starts the TPU
    runtime, which retries the cloud metadata server for about 10 minutes: far past the child's 120 s."""
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


@pytest.mark.workers
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


@pytest.mark.server
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


@pytest.mark.unit
def test_a_tpu_worker_that_does_not_bind_one_device_says_what_torch_tpu_set_and_logged(tmp_path):
    """As in a worker: stderr is the group's log file (opened for reading and writing, as the launcher does),
    TorchTPU's C++ sets TPU_VISIBLE_CHIPS with setenv (invisible to os.environ) and logs its
    DistributedWorkerConfiguration line with absl's prefix (the line's text is a string in TorchTPU's library;
    its values here are made up), another rank logs one too."""
    code = textwrap.dedent("""
        import ctypes, os, sys
        from backend.worker.device import check_one_device
        check_one_device(1)
        ctypes.CDLL(None).setenv(b"TPU_VISIBLE_CHIPS", b"3", 1)
        print("TPU_VISIBLE_CHIPS" in os.environ, flush=True)
        os.write(2, b"I1201 06:00:00.000000 4242 distributed.cc:80] DistributedWorkerConfiguration: rank=9\\n")
        os.write(2, f"I1201 06:00:00.000001 {os.getpid()} distributed.cc:80] DistributedWorkerConfiguration: "
                    "rank=3 world_size=4 topology=2x2x1\\n".encode())
        try:
            check_one_device(4)
        except RuntimeError as e:
            print(e, flush=True)
    """)
    with open(tmp_path / "group.log", "w+b") as log:
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True,
                             timeout=60, env={**os.environ, "LOCAL_RANK": "3"})
    assert out.returncode == 0, (tmp_path / "group.log").read_text()
    seen, message = out.stdout.strip().splitlines()
    assert seen == "False", "os.environ must not see a variable set with C setenv"
    assert "sees 4 devices after binding, not 1" in message and "LOCAL_RANK=3" in message
    assert "TPU_VISIBLE_CHIPS=3" in message and "TPU_PROCESS_BOUNDS=None" in message
    assert message.count("DistributedWorkerConfiguration") == 1 and "rank=3 world_size=4 topology=2x2x1" in message
    assert message.endswith("`python -m backend tpu-check`.")


@pytest.mark.workers
@needs_tpu_venv
@pytest.mark.skipif(process_env.tcmalloc_path() is None, reason="no tcmalloc here (apt install libtcmalloc-minimal4)")
def test_tpu_workers_preload_tcmalloc_or_say_once_why_not_and_torch_tpu_agrees():
    """TorchTPU's own start-up check (torch_tpu/_tcmalloc_check.py) on `import torch_tpu`: it warns in a plain
    environment, and not in a TPU worker's, which preloads the system's tcmalloc; without one, the worker's
    environment filters the warning (said once by the controller instead)."""
    code = "import torch_tpu"
    plain = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "PYTHONWARNINGS")}
    worker = process_env.worker_env("tpu", plain)
    assert worker["LD_PRELOAD"] == process_env.tcmalloc_path() and "PYTHONWARNINGS" not in worker
    without = {**plain, **process_env.allocator_env(plain, dirs=())}
    assert "LD_PRELOAD" not in without and without["PYTHONWARNINGS"] == process_env.TCMALLOC_WARNING_FILTER
    runs = {name: subprocess.run([f"{TPU_VENV}/bin/python", "-c", code], cwd=ROOT, timeout=120, capture_output=True,
                                 text=True, env={**env, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "TPU_SKIP_MDS_QUERY": "1"})
            for name, env in (("plain", plain), ("worker", worker), ("without", without))}
    assert all(r.returncode == 0 for r in runs.values()), {n: r.stderr[-2000:] for n, r in runs.items()}
    warned = {name: "tcmalloc is not loaded" in r.stderr for name, r in runs.items()}
    assert warned == {"plain": True, "worker": False, "without": False}, warned


@pytest.mark.unit
def test_a_groups_tier2_cache_folder_is_removed_with_it_and_only_ours(tmp_path, monkeypatch):
    monkeypatch.setattr(process_env, "TIER2_ROOT", tmp_path)
    mine = process_env.tpu_group_env()
    name = mine[process_env.TIER2_CACHE]
    assert name.startswith(f"comfyui-tpu-{os.getuid()}-{os.getpid()}-")
    dead = f"comfyui-tpu-{os.getuid()}-999999999-ab12"  # a controller that died without cleaning up
    others = ["default", f"comfyui-tpu-{os.getuid() + 1}-999999999-ab12"]  # TorchTPU's own, another user's
    for folder in (name, dead, *others):
        (tmp_path / folder / "entry").mkdir(parents=True)
    process_env.remove_tier2_cache({process_env.TIER2_CACHE: "default"})  # never a name we did not make
    assert (tmp_path / "default").exists()
    process_env.remove_tier2_cache(mine)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(others)


@pytest.mark.unit
@pytest.mark.parametrize("name", ["tiny-flux", "tiny-flux2"])
def test_the_float64_downcast_tpu_workers_get_changes_pixels_on_the_cpu_by_at_most_1e_5(tiny_models, monkeypatch, name):
    """What a TPU worker's downcast (FLUX's rotary embedding in float32, diffusers' own mps/npu path) does to the
    pixels, measured on the CPU by downcasting there the same way: 1.5e-6 (FLUX.1) and 2.4e-6 (FLUX.2) at 64x64,
    2 steps, float32; the bound is 1e-5 (larger images reach larger positions, where float32 angles lose more)."""
    import numpy as np
    import torch
    from diffusers import DiffusionPipeline
    from diffusers.utils import torch_utils

    from backend.worker.device import FLOAT64_DOWNCAST, downcast_float64

    assert FLOAT64_DOWNCAST == ("tpu",)
    pipe = DiffusionPipeline.from_pretrained(str(tiny_models / name), dtype=torch.float32, local_files_only=True,
                                             use_safetensors=True)

    def image() -> np.ndarray:
        return pipe(prompt="a red fox in the snow", height=64, width=64, num_inference_steps=2, guidance_scale=1.0,
                    generator=torch.Generator("cpu").manual_seed(7), output_type="np").images

    native = image()
    monkeypatch.setattr(torch_utils, "_FP64_UNSUPPORTED_DEVICES", torch_utils._FP64_UNSUPPORTED_DEVICES)
    monkeypatch.setitem(torch_utils._DTYPE_UNSUPPORTED_DEVICES, torch.float64, torch_utils._FP64_UNSUPPORTED_DEVICES)
    downcast_float64("cpu")
    assert torch_utils.maybe_adjust_dtype_for_device(torch.float64, torch.device("cpu")) == torch.float32
    difference = float(np.abs(image() - native).max())
    assert 0 < difference <= 1e-5, difference
