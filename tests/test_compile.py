"""Execution modes, Compile and the static-shape compile cache, on the CPU.

Workers compile with the 'eager'/'aot_eager' backends (seconds) except the one persistence test, which
needs inductor's on-disk cache. Recompiles are proven absent with dynamo's own counters, which the worker
reports through api.compile_stats().
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import subprocess
import textwrap
import uuid
from dataclasses import replace
from pathlib import Path

import numpy as np
import psutil
import pytest
from helpers import device_info, run_ok

from backend.controller import api, compile_plan
from backend.protocol import messages, settings
from backend.protocol.errors import CompileError
from backend.protocol.messages import Status, Step
from backend.protocol.spec import MODE_CHOICES, CompilePlan, SampleRequest
from backend.worker import compile_cache
from backend.worker.device import TPU_EAGER_MODES

ROOT = Path(__file__).resolve().parent.parent
TPU_VENV = os.environ.get("TPU_VENV")


def _request(**kw) -> SampleRequest:
    base = dict(prompt="a red fox in the snow", width=64, height=64, steps=2, guidance=2.0, seed=7, batch_size=1)
    return SampleRequest(**{**base, **kw})


def _spec(tiny_models, name="tiny-flux", **kw):
    return api.make_spec(name, [str(tiny_models)], **kw)


class Messages(list):
    """Progress messages of one call, in order. Positions (`first_text`, `first_step`) count all messages, so
    they compare with each other; `texts` is only the status texts, for membership checks."""

    def __call__(self, msg: dict) -> None:
        self.append(msg)

    @property
    def texts(self) -> list[str]:
        return [m.text for m in self if isinstance(m, Status)]

    def first_text(self, text: str) -> int:
        return next(i for i, m in enumerate(self) if isinstance(m, Status) and m.text == text)

    def first_step(self) -> int:
        return next(i for i, m in enumerate(self) if isinstance(m, Step))


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """Workers of this module keep compiled graphs in a fresh folder that starts with a stale manifest."""
    root = tmp_path_factory.mktemp("compile-cache")
    (root / "inductor").mkdir()
    (root / "inductor" / "stale-entry").write_text("built by another torch")
    (root / compile_cache.MANIFEST).write_text(json.dumps({**compile_cache.versions(), "torch": "0.0.1"}))
    api.shutdown()  # a running group would keep its own cache folder
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(settings.COMPILE_CACHE.name, str(root))
        yield root
    api.shutdown()


# ---- controller-side checks (no worker)

@pytest.mark.unit
def test_warmup_list_parses_sizes_batches_frames_and_frame_rates_and_names_bad_entries():
    assert compile_plan.parse_warmup("1024x1024, 832x1216x2; 64 X 64\n") == (
        (1024, 1024, 1, 0, 0.0), (832, 1216, 2, 0, 0.0), (64, 64, 1, 0, 0.0))
    assert compile_plan.parse_warmup("  ") == ()
    assert compile_plan.parse_warmup("64x64, 64x64x1") == ((64, 64, 1, 0, 0.0),)
    assert compile_plan.parse_warmup("832x480x81f, 32x32x5fx2, 32x32 x 5 F") == (
        (832, 480, 1, 81, 0.0), (32, 32, 2, 5, 0.0), (32, 32, 1, 5, 0.0))
    # a video's frame rate after it (LTX-2's sound lasts frames / frame_rate seconds): '@RATEfps', 'fps' optional
    assert compile_plan.parse_warmup("768x512x121f@25fps, 64x64x9fx2 @ 22.5 FPS, 64x64x9f@24") == (
        (768, 512, 1, 121, 25.0), (64, 64, 2, 9, 22.5), (64, 64, 1, 9, 24.0))
    assert CompilePlan(warmup=((832, 480, 1, 81), (64, 64, 2, 0), (64, 64, 2, 9, 22.5))).warmup_text() == (
        "832x480x81f, 64x64x2, 64x64x9fx2@22.5fps")
    text = "832x480x81f, 64x64x2, 768x512x121f@25fps"
    assert compile_plan.parse_warmup(CompilePlan(warmup=compile_plan.parse_warmup(text)).warmup_text()) == (
        compile_plan.parse_warmup(text)), "the text a plan writes reads back as the same plan"
    for bad, words in (("1024", "'1024' is not a size"), ("64x64x0", "batch 0"), ("axb", "WIDTHxHEIGHT"),
                       ("32x32x0f", "0 frames"), ("32x32x2x5f", "xFRAMESf"), ("64x64@25fps", "no frames.*x121f@25fps"),
                       ("64x64x9f@0fps", "0 fps .* 1 to 240"), ("64x64x9f@300fps", "300 fps"),
                       ("64x64x9f25fps", "@RATEfps")):
        with pytest.raises(CompileError, match=words):
            compile_plan.parse_warmup(bad)


class _BuiltinsOnly(pickle.Unpickler):
    """Unpickles builtins only: what the worker can read whatever name the pack's modules have in ComfyUI."""

    def find_class(self, module: str, name: str):
        if module != "builtins":
            raise pickle.UnpicklingError(f"the wire holds {module}.{name}, which the worker may not import")
        return super().find_class(module, name)


