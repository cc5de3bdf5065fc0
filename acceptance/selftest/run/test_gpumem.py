"""Self-tests of harness.run.gpumem with a fake pynvml: both methods, the fallback, no driver, and the peak."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest

from harness.evidence.records import MemoryReport
from harness.run.gpumem import NvmlSampler

MIB = 1024 * 1024


class FakeNVMLError(Exception):
    """Stands in for pynvml.NVMLError."""


class FakeNvml:
    """A scripted pynvml: each sample pops the next (device used MiB, [(pid, used MiB or None)]) step."""

    NVMLError = FakeNVMLError

    def __init__(self, steps, baseline_mib=500, name="NVIDIA H200", init_error=None):
        self.steps = list(steps)
        self.current = (baseline_mib, [])
        self.name = name
        self.init_error = init_error
        self.shutdown = False
        self.baseline_read = False

    def nvmlInit(self):
        if self.init_error:
            raise FakeNVMLError(self.init_error)

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, index):
        return f"gpu{index}"

    def nvmlDeviceGetName(self, handle):
        return self.name.encode()   # old pynvml returns bytes

    def nvmlDeviceGetMemoryInfo(self, handle):
        if self.baseline_read:   # the first read is the sampler's baseline; later reads advance the script
            self.current = self.steps.pop(0) if self.steps else self.current
        self.baseline_read = True
        return SimpleNamespace(used=int(self.current[0] * MIB), total=141 * 1024 * MIB)

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle):
        return [SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else int(mib * MIB))
                for pid, mib in self.current[1]]


@pytest.fixture
def child():
    """A real child process, so the tree is the test process plus one descendant."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def sample(fake, root, n=None, opened=None) -> MemoryReport:
    """Open, take one sample per scripted step (or n), close, report (device files: `opened`, None = unknown)."""
    sampler = NvmlSampler(lambda: root, nvml=fake, device_file_probe=lambda pids: opened)
    assert sampler.open()
    for _ in range(n if n is not None else len(fake.steps)):
        sampler.sample_once()
    sampler.close()
    return sampler.report()


def test_process_method_sums_the_tree_and_keeps_the_peak(child):
    """Per-process figures of root and child are summed; strangers are ignored; the peak sum wins."""
    me = os.getpid()
    steps = [(600, [(me, 100)]),
             (3900, [(me, 1200), (child, 2000), (999999, 5000)]),   # peak of the sum: 3200
             (1800, [(me, 300), (child, 1000)])]
    report = sample(FakeNvml(steps), me)
    assert report.method == "nvml-process" and report.saw_process
    assert report.peak_mib == pytest.approx(3200)
    assert report.samples == 3 and report.gpu_name == "NVIDIA H200" and report.baseline_mib == pytest.approx(500)
    assert "summed over the trainer's process tree (2 pid(s)" in report.reason


def test_peak_is_of_the_sum_not_the_sum_of_peaks(child):
    """Two processes peaking at different times give max(sum), not sum(max)."""
    me = os.getpid()
    steps = [(0, [(me, 1000), (child, 100)]), (0, [(me, 100), (child, 1000)])]
    assert sample(FakeNvml(steps), me).peak_mib == pytest.approx(1100)


def test_no_processes_listed_falls_back_to_device_delta():
    """An empty process list (containers) gives device peak minus baseline, saw_process by the rise."""
    steps = [(800, []), (3731, []), (2000, [])]
    report = sample(FakeNvml(steps, baseline_mib=500), os.getpid())
    assert report.method == "nvml-device-delta"
    assert report.peak_mib == pytest.approx(3231) and report.saw_process
    assert "NVML listed no compute process" in report.reason
    assert "rising 3231 MiB > 50 MiB above baseline" in report.reason


def test_usedgpumemory_none_falls_back_but_counts_the_pid():
    """Our pid listed without a figure: device delta, and saw_process from the listing itself."""
    me = os.getpid()
    report = sample(FakeNvml([(520, [(me, None)])], baseline_mib=500), me)
    assert report.method == "nvml-device-delta" and report.saw_process
    assert report.peak_mib == pytest.approx(20)
    assert "without per-process figures" in report.reason and "inferred" not in report.reason


def test_foreign_pids_only_and_no_rise_is_not_seen():
    """Host pids only (other PID namespace) and a rise under 50 MiB: saw_process is False, and says why."""
    report = sample(FakeNvml([(530, [(999999, 30)])], baseline_mib=500), os.getpid())
    assert report.method == "nvml-device-delta" and not report.saw_process
    assert "none of the trainer's tree" in report.reason and "30 MiB <= 50 MiB" in report.reason


