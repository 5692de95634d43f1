"""Tiny random-weight diffusers pipelines, built fully offline.

The test-suite and the benchmarks need real pipeline folders (``model_index.json``, safetensors weights,
tokenizers, scheduler configs) that load through the very same ``DiffusionPipeline.from_pretrained`` path as
the production checkpoints, yet weigh a few megabytes and run in milliseconds on a CPU. Nothing here touches
the Hugging Face Hub: the models are built from small configs and the tokenizers from vocabularies that are
generated in memory, so the folders can be produced on a machine without internet access.

Every family keeps the structural constants the production code depends on (VAE spatial factor 8, 2x2
latent packing, attention heads divisible by 2 for tensor parallelism, the real pipeline class and component
classes), so code exercised against these folders takes the same branches it takes on the real checkpoints.
"""

from __future__ import annotations

import inspect
import json
import os
import pathlib
import shutil
import tempfile
import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import torch

# The tiny pipelines by the name of their folder (tiny-<name>), one per family of backend/protocol/families
# (tests/test_families.py checks it); "flux" is FLUX.1: shipped workflows and benchmarks name tiny-flux.
FAMILIES: tuple[str, ...] = ("flux", "flux2", "sd3", "sdxl", "qwenimage", "zimage", "wan")
# Further pipelines of a family, built with them: Wan 2.1 image to video (a CLIP vision encoder, a denoiser that
# reads the start image); Wan 2.2 A14B's two experts (high noise, low noise).
MORE: tuple[str, ...] = ("wan-i2v", "wan22")
SIZES: tuple[str, ...] = ("tiny", "small")
_SIZED_FAMILIES: tuple[str, ...] = ("flux", "zimage")  # families that also come in sizes other than "tiny"

# Words that get their own BPE merges / unigram pieces, so common prompts tokenize to a realistic handful
# of tokens instead of one token per byte. Any other text still tokenizes (byte fallback for the BPE
# tokenizers, single characters for the unigram one).
_WORDS: tuple[str, ...] = tuple(
    """
    a an the of in on and with at to is by for from photo picture painting drawing image portrait landscape
    close up cat dog bird horse fox car house tree flower mountain river sea city street forest sky sun moon
    night day light dark red green blue yellow white black small big old young man woman person astronaut
    riding sitting standing beautiful detailed high quality style
    system user assistant Describe detailing color shape size texture quantity text spatial relationships
    objects background
    """.split()
)


# ----------------------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------------------


def build_tiny_pipeline(
    family: str, out_dir: str | os.PathLike, seed: int = 0, size: str = "tiny"
) -> pathlib.Path:
    """Builds and saves one pipeline folder (model_index.json + safetensors + tokenizers). Deterministic for a seed.

    size="tiny": smallest that runs; size="small": same family but wider/deeper so that one 256x256, 4-step call
    takes >= 0.3 s on one CPU thread (used by benchmarks; "flux" and "zimage" only — ValueError for others).
    The global torch RNG state of the caller is left untouched (weights are drawn inside ``fork_rng``).
    """
    if family not in _BUILDERS:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES + MORE}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {SIZES}")
    if size != "tiny" and family not in _SIZED_FAMILIES:
        raise ValueError(f"size={size!r} exists only for {_SIZED_FAMILIES}, not {family!r}")
    out = pathlib.Path(out_dir)
    if out.exists() and any(out.iterdir()) and not (out / "model_index.json").is_file():
        raise FileExistsError(f"{out} exists and is not a pipeline folder; refusing to replace it")
    with torch.random.fork_rng(devices=[]):
        pipe = _BUILDERS[family](_Seeder(seed), size)
    return save_pipeline(pipe, out)


