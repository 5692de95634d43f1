"""How sizes and counts are written for people: one formatter, in binary units (device memory is sold in GiB), so
a model's size reads the same next to the loader, in the load status and in offload's reasons; and a list of
counts as "1, 4 or 8"."""

from __future__ import annotations

from collections.abc import Sequence


def format_bytes(n: float | None) -> str:
    """'22.2 GiB', '7.6 MiB', '512 B'; '? GiB' when the size is not known."""
    if n is None:
        return "? GiB"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def or_list(values: Sequence[int]) -> str:
    """'1, 4 or 8': the counts a message offers."""
    items = [str(v) for v in values]
    return " or ".join([", ".join(items[:-1]), items[-1]]) if len(items) > 1 else "".join(items)