def test_unknown_root_is_reported():
    """A sampler whose trainer never started says so."""
    report = sample(FakeNvml([(500, [])]), None)
    assert report.method == "nvml-device-delta" and "never known" in report.reason


def test_no_driver_is_unavailable_never_raises():
    """NVML init failing (no driver) gives method 'unavailable' with the NVML error."""
    fake = FakeNvml([], init_error="Driver Not Loaded")
    with NvmlSampler(lambda: os.getpid(), nvml=fake) as sampler:
        pass
    report = sampler.report()
    assert report.method == "unavailable" and report.peak_mib is None
    assert report.reason == "NVML could not initialise: FakeNVMLError: Driver Not Loaded"


def test_real_pynvml_without_driver_is_unavailable():
    """On a machine without a driver the real pynvml also ends as 'unavailable' (skipped where a GPU works)."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML works here: the no-driver path is covered by the fake")
    with NvmlSampler(lambda: None) as sampler:
        pass
    assert sampler.report().method == "unavailable" and "NVML could not initialise" in sampler.report().reason


def test_missing_pynvml_is_unavailable(monkeypatch):
    """No pynvml module at all is a reason, not a crash."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with NvmlSampler(lambda: None) as sampler:
        pass
    assert sampler.report().method == "unavailable" and "nvidia-ml-py" in sampler.report().reason


def test_fake_module_injected_through_sys_modules(monkeypatch):
    """The sampler imports pynvml lazily, so a fake in sys.modules is used."""
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([(700, [])], baseline_mib=500))
    sampler = NvmlSampler(lambda: None)
    assert sampler.open() and sampler.gpu_name == "NVIDIA H200"


def test_thread_samples_while_the_context_is_open(child):
    """The background thread polls at the interval and the report counts its samples."""
    fake = FakeNvml([(900, [(child, 400)])] * 3, baseline_mib=500)
    with NvmlSampler(lambda: child, interval_s=0.01, nvml=fake) as sampler:
        deadline = time.monotonic() + 10    # ~0.05 s at 10 ms a sample; a loaded machine may starve the thread
        while sampler.samples < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    report = sampler.report()
    assert report.samples >= 5 and report.interval_ms == pytest.approx(10)
    assert report.method == "nvml-process" and report.peak_mib == pytest.approx(400) and fake.shutdown


def test_sample_errors_become_the_reason():
    """NVML failing on every sample leaves 'unavailable' with the last error."""
    fake = FakeNvml([])

    def broken(handle):
        raise FakeNVMLError("GPU is lost")

    sampler = NvmlSampler(lambda: None, nvml=fake)
    assert sampler.open()
    fake.nvmlDeviceGetMemoryInfo = broken
    sampler.sample_once()
    report = sampler.report()
    assert report.method == "unavailable" and "GPU is lost" in report.reason


def test_interval_must_be_at_most_100_ms():
    """Sampling slower than 100 ms would miss short peaks."""
    with pytest.raises(ValueError, match="interval_s"):
        NvmlSampler(lambda: None, interval_s=0.5)


def test_device_delta_ignores_a_rise_when_the_tree_never_opened_a_gpu():
    """A CPU-only trainer beside other GPU jobs: the device-wide rise is theirs, not the trainer's."""
    report = sample(FakeNvml([(500, []), (4000, [])], baseline_mib=500), os.getpid(), opened=False)
    assert report.method == "nvml-device-delta" and not report.saw_process and report.peak_mib == 0.0
    assert "ever opened a /dev/nvidiaN device file" in report.reason


def test_opened_gpu_device_reads_proc_fds():
    """This test process has no GPU device file open; an unreadable pid gives None."""
    from harness.run.gpumem import opened_gpu_device

    assert opened_gpu_device([os.getpid()]) is False
    assert opened_gpu_device([2**22 + 12345]) is None


class FakeMultiNvml(FakeNvml):
    """A scripted pynvml with several GPUs: each poll pops one step {gpu index: (device used MiB, [(pid, MiB)])}."""

    def __init__(self, steps, gpus=2, baseline_mib=500, lead=0, sampled=None):
        super().__init__([], baseline_mib)
        self.multi = list(steps)
        self.gpus = gpus
        self.lead = lead                                  # the first GPU the sampler reads in a poll
        self.sampled = gpus if sampled is None else sampled   # how many GPUs it reads (the baselines)
        self.poll = {i: (baseline_mib, []) for i in range(gpus)}
        self.reads = 0

    def nvmlDeviceGetCount(self):
        return self.gpus

    def nvmlDeviceGetMemoryInfo(self, handle):
        index = int(handle[3:])
        if self.reads >= self.sampled and index == self.lead:   # after the baselines, the lead's read: next poll
            self.poll = self.multi.pop(0) if self.multi else self.poll
        self.reads += 1
        return SimpleNamespace(used=int(self.poll[index][0] * MIB), total=141 * 1024 * MIB)

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle):
        return [SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else int(mib * MIB))
                for pid, mib in self.poll[int(handle[3:])][1]]


