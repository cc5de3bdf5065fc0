"""Environment preflight: can this machine run the course's BERT training? One row per requirement.

`python -m harness doctor [--cpu-only] [--json]` prints the table and exits 1 when a hard requirement fails.
A check's status: "ok", "warn" (works, but read the fix), "fail" (hard requirement), "skip" (not checked, and why).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable

from harness.base.paths import REPO, VOCAB_FILE

MIN_FREE_GPU_GIB = 8.0
MIN_FREE_DISK_GIB = 1.0
MEGATRON_CORE_RANGE = ("0.16.1", "0.20")          # supported: >= first, < second
VOCAB_SIZE = 30522
VOCAB_SPECIAL = ("[CLS]", "[SEP]", "[MASK]")
DEFAULT_RUN_DIR = REPO / "runs"
GIB = 1024 ** 3
STATUSES = ("ok", "warn", "fail", "skip")
CPU_ONLY_SKIP = "skipped: --cpu-only"


@dataclass(frozen=True)
class Check:
    """One preflight row."""

    name: str
    status: str          # "ok" | "warn" | "fail" | "skip"
    value: str           # what was found
    requirement: str     # what is needed
    fix: str = ""        # what to do when not ok

    def __post_init__(self):
        """Only the four statuses exist."""
        if self.status not in STATUSES:
            raise ValueError(f"Check {self.name!r}: status {self.status!r} not in {STATUSES}")


# ---- versions --------------------------------------------------------------------------------------------------

def parse_version(text: str) -> tuple[tuple[int, ...], int]:
    """(release numbers padded to 3, 0 for a pre-release/dev else 1): enough to order megatron-core versions."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)(.*)", text)
    if not m:
        raise ValueError(f"not a version: {text!r}")
    release = tuple(int(x) for x in m.group(1).split("."))
    release = release + (0,) * (3 - len(release))
    pre = re.match(r"[.-]?(a|b|rc|alpha|beta|pre|dev)", m.group(2) or "", re.IGNORECASE)
    return release, 0 if pre else 1


def in_range(version: str, low: str, high: str) -> bool:
    """low <= version < high (a pre-release of `low` is below it)."""
    return parse_version(low) <= parse_version(version) < (parse_version(high)[0], 0)


def check_megatron_core(version: str | None = None) -> Check:
    """megatron-core installed and within the supported range."""
    low, high = MEGATRON_CORE_RANGE
    need = f">= {low}, < {high}"
    fix = f"pip install 'megatron-core>={low},<{high}' (Python 3.11: 0.16.1; >= 0.17 needs Python >= 3.12)"
    version = version if version is not None else _dist_version("megatron-core")
    if version is None:
        return Check("megatron-core", "fail", "not installed", need, fix)
    try:
        ok = in_range(version, low, high)
    except ValueError:
        return Check("megatron-core", "fail", f"unreadable version {version!r}", need, fix)
    if ok:
        return Check("megatron-core", "ok", version, need)
    if parse_version(version) < parse_version(low):
        return Check("megatron-core", "fail", f"{version} (too old)", need, fix)
    return Check("megatron-core", "warn", f"{version} (newer than tested)", need,
                 f"untested: results may differ; for the reference numbers use megatron-core {low}")


def _dist_version(name: str) -> str | None:
    """Installed distribution version, without importing it (megatron.core's import is slow and noisy)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _has_module(name: str) -> bool:
    """The top-level module can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# ---- GPU -------------------------------------------------------------------------------------------------------

def _load_nvml(nvml: Any = None) -> tuple[Any, str | None]:
    """(initialised pynvml module or None, the reason when None)."""
    try:
        module = nvml if nvml is not None else importlib.import_module("pynvml")
    except ImportError:
        return None, "pynvml is not installed (pip install nvidia-ml-py)"
    try:
        module.nvmlInit()
    except _nvml_errors(module) as exc:
        return None, f"NVML: {type(exc).__name__}: {exc}"
    return module, None


def _nvml_errors(module: Any) -> tuple[type[BaseException], ...]:
    """NVML's own error type plus OSError (a missing shared library)."""
    error = getattr(module, "NVMLError", None)
    return (error, OSError) if isinstance(error, type) else (OSError,)


