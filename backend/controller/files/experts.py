"""A model of two denoisers from two files of one shape (Wan 2.2 A14B's experts: high noise, then low noise;
Ideogram 4's conditional and unconditional transformers): which file is which, told where ComfyUI's files say it
(their names) and by their bytes (one file twice)."""

from __future__ import annotations

from pathlib import Path

from ...families.base import ModelFamily
from ...protocol.errors import ModelError
from .recognise import Contents


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


def check_pair(family: ModelFamily, main: Path, second: Path | None, contents: Contents | None,
               shapes: dict) -> None:
    """The second file of a family whose two denoisers always run together (`family.pair`: Ideogram 4): chosen,
    of the family, of the first's shapes (`shapes`), not the same weights, and not the first by its name."""
    pair, a = family.pair, main.name
    both = (f"{family.name} runs two transformers every step, {pair.first} (diffusion_model) and {pair.second} "
            f"(diffusion_model_2, {pair.hint})")
    if second is None:
        fix = (f"Choose {pair.first} in diffusion_model, and '{a}' in diffusion_model_2" if pair.marker in a.lower()
               else f"Choose {pair.second} in diffusion_model_2")
        raise ModelError(f"diffusion_model_2: {both}; only '{a}' was chosen. {fix}.")
    b = second.name
    if contents is None or contents.denoiser is None or contents.denoiser.kind != family.id:
        what = contents.describe() if contents is not None else "it holds no diffusion model"
        raise ModelError(f"diffusion_model_2: '{b}' is not {pair.second} of {family.name} ({what}); {both}.")
    if contents.denoiser.shapes != shapes:
        raise ModelError(f"diffusion_model_2: '{b}' does not have the shapes of '{a}': {pair.first} and "
                         f"{pair.second} of one model have the same shapes. Choose the {pair.marker} file that "
                         f"goes with '{a}'.")
    if same_weights(main, second):
        raise ModelError(f"diffusion_model_2: '{b}' holds the same weights as diffusion_model ('{a}'): {both}.")
    marked_main, marked_second = pair.marker in a.lower(), pair.marker in b.lower()
    if marked_main:
        where = (f"diffusion_model, diffusion_model_2: '{a}' and '{b}' are in each other's place" if not marked_second
                 else f"diffusion_model: '{a}' is {pair.second} too")
        raise ModelError(f"{where}: {both}. {'Swap them' if not marked_second else f'Choose {pair.first} there'}.")
