"""The mfu figures (CUDA only): achieved TFLOP/s and MFU of a full-size FLUX.1 at 1024², random weights, no
download.

Three measurements, in this order, each in its own processes so the GPU holds one copy at a time:
1. the transformer alone in the plain script (bench/plain.py `transformer`): FLOPs of one forward counted by
   torch's FlopCounterMode (real FLOPs of the real modules: matmuls and attention), seconds per forward eager
   and with torch.compile — the ceiling for everything else;
2. whole pipelines, eager: ours (backend.api, strict eager) against plain pipe(), alternating;
3. the same, compiled: ours in the compiled mode (inductor, whole denoiser) against plain pipe() with
   pipe.transformer.compile(fullgraph=True, dynamic=False).
The pipeline folder holds the full-size transformer (12 B parameters, ~24 GB in bfloat16, built once on the GPU
and kept in the bench's models folder) with small random text encoders and VAE of the right widths, so that
the pipeline's FLOPs are the transformer's: pipeline TFLOP/s = steps × FLOPs per forward ÷ seconds per image.

Run as `python -m bench.mfu build OUT TINY_FLUX` it builds that folder (started by `figure`).
BENCH_MFU_FORCE=1 with BENCH_MFU_CONFIG_OVERRIDE (a small config) runs the code path without a GPU; such
numbers mean nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .common import (
    ROOT,
    Ctx,
    PlainServer,
    alternate,
    log,
    median,
    not_available,
    plain_args,
    plain_env,
    qty,
    row,
)
from .figures import request, timed
from .mfu_config import flux1_config, peak_tflops

EAGER = ("mfu_eager", "CUDA: full-size FLUX.1 1024², eager: TFLOP/s and MFU, ours vs plain pipe()")
COMPILED = ("mfu_compiled", "CUDA: full-size FLUX.1 1024², compiled: ours (compiled mode) vs plain + torch.compile")
FOLDER = "flux1-full-random"
WIDTH = HEIGHT = 1024
STEPS = 8
TEXT_TOKENS = 512  # FluxPipeline's default max_sequence_length


def build_main(out: str, tiny: str) -> None:
    """The tiny FLUX.1's tokenizers and scheduler, a full-size transformer, small encoders/VAE of matching widths."""
    import torch
    from diffusers import AutoencoderKL, DiffusionPipeline, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from backend.tiny_models import save_pipeline

    cfg = flux1_config()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    base = DiffusionPipeline.from_pretrained(tiny, dtype=torch.float32, local_files_only=True, use_safetensors=True)
    torch.manual_seed(0)
    clip = CLIPTextConfig(**{**base.text_encoder.config.to_dict(), "hidden_size": cfg["pooled_projection_dim"],
                             "intermediate_size": 2 * cfg["pooled_projection_dim"],
                             "projection_dim": cfg["pooled_projection_dim"], "num_attention_heads": 4})
    t5 = T5Config(**{**base.text_encoder_2.config.to_dict(), "d_model": cfg["joint_attention_dim"], "d_kv": 64,
                     "num_heads": 4, "d_ff": 1024, "num_layers": 1})
    vae = AutoencoderKL.from_config({**base.vae.config, "latent_channels": cfg["in_channels"] // 4})
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(dev):
            transformer = FluxTransformer2DModel(**cfg).eval()
    finally:
        torch.set_default_dtype(default)
    pipe = FluxPipeline(scheduler=base.scheduler, vae=vae, text_encoder=CLIPTextModel(clip), tokenizer=base.tokenizer,
                        text_encoder_2=T5EncoderModel(t5), tokenizer_2=base.tokenizer_2, transformer=transformer)
    pipe.to(dtype=dtype)
    save_pipeline(pipe, Path(out))


def _support(ctx: Ctx) -> str | None:
    if os.environ.get("BENCH_MFU_FORCE") == "1":
        return None
    if ctx.kind != "cuda":
        return (f"CUDA only (this run's device is {ctx.kind}): a full-size FLUX.1 transformer at 1024² is ~0.1 PFLOP "
                "per step; on CUDA this figure builds it with random weights and measures it")
    import torch

    gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    if gib < 70:
        return f"needs a GPU with ≥ 70 GiB (two 24 GB bfloat16 copies alternate); this one has {gib:.0f} GiB"
    return None


def _folder(ctx: Ctx) -> Path:
    folder = ctx.models_dir / FOLDER
    stamp = folder / ".bench-config.json"
    want = json.dumps(flux1_config(), sort_keys=True)
    if not (folder / "model_index.json").is_file() or not stamp.is_file() or stamp.read_text() != want:
        log(f"mfu: building {folder} (full-size random FLUX.1 transformer; once)")
        subprocess.run([sys.executable, "-m", "bench.mfu", "build", str(folder), ctx.model_path("tiny-flux")],
                       cwd=str(ROOT), check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        stamp.write_text(want)
    return folder


def _transformer_alone(ctx: Ctx) -> dict:
    args = [sys.executable, str(Path(__file__).parent / "plain.py"), "transformer",
            *plain_args(ctx, "tiny-flux")[2:], "--width", str(WIDTH), "--height", str(HEIGHT),
            "--text-tokens", str(TEXT_TOKENS), "--repeats", str(max(ctx.repeats, 3))]
    out = subprocess.run(args, capture_output=True, text=True, env=plain_env(ctx), cwd=str(ctx.work))
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        raise RuntimeError(f"the plain transformer run failed: {out.stderr[-2000:]}")
    return json.loads(lines[-1])


def figure(ctx: Ctx) -> list[dict]:
    why = _support(ctx)
    if why:
        return [not_available(*EAGER, why), not_available(*COMPILED, why)]
    from backend.controller import api
    from backend.protocol.spec import CompilePlan

    name = "cpu"
    if ctx.kind == "cuda":
        import torch

        name = torch.cuda.get_device_name(0)
    peak = ctx.peak_tflops or peak_tflops(name)
    _folder(ctx)  # built once, kept in the models folder
    alone = _transformer_alone(ctx)
    flops = alone["flops_per_forward"]
    per_image = STEPS * flops

    def tflops(seconds: float, per: float = per_image) -> dict:
        achieved = per / seconds / 1e12
        return qty(achieved, "TFLOP/s", mfu=achieved / peak if peak else None, s=seconds)

    wide = dataclass_replace(ctx, width=WIDTH, height=HEIGHT, steps=STEPS, model=FOLDER)
    eager = api.make_spec(FOLDER, [str(ctx.models_dir)])
    compiled = eager.with_changes(mode="compiled", compile=CompilePlan(backend="inductor"))
    plain = PlainServer(wide, FOLDER)
    rows = []
    try:
        api.load(eager)
        plain.wait_ready()
        for (fid, title), spec, warmup in ((EAGER, eager, 1), (COMPILED, compiled, 2)):
            if spec is compiled:
                plain.ask("compile", backend="inductor")

            def ours(r: int, spec=spec) -> float:
                return timed(api.sample, spec, request(wide, 2000 + r))

            def base(r: int) -> float:
                return plain.call(2000 + r)["call_s"]

            times = alternate({"ours": ours, "plain": base}, max(ctx.repeats, 3), warmup)
            t_ours, t_plain = median(times["ours"]), median(times["plain"])
            key = "eager_s" if spec is eager else "compiled_s"
            rows.append(row(fid, title, ratio=t_plain / t_ours,
                            ratio_of="ours TFLOP/s ÷ plain TFLOP/s (same FLOPs: plain s ÷ ours s)",
                            ours=tflops(t_ours), plain=tflops(t_plain),
                            details={"device": name, "peak_bf16_tflops": peak, "flops_per_forward": flops,
                                     "params": alone["params"], "steps": STEPS, "image": f"{WIDTH}x{HEIGHT}",
                                     "text_tokens": TEXT_TOKENS,
                                     "transformer_alone": tflops(median(alone[key]), flops),
                                     "counted": "transformer FLOPs only (FlopCounterMode, one forward × steps); "
                                                "the small text encoders and VAE add well under 1%"}))
    finally:
        plain.close()
        api.shutdown()
    return rows


def dataclass_replace(ctx: Ctx, **changes) -> Ctx:
    import dataclasses

    return dataclasses.replace(ctx, **changes)


if __name__ == "__main__":
    if sys.argv[1:2] == ["build"]:
        build_main(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"usage: python -m bench.mfu build OUT TINY_FLUX (got {sys.argv[1:]})")