def _text(value) -> str:
    """NVML returns bytes in old pynvml."""
    return value.decode() if isinstance(value, bytes) else str(value)


def check_gpu(nvml: Any, nvml_reason: str | None, torch: ModuleType | None) -> Check:
    """A GPU is visible with >= 8 GiB free."""
    need = f">= 1 NVIDIA GPU with >= {MIN_FREE_GPU_GIB:g} GiB free"
    if nvml is None:
        cuda = "torch.cuda.is_available() is False" if not _cuda_available(torch) else "torch sees a GPU"
        return Check("gpu", "fail", f"no GPU visible: {nvml_reason}; {cuda}", need,
                     "run on a machine with an NVIDIA GPU and its driver (nvidia-smi must work); "
                     "CPU-only checks: --cpu-only")
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        name = _text(nvml.nvmlDeviceGetName(handle))
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    except _nvml_errors(nvml) as exc:
        return Check("gpu", "fail", f"NVML sees no usable GPU 0: {type(exc).__name__}: {exc}", need,
                     "check nvidia-smi and CUDA_VISIBLE_DEVICES")
    free_gib, total_gib = mem.free / GIB, mem.total / GIB
    value = f"{name}, {free_gib:.1f} GiB free of {total_gib:.1f} GiB"
    if free_gib < MIN_FREE_GPU_GIB:
        return Check("gpu", "fail", value, need, "free GPU memory: stop other processes on the GPU (nvidia-smi)")
    return Check("gpu", "ok", value, need)


def check_driver(nvml: Any, nvml_reason: str | None) -> Check:
    """The NVIDIA driver and the CUDA version it supports."""
    need = "an NVIDIA driver (CUDA version >= torch's CUDA build)"
    if nvml is None:
        return Check("driver", "fail", f"no driver: {nvml_reason}", need, "install the NVIDIA driver")
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
    except _nvml_errors(nvml) as exc:
        return Check("driver", "warn", f"version unreadable: {type(exc).__name__}: {exc}", need, "check nvidia-smi")
    return Check("driver", "ok", f"{driver}, CUDA {cuda // 1000}.{cuda % 1000 // 10}", need)


def _cuda_available(torch: ModuleType | None) -> bool:
    """torch.cuda.is_available(), False without torch."""
    return bool(torch is not None and torch.cuda.is_available())


def check_torch(torch: ModuleType | None, cpu_only: bool) -> Check:
    """torch installed; on a GPU run, a CUDA build that sees the GPU."""
    need = "torch >= 2.6" + ("" if cpu_only else ", CUDA build, torch.cuda.is_available()")
    if torch is None:
        return Check("torch", "fail", "not installed", need, "pip install torch (a CUDA build on the GPU machine)")
    cuda_build = getattr(torch.version, "cuda", None)
    value = f"{torch.__version__}, " + (f"CUDA {cuda_build} build" if cuda_build else "CPU-only build")
    if cpu_only:
        return Check("torch", "ok", value, need)
    if not cuda_build:
        return Check("torch", "fail", value, need,
                     "install a CUDA build of torch matching the driver (pip install torch --index-url "
                     "https://download.pytorch.org/whl/cu128 or the CUDA version the driver supports)")
    if not torch.cuda.is_available():
        return Check("torch", "fail", value + ", torch.cuda.is_available() is False", need,
                     "the driver is older than torch's CUDA build, or no GPU is visible (CUDA_VISIBLE_DEVICES?)")
    return Check("torch", "ok", value, need)


def check_nccl(torch: ModuleType | None) -> Check:
    """NCCL is available (--distributed-backend nccl)."""
    need = "torch.distributed with NCCL (--distributed-backend nccl)"
    fix = "install a CUDA build of torch (it bundles NCCL); on a CPU use --distributed-backend gloo"
    if torch is None or not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        return Check("nccl", "fail", "not available", need, fix)
    try:
        version = torch.cuda.nccl.version()
    except (RuntimeError, AttributeError) as exc:
        return Check("nccl", "fail", f"torch.cuda.nccl.version() failed: {exc}", need, fix)
    version = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    return Check("nccl", "ok", version, need)