@pytest.mark.unit
def test_warmup_frame_rate_defaults_to_sample_videos_for_ltx2_and_is_refused_where_nothing_takes_it(tiny_models):
    """LTX-2's sound has frames / frame_rate seconds of latents, a shape of its own: a warm-up without a frame rate
    runs at Sample Video's default frame_rate (the plan says it), one with runs at it; any other model has no frame
    rate to set, and a warm-up naming one is refused before any worker starts, naming the input and the fix."""
    import inspect

    from backend.protocol.spec import DEFAULT_FRAME_RATE, PipelineSpec, warmup_request

    assert SampleRequest(prompt="").frame_rate == DEFAULT_FRAME_RATE == 24.0
    video_nodes = (ROOT / "nodes" / "video_nodes.py").read_text()
    assert '"frame_rate": ("FLOAT", {"default": DEFAULT_FRAME_RATE,' in video_nodes, "Sample Video's default"
    ltx = _spec(tiny_models, "tiny-ltx2")
    spec, _ = api.with_compile(ltx, "whole denoiser", "eager", "64x64x9f, 64x64x17f@25fps, 64x64x9f@24fps", False)
    assert spec.compile.warmup == ((64, 64, 1, 9, DEFAULT_FRAME_RATE), (64, 64, 1, 17, 25.0))
    assert spec.compile.warmup_text() == "64x64x9f@24fps, 64x64x17f@25fps"
    # as the worker reads it: the link pickles the request, which holds builtins only (under ComfyUI the pack's
    # modules are named by its folder path, which the worker cannot import)
    wire = _BuiltinsOnly(io.BytesIO(pickle.dumps(messages.load_request(1, spec)))).load()
    spec = PipelineSpec.from_dict(wire["spec"])
    assert [warmup_request(spec, *size).frame_rate for size in spec.compile.warmup] == [24.0, 25.0]
    assert [size.label() for size in spec.compile.warmup] == ["64x64x9 frames at 24 fps (batch 1)",
                                                              "64x64x17 frames at 25 fps (batch 1)"]
    assert inspect.signature(warmup_request).parameters["frame_rate"].default == 0.0
    assert warmup_request(ltx, 64, 64, 1, 9).frame_rate == DEFAULT_FRAME_RATE
    for name, warmup in (("tiny-wan", "32x32x5f@16fps"), ("tiny-flux", "64x64x5f@25fps")):
        with pytest.raises(CompileError, match=rf"warmup: '{warmup}' names a frame rate, and .* takes none .*"
                                               rf"Remove '@\d+fps': write '{warmup.split('@')[0]}'"):
            api.with_compile(_spec(tiny_models, name), "whole denoiser", "eager", warmup, False)
    wan, _ = api.with_compile(_spec(tiny_models, "tiny-wan"), "whole denoiser", "eager", "32x32x5f", False)
    assert wan.compile.warmup == ((32, 32, 1, 5, 0.0),), "a model without a frame rate gets none"


