"""LTX-2.3 from ComfyUI's files (Load TPU Pipeline (ComfyUI files)): its all-in-one checkpoint as the templates
name it (ltx-2.3-22b-dev-fp8.safetensors: the DiT with its text connectors, the video VAE, the audio VAE and the
vocoder, in Lightricks' names, fp8) and ComfyUI's Gemma 3 file (its tokenizer inside) make the pipeline the same
tiny model makes as a diffusers folder: frames and sound equal, text, image, and image + audio to video. The files are
tests/file_fixtures.py's (`_ltx2`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import file_fixtures
import numpy as np
import pytest

from backend.controller import api
from backend.controller.files import assemble, headers, listing
from backend.protocol.errors import ModelError
from backend.protocol.spec import SampleRequest, read_json

NAMES = file_fixtures.FILES["ltx2"]
# the cases of the per-family file tests (test_files.py's check that every family whose files load has some)
CASES = {"ltx2-checkpoint": dict(checkpoint=NAMES["checkpoint"], text_encoders=(NAMES["gemma3"],))}
FOX = "a red fox in the snow"
# tiny-ltx2's smallest video: 64x64 (2x2 latent pixels), 9 frames, CFG 3 (batched), 25 fps
LTX = dict(prompt=FOX, negative_prompt="blurry", width=64, height=64, frames=9, steps=2, guidance=3.0, seed=11,
           frame_rate=25.0, batch_size=2)
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def files(comfyui_files):
    return comfyui_files("ltx2")


def _roots(models: Path) -> dict[str, list[str]]:
    return {role: [str(models / folder)] for role, folder in listing.ROLE_FOLDERS.items()}


def _spec(files: Path, **choice) -> api.PipelineSpec:
    return api.make_file_spec(assemble.FileChoice(**choice), _roots(files / "models"))


@pytest.mark.pipelines
def test_the_checkpoint_and_gemma_make_ltx2_with_the_sizes_of_their_tensors(files, tmp_path):
    """Each part read as its layout says (diffusers' converters for the DiT and both VAEs, the family's renaming
    for the connectors and the vocoder, Gemma in transformers' names with its tokenizer from the file), every size
    the reference folder's; the file holds the keys diffusers tells LTX-2 checkpoints by; a renamed copy is
    recognised by its header."""
    from diffusers.loaders.single_file_utils import CHECKPOINT_KEY_NAMES

    spec = _spec(files, **CASES["ltx2-checkpoint"])
    assert spec.class_name == "LTX2Pipeline" and spec.start_image and spec.source.configs == "ltx-2.3"
    layouts = {c.name: (c.layout, c.prefix, Path(c.path).name) for c in spec.source.components}
    checkpoint = NAMES["checkpoint"]
    assert layouts == {
        "transformer": ("ltx2", "model.diffusion_model.", checkpoint), "vae": ("ltx2-vae", "vae.", checkpoint),
        "connectors": ("ltx2-connectors", "model.diffusion_model.|text_embedding_projection.", checkpoint),
        "audio_vae": ("ltx2-audio-vae", "audio_vae.", checkpoint), "vocoder": ("ltx2-vocoder", "vocoder.", checkpoint),
        "text_encoder": ("hf", "", NAMES["gemma3"]), "tokenizer": ("gemma-spiece", "", NAMES["gemma3"])}
    reference = files / "diffusers" / "ref-ltx2"
    for name in ("transformer", "connectors", "vae", "audio_vae", "vocoder", "text_encoder"):
        mine, theirs = spec.component_config(name), read_json(reference / name / "config.json")
        keys = {k for k in theirs if not k.startswith("_")} - {"downsample_type", "rope_parameters", "architectures",
                                                                "layer_types", "dtype", "transformers_version"}
        differ = {k: (mine.get(k), theirs[k]) for k in keys if mine.get(k) != theirs[k]}
        assert not differ, (name, differ)
    # the 4th encoder level has no downsampler (its type is never read); Gemma's full-attention rotary and layer
    # types (from its window pattern) are the published ones: the tiny Gemma has no full-attention layer
    assert spec.component_config("vae")["downsample_type"][:3] == read_json(reference / "vae" / "config.json")[
        "downsample_type"][:3]
    header = headers.read_header(files / "models" / "checkpoints" / checkpoint)
    assert set(CHECKPOINT_KEY_NAMES["ltx2"]) <= set(header.shapes), "the keys diffusers tells an LTX-2 checkpoint by"
    models = tmp_path / "models"
    for folder in listing.ROLE_FOLDERS.values():
        (models / folder).mkdir(parents=True)
    shutil.copy(files / "models" / "checkpoints" / checkpoint, models / "checkpoints" / "my-ltx.safetensors")
    shutil.copy(files / "models" / "text_encoders" / NAMES["gemma3"], models / "text_encoders" / "words.safetensors")
    assert listing.list_files(_roots(models))["checkpoint"] == ["my-ltx.safetensors"]
    renamed = api.make_file_spec(assemble.FileChoice(checkpoint="my-ltx.safetensors",
                                                     text_encoders=("words.safetensors",)), _roots(models))
    assert {c.name: c.layout for c in renamed.source.components} == {k: v[0] for k, v in layouts.items()}


@pytest.mark.pipelines
def test_a_checkpoint_without_its_audio_vae_and_a_wrong_text_encoder_are_refused_naming_the_fix(files, tmp_path):
    """Each refused before any worker starts, naming the input, the file and the fix."""
    import torch
    from safetensors.torch import save_file

    with pytest.raises(ModelError) as e:
        _spec(files, checkpoint=NAMES["no_audio_vae"], text_encoders=(NAMES["gemma3"],))
    assert str(e.value) == (
        f"checkpoint: LTX-2 also needs its audio_vae, which none of the chosen files holds ('{NAMES['no_audio_vae']}' "
        "is its diffusion model alone). Choose LTX-2.3's all-in-one checkpoint (ltx-2.3-22b-dev-fp8.safetensors, in "
        "models/checkpoints) in checkpoint, which holds them.")
    with pytest.raises(ModelError) as e:
        _spec(files, checkpoint=NAMES["checkpoint"])
    assert str(e.value).startswith("text_encoder: LTX-2 needs Gemma 3 12B (gemma_3_12B_it*.safetensors); Gemma 3 12B "
                                   "(gemma_3_12B_it*.safetensors) is missing (chosen: none).")
    folder = files / "models" / "text_encoders"
    qwen = {f"model.layers.0.self_attn.{p}_proj.weight": torch.zeros(8, 8) for p in "qkv"}
    qwen.update({"model.layers.0.self_attn.q_norm.weight": torch.zeros(4), "model.embed_tokens.weight": torch.zeros(9, 8)})
    save_file(qwen, str(tmp_path / "qwen_3_4b.safetensors"))
    models = tmp_path / "models"
    shutil.copytree(files / "models", models)
    shutil.copy(tmp_path / "qwen_3_4b.safetensors", models / "text_encoders")
    with pytest.raises(ModelError) as e:
        api.make_file_spec(assemble.FileChoice(checkpoint=NAMES["checkpoint"], text_encoders=("qwen_3_4b.safetensors",)),
                           _roots(models))
    assert str(e.value) == ("text_encoder_1: 'qwen_3_4b.safetensors' is a Qwen3 text encoder, which LTX-2 does not "
                            "use; it needs Gemma 3 12B (gemma_3_12B_it*.safetensors) or Gemma 4 "
                            "(gemma4-12b-with-proj-ltx-2.5-*.safetensors).")
    # an audio VAE file beside LTX-2.3's checkpoint, which holds its own
    shutil.copy(tmp_path / "qwen_3_4b.safetensors", models / "vae" / "audio.safetensors")
    with pytest.raises(ModelError) as e:
        api.make_file_spec(assemble.FileChoice(checkpoint=NAMES["checkpoint"], text_encoders=(NAMES["gemma3"],),
                                               audio_vae="audio.safetensors"), _roots(models))
    assert str(e.value) == (f"audio_vae: 'audio.safetensors' was chosen, but LTX-2 ('{NAMES['checkpoint']}') reads its "
                            f"audio VAE from '{NAMES['checkpoint']}'. Set audio_vae to '(none)'.")
    # LTX-2.5's Gemma 4 (its text projection beside it) with LTX-2.3's DiT: Gemma 3 is asked for
    gemma = headers.read_header(folder / NAMES["gemma3"])
    gemma4 = {k: torch.zeros(v) for k, v in gemma.shapes.items() if k.startswith("model.")}
    gemma4["text_embedding_projection.video_aggregate_embed.weight"] = torch.zeros(16, 96)
    save_file(gemma4, str(models / "text_encoders" / "gemma4-12b-with-proj-ltx-2.5-comfy-int8-convrot.safetensors"))
    with pytest.raises(ModelError) as e:
        api.make_file_spec(assemble.FileChoice(checkpoint=NAMES["checkpoint"], text_encoders=(
            "gemma4-12b-with-proj-ltx-2.5-comfy-int8-convrot.safetensors",)), _roots(models))
    assert str(e.value) == (
        "text_encoder: LTX-2 needs Gemma 3 12B (gemma_3_12B_it*.safetensors); Gemma 3 12B (gemma_3_12B_it*.safetensors) "
        "is missing (chosen: Gemma 4 (gemma4-12b-with-proj-ltx-2.5-*.safetensors) "
        "(gemma4-12b-with-proj-ltx-2.5-comfy-int8-convrot.safetensors)). Put the file in ComfyUI's models/text_encoders "
        "(or models/clip) folder and choose it in text_encoder_1, _2 or _3.")


LTX25 = file_fixtures.FILES["ltx25"]
LTX25_TEXT = ("text_encoder: LTX-2 needs Gemma 4 (gemma4-12b-with-proj-ltx-2.5-*.safetensors); Gemma 4 "
              "(gemma4-12b-with-proj-ltx-2.5-*.safetensors) is missing (chosen: none). Put the file in ComfyUI's "
              "models/text_encoders (or models/clip) folder and choose it in text_encoder_1, _2 or _3.")
LTX25_PARTS = (
    "diffusion_model: LTX-2 also needs its audio_vae, vocoder, which none of the chosen files holds "
    "('ltx-2.5-22b-distilled-transformer-comfy-int8-convrot.safetensors' is its diffusion model alone). Choose "
    "gemma4-12b-with-proj-ltx-2.5-*.safetensors (Gemma 4 with the connectors' text projection, models/text_encoders) "
    "in text_encoder_1 and ltx-2.5-audio-vae-*.safetensors (the audio VAE with its vocoder, models/vae) in audio_vae.")
LTX25_VAE = ("vae: LTX-2 needs a VAE (its video VAE: ltx-2.5-video-vae-*.safetensors, in models/vae); "
             "'ltx-2.5-22b-distilled-transformer-comfy-int8-convrot.safetensors' holds none. Put it in ComfyUI's "
             "models/vae folder and choose it in vae.")


@pytest.mark.pipelines
def test_ltx25s_split_files_short_of_one_are_refused_naming_what_is_missing(files, comfyui_files):
    """LTX-2.5's files as its templates name them (tiny-ltx25's, ComfyUI's layouts, int8 by comfy-kitchen): its
    DiT is told from LTX-2.3's by its tensors (no feed-forward biases: configs ltx-2.5); a set short of a file is
    refused before any worker starts, naming the file missing and the input it goes in (Gemma 4; the audio VAE
    with its vocoder; the video VAE); the files are what the templates' loaders read (the DiT holds its
    connectors, Gemma 4 its text projection and its tokenizer, the audio VAE file its vocoder)."""
    root = comfyui_files("ltx25", folder="comfyui-ltx25") / "models"
    roots = _roots(root)
    dit = headers.read_header(root / "diffusion_models" / LTX25["dit"])
    assert "model.diffusion_model.audio_embeddings_connector.transformer_1d_blocks.0.attn1.to_q.weight" in dit.logical
    assert any(k.endswith(".comfy_quant") for k in dit.shapes), "quantized by comfy-kitchen"
    gemma = headers.read_header(root / "text_encoders" / LTX25["gemma4"]).shapes
    assert "text_embedding_projection.video_aggregate_embed.weight" in gemma and "model.layers.0.layer_scalar" in gemma
    assert "tokenizer_json" in gemma
    audio = headers.read_header(root / "vae" / LTX25["audio_vae"]).shapes
    assert "vocoder.resblocks.0.convs1.0.weight" in audio and "audio_vae.decoder.conv_in.conv.weight" in audio
    # the vae lists (vae, audio_vae) offer both VAE files
    assert {LTX25["vae"], LTX25["audio_vae"]} <= set(listing.list_files(roots)["vae"])
    gemma4 = (LTX25["gemma4"],)
    for choice, message in ((dict(), LTX25_TEXT), (dict(vae=LTX25["vae"]), LTX25_TEXT),
                            (dict(vae=LTX25["vae"], text_encoders=gemma4), LTX25_PARTS),
                            (dict(vae=LTX25["vae"], audio_vae=LTX25["vae"], text_encoders=gemma4), LTX25_PARTS),
                            (dict(audio_vae=LTX25["audio_vae"], text_encoders=gemma4), LTX25_VAE)):
        with pytest.raises(ModelError) as e:
            api.make_file_spec(assemble.FileChoice(diffusion_model=LTX25["dit"], **choice), roots)
        assert str(e.value) == message, choice


def _gemma4_part(tmp_path: Path, path: Path, quant: str) -> tuple[object, object]:
    """LTX-2.5's Gemma 4 file read as the worker reads a text encoder part (ComfyUI's names renamed: layout
    gemma4-comfy), its config the pack's published Gemma 4 12B with the sizes of the file's tensors; and its
    tokenizer made from the file's `tokenizer_json` tensor."""
    import json

    import torch
    from transformers import AutoTokenizer, Gemma4UnifiedForConditionalGeneration

    from backend.families import config_dir, text_encoders
    from backend.families.ltx2.convert import gemma4_tokenizer
    from backend.protocol.spec import FileComponent
    from backend.worker import loading

    shapes = headers.read_header(path)
    assert text_encoders.recognise(shapes.logical) == "gemma4"
    published = read_json(config_dir("ltx-2.5") / "text_encoder" / "config.json")
    sizes = text_encoders.sizes("gemma4", shapes.logical, published)
    assert text_encoders.layout("gemma4", shapes.logical, sizes, published) == "gemma4-comfy"
    folder = tmp_path / quant / "text_encoder"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({**published, **sizes}))
    part = FileComponent("text_encoder", str(path), "gemma4-comfy", "", quant, path.stat().st_size)
    model = loading._load_file_component(folder.parent, "text_encoder", Gemma4UnifiedForConditionalGeneration,
                                         part, torch.float32, {})
    gemma4_tokenizer(path, config_dir("ltx-2.5") / "tokenizer", tmp_path / quant / "tokenizer")
    return model.eval(), AutoTokenizer.from_pretrained(str(tmp_path / quant / "tokenizer"))


