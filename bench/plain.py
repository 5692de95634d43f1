"""The baseline: a plain diffusers script, what a user would write without this pack.

Imports only torch, diffusers, PIL, numpy and psutil (never `backend/` or ComfyUI), loads the pipeline with
`DiffusionPipeline.from_pretrained` and calls `pipe(...)` in its own process, with the same number of torch
threads, the same dtype, the same arguments and the same per-image generator (seed) as this pack's worker.
The bench drives it so that its runs can alternate with ours; its timings are taken inside this process,
around the calls only, so the driving costs it nothing.

Modes:
  serve        load, print {"ready": ...}, then answer one JSON command per stdin line (see `serve`)
  cold         import + load + one image, print {"done": ...} and exit (the bench times it from process start)
  transformer  CUDA only: a full-size random-weight FLUX.1 transformer, forward FLOPs and TFLOP/s (bench/mfu.py)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _dtype(torch, name: str):
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _device(torch, kind: str):
    if kind == "tpu":
        import torch_tpu  # noqa: F401  (registers the device when autoload is off)

        return torch.device("tpu", 0)
    return torch.device(kind)


def _sync(torch, kind: str) -> None:
    if kind in ("cuda", "tpu"):
        torch.accelerator.synchronize()


def load(args):
    import torch
    from diffusers import DiffusionPipeline

    if args.modular:  # a modular pipeline (MiniMax H3), loaded as diffusers' docs show
        from diffusers.modular_pipelines import ModularPipeline

        pipe = ModularPipeline.from_pretrained(args.model, workflow=args.modular)
        pipe.load_components(dtype=_dtype(torch, args.dtype))
        if args.device != "cpu":
            pipe.to(_device(torch, args.device))
        pipe.set_progress_bar_config(disable=True)
        return pipe
    pipe = DiffusionPipeline.from_pretrained(args.model, dtype=_dtype(torch, args.dtype), local_files_only=True,
                                             use_safetensors=True)
    if args.offload == "model":  # diffusers' own model offload, as a script would write it
        pipe.enable_model_cpu_offload(device=_device(torch, args.device))
    else:
        pipe.to(_device(torch, args.device))
    if args.controlnet:  # the family's ControlNet pipeline made from the loaded one, as diffusers' docs show
        import diffusers

        net = diffusers.FluxControlNetModel.from_pretrained(args.controlnet, dtype=_dtype(torch, args.dtype),
                                                            local_files_only=True, use_safetensors=True)
        pipe = diffusers.FluxControlNetPipeline.from_pipe(pipe, controlnet=net.to(_device(torch, args.device)))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def call(pipe, args, cmd: dict) -> dict:
    """One image (or with `frames` one video), exactly as the worker makes it (one pipeline call per image, its own
    generator)."""
    import numpy as np
    import torch

    kwargs = {"prompt": cmd.get("prompt", "a red fox in the snow"), "height": cmd["height"], "width": cmd["width"],
              "num_inference_steps": cmd["steps"], "generator": [torch.Generator("cpu").manual_seed(cmd["seed"])],
              "output_type": "np"}
    modular = bool(args.modular)  # its blocks take no guidance, negative prompt or count of videos (MiniMax H3)
    if modular:
        kwargs["generator"] = kwargs["generator"][0]
    if not modular:
        kwargs[cmd.get("guidance_arg", "guidance_scale")] = cmd.get("guidance", 0.0)
    if cmd.get("negative_prompt"):
        kwargs["negative_prompt"] = cmd["negative_prompt"]
    video = cmd.get("frames")
    if video:
        kwargs.update({"num_frames": video} if modular else {"num_frames": video, "num_videos_per_prompt": 1})
    else:
        kwargs["num_images_per_prompt"] = 1
    if cmd.get("frame_rate"):
        kwargs["frame_rate"] = cmd["frame_rate"]
    kwargs.update(cmd.get("extra", {}))  # the pipeline's own further arguments, as the worker passes them
    if "control" in cmd:  # {"strength", "mode", "seed"}: a ControlNet image drawn from its seed, as the bench's own
        control = cmd["control"]
        kwargs.update(control_image=np.random.default_rng(control["seed"]).random(
            (1, cmd["height"], cmd["width"], 3), dtype=np.float32), controlnet_conditioning_scale=control["strength"],
            control_mode=control["mode"])
    t0, cpu0 = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = pipe(**kwargs)
        images = out.get("videos")[0] if modular else out.frames[0] if video else out.images
    images = np.asarray(images, dtype=np.float32)
    _sync(torch, args.device)
    t1, cpu1 = time.perf_counter(), time.process_time()
    saved = None
    if cmd.get("png_dir"):  # what a script that keeps its image does: 8-bit PNG (ComfyUI's SaveImage level 4)
        from PIL import Image

        saved = os.path.join(cmd["png_dir"], f"plain_{cmd['seed']}.png")
        Image.fromarray(np.clip(images[0] * 255.0, 0, 255).astype(np.uint8)).save(saved, compress_level=4)
    t2 = time.perf_counter()
    return {"call_s": t1 - t0, "cpu_s": cpu1 - cpu0, "save_s": t2 - t1, "shape": list(images.shape)}


def serve(args) -> None:
    """Commands (one JSON object per line): {"op": "call", width, height, steps, seed, [prompt, guidance,
    guidance_arg (the pipeline's name for it), negative_prompt, frames, frame_rate, extra (more pipeline
    arguments), png_dir, control: {seed, strength, mode} with --controlnet]}; {"op": "compile",
    "backend": ...} (torch.compile of the transformer, the options the pack uses); {"op": "graphs"} (dynamo's
    unique graphs so far); {"op": "rss"}; {"op": "quit"}."""
    import torch

    torch.set_num_threads(args.threads)
    rss_torch = _rss()
    t0 = time.perf_counter()
    pipe = load(args)
    _emit({"ready": True, "load_s": time.perf_counter() - t0, "pid": os.getpid(), "threads": torch.get_num_threads(),
           "rss_torch": rss_torch})
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.get("op")
        try:
            if op == "quit":
                _emit({"ok": True})
                os._exit(0)  # nothing to clean up; skips the interpreter's slow teardown of torch
            if op == "call":
                _emit(call(pipe, args, cmd))
            elif op == "compile":
                import torch._dynamo

                torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
                pipe.transformer.compile(fullgraph=True, dynamic=False, backend=cmd["backend"])
                _emit({"ok": True})
            elif op == "graphs":
                from torch._dynamo.utils import counters

                _emit({"graphs": counters["stats"]["unique_graphs"]})
            elif op == "rss":
                _emit({"rss": _rss()})
            else:
                _emit({"error": f"unknown op {op!r}"})
        except Exception as e:  # reported to the bench, which fails the figure with it
            _emit({"error": f"{type(e).__name__}: {e}"})


def cold(args) -> None:
    """Process start → import → load → first image; RSS after `import torch` and at the end."""
    t0 = time.perf_counter()
    import torch

    torch.set_num_threads(args.threads)
    rss_torch = _rss()
    import diffusers  # noqa: F401

    t1 = time.perf_counter()
    pipe = load(args)
    t2 = time.perf_counter()
    out = call(pipe, args, {"width": args.width, "height": args.height, "steps": args.steps, "seed": 0})
    _emit({"done": True, "import_s": t1 - t0, "load_s": t2 - t1, "call_s": out["call_s"], "rss_torch": rss_torch,
           "rss_end": _rss()})


def transformer(args) -> None:
    """Full-size FLUX.1 transformer with random weights at `width`x`height`: FLOPs of one forward (counted by
    torch's FlopCounterMode), then seconds per forward eager and with torch.compile. CUDA only."""
    import torch
    from diffusers import FluxTransformer2DModel

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from mfu_config import flux1_config, flux_inputs  # noqa: E402  (next to this file; pure data)

    torch.set_num_threads(args.threads)
    dtype, dev = _dtype(torch, args.dtype), _device(torch, args.device)
    torch.manual_seed(0)
    with torch.device(dev):
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            model = FluxTransformer2DModel(**flux1_config()).eval()
        finally:
            torch.set_default_dtype(default)
    inputs = flux_inputs(torch, args.width, args.height, args.text_tokens, dtype, dev)
    from torch.utils.flop_counter import FlopCounterMode

    with torch.inference_mode():
        model(**inputs)
        counter = FlopCounterMode(display=False)
        with counter:
            model(**inputs)
        flops = counter.get_total_flops()
    result = {"flops_per_forward": flops, "params": sum(p.numel() for p in model.parameters())}
    for name in ("eager", "compiled"):
        if name == "compiled":
            model.compile(fullgraph=True, dynamic=False)
        with torch.inference_mode():
            t0 = time.perf_counter()
            for _ in range(2):  # warm-up (and the compile), excluded
                model(**inputs)
            _sync(torch, args.device)
            result[f"{name}_first_s"] = time.perf_counter() - t0
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                model(**inputs)
                _sync(torch, args.device)
                times.append(time.perf_counter() - t0)
        result[f"{name}_s"] = times
    _emit({"done": True, **result})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("serve", "cold", "transformer"))
    parser.add_argument("--model", help="diffusers folder (serve, cold)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "tpu"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the pack's workers get the same)")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--height", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--text-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--offload", default="none", choices=("none", "model"), help="serve, cold: model offload")
    parser.add_argument("--controlnet", default="", help="serve: a FLUX.1 ControlNet folder (FluxControlNetPipeline)")
    parser.add_argument("--modular", default="", help="serve: the folder is a modular pipeline; run this workflow")
    args = parser.parse_args()
    {"serve": serve, "cold": cold, "transformer": transformer}[args.mode](args)


if __name__ == "__main__":
    main()
