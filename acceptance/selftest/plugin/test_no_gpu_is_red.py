"""A machine without a usable CUDA GPU: `pytest -m gpu` (and `pytest --megatron-lm PATH`) ends red, exit 3, with the
doctor's reason and fix on one line (a nightly GPU runner that lost its driver must not go green); plain `pytest`
(CPU CI) deselects the GPU tests and says so on one line, with the same reason and how to run them.

Each pytest runs in a subprocess with every GPU hidden (CUDA_VISIBLE_DEVICES=""), so the same holds on a GPU
machine; the reason expected is the doctor's own (harness.cli.doctor.no_gpu_reason), computed under the same
environment.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from types import SimpleNamespace

from harness.base.paths import REPO
from harness.cli import doctor

GPU_FILES = ("acceptance/test_nvml_gpu.py", "acceptance/test_course_checklist.py")
CPU_TEST = "acceptance/selftest/plugin/test_quiet_verdict.py::test_one_worker_more_than_the_cores"
ENV = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "CUDA_VISIBLE_DEVICES": ""}


class NoDriverNvml:
    class NVMLError(Exception):
        pass

    def nvmlInit(self):
        raise self.NVMLError("Driver Not Loaded")


class FakeGpuNvml:
    NVMLError = RuntimeError
    nvmlInit = nvmlShutdown = staticmethod(lambda: None)
    nvmlDeviceGetHandleByIndex = staticmethod(lambda index: index)
    nvmlDeviceGetName = staticmethod(lambda handle: "NVIDIA H200")
    nvmlDeviceGetMemoryInfo = staticmethod(lambda handle: SimpleNamespace(free=130 * 2**30, total=140 * 2**30))
    nvmlSystemGetDriverVersion = staticmethod(lambda: "580.95.05")
    nvmlSystemGetCudaDriverVersion = staticmethod(lambda: 13000)


def fake_torch(cuda, available, nccl=False):
    return SimpleNamespace(
        __version__="2.11.0+cu130" if cuda else "2.13.0+cpu", version=SimpleNamespace(cuda=cuda),
        cuda=SimpleNamespace(is_available=lambda: available, nccl=SimpleNamespace(version=lambda: (2, 27, 3))),
        distributed=SimpleNamespace(is_available=lambda: True, is_nccl_available=lambda: nccl))


def _pytest(*args: str) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", *args], cwd=REPO,
                          env=ENV, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def _doctor_reason() -> str:
    done = subprocess.run([sys.executable, "-c", "from harness.cli import doctor; print(doctor.no_gpu_reason())"],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]
    return done.stdout.strip()


def _stop_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if "no usable CUDA GPU on this machine" in line]


def test_gpu_session_without_a_gpu_is_red_with_the_doctors_reason_on_one_line(tmp_path):
    reason = _doctor_reason()
    assert "fix: " in reason and "\n" not in reason, reason
    for args, what in ((("-m", "gpu", "--no-fork-server", *GPU_FILES), "`pytest -m gpu`"),
                       (("--megatron-lm", str(tmp_path), "acceptance/test_checkout.py"), "`pytest --megatron-lm PATH`")):
        code, out = _pytest(*args)
        assert code == 3, (args, out[-3000:])
        lines = _stop_lines(out)
        assert len(lines) == 1, (args, out[-3000:])
        assert f"bert-acceptance: {what}: no usable CUDA GPU on this machine: {reason}" in lines[0], (lines, reason)
        assert not re.search(r"\d+ (passed|skipped|failed)", out), out[-3000:]   # nothing ran, nothing skipped green


def test_a_listing_of_the_gpu_tests_still_lists_them():
    """--collect-only is not a run: it lists the GPU tests and exits 0 even without a GPU."""
    code, out = _pytest("-m", "gpu", "--co", "-q", "--no-fork-server", *GPU_FILES)
    assert code == 0 and "acceptance/test_nvml_gpu.py::" in out and not _stop_lines(out), out[-3000:]


def test_plain_pytest_deselects_the_gpu_tests_with_one_line_and_passes():
    reason = _doctor_reason()
    code, out = _pytest("-rs", *GPU_FILES, CPU_TEST)
    assert code == 0, out[-3000:]
    lines = [line for line in out.splitlines() if "GPU test(s) not selected" in line]
    assert len(lines) == 1, out[-3000:]
    m = re.fullmatch(r"bert-acceptance: (\d+) GPU test\(s\) not selected: this machine has no usable CUDA GPU "
                     r"\((.*)\); run `pytest -m gpu` on a GPU machine", lines[0])
    assert m and m[2] == reason, (lines[0], reason)
    # every GPU test of the files is counted, none of them skipped: the count is the listing's
    listed = _pytest("-m", "gpu", "--co", "-q", "--no-fork-server", *GPU_FILES)[1]
    selected = re.search(r"(\d+)/\d+ tests? collected", listed)
    assert selected and int(m[1]) == int(selected[1]) > 0, listed[-2000:]
    assert "1 passed" in out and "SKIPPED" not in out, out[-3000:]


def test_the_reason_is_the_first_failing_gpu_row_root_cause_first():
    """No driver: the GPU row; a GPU with a CPU build of torch: torch's row; each with the doctor's fix."""
    no_driver = doctor.no_gpu_reason(torch=fake_torch(None, False), nvml=NoDriverNvml())
    assert no_driver.startswith("gpu: no GPU visible") and "fix: run on a machine with an NVIDIA GPU" in no_driver
    cpu_torch = doctor.no_gpu_reason(torch=fake_torch(None, False), nvml=FakeGpuNvml())
    assert cpu_torch.startswith("torch: 2.13.0+cpu, CPU-only build") and "fix: install a CUDA build" in cpu_torch
    hidden = doctor.no_gpu_reason(torch=fake_torch("13.0", False, nccl=True), nvml=FakeGpuNvml())
    assert hidden.startswith("torch:") and "CUDA_VISIBLE_DEVICES" in hidden
    assert all("\n" not in r for r in (no_driver, cpu_torch, hidden))