@pytest.mark.pipelines
def test_ltx25s_gemma4_file_reads_as_tiny_ltx25s_text_encoder(comfyui_files, tiny_models, tmp_path):
    """LTX-2.5's Gemma 4 file (ComfyUI's names, int8 by comfy-kitchen, the text projection and the tokenizer
    beside it) loads as Gemma4UnifiedForConditionalGeneration with the sizes of its tensors (its global layers'
    head size and K/V heads apart) and its lm_head tied to the embedding: every hidden state within 1e-4 of
    tiny-ltx25's own text encoder given the same (comfy-kitchen dequantized) weights, the int8 file's within 1e-4
    of the dequantized file's, and the file's tokenizer gives tiny-ltx25's token ids."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, Gemma4UnifiedForConditionalGeneration

    from backend.families import text_encoders

    models = comfyui_files("ltx25", folder="comfyui-ltx25") / "models" / "text_encoders"
    tiny = tiny_models / "tiny-ltx25"
    reference = Gemma4UnifiedForConditionalGeneration.from_pretrained(str(tiny / "text_encoder")).eval()

    deq = text_encoders.gemma4_keys(load_file(str(models / LTX25["gemma4_dequantized"])),
                                    "Gemma4UnifiedForConditionalGeneration")
    reference.load_state_dict(deq, strict=False)
    assert set(deq) == set(reference.state_dict()) - {"lm_head.weight"}
    ids = AutoTokenizer.from_pretrained(str(tiny / "tokenizer"))(FOX, return_tensors="pt").input_ids
    outputs = {}
    for name, quant in (("gemma4_dequantized", ""), ("gemma4", "comfy-quant")):
        model, tokenizer = _gemma4_part(tmp_path, models / LTX25[name], quant)
        assert torch.equal(tokenizer(FOX, return_tensors="pt").input_ids, ids)
        assert model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()
        with torch.no_grad():
            outputs[name] = torch.stack(model(input_ids=ids, output_hidden_states=True).hidden_states)
    with torch.no_grad():
        expected = torch.stack(reference(input_ids=ids, output_hidden_states=True).hidden_states)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(outputs["gemma4_dequantized"], expected, atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(outputs["gemma4"], outputs["gemma4_dequantized"], atol=TOLERANCE, rtol=0)


def _videos(spec: api.PipelineSpec, starts: np.ndarray | None, audio: dict | None = None) -> dict:
    return api.run_sample_outputs(api.prepare_sample(spec, SampleRequest(**LTX), starts, audio=audio), lambda m: None)


def _sound() -> dict:
    """ComfyUI's AUDIO as Load Audio gives it: a 220 Hz / 330 Hz stereo sine per video, 0.36 s (9 frames at 25 fps)
    at the audio VAE's 16 kHz."""
    import torch

    t = np.arange(round(0.36 * 16000)) / 16000
    wave = np.stack([np.stack([np.sin(2 * np.pi * (220 + 110 * b + 55 * c) * t) for c in range(2)]) for b in range(2)])
    return {"waveform": torch.from_numpy(wave.astype(np.float32) * 0.5), "sample_rate": 16000}