def save_pipeline(pipe: Any, out: pathlib.Path) -> pathlib.Path:
    """Saves `pipe` (safetensors) as the folder `out`, replacing it. It is saved into a staging folder and
    renamed into place, so an interrupted save never leaves a folder with model_index.json but missing
    weights (build_all would then skip it forever)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    staging.chmod(0o755)  # mkdtemp makes it owner-only; the folder may be served to other users
    try:
        pipe.save_pretrained(staging, safe_serialization=True)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def build_all(
    root: str | os.PathLike, families: Iterable[str] = FAMILIES + MORE, size: str = "tiny"
) -> dict[str, pathlib.Path]:
    """Builds each family (and MORE) into root/<name> where name is f"tiny-{family}" (or f"small-{family}"); skips
    folders that already hold model_index.json.

    Skipping makes it cheap to call from session-scoped fixtures and benchmark setup that share a cache dir.
    With the default ``families`` and a size other than "tiny", only the families that have that size are
    built; naming an unsupported family explicitly raises ValueError.
    """
    root = pathlib.Path(root)
    if families == FAMILIES + MORE and size != "tiny":
        families = [f for f in FAMILIES if f in _SIZED_FAMILIES]
    built: dict[str, pathlib.Path] = {}
    for family in families:
        folder = root / f"{size}-{family}"
        if not (folder / "model_index.json").is_file():
            build_tiny_pipeline(family, folder, size=size)
        built[family] = folder
    return built


# ----------------------------------------------------------------------------------------------------------
# Deterministic initialisation
# ----------------------------------------------------------------------------------------------------------


class _Seeder:
    """Re-seeds the (forked) global RNG before each component, keyed by the component's name.

    Keying by name keeps a component's weights stable when another component's config changes, and the
    global RNG is what both diffusers and transformers use for their default initialisers.
    """

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)

    def __call__(self, name: str, factory: Callable[[], Any]) -> Any:
        torch.manual_seed((self.seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
        module = factory()
        if isinstance(module, torch.nn.Module):
            module.eval()
        return module


# ----------------------------------------------------------------------------------------------------------
# Tokenizers (generated vocabularies; no files downloaded)
# ----------------------------------------------------------------------------------------------------------


def _byte_to_unicode() -> dict[int, str]:
    """The reversible byte -> printable-character table that GPT-2-style byte-level BPE vocabularies use."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _train_bpe(words: Iterable[tuple[str, ...]]) -> list[tuple[str, str]]:
    """Greedy BPE training on a tiny corpus until every word is a single symbol.

    Real training (most frequent pair first, ties broken by the pair itself) rather than per-word merge
    chains, so the merges are mutually consistent: each corpus word tokenizes back to exactly one token.
    """
    seqs = [list(w) for w in sorted(set(words))]
    merges: list[tuple[str, str]] = []
    while True:
        counts: Counter[tuple[str, str]] = Counter()
        for seq in seqs:
            counts.update(zip(seq, seq[1:], strict=False))
        if not counts:
            return merges
        best = min(counts, key=lambda pair: (-counts[pair], pair))
        merges.append(best)
        joined = best[0] + best[1]
        for seq in seqs:
            i = 0
            while i < len(seq) - 1:
                if (seq[i], seq[i + 1]) == best:
                    seq[i : i + 2] = [joined]
                i += 1


def _bpe_vocab(base: Iterable[str], merges: list[tuple[str, str]], specials: Iterable[str]) -> dict[str, int]:
    vocab: dict[str, int] = {}
    for token in [*base, *(a + b for a, b in merges), *specials]:
        vocab.setdefault(token, len(vocab))
    return vocab


def _clip_tokenizer(pad_token: str = "<|endoftext|>") -> Any:
    """CLIP byte-level BPE with ``</w>`` word ends; model_max_length=77 like the real CLIP tokenizers."""
    from transformers import CLIPTokenizer

    chars = list(_byte_to_unicode().values())
    merges = _train_bpe((*word[:-1], word[-1] + "</w>") for word in _WORDS if len(word) > 1)
    vocab = _bpe_vocab([*chars, *(c + "</w>" for c in chars)], merges, ("<|startoftext|>", "<|endoftext|>"))
    return CLIPTokenizer(vocab=vocab, merges=merges, pad_token=pad_token, model_max_length=77)


_QWEN_SPECIALS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<think>",
    "</think>",
)

# A Qwen3-style chat template (written for these tiny models): turns, then an assistant header, and an empty
# think block when ``enable_thinking=False`` (what Flux2KleinPipeline passes).
_QWEN_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\n\n</think>\n\n' }}{%- endif -%}"
    "{%- endif -%}"
)


