"""ComfyUI's prompt-weight syntax in Sample's own prompt text: read literally, and said so next to the node.

Decided (issue 23, item 4): Sample's prompts go through each pipeline's own diffusers text path (`encode_prompt`,
with the prompt cache, sharded text encoders and Qwen-Image's chat template), so its images equal plain
diffusers' for the same prompt. Honouring `(word:1.3)` there would mean a second copy of ComfyUI's per-encoder
token weighting (CLIP, T5, Qwen2.5-VL, Mistral, Qwen3) inside the workers, beside diffusers', and a prompt meant
literally would change meaning. ComfyUI already owns weighted encoding (CLIP Text Encode); it reaches Sample
through its positive/negative CONDITIONING inputs (FLUX.1, SD3, SDXL: controller/conditioning.py), not a parser here.
"""

from __future__ import annotations

import re

from .. import families
from ..protocol.spec import SampleRequest

# An unescaped ( ... ) group: ComfyUI's parser (comfy/sd1_clip.py token_weights) weighs each one, 1.1 per level
# or the number after the last ':'; `\(` is a literal bracket there.
_GROUP = re.compile(r"(?<!\\)\((?:[^()\\]|\\.)*\)")


def note(req: SampleRequest) -> str | None:
    """What Sample says when a prompt holds ComfyUI's weight syntax (None when none does)."""
    for name, text in (("prompt", req.prompt), ("negative_prompt", req.negative_prompt)):
        found = _GROUP.search(text)
        if found:
            return (f"{name}: '{found.group(0)}' is ComfyUI's prompt-weight syntax; Sample reads its prompts "
                    "literally, as diffusers does: the brackets and any ':1.3' are text the model sees, and no "
                    "weight is applied. For weights, encode the prompt with ComfyUI's CLIP Text Encode and connect it "
                    f"to Sample's positive (and negative) input ({families.conditioned_names()}).")
    return None
