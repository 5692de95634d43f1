"""The FLUX.1 tools from artists' split files (issue 26): Kontext (instruction editing of Sample's image), Fill
(inpainting and outpainting), Depth/Canny (a control image concatenated to the latents), Redux (reference images
through Apply Redux, from ComfyUI's style model and CLIP vision files). Fill and Depth/Canny are told by their
input channels, Kontext by its file name or the loader's flux_kontext choice; each runs diffusers' own pipeline
and gives the pixels of that pipeline run by a plain script on the same inputs and seed.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from lora_fixtures import make

from backend.controller import api, redux
from backend.controller.files import assemble, listing
from backend.families import config_dir
from backend.protocol.errors import InputError
from backend.protocol.spec import PipelineSpec, SampleRequest
from backend.worker import images

FOX = "a red fox in the snow"
TEXTS = ("clip_l-tiny.safetensors", "t5xxl-tiny.safetensors")
COMFYUI_FILES = ("flux1", "flux1tools", "flux1redux", "sd3")  # comfyui_files' families, built from the start (conftest)


@pytest.fixture(scope="module")
def files(comfyui_files, comfyui_dir):
    """flux1's text encoders and VAE, the tools' diffusion models, and an SD3 file (not FLUX.1); ComfyUI's package
    importable here (its key map reads FLUX.1 files of test widths), as it is in ComfyUI's process."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(comfyui_dir))
        yield comfyui_files(*COMFYUI_FILES)


def spec(files: Path, model: str, kontext: str = "auto") -> api.PipelineSpec:
    roots = {role: [str(files / "models" / folder)] for role, folder in listing.ROLE_FOLDERS.items()}
    choice = assemble.FileChoice(diffusion_model=model, text_encoders=TEXTS, vae="ae-tiny.safetensors",
                                 flux_kontext=kontext)
    return api.make_file_spec(choice, roots)


def request(**kw) -> SampleRequest:
    return SampleRequest(**{"prompt": FOX, "width": 32, "height": 32, "steps": 2, "guidance": 4.0, "seed": 3, **kw})


def picture(h: int = 32, w: int = 32) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x / (w - 1), y / (h - 1), (x + y) % 16 / 15], -1)[None].astype(np.float32)


