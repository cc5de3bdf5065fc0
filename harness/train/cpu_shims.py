"""Smallest patches that let megatron-core's CUDA-only calls run on a CPU-only torch (CI smoke runs).

Patches (applied only when CUDA is unavailable; a GPU machine is never touched):

- ``torch.cuda.current_device`` -> ``torch.device("cpu")``: dist_checkpointing builds its small
  coordination tensors (``state_dict_saver``, ``async_utils``) with ``device=torch.cuda.current_device()``.
- ``torch.cuda.synchronize`` -> no-op: dist_checkpointing's ``preload_tensors`` (filesystem_async),
  ``fully_parallel`` and ``async_utils`` call it before and after copying tensors; on CPU there is
  nothing to wait for.

Not covered here (trainer concerns, see docs/MEASURED.md "megatron-core on a CPU"): the CUDA RNG tracker
(use ``inference_rng_tracker=True, force_reset_rng=True``), GlobalMemoryBuffer, FP32Optimizer, clip_grads.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

_PATCHES = {
    "current_device": lambda: torch.device("cpu"),
    "synchronize": lambda *args, **kwargs: None,
}
_ORIGINALS: dict[str, object] = {}


def cuda_missing() -> bool:
    """True when torch has no usable CUDA, i.e. when the shims are needed."""
    return not torch.cuda.is_available()


def apply_cpu_shims() -> bool:
    """Patch torch.cuda for CPU-only runs; idempotent; returns True when patches are active."""
    if not cuda_missing():
        return False
    for name, replacement in _PATCHES.items():
        if name not in _ORIGINALS:
            _ORIGINALS[name] = getattr(torch.cuda, name)
            setattr(torch.cuda, name, replacement)
    return True


def remove_cpu_shims() -> None:
    """Restore the original torch.cuda functions patched by apply_cpu_shims."""
    for name, original in list(_ORIGINALS.items()):
        setattr(torch.cuda, name, original)
        del _ORIGINALS[name]


@contextlib.contextmanager
def cpu_shims() -> Iterator[bool]:
    """Context manager form: patches inside, originals back afterwards (if this call applied them)."""
    already = bool(_ORIGINALS)
    active = apply_cpu_shims()
    try:
        yield active
    finally:
        if active and not already:
            remove_cpu_shims()