@pytest.mark.workers
@pytest.mark.parametrize("mode", ["text to video", "image to video", "image + audio to video"])
def test_frames_and_sound_from_the_files_equal_the_diffusers_folder(files, mode):
    """Two videos (seeds 11, 12; start images 0 and 1 for image to video; with sounds 0 and 1 too, kept as the
    videos' sound, for image + audio to video: LTX2ConditionPipeline) from the files and from the same tiny
    model as a diffusers folder (the reference: fp8-rounded weights as the checkpoint stores them, the tokenizer
    the pack makes of Gemma's file) through the workers, in float32 (dtype auto would keep the DiT in fp8 storage,
    rounding its biases too): the frames and the waveforms agree."""
    starts = (np.random.default_rng(5).integers(0, 256, (2, 64, 64, 3)) / 255).astype(np.float32) \
        if mode != "text to video" else None
    audio = _sound() if mode == "image + audio to video" else None
    auto = _spec(files, **CASES["ltx2-checkpoint"])
    assert auto.storage == "float8_e4m3fn", "dtype auto keeps the file's fp8 matrices in fp8 (layerwise casting)"
    spec = api.make_file_spec(assemble.FileChoice(**CASES["ltx2-checkpoint"]), _roots(files / "models"), "float32")
    mine = _videos(spec, starts, audio)
    theirs = _videos(api.make_spec("ref-ltx2", [str(files / "diffusers")], "float32"), starts, audio)
    assert mine["images"].shape == theirs["images"].shape == (18, 64, 64, 3)
    assert np.abs(mine["images"] - theirs["images"]).max() <= TOLERANCE
    assert mine["audio"].shape == theirs["audio"].shape and mine["audio"].shape[:2] == (2, 2)
    assert np.abs(mine["audio"] - theirs["audio"]).max() <= TOLERANCE
    assert np.abs(mine["audio"]).max() > 0 and not np.array_equal(mine["images"][:9], mine["images"][9:])
    assert int(mine["audio_rate"][0]) == int(theirs["audio_rate"][0]) == 8000


