"""Artists' files for the tests, written by ComfyUI's own code from tiny diffusers pipelines.

For each family a reference diffusers folder (`diffusers/ref-<family>`) is built from the tiny pipeline of
backend/tiny_models.py, and the same weights are written as the files ComfyUI users keep (`models/checkpoints`,
`models/diffusion_models`, `models/text_encoders`, `models/vae`) by ComfyUI's converters and the functions its
save nodes call: `comfy.model_detection.convert_diffusers_mmdit` (FLUX.1, SD3), `comfy.utils.unet_to_diffusers`
(SDXL's UNet), `comfy.diffusers_convert.convert_vae_state_dict` (LDM VAEs), `supported_models.*.process_*_for_saving`
(what CheckpointSave and ModelSave write). ComfyUI 0.3.75 has no converter for the FLUX.2 transformer nor for
the Qwen-Image VAE: those files are the exact inverse of diffusers' own converters (every element traced
through the real converter), with key names and shapes taken from ComfyUI's own modules (`Flux(image_model=
"flux2")`, `WanVAE`), and a strict load into those modules proves the layout.

The reference folders differ from the tiny pipelines where the files cannot carry what the tiny models do:
the text encoders read ComfyUI's bundled tokenizers (so their vocabularies have the real sizes), and the
hyper-parameters that are not stored in any tensor (head counts, rotary splits, GroupNorm groups, T5's
relative-attention distance, activation functions) are set to what the pack derives for these widths. Each
such value is written out below; the rest of each model is the tiny pipeline's.

Run as a script (the tests do, in a subprocess, so ComfyUI's modules never enter the test process):
    python tests/file_fixtures.py OUT TINY_MODELS COMFYUI_DIR [FAMILY ...]
Each family's files are built once per OUT folder (a marker file records it).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import sys
from pathlib import Path

# "flux1-3072" (1 GB), "flux1-vae" (170 MB), "flux1tools" and "flux1redux" (the FLUX.1 tools, issue 26) and
# "zimage-quant" (ComfyUI's quantized files, issue 33) and "ltx25" (LTX-2.5's split files) only when asked
FAMILIES = ("flux1", "flux2", "flux2dev", "sd3", "sdxl", "qwenimage", "zimage", "wan", "krea2", "qwenimage21",
            "flux3", "ideogram4", "ltx2", "minimax_h3")
VERSION = "18"  # bump to rebuild cached fixtures after changing this file

# what each family's files are called (role folder/name), for the tests
FILES = {
    "flux1": {"diffusion_model": "flux1-tiny.safetensors", "comfysave": "flux1-tiny-comfysave.safetensors",
              "clip_l": "clip_l-tiny.safetensors", "t5": "t5xxl-tiny.safetensors",
              "t5_fp8": "t5xxl-tiny_fp8_e4m3fn.safetensors", "t5_fp8_scaled": "t5xxl-tiny_fp8_e4m3fn_scaled.safetensors",
              "fp8": "flux1-tiny-fp8-e5m2.safetensors", "vae": "ae-tiny.safetensors",
              "checkpoint": "flux1-tiny-checkpoint.safetensors"},
    "flux2": {"diffusion_model": "flux2-klein-tiny.safetensors", "comfysave": "flux2-klein-tiny-comfysave.safetensors",
              "fp8_scaled": "flux2-klein-tiny-fp8scaled.safetensors", "gguf": "flux2-klein-tiny-Q8_0.gguf",
              "qwen3": "qwen_3-tiny.safetensors", "vae": "flux2-vae-tiny.safetensors"},
    "flux2dev": {"diffusion_model": "flux2-dev-tiny.safetensors", "mistral": "mistral_3_small_flux2-tiny.safetensors",
                 "vae": "flux2-vae-tiny.safetensors"},
    "sd3": {"checkpoint": "sd3-tiny.safetensors", "checkpoint_no_t5": "sd3-tiny-noT5.safetensors",
            "diffusion_model": "sd3-tiny.safetensors", "clip_l": "clip_l-sd3-tiny.safetensors",
            "clip_g": "clip_g-tiny.safetensors", "t5": "t5xxl-sd3-tiny.safetensors", "vae": "sd3-vae-tiny.safetensors"},
    "flux1-3072": {"diffusion_model": "flux1-dev-3072-1x1.safetensors"},
    # FLUX.1 Kontext, Fill and Depth/Canny diffusion models; they read flux1's text encoders and VAE
    "flux1tools": {"kontext": "flux1-kontext-tiny.safetensors", "fill": "flux1-fill-tiny.safetensors",
                   "depth": "flux1-depth-tiny.safetensors"},
    "flux1-vae": {"vae": "ae-published-layout-4ch.safetensors"},
    # FLUX.1 Redux as ComfyUI's Load Style Model and Load CLIP Vision read it (style_models/, clip_vision/ under
    # redux-models/: a folder the role lists of other tests do not read); a style model for a wider FLUX.1 and a
    # CLIP ViT vision model, which the pack refuses
    "flux1redux": {"style": "flux1-redux-tiny.safetensors", "style_wide": "flux1-redux-wide-tiny.safetensors",
                   "siglip": "sigclip_vision_patch14_384-tiny.safetensors", "clip_vit": "clip_vision_vit-tiny.safetensors"},
    "sdxl": {"checkpoint": "sdxl-tiny.safetensors", "checkpoint_fp8": "sdxl-tiny-fp8-e4m3fn.safetensors"},
    "qwenimage": {"diffusion_model": "qwen-image-tiny.safetensors",
                  "comfysave": "qwen-image-tiny-comfysave.safetensors",
                  "qwen25vl": "qwen_2.5_vl-tiny.safetensors", "vae": "qwen_image_vae-tiny.safetensors",
                  # the newer releases as ComfyUI's templates name them: the same tensors, 2511 with its marker
                  "edit_2509": "qwen_image_edit_2509-tiny_fp8_e4m3fn.safetensors",
                  "edit_2511": "qwen_image_edit_2511-tiny_bf16.safetensors",
                  "t2i_2512": "qwen_image_2512-tiny_fp8_e4m3fn.safetensors"},
    "wan": {"diffusion_model": "wan2.1_t2v-tiny_fp16.safetensors",
            "fp8_scaled": "wan2.1_t2v-tiny_fp8_scaled.safetensors",
            "high_noise": "wan2.2_t2v_high_noise-tiny.safetensors", "low_noise": "wan2.2_t2v_low_noise-tiny.safetensors",
            "i2v_high_noise": "wan2.2_i2v_high_noise-tiny.safetensors",
            "i2v_low_noise": "wan2.2_i2v_low_noise-tiny.safetensors",
            "i2v21": "wan2.1_i2v-tiny_fp16.safetensors", "clip_vision": "clip_vision_h-tiny.safetensors",
            "ti2v": "wan2.2_ti2v-tiny.safetensors", "umt5": "umt5_xxl-tiny.safetensors",
            "umt5_fp8_scaled": "umt5_xxl-tiny_fp8_e4m3fn_scaled.safetensors", "vae": "wan_2.1_vae-tiny.safetensors",
            "vae22": "wan2.2_vae-tiny.safetensors"},
    "zimage": {"diffusion_model": "z_image_turbo-tiny.safetensors",
               "comfysave": "z_image_turbo-tiny-comfysave.safetensors",
               "bf16": "z_image_turbo-tiny_bf16.safetensors", "fp8": "z_image_turbo-tiny_fp8_e4m3fn.safetensors",
               "fp8_scaled": "z_image_turbo-tiny_fp8_scaled.safetensors",
               "qwen3": "qwen_3-tiny.safetensors", "vae": "ae-tiny.safetensors"},
    # ComfyUI's quantized files (issue 33; only when asked, after "zimage", whose Qwen3 and VAE files they read):
    # each beside the same file dequantized by comfy-kitchen
    "zimage-quant": {"int8_convrot": "z_image_turbo-tiny_int8_convrot.safetensors",
                     "int8_convrot_dequantized": "z_image_turbo-tiny_int8_convrot-dequantized.safetensors",
                     "fp4_mixed": "z_image_turbo-tiny_fp4_mixed.safetensors",
                     "fp4_mixed_dequantized": "z_image_turbo-tiny_fp4_mixed-dequantized.safetensors",
                     "bf16": "z_image_turbo-tiny-256_bf16.safetensors",
                     "qwen3_fp8_mixed": "qwen_3-tiny_fp8_mixed.safetensors",
                     "qwen3_fp8_mixed_dequantized": "qwen_3-tiny_fp8_mixed-dequantized.safetensors"},
    "qwenimage-quant": {"edit_2511_int8": "qwen_image_edit_2511-tiny_int8_convrot.safetensors",  # after "qwenimage"
                        "t2i_int8": "qwen_image-tiny_int8_convrot.safetensors"},
    # Krea 2 as its templates name the files: Turbo (the name says it), the same tensors renamed (read as Raw)
    "krea2": {"diffusion_model": "krea2_turbo-tiny.safetensors", "raw": "krea2-tiny.safetensors",
              "qwen3vl": "qwen3vl_4b-tiny.safetensors", "vae": "qwen_image_vae-krea2-tiny.safetensors"},
    # Krea 2 Turbo's int8 ConvRot file as its template names it (only when asked, after "krea2", whose Qwen3-VL and
    # VAE files it reads), beside the same file dequantized by comfy-kitchen
    "krea2-quant": {"int8_convrot": "krea2_turbo-tiny_int8_convrot.safetensors",
                    "int8_convrot_dequantized": "krea2_turbo-tiny_int8_convrot-dequantized.safetensors"},
    # MiniMax H3 (issue 37) as its templates name the files: the fl2va transformer full and pruned (ComfyUI's curve
    # form), Qwen3-VL, both VAEs; and the diffusers folder they were written from (ref-minimax-h3)
    # as the templates' quantized ones (comfy-kitchen's quantize: the pruned transformer's and the VAE decoder's
    # Linear layers int8 ConvRot, Qwen3-VL's nvfp4 with AWQ smoothing), each beside itself dequantized
    "minimax_h3": {"diffusion_model": "minimax_h3_fl2va-tiny_bf16.safetensors",
                   "pruned": "minimax_h3_fl2va_pruned-tiny.safetensors",
                   # the ref2va transformer (the `transformer_ref` partition), full and pruned (the r2v template's)
                   "ref2va_full": "minimax_h3_ref2va-tiny_bf16.safetensors",
                   "ref2va": "minimax_h3_ref2va_pruned-tiny.safetensors",
                   "qwen3vl": "qwen3vl_32b_minimax_h3-tiny.safetensors",
                   "vae": "minimax_h3_video_vae-tiny.safetensors", "audio_vae": "minimax_h3_audio_vae-tiny_fp32.safetensors",
                   "int8": "minimax_h3_fl2va_pruned-tiny_int8_convrot.safetensors",
                   "int8_dequantized": "minimax_h3_fl2va_pruned-tiny_int8_convrot-dequantized.safetensors",
                   "ref2va_int8": "minimax_h3_ref2va_pruned-tiny_int8_convrot.safetensors",
                   "ref2va_int8_dequantized": "minimax_h3_ref2va_pruned-tiny_int8_convrot-dequantized.safetensors",
                   "vae_int8": "minimax_h3_video_vae-tiny_int8_convrot.safetensors",
                   "vae_int8_dequantized": "minimax_h3_video_vae-tiny_int8_convrot-dequantized.safetensors",
                   "qwen3vl_nvfp4": "qwen3vl_32b_minimax_h3-tiny_nvfp4_awq.safetensors",
                   "qwen3vl_nvfp4_dequantized": "qwen3vl_32b_minimax_h3-tiny_nvfp4_awq-dequantized.safetensors"},
    "qwenimage21": {"diffusion_model": "qwen_image_2.1-tiny.safetensors", "qwen3vl": "qwen3vl_8b-tiny.safetensors",
                    "vae": "qwen_image_2.1_vae-tiny.safetensors"},
    # FLUX 3 [klein] as its templates name the files (after "flux2" and "krea2": it reads Krea 2's Qwen3-VL-4B file
    # and FLUX.2's VAE file, as both templates name qwen3vl_4b and flux2-vae), step-distilled and base
    "flux3": {"diffusion_model": "flux3-image-klein-tiny.safetensors",
              "base": "flux3-image-klein-base-tiny.safetensors", "qwen3vl": "qwen3vl_4b-tiny.safetensors",
              "vae": "flux2-vae-tiny.safetensors",
              # the base model in int8 ConvRot as its templates' file (256 wide), beside it dequantized
              "int8_convrot": "flux3-image-klein-base-int8-convrot-tiny.safetensors",
              "int8_convrot_dequantized": "flux3-image-klein-base-int8-convrot-tiny-dequantized.safetensors"},
    # Ideogram 4 as its template names the files: the conditional and the unconditional transformer (plain, and in
    # ComfyUI's scaled fp8 as the template's), Qwen3-VL-8B (36 thin layers: the pipeline taps layer 35), FLUX.2's VAE
    "ideogram4": {"diffusion_model": "ideogram4-tiny.safetensors",
                  "unconditional": "ideogram4_unconditional-tiny.safetensors",
                  "fp8_scaled": "ideogram4-tiny_fp8_scaled.safetensors",
                  "unconditional_fp8_scaled": "ideogram4_unconditional-tiny_fp8_scaled.safetensors",
                  "qwen3vl": "qwen3vl_8b-36layers-tiny.safetensors", "vae": "flux2-vae-tiny.safetensors"},
    # Ideogram 4's int8 ConvRot pair as its template names the files (only when asked, after "ideogram4", whose
    # Qwen3-VL and VAE files they read), each beside the same file dequantized by comfy-kitchen
    "ideogram4-quant": {"int8_convrot": "ideogram4-tiny_int8_convrot.safetensors",
                        "unconditional_int8_convrot": "ideogram4_unconditional-tiny_int8_convrot.safetensors",
                        "int8_convrot_dequantized": "ideogram4-tiny_int8_convrot-dequantized.safetensors",
                        "unconditional_int8_convrot_dequantized":
                            "ideogram4_unconditional-tiny_int8_convrot-dequantized.safetensors"},
    # LTX-2.3's all-in-one checkpoint as its templates name it (DiT with its text connectors, both VAEs, the
    # vocoder; fp8 as published), its Gemma 3 text encoder (the tokenizer inside), and the checkpoint without its
    # audio VAE (refused)
    "ltx2": {"checkpoint": "ltx-2.3-22b-dev-fp8.safetensors", "gemma3": "gemma_3_12B_it-tiny.safetensors",
             "no_audio_vae": "ltx-2.3-tiny-no-audio-vae.safetensors",
             # with LTX-2.3's vocoder with bandwidth extension (ComfyUI's VocoderWithBWE), beside ref-ltx2-bwe
             "bwe": "ltx-2.3-tiny-bwe.safetensors",
             # the DiT's and the connectors' blocks in ComfyUI's fp8 (comfy-kitchen, markers in the metadata), beside
             # the same checkpoint dequantized by comfy-kitchen
             "fp8_quant": "ltx-2.3-tiny-fp8-comfy-quant.safetensors",
             "fp8_quant_dequantized": "ltx-2.3-tiny-fp8-comfy-quant-dequantized.safetensors",
             # as its templates name it: ComfyUI's fp4 mixed (nvfp4 + fp8), beside it dequantized by comfy-kitchen
             "gemma3_fp4_mixed": "gemma_3_12B_it_fp4_mixed.safetensors",
             "gemma3_fp4_mixed_dequantized": "gemma_3_12B_it_fp4_mixed-dequantized.safetensors"},
    # LTX-2.5's split files as its templates (video_ltx2_5_t2v, _i2v) name them, in a folder of their own (not read
    # from files yet: refused naming them): the DiT with its connectors (int8 ConvRot), Gemma 4 with the connectors'
    # text projection beside it (int8 ConvRot), the video VAE, the audio VAE with its vocoder
    "ltx25": {"dit": "ltx-2.5-22b-distilled-transformer-comfy-int8-convrot.safetensors",
              "gemma4": "gemma4-12b-with-proj-ltx-2.5-comfy-int8-convrot.safetensors",
              "vae": "ltx-2.5-video-vae-bf16.safetensors", "audio_vae": "ltx-2.5-audio-vae-bf16.safetensors",
              # the two quantized files dequantized by comfy-kitchen (what the int8 files are compared against)
              "dit_dequantized": "ltx-2.5-tiny-transformer-dequantized.safetensors",
              "gemma4_dequantized": "gemma4-tiny-with-proj-ltx-2.5-dequantized.safetensors"},
}


# ---- ComfyUI's code


def _config_dir(folder: str) -> Path:
    """A published model's configs, in the family folder that ships them (imported late: this file also runs as a
    script, which puts the pack on sys.path first)."""
    from backend.families import config_dir

    return config_dir(folder)


def import_comfy(comfyui_dir: str):
    """ComfyUI's `comfy` package, set up as `main.py --cpu` sets it up."""
    if comfyui_dir not in sys.path:
        sys.path.append(comfyui_dir)
    argv, sys.argv = sys.argv, ["main.py", "--cpu"]
    try:
        import comfy.options

        comfy.options.enable_args_parsing()
        import comfy.cli_args  # noqa: F401  (parses --cpu)
        import comfy.diffusers_convert  # noqa: F401
        import comfy.model_detection  # noqa: F401
        import comfy.supported_models  # noqa: F401
        import comfy.utils  # noqa: F401
    finally:
        sys.argv = argv
    return comfy


def probe_invert(converter, target_shapes: dict, diffusers_sd: dict, **kwargs) -> dict:
    """The exact inverse of a converter that only renames, slices, concatenates, reshapes or swaps: each
    target tensor is filled with unique ids, the real converter runs on them, and every id's destination says
    where its value comes from in the diffusers state dict."""
    import torch

    ids, start = {}, 0
    for key, shape in target_shapes.items():
        n = int(torch.tensor(shape).prod()) if shape else 1
        ids[key] = torch.arange(start, start + n, dtype=torch.float64).reshape(shape)
        start += n
    converted = converter(checkpoint=dict(ids), **kwargs)
    flat = torch.full((start,), float("nan"), dtype=torch.float64)
    dtype = next(iter(diffusers_sd.values())).dtype
    for key, traced in converted.items():
        flat[traced.reshape(-1).long()] = diffusers_sd[key].reshape(-1).to(torch.float64)
    assert set(converted) == set(diffusers_sd), set(converted) ^ set(diffusers_sd)
    out = {}
    for key, shape in target_shapes.items():
        values = flat[ids[key].reshape(-1).long()]
        assert not torch.isnan(values).any(), f"{key}: not produced by the converter"
        out[key] = values.reshape(shape).to(dtype)
    return out


