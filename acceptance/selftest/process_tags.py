"""Process tags for the self-tests that run real torchrun trees: every process of a run carries one tag in its
environment (torchrun's agent, both workers, the checkpoint writer's manager and any process they fork), so the
check for leftovers finds a process even after it was re-parented away from the tree the launcher followed."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import psutil

from harness.run.launch import StageResult, run_stage

TAG = "BERT_ACCEPTANCE_TREE_TAG"


def new_tag() -> dict[str, str]:
    """The environment entry that tags one run's processes."""
    return {TAG: uuid.uuid4().hex}


def tagged(tag: str) -> list[psutil.Process]:
    """Live (non-zombie) processes whose environment carries `tag`."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(TAG) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def describe(procs: list[psutil.Process]) -> list[str]:
    """pid and command line of each process, for a failure message."""
    out = []
    for proc in procs:
        try:
            out.append(f"{proc.pid}: {' '.join(proc.cmdline())[:160]}")
        except psutil.Error:
            out.append(f"{proc.pid}: ?")
    return out


def leftovers(tag: str) -> list[str]:
    """Kill what still carries `tag` (a test never leaks) and describe it."""
    left = tagged(tag)
    described = describe(left)
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    return described


def run_timed(spec, run_dir: Path) -> tuple[StageResult, list[tuple[float, str]]]:
    """Run a stage; each output line with seconds since start."""
    start = time.monotonic()
    lines: list[tuple[float, str]] = []
    result = run_stage(spec, run_dir, on_line=lambda line: lines.append((time.monotonic() - start, line)))
    return result, lines
