"""Process helpers below every stage: the trainer (harness.train) and the launcher (harness.run) both use them.

A free TCP port, whether a pid is still a live process, how many cores this process may use, and the two lines a resuming trainer prints around its
wait for the other run's checkpoint (the launcher's stall clock reads them).
"""

from __future__ import annotations

import os
import socket

import psutil

# A resuming trainer's (--wait-for-load) lines around its wait for the other run's checkpoint: plain text that the
# log parser reads as nothing; the stall clock stops while the first one is the last line (the wait has its own limit)
LOAD_WAIT_MARKER = "set up; waiting for the checkpoint to resume from"
LOAD_READY_MARKER = "the checkpoint to resume from is ready"


def usable_cores() -> int:
    """The cores this process may run on (its affinity: a Slurm or container limit), the machine's count where
    affinity is unknown (not Linux), else 1."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nobody listened on a moment ago (torchrun's master port, a c10d store)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def pid_alive(pid: int) -> bool:
    """A pid that exists and is not a zombie (one process's exit that nobody reaped yet is no longer alive)."""
    try:
        return _alive(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def _alive(proc: psutil.Process) -> bool:
    """The same process is still running (not reused, not a zombie)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
