"""OUT of `python -m harness grade`: marked as the grader's (MARKER, which lists the files the grader wrote there: a
later run into the same OUT removes those and nothing else) and locked while a run writes into it (LOCK)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from harness.base.errors import HarnessError
from harness.base.paths import inside, write_text_atomic

MARKER = ".bert-grades"             # in OUT: marks it as the grader's and lists the files the grader wrote there
LOCK = ".bert-grades.lock"          # in OUT: held (flock) by the run writing into it


class UsageError(HarnessError):
    """A bad DIR/OUT/option: one line naming it and the fix, exit 4 (harness.cli.args.EXIT_USAGE)."""


def _read_marker(out: Path) -> dict | None:
    marker = out / MARKER
    if marker.is_symlink() or not marker.is_file():
        return None
    try:
        data = json.loads(marker.read_text(encoding="utf-8")[:10_000_000])
    except (OSError, ValueError):
        return {"files": []}
    return data if isinstance(data, dict) else {"files": []}


def prepare_out(out: Path):
    """Check OUT is the grader's (or new/empty), lock it, and remove the files an earlier run listed; returns the
    open lock file (kept open while grading). Raises UsageError."""
    import fcntl

    if out.is_symlink():
        raise UsageError(f"--out {out}: is a symlink; the grader writes nothing through one: give a real folder")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a folder; give a new or empty folder")
    previous = _read_marker(out) if out.is_dir() else None
    if out.is_dir() and previous is None and any(p.name != LOCK for p in out.iterdir()):
        raise UsageError(f"--out {out}: holds files the grader did not write (no {MARKER} in it); give a new or "
                         f"empty folder with --out (if a submission is named {out.name!r}, --out must be elsewhere)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write there ({exc.strerror or exc}); give a folder you can write to")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise UsageError(f"--out {out}: another `python -m harness grade` is writing there (it holds {out / LOCK}); "
                         "wait for it to finish or give another --out")
    for rel in (previous or {}).get("files", []):
        _remove_listed(out, rel)
    return fd


def _remove_listed(out: Path, rel) -> None:
    """Remove one file an earlier run listed in the marker: only a plain relative path inside OUT, only a file."""
    if not isinstance(rel, str) or rel.startswith("/") or ".." in Path(rel).parts or rel in ("", MARKER, LOCK):
        return
    path = out / rel
    if (path.is_symlink() or path.is_file()) and inside(out, path.parent):
        path.unlink(missing_ok=True)
        parent = path.parent
        while parent != out and inside(out, parent):
            try:
                parent.rmdir()       # only when empty: the grader's own per-submission folders
            except OSError:
                break
            parent = parent.parent


def write_marker(out: Path, files: list) -> None:
    write_text_atomic(out / MARKER, json.dumps({"written_by": "python -m harness grade", "files": files}, indent=0))