# ---- software and files ----------------------------------------------------------------------------------------

def check_optional_accelerators() -> list[Check]:
    """apex and Transformer Engine: optional, reported (pretrain_bert.py 0.16.1 wants TE)."""
    te = _has_module("transformer_engine")
    apex = _has_module("apex")
    return [
        Check("transformer-engine", "ok" if te else "warn", "installed" if te else "not installed",
              "optional (Megatron-LM 0.16.1 pretrain_bert.py imports it)",
              "" if te else "the suite's reference trainer does not need it; for pretrain_bert.py install TE or "
                            "patch its TE import and pass --spec local"),
        Check("apex", "ok", "installed" if apex else "not installed (optional)",
              "optional (fused kernels; torch fallbacks work)"),
    ]


def _prebuilt_helpers() -> bool:
    """megatron-core's dataset helpers come compiled in the wheel (helpers_cpp*.so)."""
    spec = importlib.util.find_spec("megatron")
    for root in (spec.submodule_search_locations or []) if spec else []:
        if list(Path(root, "core", "datasets").glob("helpers_cpp*")):
            return True
    return False


def check_build_tools(prebuilt: bool | None = None) -> Check:
    """g++, make and pybind11 (Megatron compiles its dataset helpers with them when they are not prebuilt)."""
    found = {"g++": shutil.which("g++") is not None, "make": shutil.which("make") is not None,
             "pybind11": _has_module("pybind11")}
    value = ", ".join(f"{tool} {'ok' if ok else 'missing'}" for tool, ok in found.items())
    need = "g++, make, pybind11 (to build megatron/core/datasets/helpers.cpp)"
    if all(found.values()):
        return Check("build tools", "ok", value, need)
    prebuilt = _prebuilt_helpers() if prebuilt is None else prebuilt
    steps = (["apt-get install build-essential"] if not (found["g++"] and found["make"]) else []) + \
        (["pip install pybind11"] if not found["pybind11"] else [])
    fix = "; ".join(steps)
    if prebuilt:
        return Check("build tools", "warn", value + "; helpers_cpp prebuilt in megatron-core", need,
                     fix + " if you use a Megatron-LM checkout")
    return Check("build tools", "fail", value, need, fix)


def own_vocab_problem(path: Path) -> str | None:
    """Why `path` is not the BERT uncased vocab, or None."""
    if not path.is_file():
        return f"not found: {path}"
    tokens = path.read_text(encoding="utf-8", errors="replace").splitlines()
    if len(tokens) != VOCAB_SIZE:
        return f"{path}: {len(tokens)} tokens, expected {VOCAB_SIZE}"
    missing = [t for t in VOCAB_SPECIAL if t not in set(tokens)]
    return f"{path}: missing {', '.join(missing)}" if missing else None


def _external_vocab_problem(path: Path) -> str | None:
    """harness.data.tokenizer.validate_vocab's verdict when that module exists (its errors are its message)."""
    try:
        from harness.data.tokenizer import validate_vocab  # owned elsewhere; optional
    except ImportError:
        return None
    try:
        validate_vocab(path)
    except TypeError:
        return None        # a different signature: our own check stands
    except (ValueError, OSError, AssertionError) as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - its VocabError type is not known here; the message is the point
        return f"{type(exc).__name__}: {exc}"
    return None


def check_vocab(path: str | os.PathLike | None = None) -> Check:
    """The WordPiece vocab exists, has 30522 tokens and the special tokens."""
    path = Path(path) if path is not None else VOCAB_FILE
    need = f"{VOCAB_SIZE} lines incl. {'/'.join(VOCAB_SPECIAL)}"
    problem = own_vocab_problem(path) or _external_vocab_problem(path)
    if problem:
        return Check("vocab", "fail", problem, need,
                     f"pass --vocab-file {VOCAB_FILE} (BERT uncased WordPiece, see fixtures/vocab/PROVENANCE.md)")
    return Check("vocab", "ok", str(path), need)


