"""Every node's VALIDATE_INPUTS, through a real ComfyUI server's own validation (POST /prompt), on a pretend TPU v4
host: a TPU that cannot be used refuses device auto, names it, and leaves device cpu to work, for both loaders.

The host is faked for the whole ComfyUI process (tests/fake_tpu/sitecustomize.py points our PCI scan and
TorchTPU's at a /sys + /dev tree holding four v4 chips); nothing runs on a TPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from comfy_server import ComfyServer, PromptFailed, error_message

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parent.parent
NONE = "(none)"
FLUX1_FILES = {"diffusion_model": "flux1-tiny.safetensors", "text_encoder_1": "clip_l-tiny.safetensors",
               "text_encoder_2": "t5xxl-tiny.safetensors", "vae": "ae-tiny.safetensors"}
ROLE_FOLDERS = ("diffusion_models", "text_encoders", "vae", "checkpoints")


@pytest.fixture(scope="module")
def v4_server(comfyui_dir, tiny_models, comfyui_files, tmp_path_factory):
    from fake_tpu.hosts import make_root

    files = comfyui_files("flux1") / "models"
    work = tmp_path_factory.mktemp("v4")
    fake = str(ROOT / "tests" / "fake_tpu")
    env = {"FAKE_TPU_ROOT": make_root(work / "host", "v4", 4, accel=True),
           "PYTHONPATH": os.pathsep.join([fake, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    srv = ComfyServer(str(comfyui_dir), str(tiny_models), work_dir=str(work / "comfy"), env=env,
                      extra_paths={folder: str(files / folder) for folder in ROLE_FOLDERS})
    srv.start()
    yield srv
    srv.stop()


def load_node(device: str) -> dict:
    return {"class_type": "LoadTPUPipeline",
            "inputs": {"model": "tiny-flux", "dtype": "auto", "device": device, "offload": "none", "model_path": ""}}


def files_node(device: str, **files) -> dict:
    inputs = {"diffusion_model": NONE, "text_encoder_1": NONE, "text_encoder_2": NONE, "text_encoder_3": NONE,
              "vae": NONE, "checkpoint": NONE, "dtype": "auto", "device": device, "offload": "none", **files}
    return {"class_type": "LoadTPUPipelineFiles", "inputs": inputs}


def graph(loader: dict, seed: int, between: dict | None = None) -> dict:
    """loader -> (between) -> Sample -> Save Image, 64x64 in two steps."""
    source = ["1", 0] if between is None else ["4", 0]
    wf = {"1": loader,
          "2": {"class_type": "TPUSample", "inputs": {"pipeline": source, "prompt": "a red fox", "negative_prompt": "",
                                                     "width": 64, "height": 64, "steps": 2, "guidance": 0.0,
                                                     "seed": seed, "batch_size": 1}},
          "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "validation"}}}
    if between is not None:
        wf["4"] = {**between, "inputs": {**between["inputs"], "pipeline": ["1", 0]}}
    return wf


def refused(server: ComfyServer, wf: dict) -> tuple[list[str], str]:
    """The nodes ComfyUI's validation refused `wf` for (HTTP 400), and its message."""
    with pytest.raises(PromptFailed) as e:
        server.queue(wf, "validation-test")
    return list(e.value.details["node_errors"]), str(e.value)


@pytest.mark.parametrize("loader", [load_node, lambda device: files_node(device, **FLUX1_FILES)],
                         ids=["LoadTPUPipeline", "LoadTPUPipelineFiles"])
def test_both_loaders_validate_with_the_chosen_device_on_a_tpu_v4_host(v4_server, loader):
    nodes, message = refused(v4_server, graph(loader("auto"), seed=1))
    assert nodes == ["1"] and "device 'auto'" in message and "TPU v4" in message, message
    assert "Choose device 'cpu'" in message, message
    result = v4_server.run(graph(loader("cpu"), seed=2), timeout=300)
    assert result["status"] == "success", f"{error_message(result)}\n{v4_server.log_tail()}"
    assert len(result["images"]) == 1
    assert v4_server.proc.poll() is None


def failed_once(server: ComfyServer, wf: dict) -> tuple[str, str]:
    """The node whose run failed `wf` and its message, which the UI shows once (not once per input)."""
    result = server.run(wf, timeout=120)
    assert result["status"] == "error", f"expected a failure, got {result['status']}"
    errors = [m["data"] for m in result["messages"] if m["type"] == "execution_error"]
    assert len(errors) == 1, errors
    return errors[0]["node_id"], error_message(result)


def test_the_files_loader_checks_its_files_once_and_names_the_input(v4_server):
    """The files are checked as the loader runs, before any worker starts: one message, where a VALIDATE_INPUTS
    taking all nine inputs had ComfyUI repeat it once per input."""
    node, message = failed_once(v4_server, graph(files_node("cpu"), seed=3))
    assert node == "1" and "diffusion_model" in message and "checkpoint" in message, message
    assert "custom validation" not in message.lower(), message
    assert v4_server.proc.poll() is None


@pytest.mark.parametrize("vae", ["no-such-vae.safetensors", "../vae/ae-tiny.safetensors"])
def test_a_file_not_in_its_folder_is_refused_once_by_comfyuis_own_list(v4_server, vae):
    """A name outside the folder's list (a missing file, a path out of the folder) meets ComfyUI's own check,
    which every loader gets: one error, on that input, with the value."""
    with pytest.raises(PromptFailed) as e:
        v4_server.queue(graph(files_node("cpu", **{**FLUX1_FILES, "vae": vae}), seed=3), "validation-test")
    errors = e.value.details["node_errors"]["1"]["errors"]
    assert [(err["type"], err["extra_info"]["input_name"]) for err in errors] == [("value_not_in_list", "vae")]
    assert vae in str(e.value), str(e.value)


def test_the_files_loader_names_a_device_error_once(v4_server):
    """The device is the one input validated before queueing: its refusal is one line, on `device`."""
    with pytest.raises(PromptFailed) as e:
        v4_server.queue(graph(files_node("auto", **FLUX1_FILES), seed=1), "validation-test")
    errors = e.value.details["node_errors"]["1"]["errors"]
    assert [err["extra_info"]["input_name"] for err in errors] == ["device"], errors


def test_the_folder_loader_validates_its_model_and_names_the_input(v4_server):
    wf = graph(load_node("cpu"), seed=4)
    wf["1"]["inputs"]["model_path"] = "no-such-model"
    nodes, message = refused(v4_server, wf)
    assert nodes == ["1"] and "no-such-model" in message, message


def test_compile_validates_its_warmup_sizes(v4_server):
    compile_node = {"class_type": "TPUCompile", "inputs": {"target": "whole denoiser", "backend": "auto",
                                                            "warmup": "64 by 64", "snap_to_warmup": False}}
    nodes, message = refused(v4_server, graph(load_node("cpu"), seed=5, between=compile_node))
    assert nodes == ["4"] and "warmup" in message and "64 by 64" in message, message


def test_load_lora_validates_that_the_file_is_in_the_loras_folder(v4_server):
    lora_node = {"class_type": "TPULoadLoRA", "inputs": {"lora_name": "no-such-lora.safetensors", "strength": 1.0,
                                                          "strength_text_encoder": 1.0}}
    nodes, message = refused(v4_server, graph(load_node("cpu"), seed=6, between=lora_node))
    assert nodes == ["4"] and "no-such-lora.safetensors" in message and "models/loras" in message, message
