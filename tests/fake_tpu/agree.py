"""Test-only: TorchTPU's launch rules and ours, on fake TPU hosts, printed as JSON lines (tests/test_tpu_hosts.py).

Run in the venv that has the real torch_tpu 0.2.0:

    python tests/fake_tpu/agree.py torch_tpu '[["v5e", 4], ...]'
        TorchTPU itself, in this process: for each host, set_tpu_launch_env(nproc_per_node=n), n = 1..9.
    python tests/fake_tpu/agree.py ours '[{"gen": "v5e", "chips": 4, "pod": false, "local": false}, ...]'
        The controller as ComfyUI's process runs it (no torch_tpu in this process; its own TorchTPU child
        processes see the fake host through this folder's sitecustomize): for each host, every Shard TP x Data
        Parallel choice the nodes allow, as Load TPU Pipeline -> [Shard TP] -> [Data Parallel] -> Sample do it.
        A host entry may ask for TorchTPU's launch environment through the controller ("launch": n).
    python tests/fake_tpu/agree.py families '[{"gen": "v6e", "chips": 8, "family": "flux1"}, ...]'
        The same controller, for one family of the registry on a single host: its first published model (its
        configs folder, no weights), under every layout node its declaration allows or not (Data Parallel, CFG
        Parallel, Shard TP, Context Parallel) at degrees 1..9, each before and after Data Parallel 1..9.

Hosts are single-host TPU VMs, or one host of a two-host slice ("pod": TPU_WORKER_HOSTNAMES + JOB_COMPLETION_INDEX),
with or without COMFYUI_TPU_LOCAL_GROUP=1 ("local").
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT)]
os.environ["TPU_SKIP_MDS_QUERY"] = "1"  # never let a stray runtime start block for ~10 minutes
from hosts import POD, make_root, reroot  # noqa: E402

CHOICES = [None, *range(0, 10)]  # None: no such node; 0: auto; up to 9 (TorchTPU's table ends at 8)
LAUNCH_VARS = ("TORCH_TPU_SLICEBUILDER_ADDRESSES", "TORCH_TPU_TOPOLOGY", "TORCH_TPU_XPROF_SESSION_ID",
               "TORCH_TPU_BASE_PORT", "TORCH_TPU_DEVICES_PER_HOST", "NNODES", "NODE_RANK", "MASTER_ADDR",
               "MASTER_PORT", *POD)


def torch_tpu_rules(hosts: list[list]) -> None:
    for name in LAUNCH_VARS:
        os.environ.pop(name, None)
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    import torch
    import torch_tpu  # noqa: F401  (the public API without the device: nothing starts)
    from torch_tpu._internal import env_utils
    from torch_tpu._internal.utils import hardware

    work = Path(tempfile.mkdtemp(prefix="fake-tpu-"))
    for gen, chips in hosts:
        reroot(hardware, make_root(work / f"{gen}-{chips}", gen, chips))
        results = {}
        for n in range(1, 10):
            for name in LAUNCH_VARS:
                os.environ.pop(name, None)
            env_utils._resolved_values.clear()  # set_tpu_launch_env's per-process memo
            try:
                torch.tpu.distributed.set_tpu_launch_env(nproc_per_node=n)
                results[n] = {"ok": True, "topology": os.environ.get("TORCH_TPU_TOPOLOGY"),
                              "addresses": os.environ.get("TORCH_TPU_SLICEBUILDER_ADDRESSES", "").count(",") + 1}
            except Exception as e:  # noqa: BLE001  (what TorchTPU refuses, and how)
                results[n] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps({"gen": gen, "chips": chips, "devices": hardware.get_tpu_device_count(),
                          "results": results}), flush=True)


def fake_model(folder: Path) -> Path:
    """A FLUX.1 pipeline folder with FLUX.1's 24 attention heads and no weights: enough for every check."""
    index = {"_class_name": "FluxPipeline", "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "text_encoder": ["transformers", "CLIPTextModel"], "text_encoder_2": ["transformers", "T5EncoderModel"],
             "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "T5TokenizerFast"],
             "transformer": ["diffusers", "FluxTransformer2DModel"], "vae": ["diffusers", "AutoencoderKL"]}
    configs = {"transformer": {"num_attention_heads": 24}, "text_encoder": {"model_type": "clip_text_model"},
               "text_encoder_2": {"model_type": "t5", "num_heads": 64}, "vae": {"block_out_channels": [1, 2, 3, 4]}}
    for name in index:
        if not name.startswith("_"):
            (folder / name).mkdir(parents=True, exist_ok=True)
    for name, config in configs.items():
        (folder / name / "config.json").write_text(json.dumps(config))
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


