"""Peak GPU memory of the trainer as NVML sees it (CUDA context, cuBLAS and NCCL included), for MemoryReport.

Preferred: NVML's per-process used memory of the trainer's process tree (torchrun and its workers), summed per
GPU, peak of each GPU's sum: under torchrun each rank's process on its own GPU, the worst GPU is `peak_mib` and
every GPU is in `ranks`. In containers NVML often lists no process, or host pids, or no per-process figures; then the
fallback is each device's peak used memory minus the baseline taken before the run. Without a driver the report
says "unavailable" and why; the sampler never raises.

    started = {}
    with NvmlSampler(lambda: started.get("pid")) as sampler:
        run_stage(spec, run_dir, on_start=lambda popen: started.update(pid=popen.pid))
    memory = sampler.report()
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any, Callable

import psutil

from harness.evidence.records import MemoryReport, RankMemory
from harness.run.launch import current_pids

MIB = 1024 * 1024
MAX_INTERVAL_S = 0.1
_GPU_DEVICE_FILE = re.compile(r"/dev/nvidia\d+")
SAW_PROCESS_RISE_MIB = 50.0     # device-delta mode: a rise above this counts as "the trainer was on the GPU"

PROCESS = "nvml-process"
DEVICE_DELTA = "nvml-device-delta"
UNAVAILABLE = "unavailable"


class _Gpu:
    """One GPU's handle, baseline and peaks."""

    def __init__(self, index: int, handle: Any, baseline_bytes: int):
        self.index = index
        self.handle = handle
        self.baseline_bytes = baseline_bytes
        self.peak_device_bytes = 0
        self.peak_process_bytes = 0
        self.peak_pids: tuple[int, ...] = ()
        self.figures = False          # some tree pid came with a usedGpuMemory number on this GPU

    def delta_mib(self) -> float:
        """Peak device used above the baseline."""
        return max(0, self.peak_device_bytes - self.baseline_bytes) / MIB


