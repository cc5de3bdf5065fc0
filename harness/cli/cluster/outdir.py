"""grade-checkouts' OUT: a folder the tool owns, proved by a marker, changed only below it and never through a link.

    claim(out, root, students)            # refuse an OUT that holds what the tool did not create, or a student's
    real_dir(out, "tasks", student)       # each component created or checked with lstat: a link is refused
    remove(out, "tasks", student)         # opened component by component with O_NOFOLLOW; only marker-listed names
    write_text(out, ("gradescope", student, "results.json"), text)

The marker OUT/.grade-checkouts.json lists the top-level names the tool made (its state file, the merged grades,
gradescope/, tasks/, submitit/); an OUT that holds any other entry, or is a link, or is a student's folder (or holds
one, or lies inside one) is refused before anything runs. A removal walks from OUT through real directories only
(os.open with O_NOFOLLOW | O_DIRECTORY, then rmtree with dir_fd, which never follows a link either): a planted
`tasks -> ..` makes the walk fail, and nothing outside OUT is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Iterable, Sequence

from harness.base.errors import HarnessError
from harness.base.paths import write_text_atomic

MARKER = ".grade-checkouts.json"
TOOL = "python -m harness grade-checkouts"
OWNED = ("checkouts-state.json", "grades.json", "grades.md", "grades.csv", "grades-junit.xml", "gradescope", "tasks",
         "submitit")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class OutError(HarnessError):
    """OUT cannot be used (or a path below it would leave it): the message names the entry and the fix."""


def default_out(root: Path) -> Path:
    """DIR's grades beside DIR (DIR-grades/), never inside it: no student folder can take that name."""
    root = Path(root).expanduser().resolve()
    return root.parent / f"{root.name}-grades"


def _is_link_or_not_dir(path: Path) -> str | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder"
    return None


def claim(out: Path, root: Path, students: Iterable[Path]) -> None:
    """Make OUT the tool's own (create it and its marker), or OutError when it holds anything the tool did not make."""
    out = Path(out)
    problem = _is_link_or_not_dir(out)
    if problem:
        raise OutError(f"--out {out}: {problem}: refused (the tool writes and deletes below OUT); give a new folder")
    resolved = out.resolve()
    for folder in students:
        student = Path(folder).resolve()
        if resolved == student or resolved.is_relative_to(student) or student.is_relative_to(resolved):
            raise OutError(f"--out {out}: it is, holds or lies inside the student folder {folder}: refused (no "
                           "student's files may be overwritten or deleted); give a folder outside DIR")
    if resolved == Path(root).resolve() or Path(root).resolve().is_relative_to(resolved):
        raise OutError(f"--out {out}: it is or holds DIR {root}: refused; give a folder outside DIR")
    if out.exists():
        listed = set(_listed(out))
        foreign = sorted(n for n in os.listdir(out) if n != MARKER and n not in listed and not _leftover(n))
        if foreign:
            shown = ", ".join(repr(n) for n in foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise OutError(f"--out {out}: holds {shown}, which {TOOL} did not create (no {MARKER} lists it): refused, "
                           "nothing is overwritten or deleted there; give a new or empty folder")
    else:
        out.mkdir(parents=True)
    write_text_atomic(out / MARKER, json.dumps({"tool": TOOL, "created": list(OWNED)}, indent=2) + "\n")


def _listed(out: Path) -> list[str]:
    """The names OUT's marker lists ([] without a readable marker, a plain file: then OUT must be empty)."""
    marker = out / MARKER
    try:
        if not stat.S_ISREG(os.lstat(marker).st_mode):
            return []
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    created = data.get("created") if isinstance(data, dict) else None
    return [n for n in created if isinstance(n, str) and n in OWNED] if isinstance(created, list) else []


def _leftover(name: str) -> bool:
    """A temporary file of an atomic write the tool was killed in (`.grades.json.XXXX.tmp`): its own."""
    return name.endswith(".tmp") and any(name.startswith(f".{n}.") for n in (*OWNED, MARKER.lstrip(".")))


def _check_parts(parts: Sequence[str], owned: bool = True) -> None:
    if not parts or (owned and parts[0] not in OWNED):
        raise OutError(f"{'/'.join(parts) or '(nothing)'}: not one of the names {TOOL} owns in OUT")
    for part in parts:
        if part in ("", ".", "..") or "/" in part or "\0" in part:
            raise OutError(f"{part!r}: not a plain name below OUT")


def _open_dirs(out: Path, parts: Sequence[str], create: bool) -> int:
    """A descriptor of OUT/parts..., every component a real directory (created when `create`); links refused."""
    fd = os.open(out, _DIR_FLAGS)
    try:
        for part in parts:
            if create:
                try:
                    os.mkdir(part, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:   # ELOOP/ENOTDIR: a link or a file where a folder must be
                raise OutError(f"{Path(out, *parts[:parts.index(part) + 1])}: not a real folder ({exc.strerror}): "
                               "refused, nothing is followed out of OUT") from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def real_dir(out: Path, *parts: str, owned: bool = True) -> Path:
    """OUT/parts..., created as real folders; OutError when any component is a link or a file. `owned`: parts[0]
    must be a name the marker lists (False: a caller's own folder, e.g. a task run outside OUT)."""
    _check_parts(parts, owned)
    os.close(_open_dirs(Path(out), parts, create=True))
    return Path(out, *parts)


def remove(out: Path, *parts: str, owned: bool = True) -> None:
    """Remove OUT/parts... (a marker-listed name or below one) without following any link on the way or inside."""
    _check_parts(parts, owned)
    try:
        fd = _open_dirs(Path(out), parts[:-1], create=False)
    except FileNotFoundError:
        return
    try:
        try:
            st = os.lstat(parts[-1], dir_fd=fd)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(parts[-1], dir_fd=fd)
        else:
            os.unlink(parts[-1], dir_fd=fd)      # a file, or a link itself (never its target)
    finally:
        os.close(fd)


def write_text(out: Path, parts: Sequence[str], text: str) -> Path:
    """Write OUT/parts... atomically, its folders created or checked as real ones (a link in place of the file is
    replaced, never written through)."""
    parts = tuple(parts)
    folder = real_dir(out, *parts[:-1]) if len(parts) > 1 else Path(out)
    if len(parts) == 1:
        _check_parts(parts)
    return write_text_atomic(folder / parts[-1], text)
