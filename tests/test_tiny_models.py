"""backend.tiny_models: every family builds offline, reloads through DiffusionPipeline and samples reproducibly."""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from backend.families import PIPELINES
from backend.protocol.spec import listed_components, read_index
from backend.tiny_models import FAMILIES, MORE, build_all, build_tiny_pipeline

pytestmark = pytest.mark.pipelines

PIPELINE_CLASSES = {
    "flux": "FluxPipeline",
    "flux2": "Flux2KleinPipeline",
    "sd3": "StableDiffusion3Pipeline",
    "sdxl": "StableDiffusionXLPipeline",
    "qwenimage": "QwenImagePipeline",
    "zimage": "ZImagePipeline",
    "wan": "WanPipeline",
    "wan-i2v": "WanImageToVideoPipeline",  # its frames against plain diffusers: tests/test_video.py
    "wan22": "WanPipeline",  # Wan 2.2 A14B's two experts: tests/test_video.py
    "ltx2": "LTX2Pipeline",  # its frames and sound against plain diffusers: tests/test_video.py
    "ltx25": "LTX2Pipeline",  # LTX-2.5's Gemma 4: against plain diffusers in tests/test_ltx2_upscale.py
    "qwenimage21": "QwenImage21Pipeline",  # against the pack: tests/test_image_families.py
    "krea2": "Krea2Pipeline",
    "ideogram4": "Ideogram4Pipeline",
    "flux3": "Flux3DistilledModularPipeline",  # modular pipelines: against plain diffusers in tests/test_flux3.py
    "flux3-base": "Flux3ModularPipeline",
    "minimax-h3": "MiniMaxH3ModularPipeline",  # t2va against plain diffusers: tests/test_minimax_h3.py
}
# a non-square size each family makes (LTX-2: multiples of 32, at least 2x2 latent pixels; Qwen-Image 2.1's 16x VAE;
# MiniMax H3: of 32)
NON_SQUARE = {"ltx2": (64, 96), "ltx25": (64, 96), "qwenimage21": (32, 96), "minimax-h3": (32, 64)}
MAX_FOLDER_BYTES = 8 * 2**20


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # Tiny models on a 2-core machine: more threads only add synchronisation overhead.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    return build_all(tmp_path_factory.mktemp("tiny"))


def _load(folder: Path):
    """The folder through DiffusionPipeline, or a modular one through its blocks (without the prompt upsampler,
    which the tiny folders do not hold) and its modular_model_index.json."""
    from diffusers import DiffusionPipeline

    if not (folder / "model_index.json").is_file():
        import diffusers.modular_pipelines as modular

        index = read_index(folder)
        blocks = getattr(modular, index["_blocks_class_name"])()
        blocks.sub_blocks.pop("prompt_upsampler", None)
        if "t2va" in (getattr(blocks, "_workflow_map", None) or {}):  # MiniMax H3: text to video with sound
            blocks = blocks.get_workflow("t2va")
        pipe = blocks.init_pipeline(str(folder))
        pipe.load_components(names=[n for n in listed_components(index) if n in pipe.component_names],
                             dtype=torch.float32, pretrained_model_name_or_path=str(folder))
        return pipe
    pipe = DiffusionPipeline.from_pretrained(
        str(folder), local_files_only=True, use_safetensors=True, dtype=torch.float32
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _call(pipe, seeds: list[int], height: int = 64, width: int = 64, steps: int = 2) -> np.ndarray:
    """Images [B, H, W, C]; a video pipeline's one-frame videos as images. Guidance 2 and the arguments the pack
    always passes (Pipeline.call_args: LTX-2's guidance it switches off, whose published defaults need 29 blocks;
    Ideogram 4's 48-entry default guidance schedule fits 48 steps only); a modular pipeline's one call a seed."""
    if "state" in inspect.signature(pipe.__call__).parameters:  # modular; a video's first frame (124: its least)
        video = "num_frames" in pipe.blocks.input_names
        states = [pipe(prompt="a photo of a cat", height=height, width=width, num_inference_steps=steps,
                       generator=torch.Generator().manual_seed(s), output_type="np", **({"num_frames": 124} if video
                                                                                         else {})) for s in seeds]
        return np.concatenate([np.asarray(st.get("videos"))[:, 0] if video else np.asarray(st.get("images"))
                               for st in states])
    family = PIPELINES[type(pipe).__name__]
    kwargs = {family.guidance_arg: 2.0, **dict(family.call_args)}
    params = inspect.signature(pipe.__call__).parameters
    if "max_sequence_length" in params:
        kwargs["max_sequence_length"] = 32
    video = "num_frames" in params
    kwargs.update({"num_frames": 1, "num_videos_per_prompt": len(seeds)} if video else
                  {"num_images_per_prompt": len(seeds)})
    out = pipe(
        prompt="a photo of a cat",
        height=height,
        width=width,
        num_inference_steps=steps,
        generator=[torch.Generator().manual_seed(s) for s in seeds],
        output_type="np",
        **kwargs,
    )
    return np.asarray(out.frames)[:, 0] if video else np.asarray(out.images)


def _digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*.safetensors"))
    }


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_build_all_names_and_skips_existing(built, tmp_path_factory):
    assert set(built) == set(FAMILIES + MORE)
    for family, folder in built.items():
        assert folder.name == f"tiny-{family}"
        assert read_index(folder)["_class_name"] == PIPELINE_CLASSES[family]
    marker = built["flux"] / "transformer" / "diffusion_pytorch_model.safetensors"
    mtime = marker.stat().st_mtime_ns
    assert build_all(built["flux"].parent, families=["flux"]) == {"flux": built["flux"]}
    assert marker.stat().st_mtime_ns == mtime  # not rebuilt