# ---- helpers


def _save(sd: dict, path: Path, metadata: dict | None = None) -> Path:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path), metadata=metadata)
    return path


def _sd(module) -> dict:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _seeded(seed: int, factory):
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = factory()
    return module.eval()


def _reconfigured(module, **changes):
    """`module` with config values that change no tensor shape (head counts, groups, rotary splits): the same
    weights under another config."""
    cls = type(module)
    if hasattr(cls, "from_config"):  # diffusers
        new = cls.from_config({**dict(module.config), **changes})
    else:  # transformers
        config = module.config.__class__.from_dict({**module.config.to_dict(), **changes})
        new = cls(config)
    new.load_state_dict(module.state_dict(), strict=True)
    return new.eval()


def _fp8(sd: dict, dtype) -> dict:
    """As ComfyUI's plain fp8 files store them: matrices and convolutions in fp8, the rest unchanged."""
    return {k: (v.to(dtype) if v.is_floating_point() and v.ndim >= 2 else v) for k, v in sd.items()}


def _scaled_fp8(comfy, sd: dict, keys: list[str]) -> dict:
    """ComfyUI's "scaled fp8" layout, quantized by ComfyUI's own fp8 quantizer: each listed weight in
    float8_e4m3fn with a `.scale_weight`, and the `scaled_fp8` marker."""
    import comfy.quant_ops
    import torch

    out = dict(sd)
    for key in keys:
        q, params = comfy.quant_ops.TensorCoreFP8Layout.quantize(sd[key].clone(), dtype=torch.float8_e4m3fn)
        out[key] = q
        out[key[: -len("weight")] + "scale_weight"] = params["scale"]
    out["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    return out


def _comfy_tokenizers(comfyui_dir: str) -> Path:
    return Path(comfyui_dir) / "comfy"


def _clip(width: int, heads: int, act: str, seed: int, projection: bool):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(vocab_size=49408, hidden_size=width, intermediate_size=2 * width, projection_dim=width,
                            num_hidden_layers=2, num_attention_heads=heads, max_position_embeddings=77,
                            hidden_act=act, bos_token_id=0, eos_token_id=2, pad_token_id=1)
    cls = CLIPTextModelWithProjection if projection else CLIPTextModel
    return _seeded(seed, lambda: cls(config))


def _t5(width: int, seed: int):
    from transformers import T5Config, T5EncoderModel

    # 4 heads of 8 (read from relative_attention_bias); 128 = the published relative-attention distance
    config = T5Config(vocab_size=32128, d_model=width, d_kv=width // 4, d_ff=2 * width, num_layers=2, num_heads=4,
                      relative_attention_num_buckets=8, relative_attention_max_distance=128,
                      feed_forward_proj="gated-gelu", dropout_rate=0.0, is_encoder_decoder=False, use_cache=False,
                      pad_token_id=0, eos_token_id=1)
    return _seeded(seed, lambda: T5EncoderModel(config))


def _clip_file(model) -> dict:
    """A CLIP text encoder as ComfyUI's files hold it (what CLIPSave writes): transformers' keys under
    `text_model.`, and a `text_projection` (the identity where the model has none, as in clip_l.safetensors)."""
    import torch

    sd = {}
    for key, value in _sd(model).items():
        sd[key if key.startswith(("text_model.", "text_projection.")) else f"text_model.{key}"] = value
    if "text_projection.weight" not in sd:
        width = model.config.hidden_size
        sd["text_projection.weight"] = torch.eye(width)
    return sd


# ---- families


def _flux1(tiny: Path, comfyui_dir: str, out: Path) -> None:
    from diffusers import FluxPipeline
    from transformers import CLIPTokenizer, T5TokenizerFast

    comfy = import_comfy(comfyui_dir)
    tok_dir = _comfy_tokenizers(comfyui_dir)
    pipe = FluxPipeline.from_pretrained(str(tiny / "tiny-flux"), local_files_only=True)
    pipe.tokenizer = CLIPTokenizer.from_pretrained(str(tok_dir / "sd1_tokenizer"), model_max_length=77)
    pipe.tokenizer_2 = T5TokenizerFast.from_pretrained(str(tok_dir / "text_encoders" / "t5_tokenizer"))
    pipe.text_encoder = _clip(32, 1, "quick_gelu", 11, projection=False)  # 32 wide: one head of 32
    pipe.text_encoder_2 = _t5(32, 12)
    pipe.transformer = _reconfigured(pipe.transformer, axes_dims_rope=[2, 8, 6])  # 16-wide heads
    pipe.vae = _reconfigured(pipe.vae, norm_num_groups=8)
    pipe.save_pretrained(str(out / "diffusers" / "ref-flux1"), safe_serialization=True)

    names, models = FILES["flux1"], out / "models"
    transformer = _sd(pipe.transformer)
    bfl = comfy.model_detection.convert_diffusers_mmdit({k: v.clone() for k, v in transformer.items()}, "")
    _save(bfl, models / "diffusion_models" / names["diffusion_model"])
    saving = comfy.supported_models.Flux({"image_model": "flux"})
    _save(saving.process_unet_state_dict_for_saving(dict(bfl)), models / "diffusion_models" / names["comfysave"])
    import torch

    _save(_fp8(bfl, torch.float8_e5m2), models / "diffusion_models" / names["fp8"])
    vae = comfy.diffusers_convert.convert_vae_state_dict(_sd(pipe.vae))
    _save(vae, models / "vae" / names["vae"])
    _save(_clip_file(pipe.text_encoder), models / "text_encoders" / names["clip_l"])
    t5 = _sd(pipe.text_encoder_2)
    _save(t5, models / "text_encoders" / names["t5"])
    _save(_fp8(t5, torch.float8_e4m3fn), models / "text_encoders" / names["t5_fp8"])
    matrices = [k for k, v in t5.items() if v.ndim == 2 and k.startswith("encoder.block.")]
    _save(_scaled_fp8(comfy, t5, matrices), models / "text_encoders" / names["t5_fp8_scaled"])
    clip = {f"clip_l.transformer.{k}": v for k, v in _clip_file(pipe.text_encoder).items()}
    clip.update({f"t5xxl.transformer.{k}": v for k, v in t5.items()})
    checkpoint = {}  # as CheckpointSave writes a FLUX.1 checkpoint (Comfy-Org's flux1-dev-fp8 layout)
    checkpoint.update(saving.process_clip_state_dict_for_saving(clip))
    checkpoint.update(saving.process_vae_state_dict_for_saving(dict(vae)))
    checkpoint.update(saving.process_unet_state_dict_for_saving(dict(bfl)))
    _save(checkpoint, models / "checkpoints" / names["checkpoint"])


def _flux2_transformer_file(comfy, transformer) -> dict:
    """FLUX.2's transformer in BFL's layout: no ComfyUI converter exists, so the exact inverse of diffusers'
    convert_flux2_transformer_checkpoint_to_diffusers, named and shaped by ComfyUI's own Flux(image_model=
    "flux2") and checked by a strict load into it."""
    import comfy.ldm.flux.layers
    import comfy.ldm.flux.model
    import comfy.ops
    import torch
    from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers

    c = transformer.config
    ops = comfy.ops.disable_weight_init
    with torch.device("meta"):
        module = comfy.ldm.flux.model.Flux(
            image_model="flux2", operations=ops, in_channels=c.in_channels, out_channels=c.out_channels or c.in_channels,
            vec_in_dim=None, context_in_dim=c.joint_attention_dim, hidden_size=c.num_attention_heads * c.attention_head_dim,
            mlp_ratio=c.mlp_ratio, num_heads=c.num_attention_heads, depth=c.num_layers,
            depth_single_blocks=c.num_single_layers, axes_dim=list(c.axes_dims_rope), theta=c.rope_theta, patch_size=1,
            qkv_bias=False, guidance_embed=c.guidance_embeds, global_modulation=True, mlp_silu_act=True, ops_bias=False)
        # ComfyUI builds time_in for 256 channels (the published size); the tiny model has fewer
        module.time_in = comfy.ldm.flux.layers.MLPEmbedder(in_dim=c.timestep_guidance_channels,
                                                           hidden_dim=module.hidden_size, bias=False, operations=ops)
        if c.guidance_embeds:
            module.guidance_in = comfy.ldm.flux.layers.MLPEmbedder(in_dim=c.timestep_guidance_channels,
                                                                   hidden_dim=module.hidden_size, bias=False,
                                                                   operations=ops)
    shapes = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    bfl = probe_invert(convert_flux2_transformer_checkpoint_to_diffusers, shapes, _sd(transformer))
    module.load_state_dict(bfl, strict=True, assign=True)  # exactly ComfyUI's layout
    return bfl


def _flux2(tiny: Path, comfyui_dir: str, out: Path) -> None:
    from diffusers import Flux2KleinPipeline

    comfy = import_comfy(comfyui_dir)
    pipe = Flux2KleinPipeline.from_pretrained(str(tiny / "tiny-flux2"), local_files_only=True)
    pipe.tokenizer, pipe.text_encoder = _qwen3(tiny, comfyui_dir, out)
    pipe.vae = _reconfigured(pipe.vae, norm_num_groups=8)
    pipe.save_pretrained(str(out / "diffusers" / "ref-flux2"), safe_serialization=True)

    names, models = FILES["flux2"], out / "models"
    bfl = _flux2_transformer_file(comfy, pipe.transformer)
    _save(bfl, models / "diffusion_models" / names["diffusion_model"])
    _save({f"model.diffusion_model.{k}": v for k, v in bfl.items()}, models / "diffusion_models" / names["comfysave"])
    linear = [k for k, v in bfl.items() if v.ndim == 2 and k.endswith(".weight") and "blocks." in k]
    _save(_scaled_fp8(comfy, bfl, linear), models / "diffusion_models" / names["fp8_scaled"])
    _gguf_q8(bfl, models / "diffusion_models" / names["gguf"])
    vae = comfy.diffusers_convert.convert_vae_state_dict(_sd(pipe.vae))
    _save(vae, models / "vae" / names["vae"])
    te = {k: v for k, v in _sd(pipe.text_encoder).items() if k != "lm_head.weight"}  # ComfyUI's files have none
    _save(te, models / "text_encoders" / names["qwen3"])


def _qwen3(tiny: Path, comfyui_dir: str, out: Path):
    """The tiny Qwen3 text encoder of qwen_3-tiny.safetensors (FLUX.2 [klein] and Z-Image both read Qwen3-4B's
    file) and its tokenizer: tiny-flux2's config with ComfyUI's vocabulary. Deterministic."""
    from transformers import AutoConfig, Qwen2Tokenizer, Qwen3Config, Qwen3ForCausalLM

    tokenizer = Qwen2Tokenizer.from_pretrained(str(_qwen3_tokenizer_folder(comfyui_dir, out)))
    tiny_config = AutoConfig.from_pretrained(str(tiny / "tiny-flux2" / "text_encoder"))
    config = Qwen3Config.from_dict({**tiny_config.to_dict(), "vocab_size": len(tokenizer),
                                    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
                                    "pad_token_id": tokenizer.pad_token_id,
                                    "eos_token_id": tokenizer.eos_token_id, "bos_token_id": None})
    return tokenizer, _seeded(21, lambda: Qwen3ForCausalLM(config))


def _qwen3_tokenizer_folder(comfyui_dir: str, out: Path) -> Path:
    """Qwen3's tokenizer as the pack lays it out: ComfyUI's Qwen vocabulary with Qwen3's tokenizer settings."""
    folder = out / "tokenizers" / "qwen3"
    if folder.is_dir():
        return folder
    folder.mkdir(parents=True)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(Path(comfyui_dir) / "comfy" / "text_encoders" / "qwen25_tokenizer" / name, folder / name)
    shipped = _config_dir("flux2-klein") / "tokenizer"
    shutil.copy(shipped / "tokenizer_config.json", folder / "tokenizer_config.json")
    return folder


def _gguf_q8(sd: dict, path: Path) -> None:
    """A GGUF file as city96's converter writes FLUX ones: BFL keys, matrices in Q8_0, the rest in float32."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch="flux")
    for key, value in sd.items():
        array = value.float().numpy()
        if array.ndim == 2 and array.shape[-1] % 32 == 0:
            q = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(key, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(key, array.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


TEKKEN_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                   "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]",
                   "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]"]


def _tekken() -> bytes:
    """A small tekken.json (mistral_common's format): byte-level ranks and Mistral's control tokens in their
    published order (<pad> is 11, as in Mistral Small 3.1)."""
    pattern = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
               r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
    specials = TEKKEN_SPECIALS + [f"<SPECIAL_{i}>" for i in range(len(TEKKEN_SPECIALS), 32)]
    data = {"config": {"pattern": pattern, "num_vocab_tokens": 256, "default_vocab_size": 256 + len(specials),
                       "default_num_special_tokens": len(specials), "version": "v7"},
            "vocab": [{"rank": i, "token_bytes": base64.b64encode(bytes([i])).decode(), "token_str": None}
                      for i in range(256)],
            "special_tokens": [{"rank": i, "token_str": s, "is_control": True} for i, s in enumerate(specials)]}
    return json.dumps(data).encode()


def _flux2dev(tiny: Path, comfyui_dir: str, out: Path) -> None:
    """FLUX.2 [dev]: Flux2Pipeline with a Mistral text encoder whose tokenizer travels in its file."""
    import torch
    from diffusers import Flux2KleinPipeline, Flux2Pipeline, Flux2Transformer2DModel
    from transformers import MistralConfig, MistralForCausalLM, PreTrainedTokenizerFast
    from transformers.integrations.mistral.tokenizer import MistralConverter

    comfy = import_comfy(comfyui_dir)
    klein = Flux2KleinPipeline.from_pretrained(str(tiny / "tiny-flux2"), local_files_only=True)
    folder = out / "tokenizers" / "mistral"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tekken.json").write_bytes(_tekken())
    shipped = json.loads((_config_dir("flux2") / "tokenizer"
                          / "tokenizer_config.json").read_text())
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=MistralConverter(vocab_file=str(folder / "tekken.json")).converted(),
                                        **{k: v for k, v in shipped.items() if k != "tokenizer_class"})
    hidden = 32
    config = MistralConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                           num_hidden_layers=40, num_attention_heads=1, num_key_value_heads=1, head_dim=32,
                           max_position_embeddings=1024, rope_parameters={"rope_type": "default", "rope_theta": 1e9},
                           rms_norm_eps=1e-05, sliding_window=None,
                           tie_word_embeddings=True, pad_token_id=11, bos_token_id=1, eos_token_id=2, use_cache=False)
    text_encoder = _seeded(31, lambda: MistralForCausalLM(config))
    transformer = _seeded(32, lambda: Flux2Transformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=3 * hidden, timestep_guidance_channels=32, mlp_ratio=3.0, axes_dims_rope=(4, 4, 4, 4),
        guidance_embeds=True))
    vae = _reconfigured(klein.vae, norm_num_groups=8)
    pipe = Flux2Pipeline(scheduler=klein.scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                         transformer=transformer)
    pipe.save_pretrained(str(out / "diffusers" / "ref-flux2dev"), safe_serialization=True)

    names, models = FILES["flux2dev"], out / "models"
    _save(_flux2_transformer_file(comfy, transformer), models / "diffusion_models" / names["diffusion_model"])
    te = {k: v for k, v in _sd(text_encoder).items() if k != "lm_head.weight"}
    te["tekken_model"] = torch.frombuffer(bytearray(_tekken()), dtype=torch.uint8)
    _save(te, models / "text_encoders" / names["mistral"])
    _save(comfy.diffusers_convert.convert_vae_state_dict(_sd(vae)), models / "vae" / names["vae"])


def _sd3(tiny: Path, comfyui_dir: str, out: Path) -> None:
    """SD3: ComfyUI's MMDiT code assumes 64-wide heads and one block per 64 of width, so the transformer is
    2 heads of 64 with 2 blocks; the two CLIPs differ in width (8 and 24), as diffusers tells them apart by it."""
    import torch
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTokenizer, T5TokenizerFast

    comfy = import_comfy(comfyui_dir)
    tok_dir = _comfy_tokenizers(comfyui_dir)
    pipe = StableDiffusion3Pipeline.from_pretrained(str(tiny / "tiny-sd3"), local_files_only=True)
    pipe.tokenizer = CLIPTokenizer.from_pretrained(str(tok_dir / "sd1_tokenizer"), model_max_length=77)
    pipe.tokenizer_2 = CLIPTokenizer.from_pretrained(str(tok_dir / "sd1_tokenizer"), model_max_length=77,
                                                     pad_token="!")
    pipe.tokenizer_3 = T5TokenizerFast.from_pretrained(str(tok_dir / "text_encoders" / "t5_tokenizer"))
    pipe.text_encoder = _clip(8, 1, "quick_gelu", 41, projection=True)  # 8 wide: one head of 8
    with torch.no_grad():  # SD3's CLIP-L projects by the identity (as diffusers' single-file loader sets it)
        pipe.text_encoder.text_projection.weight.copy_(torch.eye(8))
    pipe.text_encoder_2 = _clip(24, 3, "gelu", 42, projection=True)  # 24 wide: three heads of 8
    pipe.text_encoder_3 = _t5(32, 43)
    pipe.transformer = _seeded(44, lambda: SD3Transformer2DModel(
        sample_size=32, patch_size=2, in_channels=16, num_layers=2, attention_head_dim=64, num_attention_heads=2,
        joint_attention_dim=32, caption_projection_dim=128, pooled_projection_dim=32, out_channels=16,
        pos_embed_max_size=64, dual_attention_layers=(0,), qk_norm="rms_norm"))
    pipe.vae = _reconfigured(pipe.vae, norm_num_groups=8)
    pipe.save_pretrained(str(out / "diffusers" / "ref-sd3"), safe_serialization=True)

    names, models = FILES["sd3"], out / "models"
    mmdit = comfy.model_detection.convert_diffusers_mmdit({k: v.clone() for k, v in _sd(pipe.transformer).items()}, "")
    vae = comfy.diffusers_convert.convert_vae_state_dict(_sd(pipe.vae))
    clip = {}  # ComfyUI's SD3 text-encoder state (clip_l / clip_g / t5xxl, each .transformer = transformers' keys)
    for name, prefix in (("text_encoder", "clip_l"), ("text_encoder_2", "clip_g"), ("text_encoder_3", "t5xxl")):
        module = getattr(pipe, name)
        sd = _clip_file(module) if prefix != "t5xxl" else _sd(module)
        clip.update({f"{prefix}.transformer.{k}": v for k, v in sd.items()})
    saving = comfy.supported_models.SD3({"in_channels": 16})
    checkpoint = {}  # the three calls model_base.state_dict_for_saving makes for CheckpointSave
    checkpoint.update(saving.process_clip_state_dict_for_saving(dict(clip)))
    checkpoint.update(saving.process_vae_state_dict_for_saving(dict(vae)))
    checkpoint.update(saving.process_unet_state_dict_for_saving(dict(mmdit)))
    _save(checkpoint, models / "checkpoints" / names["checkpoint"])
    _save({k: v for k, v in checkpoint.items() if not k.startswith("text_encoders.t5xxl.")},
          models / "checkpoints" / names["checkpoint_no_t5"])
    _save(mmdit, models / "diffusion_models" / names["diffusion_model"])
    _save(vae, models / "vae" / names["vae"])
    _save(_clip_file(pipe.text_encoder), models / "text_encoders" / names["clip_l"])
    _save(_clip_file(pipe.text_encoder_2), models / "text_encoders" / names["clip_g"])
    _save(_sd(pipe.text_encoder_3), models / "text_encoders" / names["t5"])


def _sdxl(tiny: Path, comfyui_dir: str, out: Path) -> None:
    import torch
    from diffusers import StableDiffusionXLPipeline
    from transformers import CLIPTokenizer

    comfy = import_comfy(comfyui_dir)
    tok_dir = _comfy_tokenizers(comfyui_dir)
    pipe = StableDiffusionXLPipeline.from_pretrained(str(tiny / "tiny-sdxl"), local_files_only=True)
    pipe.tokenizer = CLIPTokenizer.from_pretrained(str(tok_dir / "sd1_tokenizer"), model_max_length=77)
    pipe.tokenizer_2 = CLIPTokenizer.from_pretrained(str(tok_dir / "sd1_tokenizer"), model_max_length=77,
                                                     pad_token="!")
    pipe.text_encoder = _clip(16, 1, "quick_gelu", 51, projection=False)
    pipe.text_encoder_2 = _clip(32, 1, "gelu", 52, projection=True)
    # 16- and 32-wide levels: one head each; 16 GroupNorm groups divide both
    pipe.unet = _reconfigured(pipe.unet, attention_head_dim=[1, 1], norm_num_groups=16)
    pipe.vae = _reconfigured(pipe.vae, norm_num_groups=8)
    pipe.save_pretrained(str(out / "diffusers" / "ref-sdxl"), safe_serialization=True)

    names, models = FILES["sdxl"], out / "models"
    c = dict(pipe.unet.config)
    levels, per = len(c["block_out_channels"]), c["layers_per_block"]
    depth = [tl if "CrossAttn" in t else 0 for t, tl in zip(c["down_block_types"], c["transformer_layers_per_block"],
                                                             strict=True)]
    unet_config = {"num_res_blocks": [per] * levels,  # the 5 fields comfy.utils.unet_to_diffusers reads
                   "channel_mult": [ch // c["block_out_channels"][0] for ch in c["block_out_channels"]],
                   "transformer_depth": sum([[d] * per for d in depth], []),
                   "transformer_depth_output": sum([[d] * (per + 1) for d in depth], []),
                   "transformer_depth_middle": c["transformer_layers_per_block"][-1]}
    key_map = comfy.utils.unet_to_diffusers(unet_config)
    unet = {key_map[k]: v for k, v in _sd(pipe.unet).items()}
    vae = comfy.diffusers_convert.convert_vae_state_dict(_sd(pipe.vae))
    clip = {f"clip_l.transformer.{k}": v for k, v in _clip_file(pipe.text_encoder).items()
            if not k.startswith("text_projection")}
    clip.update({f"clip_g.transformer.{k}": v for k, v in _sd(pipe.text_encoder_2).items()})
    saving = comfy.supported_models.SDXL(dict(comfy.supported_models.SDXL.unet_config))
    checkpoint = {}
    checkpoint.update(saving.process_clip_state_dict_for_saving(dict(clip)))
    checkpoint.update(saving.process_vae_state_dict_for_saving(dict(vae)))
    checkpoint.update(saving.process_unet_state_dict_for_saving(dict(unet)))
    _save(checkpoint, models / "checkpoints" / names["checkpoint"])
    _save(_fp8(checkpoint, torch.float8_e4m3fn), models / "checkpoints" / names["checkpoint_fp8"])


def _qwenimage(tiny: Path, comfyui_dir: str, out: Path) -> None:
    """Qwen-Image: diffusers' Wan VAE converter hard-codes the published layout (2 res blocks, dim_mult
    [1, 2, 4, 4]), so the VAE is rebuilt in it; the text encoder reads ComfyUI's Qwen tokenizer."""
    from diffusers import AutoencoderKLQwenImage, QwenImagePipeline
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen2Tokenizer

    import_comfy(comfyui_dir)
    import comfy.ldm.wan.vae

    pipe = QwenImagePipeline.from_pretrained(str(tiny / "tiny-qwenimage"), local_files_only=True)
    pipe.tokenizer = Qwen2Tokenizer.from_pretrained(str(_comfy_tokenizers(comfyui_dir) / "text_encoders"
                                                        / "qwen25_tokenizer"))
    ids = pipe.tokenizer.convert_tokens_to_ids
    config = pipe.text_encoder.config.to_dict()
    text = {**config["text_config"], "vocab_size": len(pipe.tokenizer), "pad_token_id": pipe.tokenizer.pad_token_id,
            "bos_token_id": ids("<|endoftext|>"), "eos_token_id": ids("<|im_end|>"),
            # one head of 32 (the published 128 halved to the width), mrope split [4, 6, 6] of its 16 pairs,
            # the published rope theta
            "num_attention_heads": 1, "num_key_value_heads": 1,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]}}
    vision = {**config["vision_config"], "num_heads": 1}  # 16 wide: the published 80-wide heads fit once
    new = type(pipe.text_encoder.config).from_dict({**config, "text_config": text, "vision_config": vision,
                                                    "image_token_id": ids("<|image_pad|>"),
                                                    "video_token_id": ids("<|video_pad|>"),
                                                    "vision_start_token_id": ids("<|vision_start|>"),
                                                    "vision_end_token_id": ids("<|vision_end|>")})
    pipe.text_encoder = _seeded(61, lambda: Qwen2_5_VLForConditionalGeneration(new))
    pipe.transformer = _reconfigured(pipe.transformer, axes_dims_rope=[2, 8, 6])
    vae_config = {k: v for k, v in dict(pipe.vae.config).items() if not k.startswith("_")}
    pipe.vae = _seeded(62, lambda: AutoencoderKLQwenImage(**{**vae_config, "num_res_blocks": 2,
                                                             "dim_mult": [1, 2, 4, 4]}))
    pipe.save_pretrained(str(out / "diffusers" / "ref-qwenimage"), safe_serialization=True)

    names, models = FILES["qwenimage"], out / "models"
    transformer = _sd(pipe.transformer)  # ComfyUI's Qwen-Image module uses diffusers' own names
    _save(transformer, models / "diffusion_models" / names["diffusion_model"])
    _save({f"model.diffusion_model.{k}": v for k, v in transformer.items()},
          models / "diffusion_models" / names["comfysave"])
    vc = pipe.vae.config
    import torch

    with torch.device("meta"):
        wan = comfy.ldm.wan.vae.WanVAE(dim=vc.base_dim, z_dim=vc.z_dim, dim_mult=vc.dim_mult,
                                       num_res_blocks=vc.num_res_blocks, attn_scales=vc.attn_scales,
                                       temperal_downsample=vc.temperal_downsample)
    vae = probe_invert(convert_wan_vae_to_diffusers, {k: tuple(v.shape) for k, v in wan.state_dict().items()},
                       _sd(pipe.vae))
    wan.load_state_dict(vae, strict=True, assign=True)  # exactly ComfyUI's layout
    _save(vae, models / "vae" / names["vae"])
    # transformers writes Qwen2.5-VL under its published names (model.layers.*, visual.*), which are ComfyUI's
    from safetensors.torch import load_file

    te = load_file(str(out / "diffusers" / "ref-qwenimage" / "text_encoder" / "model.safetensors"))
    _save({k: v for k, v in te.items() if k != "lm_head.weight"}, models / "text_encoders" / names["qwen25vl"])
    _qwenimage_releases(pipe, names, models, out)


