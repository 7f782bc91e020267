"""A benchmark's figures over its rounds: the median with its range, and how a report writes them."""

from __future__ import annotations

import statistics


def summary(values: list[float]) -> dict:
    """``{"median", "min", "max", "rounds"}`` of one figure's values, a value per round."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "rounds": len(values),
    }


def ratio_text(s: dict) -> str:
    """A :func:`summary` of ratios as a report shows it: ``0.95x (0.93-1.09)``."""
    spread = f" ({s['min']:.2f}-{s['max']:.2f})" if s["rounds"] > 1 else ""
    return f"{s['median']:.2f}x{spread}"