def outpainting(h: int = 32, w: int = 32, pad: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """As ComfyUI's Pad Image for Outpainting makes them (right side padded, feathering 0): the picture with grey
    (0.5) added, and a mask that is 1 on the added part."""
    image = np.full((1, h, w + pad, 3), 0.5, np.float32)
    image[:, :, :w] = picture(h, w)
    mask = np.zeros((1, h, w + pad), np.float32)
    mask[:, :, w:] = 1.0
    return image, mask


def assert_refused(words: list[str], call, *args, **kwargs) -> None:
    with pytest.raises(InputError) as e:
        call(*args, **kwargs)
    assert all(w in str(e.value) for w in words), str(e.value)


@pytest.mark.pipelines
def test_each_tool_is_told_from_its_file_and_bad_inputs_are_refused_before_anything_runs(files):
    fill, depth = spec(files, "flux1-fill-tiny.safetensors"), spec(files, "flux1-depth-tiny.safetensors")
    assert (fill.class_name, depth.class_name) == ("FluxFillPipeline", "FluxControlPipeline")
    assert fill.component_config("transformer")["in_channels"] == 288
    assert fill.component_config("transformer")["out_channels"] == 16
    assert "FLUX.1 Fill" in api.describe_files(fill) and "FLUX.1 Depth/Canny" in api.describe_files(depth)
    # Kontext: the same tensors as FLUX.1 [dev], told by the file name (auto) or the loader's choice
    assert spec(files, "flux1-kontext-tiny.safetensors").class_name == "FluxKontextPipeline"
    assert "by its file name" in api.describe_files(spec(files, "flux1-kontext-tiny.safetensors"))
    assert spec(files, "flux1-kontext-tiny.safetensors", "off").class_name == "FluxPipeline"
    assert spec(files, "flux1-tiny.safetensors", "on").class_name == "FluxKontextPipeline"
    assert spec(files, "flux1-tiny.safetensors").class_name == "FluxPipeline"  # what it was before the choice
    assert_refused(["flux_kontext", "FLUX.1 Fill", "set flux_kontext to auto"], spec, files,
                   "flux1-fill-tiny.safetensors", "on")
    roots = {role: [str(files / "models" / folder)] for role, folder in listing.ROLE_FOLDERS.items()}
    assert_refused(["flux_kontext", "sd3-tiny.safetensors", "SD3", "is a FLUX.1 model"], api.make_file_spec,
                   assemble.FileChoice(checkpoint="sd3-tiny.safetensors", flux_kontext="on"), roots)
    # Sample's inputs: each tool says which input it needs and how to make it
    image, mask = outpainting()
    assert_refused(["mask", "FLUX.1 Fill", "Pad Image for Outpainting"], api.describe_inputs, fill, request(),
                   image)
    assert_refused(["image", "FLUX.1 Fill", "mask"], api.describe_inputs, fill, request())
    assert_refused(["image", "control image", "Canny"], api.describe_inputs, depth, request())
    assert_refused(["mask", "control image", "FLUX.1 Fill"], api.describe_inputs, depth, request(), image, mask)
    assert_refused(["denoise", "control image", "set denoise to 1"], api.describe_inputs, depth,
                   request(denoise=0.5), image)
    assert_refused(["FLUX.1 Fill", "CFG Parallel has nothing to split", "FluxFillPipeline has no true CFG"],
                   api.cfg_parallel, fill)
    assert_refused(["FluxControlPipeline has no true CFG"], api.cfg_parallel, depth)
    assert "split over 2 ranks" in api.context_parallel(fill, 2)[1]  # FLUX.1's plan: the tools' transformer
    # CONDITIONING: FLUX.1's (the same text encoders); a negative one is unused where the pipeline has no true CFG
    cond = [[np.zeros((1, 256, 32), np.float32), {"pooled_output": np.zeros((1, 32), np.float32), "guidance": 30.0}]]
    notes = api.describe_inputs(fill, request(), image, mask, positive=cond, negative=cond)
    assert "guidance 30 from the positive CONDITIONING (FluxGuidance); the guidance widget is not used" in notes
    assert any("negative is not used: FLUX.1 Fill runs one pass per step" in n for n in notes), notes
    notes = api.describe_inputs(depth, request(), image)
    assert notes == ["control image (1) for FLUX.1 Depth/Canny: the output follows its structure; 48x32 stretched "
                     "to 32x32"]
    kontext = spec(files, "flux1-kontext-tiny.safetensors")
    assert any("Kontext resolution nearest its aspect ratio" in n for n in api.describe_inputs(kontext, request(),
                                                                                              picture(64, 64)))
    assert "true_cfg_scale 2: FLUX.1 Kontext runs true CFG" in api.sampling_options(kontext, true_cfg_scale=2.0)[1]
    # the Kontext resolution from the exact aspect (ComfyUI's FluxKontextImageScale): 79x118 is 832x1248, where
    # FluxKontextPipeline's own pick, from the sides rounded down to 16 (64x112), would be 800x1328
    assert (images.kontext_resolution(79, 118), images.kontext_resolution(64, 112)) == ((832, 1248), (800, 1328))
    assert_refused(["true_cfg_scale", "FLUX.1 Fill"], api.sampling_options, fill, true_cfg_scale=2.0)


@functools.cache
def _ref_flux1(files: Path):
    import diffusers

    return diffusers.FluxPipeline.from_pretrained(str(files / "diffusers" / "ref-flux1"), local_files_only=True)


def plain(files: Path, tool: str, cls_name: str, req: SampleRequest, lora: tuple[str, float] | None = None,
          **inputs) -> np.ndarray:
    """diffusers' own pipeline `cls_name`, built by hand from the reference folders: ref-flux1's text encoders
    and VAE, the tool's transformer, the published dev schedule; `lora` (file, strength) loaded with
    load_lora_weights and fused at that strength (what the worker's in-place LoRA equals bit for bit); the prompt
    unless `inputs` has its embeddings."""
    import diffusers

    base = _ref_flux1(files)
    cls = getattr(diffusers, cls_name)
    wanted = inspect.signature(cls.__init__).parameters
    parts = {k: v for k, v in base.components.items() if k in wanted}
    parts["transformer"] = diffusers.FluxTransformer2DModel.from_pretrained(
        str(files / "diffusers" / f"ref-flux1-{tool}"), subfolder="transformer", local_files_only=True)
    parts["scheduler"] = diffusers.FlowMatchEulerDiscreteScheduler.from_pretrained(str(config_dir("flux1")),
                                                                                   subfolder="scheduler")
    pipe = cls(**parts)
    if lora:
        pipe.load_lora_weights(lora[0])
        pipe.fuse_lora(lora_scale=lora[1])
    with torch.inference_mode():
        return pipe(prompt=None if "prompt_embeds" in inputs else req.prompt, height=req.height, width=req.width,
                    num_inference_steps=req.steps,
                    guidance_scale=req.guidance, generator=[torch.Generator("cpu").manual_seed(req.seed)],
                    output_type="np", **inputs).images


REF = picture(96, 64)  # Kontext's reference: resized to ~1 megapixel by the pipeline, so its runs take one step
ONE_STEP, FILL_REQ = request(steps=1), request(width=48, guidance=30.0)
TRUE_CFG = request(steps=1, negative_prompt="blurry")


@pytest.fixture(scope="module")
def one_worker(files) -> dict[str, np.ndarray]:
    """Each tool's pixels on one worker: what diffusers' pipelines are held to, and the layouts after."""
    image, mask = outpainting()
    kontext = spec(files, "flux1-kontext-tiny.safetensors")
    true_cfg, _ = api.sampling_options(kontext, true_cfg_scale=2.0)
    return {"kontext": api.sample(kontext, ONE_STEP, image=REF),
            "kontext_true_cfg": api.sample(true_cfg, TRUE_CFG, image=REF),
            "fill": api.sample(spec(files, "flux1-fill-tiny.safetensors"), FILL_REQ, image=image, mask=mask),
            "depth": api.sample(spec(files, "flux1-depth-tiny.safetensors"), request(), image=picture())}


def conditioning(files: Path) -> list:
    """ref-flux1's own embeddings of FOX (the tools' text encoders) as ComfyUI's CONDITIONING."""
    with torch.no_grad():
        embeds, pooled, _ = _ref_flux1(files).encode_prompt(FOX, None, max_sequence_length=512)
    return [[embeds.numpy(), {"pooled_output": pooled.numpy()}]]


@pytest.mark.workers
def test_the_tools_give_diffusers_own_pixels_with_loras_conditioning_compiled_and_on_two_replicas(files, one_worker,
                                                                                                   tmp_path):
    """Bit for bit against diffusers' own pipelines: text, a FLUX.1 LoRA (load_lora_weights, fused) on Kontext
    and Fill, the pipelines' own embeddings as CONDITIONING; compiled Kontext within 1e-5; Fill on two replicas."""
    import PIL.Image

    # Kontext: Sample's image is the reference (resized by the pipeline to its resolution), the output Sample's size
    pil = PIL.Image.fromarray((REF[0] * 255).round().astype(np.uint8))
    want_kontext = plain(files, "kontext", "FluxKontextPipeline", ONE_STEP, image=pil, max_area=32 * 32)
    assert one_worker["kontext"].shape == (1, 32, 32, 3) and np.array_equal(one_worker["kontext"], want_kontext)
    assert np.array_equal(one_worker["kontext_true_cfg"], plain(
        files, "kontext", "FluxKontextPipeline", TRUE_CFG, image=pil, max_area=32 * 32, true_cfg_scale=2.0,
        negative_prompt=TRUE_CFG.negative_prompt))
    # Fill: outpainting a padded picture, as Pad Image for Outpainting gives it
    image, mask = outpainting()
    want = plain(files, "fill", "FluxFillPipeline", FILL_REQ, image=image, mask_image=mask[..., None])
    assert one_worker["fill"].shape == (1, 32, 48, 3) and np.array_equal(one_worker["fill"], want)
    # Depth/Canny: Sample's image is the control image
    want = plain(files, "depth", "FluxControlPipeline", request(), control_image=picture())
    assert np.array_equal(one_worker["depth"], want)
    # CONDITIONING (CLIP Text Encode with FLUX.1's encoders) in place of the prompt: the text path's pixels
    cond, no_text = conditioning(files), request(prompt="")
    kontext, fill = spec(files, "flux1-kontext-tiny.safetensors"), spec(files, "flux1-fill-tiny.safetensors")
    depth = spec(files, "flux1-depth-tiny.safetensors")
    assert np.array_equal(api.sample(depth, no_text, image=picture(), positive=cond), one_worker["depth"])
    assert np.array_equal(api.sample(fill, dataclasses.replace(FILL_REQ, prompt=""), image=image, mask=mask,
                                     positive=cond), one_worker["fill"])
    # (Kontext from text alone here and for the LoRA below: its reference costs a 1-megapixel VAE encode per run)
    kontext_text = api.sample(kontext, request())
    assert np.array_equal(api.sample(kontext, no_text, positive=cond), kontext_text)
    # a FLUX.1 LoRA (made for FLUX.1 [dev]'s shapes) on Kontext and Fill: diffusers' load_lora_weights, fused
    lora = str(make(files / "diffusers", "ref-flux1", "diffusers", tmp_path, seed=7)[0])
    got = api.sample(api.with_lora(kontext, lora, 0.8)[0], request())
    want = plain(files, "kontext", "FluxKontextPipeline", request(), lora=(lora, 0.8), max_area=32 * 32)
    assert np.array_equal(got, want) and not np.array_equal(got, kontext_text)
    got = api.sample(api.with_lora(fill, lora, 0.8)[0], FILL_REQ, image=image, mask=mask)
    want = plain(files, "fill", "FluxFillPipeline", FILL_REQ, lora=(lora, 0.8), image=image,
                 mask_image=mask[..., None])
    assert np.array_equal(got, want) and not np.array_equal(got, one_worker["fill"])
    # compiled: a Kontext reference adds its tokens at the Kontext resolution nearest its exact aspect, so another
    # picture of that aspect reuses the graph, even one whose sides rounded down to 16 first (FluxKontextPipeline's
    # own pick) would give 800x1328 instead of 832x1248
    compiled, _ = api.with_compile(kontext, "whole denoiser", "eager", "")
    assert np.abs(api.sample(compiled, ONE_STEP, image=REF) - want_kontext).max() <= 1e-5
    before = api.compile_stats()
    api.sample(compiled, ONE_STEP, image=picture(118, 79)[..., ::-1].copy())
    after = api.compile_stats()
    assert after["graphs"] == before["graphs"] and after["unexpected_recompiles"] == 0, (before, after)
    # two data-parallel replicas: the image and mask reach both, and each image is the one one worker draws
    two, _ = api.replicate(fill, 2)
    batch = api.sample(two, dataclasses.replace(FILL_REQ, batch_size=2), image=image, mask=mask)
    assert np.array_equal(batch[:1], one_worker["fill"]) and not np.array_equal(batch[0], batch[1])


@pytest.mark.workers
def test_shard_tp_context_and_cfg_parallel_equal_one_worker(files, one_worker):
    """Shard TP 2: diffusers' FLUX.1 plan shards the blocks' projections and replicates the rest (x_embedder, which
    reads the tools' mask or control channels, included), so the tools shard as FLUX.1 does; a sharded matmul sums
    in another order, hence the FLUX.1 TP tests' tolerance, 1e-4 in float32 (tests/test_parallel.py). Context
    Parallel 2: FLUX.1's plan splits the sequence (Kontext's reference tokens in it), Ulysses sums attention in
    another order: the same tolerance. CFG Parallel on Kontext's true CFG (two unnamed passes, split by their
    order): the same arithmetic, bit for bit."""
    image, mask = outpainting()
    # Kontext: the reference's tokens beside the latents'; Fill and Depth/Canny: the condition in the input channels
    cases = (("flux1-kontext-tiny.safetensors", ONE_STEP, {"image": REF}, "kontext"),
             ("flux1-fill-tiny.safetensors", FILL_REQ, {"image": image, "mask": mask}, "fill"),
             ("flux1-depth-tiny.safetensors", request(), {"image": picture()}, "depth"))
    for model, req, inputs, name in cases:
        sharded, text = api.shard(spec(files, model), 2)
        assert "sharded over 2 chips" in text
        got = api.sample(sharded, req, **inputs)
        assert np.abs(got - one_worker[name]).max() <= 1e-4, name
    for model, req, inputs, name in cases:
        split, text = api.context_parallel(spec(files, model), 2)
        assert "split over 2 ranks" in text
        got = api.sample(split, req, **inputs)
        assert np.abs(got - one_worker[name]).max() <= 1e-4, name
    kontext, _ = api.sampling_options(spec(files, "flux1-kontext-tiny.safetensors"), true_cfg_scale=2.0)
    split, text = api.cfg_parallel(kontext)
    assert "FLUX.1 Kontext runs two passes per step only with true CFG" in text
    assert np.array_equal(api.sample(split, TRUE_CFG, image=REF), one_worker["kontext_true_cfg"])
    assert [w["cfg_exchanges"] for w in api.worker_info()] == [1, 1], "the one step's two passes ran split"


def redux_file(files: Path, name: str) -> str:
    """A Redux fixture (tests/file_fixtures.py: in redux-models/, which the role lists do not read), or a model
    file of the other roles (text_encoders/...)."""
    return str(files / ("redux-models" if name.startswith(("style_models/", "clip_vision/")) else "models") / name)


STYLE, SIGLIP = "style_models/flux1-redux-tiny.safetensors", "clip_vision/sigclip_vision_patch14_384-tiny.safetensors"


def dev(files: Path) -> api.PipelineSpec:
    """FLUX.1 [dev] (what Redux is made for): the Kontext file has its tensors, loaded as FluxPipeline."""
    return spec(files, "flux1-kontext-tiny.safetensors", "off")


@pytest.mark.pipelines
def test_redux_reads_comfyuis_style_model_and_clip_vision_files_and_refuses_what_does_not_fit(files):
    flux, style, siglip = dev(files), redux_file(files, STYLE), redux_file(files, SIGLIP)
    ours, text = api.with_redux(flux, style, siglip, picture(), 0.8, 0.5)
    ref = ours.redux[0]
    assert json.loads(ref.vision_config) == {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
                                             "num_attention_heads": 4, "patch_size": 14, "image_size": 384,
                                             "vision_use_head": True}
    assert json.loads(ref.embedder_config) == {"redux_dim": 16, "txt_in_features": 32}
    assert "FluxPriorReduxPipeline" in text and "prompt_embeds_scale 0.8, pooled_prompt_embeds_scale 0.5" in text
    back = PipelineSpec.from_dict(ours.to_dict())  # the link's format: the images travel beside the spec
    assert back == ours and back.redux[0].image is None and api.checked(back).redux == ours.redux
    assert redux.weight_bytes(ours, 4)["redux"] > 0  # offload 'auto' counts the two models
    # bad input, each refused naming the input and the fix
    roots = {role: [str(files / "models" / folder)] for role, folder in listing.ROLE_FOLDERS.items()}
    sd3 = api.make_file_spec(assemble.FileChoice(checkpoint="sd3-tiny.safetensors"), roots)
    assert_refused(["style_model_name", "SD3", "Load a FLUX.1 model"], api.with_redux, sd3, style, siglip, picture())
    assert_refused(["clip_vision_name", "CLIP ViT", "sigclip_vision_patch14_384"], api.with_redux, flux, style,
                   redux_file(files, "clip_vision/clip_vision_vit-tiny.safetensors"), picture())
    assert_refused(["clip_vision_name", "style model", "goes in style_model_name"], api.with_redux, flux, style, style,
                   picture())
    assert_refused(["style_model_name", "vision model", "goes in clip_vision_name"], api.with_redux, flux, siglip, siglip,
                   picture())
    assert_refused(["style_model_name", "not a FLUX.1 Redux style model", "flux1-redux-dev"], api.with_redux, flux,
                   redux_file(files, "text_encoders/clip_l-tiny.safetensors"), siglip, picture())
    assert_refused(["style_model_name", "64 wide", "32 wide", "made for this FLUX.1"], api.with_redux, flux,
                   redux_file(files, "style_models/flux1-redux-wide-tiny.safetensors"), siglip, picture())
    assert_refused(["prompt_embeds_scale", "between 0 and 10"], api.with_redux, flux, style, siglip, picture(), 11.0)
    assert_refused(["image", "IMAGE of shape"], api.with_redux, flux, style, siglip, np.zeros((2, 3)))
    # the files loader's clip_vision (Wan's CLIP ViT) does not list the SigLIP, which only Redux reads
    listed = listing.list_files({"clip_vision": [str(files / "redux-models" / "clip_vision")]})["clip_vision"]
    assert listed == ["clip_vision_vit-tiny.safetensors"], listed
    assert_refused(["text", "one FluxPriorReduxPipeline call", "Batch Images"], api.with_redux, ours, style, siglip,
                   picture(), text="image only")
    assert_refused(["Context Parallel", "Remove Context Parallel"], redux.check, ours.with_changes(cp_degree=2), ref)


@functools.cache
def _ref_prior(files: Path):
    import diffusers
    from diffusers.pipelines.flux.modeling_flux import ReduxImageEncoder
    from transformers import SiglipImageProcessor, SiglipVisionModel

    folder, base = files / "diffusers" / "ref-flux1-redux", _ref_flux1(files)
    return diffusers.FluxPriorReduxPipeline(
        image_encoder=SiglipVisionModel.from_pretrained(str(folder / "image_encoder")),
        feature_extractor=SiglipImageProcessor.from_pretrained(str(config_dir("flux1-redux") / "feature_extractor")),
        image_embedder=ReduxImageEncoder.from_pretrained(str(folder / "image_embedder")),
        text_encoder=base.text_encoder, tokenizer=base.tokenizer, text_encoder_2=base.text_encoder_2,
        tokenizer_2=base.tokenizer_2)


def plain_redux(files: Path, req: SampleRequest, pictures: list[np.ndarray], scales: list[float],
                pooled: list[float], **text) -> np.ndarray:
    """diffusers' example by hand: FluxPriorReduxPipeline on the references (PIL images), its output to
    FluxPipeline."""
    import PIL.Image

    pil = [PIL.Image.fromarray((p * 255).round().astype(np.uint8)) for p in pictures]
    with torch.inference_mode():
        out = _ref_prior(files)(image=pil, prompt_embeds_scale=scales, pooled_prompt_embeds_scale=pooled, **text)
    return plain(files, "kontext", "FluxPipeline", req, prompt_embeds=out.prompt_embeds,
                 pooled_prompt_embeds=out.pooled_prompt_embeds)


@pytest.mark.workers
def test_redux_gives_the_pixels_of_diffusers_prior_then_flux_pipeline_on_two_replicas_and_compiled(files):
    """On two data-parallel replicas (the group of two the test above leaves running): each replica's image is
    the one diffusers' prior and FluxPipeline draw with its seed."""
    flux, style, siglip = dev(files), redux_file(files, STYLE), redux_file(files, SIGLIP)
    two_refs = np.concatenate([picture(), 1 - picture()])  # a batch of two references, and a chained third
    third = picture(40, 24)[..., ::-1].copy()
    chained, _ = api.with_redux(api.with_redux(flux, style, siglip, two_refs)[0], style, siglip, third, 0.5, 0.7)
    chained, _ = api.replicate(chained, 2)
    batch = api.sample(chained, request(batch_size=2))
    scales = {"pictures": [*two_refs, third[0]], "scales": [1.0, 1.0, 0.5], "pooled": [1.0, 1.0, 0.7]}
    want = [plain_redux(files, request(seed=seed), **scales, prompt=FOX) for seed in (3, 4)]
    assert batch.shape == (2, 32, 32, 3) and np.array_equal(batch, np.concatenate(want))
    # 'image only': zeros for the prompt's tokens, as the prior without text encoders makes them
    alone, _ = api.with_redux(api.replicate(flux, 2)[0], style, siglip, third, 0.9, 1.0, text="image only")
    zeros = {"prompt_embeds": torch.zeros(1, 512, 32), "pooled_prompt_embeds": torch.zeros(1, 32)}
    assert np.array_equal(api.sample(alone, request()),
                          plain_redux(files, request(), [third[0]], [0.9], [1.0], **zeros))
    # compiled: the prompt's embeddings come from the prompt cache now (kept as encoded); another reference,
    # scale or prompt keeps the token count (512 + 729): the same graph
    compiled, _ = api.with_compile(chained, "whole denoiser", "eager", "")
    assert np.abs(api.sample(compiled, request()) - want[0]).max() <= 1e-5
    before = api.compile_stats()
    other, _ = api.with_redux(api.replicate(flux, 2)[0], style, siglip, third, 0.3, 0.2)
    api.sample(api.with_compile(other, "whole denoiser", "eager", "")[0], request(prompt="a cat"))
    after = api.compile_stats()
    assert after["graphs"] == before["graphs"] and after["unexpected_recompiles"] == 0, (before, after)
