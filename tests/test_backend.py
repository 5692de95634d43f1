"""The backend alone (no ComfyUI): worker processes load tiny pipelines and sample reproducibly."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time

import numpy as np
import pytest
import torch
from helpers import diffusion_pipeline, makes_images, tiny_pipelines

from backend.controller import api, group, link
from backend.protocol.errors import Interrupted, WorkerCrashed
from backend.protocol.messages import Step
from backend.protocol.spec import GroupConfig, SampleRequest, index_file
from backend.protocol.units import format_bytes
from backend.worker import loading

FAMILY_DIRS = tiny_pipelines(makes_images)  # each image family's tiny pipeline, from the registry


def _request(**kw) -> SampleRequest:
    base = dict(prompt="a red fox in the snow", width=64, height=64, steps=2, guidance=2.0, seed=7, batch_size=1)
    return SampleRequest(**{**base, **kw})


@pytest.mark.workers
@pytest.mark.parametrize("name", FAMILY_DIRS)
def test_each_family_samples_in_a_worker(tiny_models, name):
    assert index_file(tiny_models / name) is not None, f"backend.tiny_models did not build {name}"
    spec = api.make_spec(name, [str(tiny_models)])
    images = api.sample(spec, _request(width=64, height=32, batch_size=2))  # 32: Qwen-Image 2.1's multiple
    assert images.shape == (2, 32, 64, 3) and images.dtype == np.float32  # RGB for ComfyUI (Qwen-Image 2.1: RGBA)
    assert np.isfinite(images).all() and images.min() >= 0.0 and images.max() <= 1.0
    again = api.sample(spec, _request(width=64, height=32, batch_size=2))
    assert np.array_equal(images, again), "same seed must give the same pixels"
    other = api.sample(spec, _request(width=64, height=32, batch_size=2, seed=8))
    assert not np.array_equal(images, other)


@pytest.mark.workers
def test_matches_plain_diffusers_in_process(tiny_models):
    """The worker's image equals what a plain diffusers script gives for the same seed (tolerance 1e-5)."""
    from diffusers import DiffusionPipeline

    spec = api.make_spec("tiny-flux", [str(tiny_models)])
    ours = api.sample(spec, _request(guidance=0.0, steps=3))
    pipe = DiffusionPipeline.from_pretrained(str(tiny_models / "tiny-flux"), dtype=torch.float32,
                                             local_files_only=True, use_safetensors=True)
    plain = pipe(prompt="a red fox in the snow", height=64, width=64, num_inference_steps=3, guidance_scale=0.0,
                 generator=[torch.Generator("cpu").manual_seed(7)], output_type="np").images
    assert np.abs(ours - plain).max() <= 1e-5


@pytest.mark.unit
@pytest.mark.parametrize("name", tiny_pipelines(diffusion_pipeline))
def test_loading_names_each_component_and_equals_diffusers_own_load(tiny_models, name):
    """Loading one component at a time (to say which one is loading) builds the same pipeline as
    DiffusionPipeline.from_pretrained: same class, same components, same weights and dtypes."""
    from diffusers import DiffusionPipeline

    path = str(tiny_models / name)
    assert (tiny_models / name / "model_index.json").is_file(), f"backend.tiny_models did not build {name}"
    said: list[str] = []
    ours = loading.load_pipeline(path, torch.bfloat16, said.append)
    plain = DiffusionPipeline.from_pretrained(path, dtype=torch.bfloat16, local_files_only=True,
                                              use_safetensors=True)
    assert type(ours) is type(plain) and ours.components.keys() == plain.components.keys()
    modules = []
    for key, theirs in plain.components.items():
        mine = ours.components[key]
        assert type(mine) is type(theirs), key
        if isinstance(theirs, torch.nn.Module):
            modules.append(key)
            a, b = mine.state_dict(), theirs.state_dict()
            assert a.keys() == b.keys(), key
            assert all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a), key
    # one line per weighted component, before it loads, in model_index.json order, then the light parts
    index_order = [k for k in json.loads((tiny_models / name / "model_index.json").read_text()) if k in modules]
    n = len(index_order)
    assert said[:n] == [
        f"loading {k} ({type(ours.components[k]).__name__}, "
        f"{format_bytes(sum(f.stat().st_size for f in (tiny_models / name / k).rglob('*')))})"
        f" · component {i} of {n}"
        for i, k in enumerate(index_order, 1)
    ], said
    assert said[n:] == ["loading tokenizers and scheduler, building the pipeline"], said


@pytest.mark.unit
def test_a_component_that_cannot_load_is_named(tiny_models, tmp_path):
    broken = tmp_path / "flux-without-vae-weights"
    shutil.copytree(tiny_models / "tiny-flux", broken)
    for f in (broken / "vae").glob("*.safetensors"):
        f.unlink()
    with pytest.raises(OSError, match="component 'vae'"):
        loading.load_pipeline(str(broken), torch.float32, lambda text: None)


@pytest.mark.workers
def test_each_image_of_a_batch_has_its_own_seed(tiny_models):
    """Image i of a batch with seed s is image 0 of a batch of one with seed s + i (tolerance 1e-4)."""
    spec = api.make_spec("tiny-flux", [str(tiny_models)])
    batch = api.sample(spec, _request(seed=100, batch_size=3))
    single = api.sample(spec, _request(seed=102, batch_size=1))
    assert np.abs(batch[2] - single[0]).max() <= 1e-4
    assert not np.allclose(batch[0], batch[1])


