"""Tolerance bands computed from the spread of repeated runs (golden loss values and memory layouts use the same rule)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Band:
    """Tolerance band of one golden point, computed from repeated runs."""

    mean: float
    std: float
    tol: float
    n: int


def compute_band(samples, rel_tol_floor: float, k: float = 3.0, abs_floor: float = 0.0) -> Band:
    """Band from the spread of runs: tol = max(k * sample std, rel_tol_floor * |mean|, abs_floor)."""
    values = [float(v) for v in samples]
    if not values:
        raise ValueError("compute_band needs at least one sample")
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return Band(mean=mean, std=std, tol=max(k * std, rel_tol_floor * abs(mean), abs_floor), n=len(values))
