"""What a worker does with requests: load (or reuse) a diffusers pipeline, run it in an execution mode, sample.

Keeps one pipeline warm; the load key decides when weights must be reloaded. The runtime owns the execution
mode and the compile warm-up loop; compiling itself is the compiler's (`compiler.Compiler`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import families
from ..families.text_encoders import TOKENIZER_LAYOUTS
from ..protocol import messages, samplers, settings
from ..protocol.errors import Interrupted, ModelError
from ..protocol.messages import Request, Status, Step
from ..protocol.spec import FP8_STORAGE, PipelineSpec, SampleRequest, mode_note, warmup_request
from . import (
    controlnets,
    device,
    images,
    latents,
    loading,
    modular,
    parallel,
    quantized,
    redux,
    rng,
    sound,
    storage,
)
from .cfg_parallel import CFGParallel, named_branches, two_passes
from .compile_cache import CACHE_INFO
from .compiler import Compiler, experts, named_experts, steps_for_every_expert
from .latency import Latency
from .lora import Loras
from .prompt_cache import PromptCache, text_encoder_state
from .step_cache import StepCache

# Sample's CONDITIONING as the pipelines take it (the controller sends these arrays)
EMBEDDINGS = ("prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds", "negative_pooled_prompt_embeds")
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class Runtime:
    def __init__(self, kind: str, device: Any, rank: int, world_size: int, channel: Any):
        self.kind, self.device, self.rank, self.world_size, self.channel = kind, device, rank, world_size, channel
        self.pipe: Any = None
        self.own_scheduler: Any = None  # the loaded pipeline's scheduler (Sample's sampler 'default')
        self.loaded: PipelineSpec | None = None  # the description the weights in memory were loaded for
        self.loads, self.samples = 0, 0  # samples: Sample requests served (compile warm-ups are not samples)
        self.steps = 0  # denoising steps run, all requests together (ranks of one sharded model agree)
        self.vae_decodes = 0  # runs of the VAE's decoder (Sample Latent never runs it)
        self.mode = "strict eager"
        self._rid: int | None = None
        self._cache_told = False  # a renewed or unusable compile cache folder is said once
        self.compiler = Compiler(self.status)
        self.loras = Loras(self.status)
        self.step_cache = StepCache(self.status)
        self.pass_peers: Any = None  # the ranks of one denoiser pass (TP/context shards), when step caching needs them
        self.image_pipes = images.ImagePipelines(self.status)
        self.controlnets = controlnets.ControlNetPipelines(self.status)
        self.vote = parallel.StopVote(1)  # replaced at load time when the model is split over ranks
        self.prompts = PromptCache()
        self.redux = redux.Redux(self.status, self.prompts)
        self.cfg: CFGParallel | None = None  # the CFG split of the loaded denoiser (CFG Parallel)
        self.latency = Latency()

    # ---- dispatch
    def handle(self, request: Request) -> tuple[dict, dict | None]:
        self._rid = request.id
        if request.op == messages.LOAD:
            return self.prepare(request.spec), None
        if request.op == messages.SAMPLE:
            t0 = time.perf_counter()
            self.prepare(request.spec)
            self.latency = Latency()
            self.latency.parts["load_s"] = time.perf_counter() - t0  # loading, LoRAs, mode and compile warm-ups
            out = self.sample(request.spec, request.request, request.arrays)
            self.samples += 1
            value = {"loads": self.loads, "latency": self.latency.as_dict(), "sent_at": time.time()}
            return value, out
        if request.op == messages.DECODE:
            self.prepare(request.spec)
            out = (latents.decode(self.pipe, request.spec.family, request.arrays["latent"], self.channel.interrupt.is_set,
                                  self.status) if self.rank == 0 else None)  # rank 0 alone: no stop vote
            return {"loads": self.loads}, ({"images": out} if out is not None else None)
        if request.op == messages.INFO:
            return self.info(), None
        raise ValueError(f"unknown worker op '{request.op}'")

    def status(self, text: str) -> None:
        if self.rank != 0:  # every rank does the same; one voice is enough
            return
        self.channel.send(Status(self._rid, text))

    def info(self) -> dict:
        return {"rank": self.rank, "pid": os.getpid(), "device": str(self.device), "loads": self.loads,
                "samples": self.samples, "steps": self.steps, "vae_decodes": self.vae_decodes,
                "cfg_exchanges": self.cfg.exchanges if self.cfg is not None else 0,  # CFG Parallel's split passes
                "threads": torch.get_num_threads(),  # CPU pixels agree bit for bit only at equal thread counts
                "model": self.loaded.model_path if self.loaded else None,
                "dtype": str(self.pipe.dtype).replace("torch.", "") if self.pipe is not None else None,
                "offload": self.loaded.offload if self.loaded else None,
                "storage": self.loaded.storage if self.loaded else None,  # fp8 storage of the denoiser ("" none)
                "device_mesh": parallel.group_mesh.cache_info().currsize > 0,  # this process built one
                "experts": self._experts(),
                "loras": self.loras.info(), "lora_apply_s": self.loras.apply_s,
                "compile": {"mode": self.mode, "note": mode_note(self.kind, self.mode), **self.compiler.stats(),
                            "torch_tpu_cache": device.tpu_cache_stats(self.kind)},
                "prompt_cache": self.prompts.stats()}

    def _experts(self) -> dict[str, dict]:
        """What each denoiser (both experts of a pair) runs under: diffusers' context-parallel config, the CFG
        split, compiled modules, a step cache hook, layers kept in fp8 storage."""
        if self.pipe is None:
            return {}
        named = named_experts(self.pipe)  # the first one as "denoiser", the others by their component name
        return {("denoiser" if i == 0 else name): {"context_parallel": getattr(module, "_parallel_config", None) is not None,
                       "cfg_split": self.cfg is not None and self.cfg.splits(module),
                       "compiled": sum(getattr(m, "_compiled_call_impl", None) is not None for m in module.modules()),
                       "step_cache": bool(getattr(module, "is_cache_enabled", False)),
                       "fp8_layers": sum(storage.compute_dtype_of(m) is not None for m in module.modules())}
                for i, (name, module) in enumerate(named.items())}

    # ---- loading, mode, warm-up
    def prepare(self, spec: PipelineSpec) -> dict:
        """Loads the pipeline unless it is loaded, sets the mode, compiles and warms up what the plan asks."""
        if self.loaded is None or self.loaded.load_key() != spec.load_key():
            self.load(spec)
        self.set_mode(spec)
        if spec.step_cache != "off":  # collective the first time: every rank prepares every request
            self.pass_peers = parallel.pass_peers(spec)
        tp = (parallel.spec_mesh(spec, self.kind)["tp"], "transformer") if spec.tp_degree > 1 else None
        self.loras.apply(self.pipe, spec.loras, spec.family.name, tp)
        for i, todo in enumerate(pending := self.compiler.apply(self.pipe, spec, self.dtype_name(spec)), 1):
            w, h, *_ = todo
            req = warmup_request(spec, *todo)
            # a pair: both experts compile in the warm-up (which runs the pipeline's own scheduler)
            steps = steps_for_every_expert(self.pipe, self.own_scheduler, req.steps)
            self.status(f"warm-up {i}/{len(pending)}: {todo.label()}"
                        + (f", {steps} steps so that both experts run" if steps != req.steps else ""))
            # edit and image-to-video models need an image: a grey one of the size (reference images add their
            # own tokens)
            grey = {"image": np.full((1, h, w, 3), 0.5, np.float32)} if spec.family.needs_image else {}
            if spec.family.needs_mask:  # FLUX.1 Fill: and a mask (all of it repainted)
                grey["mask"] = np.ones((1, h, w), np.float32)
            self.sample(spec, dataclasses.replace(req, steps=steps),
                        {**grey, **controlnets.warmup_arrays(spec, w, h), **redux.warmup_arrays(spec)})
            self.compiler.warmed_up(todo)
        return self.info()

    def _count_decode(self, module: Any, args: Any) -> None:
        self.vae_decodes += 1

    def dtype_name(self, spec: PipelineSpec) -> str:
        """The dtype the weights compute in (fp8 storage: the dtype each layer is cast to while it runs)."""
        if spec.dtype == "auto":
            return device.default_dtype_name(self.kind)
        return "bfloat16" if spec.dtype in FP8_STORAGE else spec.dtype

    def load(self, spec: PipelineSpec) -> None:
        self.unload()
        dtype_name = self.dtype_name(spec)
        self.status(f"loading {spec.name} ({dtype_name}) on {self.device}")
        t0 = time.perf_counter()
        extra = parallel.load_kwargs(spec, self.kind)  # collective: before the turns
        pipe = parallel.in_turn(spec, self.rank,
                                lambda: self._load_onto_device(spec, dtype_name, extra), self.status)
        pipe.set_progress_bar_config(disable=True)
        for module in pipe.components.values():  # inference only; the same flags whatever a LoRA load did
            if isinstance(module, torch.nn.Module):
                module.requires_grad_(False)
        self.vote = parallel.StopVote(spec.model_ranks)
        pipe.vae.decoder.register_forward_pre_hook(self._count_decode)
        self.prompts.attach(pipe)
        if spec.cp_degree > 1:
            for expert in experts(pipe):
                parallel.check_even_split(expert, spec.cp_degree, spec.family.cp_packed)
        if spec.cfg_parallel > 1:
            self.cfg = CFGParallel(experts(pipe), spec.family.cfg_passes, parallel.cfg_group(spec, self.kind),
                                   spec.layout(self.rank).cfg_rank)
        self.pipe, self.loaded, self.own_scheduler = pipe, spec, pipe.scheduler
        self.vae_tiles = bool(getattr(getattr(pipe, "vae", None), "use_tiling", False))  # the VAE's own default
        self.loads += 1
        self.status(f"loaded {spec.name} in {time.perf_counter() - t0:.1f} s")
        if self.should_stop():  # loading cannot stop midway; stop right after it (all TP ranks agree)
            self.status("stopped after loading finished (loading cannot be interrupted midway); the model "
                        "stays loaded for the next run")
            raise Interrupted(Interrupted.DEFAULT)

    def _load_onto_device(self, spec: PipelineSpec, dtype_name: str, extra: dict | None) -> Any:
        """Reads the weights into host memory and puts them where the offload choice says."""
        try:
            stored = getattr(torch, spec.storage) if spec.storage else None  # fp8 storage: read into it
            quantized_file = spec.source is not None and spec.source.quantized() is not None
            if (stored is not None or quantized_file) and self.kind == "cpu":  # both allocate weights per call
                storage.return_freed_blocks()
            if spec.source is not None and not modular.own_files(spec.source):  # artists' files (FLUX 3's too)
                pipe = loading.load_files(spec.source, _DTYPES[dtype_name], self.status, extra, stored)
            elif spec.family.modular is not None:  # a folder, or files of a modular configs folder (MiniMax H3)
                pipe = modular.load(spec.model_path, spec.family, _DTYPES[dtype_name], self.status, extra, spec.source)
            else:
                pipe = loading.load_pipeline(spec.model_path, _DTYPES[dtype_name], self.status, extra, spec.variant,
                                             stored)
        except OSError as e:
            if device.is_oom(e):
                raise
            if spec.source is not None:
                raise RuntimeError(f"model: '{spec.name}' could not be loaded ({e}). ComfyUI-TPU never downloads at "
                                   "run time: check that the files are complete and belong together.") from e
            raise RuntimeError(
                f"model: '{spec.name}' could not be loaded from its folder ({e}). ComfyUI-TPU never downloads at "
                "run time: make sure the folder holds every component (safetensors weights, configs, "
                "tokenizers).") from e
        plain = "tpu" if spec.mode == "compiled" else self.kind  # compiled: the TPU's aten-only layers anywhere
        for name, module in pipe.components.items():  # a TPU keeps int8/fp8 layers only (worker/quantized.py)
            if isinstance(module, torch.nn.Module):
                quantized.for_device(module, plain, _DTYPES[dtype_name], self.status, name)
        storage.keep_in_storage_dtype(pipe, spec, _DTYPES[dtype_name])  # the rest: cast before the device
        if spec.offload == "model":
            pipe.enable_model_cpu_offload(device=self.device)
        elif spec.offload == "sequential":
            pipe.enable_sequential_cpu_offload(device=self.device)
        elif spec.offload == "none":
            pipe.to(self.device)
        else:
            raise ValueError(f"offload '{spec.offload}' was not resolved by the controller")
        return pipe

    def set_mode(self, spec: PipelineSpec) -> None:
        """Applies the execution mode process-wide (only TorchTPU has eager modes) and says what differs here."""
        if not self._cache_told and not CACHE_INFO["status"].startswith(("new", "reused", "not set up")):
            self.status(f"compile cache {CACHE_INFO['dir']}: {CACHE_INFO['status']}")  # renewed or disabled
        self._cache_told = True
        self.mode = spec.mode
        device.set_execution_mode(self.kind, spec.mode)
        if note := mode_note(self.kind, spec.mode):
            self.status(note)

    def unload(self) -> None:
        if self.pipe is None:
            return
        self.compiler.forget()
        self.loras.forget()
        self.step_cache.forget()
        self.image_pipes.forget()
        self.controlnets.forget()
        self.redux.forget()
        self.prompts.clear()
        self.pipe, self.loaded, self.cfg, self.own_scheduler = None, None, None, None
        gc.collect()
        if self.kind == "cuda":
            torch.cuda.empty_cache()

    # ---- sampling
    def sample(self, spec: PipelineSpec, req: SampleRequest, arrays: dict | None = None) -> dict | None:
        """This replica's outputs as `req.outputs` asks (None on ranks that do not send them): "images" [B, H, W, C]
        float32 in 0..1, a video pipeline's frames [B·F, H, W, C]; "latents", ComfyUI's LATENT of each image
        (worker/latents.py); a video model's sound "audio" [B, C, S] and its "audio_rate" (worker/sound.py).
        Global image i is drawn from its own generator (seed + i) and with its own pipeline call, so the same seed
        gives the same pixels whatever the batch size or the number of replicas (batched matmuls differ in the
        last bits between a batch of 4 and two of 2). Replica r draws a contiguous slice. With input images
        (`arrays`: image, mask, or latent), image i of the run takes input image i (cycling). With `spec.batched`
        the images of one prompt go in one call instead (each still with its own generator; text to image without
        ControlNets only): faster where the chip has room, not bit-identical to one call per image."""
        arrays = arrays or {}
        layout = spec.layout(self.rank)
        everything, indices = req.images(), layout.my_share(req)
        kind = images.task(spec.family, arrays, req.denoise)
        pipe = (self.controlnets.for_task(self.pipe, spec, kind, self.device)
                or self.image_pipes.for_task(self.pipe, spec.family, kind))
        if spec.family.modular is not None:  # a partition its task loaded now (transformer_ref) gets the LoRAs
            self.loras.apply(self.pipe, spec.loras, spec.family.name)
        device.eager_workarounds(self.kind, pipe)  # TPU: the UNets' time_proj on the CPU (device.py)
        if spec.family.frame_step:  # tiled when asked, else as the VAE loaded (MiniMax H3's tiles by default, as
            images.tile_vae(pipe.vae, req.tiled_vae, self.vae_tiles)  # its released frames were made)
        self.prompts.wrap(pipe)  # an image pipeline made from the loaded one shares its prompt cache
        prior = self.redux.prior_for(self.pipe, spec, self.device)
        if self.should_stop():
            raise Interrupted(Interrupted.DEFAULT)
        calls: list[tuple[str, list[int]]] = []  # (prompt, global image indices) of each pipeline call
        for i in indices:
            prompt = everything[i][0]
            if spec.batched and kind == images.TEXT and not spec.controlnets and calls and calls[-1][0] == prompt:
                calls[-1][1].append(i)
            else:
                calls.append((prompt, [i]))
        out, latent_out, audio_out, done = [], [], [], 0
        keep_latents, decode = layout.leader and req.outputs != "images", req.outputs != "latents"
        for prompt, group in calls:
            if kind in (images.IMG2IMG, images.INPAINT) and req.denoise == 0:  # nothing to repaint
                out.append(images.input_image(arrays, group[0], req.width, req.height))
                done += 1
                continue
            generators = [rng.generator(everything[i][1]) for i in group]
            pipe.scheduler = self._scheduler(spec, req, kind, everything[group[0]][1])
            kwargs = self._call_kwargs(pipe, spec, req, generators, prompt)
            self._embeddings(pipe, spec, kwargs, arrays)
            if not layout.leader:  # only a replica's first rank sends images: its peers skip the VAE decode
                kwargs["output_type"] = "latent"
            split = self._cfg_split(pipe, spec, kwargs, say=not done)
            with (torch.inference_mode(), self.latency.call(self.prompts), split,
                  self.prompts.using(spec.prompt_cache, text_encoder_state(spec)),
                  self.step_cache.call(pipe, spec, req.steps, self.pass_peers), parallel.even_text(pipe, spec),
                  contextlib.ExitStack() as sampling):
                self.redux.add_inputs(prior, spec, kwargs, arrays)  # before the compiler reads the text length
                call = sampling.enter_context(self.compiler.sampling(pipe, spec, kwargs, bool(req.upscale_model)))
                sampling.enter_context(controlnets.seeded(spec, everything[group[0]][1]))
                sampling.enter_context(rng.cpu_draws(self.kind, everything[group[0]][1]))
                controlnets.add_inputs(spec, kind, kwargs, arrays, group[0])
                images.add_inputs(pipe, spec.family, kind, kwargs, arrays, group[0], req)
                sound.add_inputs(pipe, spec.family, kind, kwargs, arrays, group[0], sampling)
                each = messages.steps_per_image(req)  # both stages' with upscale_model (two_stage.call)
                self._on_steps(pipe, kwargs, call, done=done * each, total=len(indices) * each,
                               report=layout.leader, per_step=len(group), steps=each,
                               then=images.decode_note(spec, req) if decode else "")
                result, taken = None, []
                with contextlib.ExitStack() as latent_io:
                    if kind == images.LATENT:
                        latent_io.enter_context(latents.encoded_as(pipe, images.input_latent(arrays, group[0])))
                    if keep_latents:
                        latent_io.enter_context(latents.captured(pipe, taken, decode))
                    if spec.family.frame_step and layout.leader and decode and not spec.family.modular:
                        stop = self.channel.interrupt.is_set
                        latent_io.enter_context(images.decode_progress(pipe.vae, self.status, stop))
                        latent_io.enter_context(sound.decode_progress(pipe, spec.family, self.status, stop))
                    result = (modular.call(pipe, spec.family, kwargs) if spec.family.modular else
                              families.module(spec.family.family, spec.family.latent_upscale).call(
                                  pipe, kwargs, req.upscale_model, tuple(req.upscale_sigmas))
                              if req.upscale_model else pipe(**kwargs))
            if result is None:  # stopped before the VAE: only the latents were asked for
                self._check_finite(spec, torch.cat(taken), arrays)
            else:
                self._check_finite(spec, result.frames if hasattr(result, "frames") else result.images, arrays)
            done += len(group)
            if layout.leader and decode:
                out.append(images.pixels_of(result, spec.family.alpha))
                if (wave := sound.waveform(spec.family, result)) is not None:
                    audio_out.append(wave)
            latent_out += [latents.comfy_layout(pipe, spec.family, z) for z in taken]
        if not layout.leader or not (out or latent_out):
            return None
        sent = {"images": images.joined(out)} if out else {}
        if latent_out:
            sent["latents"] = images.joined(latent_out)
        if audio_out:  # the sound of each video, and its rate (ComfyUI's AUDIO)
            sent["audio"] = images.joined(audio_out)
            sent["audio_rate"] = np.array([sound.rate(pipe, spec.family)], np.int64)
        return sent

    def _check_finite(self, spec: PipelineSpec, out: Any, arrays: dict) -> None:
        """Latents (ranks that skip the VAE) or images (video frames) holding NaN or infinity would be saved black:
        the run fails instead, naming the likely causes: the inputs first (a latent or CONDITIONING whose values
        overflow), then the LoRAs, the weights and the dtype."""
        latents = isinstance(out, torch.Tensor)
        if bool(torch.isfinite(out).all() if latents else np.isfinite(np.asarray(out, dtype=np.float32)).all()):
            return
        what = "latents" if latents else "images"
        if found := images.outsized(arrays):
            named = ", ".join(f"{name} holds values up to {v:.3g}" for name, v in found.items())
            raise ModelError(f"{'/'.join(found)}: the run made {what} that are not numbers (NaN or infinity), which "
                             f"would be saved as black images, because its input overflowed: {named}, far beyond "
                             f"what a VAE's latent (within about ±{images.OUTSIZED['latent']:g}) or a text "
                             f"encoder's CONDITIONING (±{images.OUTSIZED['prompt_embeds']:g}) holds. Check the "
                             "nodes that made it (a LoadLatent file, latent or conditioning math, a strength).")
        causes = []
        if spec.loras:
            causes.append(f"the LoRAs applied ({', '.join(f'{x.name} at strength {x.strength:g}' for x in spec.loras)}"
                          "): run without them, or at a lower strength, to find out")
        files = sorted({Path(c.path).name for c in spec.source.components if c.layout not in TOKENIZER_LAYOUTS}
                       ) if spec.source else [spec.name]
        causes.append(f"NaN or infinity in the model's weights ({', '.join(files)}): the file is damaged or "
                      "converted wrongly; download it again")
        if (dtype := self.dtype_name(spec)) == "float16":
            causes.append("float16 overflow (the model computes in float16 here): choose dtype bfloat16 or float32 "
                          "in Load TPU Pipeline")
        raise ModelError(f"the run made {what} that are not numbers (NaN or infinity) in {dtype}, which would be saved "
                         f"as black images, so it failed instead. Likely causes: {'; '.join(causes)}.")

    def _scheduler(self, spec: PipelineSpec, req: SampleRequest, kind: str, seed: int) -> Any:
        """The scheduler of one call: the loaded pipeline's own, or the one Sample's sampler and scheduler name
        (checked by the controller), built from its config. Weights and compiled graphs are untouched."""
        own = {**self.own_scheduler.config, "_class_name": type(self.own_scheduler).__name__}
        chosen = samplers.resolve(own, spec.family, req.sampler, req.scheduler,
                                  image_input=kind in (images.IMG2IMG, images.INPAINT, images.LATENT))
        if spec.sigmas and spec.family.sigmas_as_given:  # Sampling Options' sigmas unshifted (LTX-2: base.py)
            own, chosen = {**own, "use_dynamic_shifting": False, "shift_terminal": None}, chosen or (own["_class_name"], {})
        if chosen is None:
            return self.own_scheduler
        import diffusers
        return getattr(diffusers, chosen[0]).from_config(samplers.scheduler_config(own, *chosen, seed))

    def _cfg_split(self, pipe: Any, spec: PipelineSpec, kwargs: dict, say: bool) -> Any:
        """CFG Parallel for one call: split when the pipeline runs two passes, else both ranks run it whole."""
        if self.cfg is None:
            return contextlib.nullcontext()
        family = spec.family
        active = two_passes(pipe, family.cfg_passes, kwargs, family.cfg_above, family.distilled_key)
        if not active and say:
            self.status(f"CFG Parallel: this Sample runs one denoiser pass per step (guidance ≤ {family.cfg_above:g}, or no "
                        "true CFG), or its passes cannot be split (FLUX.1 image to image and inpainting), so both ranks "
                        "compute it whole; raise the guidance (FLUX.1: true_cfg_scale in Sampling Options) to split it.")
        return self.cfg.call(active, named=named_branches(pipe))

    def should_stop(self) -> bool:
        """The controller asked to stop; with a sharded model, agreed by all its ranks at the same step."""
        return self.vote(self.channel.interrupt.is_set())

    def _call_kwargs(self, pipe: Any, spec: PipelineSpec, req: SampleRequest, generators: list,
                     prompt: str) -> dict:
        """The pipeline call's arguments; width and height stay even where the pipeline has none (the compiler
        and the image inputs read them; images.add_inputs drops them)."""
        family = spec.family
        params = modular.parameters(pipe, family)
        kwargs: dict[str, Any] = {
            "prompt": prompt, "height": req.height, "width": req.width,
            "num_inference_steps": req.steps, "generator": generators,
            "num_images_per_prompt": len(generators), "num_videos_per_prompt": len(generators), "output_type": "np",
            family.guidance_arg: req.guidance,
        }
        if spec.sigmas:  # Sampling Options' schedule (the controller made req.steps its length)
            kwargs["sigmas"] = list(spec.sigmas)
        if family.frame_step:
            kwargs["num_frames"] = req.frames
        if family.frame_rate_arg:
            kwargs[family.frame_rate_arg] = req.frame_rate
        also = req.guidance if req.audio_guidance < 0 else req.audio_guidance  # Sample Video's audio_guidance
        kwargs.update(dict.fromkeys(family.guidance_also, also), **dict(family.call_args))
        if family.guidance_arg != "true_cfg_scale" and "true_cfg_scale" in params:
            kwargs["true_cfg_scale"] = spec.true_cfg_scale  # FLUX.1's true CFG (1 = off, its default)
        true_cfg = family.guidance_arg == "true_cfg_scale" or spec.true_cfg_scale > 1
        if "negative_prompt" in params and (req.negative_prompt or true_cfg):
            kwargs["negative_prompt"] = req.negative_prompt  # true CFG runs only with one (Qwen-Image, FLUX.1)
        return {k: v for k, v in kwargs.items() if k in params or k in ("width", "height")}

    def _embeddings(self, pipe: Any, spec: PipelineSpec, kwargs: dict, arrays: dict) -> None:
        """Sample's CONDITIONING (checked and padded by the controller: controller/conditioning.py) in place of the
        prompt text: the pipeline's own embedding arguments, in the compute dtype on its execution device."""
        if "prompt_embeds" not in arrays:
            return
        kwargs.pop("prompt", None), kwargs.pop("negative_prompt", None)
        dtype, where = _DTYPES[self.dtype_name(spec)], pipe._execution_device
        for name in EMBEDDINGS:
            if name in arrays:
                kwargs[name] = torch.from_numpy(np.array(arrays[name])).to(where, dtype)

    def _on_steps(self, pipe: Any, kwargs: dict, call: Any, done: int, total: int, report: bool,
                  per_step: int = 1, steps: int = 1, then: str = "") -> None:
        """Adds the step callback: counts the call's `steps` steps, reports each one (with its duration; a batched
        call's step counts once per image; a second-order scheduler's two model calls count once), stops when
        asked. `then`: said after the last step (what the call does next that no step counts)."""
        if "callback_on_step_end" not in modular.parameters(pipe, self.loaded.family):
            return
        last, counted = [time.perf_counter()], [0]
        order = getattr(pipe.scheduler, "order", 1)  # Heun, DPM2, DPM++ SDE: two model calls per step

        def on_step_end(pipe, step, timestep, callback_kwargs):
            self.latency.step_end()
            if self.cfg is not None:
                self.cfg.check_step()
            stop = self.should_stop()
            if stop and step == 0 and call.compiling:  # the compile ran inside this first step
                # before the step's progress: ComfyUI's progress hook raises on it once Cancel was pressed
                self.status(call.stop_note())
            finished = min(-(-(step + 1) // order), steps)
            if finished > counted[0]:
                self.steps += finished - counted[0]
                counted[0] = finished
                now = time.perf_counter()
                step_s, last[0] = now - last[0], now
                if report:  # steps of this rank's whole share: done before this image + this image's
                    self.channel.send(Step(self._rid, done + finished * per_step, total, step_s, self.rank))
                if report and then and finished == steps and not stop:
                    self.status(then)
            if stop:
                raise Interrupted(Interrupted.DEFAULT)
            return {}

        kwargs["callback_on_step_end"] = on_step_end

    # ---- errors
    def describe_error(self, e: BaseException) -> str:
        text = f"{type(e).__name__}: {e}"
        if device.is_oom(e):
            cap = settings.WORKER_MEMORY_LIMIT_GB.raw()
            if cap:
                cap = f" (this worker's memory is capped at {cap} GiB by {settings.WORKER_MEMORY_LIMIT_GB.name})"
            return (f"out of memory on {self.device}{cap}: {text}. Try offload 'model' or 'sequential' in "
                    "Load TPU Pipeline, a smaller width/height or batch_size, or Shard TP over more chips.")
        return text