def _qwen_tokenizer() -> Any:
    """Qwen2 byte-level BPE (no end-of-word marker, ``Ġ`` for a leading space) with the Qwen special tokens."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    table = _byte_to_unicode()
    space = table[ord(" ")]
    corpus = [tuple(w) for w in _WORDS if len(w) > 1] + [(space, *w) for w in _WORDS]
    merges = _train_bpe(corpus)
    vocab = _bpe_vocab(table.values(), merges, _QWEN_SPECIALS)
    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=32768,
    )
    tok.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in _QWEN_SPECIALS], special_tokens=True
    )
    tok.chat_template = _QWEN_CHAT_TEMPLATE
    return tok


def _t5_tokenizer() -> Any:
    """T5 SentencePiece-style Unigram tokenizer: <pad>=0, </s>=1, <unk>=2, pieces with the ``▁`` word marker."""
    from transformers import T5Tokenizer

    pieces: list[tuple[str, float]] = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    seen = {p for p, _ in pieces}

    def add(piece: str, score: float) -> None:
        if piece not in seen:
            seen.add(piece)
            pieces.append((piece, score))

    for word in _WORDS:
        add("▁" + word, -3.0 - 0.01 * len(pieces))
    for code in range(ord("!"), ord("~") + 1):
        add(chr(code), -8.0)
        add("▁" + chr(code), -7.0)
    return T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=512)


# ----------------------------------------------------------------------------------------------------------
# Shared text encoders and VAE
# ----------------------------------------------------------------------------------------------------------


def _clip_text(seed: _Seeder, name: str, tokenizer: Any, hidden: int, with_projection: bool) -> Any:
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        projection_dim=hidden,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=77,
        hidden_act="gelu",
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    cls = CLIPTextModelWithProjection if with_projection else CLIPTextModel
    return seed(name, lambda: cls(config))


def _t5_encoder(seed: _Seeder, name: str, tokenizer: Any, d_model: int) -> Any:
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=d_model,
        d_kv=d_model // 4,
        d_ff=2 * d_model,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        feed_forward_proj="gated-gelu",
        dropout_rate=0.0,
        is_encoder_decoder=False,
        use_cache=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return seed(name, lambda: T5EncoderModel(config))


def _vae_kl(
    seed: _Seeder,
    latent_channels: int,
    channels: tuple[int, ...] = (8, 16, 16, 16),
    layers: int = 1,
    **extra: Any,
) -> Any:
    """4-block KL autoencoder: three downsamples keep the real spatial factor of 8."""
    from diffusers import AutoencoderKL

    return seed(
        "vae",
        lambda: AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D",) * len(channels),
            up_block_types=("UpDecoderBlock2D",) * len(channels),
            block_out_channels=channels,
            layers_per_block=layers,
            latent_channels=latent_channels,
            norm_num_groups=4,
            sample_size=64,
            **extra,
        ),
    )


def _qwen_text_common(vocab_size: int, hidden: int) -> dict[str, Any]:
    return {
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
    }


# ----------------------------------------------------------------------------------------------------------
# Families
# ----------------------------------------------------------------------------------------------------------


# FLUX.1 shapes per size. "small" was sized by measurement (one CPU thread, 256x256, 4 steps: ~0.5 s, ~7.6 MB).
# Transformer FLOPs cost a lot of stored bytes per FLOP at 256 tokens, so a full-resolution-heavy VAE decoder
# (wide first block, convolutions reuse each weight 65k times) supplies most of the time: the 4 transformer
# steps take ~40 ms, the decode ~0.45 s. Widening the transformer instead would need ~40 MB for the same time.
_FLUX_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {
        "heads": 2,
        "head_dim": 16,
        "rope": (4, 6, 6),
        "double": 1,
        "single": 1,
        "vae": (8, 16, 16, 16),
        "vae_layers": 1,
    },
    "small": {
        "heads": 4,
        "head_dim": 24,
        "rope": (4, 10, 10),
        "double": 2,
        "single": 2,
        "vae": (112, 32, 16, 16),
        "vae_layers": 1,
    },
}


def _flux(seed: _Seeder, size: str) -> Any:
    """FLUX.1-schnell-like: no guidance embedding, CLIP-L pooled + T5 sequence conditioning."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    shape = _FLUX_SIZES[size]
    clip_tok = _clip_tokenizer()
    t5_tok = _t5_tokenizer()
    clip_hidden, t5_dim, latent = 32, 32, 4
    transformer = seed(
        "transformer",
        lambda: FluxTransformer2DModel(
            patch_size=1,
            in_channels=4 * latent,
            num_layers=shape["double"],
            num_single_layers=shape["single"],
            attention_head_dim=shape["head_dim"],
            num_attention_heads=shape["heads"],
            joint_attention_dim=t5_dim,
            pooled_projection_dim=clip_hidden,
            guidance_embeds=False,
            axes_dims_rope=shape["rope"],
        ),
    )
    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000,
            shift=1.0,
            use_dynamic_shifting=False,
            base_shift=0.5,
            max_shift=1.15,
            base_image_seq_len=256,
            max_image_seq_len=4096,
        ),
        vae=_vae_kl(
            seed,
            latent,
            shape["vae"],
            shape["vae_layers"],
            scaling_factor=0.3611,
            shift_factor=0.1159,
            use_quant_conv=False,
            use_post_quant_conv=False,
        ),
        text_encoder=_clip_text(seed, "text_encoder", clip_tok, clip_hidden, with_projection=False),
        tokenizer=clip_tok,
        text_encoder_2=_t5_encoder(seed, "text_encoder_2", t5_tok, t5_dim),
        tokenizer_2=t5_tok,
        transformer=transformer,
    )