@pytest.mark.parametrize("family", FAMILIES)
def test_family_samples_reproducibly(built, family):
    folder = built[family]
    assert _folder_bytes(folder) < MAX_FOLDER_BYTES
    pipe = _load(folder)
    assert type(pipe).__name__ == PIPELINE_CLASSES[family]

    channels = 4 if PIPELINES[type(pipe).__name__].alpha else 3  # Qwen-Image 2.1's VAE decodes RGBA
    first = _call(pipe, [0])
    assert first.shape == (1, 64, 64, channels)
    assert np.isfinite(first).all()
    assert first.min() >= 0.0 and first.max() <= 1.0
    np.testing.assert_array_equal(first, _call(pipe, [0]))
    assert not np.array_equal(first, _call(pipe, [1]))

    # One generator per image, non-square size that is only a multiple of 16 (or what the family needs: LTX-2's
    # 32-pixel latents, Qwen-Image 2.1's 16x VAE)
    height, width = NON_SQUARE.get(family, (32, 48))
    batch = _call(pipe, [3, 4], height=height, width=width)
    assert batch.shape == (2, height, width, channels)
    assert np.isfinite(batch).all()
    assert not np.array_equal(batch[0], batch[1])


@pytest.mark.parametrize("family", FAMILIES + MORE)
def test_build_is_deterministic(built, family, tmp_path):
    again = build_tiny_pipeline(family, tmp_path / "again", seed=0)
    assert _digests(again) == _digests(built[family])
    other = build_tiny_pipeline(family, tmp_path / "other", seed=1)
    assert _digests(other) != _digests(built[family])


def test_attention_heads_split_for_tensor_parallel(built):
    for family in ("flux", "flux2", "qwenimage", "sd3"):
        config = json.loads((built[family] / "transformer" / "config.json").read_text())
        assert config["num_attention_heads"] % 2 == 0, family


def test_tokenizers_match_what_the_pipelines_assume(built):
    from transformers import AutoTokenizer

    clip = AutoTokenizer.from_pretrained(str(built["flux"] / "tokenizer"))
    assert clip.model_max_length == 77
    t5 = AutoTokenizer.from_pretrained(str(built["flux"] / "tokenizer_2"))
    assert t5("a photo of a cat").input_ids[-1] == t5.eos_token_id
    qwen = AutoTokenizer.from_pretrained(str(built["qwenimage"] / "tokenizer"))
    # QwenImagePipeline drops the first 34 tokens (its system prompt), as the real Qwen tokenizer splits it.
    prefix = (
        "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
        "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n"
    )
    assert len(qwen(prefix).input_ids) == 34
    klein = AutoTokenizer.from_pretrained(str(built["flux2"] / "tokenizer"))
    text = klein.apply_chat_template(
        [{"role": "user", "content": "a cat"}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    assert text.startswith("<|im_start|>user\na cat<|im_end|>\n<|im_start|>assistant\n")
    zimage = AutoTokenizer.from_pretrained(str(built["zimage"] / "tokenizer"))
    # ZImagePipeline asks for thinking (no think block): exactly ComfyUI's Z-Image template
    text = zimage.apply_chat_template([{"role": "user", "content": "a cat"}], tokenize=False,
                                      add_generation_prompt=True, enable_thinking=True)
    assert text == "<|im_start|>user\na cat<|im_end|>\n<|im_start|>assistant\n"


def test_small_models_run_at_benchmark_size(tmp_path):
    built_small = build_all(tmp_path, size="small")
    assert set(built_small) == {"flux", "zimage"}
    for family, folder in built_small.items():
        assert folder.name == f"small-{family}"
        assert _folder_bytes(folder) < MAX_FOLDER_BYTES
        image = _call(_load(folder), [0], height=256, width=256, steps=4)
        assert image.shape == (1, 256, 256, 3) and np.isfinite(image).all()


def test_small_size_is_flux_and_zimage_only(tmp_path):
    for family in FAMILIES:
        if family not in ("flux", "zimage"):
            with pytest.raises(ValueError):
                build_tiny_pipeline(family, tmp_path / family, size="small")
    with pytest.raises(ValueError):
        build_tiny_pipeline("nope", tmp_path / "nope")
    with pytest.raises(ValueError):
        build_tiny_pipeline("flux", tmp_path / "huge", size="huge")


def test_rebuild_replaces_only_pipeline_folders(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("not a pipeline")
    with pytest.raises(FileExistsError):
        build_tiny_pipeline("sdxl", foreign)
    assert (foreign / "keep.txt").read_text() == "not a pipeline"
    folder = build_tiny_pipeline("sdxl", tmp_path / "sdxl")
    (folder / "stale.txt").write_text("from an older build")
    build_tiny_pipeline("sdxl", folder)
    assert not (folder / "stale.txt").exists() and (folder / "model_index.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign", "sdxl"]  # no staging leftovers
