"""Importing megatron-core without paying for torch.compile's machinery, and heavy imports without the collector.

megatron-core decorates its fused functions with torch.compile when it is imported (megatron.core.jit), and the
decoration alone imports torch._dynamo and torch._inductor: 3.6 of the ~10 s that importing torch and megatron-core
takes on an H200 host. Nothing in this suite calls those functions (the trainer uses harness.train.fusions), so
`import_megatron_core()` imports megatron-core with a lazy torch.compile: a decorated function still gets exactly
torch.compile(fn, **options), at its first call.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
import threading
import warnings
from typing import Iterator

_LOCK = threading.Lock()


def lazy_compile(real):
    """torch.compile that compiles on the first call instead of at decoration."""
    def compile(model=None, **options):
        if model is None:  # @torch.compile(**options)
            return lambda fn: compile(fn, **options)
        if not callable(model) or isinstance(model, type):
            return real(model, **options)
        compiled = None

        @functools.wraps(model)
        def call(*args, **kwargs):
            nonlocal compiled
            if compiled is None:
                compiled = real(model, **options)
            return compiled(*args, **kwargs)
        return call
    return compile


@contextlib.contextmanager
def lazy_torch_compile() -> Iterator[None]:
    """torch.compile is lazy_compile(torch.compile) inside the block, the real one after."""
    import torch

    with _LOCK:
        real = torch.compile
        torch.compile = lazy_compile(real)
        try:
            yield
        finally:
            torch.compile = real


def import_megatron_core() -> None:
    """Import megatron.core (once per process) with a lazy torch.compile and the collector paused
    (collector_paused); its TE/Apex warnings are silenced."""
    if "megatron.core" in sys.modules:
        return
    with collector_paused(), lazy_torch_compile(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed": known, irrelevant here
        import megatron.core  # noqa: F401


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Heavy imports (torch, megatron-core) with the cyclic garbage collector off; what they loaded is frozen after.

    Importing torch and megatron-core creates a few hundred thousand long-lived objects, and the collector's full
    passes over them while they load cost 0.3 of the ~1.9 s of CPU that `import torch` takes on a 2-core machine
    (measured: 1.9 s with the collector, 1.6 s without). Frozen (gc.freeze), they are never walked again: later
    full collections in a training are shorter, and a fork of the pre-imported server does not touch their pages.
    This is the pattern the gc module documents for a process that forks: collector off early, freeze, then on.
    A cycle left by the imports is kept rather than collected (module-level objects live as long as the process).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()