def _flux2(seed: _Seeder, size: str) -> Any:
    """FLUX.2 [klein]-like: Qwen3 text encoder (3 stacked hidden layers), step-distilled (no CFG)."""
    from diffusers import (
        AutoencoderKLFlux2,
        FlowMatchEulerDiscreteScheduler,
        Flux2KleinPipeline,
        Flux2Transformer2DModel,
    )
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = _qwen_tokenizer()
    hidden = 32
    # The pipeline stacks hidden states 9, 18 and 27 by default, so the encoder needs 27 (very thin) layers.
    text_config = Qwen3Config(
        **_qwen_text_common(len(tok), hidden),
        num_hidden_layers=27,
        head_dim=16,
        tie_word_embeddings=True,
        use_cache=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    latent = 4
    transformer = seed(
        "transformer",
        lambda: Flux2Transformer2DModel(
            patch_size=1,
            in_channels=4 * latent,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=3 * hidden,
            timestep_guidance_channels=32,
            mlp_ratio=3.0,
            axes_dims_rope=(4, 4, 4, 4),
            guidance_embeds=False,
        ),
    )
    vae = seed(
        "vae",
        lambda: AutoencoderKLFlux2(
            block_out_channels=(8, 16, 16, 16),
            layers_per_block=1,
            latent_channels=latent,
            norm_num_groups=4,
            sample_size=64,
        ),
    )
    return Flux2KleinPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000,
            shift=3.0,
            use_dynamic_shifting=True,
            time_shift_type="exponential",
            base_shift=0.5,
            max_shift=1.15,
            base_image_seq_len=256,
            max_image_seq_len=4096,
        ),
        vae=vae,
        text_encoder=seed("text_encoder", lambda: Qwen3ForCausalLM(text_config)),
        tokenizer=tok,
        transformer=transformer,
        is_distilled=True,
    )


