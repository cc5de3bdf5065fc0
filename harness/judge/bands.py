"""Tolerance bands computed from the spread of repeated runs (golden loss values and memory layouts use the same
rule), and the one test of a value against a golden point that the grader's checkers and the population's
held-out evaluation both use."""

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


def within(value: float, mean: float, tol: float) -> bool:
    """`value` is inside the golden point mean +/- tol (edges included); a nan value never is."""
    return abs(value - mean) <= tol


def margin(value: float, mean: float, tol: float) -> float:
    """How far inside the band `value` is (tol - |value - mean|): >= 0 exactly when within(); -inf for nan."""
    m = tol - abs(value - mean)
    return m if m == m else -math.inf