def _existing_parent(path: Path) -> Path:
    """The nearest existing directory at or above `path` (the run dir may not exist yet)."""
    path = path.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(run_dir: str | os.PathLike | None = None) -> Check:
    """Room for checkpoints (2 x 66 MB) and logs in the run directory's filesystem."""
    where = _existing_parent(Path(run_dir) if run_dir is not None else DEFAULT_RUN_DIR)
    free_gib = shutil.disk_usage(where).free / GIB
    need = f">= {MIN_FREE_DISK_GIB:g} GiB free"
    value = f"{free_gib:.1f} GiB free at {where}"
    if free_gib < MIN_FREE_DISK_GIB:
        return Check("disk", "fail", value, need, "free disk space or point --run-dir at a larger filesystem")
    return Check("disk", "ok", value, need)


def check_psutil() -> Check:
    """psutil: torch_dist checkpoint saves hang without it; the launcher needs it too."""
    version = _dist_version("psutil")
    need = "installed (torch_dist saves hang without it)"
    if version is None:
        return Check("psutil", "fail", "not installed", need, "pip install psutil")
    return Check("psutil", "ok", version, need)


DIST_NAME = "bert-acceptance"


def requires_python() -> str:
    """The package's own Python requirement (">=3.11"), one source: the installed metadata's Requires-Python, or
    pyproject.toml's requires-python where the package is not installed (a plain checkout on PYTHONPATH)."""
    try:
        found = importlib.metadata.metadata(DIST_NAME).get("Requires-Python")
    except importlib.metadata.PackageNotFoundError:
        found = None
    if found:
        return found.strip()
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"].strip()


def _minimum(spec: str) -> tuple[int, ...]:
    """The lowest version a requires-python of the form ">=X.Y[.Z]" allows (the only form pyproject uses)."""
    m = re.fullmatch(r"\s*>=\s*(\d+(?:\.\d+)*)\s*", spec)
    if not m:
        raise ValueError(f"requires-python {spec!r}: doctor reads only '>=X.Y'")
    return tuple(int(x) for x in m.group(1).split("."))


def check_python(version_info: tuple = tuple(sys.version_info[:3]), spec: str | None = None) -> Check:
    """The interpreter against the package's requires-python (megatron-core >= 0.17 needs Python >= 3.12)."""
    spec = spec if spec is not None else requires_python()
    low = _minimum(spec)
    version = ".".join(map(str, version_info[:3]))
    need = f">= {'.'.join(map(str, low))} (requires-python {spec.replace(' ', '')})"
    if tuple(version_info[:len(low)]) < low:
        return Check("python", "fail", version, need,
                     f"use Python {'.'.join(map(str, low))} or newer (a venv made with it: python3.N -m venv .venv)")
    return Check("python", "ok", version, need)


def _import_torch() -> ModuleType | None:
    """torch, or None when it is not installed."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        return None


# ---- the table -------------------------------------------------------------------------------------------------

def gpu_checks(torch: ModuleType | None, nvml: Any = None) -> list[Check]:
    """GPU model and memory, driver, torch's CUDA build, NCCL."""
    module, reason = _load_nvml(nvml)
    try:
        return [check_gpu(module, reason, torch), check_driver(module, reason), check_torch(torch, cpu_only=False),
                check_nccl(torch)]
    finally:
        if module is not None:
            module.nvmlShutdown()


def skipped_gpu_checks(torch: ModuleType | None) -> list[Check]:
    """With --cpu-only: GPU rows say skipped; torch is still reported."""
    return [Check("gpu", "skip", CPU_ONLY_SKIP, f">= 1 NVIDIA GPU with >= {MIN_FREE_GPU_GIB:g} GiB free"),
            Check("driver", "skip", CPU_ONLY_SKIP, "an NVIDIA driver"),
            check_torch(torch, cpu_only=True),
            Check("nccl", "skip", CPU_ONLY_SKIP, "torch.distributed with NCCL")]