class NvmlSampler:
    """A context manager whose thread samples NVML every `interval_s` while the trainer runs.

    `device_index` None samples every GPU NVML lists (a torchrun tree spreads over several); an int, that one.
    """

    def __init__(self, root_pid_getter: Callable[[], int | None], interval_s: float = 0.05,
                 device_index: int | None = None, nvml: Any = None, device_file_probe: Callable | None = None):
        if not 0 < interval_s <= MAX_INTERVAL_S:
            raise ValueError(f"NvmlSampler interval_s must be in (0, {MAX_INTERVAL_S}] s, got {interval_s!r}")
        self.root_pid_getter = root_pid_getter
        self.interval_s = interval_s
        self.device_index = device_index
        self._nvml = nvml
        self._device_file_probe = device_file_probe or opened_gpu_device
        self._handle = None
        self._gpus: list[_Gpu] = []
        self._ranks: dict[int, int | None] = {}   # pid -> RANK from its environment
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._init_error: str | None = None
        self._last_error: str | None = None
        self.gpu_name: str | None = None
        self.baseline_bytes: int | None = None
        self.samples = 0
        self._tree_pids_listed: set[int] = set()
        self._others_listed = False       # NVML listed processes outside the tree
        self._opened_gpu: bool | None = None  # a tree pid had /dev/nvidiaN open (None: /proc unreadable)
        self._root_known = False

    # ---- lifecycle -------------------------------------------------------------------------------------------

    def open(self) -> bool:
        """Initialise NVML, read the GPU name and the baseline; False (with the reason kept) when impossible."""
        try:
            if self._nvml is None:
                import pynvml as nvml_module

                self._nvml = nvml_module
        except ImportError as exc:
            self._init_error = f"pynvml is not installed (pip install nvidia-ml-py): {exc}"
            return False
        try:
            self._nvml.nvmlInit()
            indices = ([self.device_index] if self.device_index is not None
                       else range(int(self._nvml.nvmlDeviceGetCount())))
            for index in indices:
                handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
                self._gpus.append(_Gpu(index, handle, int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used)))
            if not self._gpus:
                raise OSError("NVML lists no GPU")
            self._handle = self._gpus[0].handle
            self.gpu_name = _text(self._nvml.nvmlDeviceGetName(self._handle))
            self.baseline_bytes = self._gpus[0].baseline_bytes
        except self._errors() as exc:
            self._init_error = f"NVML could not initialise: {_describe(exc)}"
            self._handle = None
            self._gpus = []
            return False
        return True

    def close(self) -> None:
        """Shut NVML down (errors ignored: nothing left to measure)."""
        if self._handle is None:
            return
        try:
            self._nvml.nvmlShutdown()
        except self._errors():
            pass
        self._handle = None

    def __enter__(self) -> "NvmlSampler":
        if self.open():
            self._thread = threading.Thread(target=self._loop, daemon=True, name="nvml-sampler")
            self._thread.start()
        return self

    def __exit__(self, *exc_info) -> bool:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.close()
        return False

    def _errors(self) -> tuple[type[BaseException], ...]:
        """Exceptions that mean "NVML said no": its NVMLError, plus OSError from a missing library."""
        nvml_error = getattr(self._nvml, "NVMLError", None)
        return (nvml_error, OSError) if isinstance(nvml_error, type) else (OSError,)

    def _loop(self) -> None:
        """Sample until stopped; an NVML error in one sample is kept as a reason, never raised."""
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)

    # ---- sampling --------------------------------------------------------------------------------------------

    def sample_once(self) -> None:
        """One poll: the device's used memory and the per-process figures of the trainer's tree."""
        if self._handle is None:
            return
        root = self.root_pid_getter()
        tree = current_pids(root) if root else frozenset()
        try:
            polled = [(gpu, int(self._nvml.nvmlDeviceGetMemoryInfo(gpu.handle).used), self._processes(gpu.handle))
                      for gpu in self._gpus]
        except self._errors() as exc:
            self._last_error = _describe(exc)
            return
        if not self._opened_gpu:
            opened = self._device_file_probe(tree)
            self._opened_gpu = opened if self._opened_gpu is None or opened else self._opened_gpu
        for pid in tree:
            if self._ranks.get(pid) is None:   # not known yet, or seen between fork and exec (its parent's env)
                self._ranks[pid] = _rank_of(pid)
        with self._lock:
            self.samples += 1
            self._root_known = self._root_known or bool(root)
            for gpu, used, procs in polled:
                self._record(gpu, tree, used, procs)

    def _processes(self, handle) -> list:
        """NVML's compute processes on one device (the v3 call when this pynvml has it)."""
        call = getattr(self._nvml, "nvmlDeviceGetComputeRunningProcesses_v3", None) \
            or self._nvml.nvmlDeviceGetComputeRunningProcesses
        return list(call(handle) or [])

    def _record(self, gpu: _Gpu, tree: frozenset[int], used: int, procs: list) -> None:
        """Fold one GPU's sample into its peaks."""
        gpu.peak_device_bytes = max(gpu.peak_device_bytes, used)
        ours = [p for p in procs if p.pid in tree]
        self._tree_pids_listed.update(p.pid for p in ours)
        self._others_listed = self._others_listed or len(ours) < len(procs)
        figures = {p.pid: int(p.usedGpuMemory) for p in ours if p.usedGpuMemory is not None}
        if figures:
            gpu.figures = True
            if sum(figures.values()) > gpu.peak_process_bytes:
                gpu.peak_process_bytes = sum(figures.values())
                gpu.peak_pids = tuple(sorted(figures))

    # ---- the verdict -----------------------------------------------------------------------------------------

    def report(self) -> MemoryReport:
        """The peak, how it was measured, and why that method."""
        with self._lock:
            if self._init_error:
                return self._unavailable(self._init_error)
            if self.samples == 0:
                return self._unavailable("no NVML sample was taken"
                                         + (f": {self._last_error}" if self._last_error else ""))
            if any(gpu.figures for gpu in self._gpus):
                return self._process_report()
            return self._device_delta_report()

    def _common(self, worst: _Gpu | None = None) -> dict:
        """Fields every report shares; the baseline is the worst GPU's (the first GPU's when none is)."""
        baseline = worst.baseline_bytes if worst is not None else self.baseline_bytes
        return dict(samples=self.samples, interval_ms=self.interval_s * 1000, gpu_name=self.gpu_name,
                    baseline_mib=None if baseline is None else baseline / MIB)

    def _rank(self, pids: tuple[int, ...]) -> int | None:
        """The one RANK these pids carry (None when none or several)."""
        ranks = {self._ranks.get(pid) for pid in pids} - {None}
        return ranks.pop() if len(ranks) == 1 else None

    def _unavailable(self, reason: str) -> MemoryReport:
        """No measurement, with the reason."""
        return MemoryReport(method=UNAVAILABLE, reason=reason, **self._common())

    def _process_report(self) -> MemoryReport:
        """Per-process figures were there: per GPU, peak of the sum over the tree's processes on it; the worst GPU."""
        used = [gpu for gpu in self._gpus if gpu.figures]
        ranks = tuple(RankMemory(gpu.index, gpu.peak_process_bytes / MIB, gpu.peak_pids, self._rank(gpu.peak_pids))
                      for gpu in used)
        worst = max(used, key=lambda gpu: gpu.peak_process_bytes)
        reason = (f"peak of NVML per-process used memory summed over the trainer's process tree "
                  f"({len(self._tree_pids_listed)} pid(s) seen in NVML's list), per GPU; "
                  f"{len(used)} GPU(s) used, the worst is GPU {worst.index}")
        return MemoryReport(method=PROCESS, peak_mib=worst.peak_process_bytes / MIB, saw_process=True,
                            reason=reason, ranks=ranks, **self._common(worst))

    def _device_delta_report(self) -> MemoryReport:
        """No per-process figure for the tree: per GPU, peak device used minus the baseline; the worst GPU."""
        worst = max(self._gpus, key=_Gpu.delta_mib)
        delta_mib = worst.delta_mib()
        risen = tuple(RankMemory(gpu.index, gpu.delta_mib()) for gpu in self._gpus
                      if gpu.delta_mib() > SAW_PROCESS_RISE_MIB)
        rose = delta_mib > SAW_PROCESS_RISE_MIB
        listed = bool(self._tree_pids_listed)
        parts = [self._why_no_process_figures(),
                 "fell back to peak device used minus the baseline taken before the run "
                 "(includes any other process on this GPU)"]
        if self._opened_gpu is False:
            parts.append("none of the trainer's processes ever opened a /dev/nvidiaN device file: it did not use "
                         "this GPU, so the device-wide rise belongs to other processes")
            return MemoryReport(method=DEVICE_DELTA, peak_mib=0.0, saw_process=False, reason="; ".join(parts),
                                **self._common(worst))
        if not listed:
            parts.append(f"saw_process inferred from device used rising {delta_mib:.0f} MiB "
                         f"{'>' if rose else '<='} {SAW_PROCESS_RISE_MIB:g} MiB above baseline")
        return MemoryReport(method=DEVICE_DELTA, peak_mib=delta_mib, saw_process=listed or rose,
                            reason="; ".join(parts), ranks=risen, **self._common(worst))

    def _why_no_process_figures(self) -> str:
        """Which of the container symptoms this run showed."""
        if not self._root_known:
            return "the trainer's pid was never known to the sampler"
        if self._tree_pids_listed:
            return "NVML listed the trainer's pids without per-process figures (usedGpuMemory unavailable)"
        if self._others_listed:
            return "NVML listed processes but none of the trainer's tree (another PID namespace, e.g. a container)"
        return "NVML listed no compute process (typical inside a container)"


def opened_gpu_device(pids) -> bool | None:
    """Whether any pid has a /dev/nvidiaN device file open (works across PID namespaces, unlike NVML's list).

    None when no pid's file descriptors could be read.
    """
    readable = False
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue
        readable = True
        for name in names:
            try:
                target = os.readlink(f"{fd_dir}/{name}")
            except OSError:
                continue
            if _GPU_DEVICE_FILE.fullmatch(target):
                return True
    return False if readable else None


def _rank_of(pid: int) -> int | None:
    """The RANK torchrun put into a process's environment, or None (not a rank, gone, or unreadable)."""
    try:
        rank = psutil.Process(pid).environ().get("RANK")
    except (psutil.Error, OSError):
        return None
    return int(rank) if rank is not None and rank.isdigit() else None


def _text(value) -> str:
    """NVML strings are bytes in old pynvml versions."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _describe(exc: BaseException) -> str:
    """`NVMLError_DriverNotLoaded: Driver Not Loaded` style text."""
    return f"{type(exc).__name__}: {exc}"