def _qwenimage_releases(pipe, names: dict, models: Path, out: Path) -> None:
    """Qwen-Image-2512 and Edit-2509 files are Qwen-Image's tensors under their release's name (float32 here:
    the name is what is tested); Comfy-Org's Edit-2511 files add the empty `__index_timestep_zero__` tensor that
    ComfyUI's module registers for its "index_timestep_zero" reference method. 2511's reference: diffusers'
    QwenImageEditPlusPipeline over the same components with Qwen2-VL's processor (the pack's shipped image
    settings, ComfyUI's vocabulary) with 2511's zero_cond_t."""
    import torch
    from diffusers import QwenImageEditPlusPipeline
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    transformer = _sd(pipe.transformer)
    for name in ("edit_2509", "t2i_2512"):
        _save(transformer, models / "diffusion_models" / names[name])
    _save({**transformer, "__index_timestep_zero__": torch.tensor([])}, models / "diffusion_models" / names["edit_2511"])
    settings = _config_dir("qwenimage") / "processor"
    processor = Qwen2VLProcessor(image_processor=Qwen2VLImageProcessor.from_pretrained(str(settings)),
                                 tokenizer=pipe.tokenizer, video_processor=Qwen2VLVideoProcessor())
    zero = _reconfigured(pipe.transformer, zero_cond_t=True)
    QwenImageEditPlusPipeline.from_pipe(pipe, processor=processor, transformer=zero).save_pretrained(
        str(out / "diffusers" / "ref-qwenimage-edit-2511"), safe_serialization=True)


def _qwen3vl(model_cls, tokenizer, published: str, tiny_config, seed: int, vision_heads: int, tied: bool = True):
    """A tiny Qwen3-VL of class `model_cls` with ComfyUI's vocabulary (`tokenizer`) and the values no tensor
    stores set to what the pack derives for these widths from the published config `published` (text_encoders
    ._llm_sizes, _qwen3vl_vision): the mRoPE split scaled to the head's 8 pairs, the published vision head size
    fitted to 16 wide (4B's 64: one head; 8B's 72: four of 4), the deepstack merger on block 0 of 1, the
    published context length, token ids and tying of lm_head."""
    ids = tokenizer.convert_tokens_to_ids
    config = tiny_config.to_dict()
    pub = json.loads((_config_dir(published) / "text_encoder" / "config.json").read_text())
    rope = {**pub["text_config"]["rope_parameters"], "mrope_section": [3, 2, 3]}  # scaled([24, 20, 20], 8)
    new = type(tiny_config).from_dict({
        **config, "text_config": {**config["text_config"], "vocab_size": len(tokenizer), "rope_parameters": rope,
                                  "pad_token_id": None, "bos_token_id": ids("<|endoftext|>"),
                                  "eos_token_id": ids("<|im_end|>"),
                                  "max_position_embeddings": pub["text_config"]["max_position_embeddings"],
                                  "tie_word_embeddings": tied},
        "vision_config": {**config["vision_config"], "num_heads": vision_heads, "deepstack_visual_indexes": [0]},
        "tie_word_embeddings": tied,
        "image_token_id": ids("<|image_pad|>"), "video_token_id": ids("<|video_pad|>"),
        "vision_start_token_id": ids("<|vision_start|>"), "vision_end_token_id": ids("<|vision_end|>")})
    return _seeded(seed, lambda: model_cls(new))


def qwen3vl_file(model) -> dict:
    """A Qwen3-VL text encoder as ComfyUI's qwen3vl_* files hold it: the original names (`model.layers.*`,
    `visual.*`; comfy/text_encoders/qwen3vl.py), lm_head only where it is not tied to the embeddings (the inverse
    of text_encoders.qwen3vl_keys)."""
    out = {}
    for key, value in _sd(model).items():
        key = key.removeprefix("model.")
        if key.startswith("language_model."):
            out["model." + key[len("language_model."):]] = value
        elif key.startswith("visual.") or (key == "lm_head.weight" and not model.config.tie_word_embeddings):
            out[key] = value
    return out


KREA2_NAMES = {"first.": "img_in.", "tmlp.0.": "time_embed.linear_1.", "tmlp.2.": "time_embed.linear_2.",
               "tproj.1.": "time_mod_proj.", "txtmlp.0.scale": "txt_in.norm.weight", "txtmlp.1.": "txt_in.linear_1.",
               "txtmlp.3.": "txt_in.linear_2.", "txtfusion.": "text_fusion.", "blocks.": "transformer_blocks.",
               "last.linear.": "final_layer.linear.", "last.norm.scale": "final_layer.norm.weight",
               "last.modulation.lin": "final_layer.scale_shift_table"}
KREA2_BLOCK_NAMES = {".attn.wq.": ".attn.to_q.", ".attn.wk.": ".attn.to_k.", ".attn.wv.": ".attn.to_v.",
                     ".attn.wo.": ".attn.to_out.0.", ".attn.gate.": ".attn.to_gate.",
                     ".attn.qknorm.qnorm.scale": ".attn.norm_q.weight", ".attn.qknorm.knorm.scale": ".attn.norm_k.weight",
                     ".mlp.": ".ff.", ".prenorm.scale": ".norm1.weight", ".postnorm.scale": ".norm2.weight",
                     ".mod.lin": ".scale_shift_table"}


def _krea2_transformer_file(transformer) -> dict:
    """Krea 2's transformer in ComfyUI's layout (Krea's original names, the six modulation vectors of a block
    flattened): ComfyUI 0.3.75 has no Krea 2 module, so the names are diffusers' converter's (single_file_utils
    convert_krea2_transformer_checkpoint_to_diffusers) run backwards, and the real converter must give every
    tensor back exactly."""
    import torch
    from diffusers.loaders.single_file_utils import convert_krea2_transformer_checkpoint_to_diffusers

    sd = _sd(transformer)
    out = {}
    for key, value in sd.items():
        for comfy_name, name in KREA2_BLOCK_NAMES.items():
            key = key.replace(name, comfy_name)
        for comfy_name, name in KREA2_NAMES.items():
            if key.startswith(name):
                key = comfy_name + key[len(name):]
                break
        out[key] = value.reshape(-1) if key.startswith("blocks.") and key.endswith(".mod.lin") else value
    back = convert_krea2_transformer_checkpoint_to_diffusers(dict(out))
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd), "not the converter's inverse"
    return out


def _wan_vae_rebuilt(comfy, vae, seed: int, out_path: Path):
    """A Wan-layout VAE (Qwen-Image's) rebuilt in the published layout that diffusers' Wan VAE converter hard-codes
    (2 res blocks, dim_mult [1, 2, 4, 4]), written as ComfyUI's WanVAE holds it (a strict load proves it)."""
    import comfy.ldm.wan.vae
    import torch
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    config = {k: v for k, v in dict(vae.config).items() if not k.startswith("_")}
    vae = _seeded(seed, lambda: type(vae)(**{**config, "num_res_blocks": 2, "dim_mult": [1, 2, 4, 4]}))
    vc = vae.config
    with torch.device("meta"):
        wan = comfy.ldm.wan.vae.WanVAE(dim=vc.base_dim, z_dim=vc.z_dim, dim_mult=vc.dim_mult,
                                       num_res_blocks=vc.num_res_blocks, attn_scales=vc.attn_scales,
                                       temperal_downsample=vc.temperal_downsample)
    sd = probe_invert(convert_wan_vae_to_diffusers, {k: tuple(v.shape) for k, v in wan.state_dict().items()},
                      _sd(vae))
    wan.load_state_dict(sd, strict=True, assign=True)
    _save(sd, out_path)
    return vae


def _krea2(tiny: Path, comfyui_dir: str, out: Path) -> None:
    """Krea 2 Turbo: the tiny pipeline with ComfyUI's Qwen vocabulary (its 34-token prompt prefix is the real
    tokenizer's), Qwen3-VL-4B in ComfyUI's names, Qwen-Image's VAE rebuilt for diffusers' converter."""
    from diffusers import Krea2Pipeline
    from transformers import Qwen2Tokenizer, Qwen3VLModel

    comfy = import_comfy(comfyui_dir)
    pipe = Krea2Pipeline.from_pretrained(str(tiny / "tiny-krea2"), local_files_only=True)
    pipe.tokenizer = Qwen2Tokenizer.from_pretrained(str(_comfy_tokenizers(comfyui_dir) / "text_encoders"
                                                        / "qwen25_tokenizer"))
    pipe.text_encoder = _qwen3vl(Qwen3VLModel, pipe.tokenizer, "krea2", pipe.text_encoder.config, 71, vision_heads=1)
    names, models = FILES["krea2"], out / "models"
    pipe.vae = _wan_vae_rebuilt(comfy, pipe.vae, 72, models / "vae" / names["vae"])
    pipe.register_to_config(is_distilled=True)  # Turbo, as the file name says
    pipe.save_pretrained(str(out / "diffusers" / "ref-krea2"), safe_serialization=True)
    transformer = _krea2_transformer_file(pipe.transformer)
    _save(transformer, models / "diffusion_models" / names["diffusion_model"])
    _save(transformer, models / "diffusion_models" / names["raw"])
    _save(qwen3vl_file(pipe.text_encoder), models / "text_encoders" / names["qwen3vl"])