@pytest.mark.unit
def test_compile_plan_checks_name_the_input_and_the_fix(tiny_models):
    flux = _spec(tiny_models)
    spec, notes = api.with_compile(flux, "whole denoiser", "auto", "64x64, 128x64x2", True)
    assert spec.mode == "compiled" and spec.load_key() == flux.load_key()
    # the plan is resolved once, for the pipeline's device: auto is inductor here and TorchTPU's compiler on TPU
    assert spec.compile == CompilePlan("whole denoiser", "inductor", ((64, 64, 1, 0), (128, 64, 2, 0)), True) \
        and not notes
    on_tpu = spec.with_changes(kind="tpu", compile=replace(spec.compile, backend="auto"))
    assert compile_plan.resolve_compile(on_tpu).compile.backend == "tpu"
    assert compile_plan.resolve_compile(spec) == spec, "resolving twice changes nothing"
    # 'compiled' without a Compile node: whole denoiser, the device's own backend, and a note saying so
    spec, notes = api.with_mode(flux, "compiled")
    assert spec.compile == CompilePlan("whole denoiser", "inductor")
    assert "whole denoiser, backend inductor" in notes[0]
    assert api.with_mode(flux, "defer-and-fuse eager")[1] == [
        "defer-and-fuse eager exists only on TPU; running strict eager on cpu."]
    # offload 'model' forces repeated blocks; 'sequential' cannot be compiled
    spec, notes = api.with_compile(_spec(tiny_models, offload="model"), "whole denoiser", "eager", "", False)
    assert spec.compile.target == "repeated blocks" and "repeated blocks" in notes[0]
    failures = [
        (lambda: api.with_compile(_spec(tiny_models, offload="sequential"), "whole denoiser", "eager", "", False),
         "offload: 'sequential'"),
        (lambda: api.with_compile(_spec(tiny_models, "tiny-sd3"), "repeated blocks", "eager", "", False),
         "SD3's transformer has no repeated blocks"),
        (lambda: api.with_compile(_spec(tiny_models, "tiny-sd3", offload="model"), "whole denoiser", "eager", "",
                                  False), "forced by offload 'model'"),
        (lambda: api.with_compile(flux, "whole denoiser", "tpu", "", False), "backend: 'tpu'"),
        (lambda: api.with_compile(flux, "whole denoiser", "eager", "64x60", False), "warmup: 64x60: height"),
        (lambda: api.with_compile(flux, "whole denoiser", "eager", "", True), "snap_to_warmup"),
    ]
    for call, words in failures:
        with pytest.raises(CompileError, match=words):
            call()


