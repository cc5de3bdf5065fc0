"""One run's outcome as the session records it, and the runs derived from another (the judge's mutants).

A derived run (RunSpec.derivation) is not trained: DERIVATIONS writes it from its base run's log and checkpoints
(a log cut short, checkpoint shards cut in half, a run without --save), so the judge's mutants cost no training.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from harness.evidence import logs
from harness.evidence.records import CheckpointReport, MemoryReport, RunEvidence
from harness.run.launch import StageResult
from harness.run.runs import RunSpec
from harness.evidence.logformat import format_arguments


@dataclass
class RunOutcome:
    """What happened to one run: its stage result and what the observers saw."""

    spec: RunSpec
    stage: StageResult | None = None
    memory: MemoryReport | None = None
    save_dir: Path | None = None
    summary: dict = field(default_factory=dict)
    evidence: RunEvidence | None = None
    checkpoint_report: CheckpointReport | None = None
    seconds: float = 0.0


def _truncate_log(base: RunOutcome, outcome: RunOutcome, target: Path) -> str:
    """The base run's log, cut before `training ...` (a submitted log that stops early)."""
    from harness.evidence import mutants

    return mutants.truncated_before_marker("training")(base.stage.log_path.read_text(errors="replace"))


def _corrupt_checkpoint(base: RunOutcome, outcome: RunOutcome, target: Path) -> str:
    """A copy of the base run's checkpoints with every .distcp shard of the last iteration cut in half.

    Every shard: which one holds the model's tensors depends on how the writer balanced them by size.
    """
    if base.save_dir is not None:
        outcome.save_dir = target / "checkpoints"
        shutil.copytree(base.save_dir, outcome.save_dir, dirs_exist_ok=True)
        last = max(outcome.save_dir.glob("iter_*"))
        for shard in sorted(last.glob("*.distcp")):
            shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    return base.stage.log_path.read_text(errors="replace")


def _without_save(base: RunOutcome, outcome: RunOutcome, target: Path) -> str:
    """The base run as if its command had no --save: no checkpoint directory, no save lines in the log (the ones
    the log parser reads as checkpoint records), and `save` None in its arguments block (what Megatron prints for
    an unset option)."""
    outcome.save_dir = None
    text = base.stage.log_path.read_text(errors="replace")
    save_lines = {record.line_no for record in logs.parse_log(text).checkpoints}
    save_row = format_arguments({"save": ""})[1]  # "  save ....... " as the block prints it
    kept = []
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        if number in save_lines:
            continue
        kept.append(save_row + "None\n" if line.startswith(save_row) else line)
    return "".join(kept)


DERIVATIONS = {"truncate-log": _truncate_log, "corrupt-checkpoint": _corrupt_checkpoint, "no-save": _without_save}


def device_of(outcome: RunOutcome) -> str | None:
    """Where the trainer ran: its own summary, else NVML's sighting of the process."""
    if outcome.summary.get("device"):
        return outcome.summary["device"]
    if outcome.memory is not None and outcome.memory.method != "unavailable":
        return "cuda" if outcome.memory.saw_process else "cpu"
    return None
