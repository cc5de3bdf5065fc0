"""GPU memory bands per parallel layout: the run's layout from its evidence, and the band calibrated for it.

More ranks legitimately use more memory per GPU (NCCL communicators, gradient buffers), so a DP=2 or TP=2 run
is judged against its own measured peaks, never against the 1-GPU band. A layout file (fixtures/golden/) keeps
the measured per-rank peaks of each layout with their provenance; the band is computed from them by the same
rule as the 1-GPU band (`memory_band`). A layout the file does not have has no band: not measured.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from harness.base.errors import HarnessError
from harness.judge.bands import compute_band
from harness.base.paths import GOLDEN_DIR

MEMORY_REL_TOL = 0.10  # memory varies with allocator and library versions more than with the seed
BAND_RULE = f"[min - tol, max + tol], tol = max(3 std, {MEMORY_REL_TOL:.0%} of mean)"
PARALLEL_ARGS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size", "world_size")


class LayoutError(HarnessError, ValueError):
    """A layout file is wrong; the message names the file and the layout."""


@dataclass(frozen=True)
class Layout:
    """How a run split its work: tensor-, pipeline- and data-parallel sizes (their product is the world size)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def name(self) -> str:
        """`1 GPU`, `DP=2`, `TP=2`, `TP=2 x DP=2`: the sizes above 1."""
        parts = [f"{n}={s}" for n, s in (("TP", self.tp), ("PP", self.pp), ("DP", self.dp)) if s > 1]
        return " x ".join(parts) if parts else "1 GPU"


@dataclass(frozen=True)
class LayoutBand:
    """One layout's calibrated band and the per-rank peaks it was computed from."""

    key: str
    layout: Layout
    lo: int
    hi: int
    samples: dict = field(hash=False)        # "rank 0 (GPU 0)" -> peak MiB


def memory_band(peaks: list[float]) -> dict:
    """The band for a memory criterion from measured peaks: [min - tol, max + tol], tol = max(3 std, 10% of mean)."""
    band = compute_band(peaks, MEMORY_REL_TOL)
    return {"lo": round(min(peaks) - band.tol), "hi": round(max(peaks) + band.tol), "samples": peaks,
            "rule": BAND_RULE}


def _size(value) -> int | None:
    """A printed or JSON size as an int (None when absent or not a positive integer)."""
    try:
        size = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    return size if size > 0 else None


def _from_sizes(sizes: dict) -> Layout | None:
    """A Layout from {tensor_model_parallel_size, pipeline_model_parallel_size, data_parallel_size, world_size}."""
    tp = _size(sizes.get("tensor_model_parallel_size")) or 1
    pp = _size(sizes.get("pipeline_model_parallel_size")) or 1
    dp, world = _size(sizes.get("data_parallel_size")), _size(sizes.get("world_size"))
    if dp is None and world is not None and world % (tp * pp) == 0:
        dp = world // (tp * pp)
    if dp is None or (world is not None and world != tp * pp * dp):
        return None
    return Layout(tp, pp, dp)


def layout_of(ev) -> tuple[Layout | None, str]:
    """(layout, where it was read): the log's `arguments` block, else summary.json, else NVML's GPU count.

    Megatron-LM and the reference trainer both print world_size and data_parallel_size in the block; the
    trainer's summary.json records the same sizes. Without either, a run that NVML saw on one GPU is a 1-GPU
    run; one seen on several GPUs has an unknown layout (None).
    """
    printed = getattr(ev.log, "arguments", None) or {}
    recorded = (ev.extra or {}).get("summary") or {}
    arguments = {name: printed[name] for name in PARALLEL_ARGS if name in printed}
    summary = {name: recorded[name] for name in PARALLEL_ARGS if name in recorded}
    # the block alone; else the summary, with the block's sizes where it has them (older logs print TP and PP only)
    for sizes, how in ((arguments, "the log's arguments block"),
                       ({**summary, **arguments}, "the arguments block and summary.json" if arguments
                        else "summary.json")):
        layout = _from_sizes(sizes)
        if layout is not None:
            return layout, how
    gpus = len(ev.memory.ranks) if ev.memory is not None else 0
    if gpus <= 1:
        return Layout(), "no parallel sizes recorded; NVML saw one GPU"
    return None, f"no parallel sizes in the log or summary.json, and NVML saw {gpus} GPUs"


def load_layout_bands(name: str | Path) -> dict:
    """{Layout: LayoutBand} from a layout file (a name under fixtures/golden/, or a path); errors name the file."""
    path = Path(name) if Path(name).is_absolute() else GOLDEN_DIR / name
    try:
        raw = json.loads(path.read_text())
        layouts = raw["layouts"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise LayoutError(f"{path}: cannot read memory layouts (needs a `layouts` object): {exc!r}") from exc
    bands = {}
    for key, entry in layouts.items():
        try:
            layout = Layout(int(entry["tp"]), int(entry["pp"]), int(entry["dp"]))
            samples = {str(rank): float(peak) for rank, peak in entry["peak_mib_per_rank"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise LayoutError(f"{path}: layout {key!r} needs tp, pp, dp and peak_mib_per_rank "
                              f"{{rank: MiB}}: {exc!r}") from exc
        if not samples:
            raise LayoutError(f"{path}: layout {key!r} has no measured peak")
        if layout in bands:
            raise LayoutError(f"{path}: layout {key!r} repeats {layout.name()} (also {bands[layout].key!r})")
        band = memory_band(list(samples.values()))
        bands[layout] = LayoutBand(key, layout, band["lo"], band["hi"], samples)
    return bands
