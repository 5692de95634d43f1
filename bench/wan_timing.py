"""One Wan video on this host's chips, timed end to end: the figure to hold against the published TPU numbers.

    bash bench/wan.sh --model models/diffusers/Wan2.2-T2V-A14B-Diffusers            # 1280x720, 81 frames, 40 steps
    bash bench/wan.sh --model .../Wan2.1-T2V-14B-Diffusers --steps 50                 # the Wan 2.1 figures

Like `python -m backend tpu-check`, it goes through `backend.controller.api` as the nodes do: the layout over
every chip of the host (default: CFG Parallel's two passes, each split by Context Parallel over half the chips),
compiled mode with the video's shape as the warm-up, then one video of the published workload, timed, with where
the time went (text, denoise, VAE, hand-back). It prints the figure next to the published ones and writes a JSON.
The published numbers are for other software on the same chips (maxdiffusion on JAX): the comparison holds when
the workload (model, 1280x720, 81 frames, steps, CFG) is the same. Not yet run on a TPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

# (what, chips, seconds per video, source), all 1280x720, 81 frames, with CFG
PUBLISHED = (("Wan 2.2 A14B T2V, 40 steps", "v7x-8", 194.0, "maxdiffusion"),
             ("Wan 2.1 14B T2V, 50 steps", "v7x-8", 249.0, "maxdiffusion"),
             ("Wan 2.1 14B T2V, 50 steps", "v6e-8", 229.0, "maxdiffusion"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/wan.sh", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a Wan diffusers folder (WanPipeline)")
    p.add_argument("--frames", type=int, default=81)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--guidance", type=float, default=5.0)
    p.add_argument("--layout", default="cfg+cp", choices=("cfg+cp", "cp", "one"),
                   help="cfg+cp: CFG Parallel, each pass over half the chips by Context Parallel (default); cp: "
                        "Context Parallel over all chips; one: one chip")
    p.add_argument("--mode", default="compiled", choices=("compiled", "eager"))
    p.add_argument("--offload", default="none", choices=("none", "auto", "model"))
    p.add_argument("--out", default="", help="also write the result as JSON here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from backend.controller import api, devices
    from backend.protocol.messages import Status
    from backend.protocol.spec import SampleRequest

    args = parse_args(argv)
    folder = Path(args.model).expanduser().resolve()
    info = devices.detect()
    spec = api.make_spec(folder.name, [str(folder.parent)], offload=args.offload)
    if args.layout == "cfg+cp":
        spec = api.cfg_parallel(spec)[0]
    if args.layout == "cp" or (args.layout == "cfg+cp" and info.kind != "cpu"):  # auto degree: the chips left
        spec = api.context_parallel(spec, 0)[0]
    if args.mode == "compiled":
        spec = api.with_compile(spec, "whole denoiser", "auto", f"{args.width}x{args.height}x{args.frames}f")[0]
    req = SampleRequest(prompt="a red fox running through fresh snow in a pine forest, morning light, cinematic",
                        negative_prompt="blurry, low quality, static, distorted", width=args.width,
                        height=args.height, frames=args.frames, steps=args.steps, guidance=args.guidance, seed=0)
    prepared = api.prepare_sample(spec, req)

    def say(msg) -> None:
        if isinstance(msg, Status) and msg.text:
            print(f"  {msg.text}", file=sys.stderr, flush=True)

    print(f"{info.kind} ({info.name}), {info.devices} device(s); {folder.name}; {args.width}x{args.height}, "
          f"{args.frames} frames, {args.steps} steps, guidance {args.guidance:g}; layout {args.layout} "
          f"(world size {prepared.spec.world_size}), {args.mode}", flush=True)
    t0 = time.perf_counter()
    api.load(prepared.spec, say)  # start, load, and in compiled mode the warm-up video
    loaded = time.perf_counter() - t0
    t1 = time.perf_counter()
    frames = api.run_sample(prepared, say)
    seconds = time.perf_counter() - t1
    latency = api.last_latency() or {}
    api.shutdown()
    result = {"device": {"kind": info.kind, "name": info.name, "devices": info.devices}, "model": folder.name,
              "workload": vars(args), "world_size": prepared.spec.world_size, "notes": list(prepared.notes),
              "start_load_warmup_s": round(loaded, 1), "video_s": round(seconds, 1), "frames_shape": list(frames.shape),
              "phases_s": latency, "published": [dict(zip(("what", "chips", "s", "source"), p, strict=True)) for p in PUBLISHED]}
    print(f"\none video: {seconds:.1f} s (text {latency.get('text_s', 0):.1f}, denoise {latency.get('denoise_s', 0):.1f}, "
          f"VAE {latency.get('vae_s', 0):.1f}, hand-back {latency.get('handback_s', 0):.1f}); start, load and "
          f"warm-up before it: {loaded:.1f} s")
    for what, chips, published, source in PUBLISHED:
        print(f"published: {what}, 1280x720x81, {chips}: {published:.0f} s ({source})")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