@pytest.mark.unit
def test_manifest_mismatch_renews_the_cache_with_a_logged_reason(tmp_path, caplog):
    root = tmp_path / "cache"
    env: dict = {}
    assert compile_cache.prepare_cache_env(env, str(root))["status"] == "new"
    assert env == compile_cache.compile_cache_env(str(root)) and env["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "1"
    stale = root / "tpu" / "entry"
    stale.write_text("x")
    assert compile_cache.prepare_cache_env({}, str(root))["status"] == "reused" and stale.exists()

    manifest = json.loads((root / compile_cache.MANIFEST).read_text())
    (root / compile_cache.MANIFEST).write_text(json.dumps({**manifest, "libtpu": "0.0.1", "diffusers": "0.1"}))
    with caplog.at_level(logging.WARNING, logger="comfyui_tpu"):
        info = compile_cache.prepare_cache_env({}, str(root))
    assert info["status"].startswith("renewed (built with other versions: ") and "diffusers 0.1 → " in info["status"]
    assert "starting a fresh one" in caplog.text and "libtpu 0.0.1 → " in caplog.text
    assert not stale.exists() and json.loads((root / compile_cache.MANIFEST).read_text())["diffusers"] != "0.1"

    (root / compile_cache.MANIFEST).write_text("{not json")
    assert "manifest is unreadable" in compile_cache.prepare_cache_env({}, str(root))["status"]
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {}
    info = compile_cache.prepare_cache_env(env, str(blocker / "cache"))  # cannot be created: no crash, no env
    assert info["status"].startswith("disabled") and env == {}


# ---- in worker processes

@pytest.mark.workers
def test_worker_start_renews_a_stale_cache_and_samples(tiny_models, cache_dir):
    messages = Messages()
    images = api.sample(_spec(tiny_models), _request(), messages)
    assert images.shape == (1, 64, 64, 3)
    assert any(t.startswith(f"compile cache {cache_dir}: renewed (built with other versions: torch 0.0.1 → ")
               for t in messages.texts), messages.texts
    cache = api.compile_stats()["cache"]
    assert cache["dir"] == str(cache_dir) and cache["status"].startswith("renewed (built with other versions: torch")
    assert not (cache_dir / "inductor" / "stale-entry").exists()
    assert json.loads((cache_dir / compile_cache.MANIFEST).read_text())["torch"] == compile_cache.versions()["torch"]


@pytest.mark.workers
@pytest.mark.parametrize("name", ["tiny-flux", "tiny-sdxl"])
def test_each_mode_gives_an_image_and_switching_modes_does_not_reload(tiny_models, cache_dir, name):
    base = _spec(tiny_models, name)
    reference = api.sample(base, _request())
    loads = api.worker_info()[0]["loads"]
    assert {"defer-and-fuse eager", "compiled"} <= set(MODE_CHOICES), "the checks below would not run"
    for mode in [*MODE_CHOICES, "strict eager"]:  # ... and back from compiled to eager
        spec, notes = api.with_mode(base, mode)
        if mode == "compiled":
            spec = spec.with_changes(compile=CompilePlan(backend="eager"))
        messages = Messages()
        images = api.sample(spec, _request(), messages)
        stats = api.compile_stats()
        assert images.shape == (1, 64, 64, 3) and np.isfinite(images).all(), mode
        assert np.abs(images - reference).max() <= 1e-4, f"{mode} draws another image"
        assert stats["mode"] == mode
        if mode == "defer-and-fuse eager":
            assert notes == [stats["note"]] and stats["note"] in messages.texts
        if mode == "compiled":
            assert stats["compiled"]["backend"] == "eager" and stats["compiled"]["target"] == "whole denoiser"
            assert any(t.startswith("compiling 64x64 (batch 1") for t in messages.texts)
        else:
            assert stats["compiled"] is None
    assert api.worker_info()[0]["loads"] == loads, "switching modes reloaded the weights"


@pytest.mark.workers
def test_after_warmup_varied_samples_never_recompile_and_a_new_size_compiles_once(tiny_models, cache_dir):
    spec, _ = api.with_compile(_spec(tiny_models), "whole denoiser", "aot_eager", "64x64", False)
    messages = Messages()
    warm = api.load(spec, messages)["compile"]
    assert "warm-up 1/1: 64x64 (batch 1)" in messages.texts
    assert messages.first_text("compiling 64x64 (batch 1) for the first time…") < messages.first_step()
    # one graph for a 2-step warm-up: no per-step recompile (e.g. from the timestep tensor)
    shape = next(s for s in warm["shapes"] if s["shape"] == "64x64 (batch 1)" and "aot_eager" in s["component"])
    assert (shape["compiles"], shape["graphs"], warm["unexpected_recompiles"]) == (1, 1, 0)

    varied = [dict(seed=1), dict(prompt="a much longer prompt about a lighthouse on a cliff at dusk"),
              dict(steps=5), dict(guidance=0.0), dict(guidance=7.5, seed=3, steps=3), dict(negative_prompt="blurry")]
    for change in varied:
        api.sample(spec, _request(**change))
    stats = api.compile_stats()
    assert stats["graphs"] == warm["graphs"] and stats["compiles"] == warm["compiles"], "a Sample recompiled"
    assert stats["unexpected_recompiles"] == 0 and stats["hits"] == warm["hits"] + len(varied)

    messages = Messages()
    api.sample(spec, _request(width=96), messages)
    announced = messages.first_text("compiling 96x64 (batch 1) for the first time…")
    assert announced < messages.first_step(), "the compile must be announced before it starts"
    after = api.compile_stats()
    assert (after["compiles"], after["graphs"]) == (stats["compiles"] + 1, stats["graphs"] + 1)
    new = next(s for s in after["shapes"] if s["shape"] == "96x64 (batch 1)" and "aot_eager" in s["component"])
    assert new["compiles"] == 1 and new["compile_s"] > 0

    # snapping (off by default) sends an unseen size to the closest warmed-up one, and says so
    snapping = spec.with_changes(compile=replace(spec.compile, snap_to_warmup=True))
    messages = Messages()
    images = api.sample(snapping, _request(width=80, height=80), messages)
    assert images.shape == (1, 64, 64, 3) and "snapped 80x80 to the warmed-up size 64x64" in messages.texts
    assert api.compile_stats()["graphs"] == after["graphs"]


@pytest.mark.workers
def test_cfg_and_prompt_length_do_not_surprise(tiny_models, cache_dir):
    """SDXL: CFG on/off is a different batch for the UNet, so a known signature; Qwen-Image: prompts of any
    length up to the 128-token bucket share one graph (padded embeddings with a mask)."""
    sdxl, _ = api.with_compile(_spec(tiny_models, "tiny-sdxl"), "whole denoiser", "eager", "64x64", False)
    before = api.load(sdxl)["compile"]
    api.sample(sdxl, _request(guidance=7.0, seed=2))
    messages = Messages()
    api.sample(sdxl, _request(guidance=1.0), messages)  # no CFG: half the batch, announced as a new shape
    assert "compiling 64x64 (batch 1) for the first time…" in messages.texts
    stats = api.compile_stats()
    assert stats["compiles"] == before["compiles"] + 1 and stats["unexpected_recompiles"] == 0

    qwen, _ = api.with_compile(_spec(tiny_models, "tiny-qwenimage"), "whole denoiser", "eager", "64x64", False)
    warm = api.load(qwen)["compile"]
    prompts = (("fox", ""), ("a lighthouse on a cliff at dusk, oil painting, warm light", "blurry, low quality"),
               ("a very long prompt " * 4, "no"))
    for prompt, negative in prompts:
        images = api.sample(qwen, _request(prompt=prompt, negative_prompt=negative, guidance=4.0))
        assert np.isfinite(images).all()
    stats = api.compile_stats()
    assert stats["graphs"] == warm["graphs"] and stats["unexpected_recompiles"] == 0
    assert stats["hits"] == warm["hits"] + len(prompts)
    messages = Messages()  # a prompt past the bucket: the next bucket, announced like a new size
    api.sample(qwen, _request(prompt="a very long prompt " * 12, guidance=4.0), messages)
    assert "compiling 64x64 (batch 1, prompt ≤ 256 tokens) for the first time…" in messages.texts
    assert api.compile_stats()["graphs"] == warm["graphs"] + 1


@pytest.mark.workers
def test_offload_model_compiles_the_repeated_blocks_and_says_so(tiny_models, cache_dir):
    offloaded = _spec(tiny_models, offload="model")
    eager = api.sample(offloaded, _request())
    spec, notes = api.with_compile(offloaded, "whole denoiser", "eager", "", False)
    messages = Messages()
    images = api.sample(spec, _request(), messages)
    stats = api.compile_stats()
    assert notes[0] in messages.texts and stats["compiled"]["target"] == "repeated blocks"
    shape = next(s for s in stats["shapes"] if s["component"] == stats["compiled"]["component"])
    assert shape["graphs"] == 2  # FluxTransformerBlock and FluxSingleTransformerBlock, each compiled once
    assert np.abs(images - eager).max() <= 1e-4


# Inductor on 2 CPU cores, cheaply: scalar C++ kernels (no AVX variants: about half the kernels to build) compiled
# in the worker itself (no pool of compile subprocesses, each importing torch). The on-disk cache works the same;
# the tiny Wan video block's first compile took 33 s this way against 105 s by default (a busy 2-core host).
QUICK_INDUCTOR = {"TORCHINDUCTOR_VEC_ISA_OK": "0", "TORCHINDUCTOR_COMPILE_THREADS": "1"}


@pytest.mark.workers
@pytest.mark.parametrize("name,request_", [("tiny-flux", {}), ("tiny-wan", dict(width=32, height=32, frames=5))],
                         ids=["image", "video"])
def test_inductor_graphs_come_back_from_disk_after_a_restart(tiny_models, tmp_path, monkeypatch, name, request_):
    """An image (FLUX.1's blocks) and a video (Wan's blocks, a shape with frames): a fresh worker process finds
    every graph the first one compiled in the compile cache folder, and makes the same pixels."""
    monkeypatch.setenv(settings.COMPILE_CACHE.name, str(tmp_path / "cache"))
    for key, value in QUICK_INDUCTOR.items():
        monkeypatch.setenv(key, value)
    api.shutdown()
    spec, _ = api.with_compile(_spec(tiny_models, name), "repeated blocks", "inductor", "", False)
    try:
        cold_image = api.sample(spec, _request(**request_))
        cold = api.compile_stats()
        assert cold["cache"]["status"] == "new" and cold["disk_misses"] >= 1 and cold["disk_hits"] == 0
        api.shutdown()  # like restarting ComfyUI: a fresh worker process
        messages = Messages()
        warm_image = api.sample(spec, _request(**request_), messages)
        warm = api.compile_stats()
    finally:
        api.shutdown()
    assert warm["cache"]["status"] == "reused"
    assert warm["disk_hits"] == cold["disk_misses"] and warm["disk_misses"] == 0, warm
    assert warm["shapes"][0]["from_disk"] and any("on-disk cache" in t for t in messages.texts)
    assert warm["shapes"][0]["shape"] == ("32x32x5 frames (batch 1)" if request_ else "64x64 (batch 1)")
    assert np.abs(cold_image - warm_image).max() <= 1e-5


# ---- the real TorchTPU package, no TPU touched

@pytest.mark.workers
@pytest.mark.skipif(not TPU_VENV, reason="TPU_VENV (venv with torch-tpu + libtpu) not set")
def test_modes_and_compile_names_exist_in_real_torch_tpu():
    code = """
        import glob, json, os
        import torch, torch._dynamo
        import torch_tpu
        from backend.controller.compile_plan import compile_backend
        from backend.protocol.spec import MODE_CHOICES
        from backend.worker import compile_cache, device
        modes = {}
        for mode in MODE_CHOICES:
            device.set_execution_mode("tpu", mode)   # process-wide torch.tpu.eager_mode, as the worker does
            modes[mode] = torch.tpu.eager_mode.name
        so = glob.glob(os.path.join(os.path.dirname(torch_tpu.__file__), "csrc/common/glue_*/libpywrap_*common.so"))
        env = compile_cache.compile_cache_env("/x")
        names = [k for k in env if k.startswith("TORCH_TPU")]
        print(json.dumps({"modes": modes, "tpu_backend": "tpu" in torch._dynamo.list_backends(),
                          "auto": compile_backend("tpu", "auto"),
                          "env_known": {k: any(k.encode() in open(f, "rb").read() for f in so) for k in names},
                          "torch_tpu": compile_cache.versions()["torch_tpu"]}))
    """
    out = subprocess.run([f"{TPU_VENV}/bin/python", "-W", "ignore", "-c", textwrap.dedent(code)], cwd=ROOT,
                         timeout=120, capture_output=True, text=True, env={**os.environ, "TPU_SKIP_MDS_QUERY": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["modes"] == TPU_EAGER_MODES
    assert got["tpu_backend"] and got["auto"] == "tpu" and got["torch_tpu"] == "0.2.0"
    assert got["env_known"] == {"TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": True}


# ---- through a real ComfyUI

@pytest.mark.server
def test_compile_workflow_in_comfyui_shows_compile_text_and_saves_a_png(server):
    prefix = f"compile-{uuid.uuid4().hex[:8]}"
    workflow = {
        "1": {"class_type": "LoadTPUPipeline",
              "inputs": {"model": "tiny-flux", "dtype": "auto", "device": "auto", "offload": "none", "model_path": ""}},
        "2": {"class_type": "TPUSetExecutionMode", "inputs": {"pipeline": ["1", 0], "mode": "compiled"}},
        "3": {"class_type": "TPUCompile", "inputs": {"pipeline": ["2", 0], "target": "whole denoiser",
                                                     "backend": "eager", "warmup": "64x64", "snap_to_warmup": False}},
        "4": {"class_type": "TPUSample", "inputs": {"pipeline": ["3", 0], "prompt": "a lighthouse", "negative_prompt": "",
                                                    "width": 64, "height": 64, "steps": 2, "guidance": 0.0,
                                                    "seed": 11, "batch_size": 1}},
        "5": {"class_type": "SaveImage", "inputs": {"images": ["4", 0], "filename_prefix": prefix}},
    }
    result = run_ok(server, workflow, timeout=180)
    assert len(result["images"]) == 1 and result["images"][0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    messages = result["messages"]
    texts = [(i, m["data"]["text"]) for i, m in enumerate(messages)
             if m["type"] == "progress_text" and m["data"]["node"] == "3"]
    compiling = [i for i, t in texts if t == "compiling 64x64 (batch 1) for the first time…"]
    # The status text arrives before the compile finishes: before the warm-up's first step (which needs the
    # compiled graph) reports, and before the node is done.
    first_step = next(i for i, t in texts if t.startswith("step "))
    done = next(i for i, m in enumerate(messages) if m["type"] == "executed" and m["data"].get("node") == "3")
    assert compiling and compiling[0] < first_step < done, texts
    assert any("compiled: tiny-flux/transformer (float32, whole denoiser, eager)" in t for _, t in texts), texts

    stats = device_info(server)["workers"][0]["compile"]
    assert stats["mode"] == "compiled" and stats["compiles"] >= 1 and stats["unexpected_recompiles"] == 0
    # the nodes put the cache in ComfyUI's user directory unless the environment names a folder
    # (the session server may have started inside this module's cache_dir fixture, which names one)
    chosen = psutil.Process(server.proc.pid).environ().get(settings.COMPILE_CACHE.name)
    expected = chosen or str(server.work_dir / "user" / "comfyui-tpu" / "compile-cache")
    assert stats["cache"]["dir"] == expected, f"{settings.COMPILE_CACHE.name}={chosen!r} in the server's environment"


# ---- the 2026 families: one worker test over all of them (the compile tests are the suite's slowest)

# name -> (warm-up, request sizes, target run, compiled components, compiles a prompt of another length adds):
# Qwen-Image 2.1 cannot be compiled whole (its repeated blocks are, with a note) and takes the prompt at its own
# length (padding it would move the image's rotary positions: each new length compiles, announced: the Sample's
# prompt after the warm-up's, then the longer one); Ideogram 4
# compiles both of its transformers; FLUX 3 is a modular pipeline (its components' transformer); LTX-2 a video with
# sound (frames in the warm-up)
NEW_FAMILIES = {
    "tiny-qwenimage21": ("64x64", dict(width=64, height=64), "repeated blocks", ("denoiser",), 2),
    "tiny-krea2": ("32x32", dict(width=32, height=32), "whole denoiser", ("denoiser",), 0),
    "tiny-ideogram4": ("32x32", dict(width=32, height=32), "whole denoiser",
                       ("denoiser", "unconditional_transformer"), 0),
    "tiny-flux3": ("32x32", dict(width=32, height=32), "whole denoiser", ("denoiser",), 0),
    "tiny-ltx2": ("64x64x9f", dict(width=64, height=64, frames=9), "whole denoiser", ("denoiser",), 0),
}


@pytest.mark.workers
@pytest.mark.parametrize("name", list(NEW_FAMILIES))
def test_new_families_compile_once_and_never_again_over_prompts_seeds_and_steps(tiny_models, cache_dir, name):
    """After the warm-up, other seeds, prompts (of other lengths) and step counts reuse its graphs: 0 unexpected
    recompiles, and the last image is the eager one. Measured on a busy 2-core host: 18 s (Krea 2, FLUX 3) to 65 s
    (Qwen-Image 2.1) each."""
    warmup, size, target, compiled, prompt_compiles = NEW_FAMILIES[name]
    base = _spec(tiny_models, name)
    spec, notes = api.with_compile(base, "whole denoiser", "eager", warmup, False)
    assert spec.compile.target == target
    assert [n for n in notes if "cannot be compiled whole" in n] == ([notes[0]] if target != "whole denoiser" else [])
    warm = api.load(spec)["compile"]
    assert warm["compiles"] >= 1 and warm["unexpected_recompiles"] == 0
    experts = api.worker_info()[0]["experts"]
    assert sorted(experts) == sorted(compiled) and all(e["compiled"] for e in experts.values()), experts
    varied = [dict(seed=1), dict(seed=4, steps=3),
              dict(prompt="a much longer prompt about a lighthouse on a cliff at dusk, oil", seed=2)]
    messages = Messages()
    for change in varied:
        last = api.sample(spec, _request(**size, **change), messages)
    stats = api.compile_stats()
    assert stats["compiles"] == warm["compiles"] + prompt_compiles, "a Sample recompiled"
    assert (stats["graphs"] > warm["graphs"]) == bool(prompt_compiles) and stats["unexpected_recompiles"] == 0
    assert bool(prompt_compiles) == any("again for a prompt of another length" in t for t in messages.texts)
    eager = api.sample(base, _request(**size, **varied[-1]))
    assert np.abs(np.asarray(last) - np.asarray(eager)).max() <= 1e-4


@pytest.mark.unit
def test_minimax_h3_compiled_mode_is_refused_naming_the_shapes_that_follow_prompt_and_step(tiny_models):
    with pytest.raises(CompileError, match=r"mode: 'compiled' cannot run MiniMax H3: .*no attention mask.*"
                                           r"changes from step to step"):
        api.with_compile(_spec(tiny_models, "tiny-minimax-h3"), "whole denoiser", "eager", "32x32x124f", False)
