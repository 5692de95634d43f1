"""The pack inside a real ComfyUI server, driven only over HTTP and the websocket like the web UI does.

The worker processes belong to the server process, so worker state is read through the server (the TPU
Device Info node) and processes are inspected with psutil; nothing here imports backend/ to look at them.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import tempfile

import numpy as np
import psutil
import pytest
from comfy_server import ComfyServer, PromptFailed, error_message, load_workflow
from helpers import (
    DEMO,
    LONG,
    ROOT,
    alive,
    group_processes,
    info_from,
    kill_all,
    pixels,
    prompt,
    run_ok,
    wait_gone,
    worker_state,
)

from backend.protocol.spec import index_file

pytestmark = pytest.mark.server

OUR_NODES = {"LoadTPUPipeline", "TPUSample", "TPUDeviceInfo", "TPUFreeWorkers"}


# ---- helpers
def cached_nodes(result: dict) -> list[str]:
    return [n for m in result["messages"] if m["type"] == "execution_cached" for n in m["data"]["nodes"]]


# ---- the nodes as the UI sees them
def test_nodes_in_object_info(server, tiny_models):
    """Each of our nodes is in the TPU category and explains itself: a display name, a description, a tooltip
    on every input and every output."""
    info = server.get("/object_info").json()
    ours = {name: d for name, d in info.items() if d.get("python_module", "").endswith("ComfyUI-TPU")}
    assert OUR_NODES <= set(ours), f"missing from /object_info: {OUR_NODES - set(ours)}"
    assert {name for name, d in info.items() if d["category"] == "TPU"} == set(ours)
    problems = []
    for name, node in ours.items():
        if node.get("category") != "TPU":
            problems.append(f"{name}: category {node.get('category')!r}")
        if not str(node["display_name"]).strip():
            problems.append(f"{name}: no display name")
        if not str(node.get("description", "")).strip():
            problems.append(f"{name}: no description")
        for section in ("required", "optional"):
            for inp, spec in node["input"].get(section, {}).items():
                opts = spec[1] if len(spec) > 1 else {}
                if not str(opts.get("tooltip", "")).strip():
                    problems.append(f"{name}.{inp}: no tooltip")
        tips = node.get("output_tooltips", [])
        if len(tips) != len(node["output"]) or not all(str(t).strip() for t in tips):
            problems.append(f"{name}: output tooltips {tips} for outputs {node['output']}")
    assert problems == []

    models = ours["LoadTPUPipeline"]["input"]["required"]["model"][0]
    assert {"tiny-flux", "tiny-sd3", "tiny-sdxl"} <= set(models)
    roots = [tiny_models, server.work_dir / "models" / "diffusers"]
    not_pipelines = [m for m in models if not any(index_file(r / m) for r in roots)]
    assert not_pipelines == [], "only folders holding a pipeline index (model_index.json, modular_model_index.json)"


def test_each_nodes_help_page_is_served_where_the_frontends_help_panel_looks(server):
    """The frontend (1.32.9) takes the pack from the node's python_module ("custom_nodes.<folder>", "@version"
    dropped) and fetches /extensions/<pack>/docs/<class>/<locale>.md, then /extensions/<pack>/docs/<class>.md;
    ComfyUI serves the pack's WEB_DIRECTORY there. Every node class gets its page; nothing else of the pack is
    served, and no script of ours is offered to the browser."""
    info = server.get("/object_info").json()
    ours = {name: d["python_module"] for name, d in info.items() if d.get("category") == "TPU"}
    assert len(ours) >= 18
    for name, module in ours.items():
        pack = module.split(".")[1].split("@")[0]
        assert module.split(".")[0] == "custom_nodes" and pack == "ComfyUI-TPU", module
        assert server.get(f"/extensions/{pack}/docs/{name}/en.md").status_code == 404  # no locale pages: the
        page = server.get(f"/extensions/{pack}/docs/{name}.md")  # frontend's fallback is what it reads
        assert page.status_code == 200, (name, page.status_code)
        # the frontend reads it with fetch's text(): UTF-8, whatever the content type says
        assert page.content.decode("utf-8") == (ROOT / "web" / "docs" / f"{name}.md").read_text(), name
    picture = server.get("/extensions/ComfyUI-TPU/docs/images/TPUSample.png")
    assert picture.status_code == 200 and picture.content[:4] == b"\x89PNG"
    for private in ("__init__.py", "README.md", "../__init__.py", "docs/../../nodes/__init__.py"):
        assert server.get(f"/extensions/ComfyUI-TPU/{private}").status_code in (403, 404), private
    assert not [e for e in server.get("/extensions").json() if e.startswith("/extensions/ComfyUI-TPU/")]


@pytest.mark.server
def test_offload_auto_is_the_default_of_new_load_nodes_and_says_what_it_chose(server):
    load = server.get("/object_info/LoadTPUPipeline").json()["LoadTPUPipeline"]["input"]["required"]["offload"]
    assert load[0] == ["none", "model", "sequential", "auto"] and load[1]["default"] == "auto"
    wf = prompt(info=True)
    wf["1"]["inputs"]["offload"] = "auto"
    result = run_ok(server, wf)
    texts = [m["data"]["text"] for m in result["messages"]
             if m["type"] == "progress_text" and m["data"]["node"] == "1"]
    assert texts and "tiny-flux (FLUX.1) on the CPU" in texts[-1], texts
    assert "offload auto → none: on the CPU the weights stay in host memory" in texts[-1]
    info = info_from(result)
    assert (info["device"], info["chips"], info["devices"], info["notes"]) == ("cpu", 1, 1, [])
    assert worker_state(server)["offload"] == "none", "the worker runs what auto chose"


# ---- the shipped demo workflow
def test_demo_workflow_writes_png(server):
    result = run_ok(server, load_workflow(DEMO))
    assert len(result["images"]) == 1
    path = result["images"][0]
    assert path.is_file()
    px = pixels(path)
    assert px.shape == (256, 256, 3)
    assert px.std() > 1.0 and len(np.unique(px.reshape(-1, 3), axis=0)) > 100, "the image is (nearly) constant"


# ---- what ComfyUI's cache and the warm worker save
def test_requeue_is_served_from_cache(server):
    wf = prompt(info=True)  # Device Info re-runs every time (IS_CHANGED = NaN); the rest may be cached
    run_ok(server, wf)
    second = run_ok(server, wf)
    third = run_ok(server, wf)
    assert {"1", "2", "3"} <= set(cached_nodes(second)) and {"1", "2", "3"} <= set(cached_nodes(third))
    before, after = info_from(second)["workers"][0], info_from(third)["workers"][0]
    assert (after["samples"], after["loads"]) == (before["samples"], before["loads"]), "the worker sampled again"
    assert after["pid"] == before["pid"]
    assert third["images"] == second["images"] and third["images"][0].is_file()


def test_new_seed_resamples_warm_and_new_model_reloads(server):
    first = run_ok(server, prompt())  # makes sure tiny-flux is the loaded model
    s0 = worker_state(server)
    second = run_ok(server, prompt())
    s1 = worker_state(server)
    assert s1["samples"] == s0["samples"] + 1
    assert s1["loads"] == s0["loads"], "a new seed must not reload the weights"
    assert s1["pid"] == s0["pid"], "a new seed must not restart the worker"
    assert not np.array_equal(pixels(first["images"][0]), pixels(second["images"][0])), "new seed, same image"

    sd3 = run_ok(server, prompt(model="tiny-sd3"))
    s2 = worker_state(server)
    assert s2["loads"] == s1["loads"] + 1 and s2["samples"] == s1["samples"] + 1
    assert s2["model"].rstrip("/").endswith("tiny-sd3")
    assert s2["pid"] == s1["pid"], "another model on the same device reuses the worker"
    assert pixels(sd3["images"][0]).shape == (64, 64, 3)


def test_free_workers_node_stops_the_group(server):
    run_ok(server, prompt())
    group = group_processes(server)
    assert group, "a sample must leave a warm worker group"
    result = run_ok(server, {"1": {"class_type": "TPUFreeWorkers", "inputs": {}}})
    assert result["history"]["status"]["status_str"] == "success"
    assert wait_gone(group, timeout=10) == [], "Free TPU Workers left worker processes running"
    assert worker_state(server) is None, "Device Info still reports workers after Free"
    run_ok(server, prompt())
    state = worker_state(server)
    assert (state["loads"], state["samples"]) == (1, 1), "the next Sample must start a fresh worker"


# ---- progress on the websocket
def test_progress_messages(server):
    result = run_ok(server, prompt(steps=8))
    progress = [m["data"] for m in result["messages"] if m["type"] == "progress" and m["data"].get("node") == "2"]
    values = [p["value"] for p in progress]
    assert len(values) >= 2, f"progress for Sample: {progress}"
    assert values == sorted(set(values)), f"not increasing: {values}"
    assert {p["max"] for p in progress} == {8} and values[-1] == 8


def test_loading_text_names_each_component_as_it_loads(server, tiny_models):
    run_ok(server, {"1": {"class_type": "TPUFreeWorkers", "inputs": {}}})  # so the next Sample loads
    result = run_ok(server, prompt())
    texts = [m["data"]["text"] for m in result["messages"]
             if m["type"] == "progress_text" and m["data"]["node"] == "2"]
    index = json.loads((tiny_models / "tiny-flux" / "model_index.json").read_text())
    weighted = [k for k in index if k in ("transformer", "text_encoder", "text_encoder_2", "vae")]

    def first(prefix: str) -> int:
        return next(i for i, t in enumerate(texts) if t.startswith(prefix))

    order = [first("loading tiny-flux (float32) on cpu")]
    order += [first(f"loading {k} (") for k in weighted]
    order += [first("loaded tiny-flux in "), first("step ")]
    assert order == sorted(order), texts
    assert f"component {len(weighted)} of {len(weighted)}" in texts[order[-3]], texts


# ---- Cancel
def test_interrupt_stops_a_long_sample(server):
    run_ok(server, prompt())  # warm: worker started, tiny-flux loaded
    before = worker_state(server)
    sent = []

    def on_message(msg):
        if msg["type"] == "progress" and not sent:
            sent.append(msg["data"]["value"])
            server.interrupt()

    result = server.run(prompt(**LONG), timeout=90, on_message=on_message)
    assert result["status"] == "interrupted", error_message(result)
    assert [m["data"]["node_id"] for m in result["messages"] if m["type"] == "execution_interrupted"] == ["2"]

    after = worker_state(server)
    assert after["samples"] == before["samples"], "the interrupted sample must not complete"
    assert after["pid"] == before["pid"], "an interrupt must not cost a worker restart"
    ran, asked = after["steps"] - before["steps"], LONG["batch_size"] * LONG["steps"]
    assert 0 < ran < asked, f"the interrupted sample ran {ran} of its {asked} steps"
    run_ok(server, prompt())
    final = worker_state(server)
    demo = load_workflow(DEMO)["2"]["inputs"]  # prompt() keeps the demo's steps and batch size
    steps = demo["batch_size"] * demo["steps"]
    assert (final["samples"], final["steps"]) == (after["samples"] + 1, after["steps"] + steps), (
        "the worker went on with the interrupted sample"
    )


# ---- bad input leaves the server up
def _not_a_pipeline(server) -> dict:
    (server.work_dir / "models" / "diffusers" / "not-a-pipeline").mkdir(parents=True, exist_ok=True)
    return {"1.model_path": "not-a-pipeline"}


@pytest.mark.parametrize("case", ["unknown_model", "not_a_pipeline", "bad_width", "zero_steps"])
def test_bad_input_is_reported_and_server_stays_up(server, case):
    if case == "unknown_model":
        with pytest.raises(PromptFailed) as e:
            server.run(load_workflow(DEMO, **{"1.model": "no-such-model"}))
        errors = e.value.details["node_errors"]["1"]["errors"]
        assert "model" in {err["extra_info"].get("input_name") for err in errors}
        assert "no-such-model" in str(e.value) and "model" in str(e.value)
    elif case == "not_a_pipeline":
        with pytest.raises(PromptFailed) as e:
            server.run(load_workflow(DEMO, **_not_a_pipeline(server)))
        assert "model_index.json" in str(e.value) and "not-a-pipeline" in str(e.value)
        assert list(e.value.details["node_errors"]) == ["1"]
    elif case == "bad_width":
        result = server.run(prompt(width=1000))
        assert result["status"] == "error"
        message = error_message(result)
        assert "width" in message and "1000" in message and "multiple of 16" in message, message
    else:
        with pytest.raises(PromptFailed) as e:
            server.run(prompt(steps=0))
        errors = e.value.details["node_errors"]["2"]["errors"]
        assert [(err["type"], err["extra_info"]["input_name"]) for err in errors] == \
            [("value_smaller_than_min", "steps")]
    assert server.proc.poll() is None
    assert len(run_ok(server, prompt())["images"]) == 1


# ---- a worker dies mid-sample
def test_worker_crash_fails_the_prompt_and_next_prompt_recovers(server):
    run_ok(server, prompt())
    state = worker_state(server)
    group = group_processes(server)
    workers = group_processes(server, workers_only=True)
    assert len(workers) == 1, f"expected one worker rank, found {[p.cmdline() for p in workers]}"
    victim = workers[0]
    assert state["pid"] == victim.pid
    killed = []

    def on_message(msg):
        if msg["type"] == "progress" and not killed:
            killed.append(victim.pid)
            os.kill(victim.pid, signal.SIGKILL)

    try:
        result = server.run(prompt(**LONG), timeout=90, on_message=on_message)
        assert result["status"] == "error"
        message = error_message(result)
        assert "rank 0" in message and "stopped unexpectedly" in message, message
        assert server.proc.poll() is None and server.get("/system_stats").ok

        run_ok(server, prompt())
        fresh = group_processes(server, workers_only=True)
        assert len(fresh) == 1 and fresh[0].pid != victim.pid
        assert wait_gone(group, timeout=10) == [], "processes of the killed group were left behind"
    finally:
        kill_all([p for p in group if alive(p)])


# ---- stopping ComfyUI stops the workers
@pytest.mark.parametrize("how", ["sigint", "sigkill"])
def test_stopping_the_server_stops_its_workers(comfyui_dir, tiny_models, tmp_path, how):
    srv = ComfyServer(str(comfyui_dir), str(tiny_models), work_dir=str(tmp_path)).start()
    group: list[psutil.Process] = []
    def left() -> set[str]:  # this server's run folders (store, secret, log), named after its pid
        return set(glob.glob(os.path.join(tempfile.gettempdir(), f"comfyui-tpu-run-{srv.proc.pid}-*")))

    try:
        run_ok(srv, prompt())
        group = group_processes(srv)
        assert len(group) == 1, "expected one worker"
        if how == "sigint":  # Ctrl+C: ComfyUI exits normally and stops its worker group on the way out
            assert srv.stop(timeout=15) != -signal.SIGKILL, "ComfyUI did not exit on SIGINT"
        else:  # a crash: each worker notices its controller is gone and exits by itself
            srv.kill()
        assert wait_gone(group, timeout=10) == [], f"workers outlived ComfyUI ({how})"
        if how == "sigint":  # the group was closed by the pack (its cleanup ran), not merely orphaned
            assert "worker group GroupConfig(kind='cpu', world_size=1, hosts=(), per_host=0) stopped" in srv.log_path.read_text()
        if how == "sigint":  # closed by the pack: nothing left
            assert left() == set(), f"temp files left behind: {left()}"
        else:  # killed: its folder waits for the next start, which removes the folders of dead controllers
            assert len(left()) == 1
            from backend.controller.launcher import remove_stale_run_dirs

            remove_stale_run_dirs()
            assert left() == set(), f"a dead controller's run folder survived: {left()}"
    finally:
        srv.stop()
        kill_all([p for p in group if alive(p)])