def _sd3(seed: _Seeder, size: str) -> Any:
    """SD3/3.5-like MMDiT: CLIP-L + CLIP-G (pooled and penultimate states) + T5, 16 latent channels."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    clip_tok = _clip_tokenizer()
    clip_tok_2 = _clip_tokenizer(pad_token="!")
    t5_tok = _t5_tokenizer()
    clip_hidden, t5_dim = 16, 32  # the two CLIP widths are concatenated and zero-padded to the T5 width
    transformer = seed(
        "transformer",
        lambda: SD3Transformer2DModel(
            sample_size=32,
            patch_size=2,
            in_channels=16,
            num_layers=2,
            attention_head_dim=8,
            num_attention_heads=4,
            joint_attention_dim=t5_dim,
            caption_projection_dim=32,
            pooled_projection_dim=2 * clip_hidden,
            out_channels=16,
            pos_embed_max_size=64,
            dual_attention_layers=(0,),
            qk_norm="rms_norm",
        ),
    )
    return StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0),
        vae=_vae_kl(
            seed,
            16,
            scaling_factor=1.5305,
            shift_factor=0.0609,
            use_quant_conv=False,
            use_post_quant_conv=False,
        ),
        text_encoder=_clip_text(seed, "text_encoder", clip_tok, clip_hidden, with_projection=True),
        tokenizer=clip_tok,
        text_encoder_2=_clip_text(seed, "text_encoder_2", clip_tok_2, clip_hidden, with_projection=True),
        tokenizer_2=clip_tok_2,
        text_encoder_3=_t5_encoder(seed, "text_encoder_3", t5_tok, t5_dim),
        tokenizer_3=t5_tok,
    )


def _sdxl(seed: _Seeder, size: str) -> Any:
    """SDXL-like UNet with text_time added conditioning; two CLIP encoders (the second with projection)."""
    from diffusers import EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel

    clip_tok = _clip_tokenizer()
    clip_tok_2 = _clip_tokenizer(pad_token="!")
    hidden_1, hidden_2, time_dim = 16, 32, 8
    unet = seed(
        "unet",
        lambda: UNet2DConditionModel(
            sample_size=8,
            in_channels=4,
            out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            block_out_channels=(16, 32),
            layers_per_block=1,
            norm_num_groups=4,
            attention_head_dim=(2, 4),
            transformer_layers_per_block=(1, 1),
            use_linear_projection=True,
            cross_attention_dim=hidden_1 + hidden_2,
            addition_embed_type="text_time",
            addition_time_embed_dim=time_dim,
            projection_class_embeddings_input_dim=6 * time_dim + hidden_2,
        ),
    )
    scheduler = EulerDiscreteScheduler(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        prediction_type="epsilon",
        timestep_spacing="leading",
        steps_offset=1,
    )
    return StableDiffusionXLPipeline(
        vae=_vae_kl(seed, 4, scaling_factor=0.13025),
        text_encoder=_clip_text(seed, "text_encoder", clip_tok, hidden_1, with_projection=False),
        text_encoder_2=_clip_text(seed, "text_encoder_2", clip_tok_2, hidden_2, with_projection=True),
        tokenizer=clip_tok,
        tokenizer_2=clip_tok_2,
        unet=unet,
        scheduler=scheduler,
        force_zeros_for_empty_prompt=True,
    )


def _qwenimage(seed: _Seeder, size: str) -> Any:
    """Qwen-Image-like: Qwen2.5-VL text encoder (tiny vision tower included), Wan-style causal 3D VAE."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tok = _qwen_tokenizer()
    hidden = 32
    ids = tok.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(
        text_config={
            **_qwen_text_common(len(tok), hidden),
            "num_hidden_layers": 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            "pad_token_id": tok.pad_token_id,
            "bos_token_id": tok.pad_token_id,
            "eos_token_id": tok.eos_token_id,
            "use_cache": False,
        },
        vision_config={
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "out_hidden_size": hidden,
            "fullatt_block_indexes": [0],
        },
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=True,
    )
    z_dim = 4
    transformer = seed(
        "transformer",
        lambda: QwenImageTransformer2DModel(
            patch_size=2,
            in_channels=4 * z_dim,
            out_channels=z_dim,
            num_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=hidden,
            axes_dims_rope=(4, 6, 6),
        ),
    )
    vae = seed(
        "vae",
        lambda: AutoencoderKLQwenImage(
            base_dim=8,
            z_dim=z_dim,
            dim_mult=[1, 2, 2, 2],
            num_res_blocks=1,
            temperal_downsample=[False, True, True],
            latents_mean=[0.0] * z_dim,
            latents_std=[1.0] * z_dim,
        ),
    )
    return QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(
            num_train_timesteps=1000,
            shift=1.0,
            use_dynamic_shifting=True,
            time_shift_type="exponential",
            base_shift=0.5,
            max_shift=0.9,
            base_image_seq_len=256,
            max_image_seq_len=8192,
            shift_terminal=0.02,
        ),
        vae=vae,
        text_encoder=seed("text_encoder", lambda: Qwen2_5_VLForConditionalGeneration(config)),
        tokenizer=tok,
        transformer=transformer,
    )


# Z-Image shapes per size; "small" is sized like small FLUX.1 (its VAE decoder supplies most of the time).
_ZIMAGE_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"dim": 32, "heads": 2, "axes": [4, 6, 6], "vae": (8, 16, 16, 16)},
    "small": {"dim": 96, "heads": 4, "axes": [4, 10, 10], "vae": (112, 32, 16, 16)},
}