def _krea2_quant(tiny: Path, comfyui_dir: str, out: Path) -> None:
    """Krea 2 Turbo's int8 ConvRot file: a 256-wide tiny transformer (ConvRot rotates groups of 256 input
    features) reading the tiny Qwen3-VL (32 wide) and VAE (4 channels), each block's attention and feed-forward
    matrices quantized by comfy-kitchen as Comfy-Org's file quantizes them; and the file dequantized."""
    from diffusers import Krea2Transformer2DModel

    transformer = _seeded(91, lambda: Krea2Transformer2DModel(
        in_channels=16, num_layers=2, attention_head_dim=16, num_attention_heads=16, num_key_value_heads=4,
        intermediate_size=256, timestep_embed_dim=32, text_hidden_dim=32, num_text_layers=12,
        text_num_attention_heads=2, text_num_key_value_heads=2, text_intermediate_size=64,
        num_layerwise_text_blocks=1, num_refiner_text_blocks=1, axes_dims_rope=(4, 6, 6)))
    sd = _krea2_transformer_file(transformer)
    plan = {k[: -len(".weight")]: "int8_convrot" for k, v in sd.items()
            if k.startswith("blocks.") and v.ndim == 2 and (".attn.w" in k or ".attn.gate." in k or ".mlp." in k)}
    quantized, _, dequantized = quantize_comfy(sd, plan)
    names, models = FILES["krea2-quant"], out / "models" / "diffusion_models"
    _save(quantized, models / names["int8_convrot"])
    _save(dequantized, models / names["int8_convrot_dequantized"])


def _qwenimage21_vae_file(comfy, vae) -> dict:
    """Qwen-Image 2.1's VAE as qwen_image_2.1_vae_bf16.safetensors holds it. ComfyUI 0.3.75 has no module for it:
    the key names are its Wan 2.2 VAE's (comfy.ldm.wan.vae2_2.WanVAE) at this VAE's five levels, the shapes the
    published file's (4 channels in and out, RGBA without patches; every convolution with a temporal kernel of 1:
    `conv1.weight` [128, 128, 1, 1, 1], `decoder.head.2.weight` [4, 144, 1, 3, 3]), and every value is traced
    through the family's converter, which must produce every diffusers tensor."""
    import comfy.ldm.wan.vae2_2
    import torch

    from backend.families.qwenimage21.convert import qwenimage21_vae

    vc = vae.config
    with torch.device("meta"):
        wan = comfy.ldm.wan.vae2_2.WanVAE(dim=vc.base_dim, dec_dim=vc.decoder_base_dim, z_dim=vc.z_dim,
                                          dim_mult=list(vc.dim_mult), num_res_blocks=vc.num_res_blocks,
                                          temperal_downsample=list(vc.temperal_downsample))
    shapes = {}
    for key, value in wan.state_dict().items():
        shape = list(value.shape)
        if len(shape) == 5:
            shape[2] = 1
        if key == "encoder.conv1.weight":
            shape[1] = vc.in_channels
        if key.startswith("decoder.head.2."):
            shape[0] = vc.out_channels
        shapes[key] = tuple(shape)
    return probe_invert(lambda checkpoint: qwenimage21_vae(checkpoint, {}), shapes, _sd(vae))


def _qwenimage21(tiny: Path, comfyui_dir: str, out: Path) -> None:
    """Qwen-Image 2.1: the tiny pipeline with ComfyUI's Qwen vocabulary and the pack's processor settings,
    Qwen3-VL-8B in ComfyUI's names (untied lm_head, as published), the rotary split the pack derives for 16-wide
    heads ([2, 8, 6]); the transformer file in ComfyUI's layout (fused gate and up rows: diffusers' converter
    splits them back)."""
    import torch
    from diffusers import QwenImage21Pipeline
    from transformers import Qwen3VLForConditionalGeneration, Qwen3VLProcessor

    comfy = import_comfy(comfyui_dir)
    folder = out / "tokenizers" / "qwenimage21-processor"  # as the worker lays it out: ComfyUI's vocabulary,
    folder.mkdir(parents=True, exist_ok=True)  # the pack's processor files over it
    for file in (Path(comfyui_dir) / "comfy" / "text_encoders" / "qwen25_tokenizer").iterdir():
        shutil.copy(file, folder / file.name)
    for file in (_config_dir("qwenimage21") / "processor").iterdir():
        shutil.copy(file, folder / file.name)
    processor = Qwen3VLProcessor.from_pretrained(str(folder))
    pipe = QwenImage21Pipeline.from_pretrained(str(tiny / "tiny-qwenimage21"), local_files_only=True)
    pipe.processor = processor
    pipe.text_encoder = _qwen3vl(Qwen3VLForConditionalGeneration, processor.tokenizer, "qwenimage21",
                                 pipe.text_encoder.config, 81, vision_heads=4, tied=False)
    pipe.transformer = _reconfigured(pipe.transformer, axes_dims_rope=[2, 8, 6])
    pipe.save_pretrained(str(out / "diffusers" / "ref-qwenimage21"), safe_serialization=True)
    names, models = FILES["qwenimage21"], out / "models"
    transformer = {}
    for key, value in _sd(pipe.transformer).items():
        if key.endswith("img_mlp.gate_layer.weight"):
            transformer[key.replace("gate_layer", "gate_up")] = torch.cat([value, _sd(pipe.transformer)[
                key.replace("gate_layer", "proj")]], 0)
        elif not key.endswith("img_mlp.proj.weight"):
            transformer[key] = value
    _save(transformer, models / "diffusion_models" / names["diffusion_model"])
    _save(qwen3vl_file(pipe.text_encoder), models / "text_encoders" / names["qwen3vl"])
    _save(_qwenimage21_vae_file(comfy, pipe.vae), models / "vae" / names["vae"])


# FLUX 3's transformer: diffusers' names -> BFL's (what convert_flux3_transformer_checkpoint_to_diffusers renames)
FLUX3_PREFIXES = {"x_embedders.": "emb_in.", "context_embedder.": "txt_in.", "mode_blocks.": "content_mode_blocks.",
                  "single_transformer_blocks.": "single_blocks."}
FLUX3_SUFFIXES = {"attn.to_q.weight": "q_proj.weight", "attn.to_k.weight": "k_proj.weight",
                  "attn.to_v.weight": "v_proj.weight", "attn.to_out.0.weight": "attn_out.weight",
                  "attn.norm_q.weight": "norm.query_norm.scale", "attn.norm_k.weight": "norm.key_norm.scale",
                  "ff.linear_in.weight": "mlp_in.weight", "ff.linear_out.weight": "mlp_out.weight",
                  ".linear.weight": ".lin.weight"}
FLUX3_KEYS = {"timestep_embedder.linear_1.weight": "time_in.in_layer.weight",
              "timestep_embedder.linear_2.weight": "time_in.out_layer.weight",
              "target_timestep_embedder.linear_1.weight": "ref_time_in.in_layer.weight",
              "target_timestep_embedder.linear_2.weight": "ref_time_in.out_layer.weight",
              "proj_out.weight": "final_layer.image.linear.weight",
              "norm_out.linear.weight": "final_layer.image.adaLN_modulation.1.weight"}


def flux3_transformer_file(transformer) -> dict:
    """FLUX 3's transformer as its flux3-image-klein-* files hold it: BFL's layout (`content_mode_blocks.image.N`,
    `emb_in.image`, `single_blocks.N.q_proj`, `final_layer.image` with shift before scale), the layout diffusers'
    convert_flux3_transformer_checkpoint_to_diffusers reads. ComfyUI 0.3.75 has no FLUX 3 module: the names are
    that converter's run backwards, and the real converter must give every tensor back exactly."""
    import torch
    from diffusers.loaders.single_file_utils import convert_flux3_transformer_checkpoint_to_diffusers

    sd = _sd(transformer)
    out = {}
    for key, value in sd.items():
        if key in FLUX3_KEYS:
            shift_last = key == "norm_out.linear.weight"  # diffusers' [scale, shift] rows, BFL's [shift, scale]
            out[FLUX3_KEYS[key]] = torch.cat(value.chunk(2, dim=0)[::-1], dim=0) if shift_last else value
            continue
        new = next((bfl + key[len(d):] for d, bfl in FLUX3_PREFIXES.items() if key.startswith(d)), key)
        new = next((new[: -len(d)] + bfl for d, bfl in FLUX3_SUFFIXES.items() if new.endswith(d)), new)
        out[new] = value
    back = convert_flux3_transformer_checkpoint_to_diffusers(dict(out))
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd), "not the converter's inverse"
    return out


# ComfyUI's Ideogram 4 transformer (comfy/ldm/ideogram4/model.py, read through the search tool: ComfyUI 0.3.75 has
# no Ideogram 4 module to load into), by its modules: Ideogram4Transformer's input_proj, llm_cond_norm,
# llm_cond_proj, t_embedding (Ideogram4EmbedScalar: mlp_in, mlp_out), adaln_proj, embed_image_indicator and
# final_layer (Ideogram4FinalLayer: norm_final without weights, linear, adaln_modulation); each of its `layers`
# an Ideogram4TransformerBlock: attention (Ideogram4Attention: qkv and o without bias, norm_q, norm_k), feed_forward
# (Lumina's FeedForward: w1, w2, w3 without bias), four RMSNorms and adaln_modulation
IDEOGRAM4_GLOBAL_KEYS = ("input_proj.weight", "input_proj.bias", "llm_cond_norm.weight", "llm_cond_proj.weight",
                         "llm_cond_proj.bias", "t_embedding.mlp_in.weight", "t_embedding.mlp_in.bias",
                         "t_embedding.mlp_out.weight", "t_embedding.mlp_out.bias", "adaln_proj.weight",
                         "adaln_proj.bias", "embed_image_indicator.weight", "final_layer.linear.weight",
                         "final_layer.linear.bias", "final_layer.adaln_modulation.weight",
                         "final_layer.adaln_modulation.bias")
IDEOGRAM4_BLOCK_KEYS = ("attention.qkv.weight", "attention.norm_q.weight", "attention.norm_k.weight",
                        "attention.o.weight", "feed_forward.w1.weight", "feed_forward.w2.weight",
                        "feed_forward.w3.weight", "attention_norm1.weight", "ffn_norm1.weight", "attention_norm2.weight",
                        "ffn_norm2.weight", "adaln_modulation.weight", "adaln_modulation.bias")


def ideogram4_transformer_file(transformer) -> dict:
    """An Ideogram 4 transformer as ComfyUI's ideogram4_* files hold it (ComfyUI keeps no converter for it: its
    module loads the file as it is): ComfyUI's Ideogram4Attention computes q, k and v with one Linear `qkv` whose
    output it views as [3, heads, head size], so its rows are diffusers' to_q, to_k and to_v in that order, and
    calls the output `o`. Checked against ComfyUI's names above (every key, no other) and the shapes its modules
    give them, and the family's converter must give every diffusers tensor back exactly."""
    import torch

    from backend.families.ideogram4.convert import ideogram4_transformer

    sd, c = _sd(transformer), transformer.config
    hidden = c.num_attention_heads * c.attention_head_dim
    out = {}
    for key, value in sd.items():
        if ".attention.to_q." in key:
            out[key.replace(".to_q.", ".qkv.")] = torch.cat([sd[key.replace("to_q", n)] for n in ("to_q", "to_k", "to_v")])
        elif ".attention.to_k." not in key and ".attention.to_v." not in key:
            out[key.replace(".attention.to_out.0.", ".attention.o.")] = value
    assert set(out) == {*IDEOGRAM4_GLOBAL_KEYS, *(f"layers.{i}.{k}" for i in range(c.num_layers)
                                                 for k in IDEOGRAM4_BLOCK_KEYS)}, "not ComfyUI's names"
    assert out["layers.0.attention.qkv.weight"].shape == (3 * hidden, hidden)  # Linear(hidden, hidden * 3)
    assert out["layers.0.attention.o.weight"].shape == (hidden, hidden)
    back = ideogram4_transformer(dict(out), {})
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd), "not the converter's inverse"
    return out


def flux3_wide(flow_map: bool, seed: int = 93):
    """A FLUX 3 transformer 256 wide (ConvRot rotates groups of 256 input features), reading the tiny Qwen3-VL's
    eight stacked hidden states (8 x 32) and the tiny FLUX.2 VAE's 4 channels (2x2 packed: 16)."""
    from diffusers.models.transformers.transformer_flux3 import Flux3Transformer2DModel

    return _seeded(seed, lambda: Flux3Transformer2DModel(
        in_channels=16, cond_in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=16, joint_attention_dim=256, timestep_channels=32, mlp_ratio=3.0,
        axes_dims_rope=(4, 4, 4, 4), flow_map=flow_map))


def _flux3(tiny: Path, comfyui_dir: str, out: Path) -> None:
    """FLUX 3 [klein]: tiny-flux3's (step-distilled) and tiny-flux3-base's transformers as their files, beside
    reference modular folders of the same transformers with Krea 2's tiny Qwen3-VL-4B (its file is theirs too; as
    Qwen3VLForConditionalGeneration, lm_head tied as published), ComfyUI's Qwen vocabulary in a Qwen3VLProcessor
    with the pack's settings (as the worker lays it out), and FLUX.2's tiny VAE (its file flux2-vae-tiny); and a
    256-wide base model's int8 ConvRot file, quantized by comfy-kitchen, beside it dequantized."""
    import diffusers.modular_pipelines as modular
    from diffusers import AutoencoderKLFlux2
    from diffusers.models.transformers.transformer_flux3 import Flux3Transformer2DModel
    from transformers import Qwen3VLForConditionalGeneration, Qwen3VLModel, Qwen3VLProcessor

    from backend.tiny_models import save_pipeline

    refs = out / "diffusers"
    assert (refs / "ref-krea2").is_dir() and (refs / "ref-flux2").is_dir(), "FLUX 3's files come after krea2, flux2"
    folder = out / "tokenizers" / "flux3-processor"
    folder.mkdir(parents=True, exist_ok=True)
    for file in (Path(comfyui_dir) / "comfy" / "text_encoders" / "qwen25_tokenizer").iterdir():
        shutil.copy(file, folder / file.name)
    for file in (_config_dir("flux3") / "tokenizer").iterdir():
        shutil.copy(file, folder / file.name)
    processor = Qwen3VLProcessor.from_pretrained(str(folder))
    qwen = Qwen3VLModel.from_pretrained(str(refs / "ref-krea2" / "text_encoder"))
    text_encoder = _seeded(0, lambda: Qwen3VLForConditionalGeneration(qwen.config))
    text_encoder.model.load_state_dict(qwen.state_dict(), strict=True)
    assert text_encoder.lm_head.weight is text_encoder.model.language_model.embed_tokens.weight, "tied"
    vae = AutoencoderKLFlux2.from_pretrained(str(refs / "ref-flux2" / "vae"))
    names = FILES["flux3"]
    for model, blocks, file in (("flux3", "Flux3DistilledAutoBlocks", "diffusion_model"),
                                ("flux3-base", "Flux3AutoBlocks", "base")):
        transformer = Flux3Transformer2DModel.from_pretrained(str(tiny / f"tiny-{model}" / "transformer"))
        pipe = getattr(modular, blocks)().init_pipeline()
        pipe.update_components(text_encoder=text_encoder, tokenizer=processor, transformer=transformer, vae=vae)
        save_pipeline(pipe, refs / f"ref-{model}")
        _save(flux3_transformer_file(transformer), out / "models" / "diffusion_models" / names[file])
    sd = flux3_transformer_file(flux3_wide(flow_map=False))
    plan = {k[: -len(".weight")]: "int8_convrot" for k, v in sd.items() if v.ndim == 2 and k.endswith(
        ("q_proj.weight", "k_proj.weight", "v_proj.weight", "attn_out.weight", "mlp_in.weight", "mlp_out.weight"))}
    quantized, _, dequantized = quantize_comfy(sd, plan)  # every block's attention and feed-forward
    _save(quantized, out / "models" / "diffusion_models" / names["int8_convrot"])
    _save(dequantized, out / "models" / "diffusion_models" / names["int8_convrot_dequantized"])