@pytest.mark.workers
def test_seed_or_prompt_change_does_not_reload_but_model_change_does(tiny_models):
    spec = api.make_spec("tiny-flux", [str(tiny_models)])
    api.sample(spec, _request())
    loads = api.worker_info()[0]["loads"]
    api.sample(spec, _request(seed=1234, prompt="another prompt", steps=3))
    assert api.worker_info()[0]["loads"] == loads
    api.sample(api.make_spec("tiny-sdxl", [str(tiny_models)]), _request())
    assert api.worker_info()[0]["loads"] == loads + 1


@pytest.mark.workers
def test_model_offload_uses_diffusers_hooks(tiny_models):
    plain = api.make_spec("tiny-flux", [str(tiny_models)])
    offloaded = api.make_spec("tiny-flux", [str(tiny_models)], offload="model")
    a = api.sample(plain, _request())
    b = api.sample(offloaded, _request())
    assert np.abs(a - b).max() <= 1e-5


@pytest.mark.workers
def test_progress_and_interrupt_stop_the_worker_at_the_next_step(tiny_models):
    spec = api.make_spec("tiny-flux", [str(tiny_models)])
    api.load(spec)
    steps_seen: list[int] = []
    stop = threading.Event()

    def on_progress(msg):
        if isinstance(msg, Step):
            steps_seen.append(msg.step)
            if msg.step == 3:
                stop.set()

    with pytest.raises(Interrupted):
        api.sample(spec, _request(steps=5000), on_progress, stop.is_set)
    assert steps_seen[:3] == [1, 2, 3]
    # Tiny steps take ~5 ms, so "the next step" is a few steps after the flag, far from the 5000 asked for.
    assert max(steps_seen) < 50
    assert api.sample(spec, _request()).shape == (1, 64, 64, 3), "the next request works"


@pytest.mark.workers
def test_exception_in_progress_callback_interrupts_and_reraises(tiny_models):
    """ComfyUI's progress hook raises on Cancel: the workers stop and the same exception comes out."""
    spec = api.make_spec("tiny-flux", [str(tiny_models)])

    class Cancel(Exception):
        pass

    def on_progress(msg):
        if isinstance(msg, Step) and msg.step == 2:
            raise Cancel()

    with pytest.raises(Cancel):
        api.sample(spec, _request(steps=5000), on_progress)
    assert api.sample(spec, _request()).shape == (1, 64, 64, 3)


@pytest.mark.workers
def test_killed_worker_gives_a_clear_error_and_the_next_request_starts_fresh(tiny_models):
    spec = api.make_spec("tiny-flux", [str(tiny_models)])
    api.load(spec)
    pid = api.worker_info()[0]["pid"]

    def kill_on_step(msg):
        if isinstance(msg, Step) and msg.step == 2:
            os.kill(pid, signal.SIGKILL)

    with pytest.raises(WorkerCrashed, match=r"rank 0 \(pid \d+\) stopped unexpectedly") as e:
        api.sample(spec, _request(steps=5000), kill_on_step)
    assert (e.value.rank, e.value.pid, e.value.host) == (0, pid, None)
    assert api.sample(spec, _request()).shape == (1, 64, 64, 3)
    assert api.worker_info()[0]["pid"] != pid
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.workers
def test_worker_channel_refuses_a_peer_without_the_secret(monkeypatch):
    """Another local process that connects to a starting group without the secret is turned away."""
    from multiprocessing.connection import AuthenticationError, Client

    g = group.WorkerGroup(GroupConfig("cpu", 1))
    captured = {}
    real_init = link.Listener.__init__

    def spy(self, *a, **kw):
        real_init(self, *a, **kw)
        captured["addr"] = self.sock.getsockname()

    def intruder():
        deadline = time.monotonic() + 60
        while "addr" not in captured and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            Client(captured["addr"], authkey=b"wrong secret")
            captured["result"] = "accepted"
        except (AuthenticationError, EOFError, OSError):
            captured["result"] = "refused"

    monkeypatch.setattr(link.Listener, "__init__", spy)
    try:
        t = threading.Thread(target=intruder)
        t.start()
        g.start()
        t.join(10)
    finally:
        g.close()
    assert captured["result"] == "refused"
    assert captured["addr"][0] == "127.0.0.1"


@pytest.mark.unit
def test_a_group_start_removes_stale_run_folders_once(monkeypatch):
    """Once per start, by the group (the launcher it drives does not do it again)."""
    from backend.controller import launcher

    calls = []
    monkeypatch.setattr(group, "remove_stale_run_dirs", lambda: calls.append("group"))
    monkeypatch.setattr(launcher, "remove_stale_run_dirs", lambda: calls.append("launcher"))

    def no_room(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(launcher.tempfile, "mkdtemp", no_room)  # the launcher's first step: stop there
    with pytest.raises(OSError, match="No space left"):
        group.WorkerGroup(GroupConfig("cpu", 1)).start()
    assert calls == ["group"]


@pytest.mark.unit
def test_sizes_read_the_same_everywhere():
    """One formatter, binary units: the loader's text, offload's reasons and the load status agree."""
    assert format_bytes(int(22.2 * 2**30)) == "22.2 GiB" and format_bytes(8 * 2**20) == "8.0 MiB"
    assert format_bytes(512) == "512 B" and format_bytes(None) == "? GiB"


@pytest.mark.unit
def test_one_interrupted_on_both_sides():
    """The worker stops a request with the same Interrupted the controller raises to the node."""
    from backend.protocol import errors
    from backend.worker import runtime

    assert runtime.Interrupted is errors.Interrupted is Interrupted