# Each rank of a group started by our launcher: the handshake port TorchTPU's own code reads from its environment
# (as its coordinator, rank 0, would), and the tier-2 cache name it was given.
RANK_REPORT = """
import json, os
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
from torch_tpu._internal.distributed import handshake
print(json.dumps({"rank": int(os.environ["RANK"]), "handshake_port": handshake._get_validated_port(True),
                  "tier2": os.environ.get("TORCH_TPU_TIER2_COMPILATION_CACHE")}), flush=True)
"""


def what_ranks_see(env: dict[str, str], n: int) -> list[dict]:
    """Starts `n` ranks with `env` through the controller's launcher (each reports, then exits)."""
    from backend.controller import launcher
    from backend.protocol import settings

    launcher.WORKER_COMMAND = [sys.executable, "-c", RANK_REPORT]
    group = launcher.Launcher(n)
    group.start({**env, settings.DEVICE_KIND.name: "tpu"}, os.urandom(32))
    try:
        for proc in group.procs:
            proc.wait(timeout=120)
        lines = group.log_tail(lines=10_000, max_bytes=1 << 20).splitlines()
    finally:
        group.stop(2.0)
        group.close()
    return sorted((json.loads(line) for line in lines if line.startswith("{")), key=lambda r: r["rank"])


def our_rules(hosts: list[dict]) -> None:
    from backend.controller import api, devices, process_env
    from backend.protocol import settings
    from backend.protocol.errors import TPUError

    work = Path(tempfile.mkdtemp(prefix="fake-tpu-"))
    models = work / "models"
    fake_model(models / "flux-24-heads")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT)])  # this folder's sitecustomize, children
    for host in hosts:
        root = make_root(work / f"{host['gen']}-{host['chips']}", host["gen"], host["chips"])
        devices.SYS_ROOT = root  # our PCI scan (this throwaway process only)
        os.environ["FAKE_TPU_ROOT"] = root  # TorchTPU's, in the controller's child processes
        for name, value in POD.items():
            os.environ.pop(name, None)
            if host["pod"]:
                os.environ[name] = value
        os.environ.pop(settings.LOCAL_GROUP.name, None)
        if host["local"]:
            os.environ[settings.LOCAL_GROUP.name] = "1"
        out = {**host, "combos": []}
        try:
            info = devices.detect()
            out["info"] = {"chips": info.chips, "devices": info.devices, "sizes": info.group_sizes,
                           "notes": list(info.notes), "memory_gib": info.memory_gib, "name": info.name}
        except TPUError as e:
            out["info"] = {"error": str(e)}
        for tp in CHOICES:
            for dp in CHOICES:
                step, combo = "load", {"tp": tp, "dp": dp}
                try:
                    spec = api.make_spec("flux-24-heads", [str(models)], offload="auto")
                    step = "shard"
                    if tp is not None:
                        spec, _ = api.shard(spec, tp)
                    step = "replicate"
                    if dp is not None:
                        spec, _ = api.replicate(spec, dp)
                    step = "sample"
                    spec = api.checked(spec)
                    combo.update(ok=True, world=spec.world_size, tp_degree=spec.tp_degree, replicas=spec.dp_replicas,
                                 offload=spec.offload, load_in_turn=spec.load_in_turn)
                except TPUError as e:
                    combo.update(ok=False, step=step, error=f"{type(e).__name__}: {e}")
                out["combos"].append(combo)
        if host.get("launch"):
            try:
                envs = [process_env.tpu_worker_env(host["launch"]) for _ in range(2)]  # two groups on this VM
                out["launch_env"] = {k: v for k, v in envs[0].items() if os.environ.get(k) != v}
                out["groups"] = [what_ranks_see(env, host["launch"]) for env in envs]
            except TPUError as e:
                out["launch_env"] = {"error": str(e)}
        print(json.dumps(out), flush=True)


