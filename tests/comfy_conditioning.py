"""CONDITIONING made by ComfyUI's own code from tiny FLUX.1 text encoder files (CLIP-L and T5-XXL).

ComfyUI's CLIP loaders build the published sizes from fixed configs (CLIP-L 768 wide, T5-XXL 4096), so the tiny
files do not load through CLIPLoader or DualCLIPLoader as such: `comfy.sd.load_clip` (what DualCLIPLoader calls)
refuses them with size mismatches. Here the same `load_clip` runs with ComfyUI's own config overrides set to the tiny
sizes (`model_options["t5xxl_model_config"]`, which SDClipModel merges into its config, and `["model_config"]`, which
load_clip's long-CLIP check turns into CLIP-L's) and float32 weights (`["dtype"]`, what --fp32-text-enc sets;
ComfyUI's default is float16 weights, also on the CPU, which moves T5's output by about 1e-3 here); everything else is ComfyUI's code as the nodes run it: its tokenizers, FluxClipModel, CLIP Text
Encode, FluxGuidance, ConditioningConcat, ConditioningAverage, ConditioningCombine, ConditioningSetTimestepRange,
Conditioning (Set Area). ComfyUI's T5 has the published 32 relative-attention buckets built in (no override), so the
test gives it a tiny T5 with 32. SD3's and SDXL's encoders cannot run at tiny sizes even so (SD3ClipModel pads to a
fixed 4096; both read CLIP's penultimate layer and assert more than two layers, which the tiny CLIPs have).

Run as a script (in a subprocess, so ComfyUI's modules never enter the test process):
    python tests/comfy_conditioning.py COMFYUI_DIR CLIP_L_FILE T5_FILE OUT_FILE PROMPT
OUT_FILE gets a pickle of {name: CONDITIONING with numpy arrays}.
"""

from __future__ import annotations

import pickle
import sys

# the tiny encoders' sizes (tests/file_fixtures.py: _clip(32, 1, "quick_gelu"), _t5(32))
CLIP_L = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 1, "num_hidden_layers": 2,
          "projection_dim": 32, "hidden_act": "quick_gelu"}
T5 = {"d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4}


def main(comfyui_dir: str, clip_l: str, t5: str, out: str, prompt: str) -> None:
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from file_fixtures import import_comfy

    import_comfy(comfyui_dir)
    import comfy.sd
    import torch
    from comfy_extras.nodes_flux import FluxGuidance

    import nodes

    files = [clip_l, t5]
    try:
        comfy.sd.load_clip(files, clip_type=comfy.sd.CLIPType.FLUX)
        refused = ""
    except RuntimeError as e:
        refused = " ".join(str(e).splitlines()[:2])
    # float32 weights, as ComfyUI's --fp32-text-enc gives (its default is float16 weights even on the CPU)
    clip = comfy.sd.load_clip(files, clip_type=comfy.sd.CLIPType.FLUX,
                              model_options={"model_config": dict(CLIP_L), "t5xxl_model_config": T5,
                                             "dtype": torch.float32})
    encode = nodes.CLIPTextEncode().encode
    plain = encode(clip, prompt)[0]
    other = encode(clip, "a small house by the river at night")[0]
    conds = {
        "plain": plain,
        "weighted": encode(clip, f"({prompt}:1.3)")[0],
        "guidance": FluxGuidance.execute(plain, 2.5).args[0],
        "concat": nodes.ConditioningConcat().concat(plain, other)[0],
        "average": nodes.ConditioningAverage().addWeighted(plain, other, 0.25)[0],
        "combine": nodes.ConditioningCombine().combine(plain, other)[0],
        "timestep_range": nodes.ConditioningSetTimestepRange().set_range(plain, 0.0, 0.5)[0],
        "area": nodes.ConditioningSetArea().append(plain, 64, 64, 0, 0, 1.0)[0],
    }
    result = {name: [[c.float().numpy(), {k: v.float().numpy() if hasattr(v, "numpy") else v
                                          for k, v in extras.items()}] for c, extras in cond]
              for name, cond in conds.items()}
    result["_refused"] = refused
    with open(out, "wb") as f:
        pickle.dump(result, f)


if __name__ == "__main__":
    main(*sys.argv[1:6])
