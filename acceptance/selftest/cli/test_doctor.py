"""Self-tests of harness.cli.doctor: the table, a missing vocab, GPU rows without a GPU, the megatron-core range."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from harness.cli import doctor
from harness.cli.doctor import Check, check_megatron_core, format_table, hard_failures, in_range, run_checks
from harness.base.paths import REPO, VOCAB_FILE

GPU_ROWS = ("gpu", "driver", "nccl")
GIB = 1024 ** 3


class NoDriverNvml:
    """pynvml on a machine without the NVIDIA driver."""

    class NVMLError(Exception):
        """Stands in for pynvml.NVMLError."""

    def nvmlInit(self):
        raise self.NVMLError("Driver Not Loaded")


class FakeGpuNvml:
    """pynvml on a machine with one GPU and `free_gib` free."""

    NVMLError = RuntimeError

    def __init__(self, free_gib=130.0):
        self.free_gib = free_gib

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return "NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(free=int(self.free_gib * GIB), total=140 * GIB, used=int((140 - self.free_gib) * GIB))

    def nvmlSystemGetDriverVersion(self):
        return b"580.95.05"

    def nvmlSystemGetCudaDriverVersion(self):
        return 13000


def fake_torch(cuda: str | None, available: bool, nccl: bool = False):
    """A torch stand-in: version, CUDA build, availability, NCCL."""
    return SimpleNamespace(
        __version__="2.11.0+cu130" if cuda else "2.13.0+cpu", version=SimpleNamespace(cuda=cuda),
        cuda=SimpleNamespace(is_available=lambda: available, nccl=SimpleNamespace(version=lambda: (2, 27, 3))),
        distributed=SimpleNamespace(is_available=lambda: True, is_nccl_available=lambda: nccl))


def by_name(checks: list[Check]) -> dict[str, Check]:
    """Checks keyed by name."""
    return {c.name: c for c in checks}


def test_no_gpu_fails_gpu_rows_with_a_reason_and_a_fix():
    """Without a driver the GPU rows fail, quoting NVML's error, and say what to do."""
    checks = by_name(run_checks(nvml=NoDriverNvml(), torch=fake_torch(None, False)))
    for name in GPU_ROWS + ("torch",):
        assert checks[name].status == "fail" and checks[name].fix, checks[name]
    assert "no GPU visible: NVML: NVMLError: Driver Not Loaded" in checks["gpu"].value
    assert "torch.cuda.is_available() is False" in checks["gpu"].value
    assert "CPU-only build" in checks["torch"].value
    assert {c.name for c in hard_failures(checks.values())} >= set(GPU_ROWS)


def test_cpu_only_skips_gpu_rows():
    """--cpu-only turns the GPU rows into skips and a CPU torch into ok."""
    checks = by_name(run_checks(cpu_only=True, nvml=NoDriverNvml(), torch=fake_torch(None, False)))
    assert all(checks[n].status == "skip" and "--cpu-only" in checks[n].value for n in GPU_ROWS)
    assert checks["torch"].status == "ok"


def test_gpu_present_is_ok_and_too_little_memory_fails():
    """An H200 with 130 GiB free passes; 4 GiB free fails the 8 GiB requirement."""
    torch = fake_torch("13.0", True, nccl=True)
    good = by_name(doctor.gpu_checks(torch, FakeGpuNvml()))
    assert all(c.status == "ok" for c in good.values()), good
    assert good["gpu"].value.startswith("NVIDIA H200, 130.0 GiB free")
    assert good["driver"].value == "580.95.05, CUDA 13.0" and good["nccl"].value == "2.27.3"
    low = by_name(doctor.gpu_checks(torch, FakeGpuNvml(free_gib=4)))["gpu"]
    assert low.status == "fail" and ">= 8 GiB free" in low.requirement


def test_missing_vocab_fails_with_a_fix(tmp_path):
    """A vocab path that does not exist is a hard failure naming the path and the fixture to use."""
    missing = tmp_path / "nope.txt"
    check = by_name(run_checks(cpu_only=True, vocab_file=missing))["vocab"]
    assert check.status == "fail" and str(missing) in check.value
    assert f"--vocab-file {VOCAB_FILE}" in check.fix