@pytest.fixture
def ranks():
    """Two child processes standing in for torchrun's workers, RANK 0 and RANK 1 in their environment."""
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              env={**os.environ, "RANK": str(rank)}) for rank in (0, 1)]
    deadline = time.monotonic() + 10   # until exec: before it, /proc shows the parent's environment (no RANK)
    while time.monotonic() < deadline and any(psutil.Process(p.pid).environ().get("RANK") is None for p in procs):
        time.sleep(0.01)
    yield [p.pid for p in procs]
    for proc in procs:
        proc.kill()
        proc.wait()


def test_each_rank_on_its_own_gpu_keeps_its_own_peak(ranks):
    """Rank 0 on GPU 0, rank 1 on GPU 1: one peak per GPU, named by rank; peak_mib is the worst GPU's."""
    r0, r1 = ranks
    steps = [{0: (900, [(r0, 400)]), 1: (800, [(r1, 300)])},
             {0: (2900, [(r0, 2400)]), 1: (3100, [(r1, 2600), (999999, 7000)])},   # a stranger on GPU 1
             {0: (1000, [(r0, 500)]), 1: (1000, [(r1, 500)])}]
    fake = FakeMultiNvml(steps)
    report = sample(fake, os.getpid(), n=3)
    assert report.method == "nvml-process" and report.samples == 3
    assert [(r.gpu_index, r.rank, r.pids) for r in report.ranks] == [(0, 0, (r0,)), (1, 1, (r1,))]
    assert [r.peak_mib for r in report.ranks] == pytest.approx([2400, 2600])
    assert report.peak_mib == pytest.approx(2600) and "worst is GPU 1" in report.reason
    assert [r.label() for r in report.ranks] == ["rank 0 (GPU 0)", "rank 1 (GPU 1)"]


def test_a_gpu_the_tree_never_used_is_not_a_rank(ranks):
    """A single-GPU run on a 2-GPU machine: only GPU 0 is reported, as before."""
    r0, _ = ranks
    steps = [{0: (2900, [(r0, 2400)]), 1: (4000, [(999999, 3500)])}]
    report = sample(FakeMultiNvml(steps), os.getpid(), n=1)
    assert [(r.gpu_index, r.peak_mib) for r in report.ranks] == [(0, pytest.approx(2400))]
    assert report.peak_mib == pytest.approx(2400)


def test_device_delta_reports_each_gpu_that_rose():
    """No process list (a container): each GPU's rise above its baseline; the worst is peak_mib."""
    steps = [{0: (2500, []), 1: (3300, [])}, {0: (700, []), 1: (520, [])}]
    report = sample(FakeMultiNvml(steps, baseline_mib=500), os.getpid(), n=2)
    assert report.method == "nvml-device-delta" and report.peak_mib == pytest.approx(2800)
    assert [(r.gpu_index, r.peak_mib) for r in report.ranks] == [(0, pytest.approx(2000)), (1, pytest.approx(2800))]


def test_a_rank_read_between_fork_and_exec_is_read_again(ranks, monkeypatch):
    """A worker caught before its exec shows its parent's environment (no RANK): a later sample reads it again
    instead of keeping "no rank" for the whole run."""
    from harness.run import gpumem

    r0, r1 = ranks
    seen = {r0: [None, 0], r1: [None, 1]}    # the first read of each pid: before exec
    monkeypatch.setattr(gpumem, "_rank_of", lambda pid: seen[pid].pop(0) if pid in seen and seen[pid] else None)
    steps = [{0: (900, [(r0, 400)]), 1: (800, [(r1, 300)])}, {0: (2900, [(r0, 2400)]), 1: (3100, [(r1, 2600)])}]
    report = sample(FakeMultiNvml(steps), os.getpid(), n=2)
    assert [(r.gpu_index, r.rank) for r in report.ranks] == [(0, 0), (1, 1)], report.ranks


def test_device_index_samples_one_gpu_only(ranks):
    """device_index=1 follows GPU 1 alone."""
    r0, r1 = ranks
    fake = FakeMultiNvml([{0: (2900, [(r0, 2400)]), 1: (900, [(r1, 300)])}], lead=1, sampled=1)
    sampler = NvmlSampler(lambda: os.getpid(), nvml=fake, device_index=1, device_file_probe=lambda pids: None)
    assert sampler.open()
    sampler.sample_once()
    report = sampler.report()
    assert [(r.gpu_index, r.rank) for r in report.ranks] == [(1, 1)] and report.peak_mib == pytest.approx(300)
