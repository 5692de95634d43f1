"""The LTX-2 family's key conversions (torch; the worker reads them through families.conversions, the controller
never): the LoRA layout that diffusers does not read as it is, and the parts of ComfyUI's LTX-2 files that diffusers'
single-file loader has no converter for (the text connectors, the vocoder) or misses names of (LTX-2.3's prompt AdaLN)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..lora_keys import up_down_as_a_b

_NATIVE = ("diffusion_model.", "text_embedding_projection.")


def up_down(keys: list[str]) -> bool:
    """ComfyUI's LoraSave (and kohya-style extractors): 'diffusion_model.<native>.lora_down/lora_up' (with .alpha
    where the trainer kept one). Lightricks' own files ('….lora_A/lora_B') diffusers reads as they are."""
    return any(k.startswith(_NATIVE) and k.endswith(".lora_down.weight") for k in keys)


def ltx2_up_down(sd: dict, pipe_cls: Any) -> dict:
    """diffusers 0.42.1's LTX-2 converter renames the native module names but keeps 'lora_down/lora_up', which
    its peft loader then finds no rank in (an IndexError in get_peft_kwargs): rename them to lora_A / lora_B, with
    alpha / rank folded into lora_B (what ComfyUI applies), and drop the .alpha entries."""
    return up_down_as_a_b(sd)


# The LoRA layouts diffusers does not read as they are, by name: whether a file's keys are in that layout,
# and the rewrite it needs before diffusers' load_lora_weights reads it
LORA_FORMATS: dict[str, tuple[Callable[[list[str]], bool], Callable[[dict, Any], dict]]] = {
    "comfy-ltx2": (up_down, ltx2_up_down),
}


# ---- ComfyUI's files (ltx-2.3-22b-dev-fp8.safetensors: Lightricks' own names, which ComfyUI keeps)

# LTX-2.3's prompt AdaLN, which diffusers 0.42.1's transformer converter leaves under its original name (its
# `adaln_single` handler renames keys that start with it only): renamed first, then diffusers' converter runs
_PROMPT_ADALN = {"prompt_adaln_single.": "prompt_adaln.", "audio_prompt_adaln_single.": "audio_prompt_adaln."}
# Lightricks' names of the text connectors (ComfyUI's Embeddings1DConnector inside its LTX-AV model, and the
# text_embedding_projection beside it) -> diffusers' LTX2TextConnectors', as diffusers' own conversion script
# (scripts/convert_ltx2_to_diffusers.py) renames them; diffusers 0.42.1 ships no single-file converter for them
_CONNECTORS = (("model.diffusion_model.video_embeddings_connector.", "video_connector."),
               ("model.diffusion_model.audio_embeddings_connector.", "audio_connector."),
               ("text_embedding_projection.video_aggregate_embed.", "video_text_proj_in."),
               ("text_embedding_projection.audio_aggregate_embed.", "audio_text_proj_in."),
               ("text_embedding_projection.aggregate_embed.", "text_proj_in."),
               (".transformer_1d_blocks.", ".transformer_blocks."), (".q_norm.", ".norm_q."), (".k_norm.", ".norm_k."))
# ... and of the vocoder (HiFi-GAN's names, ComfyUI's Vocoder) -> diffusers' LTX2Vocoder's, as that script renames
# them, and of LTX-2.3's with bandwidth extension (ComfyUI's VocoderWithBWE: `vocoder.`, `bwe_generator.`, `mel_stft.`
# as diffusers' LTX2VocoderWithBWE names them; its anti-aliased activations: `act_post`, `downsample.lowpass`)
_VOCODER = (("conv_pre.", "conv_in."), ("conv_post.", "conv_out."), ("ups.", "upsamplers."), ("resblocks.", "resnets."),
            ("act_post.", "act_out."), (".downsample.lowpass.", ".downsample."))


def _renamed(sd: dict, pairs: tuple[tuple[str, str], ...]) -> dict:
    out = {}
    for key, value in sd.items():
        for old, new in pairs:
            key = key.replace(old, new)
        out[key] = value
    return out