@pytest.mark.workers
def test_a_vocoder_with_bandwidth_extension_loads_and_gives_the_folders_sound(files):
    """LTX-2.3's vocoder with bandwidth extension (ComfyUI's VocoderWithBWE: a HiFi-GAN, a second one over its mel
    transform, anti-aliased snake activations) read as diffusers' LTX2VocoderWithBWE, its sizes from the tensors:
    frames and 48 kHz sound equal the same model as a diffusers folder."""
    spec = api.make_file_spec(assemble.FileChoice(checkpoint=NAMES["bwe"], text_encoders=(NAMES["gemma3"],)),
                              _roots(files / "models"), "float32")
    assert spec.model_index()["vocoder"][1] == "LTX2VocoderWithBWE"
    mine = _videos(spec, None)
    theirs = _videos(api.make_spec("ref-ltx2-bwe", [str(files / "diffusers")], "float32"), None)
    assert np.abs(mine["images"] - theirs["images"]).max() <= TOLERANCE
    assert mine["audio"].shape == theirs["audio"].shape and np.abs(mine["audio"]).max() > 0
    assert np.abs(mine["audio"] - theirs["audio"]).max() <= TOLERANCE
    assert int(mine["audio_rate"][0]) == int(theirs["audio_rate"][0]) == 48000


