"""Host memory while several workers load: the peak of the workers' summed RSS during one load, as a multiple of
the model's size on disk, with the Data Parallel replicas loading together and in turn.

Each measurement starts a fresh group of 2 workers (one per replica), loads tiny-flux first (its first load is
the imports of diffusers and transformers, ~400 MB per worker against 0.9 MB of weights: reported as each
worker's own cost, not counted), then loads the measured model while a thread samples both workers' RSS every
few milliseconds. The weights are loaded in
bfloat16 from float32 files, so each worker converts them into its own memory, as weights pass through a TPU or
GPU worker's host memory on their way to the device. (A float32 load on the CPU maps the files instead: the
pages are shared, and counted only once a computation touches them.) "mid-flux" is a bench-only FLUX.1 of
~144 MB (a wider transformer on tiny-flux's other parts), big enough to stand out of the RSS noise that hides
the 0.9 MB tiny-flux and the 7.9 MB small-flux.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from .common import Ctx, log, qty, row, target

ID = "load_memory"
TITLE = "Host memory while 2 workers load (bfloat16): peak of their summed RSS ÷ one model on disk, in turn vs together"
TARGET = target("<=", 0.75)
MID = "mid-flux"
REPLICAS = 2
MB = 1e6


def build_mid(models_dir: Path) -> Path:
    """mid-flux: tiny-flux with a FLUX.1 transformer 512 wide, 2 double + 4 single blocks (~144 MB float32)."""
    out = models_dir / MID
    if (out / "model_index.json").is_file():
        return out
    import torch
    from diffusers import DiffusionPipeline, FluxTransformer2DModel

    from backend.tiny_models import save_pipeline

    base = DiffusionPipeline.from_pretrained(str(models_dir / "tiny-flux"), local_files_only=True,
                                             use_safetensors=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = FluxTransformer2DModel(
            patch_size=1, in_channels=16, num_layers=2, num_single_layers=4, attention_head_dim=64,
            num_attention_heads=8, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=False,
            axes_dims_rope=(16, 24, 24)).eval()
    base.register_modules(transformer=transformer)
    return save_pipeline(base, out)


def disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*.safetensors"))


def measure(ctx: Ctx, model: str, in_turn: bool) -> dict:
    """One fresh 2-worker group: the summed RSS before, at its peak during, and after loading `model`."""
    import psutil

    from backend.controller import api, group

    roots = [str(ctx.models_dir)]
    warm = api.checked(api.make_spec("tiny-flux", roots, dtype="bfloat16").with_changes(dp_replicas=REPLICAS))
    g = group.WorkerGroup(api.group_config(warm))
    g.start()
    try:
        procs = [psutil.Process(pid) for pid in g.launcher.pids]

        def rss() -> int:
            return sum(p.memory_info().rss for p in procs)

        started = rss()
        g.load(warm)
        before = rss()
        spec = api.checked(api.make_spec(model, roots, dtype="bfloat16")
                           .with_changes(dp_replicas=REPLICAS, load_in_turn=in_turn))
        peak, stop = [before], threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], rss())
                time.sleep(0.002)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        try:
            g.load(spec)
        finally:
            stop.set()
            sampler.join()
        seconds = time.perf_counter() - t0
        after = rss()
    finally:
        g.close()
    size = disk_bytes(ctx.models_dir / model)
    return {"model": model, "in_turn": in_turn, "disk_mb": size / MB, "peak_x": (peak[0] - before) / size,
            "after_x": (after - before) / size, "peak_growth_mb": (peak[0] - before) / MB,
            "imports_mb_per_worker": (before - started) / MB / REPLICAS, "worker_rss_mb": before / MB / REPLICAS,
            "load_s": seconds}


def figure(ctx: Ctx) -> list[dict]:
    models = ["small-flux"] if ctx.quick else ["small-flux", MID]
    if MID in models:
        build_mid(ctx.models_dir)
    runs = []
    for model in models:
        for in_turn in (False, True):
            r = measure(ctx, model, in_turn)
            log(f"load_memory {model} {'in turn' if in_turn else 'together'}: peak {r['peak_x']:.2f}x on disk, "
                f"after {r['after_x']:.2f}x, {r['load_s']:.1f} s")
            runs.append(r)
    main = models[-1]
    together = next(r for r in runs if r["model"] == main and not r["in_turn"])
    turns = next(r for r in runs if r["model"] == main and r["in_turn"])
    return [row(ID, TITLE, ratio=turns["peak_x"] / together["peak_x"],
                ratio_of=f"peak in turn ÷ peak together, {main} ({together['disk_mb']:.1f} MB on disk), "
                         f"{REPLICAS} CPU workers; each worker ends holding 0.5x (bfloat16 of float32 files)",
                ours=qty(round(turns["peak_x"], 3), "x on disk"), plain=qty(round(together["peak_x"], 3), "x on disk"),
                tgt=TARGET, details={"runs": runs, "replicas": REPLICAS, "dtype": "bfloat16",
                                     "ours_is": "replicas loading in turn (the default)",
                                     "plain_is": "the same group with the replicas loading together"})]
