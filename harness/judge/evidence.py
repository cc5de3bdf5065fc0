"""What the observers measured about one run: the only input the criteria engine judges.

Each observer (log parser, checkpoint inspector, NVML sampler, launcher) fills one field; a field left
``None`` means "not measured", which the engine reports as not measurable, never as passed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CheckpointReport:
    """Result of inspecting a ``--save`` directory (harness.judge.checkpoints)."""

    save_dir: str
    iterations: tuple[int, ...] = ()          # iter_NNNNNNN dirs found, sorted
    tracker: int | None = None                # content of latest_checkpointed_iteration.txt
    format: str | None = None                 # "torch_dist" | "torch" | None
    loaded: bool = False                      # weights of the newest checkpoint loaded on CPU
    shapes_ok: bool = False                   # names/shapes match the model config
    num_parameters: int = 0                   # parameter elements in the loaded weights
    problems: tuple[str, ...] = ()            # human-readable, each names file and fix


@dataclass(frozen=True)
class MemoryReport:
    """Peak GPU memory of the trainer as NVML saw it (harness.run.gpumem)."""

    method: str                               # "nvml-process" | "nvml-device-delta" | "unavailable"
    peak_mib: float | None = None
    baseline_mib: float | None = None
    samples: int = 0
    interval_ms: float = 0.0
    gpu_name: str | None = None
    saw_process: bool = False                 # the trainer (or a child) appeared in NVML's process list
    reason: str = ""                          # why unavailable / which fallback was used


@dataclass(frozen=True)
class RunEvidence:
    """Everything known about one training run, plus its optional resume."""

    run_dir: str
    exit_code: int | None = None
    timed_out: bool = False
    log: Any = None                           # harness.judge.logs.ParsedLog of the training run
    log_path: str | None = None
    checkpoints: CheckpointReport | None = None
    memory: MemoryReport | None = None
    resume_log: Any = None                    # ParsedLog of the run resumed from a checkpoint
    device: str | None = None                 # "cuda" | "cpu", as the trainer reported it
    extra: dict = field(default_factory=dict)