@pytest.mark.workers
def test_a_checkpoint_in_comfyuis_fp8_layers_gives_the_videos_of_it_dequantized_by_comfy_kitchen(files):
    """The DiT's and the text connectors' blocks in ComfyUI's quantized fp8 (comfy-kitchen, the markers in the
    metadata): the DiT kept quantized, the connectors (read under both their prefixes) dequantized at load;
    frames and sound equal the same checkpoint dequantized by comfy-kitchen."""
    quant = _spec(files, checkpoint=NAMES["fp8_quant"], text_encoders=(NAMES["gemma3"],))
    assert {c.name: c.quant for c in quant.source.components if c.name in ("transformer", "connectors", "vae")} == {
        "transformer": "comfy-quant", "connectors": "comfy-quant", "vae": ""}
    deq = _spec(files, checkpoint=NAMES["fp8_quant_dequantized"], text_encoders=(NAMES["gemma3"],))
    mine, theirs = _videos(quant, None), _videos(deq, None)
    assert mine["images"].shape == (18, 64, 64, 3) and mine["images"].std() > 0
    assert np.abs(mine["images"] - theirs["images"]).max() <= TOLERANCE
    assert np.abs(mine["audio"] - theirs["audio"]).max() <= TOLERANCE


@pytest.mark.workers
def test_the_templates_gemma_in_fp4_mixed_gives_the_videos_of_it_dequantized_by_comfy_kitchen(files):
    """gemma_3_12B_it_fp4_mixed (as the templates name it: nvfp4 MLP, fp8 attention, int8 embedding, ComfyUI's
    markers in the metadata), kept quantized in the worker, against the same file dequantized by comfy-kitchen;
    its tokenizer from the quantized file too."""
    quant = _spec(files, checkpoint=NAMES["checkpoint"], text_encoders=(NAMES["gemma3_fp4_mixed"],))
    text_encoder = quant.source.component("text_encoder")
    assert (text_encoder.quant, quant.source.component("tokenizer").layout) == ("comfy-quant", "gemma-spiece")
    deq = _spec(files, checkpoint=NAMES["checkpoint"], text_encoders=(NAMES["gemma3_fp4_mixed_dequantized"],))
    mine, theirs = _videos(quant, None), _videos(deq, None)
    assert mine["images"].shape == (18, 64, 64, 3) and mine["images"].std() > 0
    assert np.abs(mine["images"] - theirs["images"]).max() <= TOLERANCE
    assert np.abs(mine["audio"] - theirs["audio"]).max() <= TOLERANCE


