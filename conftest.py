"""Suite-wide options, markers and the GPU skip. Session fixtures live in acceptance/conftest.py."""

from __future__ import annotations

import pytest

from harness.options import FLAGS, OPTIONS, setting


def pytest_addoption(parser):
    group = parser.getgroup("bert-acceptance")
    for dest, (flag, ini, help_text) in OPTIONS.items():
        if dest in FLAGS:
            group.addoption(flag, dest=dest, action="store_true", default=None, help=help_text)
            parser.addini(ini, help_text, type="bool", default=False)
        else:
            group.addoption(flag, dest=dest, default=None, help=help_text)
            parser.addini(ini, help_text, default=None)


def pytest_report_header(config):
    shown = {dest: setting(config, dest) for dest in OPTIONS}
    parts = [f"{OPTIONS[d][0]}={v}" for d, v in shown.items() if v not in (None, False, "")]
    return "bert-acceptance: " + (", ".join(parts) if parts else "defaults (profile reference)")


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - no torch means no GPU; the doctor explains why
        return 0


def pytest_collection_modifyitems(config, items):
    gpus = None
    for item in items:
        if "gpu" in item.keywords or "multigpu" in item.keywords:
            gpus = _gpu_count() if gpus is None else gpus
            need = 2 if "multigpu" in item.keywords else 1
            if gpus < need and not _judges_recorded_run(config):
                reason = (f"needs {need} CUDA GPU(s), found {gpus}: run `pytest -m gpu` on a GPU machine"
                          if need == 1 else f"needs {need} CUDA GPUs, found {gpus}")
                item.add_marker(pytest.mark.skip(reason=reason))


def _judges_recorded_run(config) -> bool:
    """--reuse-run / --from-log judge an existing run: no GPU needed."""
    return bool(setting(config, "reuse_run") or setting(config, "from_log"))