def _zimage(seed: _Seeder, size: str) -> Any:
    """Z-Image-Turbo-like: one single-stream transformer (noise and context refiners, then joint layers), the
    Qwen3 text encoder (its second-to-last hidden state), FLUX.1's 16-channel VAE layout (here 4 channels)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    shape = _ZIMAGE_SIZES[size]
    tok = _qwen_tokenizer()
    hidden, latent = 32, 4
    text_config = Qwen3Config(
        **_qwen_text_common(len(tok), hidden),
        num_hidden_layers=2,
        head_dim=16,
        tie_word_embeddings=True,
        use_cache=False,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    transformer = seed(
        "transformer",
        lambda: ZImageTransformer2DModel(
            all_patch_size=(2,),
            all_f_patch_size=(1,),
            in_channels=latent,
            dim=shape["dim"],
            n_layers=2,
            n_refiner_layers=1,
            n_heads=shape["heads"],
            n_kv_heads=shape["heads"],
            cap_feat_dim=hidden,
            axes_dims=shape["axes"],  # sums to the head width, as the published [32, 48, 48] to 128
            axes_lens=[1024, 512, 512],
        ),
    )
    return ZImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False),
        vae=_vae_kl(
            seed,
            latent,
            shape["vae"],
            scaling_factor=0.3611,
            shift_factor=0.1159,
            use_quant_conv=False,
            use_post_quant_conv=False,
        ),
        text_encoder=seed("text_encoder", lambda: Qwen3Model(text_config)),
        tokenizer=tok,
        transformer=transformer,
    )


def _wan(seed: _Seeder, size: str) -> Any:
    """Wan 2.1-like text to video: UMT5 text encoder, a 2-block video DiT (patches 1x2x2, 2 heads), Wan's causal 3D
    VAE (8x spatial, 4x temporal) and the published UniPC flow schedule. 5 frames of 32x32 make 8 tokens."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    tok = _t5_tokenizer()
    hidden, z_dim = 32, 4
    text = UMT5Config(vocab_size=len(tok), d_model=hidden, d_kv=hidden // 4, d_ff=2 * hidden, num_layers=2,
                      num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=32,
                      feed_forward_proj="gated-gelu", dropout_rate=0.0, is_encoder_decoder=False, use_cache=False,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    transformer = seed(
        "transformer",
        lambda: WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=z_dim,
            out_channels=z_dim, text_dim=hidden, freq_dim=16, ffn_dim=32, num_layers=2, rope_max_seq_len=32,
        ),
    )
    vae = seed(
        "vae",
        lambda: AutoencoderKLWan(
            base_dim=8, z_dim=z_dim, dim_mult=[1, 2, 2, 2], num_res_blocks=1, temperal_downsample=[False, True, True],
            latents_mean=[0.0] * z_dim, latents_std=[1.0] * z_dim,
        ),
    )
    return WanPipeline(
        tokenizer=tok,
        text_encoder=seed("text_encoder", lambda: UMT5EncoderModel(text)),
        vae=vae,
        scheduler=UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0),
        transformer=transformer,
    )


def _wan_i2v(seed: _Seeder, size: str) -> Any:
    """Wan 2.1-like image to video: the text-to-video parts of `_wan`, a CLIP vision image encoder (clip_vision_h's
    role: its second-to-last hidden state conditions every block) and its image processor, and a denoiser that
    also reads the start image's latents and mask (in channels 2 · z_dim + 4, as the published 36 for 16)."""
    from diffusers import WanImageToVideoPipeline, WanTransformer3DModel
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    t2v = _wan(seed, size)
    z_dim, width = t2v.vae.config.z_dim, 16
    vision = CLIPVisionConfig(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
                              num_attention_heads=2, image_size=32, patch_size=8, projection_dim=width)
    transformer = seed(
        "transformer_i2v",
        lambda: WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=2 * z_dim + 4,
            out_channels=z_dim, text_dim=t2v.text_encoder.config.d_model, freq_dim=16, ffn_dim=32, num_layers=2,
            rope_max_seq_len=32, image_dim=width, added_kv_proj_dim=24,
        ),
    )
    processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32},
                                   image_mean=[0.48145466, 0.4578275, 0.40821073],
                                   image_std=[0.26862954, 0.26130258, 0.27577711])
    return WanImageToVideoPipeline(
        tokenizer=t2v.tokenizer, text_encoder=t2v.text_encoder, vae=t2v.vae, scheduler=t2v.scheduler,
        transformer=transformer, image_encoder=seed("image_encoder", lambda: CLIPVisionModel(vision)),
        image_processor=processor,
    )