def _ideogram4(tiny: Path, comfyui_dir: str, out: Path) -> None:
    """Ideogram 4: the tiny pipeline with ComfyUI's Qwen vocabulary and the pack's tokenizer settings (as the worker
    lays the tokenizer out), Qwen3-VL-8B in ComfyUI's names (36 thin layers, as the tiny one), the rotary split the
    pack derives for 16-wide heads ([2, 1, 1]: the published [24, 20, 20] of 256-wide heads, in proportion),
    FLUX.2's VAE with the GroupNorm groups the pack derives (8), written by ComfyUI's own VAE converter (the tiny
    FLUX.2 and Ideogram 4 VAEs are the same weights, so this is FLUX.2's flux2-vae file, as artists share it); the two
    transformers in ComfyUI's layout, each in its own file as the template loads them, plain and in scaled fp8 (every
    block's matrices, by ComfyUI's own fp8 quantizer)."""
    from diffusers import Ideogram4Pipeline
    from transformers import Qwen2Tokenizer, Qwen3VLModel

    comfy = import_comfy(comfyui_dir)
    folder = out / "tokenizers" / "ideogram4-tokenizer"  # ComfyUI's vocabulary, the pack's files over it
    folder.mkdir(parents=True, exist_ok=True)
    for file in (Path(comfyui_dir) / "comfy" / "text_encoders" / "qwen25_tokenizer").iterdir():
        shutil.copy(file, folder / file.name)
    for file in (_config_dir("ideogram4") / "tokenizer").iterdir():
        shutil.copy(file, folder / file.name)
    pipe = Ideogram4Pipeline.from_pretrained(str(tiny / "tiny-ideogram4"), local_files_only=True)
    pipe.tokenizer = Qwen2Tokenizer.from_pretrained(str(folder))
    pipe.text_encoder = _qwen3vl(Qwen3VLModel, pipe.tokenizer, "ideogram4", pipe.text_encoder.config, 101,
                                 vision_heads=4, tied=False)
    pipe.transformer = _reconfigured(pipe.transformer, mrope_section=[2, 1, 1])
    pipe.unconditional_transformer = _reconfigured(pipe.unconditional_transformer, mrope_section=[2, 1, 1])
    pipe.vae = _reconfigured(pipe.vae, norm_num_groups=8)
    pipe.save_pretrained(str(out / "diffusers" / "ref-ideogram4"), safe_serialization=True)
    names, models = FILES["ideogram4"], out / "models"
    for module, name in ((pipe.transformer, ""), (pipe.unconditional_transformer, "unconditional")):
        sd = ideogram4_transformer_file(module)
        _save(sd, models / "diffusion_models" / names[name or "diffusion_model"])
        linear = [k for k, v in sd.items() if k.startswith("layers.") and k.endswith(".weight") and v.ndim == 2]
        _save(_scaled_fp8(comfy, sd, linear),
              models / "diffusion_models" / names["_".join(filter(None, (name, "fp8_scaled")))])
    _save(qwen3vl_file(pipe.text_encoder), models / "text_encoders" / names["qwen3vl"])
    vae, path = comfy.diffusers_convert.convert_vae_state_dict(_sd(pipe.vae)), models / "vae" / names["vae"]
    if path.exists():  # FLUX.2's, built before: it must hold these weights
        import torch
        from safetensors.torch import load_file

        held = load_file(str(path))
        assert held.keys() == vae.keys() and all(torch.equal(held[k], vae[k]) for k in vae), "not FLUX.2's VAE"
    else:
        _save(vae, path)


def _ideogram4_quant(tiny: Path, comfyui_dir: str, out: Path) -> None:
    """Ideogram 4's int8 ConvRot files (ideogram4_int8_convrot, ideogram4_unconditional_int8_convrot): two
    256-wide tiny transformers (ConvRot rotates groups of 256 input features; 16-wide heads, so the rotary split
    the pack derives, [2, 1, 1]) reading the tiny Qwen3-VL (13 layers of 32) and VAE (4 channels), every block's
    matrices quantized by comfy-kitchen (ConvRot where the input features allow, else int8 per row); and each file
    dequantized."""
    from diffusers import Ideogram4Transformer2DModel

    names, models = FILES["ideogram4-quant"], out / "models" / "diffusion_models"
    for seed, name in ((111, "int8_convrot"), (112, "unconditional_int8_convrot")):
        sd = ideogram4_transformer_file(_seeded(seed, lambda: Ideogram4Transformer2DModel(
            in_channels=16, num_layers=2, attention_head_dim=16, num_attention_heads=16, intermediate_size=256,
            adaln_dim=256, llm_features_dim=13 * 32, rope_theta=5_000_000, mrope_section=(2, 1, 1))))
        plan = {k[: -len(".weight")]: "int8_convrot" if fits("int8_convrot", v.shape) else "int8_rowwise"
                for k, v in sd.items() if k.startswith("layers.") and k.endswith(".weight") and v.ndim == 2}
        quantized, _, dequantized = quantize_comfy(sd, plan)
        _save(quantized, models / names[name])
        _save(dequantized, models / names[f"{name}_dequantized"])


def _zimage_transformer_file(comfy, transformer) -> dict:
    """Z-Image's transformer in ComfyUI's layout (its Lumina 2 `NextDiT` with Z-Image's modulation; fused qkv,
    `final_layer.`, `x_embedder.`): the exact inverse of diffusers' convert_z_image_transformer_checkpoint_to_
    diffusers, named and shaped by ComfyUI's own module and checked by a strict load into it. ComfyUI's module
    also holds a `norm_final` RMSNorm that Z-Image never runs (diffusers' converter drops it): ones here."""
    import comfy.ldm.lumina.model
    import comfy.ldm.modules.diffusionmodules.mmdit
    import comfy.ops
    import torch
    from diffusers.loaders.single_file_utils import convert_z_image_transformer_checkpoint_to_diffusers

    c = transformer.config
    ops = comfy.ops.disable_weight_init
    with torch.device("meta"):
        # multiple_of=1: ComfyUI rounds the feed-forward width up to 256, which the published 10240 already is
        module = comfy.ldm.lumina.model.NextDiT(
            patch_size=c.all_patch_size[0], in_channels=c.in_channels, dim=c.dim, n_layers=c.n_layers,
            n_refiner_layers=c.n_refiner_layers, n_heads=c.n_heads, n_kv_heads=c.n_kv_heads, multiple_of=1,
            ffn_dim_multiplier=8.0 / 3.0, norm_eps=c.norm_eps, qk_norm=c.qk_norm, cap_feat_dim=c.cap_feat_dim,
            axes_dims=list(c.axes_dims), axes_lens=list(c.axes_lens), rope_theta=c.rope_theta,
            z_image_modulation=True, time_scale=c.t_scale, pad_tokens_multiple=32, operations=ops)
        # ComfyUI sizes the timestep MLP as min(dim, 1024) -> 256, which is diffusers' 1024 -> min(dim, 256) only
        # at the published width (3840); the tiny model has diffusers' sizes
        module.t_embedder = comfy.ldm.modules.diffusionmodules.mmdit.TimestepEmbedder(
            1024, output_size=min(c.dim, 256), operations=ops)
    shapes = {k: tuple(v.shape) for k, v in module.state_dict().items() if k != "norm_final.weight"}
    sd = probe_invert(convert_z_image_transformer_checkpoint_to_diffusers, shapes, _sd(transformer))
    sd["norm_final.weight"] = torch.ones(c.dim)
    module.load_state_dict(sd, strict=True, assign=True)  # exactly ComfyUI's layout
    return sd


def _zimage(tiny: Path, comfyui_dir: str, out: Path) -> None:
    """Z-Image (Turbo): ComfyUI's own split files as its Z-Image template lays them out (the diffusion model in
    ComfyUI's layout, Qwen3-4B, FLUX.1's ae.safetensors: the same text encoder and VAE files as FLUX.2 [klein]
    and FLUX.1 here, as artists share them), plus bf16, fp8 and scaled-fp8 variants."""
    import torch
    from diffusers import ZImagePipeline

    comfy = import_comfy(comfyui_dir)
    pipe = ZImagePipeline.from_pretrained(str(tiny / "tiny-zimage"), local_files_only=True)
    pipe.tokenizer, qwen3 = _qwen3(tiny, comfyui_dir, out)  # FLUX.2 [klein]'s file: 32 wide, as the tiny model
    pipe.text_encoder = qwen3.model  # diffusers' Z-Image folders hold Qwen3Model (the model without its LM head)
    pipe.transformer = _reconfigured(pipe.transformer, axes_lens=[1536, 512, 512])  # ComfyUI's, as shipped
    pipe.vae = _reconfigured(pipe.vae, norm_num_groups=8)
    pipe.save_pretrained(str(out / "diffusers" / "ref-zimage"), safe_serialization=True)

    names, models = FILES["zimage"], out / "models"
    comfy_sd = _zimage_transformer_file(comfy, pipe.transformer)
    dm = models / "diffusion_models"
    _save(comfy_sd, dm / names["diffusion_model"])
    saving = comfy.supported_models.ZImage(dict(comfy.supported_models.ZImage.unet_config))
    _save(saving.process_unet_state_dict_for_saving(dict(comfy_sd)), dm / names["comfysave"])
    _save({k: v.to(torch.bfloat16) for k, v in comfy_sd.items()}, dm / names["bf16"])
    _save(_fp8(comfy_sd, torch.float8_e4m3fn), dm / names["fp8"])
    linear = [k for k, v in comfy_sd.items() if v.ndim == 2 and k.endswith(".weight") and k.startswith("layers.")]
    _save(_scaled_fp8(comfy, comfy_sd, linear), dm / names["fp8_scaled"])
    # FLUX.1's ae.safetensors: the tiny FLUX.1 and Z-Image VAEs are the same weights, so this is FLUX.1's file
    _save(comfy.diffusers_convert.convert_vae_state_dict(_sd(pipe.vae)), models / "vae" / names["vae"])
    te = {f"model.{k}": v for k, v in _sd(qwen3.model).items()}  # as ComfyUI's qwen_3_4b: no lm_head
    _save(te, models / "text_encoders" / names["qwen3"])


# ComfyUI's quantized formats (issue 33), written by comfy-kitchen's own quantize: (format, layout, kwargs, the
# comfy_quant fields ComfyUI writes)
QUANT_SPECS = {
    "int8_rowwise": ("int8_tensorwise", "TensorWiseINT8Layout", {"per_channel": True}, {}),
    "int8_convrot": ("int8_tensorwise", "TensorWiseINT8Layout",
                     {"per_channel": True, "convrot": True, "convrot_groupsize": 256},
                     {"convrot": True, "convrot_groupsize": 256}),
    "nvfp4": ("nvfp4", "TensorCoreNVFP4Layout", {}, {}),
    "fp8": ("float8_e4m3fn", "TensorCoreFP8Layout", {}, {}),
    # ConvRot over groups of 16 (a power of 4, as comfy-kitchen's Hadamard needs): the tiny MiniMax H3's layers
    # are 16 to 64 wide, where the released files rotate groups of 64
    "int8_convrot_16": ("int8_tensorwise", "TensorWiseINT8Layout",
                        {"per_channel": True, "convrot": True, "convrot_groupsize": 16},
                        {"convrot": True, "convrot_groupsize": 16}),
}


def quantize_comfy(sd: dict, plan: dict[str, str], markers: str = "tensor") -> tuple[dict, dict, dict]:
    """`sd` in ComfyUI's quantized layout, each layer of `plan` (prefix -> QUANT_SPECS name) quantized by
    comfy-kitchen's own `QuantizedTensor.from_float` and written by its `state_dict_tensors` ("<L>.weight",
    "<L>.weight_scale", ...) with its "<L>.comfy_quant" marker (markers="metadata": in
    __metadata__["_quantization_metadata"] instead); and the same tensors dequantized by comfy-kitchen (float32).
    Returns (file tensors, file metadata, dequantized tensors)."""
    import json

    import comfy_kitchen as ck
    import torch
    from comfy_kitchen.tensor import QuantizedTensor

    out, deq, layers = dict(sd), dict(sd), {}
    with ck.use_backend("eager"):
        for prefix, spec in plan.items():
            fmt, layout, kwargs, extra = QUANT_SPECS[spec]
            w = out.pop(f"{prefix}.weight").to(torch.float32)
            qt = QuantizedTensor.from_float(w, layout, **kwargs)
            for suffix, t in qt.layout_cls.state_dict_tensors(qt._qdata, qt._params).items():
                out[f"{prefix}.weight{suffix}"] = t.contiguous()
            deq[f"{prefix}.weight"] = qt.dequantize().to(torch.float32)
            layers[prefix] = {"format": fmt, **extra}
            if markers == "tensor":
                out[f"{prefix}.comfy_quant"] = torch.tensor(list(json.dumps(layers[prefix]).encode()), dtype=torch.uint8)
    metadata = {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": layers})} \
        if markers == "metadata" else None
    return out, metadata, deq


def zimage_quant_plan(sd: dict, wide: str, narrow: str) -> dict[str, str]:
    """The layers Comfy-Org's z_image_turbo_int8_convrot quantizes (attention qkv and out, feed-forward w1-w3,
    adaLN of every block): `wide` where the input features are a multiple of 256 (ConvRot's groups), else
    `narrow`."""
    plan = {}
    for k, v in sd.items():
        if k.endswith(".weight") and v.ndim == 2 and any(
                s in k for s in (".attention.qkv.", ".attention.out.", ".feed_forward.w", ".adaLN_modulation.0.")):
            plan[k[: -len(".weight")]] = wide if fits(wide, v.shape) else narrow
    return plan


def fits(spec: str, shape: tuple) -> bool:
    """Whether a weight of `shape` takes `spec` unpadded: ConvRot rotates groups of 256 input features; nvfp4
    pads to 16x16 blocks (published models' sizes are multiples of 16; a padded layer's true size is not in the
    file)."""
    return {"int8_convrot": shape[1] % 256 == 0, "nvfp4": shape[0] % 16 == 0 and shape[1] % 16 == 0}.get(spec, True)


def zimage_wide(seed: int = 33):
    """A tiny Z-Image transformer 256 wide (ConvRot rotates groups of 256 input features), reading the tiny
    Qwen3 (32 wide) and VAE (4 channels)."""
    from diffusers import ZImageTransformer2DModel

    return _seeded(seed, lambda: ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=256, n_layers=2, n_refiner_layers=1,
        n_heads=2, n_kv_heads=2, cap_feat_dim=32, axes_dims=[32, 48, 48], axes_lens=[1536, 512, 512]))


def _zimage_quant(tiny: Path, comfyui_dir: str, out: Path) -> None:
    """ComfyUI's quantized Z-Image files as Comfy-Org's templates name them: the diffusion model in int8 ConvRot
    and in nvfp4 + fp8 ("fp4 mixed"), Qwen3 in fp8 + nvfp4 ("fp8 mixed", markers in the metadata, layer 0 left
    bf16 as Comfy-Org's are partly), each beside the same file dequantized by comfy-kitchen ("-dequantized",
    float32), and the 256-wide model in bfloat16 (the benchmark's and the tests' reference)."""
    import torch
    from safetensors.torch import load_file

    comfy = import_comfy(comfyui_dir)
    names, models = FILES["zimage-quant"], out / "models"
    dm, te = models / "diffusion_models", models / "text_encoders"
    comfy_sd = _zimage_transformer_file(comfy, zimage_wide())
    _save({k: v.to(torch.bfloat16) for k, v in comfy_sd.items()}, dm / names["bf16"])
    for name, wide, narrow in (("int8_convrot", "int8_convrot", "int8_rowwise"), ("fp4_mixed", "nvfp4", "fp8")):
        sd, meta, deq = quantize_comfy(comfy_sd, zimage_quant_plan(comfy_sd, wide, narrow))
        _save(sd, dm / names[name], meta)
        _save(deq, dm / names[f"{name}_dequantized"])
    qwen = load_file(str(models / "text_encoders" / FILES["zimage"]["qwen3"]))
    plan = {k[: -len(".weight")]: ("nvfp4" if ".mlp." in k and fits("nvfp4", v.shape) else "fp8")
            for k, v in qwen.items() if k.endswith("_proj.weight") and not k.startswith("model.layers.0.")}
    plan["model.embed_tokens"] = "int8_rowwise"  # ComfyUI quantizes text encoders' embeddings too (int8, fp8)
    sd, meta, deq = quantize_comfy({k: v.to(torch.bfloat16) for k, v in qwen.items()}, plan, markers="metadata")
    _save(sd, te / names["qwen3_fp8_mixed"], meta)
    _save(deq, te / names["qwen3_fp8_mixed_dequantized"])


def _qwenimage_quant(tiny: Path, comfyui_dir: str, out: Path) -> None:
    """Qwen-Image-Edit-2511 in int8 as Comfy-Org's qwen_image_edit_2511_int8_convrot (every Linear of the blocks;
    the tiny model is too narrow for ConvRot's groups of 256, so per row), from the tiny 2511 file (after
    "qwenimage"), quantized by comfy-kitchen; for the template workflow."""
    from safetensors.torch import load_file

    dm = out / "models" / "diffusion_models"
    for source, name in (("edit_2511", "edit_2511_int8"), ("diffusion_model", "t2i_int8")):  # t2i: the layouts' tests
        sd = load_file(str(dm / FILES["qwenimage"][source]))
        plan = {k[: -len(".weight")]: "int8_convrot" if fits("int8_convrot", v.shape) else "int8_rowwise"
                for k, v in sd.items() if k.startswith("transformer_blocks.") and k.endswith(".weight") and v.ndim == 2}
        quantized, meta, _ = quantize_comfy(sd, plan)
        _save(quantized, dm / FILES["qwenimage-quant"][name], meta)


def spiece_model() -> bytes:
    """A small SentencePiece (unigram) model trained here on the tiny pipelines' words and a few others, with
    UMT5's numbering (pad 0, end 1, unknown 2) and SentencePiece's default nmt_nfkc normalization (UMT5's)."""
    import io

    import sentencepiece

    from backend.families.tiny_parts import WORDS as _WORDS

    text = " ".join(_WORDS) + " fox snow blurry ＡＢＣ café naïve 123"
    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([text] * 20), model_writer=out, vocab_size=120, model_type="unigram", pad_id=0,
        eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False, num_threads=1, minloglevel=2)
    return out.getvalue()


def _wan_transformer_file(comfy, transformer) -> dict:
    """A Wan transformer in Wan's (and ComfyUI's) layout: the exact inverse of diffusers' convert_wan_transformer_
    to_diffusers, named and shaped by ComfyUI's own WanModel and checked by a strict load into it."""
    import comfy.ldm.wan.model
    import comfy.ops
    import torch
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    c = transformer.config
    with torch.device("meta"):
        module = comfy.ldm.wan.model.WanModel(
            model_type="i2v" if c.image_dim else "t2v", patch_size=tuple(c.patch_size), in_dim=c.in_channels, dim=c.num_attention_heads *
            c.attention_head_dim, ffn_dim=c.ffn_dim, freq_dim=c.freq_dim, text_dim=c.text_dim, out_dim=c.out_channels,
            num_heads=c.num_attention_heads, num_layers=c.num_layers, operations=comfy.ops.disable_weight_init)
    sd = probe_invert(convert_wan_transformer_to_diffusers, {k: tuple(v.shape) for k, v in module.state_dict().items()},
                      _sd(transformer))
    module.load_state_dict(sd, strict=True, assign=True)  # exactly ComfyUI's layout
    return sd


