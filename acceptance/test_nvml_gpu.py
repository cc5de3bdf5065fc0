"""On a GPU: the NVML sampler sees a real CUDA process (its fake-NVML self-tests are in selftest/test_gpumem.py).
Kept out of acceptance/selftest/, which a `-m gpu` session does not collect."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from harness.run import gpumem
from harness.run.gpumem import NvmlSampler

# A child that holds 256 MiB of CUDA memory through the driver API alone (importing torch would cost seconds of
# the GPU session): the primary context of device 0, one cuMemAlloc, held until its stdin closes (10 s at most).
CUDA_CHILD = '''
import ctypes, select, sys
cuda = ctypes.CDLL("libcuda.so.1")
def ok(result, what):
    if result != 0:
        sys.exit(f"{what} failed: CUresult {result}")
ok(cuda.cuInit(0), "cuInit")
device, context, pointer = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
ok(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
ok(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
ok(cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(256 * 2**20)), "cuMemAlloc")
print("ready", flush=True)
select.select([sys.stdin], [], [], 10.0)
'''


@pytest.mark.gpu
def test_real_nvml_sees_a_cuda_child():
    """On a GPU: a child holding 256 MiB of CUDA memory shows up with at least that much."""
    code = CUDA_CHILD
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    with NvmlSampler(lambda: proc.pid) as sampler:
        assert proc.stdout.readline().strip() == "ready", "the CUDA child failed (its error is above)"
        deadline = time.monotonic() + 5.0  # hold the memory until the sampler has seen it (5 s at most)
        while time.monotonic() < deadline and not (sampler.report().saw_process
                                                   and sampler.report().peak_mib >= 256):
            time.sleep(sampler.interval_s)
        time.sleep(2 * sampler.interval_s)
        proc.stdin.close()
        proc.wait(timeout=60)
    report = sampler.report()
    assert report.method in (gpumem.PROCESS, gpumem.DEVICE_DELTA), report.reason
    assert report.saw_process and report.peak_mib >= 256, report
