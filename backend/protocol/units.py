"""How sizes are written for people: one formatter, in binary units (device memory is sold in GiB), so a model's
size reads the same next to the loader, in the load status and in offload's reasons."""

from __future__ import annotations


def format_bytes(n: float | None) -> str:
    """'22.2 GiB', '7.6 MiB', '512 B'; '? GiB' when the size is not known."""
    if n is None:
        return "? GiB"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"