def _wan_vae_file(comfy, vae) -> dict:
    """A Wan VAE in Wan's (and ComfyUI's) layout. Wan 2.1's: the exact inverse of diffusers' converter, shaped by
    ComfyUI's WanVAE. Wan 2.2's (diffusers has no converter): the inverse of the pack's (worker/loading.py), shaped
    by ComfyUI's Wan 2.2 WanVAE, and checked by decoding one latent with ComfyUI's module and diffusers' model."""
    import comfy.ldm.wan.vae
    import comfy.ldm.wan.vae2_2
    import torch
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    from backend.families.wan.convert import convert_wan22_vae

    c = vae.config
    common = dict(dim=c.base_dim, z_dim=c.z_dim, dim_mult=list(c.dim_mult), num_res_blocks=c.num_res_blocks,
                  attn_scales=list(c.attn_scales), temperal_downsample=list(c.temperal_downsample))
    if c.is_residual:
        module = comfy.ldm.wan.vae2_2.WanVAE(dec_dim=c.decoder_base_dim, **common)
        converter = lambda checkpoint: convert_wan22_vae(checkpoint)  # noqa: E731
    else:
        module = comfy.ldm.wan.vae.WanVAE(**common)
        converter = convert_wan_vae_to_diffusers
    sd = probe_invert(converter, {k: tuple(v.shape) for k, v in module.state_dict().items()}, _sd(vae))
    module.load_state_dict(sd, strict=True)
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        latent = torch.randn(1, c.z_dim, 2, 2, 2)
        theirs = module.eval().decode(latent).clamp(-1, 1)
        ours = vae.decode(latent).sample
    assert torch.allclose(theirs, ours, atol=1e-5), float((theirs - ours).abs().max())  # the same decoder
    return sd


def _clip_vision(comfy, published: Path):
    """A CLIP vision encoder of clip_vision_h's width (1280, heads of 80) with 2 layers, 32x32 images in 8-pixel
    patches, as transformers' CLIPVisionModel (what diffusers' Wan image to video reads) and as its file in
    ComfyUI's models/clip_vision (Comfy-Org's layout: transformers' CLIPVisionModelWithProjection, float16),
    checked by a strict load into ComfyUI's own CLIPVisionModelProjection. The weights are rounded to float16 in
    both."""
    import comfy.clip_model
    import comfy.ops
    import torch
    from transformers import CLIPVisionConfig, CLIPVisionModel, CLIPVisionModelWithProjection

    from backend.protocol.spec import read_json

    config = {**read_json(published / "image_encoder" / "config.json"), "intermediate_size": 32,
              "num_hidden_layers": 2, "image_size": 32, "patch_size": 8, "projection_dim": 32}
    config.pop("architectures", None)
    with_projection = _seeded(90, lambda: CLIPVisionModelWithProjection(CLIPVisionConfig(**config)))
    sd = {k: v.half() for k, v in _sd(with_projection).items()}
    with torch.device("meta"):
        theirs = comfy.clip_model.CLIPVisionModelProjection(config, None, None, comfy.ops.disable_weight_init)
    theirs.load_state_dict(sd, strict=True, assign=True)  # exactly ComfyUI's layout
    vision = CLIPVisionModel(CLIPVisionConfig(**config))
    prefix = "vision_model."  # transformers 5 names CLIPVisionModel's own keys without it (and reads files with it)
    vision.load_state_dict({k[len(prefix):]: v.float() for k, v in sd.items() if k.startswith(prefix)}, strict=True)
    return vision.eval(), sd


def _wan(tiny: Path, comfyui_dir: str, out: Path) -> None:
    """Wan: 2.1 text to video (tiny-wan's transformer), 2.2 A14B (two experts of its shape), its image-to-video pair
    (in channels 2 · 4 + 4, as the published 36 for 16; no image encoder) and 2.2 TI2V 5B
    (48 latent channels, Wan 2.2's VAE), with one UMT5 file holding its SentencePiece model (`spiece_model`, as
    Comfy-Org's umt5_xxl files do) in float32 and ComfyUI's scaled fp8. The configs are the pack's published
    ones (the Wan family's configs/) with the tiny widths; the heads are 8 wide (the published 128 halved to the width)."""
    import tempfile

    import diffusers
    import torch
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanTransformer3DModel
    from transformers import CLIPImageProcessor, T5TokenizerFast, UMT5Config, UMT5EncoderModel

    from backend.protocol.spec import read_json
    from backend.worker.loading import _spiece_tokenizer

    comfy = import_comfy(comfyui_dir)
    names, models = FILES["wan"], out / "models"
    spiece = spiece_model()
    published = {folder: _config_dir(folder) for folder in ("wan21-t2v-1.3b", "wan21-i2v-14b", "wan22-t2v-a14b",
                                                            "wan22-i2v-a14b", "wan22-ti2v-5b")}
    te_config = read_json(published["wan21-t2v-1.3b"] / "text_encoder" / "config.json")
    with tempfile.TemporaryDirectory() as tmp:
        probe = _save({"spiece_model": torch.frombuffer(bytearray(spiece), dtype=torch.uint8)}, Path(tmp) / "te.sft")
        _spiece_tokenizer(probe, published["wan21-t2v-1.3b"] / "tokenizer", Path(tmp) / "tokenizer")
        tokenizer = T5TokenizerFast.from_pretrained(str(Path(tmp) / "tokenizer"))
    te = UMT5Config.from_dict({**te_config, "vocab_size": len(tokenizer), "d_model": 32, "d_kv": 8, "d_ff": 64,
                               "num_layers": 2, "num_heads": 4, "relative_attention_num_buckets": 8})
    text_encoder = _seeded(81, lambda: UMT5EncoderModel(te))
    tiny_wan = WanTransformer3DModel.from_pretrained(str(tiny / "tiny-wan"), subfolder="transformer")

    def transformer(folder: str, seed: int, **sizes):
        config = {**read_json(published[folder] / "transformer" / "config.json"), "attention_head_dim": 8,
                  "num_attention_heads": 3, "ffn_dim": 32, "freq_dim": 16, "num_layers": 2, "text_dim": 32, **sizes}
        return _seeded(seed, lambda: WanTransformer3DModel.from_config(config))

    def vae(folder: str, seed: int, **sizes):
        config = {**read_json(published[folder] / "vae" / "config.json"), "base_dim": 8, **sizes}
        if config["z_dim"] != read_json(published[folder] / "vae" / "config.json")["z_dim"]:  # as the pack does
            config.update(latents_mean=[0.0] * config["z_dim"], latents_std=[1.0] * config["z_dim"])
        return _seeded(seed, lambda: AutoencoderKLWan.from_config(config))

    def pipeline(folder: str, **parts):
        scheduler = UniPCMultistepScheduler.from_config(read_json(published[folder] / "scheduler" / "scheduler_config.json"))
        index = read_json(published[folder] / "model_index.json")
        return getattr(diffusers, index["_class_name"])(
            tokenizer=tokenizer, text_encoder=text_encoder, scheduler=scheduler,
            boundary_ratio=index.get("boundary_ratio"), expand_timesteps=index.get("expand_timesteps", False), **parts)

    wan21 = transformer("wan21-t2v-1.3b", 0, in_channels=4, out_channels=4)
    # tiny-wan's weights (heads of the pack's width), rounded to float16 as the file stores them
    wan21.load_state_dict({k: v.half().float() for k, v in tiny_wan.state_dict().items()}, strict=True)
    vae21 = vae("wan21-t2v-1.3b", 82, z_dim=4)  # Wan 2.1's layout (2 res blocks, [1, 2, 4, 4]): its converter's
    high, low = (transformer("wan22-t2v-a14b", seed, in_channels=4, out_channels=4) for seed in (83, 84))
    # the image-to-video experts read the noise, the start image's latents and their 4-channel mask
    i2v_high, i2v_low = (transformer("wan22-i2v-a14b", seed, in_channels=12, out_channels=4) for seed in (87, 88))
    ti2v = transformer("wan22-ti2v-5b", 85)
    # Wan 2.1 image to video: ComfyUI's WanModel reads 1280-wide CLIP features (clip_vision_h's, fixed in it), so
    # the image embedding and the CLIP vision encoder are that wide (2 layers, 16 heads of 80 as ViT-H's)
    i2v21 = transformer("wan21-i2v-14b", 89, in_channels=12, out_channels=4, added_kv_proj_dim=24)
    i2v21.load_state_dict({k: v.half().float() for k, v in i2v21.state_dict().items()}, strict=True)
    vision, clip_vision_file = _clip_vision(comfy, published["wan21-i2v-14b"])
    processor = CLIPImageProcessor.from_pretrained(str(published["wan21-i2v-14b"] / "image_processor"),
                                                   size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    vae22 = vae("wan22-ti2v-5b", 86, decoder_base_dim=16)  # the published layout: widths alone are read
    refs = {"ref-wan21": pipeline("wan21-t2v-1.3b", transformer=wan21, vae=vae21),
            "ref-wan22-a14b": pipeline("wan22-t2v-a14b", transformer=high, transformer_2=low, vae=vae21),
            "ref-wan22-i2v-a14b": pipeline("wan22-i2v-a14b", transformer=i2v_high, transformer_2=i2v_low, vae=vae21),
            "ref-wan21-i2v": pipeline("wan21-i2v-14b", transformer=i2v21, vae=vae21, image_encoder=vision,
                                      image_processor=processor),
            "ref-wan22-5b": pipeline("wan22-ti2v-5b", transformer=ti2v, vae=vae22)}
    for name, pipe in refs.items():
        pipe.save_pretrained(str(out / "diffusers" / name), safe_serialization=True)

    dm = models / "diffusion_models"
    wan21_sd = _wan_transformer_file(comfy, wan21)
    _save({k: v.to(torch.float16) if v.is_floating_point() else v for k, v in wan21_sd.items()}, dm / names["diffusion_model"])
    linear = [k for k, v in wan21_sd.items() if v.ndim == 2 and k.endswith(".weight") and k.startswith("blocks.")]
    _save(_scaled_fp8(comfy, wan21_sd, linear), dm / names["fp8_scaled"])
    for key, module in (("high_noise", high), ("low_noise", low), ("i2v_high_noise", i2v_high),
                        ("i2v_low_noise", i2v_low), ("ti2v", ti2v)):
        _save(_wan_transformer_file(comfy, module), dm / names[key])
    _save({k: v.to(torch.float16) for k, v in _wan_transformer_file(comfy, i2v21).items()}, dm / names["i2v21"])
    _save(clip_vision_file, models / "clip_vision" / names["clip_vision"])
    _save(_wan_vae_file(comfy, vae21), models / "vae" / names["vae"])
    _save(_wan_vae_file(comfy, vae22), models / "vae" / names["vae22"])
    umt5 = _sd(text_encoder)
    umt5.pop("encoder.embed_tokens.weight", None)  # tied to shared.weight; ComfyUI's files hold shared only
    tokenizer_tensor = {"spiece_model": torch.frombuffer(bytearray(spiece), dtype=torch.uint8)}
    _save({**umt5, **tokenizer_tensor}, models / "text_encoders" / names["umt5"])
    matrices = [k for k, v in umt5.items() if v.ndim == 2 and k.startswith("encoder.block.")]
    _save({**_scaled_fp8(comfy, umt5, matrices), **tokenizer_tensor}, models / "text_encoders" / names["umt5_fp8_scaled"])


def flux1_published_width():
    """A FLUX.1 transformer of the published width (3072: 24 heads of 128, MLP ratio 4), with 1 double and
    1 single block and the tiny text encoders' and VAE's widths, in bfloat16 (about 1 GB). Deterministic.

    Built on the meta device and filled from one seeded pool of random values, each tensor from its own offset
    (so no two tensors hold the same values): torch's default initialisers draw 530 million values, seconds of
    CPU each time the tests build it (here and again as the test's reference)."""
    import torch
    from diffusers import FluxTransformer2DModel

    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            module = FluxTransformer2DModel(
                in_channels=16, num_layers=1, num_single_layers=1, joint_attention_dim=32, pooled_projection_dim=32,
                guidance_embeds=True)
    finally:
        torch.set_default_dtype(default)
    module = module.to_empty(device="cpu")
    pool = torch.empty(2**22 + 9, dtype=torch.bfloat16).uniform_(-0.02, 0.02, generator=torch.Generator().manual_seed(71))
    for i, (_, tensor) in enumerate(sorted(module.state_dict().items())):
        start = i * 65_537 % pool.numel()
        ring, flat = torch.cat([pool[start:], pool[:start]]), tensor.view(-1)
        for at in range(0, flat.numel(), ring.numel()):
            part = flat[at:at + ring.numel()]
            part.copy_(ring[:part.numel()])
    return module.eval()


def _flux1_3072(tiny: Path, comfyui_dir: str, out: Path) -> None:
    comfy = import_comfy(comfyui_dir)
    transformer = flux1_published_width()
    bfl = comfy.model_detection.convert_diffusers_mmdit(_sd(transformer), "")
    del transformer
    _save(bfl, out / "models" / "diffusion_models" / FILES["flux1-3072"]["diffusion_model"])


def _flux1tools(tiny: Path, comfyui_dir: str, out: Path) -> None:
    """The FLUX.1 tools as BFL publishes them (dev-like: a guidance embedding): Kontext with FLUX.1 [dev]'s tensors,
    Fill reading latents + masked image latents + the mask (a VAE pixel block per packed channel: 16 + 16 + 4·8²
    input channels), Depth/Canny reading latents + control image latents (16 + 16); each 16 output channels.
    Random weights the size of ref-flux1's transformer, written as ComfyUI holds FLUX.1 files; each transformer
    also as a diffusers folder (`diffusers/ref-flux1-<tool>/transformer`) for the plain diffusers reference,
    which uses ref-flux1's other components and the published dev schedule."""
    from diffusers import FluxTransformer2DModel

    build(out, tiny, comfyui_dir, ("flux1",))
    comfy = import_comfy(comfyui_dir)
    config = {k: v for k, v in FluxTransformer2DModel.load_config(str(out / "diffusers" / "ref-flux1"),
                                                                 subfolder="transformer").items()
              if not k.startswith("_")}
    latents = config["in_channels"]  # 4 VAE channels, 2x2 packed
    mask = 4 * 8 * 8  # the VAE's 8x8 pixel block of the mask, 2x2 packed
    inputs = {"kontext": latents, "fill": 2 * latents + mask, "depth": 2 * latents}
    for i, (tool, channels) in enumerate(inputs.items()):
        transformer = _seeded(40 + i, lambda c=channels: FluxTransformer2DModel(
            **{**config, "in_channels": c, "out_channels": latents, "guidance_embeds": True}))
        transformer.save_pretrained(str(out / "diffusers" / f"ref-flux1-{tool}" / "transformer"))
        bfl = comfy.model_detection.convert_diffusers_mmdit(_sd(transformer), "")
        _save(bfl, out / "models" / "diffusion_models" / FILES["flux1tools"][tool])


def _flux1redux(tiny: Path, comfyui_dir: str, out: Path) -> None:
    """FLUX.1 Redux for ref-flux1 (T5 32 wide): a SigLIP vision model of the published image size and patch (384,
    14: 729 tokens) 16 wide, 2 layers, with its attention-pooling head as transformers saves it (4 heads of 4: what
    the pack derives for this width from the published head size 72), and a ReduxImageEncoder 16 -> 32. The
    files hold the layout ComfyUI's loaders read, proved by loading them into ComfyUI's own modules (its SigLIP
    drops the head, as its Load CLIP Vision does): diffusers' keys for the embedder; for the vision models
    transformers' keys under `vision_model.` (transformers 5 saves SiglipVisionModel without that prefix and
    reads it with or without). Both also as diffusers folders (`diffusers/ref-flux1-redux`) for the plain
    FluxPriorReduxPipeline."""
    import torch
    from diffusers.pipelines.flux.modeling_flux import ReduxImageEncoder
    from transformers import CLIPVisionConfig, CLIPVisionModel, SiglipVisionConfig, SiglipVisionModel

    build(out, tiny, comfyui_dir, ("flux1",))
    import_comfy(comfyui_dir)
    import comfy.clip_model as comfy_clip
    import comfy.ldm.flux.redux as comfy_redux
    import comfy.ops as comfy_ops

    names, models, ref = FILES["flux1redux"], out / "redux-models", out / "diffusers" / "ref-flux1-redux"
    sizes = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
             "image_size": 384, "patch_size": 14}
    siglip = _seeded(50, lambda: SiglipVisionModel(SiglipVisionConfig(hidden_act="gelu_pytorch_tanh", **sizes)))
    embedder = _seeded(51, lambda: ReduxImageEncoder(redux_dim=16, txt_in_features=32))
    siglip.save_pretrained(str(ref / "image_encoder"))
    embedder.save_pretrained(str(ref / "image_embedder"))
    comfy_siglip = comfy_clip.CLIPVisionModelProjection(
        {**sizes, "num_channels": 3, "hidden_act": "gelu_pytorch_tanh", "model_type": "siglip_vision_model"},
        torch.float32, "cpu", comfy_ops.manual_cast)
    vision_sd = _vision_file(siglip)
    missing, unexpected = comfy_siglip.load_state_dict(vision_sd, strict=False)
    assert not missing and all(k.startswith("vision_model.head.") for k in unexpected), (missing, unexpected)
    comfy_redux.ReduxImageEncoder(16, 32).load_state_dict(_sd(embedder), strict=True)
    _save(vision_sd, models / "clip_vision" / names["siglip"])
    _save(_sd(embedder), models / "style_models" / names["style"])
    _save(_sd(_seeded(52, lambda: ReduxImageEncoder(redux_dim=16, txt_in_features=64))),
          models / "style_models" / names["style_wide"])
    vit = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
                           image_size=28, patch_size=14, projection_dim=16)
    _save(_vision_file(_seeded(53, lambda: CLIPVisionModel(vit))), models / "clip_vision" / names["clip_vit"])


def _vision_file(model) -> dict:
    """A transformers vision model as ComfyUI's clip_vision files hold it: every key under `vision_model.`."""
    return {k if k.startswith("vision_model.") else f"vision_model.{k}": v for k, v in _sd(model).items()}