def test_wrong_vocab_contents_fail(tmp_path):
    """A 5-token vocab, or one missing [MASK], is not the BERT vocab."""
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    assert "5 tokens, expected 30522" in doctor.check_vocab(tiny).value
    no_mask = tmp_path / "nomask.txt"
    no_mask.write_text(VOCAB_FILE.read_text().replace("[MASK]\n", "[MASQ]\n"))
    assert doctor.check_vocab(no_mask).value.endswith("missing [MASK]")
    assert doctor.check_vocab(VOCAB_FILE).status == "ok"


@pytest.mark.parametrize("version, status", [
    ("0.16.1", "ok"), ("0.19.9", "ok"), ("0.17.0.dev20260801", "ok"), ("0.16.2rc1", "ok"),
    ("0.16.0", "fail"), ("0.16.1rc1", "fail"), ("0.9.0", "fail"),
    ("0.20.0", "warn"), ("0.20.0rc0", "warn"), ("1.0", "warn"),
])
def test_megatron_core_range(version, status):
    """Supported range is [0.16.1, 0.20): older fails, newer warns."""
    assert check_megatron_core(version).status == status


def test_megatron_core_missing_and_unreadable(monkeypatch):
    """Not installed, or a version we cannot read, fails with the pip line."""
    monkeypatch.setattr(doctor, "_dist_version", lambda name: None)
    missing = check_megatron_core()
    assert missing.status == "fail" and missing.value == "not installed"
    bad = check_megatron_core("garbage")
    assert bad.status == "fail" and "pip install 'megatron-core>=0.16.1,<0.20'" in bad.fix
    assert in_range("0.16.1", "0.16.1", "0.20") and not in_range("0.20", "0.16.1", "0.20")


def test_table_renders_aligned_with_fixes_and_summary(tmp_path):
    """Every row shares the column layout; failed rows carry their fix; the last line counts statuses."""
    checks = [Check("gpu", "fail", "no GPU visible", ">= 8 GiB free", "use a GPU machine"),
              Check("vocab", "ok", "/x/vocab.txt", "30522 lines"),
              Check("apex", "skip", "skipped: --cpu-only", "optional")]
    lines = format_table(checks).splitlines()
    assert lines[0].split() == ["STATUS", "CHECK", "NEEDS", "FOUND"]
    found_at = lines[0].index("FOUND")
    assert lines[2][found_at:] == "no GPU visible" and lines[4][found_at:] == "/x/vocab.txt"
    assert lines[2].startswith("FAIL") and lines[3].strip() == "fix: use a GPU machine"
    assert lines[-1] == "1 ok, 0 warn, 1 fail, 1 skip -> NOT READY"


def test_disk_check_uses_the_nearest_existing_directory(tmp_path):
    """A run dir that does not exist yet is measured on its filesystem."""
    check = doctor.check_disk(tmp_path / "runs" / "later")
    assert check.status in ("ok", "fail") and str(tmp_path) in check.value


def test_bad_status_is_refused():
    """Only ok/warn/fail/skip exist."""
    with pytest.raises(ValueError, match="status"):
        Check("x", "passed", "", "")


def test_cli_cpu_only_json_and_missing_vocab_exit_code(tmp_path):
    """`python -m harness doctor --cpu-only --json` prints JSON; a missing vocab makes it exit 1."""
    cmd = [sys.executable, "-m", "harness", "doctor", "--cpu-only", "--json", "--vocab-file", str(tmp_path / "no")]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    report = json.loads(done.stdout)
    assert done.returncode == 1 and report["ready"] is False
    rows = {c["name"]: c for c in report["checks"]}
    assert rows["vocab"]["status"] == "fail" and all(rows[n]["status"] == "skip" for n in GPU_ROWS)


def test_cli_table_and_no_subcommand():
    """The plain table prints; no subcommand prints help and exits 4 (usage error)."""
    from harness.__main__ import main

    assert main([]) == 4
    done = subprocess.run([sys.executable, "-m", "harness", "doctor", "--cpu-only"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, 1) and "STATUS" in done.stdout and "-> " in done.stdout.splitlines()[-1]
