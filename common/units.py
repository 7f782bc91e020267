"""Byte counts written for people: read (``"4MiB"``, ``"1G"``, ``"128k"``, ``"4096"``) and written (``"2.5 MiB"``)."""

from __future__ import annotations

import argparse

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """A byte count from ``"4MiB"``, ``"1G"``, ``"128k"`` or ``"4096"``.

    Raises
    ------
    argparse.ArgumentTypeError
        The text is not a size.
    """
    t = str(text).strip().lower()
    for suffix in ("ib", "b"):
        if t.endswith(suffix):
            t = t[: -len(suffix)]
            break
    unit = t[-1:] if t[-1:] in _UNITS and t[-1:] else ""
    number = t[: len(t) - len(unit)]
    try:
        value = int(float(number) * _UNITS[unit])
    except (ValueError, OverflowError):  # OverflowError: "inf", "1e400"
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"negative size: {text!r}")
    return value


def format_size(n: float) -> str:
    """``n`` bytes in binary units, four significant digits (``2.5 MiB``, ``800 GiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.4g} {unit}"
        n /= 1024
    return f"{n} B"