def _ltx25_spec(root: Path, dit: str = "dit", gemma4: str = "gemma4") -> api.PipelineSpec:
    return api.make_file_spec(assemble.FileChoice(diffusion_model=LTX25[dit], text_encoders=(LTX25[gemma4],),
                                                  vae=LTX25["vae"], audio_vae=LTX25["audio_vae"]),
                              _roots(root / "models"), "float32")


@pytest.mark.workers
def test_ltx25s_split_files_give_the_videos_of_them_dequantized_by_comfy_kitchen(comfyui_files):
    """LTX-2.5's four files as its templates name them: the int8 DiT (its connectors' blocks inside, their text
    projection read from Gemma 4's file: one part from two files), Gemma 4 int8 in ComfyUI's names with its
    tokenizer inside, the video VAE, the audio VAE with its vocoder (in audio_vae); text to video through the
    workers: frames and sound within 1e-4 of the same files dequantized by comfy-kitchen."""
    root = comfyui_files("ltx25", folder="comfyui-ltx25")
    quant = _ltx25_spec(root)
    assert quant.class_name == "LTX2Pipeline" and quant.source.configs == "ltx-2.5"
    layouts = {c.name: (c.layout, Path(c.path).name, tuple(Path(m).name for m in c.more), c.quant)
               for c in quant.source.components}
    assert layouts == {
        "transformer": ("ltx2", LTX25["dit"], (), "comfy-quant"), "vae": ("ltx2-vae", LTX25["vae"], (), ""),
        "connectors": ("ltx2-connectors", LTX25["dit"], (LTX25["gemma4"],), "comfy-quant"),
        "audio_vae": ("ltx2-audio-vae", LTX25["audio_vae"], (), ""),
        "vocoder": ("ltx2-vocoder", LTX25["audio_vae"], (), ""),
        "text_encoder": ("gemma4-comfy", LTX25["gemma4"], (), "comfy-quant"),
        "tokenizer": ("gemma4-json", LTX25["gemma4"], (), "")}
    deq = _ltx25_spec(root, "dit_dequantized", "gemma4_dequantized")
    mine, theirs = _videos(quant, None), _videos(deq, None)
    assert mine["images"].shape == theirs["images"].shape == (18, 64, 64, 3) and mine["images"].std() > 0
    assert np.abs(mine["images"] - theirs["images"]).max() <= TOLERANCE
    assert mine["audio"].shape == theirs["audio"].shape and np.abs(mine["audio"]).max() > 0
    assert np.abs(mine["audio"] - theirs["audio"]).max() <= TOLERANCE