def _wan22(seed: _Seeder, size: str) -> Any:
    """Wan 2.2 A14B-like text to video: `_wan`'s parts with a second expert (`transformer_2`, low noise, its own
    weights) and the published boundary_ratio (0.875) and flow shift (12): 2 steps run the high-noise expert only,
    3 run both (the last step's timestep is below the boundary)."""
    from diffusers import UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel

    wan = _wan(seed, size)
    low = seed("transformer_2", lambda: WanTransformer3DModel.from_config(wan.transformer.config))
    return WanPipeline(
        tokenizer=wan.tokenizer, text_encoder=wan.text_encoder, vae=wan.vae, transformer=wan.transformer,
        transformer_2=low, boundary_ratio=0.875,
        scheduler=UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=12.0),
    )


_BUILDERS: dict[str, Callable[[_Seeder, str], Any]] = {
    "flux": _flux,
    "flux2": _flux2,
    "sd3": _sd3,
    "sdxl": _sdxl,
    "qwenimage": _qwenimage,
    "zimage": _zimage,
    "wan": _wan,
    "wan-i2v": _wan_i2v,
    "wan22": _wan22,
}


# ----------------------------------------------------------------------------------------------------------
# ControlNets (Apply ControlNet): one tiny random-weight ControlNet per kind, fitting its tiny pipeline
# ----------------------------------------------------------------------------------------------------------

# name -> (tiny pipeline family, diffusers class, changes to the config taken from the pipeline's denoiser)
CONTROLNETS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "flux": ("flux", "FluxControlNetModel", {"num_layers": 1, "num_single_layers": 1}),
    "flux-union": ("flux", "FluxControlNetModel", {"num_layers": 1, "num_single_layers": 1, "num_mode": 7}),
    "sd3": ("sd3", "SD3ControlNetModel", {"num_layers": 1}),
    "sdxl": ("sdxl", "ControlNetModel", {}),
    "sdxl-union": ("sdxl", "ControlNetUnionModel", {"num_control_type": 8, "num_trans_channel": 16, "num_trans_head": 2,
                                                    "num_proj_channel": 16}),
    "qwenimage": ("qwenimage", "QwenImageControlNetModel", {"num_layers": 1}),
    # Z-Image-Turbo-Fun-Controlnet-Union 2.1 (control refiner blocks; reads image and mask too: 2 × 4 + 1 channels)
    # and 1.0 (plain refiner blocks, the control image only); control layers evenly over the transformer's 2
    "zimage": ("zimage", "ZImageControlNetModel", {"control_layers_places": [0, 1], "control_refiner_layers_places": [0],
                                                   "add_control_noise_refiner": "control_noise_refiner",
                                                   "control_in_dim": 9}),
    "zimage-1.0": ("zimage", "ZImageControlNetModel", {"control_layers_places": [0], "control_refiner_layers_places": [],
                                                       "add_control_noise_refiner": None, "control_in_dim": 4}),
}


def build_tiny_controlnet(name: str, pipeline: str | os.PathLike, out_dir: str | os.PathLike, seed: int = 0) -> pathlib.Path:
    """Saves ControlNet `name` (a key of CONTROLNETS) for the pipeline folder `pipeline` (a tiny or small one of its
    family) as a diffusers folder `out_dir` (config.json + diffusion_pytorch_model.safetensors, the layout its
    published files have).
    Every weight is drawn at random (diffusers zero-initialises a new ControlNet's output layers, which would leave
    the image unchanged). Deterministic for a seed; skipped when the folder exists."""
    import diffusers

    _, class_name, changes = CONTROLNETS[name]
    out = pathlib.Path(out_dir)
    if (out / "config.json").is_file():
        return out
    cls = getattr(diffusers, class_name)
    base = pathlib.Path(pipeline)
    denoiser = "unet" if (base / "unet").is_dir() else "transformer"
    config = json.loads((base / denoiser / "config.json").read_text())
    wanted = inspect.signature(cls.__init__).parameters
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
        model = cls(**{**{k: v for k, v in config.items() if k in wanted}, **changes}).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * (0.5 / (p[0].numel() ** 0.5) if p.ndim > 1 else 0.02))
    model.save_pretrained(out)
    return out