def run_checks(cpu_only: bool = False, *, vocab_file: str | os.PathLike | None = None,
               run_dir: str | os.PathLike | None = None, nvml: Any = None, torch: Any = None,
               megatron_core_version: str | None = None) -> list[Check]:
    """Every preflight check, in table order (fakes for nvml/torch/version are for the self-tests)."""
    torch = torch if torch is not None else _import_torch()
    checks = [check_python()]
    checks += skipped_gpu_checks(torch) if cpu_only else gpu_checks(torch, nvml)
    checks += [check_megatron_core(megatron_core_version), *check_optional_accelerators(), check_build_tools(),
               check_vocab(vocab_file), check_disk(run_dir), check_psutil()]
    return checks


def hard_failures(checks: Iterable[Check]) -> list[Check]:
    """The checks that make training impossible here."""
    return [c for c in checks if c.status == "fail"]


def one_line(check: Check) -> str:
    """A check's row and its fix as one line (whitespace in what was found, e.g. NVML's message, collapsed)."""
    text = f"{check.name}: {check.value} (needs {check.requirement})" + (f"; fix: {check.fix}" if check.fix else "")
    return " ".join(text.split())


def no_gpu_reason(torch: Any = None, nvml: Any = None) -> str:
    """Why this machine has no usable CUDA GPU, on one line: the first failing GPU row of the doctor's table (root
    cause first: the GPU, its driver, torch's CUDA build, NCCL) with its fix. The pytest session that needs a GPU
    and finds none stops with it (conftest.py), so the doctor is the one source of the reason."""
    torch = torch if torch is not None else _import_torch()
    failing = hard_failures(gpu_checks(torch, nvml))
    if failing:
        return one_line(failing[0])
    return ("gpu: torch.cuda.device_count() is 0 although the doctor's GPU checks pass; fix: check "
            "CUDA_VISIBLE_DEVICES and run `python -m harness doctor`")


def format_table(checks: list[Check]) -> str:
    """An aligned table, each non-ok row followed by its fix, and a one-line summary."""
    label = {"ok": "ok", "warn": "WARN", "fail": "FAIL", "skip": "skip"}
    header = ("STATUS", "CHECK", "NEEDS", "FOUND")
    rows = [(label[c.status], c.name, c.requirement, c.value) for c in checks]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    lines = [_row(header, widths), _row(tuple("-" * w for w in widths) + ("-" * 5,), widths)]
    for check, row in zip(checks, rows):
        lines.append(_row(row, widths))
        if check.fix and check.status in ("warn", "fail"):
            lines.append(" " * (widths[0] + 2) + "fix: " + check.fix)
    counts = {s: sum(c.status == s for c in checks) for s in STATUSES}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items())
                 + (" -> NOT READY" if counts["fail"] else " -> ready"))
    return "\n".join(lines)


def _row(cells: tuple[str, ...], widths: list[int]) -> str:
    """Cells padded to their column width (the last column is free)."""
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths)) + "  " + cells[-1]


def to_json(checks: list[Check]) -> str:
    """The checks as a JSON list plus the verdict."""
    return json.dumps({"ready": not hard_failures(checks), "checks": [asdict(c) for c in checks]}, indent=2)


def add_arguments(parser) -> None:
    """The doctor's command-line flags."""
    parser.add_argument("--cpu-only", action="store_true", help="skip the GPU checks (CI, laptops)")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument("--vocab-file", default=None, help=f"vocab to check (default: {VOCAB_FILE})")
    parser.add_argument("--run-dir", default=None, help=f"where runs go, for the disk check (default: {DEFAULT_RUN_DIR})")
    parser.epilog = EXIT_CODES_HELP


EXIT_READY, EXIT_NOT_READY = 0, 1
EXIT_CODES_HELP = ("exit codes: 0 ready (no FAIL row; WARN rows are read and allowed); 1 not ready (a FAIL row: its "
                   "fix is printed under it); 4 usage error")


def main(args) -> int:
    """Print the table (or JSON); 1 when a hard requirement fails."""
    checks = run_checks(cpu_only=args.cpu_only, vocab_file=args.vocab_file, run_dir=args.run_dir)
    print(to_json(checks) if args.json else format_table(checks))
    return EXIT_NOT_READY if hard_failures(checks) else EXIT_READY