def prompt_adaln(sd: dict) -> dict:
    """LTX-2.3's DiT in Lightricks' names, its prompt AdaLN renamed for diffusers' converter (which misses it:
    the model would keep those layers unloaded)."""
    return {next((new + k[len(old):] for old, new in _PROMPT_ADALN.items() if k.startswith(old)), k): v
            for k, v in sd.items()}


def connectors(sd: dict, config: dict) -> dict:
    """LTX-2's text connectors from an LTX-AV checkpoint (keys under their full names: the video and audio
    connectors in the diffusion model, the per-modality projections beside it), in LTX2TextConnectors' names;
    the rest of the file is not read (the component's prefixes select them)."""
    return _renamed({k: v for k, v in sd.items() if "embeddings_connector." in k or "embedding_projection." in k},
                    _CONNECTORS)


def vocoder(sd: dict, config: dict) -> dict:
    """LTX-2's vocoder (ComfyUI's Vocoder: HiFi-GAN's names; VocoderWithBWE: two of them and the mel transform)
    in LTX2Vocoder's (LTX2VocoderWithBWE's) names."""
    return _renamed(sd, _VOCODER)


def audio_vae(sd: dict, config: dict) -> dict:
    """LTX-2's audio VAE: diffusers' own converter (AutoencoderKLLTX2Audio has none of diffusers' single-file
    loading in 0.42.1, though the converter is there)."""
    from diffusers.loaders.single_file_utils import convert_ltx2_audio_vae_to_diffusers

    return convert_ltx2_audio_vae_to_diffusers(sd)


# Whole components this family converts itself, by loader layout (worker/loading.py reads them with a strict
# load), and the names diffusers' single-file converters miss, renamed before they run
VAE_CONVERTERS: dict[str, Callable[[dict, dict], dict]] = {"ltx2-connectors": connectors, "ltx2-vocoder": vocoder,
                                                           "ltx2-audio-vae": audio_vae}
RENAMES: dict[str, Callable[[dict], dict]] = {"ltx2": prompt_adaln}


def gemma_tokenizer(te_file: Any, shipped: Any, target: Any) -> None:
    """Gemma's tokenizer from the `spiece_model` tensor that ComfyUI's Gemma 3 files carry (a SentencePiece BPE
    model's bytes, which ComfyUI reads with sentencepiece, one of its requirements): its pieces by id and the
    merges transformers' own converter derives from them (generate_merges; the converter itself parses the model
    with protobuf, which neither ComfyUI nor the pack installs) in a GemmaTokenizer, with the pack's settings."""
    import shutil
    from pathlib import Path

    import sentencepiece
    from safetensors import safe_open
    from transformers import GemmaTokenizer
    from transformers.convert_slow_tokenizer import generate_merges

    with safe_open(str(te_file), "pt") as f:
        sp = sentencepiece.SentencePieceProcessor(model_proto=f.get_tensor("spiece_model").numpy().tobytes())
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    GemmaTokenizer(vocab=vocab, merges=generate_merges(vocab)).save_pretrained(str(target))
    shutil.copy(Path(shipped) / "tokenizer_config.json", target / "tokenizer_config.json")


def gemma4_tokenizer(te_file: Any, shipped: Any, target: Any) -> None:
    """Gemma 4's tokenizer from the `tokenizer_json` tensor of LTX-2.5's Gemma 4 file (a tokenizer.json's bytes, as
    ComfyUI's Gemma4SDTokenizer reads it: Gemma 4 ships no SentencePiece model), with the pack's settings."""
    import shutil
    from pathlib import Path

    from safetensors import safe_open

    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    with safe_open(str(te_file), "pt") as f:
        (target / "tokenizer.json").write_bytes(f.get_tensor("tokenizer_json").numpy().tobytes())
    shutil.copy(Path(shipped) / "tokenizer_config.json", target / "tokenizer_config.json")


# Tokenizers made from a tensor of the text encoder's file, by loader layout
TOKENIZERS: dict[str, Callable[[Any, Any, Any], None]] = {"gemma-spiece": gemma_tokenizer,
                                                          "gemma4-json": gemma4_tokenizer}