def _flux1_vae(tiny: Path, comfyui_dir: str, out: Path) -> None:
    """A FLUX.1 VAE file that ComfyUI's VAELoader reads: its LDM VAE has fixed sizes (128 channels, multipliers
    [1, 2, 4, 4], 2 res blocks; only the latent channels are read from the file), so a tiny one does not load.
    This one has the published layout with the tiny FLUX.1's 4 latent channels (random weights, bfloat16)."""
    import torch
    from diffusers import AutoencoderKL

    comfy = import_comfy(comfyui_dir)
    vae = _seeded(21, lambda: AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=4, norm_num_groups=32,
        scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False))
    sd = comfy.diffusers_convert.convert_vae_state_dict(_sd(vae))
    _save({k: v.to(torch.bfloat16) for k, v in sd.items()}, out / "models" / "vae" / FILES["flux1-vae"]["vae"])


# ---- LTX-2.3: Lightricks' names (ComfyUI keeps them), from diffusers' by the inverse of diffusers' renames
# (loaders/single_file_utils.py's LTX-2 converters, scripts/convert_ltx2_to_diffusers.py's connector and vocoder
# tables); the builder checks diffusers' converters give the diffusers names back, and each name against ComfyUI's
# modules as read (comfy/ldm/lightricks/av_model.py: patchify_proj, adaln_single, prompt_adaln_single,
# av_ca_*_adaln_single, scale_shift_table_a2v_ca_*, q_norm/k_norm, video_embeddings_connector (Embeddings1DConnector:
# transformer_1d_blocks), text_encoders/lt.py: text_embedding_projection, vocoders/vocoder.py: conv_pre, ups,
# resblocks, conv_post); diffusers' own detection of an LTX-2 checkpoint (CHECKPOINT_KEY_NAMES["ltx2"]) is checked
# on the file in tests/test_ltx2_files.py

_LTX2_TOP = (("audio_proj_in.", "audio_patchify_proj."), ("proj_in.", "patchify_proj."),
             ("audio_time_embed.", "audio_adaln_single."), ("time_embed.", "adaln_single."),
             ("audio_prompt_adaln.", "audio_prompt_adaln_single."), ("prompt_adaln.", "prompt_adaln_single."),
             ("av_cross_attn_video_scale_shift.", "av_ca_video_scale_shift_adaln_single."),
             ("av_cross_attn_video_a2v_gate.", "av_ca_a2v_gate_adaln_single."),
             ("av_cross_attn_audio_scale_shift.", "av_ca_audio_scale_shift_adaln_single."),
             ("av_cross_attn_audio_v2a_gate.", "av_ca_v2a_gate_adaln_single."))
_LTX2_INNER = ((".video_a2v_cross_attn_scale_shift_table", ".scale_shift_table_a2v_ca_video"),
               (".audio_a2v_cross_attn_scale_shift_table", ".scale_shift_table_a2v_ca_audio"),
               (".norm_q.", ".q_norm."), (".norm_k.", ".k_norm."))


def _ltx2_native(sd: dict, top=_LTX2_TOP, inner=_LTX2_INNER) -> dict:
    """diffusers' names -> Lightricks': `top` by prefix, `inner` anywhere."""
    out = {}
    for key, value in sd.items():
        key = next((new + key[len(old):] for old, new in top if key.startswith(old)), key)
        for old, new in inner:
            key = key.replace(old, new)
        out[key] = value
    return out


def _ltx2_vae_native(sd: dict) -> dict:
    import re

    def stage(m):
        side, kind, i, rest = m.group(1), m.group(2), int(m.group(3)), m.group(4)
        if kind == "down":
            index = 2 * i + 1 if rest.startswith("downsamplers.0.") else 2 * i
        else:
            index = 2 * i + 1 if rest.startswith("upsamplers.0.") else 2 * i + 2
        rest = rest.replace("downsamplers.0.", "").replace("upsamplers.0.", "")
        return f"{side}.{kind}_blocks.{index}.{rest}"

    out = {}
    for key, value in sd.items():
        key = re.sub(r"^(encoder|decoder)\.(down|up)_blocks\.(\d+)\.(.*)$", stage, key)
        key = key.replace("encoder.mid_block.", "encoder.down_blocks.8.").replace("decoder.mid_block.", "decoder.up_blocks.0.")
        key = key.replace(".resnets.", ".res_blocks.").replace("latents_mean", "per_channel_statistics.mean-of-means")
        out[key.replace("latents_std", "per_channel_statistics.std-of-means")] = value
    return out


def _ltx2_connector_name(key: str) -> str:
    """A key of diffusers' LTX2TextConnectors -> ComfyUI's: the connectors' blocks in the DiT
    (`model.diffusion_model.*_embeddings_connector`), their text projection beside the text encoder
    (`text_embedding_projection.*_aggregate_embed`)."""
    for old, new in (("video_connector.", "model.diffusion_model.video_embeddings_connector."),
                     ("audio_connector.", "model.diffusion_model.audio_embeddings_connector."),
                     ("video_text_proj_in.", "text_embedding_projection.video_aggregate_embed."),
                     ("audio_text_proj_in.", "text_embedding_projection.audio_aggregate_embed.")):
        if key.startswith(old):
            return new + _ltx2_native({key[len(old):]: None}, top=()).popitem()[0].replace(
                "transformer_blocks.", "transformer_1d_blocks.", 1)
    raise KeyError(f"not a key of LTX-2's connectors: {key}")


def _fp8_rounded(module):
    """`module` with its matrices and convolutions rounded through float8_e4m3fn, as the fp8 file stores them."""
    import torch

    with torch.no_grad():
        for value in module.state_dict().values():
            if value.is_floating_point() and value.ndim >= 2:
                value.copy_(value.to(torch.float8_e4m3fn).to(value.dtype))
    return module


def _ltx2(tiny: Path, comfyui_dir: str, out: Path) -> None:
    """LTX-2.3 as its templates load it: tiny-ltx2 with LTX-2.3's published values that change no tensor
    (double-precision rotary, the connectors' rotary length, the decoder's residual
    upsampling, the audio VAE's resolution; Gemma 3's attention scale and window) and its weights rounded through
    fp8 as the checkpoint stores them; Gemma 3 as ComfyUI's file holds it (transformers' Gemma3ForCausalLM names,
    without lm_head, and its SentencePiece model in `spiece_model`), its tokenizer the one the pack makes of it."""
    import io

    import sentencepiece
    import torch
    from diffusers import LTX2Pipeline
    from diffusers.loaders.single_file_utils import (
        convert_ltx2_audio_vae_to_diffusers,
        convert_ltx2_transformer_to_diffusers,
        convert_ltx2_vae_to_diffusers,
    )
    from transformers import Gemma3ForCausalLM, GemmaTokenizer

    from backend.families.ltx2.convert import connectors, gemma_tokenizer, prompt_adaln, vocoder
    from backend.families.tiny_parts import WORDS as _WORDS

    pipe = LTX2Pipeline.from_pretrained(str(tiny / "tiny-ltx2"), local_files_only=True)
    names, models = FILES["ltx2"], out / "models"
    pipe.transformer = _fp8_rounded(_reconfigured(pipe.transformer, rope_double_precision=True))
    pipe.connectors = _fp8_rounded(_reconfigured(pipe.connectors, rope_double_precision=True,
                                                 connector_rope_base_seq_len=4096))
    pipe.vae = _fp8_rounded(_reconfigured(pipe.vae, upsample_residual=[True, True, True]))
    pipe.audio_vae = _fp8_rounded(_reconfigured(pipe.audio_vae, resolution=256))
    pipe.vocoder = _fp8_rounded(pipe.vocoder)
    text = pipe.text_encoder.config.text_config.to_dict()
    text.update(query_pre_attn_scalar=256, sliding_window=1024, max_position_embeddings=131072, architectures=None)
    gemma = Gemma3ForCausalLM(type(pipe.text_encoder.config.text_config).from_dict(text)).eval()
    language = pipe.text_encoder.model.language_model.state_dict()
    gemma.model.load_state_dict(language, strict=True)
    gemma.tie_weights()
    spm = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([" ".join(_WORDS) + " fox snow blurry"] * 20), model_writer=spm, vocab_size=320,
        model_type="bpe", pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>",
        bos_piece="<bos>", unk_piece="<unk>", byte_fallback=True, hard_vocab_limit=False, num_threads=1,
        minloglevel=2)
    gemma_sd = {f"model.{k}": v for k, v in gemma.model.state_dict().items()}
    gemma_sd["spiece_model"] = torch.frombuffer(bytearray(spm.getvalue()), dtype=torch.uint8)
    gemma_file = _save(gemma_sd, models / "text_encoders" / names["gemma3"])
    # fp4 mixed as _zimage_quant writes Qwen3's: the MLP in nvfp4, attention in fp8, the embedding in int8, layer 0 left
    plan = {k[: -len(".weight")]: ("nvfp4" if ".mlp." in k and fits("nvfp4", v.shape) else "fp8")
            for k, v in gemma_sd.items() if k.endswith("_proj.weight") and not k.startswith("model.layers.0.")}
    plan["model.embed_tokens"] = "int8_rowwise"
    quant, meta, deq = quantize_comfy({k: v.to(torch.bfloat16) if v.is_floating_point() else v
                                       for k, v in gemma_sd.items()}, plan, markers="metadata")
    _save(quant, models / "text_encoders" / names["gemma3_fp4_mixed"], meta)
    _save(deq, models / "text_encoders" / names["gemma3_fp4_mixed_dequantized"])
    folder = out / "tokenizers" / "ltx2-gemma"
    gemma_tokenizer(gemma_file, _config_dir("ltx-2.3") / "tokenizer", folder)
    pipe.tokenizer, pipe.text_encoder = GemmaTokenizer.from_pretrained(str(folder)), gemma
    assert len(pipe.tokenizer) <= gemma.config.vocab_size
    pipe.save_pretrained(str(out / "diffusers" / "ref-ltx2"), safe_serialization=True)

    transformer, vae, audio_vae = _sd(pipe.transformer), _sd(pipe.vae), _sd(pipe.audio_vae)
    native = {"transformer": _ltx2_native(transformer), "vae": _ltx2_vae_native(vae),
              "audio_vae": _ltx2_vae_native(audio_vae), "vocoder": _ltx2_native(_sd(pipe.vocoder), top=(), inner=(
                  ("conv_in.", "conv_pre."), ("conv_out.", "conv_post."), ("upsamplers.", "ups."),
                  ("resnets.", "resblocks.")))}
    links = {_ltx2_connector_name(k): v for k, v in _sd(pipe.connectors).items()}
    # diffusers' own converters (and the pack's, where diffusers has none) give the diffusers names back
    assert set(convert_ltx2_transformer_to_diffusers(prompt_adaln(dict(native["transformer"])))) == set(transformer)
    assert set(convert_ltx2_vae_to_diffusers(dict(native["vae"]))) == set(vae)
    assert set(convert_ltx2_audio_vae_to_diffusers(dict(native["audio_vae"]))) == set(audio_vae)
    assert set(vocoder(native["vocoder"], {})) == set(_sd(pipe.vocoder))
    assert set(connectors(links, {})) == set(_sd(pipe.connectors))
    checkpoint = {**{f"model.diffusion_model.{k}": v for k, v in native["transformer"].items()}, **links,
                  **{f"vae.{k}": v for k, v in native["vae"].items()},
                  "vae.per_channel_statistics.mean-of-stds": torch.ones_like(vae["latents_std"]),
                  **{f"audio_vae.{k}": v for k, v in native["audio_vae"].items()},
                  **{f"vocoder.{k}": v for k, v in native["vocoder"].items()}}
    _save(_fp8(checkpoint, torch.float8_e4m3fn), models / "checkpoints" / names["checkpoint"])
    _save(_fp8({k: v for k, v in checkpoint.items() if not k.startswith("audio_vae.")}, torch.float8_e4m3fn),
          models / "checkpoints" / names["no_audio_vae"])
    plan = {k[: -len(".weight")]: "fp8" for k, v in checkpoint.items() if v.ndim == 2 and k.endswith(".weight") and (
        ".transformer_blocks." in k or ".transformer_1d_blocks." in k)}
    quant, meta, deq = quantize_comfy(checkpoint, plan, markers="metadata")
    _save(quant, models / "checkpoints" / names["fp8_quant"], meta)
    _save(deq, models / "checkpoints" / names["fp8_quant_dequantized"])
    pipe.vocoder = bwe = _fp8_rounded(_ltx2_bwe())
    pipe.save_pretrained(str(out / "diffusers" / "ref-ltx2-bwe"), safe_serialization=True)
    native = _ltx2_native(_sd(bwe), top=(), inner=(
        ("conv_in.", "conv_pre."), ("conv_out.", "conv_post."), ("upsamplers.", "ups."), ("resnets.", "resblocks."),
        ("act_out.", "act_post."), (".downsample.filter", ".downsample.lowpass.filter")))
    assert set(vocoder(native, {})) == set(_sd(bwe))
    checkpoint = {**{k: v for k, v in checkpoint.items() if not k.startswith("vocoder.")},
                  **{f"vocoder.{k}": v for k, v in native.items()}}
    _save(_fp8(checkpoint, torch.float8_e4m3fn), models / "checkpoints" / names["bwe"])


def _ltx2_bwe():
    """A tiny LTX2VocoderWithBWE for tiny-ltx2's audio VAE (2 channels of 16 mel bins, 100 mel frames a second):
    diffusers' defaults (LTX-2.3's) where no tensor holds them (its mel hop, 80; the rates follow: a first stage of
    160x to 16 kHz, an extension of 240x per hop to 48 kHz), strides half the kernels (the pack's rule for kernels
    other than the published ones)."""
    from diffusers.pipelines.ltx2 import LTX2VocoderWithBWE

    from backend.families.ltx2.files import BWE

    return _seeded(61, lambda: LTX2VocoderWithBWE(**{
        **BWE, "in_channels": 32, "hidden_channels": 16, "out_channels": 2, "upsample_kernel_sizes": [20, 32],
        "upsample_factors": [10, 16], "resnet_kernel_sizes": [3], "resnet_dilations": [[1, 3, 5]],
        "final_bias": False, "bwe_in_channels": 32, "bwe_hidden_channels": 16, "bwe_out_channels": 2,
        "bwe_upsample_kernel_sizes": [24, 40], "bwe_upsample_factors": [12, 20], "bwe_resnet_kernel_sizes": [3],
        "bwe_resnet_dilations": [[1, 3, 5]], "bwe_final_bias": False, "filter_length": 64, "window_length": 64,
        "num_mel_channels": 16}))


def _ltx25(tiny: Path, comfyui_dir: str, out: Path) -> None:
    """LTX-2.5's split files of tiny-ltx25 (ComfyUI's loaders: UNETLoader, CLIPLoader "ltxv", two VAELoaders). The
    DiT in Lightricks' names under `model.diffusion_model.` with its two connectors (as LTX-2.3's checkpoint holds
    them); Gemma 4 as ComfyUI's Gemma4Transformer names it (comfy/text_encoders/gemma4.py: `model.` + transformers'
    language-model names, checked below) with the connectors' `text_embedding_projection.` beside it; the video VAE
    unprefixed (comfy/sd.py's LTX VAE keys); the audio VAE under `audio_vae.` with its vocoder under `vocoder.`
    (comfy/sd.py's "LTX Audio" branch: a vocoder key, `audio_vae.` read as its autoencoder). The DiT's and
    Gemma's block matrices quantized by comfy-kitchen (int8 ConvRot where 256 input features fit, else int8 per
    row: tiny-ltx25 is too narrow for ConvRot's groups, so int8 per row throughout)."""
    import torch
    from diffusers import LTX2Pipeline

    pipe = LTX2Pipeline.from_pretrained(str(tiny / "tiny-ltx25"), local_files_only=True)
    names, models = FILES["ltx25"], out / "models"
    # the published values that change no tensor, as in LTX-2.3's fixture (and Gemma 4 12B's window and length)
    pipe.transformer = _reconfigured(pipe.transformer, rope_double_precision=True)
    pipe.connectors = _reconfigured(pipe.connectors, rope_double_precision=True, connector_rope_base_seq_len=4096)
    pipe.vae = _reconfigured(pipe.vae, upsample_residual=[True, True, True])
    pipe.audio_vae = _reconfigured(pipe.audio_vae, resolution=256)
    text = {**pipe.text_encoder.config.text_config.to_dict(), "sliding_window": 1024, "max_position_embeddings": 131072}
    pipe.text_encoder = _reconfigured(pipe.text_encoder, text_config=text)
    connectors_sd = _sd(pipe.connectors)  # the connectors' tensors in ComfyUI's names; diffusers' name -> ComfyUI's
    link_names = {k: _ltx2_connector_name(k) for k in connectors_sd}
    links = {link_names[k]: v for k, v in connectors_sd.items()}
    dit = {**{f"model.diffusion_model.{k}": v for k, v in _ltx2_native(_sd(pipe.transformer)).items()},
           **{k: v for k, v in links.items() if k.startswith("model.diffusion_model.")}}
    language = pipe.text_encoder.model.language_model.state_dict()
    gemma = {**{f"model.{k}": v for k, v in language.items()},
             **{k: v for k, v in links.items() if k.startswith("text_embedding_projection.")}}
    # its tokenizer inside, as ComfyUI's Gemma 4 files keep it (the bytes of a tokenizer.json)
    tokenizer_json = (tiny / "tiny-ltx25" / "tokenizer" / "tokenizer.json").read_bytes()
    gemma["tokenizer_json"] = torch.frombuffer(bytearray(tokenizer_json), dtype=torch.uint8)
    assert {f"model.language_model.{k[len('model.'):]}" for k in gemma if k.startswith("model.")} == set(
        pipe.text_encoder.state_dict()) - {"lm_head.weight"}, "ComfyUI's Gemma 4 names are transformers' under model."
    stored = {}  # every tensor as the files store it (dequantized by comfy-kitchen, bf16), in ComfyUI's names
    for sd, name, inside in ((dit, "dit", (".transformer_blocks.", ".transformer_1d_blocks.")),
                             (gemma, "gemma4", ("model.layers.",))):
        plan = {k[: -len(".weight")]: "int8_convrot" if fits("int8_convrot", v.shape) else "int8_rowwise"
                for k, v in sd.items() if k.endswith(".weight") and v.ndim == 2 and any(i in k for i in inside)}
        folder = "diffusion_models" if name == "dit" else "text_encoders"
        quant, _, deq = quantize_comfy(sd, plan)
        _save(quant, models / folder / names[name])
        _save(deq, models / folder / names[f"{name}_dequantized"])
        stored.update(deq)

    def bf16(sd: dict) -> dict:  # as the files' names say
        return {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in sd.items()}

    vocoder_inner = (("conv_in.", "conv_pre."), ("conv_out.", "conv_post."), ("upsamplers.", "ups."),
                     ("resnets.", "resblocks."))
    vae = bf16(_ltx2_vae_native(_sd(pipe.vae)))
    audio = bf16({**{f"audio_vae.{k}": v for k, v in _ltx2_vae_native(_sd(pipe.audio_vae)).items()},
                  **{f"vocoder.{k}": v for k, v in _ltx2_native(_sd(pipe.vocoder), top=(), inner=vocoder_inner).items()}})
    _save(vae, models / "vae" / names["vae"])
    _save(audio, models / "vae" / names["audio_vae"])
    # the reference: tiny-ltx25 as a diffusers folder with the weights the files hold (each tensor found by its
    # ComfyUI name: the DiT's and Gemma's dequantized by comfy-kitchen, the VAEs' and the vocoder's bf16-rounded)
    stored.update(vae)
    stored.update(audio)
    native = {"transformer": lambda k: "model.diffusion_model." + next(iter(_ltx2_native({k: None}))),
              "connectors": link_names.__getitem__,
              "text_encoder": lambda k: "model.embed_tokens.weight" if k == "lm_head.weight"
              else "model." + k[len("model.language_model."):],
              "vae": lambda k: next(iter(_ltx2_vae_native({k: None}))),
              "audio_vae": lambda k: "audio_vae." + next(iter(_ltx2_vae_native({k: None}))),
              "vocoder": lambda k: "vocoder." + next(iter(_ltx2_native({k: None}, top=(), inner=vocoder_inner)))}
    for component, name_of in native.items():
        module = getattr(pipe, component)
        own = module.state_dict()
        module.load_state_dict({k: stored[name_of(k)].to(v.dtype) for k, v in own.items()})
    pipe.save_pretrained(str(out / "diffusers" / "ref-ltx25"), safe_serialization=True)


