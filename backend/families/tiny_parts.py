"""What the families' tiny builders share: generated tokenizers (no files downloaded), a seeder that keeps each
component's weights stable, and the text encoders and VAE several families use. Torch: for the tiny builders
(each family's tiny.py), which the tests, `tpu-check` and `make-tiny-models` run; never the controller.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import torch

# Words that get their own BPE merges / unigram pieces, so common prompts tokenize to a realistic handful
# of tokens instead of one token per byte. Any other text still tokenizes (byte fallback for the BPE
# tokenizers, single characters for the unigram one).
WORDS: tuple[str, ...] = tuple(
    """
    a an the of in on and with at to is by for from photo picture painting drawing image portrait landscape
    close up cat dog bird horse fox car house tree flower mountain river sea city street forest sky sun moon
    night day light dark red green blue yellow white black small big old young man woman person astronaut
    riding sitting standing beautiful detailed high quality style
    system user assistant Describe detailing color shape size texture quantity text spatial relationships
    objects background
    """.split()
)


class Seeder:
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


def clip_tokenizer(pad_token: str = "<|endoftext|>") -> Any:
    """CLIP byte-level BPE with ``</w>`` word ends; model_max_length=77 like the real CLIP tokenizers."""
    from transformers import CLIPTokenizer

    chars = list(_byte_to_unicode().values())
    merges = _train_bpe((*word[:-1], word[-1] + "</w>") for word in WORDS if len(word) > 1)
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


def qwen_tokenizer() -> Any:
    """Qwen2 byte-level BPE (no end-of-word marker, ``Ġ`` for a leading space) with the Qwen special tokens."""
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    table = _byte_to_unicode()
    space = table[ord(" ")]
    corpus = [tuple(w) for w in WORDS if len(w) > 1] + [(space, *w) for w in WORDS]
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


def t5_tokenizer() -> Any:
    """T5 SentencePiece-style Unigram tokenizer: <pad>=0, </s>=1, <unk>=2, pieces with the ``▁`` word marker."""
    from transformers import T5Tokenizer

    pieces: list[tuple[str, float]] = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    seen = {p for p, _ in pieces}

    def add(piece: str, score: float) -> None:
        if piece not in seen:
            seen.add(piece)
            pieces.append((piece, score))

    for word in WORDS:
        add("▁" + word, -3.0 - 0.01 * len(pieces))
    for code in range(ord("!"), ord("~") + 1):
        add(chr(code), -8.0)
        add("▁" + chr(code), -7.0)
    return T5Tokenizer(vocab=pieces, extra_ids=0, model_max_length=512)


_GEMMA_SPECIALS: tuple[str, ...] = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>",
                                     "<start_of_image>", "<end_of_image>", "<image_soft_token>")


def gemma_tokenizer() -> Any:
    """Gemma-style BPE (``▁`` word marker, ``<0xNN>`` byte fallback), ids 0..4 = pad, eos, bos, unk, mask as in
    Gemma 3 (LTX-2's text encoder), and the image tokens Gemma3ForConditionalGeneration's config names."""
    from transformers import GemmaTokenizer

    vocab = {t: i for i, t in enumerate(_GEMMA_SPECIALS)}
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    letters = "▁" + "".join(WORDS) + "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-:<>"
    for ch in sorted(set(letters)):
        vocab.setdefault(ch, len(vocab))
    merges = _train_bpe(("▁", *w) for w in WORDS)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    return GemmaTokenizer(vocab=vocab, merges=merges, model_max_length=1024)


def clip_text(seed: Seeder, name: str, tokenizer: Any, hidden: int, with_projection: bool) -> Any:
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


def t5_encoder(seed: Seeder, name: str, tokenizer: Any, d_model: int) -> Any:
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


def vae_kl(
    seed: Seeder,
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


def qwen_text_common(vocab_size: int, hidden: int) -> dict[str, Any]:
    return {
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
    }



# A Qwen3-VL-style chat template (written for these tiny models): content is a string or a list of {"type": "text"
# / "image"} parts (what Qwen3VLProcessor.apply_chat_template and Ideogram 4 pass); an image becomes
# <|vision_start|><|image_pad|><|vision_end|>; an empty think block when enable_thinking is false.
QWEN3VL_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{ part['text'] }}"
    "{%- elif part['type'] == 'image' -%}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\n\n</think>\n\n' }}{%- endif -%}"
    "{%- endif -%}"
)


def qwen3vl_tokenizer() -> Any:
    """The Qwen tokenizer above with Qwen3-VL's kind of chat template (content as a list of parts)."""
    tok = qwen_tokenizer()
    tok.chat_template = QWEN3VL_CHAT_TEMPLATE
    return tok


def qwen3vl_processor(tok: Any, patch: int = 16, merge: int = 2, size: dict | None = None) -> Any:
    """Qwen3VLProcessor: `tok` + Qwen2-VL's image processor and Qwen3-VL's video processor with Qwen3-VL's settings
    (patch 16, temporal patch 2, merge 2, mean/std 0.5, its pixel budget: Qwen-Image 2.1 needs the vision tower to
    see a reference at the size its VAE encodes, 1024² pixels, one vision token per 2x2 latent pixels)."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    size = size or {"shortest_edge": 65536, "longest_edge": 16777216}  # Qwen3-VL-8B-Instruct's preprocessor_config
    settings = dict(patch_size=patch, temporal_patch_size=2, merge_size=merge, image_mean=[0.5] * 3,
                    image_std=[0.5] * 3, size=size)
    return Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(**settings), tokenizer=tok,
                            video_processor=Qwen3VLVideoProcessor(**settings), chat_template=QWEN3VL_CHAT_TEMPLATE)


def qwen3vl_config(tok: Any, hidden: int = 32, layers: int = 2) -> Any:
    """A tiny Qwen3-VL config: text 2 heads of 16 with interleaved mRoPE [2, 3, 3] (`layers` thin layers: the
    pipelines that tap fixed layers of the 36 published ones need 36); vision 1 block, patch 16, deepstack [0]."""
    from transformers import Qwen3VLConfig

    ids = tok.convert_tokens_to_ids
    text = {**qwen_text_common(len(tok), hidden), "num_hidden_layers": layers, "head_dim": 16,
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [2, 3, 3],
                                "mrope_interleaved": True},
            "pad_token_id": tok.pad_token_id, "use_cache": False, "tie_word_embeddings": True}
    vision = {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "patch_size": 16,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": hidden,
              "num_position_embeddings": 64, "deepstack_visual_indexes": [0]}
    return Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
                         video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
                         vision_end_token_id=ids("<|vision_end|>"), tie_word_embeddings=True)
