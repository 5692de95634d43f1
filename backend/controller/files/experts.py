"""A model of two experts (Wan 2.2 A14B: high noise, then low noise) from two files of one shape: which file is
which expert, told where ComfyUI's files say it (their names) and by their bytes (one file twice)."""

from __future__ import annotations

from pathlib import Path

from ...protocol.errors import ModelError


def check_order(pair: str, main: Path, second: Path) -> None:
    """The two experts are one file's shapes, so they are told apart where ComfyUI's files say which is which (their
    names carry high_noise / low_noise) and by their weights (the same bytes are the same expert): one file twice,
    or the two swapped, would run one expert for both noise levels, or each at the other's, and give a bad video."""
    a, b = main.name, second.name
    if same_weights(main, second):
        raise ModelError(f"diffusion_model_2: '{b}' holds the same weights as diffusion_model ('{a}'): {pair} needs "
                         "its two experts, the high-noise one in diffusion_model and the low-noise one in "
                         "diffusion_model_2.")
    high_second, low_main = "high_noise" in b.lower(), "low_noise" in a.lower()
    if high_second or low_main:
        if high_second and low_main:
            where = f"diffusion_model, diffusion_model_2: '{a}' and '{b}' are in each other's place"
        elif high_second:
            where = f"diffusion_model_2: '{b}' is the high-noise expert, chosen as the low-noise one"
        else:
            where = f"diffusion_model: '{a}' is the low-noise expert, chosen as the high-noise one"
        raise ModelError(f"{where}: {pair} runs the high-noise expert (diffusion_model) first and the low-noise one "
                         "(diffusion_model_2) for the last steps. Swap them.")


def same_weights(a: Path, b: Path) -> bool:
    """Whether two files hold the same weights: the same file, or equal in size and in three 64 KiB samples of
    their bytes (two experts differ everywhere their weights are stored)."""
    if a.resolve() == b.resolve():
        return True
    size = a.stat().st_size
    if size != b.stat().st_size:
        return False
    with a.open("rb") as fa, b.open("rb") as fb:
        for at in (size // 4, size // 2, 3 * size // 4):
            fa.seek(at)
            fb.seek(at)
            if fa.read(65536) != fb.read(65536):
                return False
    return True
