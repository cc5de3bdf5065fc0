"""Suite-wide options, markers and the GPU skip. Session fixtures live in acceptance/conftest.py."""

from __future__ import annotations

import pytest

# One help text per setting, shared by the command-line flag and the ini key (the pytest-timeout way).
OPTIONS = {
    "run_dir": ("--run-dir", "bert_run_dir", "directory for this session's run (default: a fresh runs/<timestamp>)"),
    "keep_run": ("--keep-run", "bert_keep_run", "keep the run directory even when every test passed"),
    "criteria": ("--criteria", "bert_criteria", "criteria profile: reference (default), course, or a path to a .toml"),
    "vocab_file": ("--vocab-file", "bert_vocab_file", "WordPiece vocab (default: fixtures/vocab/bert-base-uncased-vocab.txt)"),
    "reuse_run": ("--reuse-run", "bert_reuse_run", "judge an existing run directory instead of training again"),
    "from_log": ("--from-log", "bert_from_log", "judge a submitted Megatron training log (no GPU needed)"),
    "checkpoint_dir": ("--checkpoint-dir", "bert_checkpoint_dir", "with --from-log: the run's --save directory"),
    "stage_timeout": ("--stage-timeout", "bert_stage_timeout", "wall-clock limit per stage in seconds (default 300)"),
    "megatron_lm": ("--megatron-lm", "bert_megatron_lm", "grade a Megatron-LM checkout at PATH instead of the reference trainer"),
    "train_script": ("--train-script", "bert_train_script", "with --megatron-lm: the student's training script"),
}
FLAGS = {"keep_run"}


def pytest_addoption(parser):
    group = parser.getgroup("bert-acceptance")
    for dest, (flag, ini, help_text) in OPTIONS.items():
        if dest in FLAGS:
            group.addoption(flag, dest=dest, action="store_true", default=None, help=help_text)
            parser.addini(ini, help_text, type="bool", default=False)
        else:
            group.addoption(flag, dest=dest, default=None, help=help_text)
            parser.addini(ini, help_text, default=None)


def setting(config, dest):
    """Effective value of a setting: command line wins over the ini key."""
    value = config.getoption(dest)
    if value is None:
        value = config.getini(OPTIONS[dest][1])
    return value


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


def _gpu_markers_selected(config) -> bool:
    return "gpu" in (config.getoption("markexpr") or "")


def _judges_recorded_run(config) -> bool:
    """--reuse-run / --from-log judge an existing run: no GPU needed."""
    return bool(setting(config, "reuse_run") or setting(config, "from_log"))