MINIMAX_H3_NAMES = {  # ComfyUI's names (comfy/ldm/minimax/model.py) -> diffusers' (its converter's rename table)
    "video_patch_proj.": "proj_in.", "audio_patch_proj.": "audio_proj_in.", "condition_proj.": "context_embedder.",
    "time_embedder.proj_in.": "time_embedder.linear_1.", "time_embedder.proj_out.": "time_embedder.linear_2.",
    "final_layer.norm.": "norm_out.norm.", "final_layer.adaln_proj.linear.": "norm_out.linear.",
    "final_layer.video_out.": "proj_out.", "final_layer.audio_out.": "audio_proj_out.",
    ".attn.q_norm.": ".attn.norm_q.", ".attn.k_norm.": ".attn.norm_k.", ".attn.out_proj.": ".attn.to_out.0.",
    ".mlp.fc1.": ".ff.net.0.proj.", ".mlp.fc2.": ".ff.net.2."}
CURVE_GRID = 1025  # the rows of adaln_t_table in every published pruned file


def minimax_h3_transformer_file(transformer) -> dict:
    """MiniMax H3's transformer in ComfyUI's layout (comfy/ldm/minimax/model.py: `blocks.*`, `token_refiner.blocks.*`,
    the fused `attn.qkv_proj`, `mlp.fc1`/`fc2`, `final_layer.*`, the `rope.inv_freq` buffer): the names from ComfyUI's
    module tree, the tensors from diffusers' own converter run backwards (probe_invert: the real converter must
    give every tensor back exactly)."""
    import torch
    from diffusers.loaders.single_file_utils import convert_minimax_h3_transformer_checkpoint_to_diffusers

    sd, config = _sd(transformer), dict(transformer.config)
    back = {v: k for k, v in MINIMAX_H3_NAMES.items()}
    shapes = {}
    for key, value in sd.items():
        name = key.replace("transformer_blocks.", "blocks.", 1).replace("token_refiner.refiner_blocks.",
                                                                         "token_refiner.blocks.", 1)
        top = next((t for t in back if not t.startswith(".") and name.startswith(t)), None)
        name = back[top] + name[len(top):] if top else name
        for theirs, ours in back.items():
            name = name.replace(theirs, ours) if theirs.startswith(".") else name
        if name.endswith((".attn.to_k.weight", ".attn.to_v.weight")):
            continue
        if name.endswith(".attn.to_q.weight"):
            name, value = name.replace(".to_q.", ".qkv_proj."), torch.cat([value] * 3)
        shapes[name] = tuple(value.shape)
    out = probe_invert(convert_minimax_h3_transformer_checkpoint_to_diffusers, shapes, sd, config=config)
    dim = config["rope_freq_dim"]
    out["rope.inv_freq"] = 1.0 / config["rope_theta"] ** (torch.arange(0, 2 * dim, 2, dtype=torch.float32) / (2 * dim))
    return out


def minimax_h3_pruned(transformer, comfy_sd: dict) -> dict:
    """The same transformer in ComfyUI's "pruned" curve form, as Comfy-Org's minimax_h3_*_pruned_* files hold it: the
    AdaLN input silu(time_embedder(t)) sampled at CURVE_GRID points of t in [0, 1] and turned by an orthogonal basis
    (the files reduce it to its first 8 coordinates; the tiny one keeps all of them, so the curve is the model's
    own between the grid's linear pieces) as `adaln_t_table`, every AdaLN projection turned by the same basis, the
    time embedder gone."""
    import torch

    with torch.no_grad():
        t = torch.linspace(0.0, 1.0, CURVE_GRID)
        curve = torch.nn.functional.silu(transformer.time_embedder(transformer.time_proj(t)).float())
    basis = torch.linalg.qr(_seeded_randn(81, (curve.shape[1], curve.shape[1])))[0]
    out = {k: v for k, v in comfy_sd.items() if not k.startswith("time_embedder.")}
    out["adaln_t_table"] = curve @ basis
    for key in [k for k in out if k.endswith("adaln_proj.linear.weight")]:
        out[key] = (out[key].float() @ basis).to(out[key].dtype)
    return out


def _seeded_randn(seed: int, shape: tuple):
    import torch

    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def minimax_h3_qwen3vl_file(model) -> dict:
    """Qwen3-VL as ComfyUI's qwen3vl_32b_minimax_h3 file holds it (comfy/text_encoders/llama.py Qwen3VL_32BConfig,
    comfy/sd.py's detection by `model.layers.49.`): cut after layer 50 (of the tiny's 51, as of the published 64),
    without the final norm and lm_head; ComfyUI's names (qwen3vl_file)."""
    last = f"model.layers.{MINIMAX_H3_TEXT_LAYER}."
    return {k: v for k, v in qwen3vl_file(model).items()
            if not k.startswith(last) and k not in ("model.norm.weight", "lm_head.weight")}


MINIMAX_H3_TEXT_LAYER = 50  # MiniMax H3 reads hidden_states[50]: the output of layer 50, the input of layer 51


def minimax_h3_video_vae_file(vae) -> dict:
    """MiniMax H3's video VAE in ComfyUI's layout (comfy/ldm/minimax/vae.py, MiniMax's own names): the encoder's
    `down.{i}.block.{j}` / `downsample.conv`, the ViT decoder's `x_embedder`, fused per-head `attn.to_qkv`,
    `attn.to_out`, `ff.w1` ([gate; up]) and `ff.w2`, its `mask_token` buffer, and the latent statistics as
    tensors."""
    import torch

    config, heads = vae.config, vae.config.decoder_num_attention_heads
    out = {}
    for key, value in _sd(vae).items():
        if key.startswith("encoder.down_blocks."):
            level, rest = key[len("encoder.down_blocks."):].split(".", 1)
            rest = rest.replace("resnets.", "block.", 1).replace("conv_shortcut.", "nin_shortcut.", 1)
            key = f"encoder.down.{level}.{rest.replace('downsamplers.0.', 'downsample.', 1)}"
        key = key.replace("decoder.proj_in.", "decoder.x_embedder.").replace(".attn.to_out.0.", ".attn.to_out.")
        if ".attn.to_k." in key or ".attn.to_v." in key:
            continue
        if ".attn.to_q." in key:
            q, k, v = (_sd(vae)[key.replace("decoder.x_embedder.", "decoder.proj_in.").replace(".to_q.", f".{n}.")]
                       for n in ("to_q", "to_k", "to_v"))
            per_head = [t.reshape(heads, -1, *t.shape[1:]) for t in (q, k, v)]
            key, value = key.replace(".to_q.", ".to_qkv."), torch.stack(per_head, 1).reshape(-1, *q.shape[1:])
        if ".ff.net.0.proj." in key:
            up, gate = value.chunk(2, dim=0)
            key, value = key.replace(".ff.net.0.proj.", ".ff.w1."), torch.cat([gate, up])
        out[key.replace(".ff.net.2.", ".ff.w2.")] = value
    out["decoder.mask_token"] = torch.zeros(1, 1, out["decoder.x_embedder.weight"].shape[0])
    out["latents_mean"], out["latents_std"] = (torch.tensor(config[k], dtype=torch.float32)
                                               for k in ("latents_mean", "latents_std"))
    return out


def minimax_h3_audio_vae_file(vae) -> dict:
    """MiniMax H3's audio VAE in ComfyUI's layout (comfy/ldm/minimax/audio_vae.py): diffusers' names, each weight
    norm folded into a plain `.weight` (g * v / |v|), and the latent statistics as tensors."""
    import torch

    sd, out = _sd(vae), {}
    for key, value in sd.items():
        if key.endswith(".weight_g"):
            continue
        if key.endswith(".weight_v"):
            base = key[: -len(".weight_v")]
            g = sd[f"{base}.weight_g"]
            out[f"{base}.weight"] = g * value / value.norm(dim=(1, 2), keepdim=True)
            continue
        out[key] = value
    out["latents_mean"], out["latents_std"] = (torch.tensor(vae.config[k], dtype=torch.float32)
                                               for k in ("latents_mean", "latents_std"))
    return out


def _minimax_h3(tiny: Path, comfyui_dir: str, out: Path) -> None:
    """MiniMax H3's files from tiny-minimax-h3 (the reference is that folder itself): the fl2va transformer
    (the `transformer` partition, which t2va and fl2va run) and the ref2va one (`transformer_ref`), each full and
    pruned, Qwen3-VL in ComfyUI's names, both VAEs in ComfyUI's layouts."""
    import tempfile

    import torch
    from diffusers.modular_pipelines import ModularPipeline
    from transformers import Qwen2Tokenizer, Qwen3VLForConditionalGeneration, Qwen3VLProcessor

    pipe = ModularPipeline.from_pretrained(str(tiny / "tiny-minimax-h3"))
    pipe.load_components(dtype=torch.float32)
    # the reference (diffusers/ref-minimax-h3): the folder with ComfyUI's vocabulary (the text encoder rebuilt for
    # it), the pack's processor settings, and the values no tensor holds as the pack derives them for these widths
    # (the VAE decoder's and the audio VAE's one head, the VAE's 8 groups)
    tokenizer = Qwen2Tokenizer.from_pretrained(str(_comfy_tokenizers(comfyui_dir) / "text_encoders" / "qwen25_tokenizer"))
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        for f in (_config_dir("minimax_h3") / "processor").iterdir():
            shutil.copy(f, Path(tmp) / f.name)
        processor = Qwen3VLProcessor.from_pretrained(tmp)
    pipe.update_components(
        tokenizer=tokenizer, processor=processor,
        text_encoder=_qwen3vl(Qwen3VLForConditionalGeneration, tokenizer, "minimax_h3", pipe.text_encoder.config, 82,
                              vision_heads=4, tied=False),
        vae=_reconfigured(pipe.vae, decoder_num_attention_heads=1, decoder_attention_head_dim=16, norm_num_groups=8),
        audio_vae=_reconfigured(pipe.audio_vae, num_attention_heads=1))
    pipe.save_pretrained(str(out / "diffusers" / "ref-minimax-h3"))
    names, models = FILES["minimax_h3"], out / "models"
    comfy_sd = minimax_h3_transformer_file(pipe.transformer)
    _save(comfy_sd, models / "diffusion_models" / names["diffusion_model"])
    _save(minimax_h3_pruned(pipe.transformer, comfy_sd), models / "diffusion_models" / names["pruned"])
    ref_sd = minimax_h3_transformer_file(pipe.transformer_ref)
    _save(ref_sd, models / "diffusion_models" / names["ref2va_full"])
    _save(minimax_h3_pruned(pipe.transformer_ref, ref_sd), models / "diffusion_models" / names["ref2va"])
    _save(minimax_h3_qwen3vl_file(pipe.text_encoder), models / "text_encoders" / names["qwen3vl"])
    _save(minimax_h3_video_vae_file(pipe.vae), models / "vae" / names["vae"])
    _save(minimax_h3_audio_vae_file(pipe.audio_vae), models / "vae" / names["audio_vae"])
    _minimax_h3_quantized(minimax_h3_pruned(pipe.transformer, comfy_sd), minimax_h3_pruned(pipe.transformer_ref, ref_sd),
                          minimax_h3_video_vae_file(pipe.vae), minimax_h3_qwen3vl_file(pipe.text_encoder), names, models)


def _minimax_h3_quantized(pruned: dict, ref_pruned: dict, vae: dict, text: dict, names: dict, models: Path) -> None:
    """The quantized files as Comfy-Org's MiniMax H3 templates hold them, written by comfy-kitchen: the pruned
    fl2va and ref2va transformers' block Linear layers (attention qkv and out, feed-forward fc1 and fc2: 4 of each
    block) and the video VAE decoder's (to_qkv, to_out, w1, w2) int8 ConvRot; Qwen3-VL's language-model Linear
    layers nvfp4 where their sizes take it, AWQ-smoothed (the weight stored divided by a per-column `pre_quant_scale` the input is
    multiplied by); each beside the same file dequantized by comfy-kitchen (the smoothing folded back)."""
    import torch

    def plan(sd: dict, prefix: str, layers: tuple[str, ...], spec: str) -> dict[str, str]:
        return {k[: -len(".weight")]: spec for k, v in sd.items()
                if k.startswith(prefix) and k.endswith(layers) and fits(spec, tuple(v.shape))}

    blocks = (".attn.qkv_proj.weight", ".attn.out_proj.weight", ".mlp.fc1.weight", ".mlp.fc2.weight")
    for sd, prefix, layers, name in (
            (pruned, "blocks.", blocks, "int8"), (ref_pruned, "blocks.", blocks, "ref2va_int8"),
            (vae, "decoder.transformer_blocks.", (".attn.to_qkv.weight", ".attn.to_out.weight", ".ff.w1.weight",
                                                  ".ff.w2.weight"), "vae_int8")):
        tensors, metadata, deq = quantize_comfy(sd, plan(sd, prefix, layers, "int8_convrot_16"))
        role = "vae" if name == "vae_int8" else "diffusion_models"
        _save(tensors, models / role / names[name], metadata)
        _save(deq, models / role / names[f"{name}_dequantized"])
    layers = plan(text, "model.layers.", tuple(f".{p}_proj.weight" for p in ("q", "o", "gate", "up", "down")), "nvfp4")
    scales = {layer: torch.rand(text[f"{layer}.weight"].shape[1], generator=torch.Generator().manual_seed(83 + i)) + 0.5
              for i, layer in enumerate(sorted(layers))}
    smoothed = {**text, **{f"{layer}.weight": text[f"{layer}.weight"] / s for layer, s in scales.items()}}
    tensors, metadata, deq = quantize_comfy(smoothed, layers)
    _save({**tensors, **{f"{layer}.pre_quant_scale": s for layer, s in scales.items()}},
          models / "text_encoders" / names["qwen3vl_nvfp4"], metadata)
    _save({**deq, **{f"{layer}.weight": deq[f"{layer}.weight"] * s for layer, s in scales.items()}},
          models / "text_encoders" / names["qwen3vl_nvfp4_dequantized"])


BUILDERS = {"flux1": _flux1, "flux2": _flux2, "flux2dev": _flux2dev, "sd3": _sd3, "sdxl": _sdxl,
            "qwenimage": _qwenimage, "zimage": _zimage, "wan": _wan, "flux1-3072": _flux1_3072,
            "flux1-vae": _flux1_vae, "flux1tools": _flux1tools, "flux1redux": _flux1redux,
            "zimage-quant": _zimage_quant, "qwenimage-quant": _qwenimage_quant, "krea2": _krea2,
            "qwenimage21": _qwenimage21, "krea2-quant": _krea2_quant, "flux3": _flux3, "ideogram4": _ideogram4,
            "ideogram4-quant": _ideogram4_quant, "ltx2": _ltx2, "ltx25": _ltx25,
            "minimax_h3": _minimax_h3}


def build(out: Path, tiny: Path, comfyui_dir: str, families=FAMILIES) -> Path:
    """Builds the families' reference folders and files into `out` (skipping those already built)."""
    import torch

    torch.set_num_threads(1)
    for family in families:
        if _marker(out, family).exists():
            continue
        shutil.rmtree(out / "diffusers" / f"ref-{family}", ignore_errors=True)
        BUILDERS[family](tiny, comfyui_dir, out)
        _marker(out, family).write_text("")
    return out


def built(out: Path, families=FAMILIES) -> bool:
    """Whether `out` holds every family already (read without starting the builder: no torch import)."""
    return all(_marker(out, family).exists() for family in families)


def _marker(out: Path, family: str) -> Path:
    return out / f".built-{family}-v{VERSION}"


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the pack (backend.*)
    out_dir, tiny_dir, comfy_dir, *names = sys.argv[1:]
    build(Path(out_dir), Path(tiny_dir), comfy_dir, names or FAMILIES)
