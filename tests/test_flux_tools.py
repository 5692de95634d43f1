"""The FLUX.1 tools from artists' split files (issue 26): Kontext (instruction editing of Sample's image), Fill
(inpainting and outpainting), Depth/Canny (a control image concatenated to the latents), Redux (reference images
through Apply Redux, from ComfyUI's style model and CLIP vision files). Fill and Depth/Canny are told by their
input channels, Kontext by its file name or the loader's flux_kontext choice; each runs diffusers' own pipeline
and gives the pixels of that pipeline run by a plain script on the same inputs and seed.
"""

from __future__ import annotations

import functools
import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from backend.controller import api, redux
from backend.controller.files import assemble, listing
from backend.protocol.errors import InputError
from backend.protocol.spec import CONFIGS_DIR, PipelineSpec, SampleRequest

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


@pytest.mark.unit
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
    assert_refused(["FLUX.1 Fill", "CFG Parallel has nothing to split"], api.cfg_parallel, fill)
    notes = api.describe_inputs(depth, request(), image)
    assert notes == ["control image (1) for FLUX.1 Depth/Canny: the output follows its structure; 48x32 stretched "
                     "to 32x32"]
    kontext = spec(files, "flux1-kontext-tiny.safetensors")
    assert any("Kontext resolution nearest its aspect ratio" in n for n in api.describe_inputs(kontext, request(),
                                                                                              picture(64, 64)))
    assert "true_cfg_scale 2" in api.sampling_options(kontext, true_cfg_scale=2.0)[1]
    assert_refused(["true_cfg_scale", "FLUX.1 Fill"], api.sampling_options, fill, true_cfg_scale=2.0)


@functools.cache
def _ref_flux1(files: Path):
    import diffusers

    return diffusers.FluxPipeline.from_pretrained(str(files / "diffusers" / "ref-flux1"), local_files_only=True)


def plain(files: Path, tool: str, cls_name: str, req: SampleRequest, **inputs) -> np.ndarray:
    """diffusers' own pipeline `cls_name`, built by hand from the reference folders: ref-flux1's text encoders
    and VAE, the tool's transformer, the published dev schedule; the prompt unless `inputs` has its
    embeddings."""
    import diffusers

    base = _ref_flux1(files)
    cls = getattr(diffusers, cls_name)
    wanted = inspect.signature(cls.__init__).parameters
    parts = {k: v for k, v in base.components.items() if k in wanted}
    parts["transformer"] = diffusers.FluxTransformer2DModel.from_pretrained(
        str(files / "diffusers" / f"ref-flux1-{tool}"), subfolder="transformer", local_files_only=True)
    parts["scheduler"] = diffusers.FlowMatchEulerDiscreteScheduler.from_pretrained(str(CONFIGS_DIR / "flux1"),
                                                                                   subfolder="scheduler")
    pipe = cls(**parts)
    with torch.inference_mode():
        return pipe(prompt=None if "prompt_embeds" in inputs else req.prompt, height=req.height, width=req.width, num_inference_steps=req.steps,
                    guidance_scale=req.guidance, generator=[torch.Generator("cpu").manual_seed(req.seed)],
                    output_type="np", **inputs).images


@pytest.mark.workers
def test_kontext_fill_and_depth_give_diffusers_own_pixels_compiled_and_on_two_replicas(files):
    import PIL.Image

    req = request()
    # Kontext: Sample's image is the reference (resized by the pipeline to its resolution), the output Sample's size
    ref, one_step = picture(96, 64), request(steps=1)  # the reference has ~1 megapixel: one step is enough
    ours = api.sample(spec(files, "flux1-kontext-tiny.safetensors"), one_step, image=ref)
    pil = PIL.Image.fromarray((ref[0] * 255).round().astype(np.uint8))
    want_kontext = plain(files, "kontext", "FluxKontextPipeline", one_step, image=pil, max_area=32 * 32)
    assert ours.shape == (1, 32, 32, 3) and np.array_equal(ours, want_kontext)
    # Fill: outpainting a padded picture, as Pad Image for Outpainting gives it
    image, mask = outpainting()
    fill_req = request(width=48, guidance=30.0)
    filled = api.sample(spec(files, "flux1-fill-tiny.safetensors"), fill_req, image=image, mask=mask)
    want = plain(files, "fill", "FluxFillPipeline", fill_req, image=image, mask_image=mask[..., None])
    assert filled.shape == (1, 32, 48, 3) and np.array_equal(filled, want)
    # Depth/Canny: Sample's image is the control image
    control = picture()
    ours = api.sample(spec(files, "flux1-depth-tiny.safetensors"), req, image=control)
    assert np.array_equal(ours, plain(files, "depth", "FluxControlPipeline", req, control_image=control))
    # compiled: a Kontext reference adds its tokens at the Kontext resolution nearest its aspect (its sides rounded
    # down to 16 first), so another picture of that aspect reuses the graph
    kontext = spec(files, "flux1-kontext-tiny.safetensors")
    compiled, _ = api.with_compile(kontext, "whole denoiser", "eager", "")
    first = api.sample(compiled, one_step, image=ref)
    assert np.abs(first - want_kontext).max() <= 1e-5
    before = api.compile_stats()
    api.sample(compiled, one_step, image=picture(144, 96)[..., ::-1].copy())
    after = api.compile_stats()
    assert after["graphs"] == before["graphs"] and after["unexpected_recompiles"] == 0, (before, after)
    # two data-parallel replicas: the image and mask reach both, and each image is the one one worker draws
    two, _ = api.replicate(spec(files, "flux1-fill-tiny.safetensors"), 2)
    batch = api.sample(two, request(width=48, guidance=30.0, batch_size=2), image=image, mask=mask)
    assert np.array_equal(batch[:1], filled) and not np.array_equal(batch[0], batch[1])


def redux_file(files: Path, name: str) -> str:
    """A Redux fixture (tests/file_fixtures.py: in redux-models/, which the role lists do not read), or a model
    file of the other roles (text_encoders/...)."""
    return str(files / ("redux-models" if name.startswith(("style_models/", "clip_vision/")) else "models") / name)


STYLE, SIGLIP = "style_models/flux1-redux-tiny.safetensors", "clip_vision/sigclip_vision_patch14_384-tiny.safetensors"


def dev(files: Path) -> api.PipelineSpec:
    """FLUX.1 [dev] (what Redux is made for): the Kontext file has its tensors, loaded as FluxPipeline."""
    return spec(files, "flux1-kontext-tiny.safetensors", "off")


@pytest.mark.unit
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
        feature_extractor=SiglipImageProcessor.from_pretrained(str(CONFIGS_DIR / "flux1-redux" / "feature_extractor")),
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
