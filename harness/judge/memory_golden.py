"""GPU memory judged portably: the training's own memory against a band calibrated per GPU kind.

What NVML shows for a process is this machine's CUDA context (driver, CUDA version, and the module-loading mode:
CUDA_MODULE_LOADING=EAGER loads every kernel of torch and cuBLAS up front, +640 MiB for a bare torch context on an
H200) plus what the training itself allocates. Only the second part belongs to the course, so the band judges the
training's own memory: the peak that torch's caching allocator reserved (torch.cuda.max_memory_reserved, written
by the trainer into summary.json: weights, Adam state, activations, CUDA-graph pools and cuBLAS workspaces all go
through it). The rest, NVML's peak minus that, is reported as the context of this GPU, beside the total and the
course's "about 2-4 GB".

Bands live in fixtures/golden/memory/<gpu kind>.json (`python -m harness calibrate` writes the file of the GPU it
runs on). A GPU kind with no file of its own is judged by the file named `portable` in FALLBACK (the allocations of
the same code and torch do not depend on the GPU), and the verdict says so.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from harness.base.paths import GOLDEN_DIR

MEMORY_DIR = GOLDEN_DIR / "memory"
FALLBACK = "nvidia-h200"      # the portable band: the GPU kind the suite was calibrated on


def slug(gpu_name: str | None) -> str:
    """A file name for a GPU kind: 'NVIDIA H200' -> 'nvidia-h200'."""
    return re.sub(r"[^a-z0-9]+", "-", (gpu_name or "unknown").lower()).strip("-") or "unknown"


def _read(path: Path) -> dict | None:
    """A golden file's contents (None when absent); a file found is read once per process (every run's verdict
    asks for it), an absent one is looked for again (calibration may write it)."""
    return _parsed(path) if path.is_file() else None


@functools.lru_cache(maxsize=16)
def _parsed(path: Path) -> dict:
    return json.loads(path.read_text())


def select(gpu_name: str | None, folder: Path = MEMORY_DIR) -> tuple[dict | None, str]:
    """(the memory golden for this GPU kind, why that one): its own file, else the portable one, else None."""
    own = folder / f"{slug(gpu_name)}.json"
    if (doc := _read(own)) is not None:
        return doc, f"calibrated on this GPU kind ({own.name})"
    fallback = folder / f"{FALLBACK}.json"
    if (doc := _read(fallback)) is not None:
        return doc, (f"no calibration for {gpu_name or 'this GPU'} ({own.name} absent): judged by the portable band "
                     f"calibrated on {doc.get('gpu', FALLBACK)} ({fallback.name}); run `python -m harness calibrate` "
                     "once on this GPU kind to calibrate it")
    return None, f"no memory calibration in {folder} (neither {own.name} nor {fallback.name})"


def version_note(doc: dict, versions: dict | None) -> str:
    """'' when the run's torch and CUDA are the calibration's (or either is unknown); else a note naming both: the
    band still applies (the allocations are the same code's), but a healthy run failing it on other versions points
    at the versions first, and the fix is a calibration on this machine."""
    made = (doc.get("provenance") or {}).get("versions") or {}
    differ = [f"{name} {made[name]} there, {versions[name]} here" for name in ("torch", "cuda")
              if (versions or {}).get(name) and made.get(name) and str(versions[name]) != str(made[name])]
    if not differ:
        return ""
    return (f"; calibrated with other versions ({'; '.join(differ)}): the same band applies, and if a healthy run "
            "leaves it, run `python -m harness calibrate` on this machine")


def document(gpu: str | None, capability: str | None, samples: dict, band: dict, provenance: dict) -> dict:
    """A memory golden file: per seed the allocator's peak reserved and NVML's peak; the band on the former."""
    return {"schema": 1, "gpu": gpu, "capability": capability, "own_band_mib": band,
            "samples": samples, "provenance": provenance}


def visible_gpu_name() -> str | None:
    """The first GPU's name as NVML reports it (None when there is none or NVML is unavailable); no torch import."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            if pynvml.nvmlDeviceGetCount() < 1:
                return None
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
            return name.decode() if isinstance(name, bytes) else str(name)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no library, no GPU: the header says so
        return None


def header_line(gpu_name: str | None = None) -> str:
    """What the pytest header says about the memory band this machine's runs are judged by."""
    gpu_name = gpu_name or visible_gpu_name()
    if gpu_name is None:
        return "memory band: no NVIDIA GPU visible (judged only in GPU runs)"
    doc, why = select(gpu_name)
    if doc is None:
        return f"memory band for {gpu_name}: none ({why})"
    band = doc["own_band_mib"]
    return f"memory band for {gpu_name}: own memory [{band['lo']}, {band['hi']}] MiB, {why}"
