"""FLUX.1 Redux in the worker (Apply Redux): diffusers' FluxPriorReduxPipeline, made of the SigLIP image encoder and
the Redux image embedder (loaded beside the pipeline, never into it), the published image processor (shipped in
backend/configs, never fetched) and the loaded pipeline's own text encoders and tokenizers (shared, not copied).
Its prompt_embeds and pooled_prompt_embeds replace the prompt of each call, as diffusers' example hands them to
FluxPipeline; so every FLUX.1 pipeline the loaded one makes (image to image, ControlNets, the tools) takes them.

The prior runs on every rank, whole (under Shard TP its image models are replicated; text encoders sharded by
the choice of Shard TP run as in the pipeline's own text path); each Data Parallel replica runs its own. The
references and scales are call arguments: changing them never reloads, and the token count stays 512 + 729
whatever the references (they are summed), so a compiled denoiser never recompiles for them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..families import config_dir
from ..families.flux1 import REDUX_CONFIGS
from ..protocol.spec import PipelineSpec, ReduxRef, read_json, redux_key
from . import images
from .loading import from_linked_file
from .prompt_cache import PromptCache

PRIOR_TEXT_TOKENS = 512  # FluxPriorReduxPipeline encodes the prompt (and makes its zeros) at this length


def load_models(ref: ReduxRef, dtype: Any) -> tuple[Any, Any]:
    """The SigLIP image encoder and the Redux image embedder of `ref` on the CPU in `dtype`, from ComfyUI's files
    with the published configs and the sizes the controller read from the files."""
    from diffusers.pipelines.flux.modeling_flux import ReduxImageEncoder
    from transformers import SiglipVisionModel

    folder = config_dir(REDUX_CONFIGS)
    vision = {**read_json(folder / "image_encoder" / "config.json"), **json.loads(ref.vision_config)}
    embedder = {**read_json(folder / "image_embedder" / "config.json"), **json.loads(ref.embedder_config)}
    return (from_linked_file(SiglipVisionModel, ref.clip_vision, vision, dtype),
            from_linked_file(ReduxImageEncoder, ref.style_model, embedder, dtype))


class Redux:
    """The prior the current spec's Redux references need (its image models loaded once per pair of files),
    until the pipeline is unloaded."""

    def __init__(self, status: Callable[[str], None], prompts: PromptCache):
        self.status, self.prompts = status, prompts
        self.pipe: Any = None
        self.key: tuple = ()
        self.prior: Any = None

    def forget(self) -> None:
        self.pipe, self.key, self.prior = None, (), None

    def prior_for(self, pipe: Any, spec: PipelineSpec, device: Any) -> Any:
        """FluxPriorReduxPipeline for the spec's references and `pipe`'s text encoders; None without references."""
        if pipe is not self.pipe:
            self.forget()
            self.pipe = pipe
        if not spec.redux:
            self.prior, self.key = None, ()  # no longer chained: freed
            return None
        ref = spec.redux[0]  # chained references share the files (the controller checks)
        key = tuple((p, Path(p).stat().st_mtime_ns) for p in (ref.style_model, ref.clip_vision))
        key += (ref.vision_config, ref.embedder_config)
        if key != self.key:
            import diffusers
            from transformers import SiglipImageProcessor

            self.prior = None
            self.status(f"loading FLUX.1 Redux ({ref.name}, {Path(ref.clip_vision).name})")
            encoder, embedder = (m.to(device).eval().requires_grad_(False) for m in load_models(ref, pipe.dtype))
            processor = SiglipImageProcessor.from_dict(  # the shipped settings: nothing to download
                read_json(config_dir(REDUX_CONFIGS) / "feature_extractor" / "preprocessor_config.json"))
            self.prior = diffusers.FluxPriorReduxPipeline(
                image_encoder=encoder, feature_extractor=processor, image_embedder=embedder,
                text_encoder=pipe.text_encoder, tokenizer=pipe.tokenizer, text_encoder_2=pipe.text_encoder_2,
                tokenizer_2=pipe.tokenizer_2)
            self.prior.set_progress_bar_config(disable=True)
            self.prompts.wrap(self.prior)  # it encodes the prompt with the loaded text encoders: the same cache
            self.prior.encode_prompt = _copies(self.prior.encode_prompt)
            self.key = key
        return self.prior

    def add_inputs(self, prior: Any, spec: PipelineSpec, kwargs: dict, arrays: dict) -> None:
        """Replaces the call's prompt (or Sample's CONDITIONING) with the prior's embeddings of every reference
        image, each with its node's scales, as one FluxPriorReduxPipeline call with a list of images makes them."""
        if prior is None:
            return
        pictures, scales, pooled_scales = [], [], []
        for i, ref in enumerate(spec.redux):
            for image in arrays[redux_key(i)]:
                pictures.append(images.pil(image))
                scales.append(float(ref.prompt_embeds_scale))
                pooled_scales.append(float(ref.pooled_prompt_embeds_scale))
        call: dict[str, Any] = {"image": pictures, "prompt_embeds_scale": scales,
                                "pooled_prompt_embeds_scale": pooled_scales}
        n = len(pictures)
        if "prompt_embeds" in kwargs:  # Sample's positive CONDITIONING: the prior takes it as the prompt's tokens
            call["prompt_embeds"] = kwargs.pop("prompt_embeds").repeat(n, 1, 1)
            call["pooled_prompt_embeds"] = kwargs.pop("pooled_prompt_embeds").repeat(n, 1)
        elif spec.redux[0].text:
            call["prompt"] = kwargs.pop("prompt")
        else:  # as the prior without text encoders: zeros (of this model's text widths) for the prompt's tokens
            kwargs.pop("prompt")
            den = spec.component_config("transformer")
            where = {"device": prior._execution_device, "dtype": prior.image_embedder.dtype}
            call["prompt_embeds"] = torch.zeros(n, PRIOR_TEXT_TOKENS, den["joint_attention_dim"], **where)
            call["pooled_prompt_embeds"] = torch.zeros(n, den["pooled_projection_dim"], **where)
        out = prior(**call)
        kwargs["prompt_embeds"], kwargs["pooled_prompt_embeds"] = out.prompt_embeds, out.pooled_prompt_embeds


def _copies(encode: Callable) -> Callable:
    """`encode` returning copies: the prior scales the pooled embedding it gets in place, and what the prompt
    cache holds must stay as it was encoded."""

    def encode_prompt(*args, **kwargs):
        return tuple(t.clone() if torch.is_tensor(t) else t for t in encode(*args, **kwargs))

    return encode_prompt


def warmup_arrays(spec: PipelineSpec) -> dict[str, np.ndarray]:
    """Grey references for a compile warm-up, so that it compiles the token count Redux calls have."""
    return {redux_key(i): np.full((1, 64, 64, 3), 0.5, np.float32) for i in range(len(spec.redux))}
