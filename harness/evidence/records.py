"""What the observers measured about one run: the only input the criteria engine judges.

Each observer (log parser, checkpoint inspector, NVML sampler, launcher) fills one field; a field left
``None`` means "not measured", which the engine reports as not measurable, never as passed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class CheckpointReport:
    """Result of inspecting a ``--save`` directory (harness.evidence.checkpoints.inspector)."""

    save_dir: str
    iterations: tuple[int, ...] = ()          # iter_NNNNNNN dirs found, sorted
    tracker: int | None = None                # content of latest_checkpointed_iteration.txt
    format: str | None = None                 # "torch_dist" | "torch" | None
    loaded: bool = False                      # weights of the newest checkpoint loaded on CPU
    shapes_ok: bool = False                   # names/shapes match the model config
    num_parameters: int = 0                   # parameter elements in the loaded weights
    problems: tuple[str, ...] = ()            # human-readable, each names file and fix
    unreadable: str = ""                      # the suite cannot read this release's checkpoint (the grader's
                                              # limitation, never the student's): what it met, e.g. a class


@dataclass(frozen=True)
class RankMemory:
    """One GPU's peak: the trainer's processes on it (under torchrun, one rank each), or its device rise."""

    gpu_index: int
    peak_mib: float
    pids: tuple[int, ...] = ()                # the tree's pids NVML listed on this GPU
    rank: int | None = None                   # their RANK (torchrun's environment), when readable

    def label(self) -> str:
        """`rank 1 (GPU 1)`, or `GPU 0` for a process that is no torchrun rank."""
        return f"rank {self.rank} (GPU {self.gpu_index})" if self.rank is not None else f"GPU {self.gpu_index}"


@dataclass(frozen=True)
class MemoryReport:
    """Peak GPU memory of the trainer as NVML saw it (harness.run.gpumem); peak_mib is the worst GPU's."""

    method: str                               # "nvml-process" | "nvml-device-delta" | "unavailable"
    peak_mib: float | None = None
    baseline_mib: float | None = None
    samples: int = 0
    interval_ms: float = 0.0
    gpu_name: str | None = None
    saw_process: bool = False                 # the trainer (or a child) appeared in NVML's process list
    reason: str = ""                          # why unavailable / which fallback was used
    ranks: tuple[RankMemory, ...] = ()        # per GPU the trainer used; empty in reports of older versions

    def __post_init__(self):
        """Accept ranks as dicts (a report read back from JSON)."""
        ranks = tuple(r if isinstance(r, RankMemory) else RankMemory(**{**r, "pids": tuple(r.get("pids", ()))})
                      for r in self.ranks)
        object.__setattr__(self, "ranks", ranks)


@dataclass(frozen=True)
class RunEvidence:
    """Everything known about one training run, plus its optional resume."""

    run_dir: str
    exit_code: int | None = None
    timed_out: bool = False
    log: Any = None                           # harness.evidence.logs.ParsedLog of the training run
    log_path: str | None = None
    checkpoints: CheckpointReport | None = None
    memory: MemoryReport | None = None
    resume_log: Any = None                    # ParsedLog of the run resumed from a checkpoint
    device: str | None = None                 # "cuda" | "cpu", as the trainer reported it
    extra: dict = field(default_factory=dict)
    provenance: tuple = ()                    # how the log(s) were read, stitched or chosen, in words
    provenance_failures: tuple = ()           # (id, cause, fix) of a submission's logs that are not one run