@pytest.mark.workers
@pytest.mark.parametrize("mode", ["text to video", "image to video"])
def test_ltx25s_split_files_give_the_videos_of_tiny_ltx25_as_a_diffusers_folder(comfyui_files, mode):
    """Two videos from LTX-2.5's four files and from tiny-ltx25 as a diffusers folder (the reference: the weights
    the files hold, the int8 ones dequantized by comfy-kitchen, the bf16 ones rounded) through the workers, in
    float32, text to video and image to video (start images 0 and 1): frames and sound agree within 1e-4, the
    sound at the vocoder's rate."""
    starts = (np.random.default_rng(5).integers(0, 256, (2, 64, 64, 3)) / 255).astype(np.float32) \
        if mode == "image to video" else None
    root = comfyui_files("ltx25", folder="comfyui-ltx25")
    mine = _videos(_ltx25_spec(root), starts)
    theirs = _videos(api.make_spec("ref-ltx25", [str(root / "diffusers")], "float32"), starts)
    assert mine["images"].shape == theirs["images"].shape == (18, 64, 64, 3) and mine["images"].std() > 0
    assert np.abs(mine["images"] - theirs["images"]).max() <= TOLERANCE
    assert mine["audio"].shape == theirs["audio"].shape and mine["audio"].shape[:2] == (2, 2)
    assert np.abs(mine["audio"]).max() > 0 and np.abs(mine["audio"] - theirs["audio"]).max() <= TOLERANCE
    assert int(mine["audio_rate"][0]) == int(theirs["audio_rate"][0]) == 8000


@pytest.mark.unit
def test_gemma4_12bs_sizes_from_its_shapes_are_comfyuis_gemma4_12b_config():
    """The shapes of ComfyUI's Gemma 4 12B (48 layers, 3840 wide, every 6th layer global: 512-wide heads, one K/V
    head, K = V, no v_proj; the others 256-wide heads, 8 K/V heads) give the published config back, and
    transformers builds each layer as ComfyUI's Gemma4_12B_Config does (window 1024, partial rotary 0.25)."""
    from transformers import Gemma4UnifiedConfig

    from backend.families import config_dir, text_encoders

    shapes = {"model.embed_tokens.weight": (262144, 3840), "model.norm.weight": (3840,),
              "text_embedding_projection.video_aggregate_embed.weight": (4096, 3840 * 49)}
    for i in range(48):
        a, glob = f"model.layers.{i}.", i % 6 == 5
        head, kv = (512, 1) if glob else (256, 8)
        shapes.update({a + "self_attn.q_proj.weight": (16 * head, 3840), a + "self_attn.k_proj.weight": (kv * head, 3840),
                       a + "self_attn.q_norm.weight": (head,), a + "self_attn.k_norm.weight": (head,),
                       a + "self_attn.o_proj.weight": (3840, 16 * head), a + "mlp.gate_proj.weight": (15360, 3840),
                       a + "pre_feedforward_layernorm.weight": (3840,), a + "layer_scalar": (1,)})
        if not glob:
            shapes[a + "self_attn.v_proj.weight"] = (kv * head, 3840)
    assert text_encoders.recognise(shapes) == "gemma4"
    published = read_json(config_dir("ltx-2.5") / "text_encoder" / "config.json")
    sizes = text_encoders.sizes("gemma4", shapes, published)
    text = sizes["text_config"]
    assert {k: text[k] for k in published["text_config"]} == published["text_config"]
    assert text["layer_types"] == (["sliding_attention"] * 5 + ["full_attention"]) * 8
    config = Gemma4UnifiedConfig.from_dict({**published, **sizes}).text_config
    layers = [(c.head_dim, c.num_key_value_heads) for c in (config.per_layer_config[i] for i in range(48))]
    assert layers == ([(256, 8)] * 5 + [(512, 1)]) * 8
    assert (config.sliding_window, config.attention_k_eq_v) == (1024, True)
    assert config.rope_parameters["full_attention"]["partial_rotary_factor"] == 0.25