LAYOUTS = ("dp", "cfg", "tp", "cp")


def _layout_node(spec, layout: str, degree: int):
    from backend.controller import api

    if layout == "cfg":
        return api.cfg_parallel(spec)[0]
    if layout == "tp":
        return api.shard(spec, degree)[0]
    if layout == "cp":
        return api.context_parallel(spec, degree, "ulysses")[0]
    return spec


def family_layouts(cases: list[dict]) -> None:
    import shutil

    from backend import families
    from backend.controller import api, devices
    from backend.controller.components import Components
    from backend.protocol.errors import TPUError
    from backend.protocol.spec import read_index

    work = Path(tempfile.mkdtemp(prefix="fake-tpu-"))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT)])
    for name in POD:
        os.environ.pop(name, None)
    for case in cases:
        family = families.FAMILIES[case["family"]]
        models = work / f"models-{family.id}"
        if not models.exists():
            if family.configs:  # the published model's configs (no weights)
                shutil.copytree(families.config_dir(family.configs[0].folder), models / family.id)
                index = read_index(models / family.id)  # a modular family's is modular_model_index.json
                for part in (k for k, v in index.items() if not k.startswith("_") and isinstance(v, list) and v[0]):
                    (models / family.id / part).mkdir(exist_ok=True)  # tokenizers: no files needed for a layout
            else:  # a family of diffusers folders only: its tiny pipeline (a few MB)
                from backend.tiny_models import build_tiny_pipeline

                build_tiny_pipeline(family.tiny[0], models / family.id)
        root = make_root(work / f"{case['gen']}-{case['chips']}", case["gen"], case["chips"])
        devices.SYS_ROOT = root
        os.environ["FAKE_TPU_ROOT"] = root
        info = devices.detect()
        spec0 = api.make_spec(family.id, [str(models)], offload="none")
        out = {**case, "class_name": spec0.class_name, "heads": Components(spec0).heads, "sizes": info.group_sizes,
               "combos": []}
        for layout in LAYOUTS:
            for degree in (range(1, 10) if layout in ("tp", "cp") else [2 if layout == "cfg" else 1]):
                for dp in [None, *range(1, 10)]:
                    for first in (("layout", "dp") if dp is not None and layout != "dp" else ("layout",)):
                        combo, step = {"layout": layout, "degree": degree, "dp": dp, "dp_first": first == "dp"}, ""
                        try:
                            spec = api.make_spec(family.id, [str(models)], offload="none")
                            for step in ((layout, "dp") if first == "layout" else ("dp", layout)):
                                if step == "dp":
                                    spec = api.replicate(spec, dp)[0] if dp is not None else spec
                                else:
                                    spec = _layout_node(spec, layout, degree)
                            step = "sample"
                            spec = api.checked(spec)
                            combo.update(ok=True, world=spec.world_size, tp=spec.tp_degree, cp=spec.cp_degree,
                                         cfg=spec.cfg_parallel, replicas=spec.dp_replicas)
                        except TPUError as e:
                            combo.update(ok=False, step=step, error=f"{type(e).__name__}: {e}")
                        out["combos"].append(combo)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    {"torch_tpu": torch_tpu_rules, "ours": our_rules, "families": family_layouts}[sys.argv[1]](json.loads(sys.argv[2]))
