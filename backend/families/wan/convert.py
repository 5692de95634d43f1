"""The Wan family's key conversions (torch; the worker reads them through families.conversions, the controller
never): its VAEs' layouts (Wan 2.1's, which Qwen-Image's VAE shares, and Wan 2.2's)."""

from __future__ import annotations

from collections.abc import Callable


def wan21_vae(sd: dict, config: dict) -> dict:
    """Wan 2.1's VAE (Qwen-Image's and Wan 2.2 A14B's too): diffusers' own converter."""
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    return convert_wan_vae_to_diffusers(sd)


_WAN_RESIDUAL = {"residual.0.": "norm1.", "residual.2.": "conv1.", "residual.3.": "norm2.", "residual.6.": "conv2.",
                 "shortcut.": "conv_shortcut."}


def convert_wan22_vae(sd: dict, config: dict | None = None) -> dict:
    """Wan 2.2's VAE (ComfyUI's and Wan's layout) in diffusers' names. diffusers 0.42 has a single-file
    converter for Wan 2.1's VAE only; its middle, head and quant layers are Wan 2.2's too, so that converter
    reads them, and the down and up blocks (Wan 2.2 nests them: `encoder.downsamples.<block>.downsamples.<layer>`,
    the resampler last) are renamed here."""
    import re

    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    blocks, rest = {}, {}
    for key, value in sd.items():
        found = re.match(r"(encoder|decoder)\.(?:down|up)samples\.(\d+)\.(?:down|up)samples\.(\d+)\.(.+)", key)
        if found is None:
            rest[key] = value
            continue
        side, block, layer, name = found.groups()
        kind = "down" if side == "encoder" else "up"
        if name.startswith(("resample.", "time_conv.")):
            blocks[f"{side}.{kind}_blocks.{block}.{kind}sampler.{name}"] = value
        else:
            old = next(k for k in _WAN_RESIDUAL if name.startswith(k))
            blocks[f"{side}.{kind}_blocks.{block}.resnets.{layer}.{_WAN_RESIDUAL[old]}{name[len(old):]}"] = value
    return {**convert_wan_vae_to_diffusers(rest), **blocks}


# The VAE layouts (families/vaes.py) this family's converters read, by loader layout
VAE_CONVERTERS: dict[str, Callable[[dict, dict], dict]] = {"wan-vae": wan21_vae, "wan22-vae": convert_wan22_vae}
