"""Where the suite's committed data lives, so no module hard-codes a path; how a file is written whole; and whether
a path stays inside a folder once symlinks are resolved (for untrusted submissions)."""

import contextlib
import errno
import os
import re
import signal
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
VOCAB_FILE = FIXTURES / "vocab" / "bert-base-uncased-vocab.txt"
CRITERIA_DIR = FIXTURES / "criteria"
GOLDEN_DIR = FIXTURES / "golden"
RECORDED_LOGS = FIXTURES / "logs"
BROKEN_INPUTS = FIXTURES / "broken"
RESULTS_DIR = REPO / "results"


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stop_signals_to(handler):
    """Inside the block Ctrl-C and SIGTERM go to `handler` (main thread only, as signal.signal is); after it, back
    to the handlers they had (SIG_DFL for one installed outside Python)."""
    previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, signal.SIG_DFL if old is None else old)


@contextlib.contextmanager
def stop_signals_deferred():
    """Ctrl-C and SIGTERM received inside the block take effect right after it, by the handlers restored then (in
    the main thread, where Python runs signal handlers whatever thread the signal reached; a thread mask would not
    do: the kernel hands the signal to another thread instead). Elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list = []
    try:
        with stop_signals_to(lambda signum, frame: pending.append(signum)):
            yield
    finally:
        if pending:
            signal.raise_signal(pending[0])   # to the handler now restored: it raises, stops, or ignores


def write_bytes_atomic(path, data: bytes) -> Path:
    """Write `data` to a new temporary file beside `path` (a fresh name, created exclusively: never through an
    existing file or symlink), then rename it over `path`: a reader sees the old file or the whole new one, never
    half of it. A symlink at `path` is replaced by the file, not written through. Ctrl-C and SIGTERM arriving
    meanwhile take effect once the write is done (an interrupt between creating the temporary file and knowing its
    name would leave it behind); any exception removes the temporary file; a leftover from a process killed
    mid-write never blocks the next write."""
    import tempfile

    path = Path(path)
    temp = None
    with stop_signals_deferred():
        try:
            fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # O_EXCL|O_NOFOLLOW
            with os.fdopen(fd, "wb") as fh:
                os.fchmod(fh.fileno(), 0o644)
                fh.write(data)
            os.replace(temp, path)
        except BaseException:
            if temp is not None:
                Path(temp).unlink(missing_ok=True)
            raise
    return path


_ATOMIC_LEFTOVER = re.compile(r"\..+\.[A-Za-z0-9_]{8}\.tmp")   # mkstemp(prefix=".NAME.", suffix=".tmp")


def remove_atomic_leftovers(folder) -> list[Path]:
    """Delete what write_bytes_atomic leaves behind when its process is killed mid-write (SIGKILL cannot wait for
    the rename): `.NAME.XXXXXXXX.tmp` files directly in `folder`, never followed through a symlink. Only for a
    folder whose writers are known to be dead. Returns what was removed."""
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if _ATOMIC_LEFTOVER.fullmatch(entry.name) and not entry.is_dir(follow_symlinks=False):
            try:
                os.unlink(entry.path)
                removed.append(Path(entry.path))
            except OSError:
                pass
    return removed


def write_text_atomic(path, text: str) -> Path:
    """write_bytes_atomic of `text` as UTF-8."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def inside(root, path) -> bool:
    """`path` is `root` or below it once both are resolved (symlinks followed, `..` removed)."""
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
    except (ValueError, OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
        return False
    return True


def links_leaving(folder, limit: int = 20) -> list:
    """[(link, target)] for symlinks under `folder` (walked without following any) that resolve outside it; a
    folder that is itself a symlink is one such entry. At most `limit` entries."""
    folder = Path(folder)
    if folder.is_symlink():
        return [(folder, os.readlink(folder))]
    found = []
    for entry, kind in walk_entries(folder):
        if kind == "link" and not inside(folder, entry):
            found.append((entry, os.readlink(entry)))
            if len(found) >= limit:
                return found
    return found


WALK_MAX_ENTRIES = 200_000


def walk_entries(folder, max_entries: int = WALK_MAX_ENTRIES):
    """(path, kind) for every entry under `folder`, kind "file", "dir", "link" or "other" (FIFO, device, socket),
    walked iteratively (any depth: no recursion) without following any link; at most `max_entries` entries (a
    submission holds a few dozen), the rest not listed. An unreadable folder is skipped."""
    stack, count = [Path(folder)], 0
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            count += 1
            if count > max_entries:
                return
            path = Path(e.path)
            try:
                if e.is_symlink():
                    yield path, "link"
                elif e.is_dir(follow_symlinks=False):
                    yield path, "dir"
                    stack.append(path)
                elif e.is_file(follow_symlinks=False):
                    yield path, "file"
                else:
                    yield path, "other"
            except OSError:
                continue


class NotInside(OSError):
    """A submission's file that is not opened: a component is a symlink (at the moment of opening, not only when
    checked), the path leaves its folder (absolute, `..`), or the end is not a regular file. `relpath` names it."""

    def __init__(self, relpath, why: str):
        super().__init__(f"{relpath}: {why}")
        self.relpath, self.why = str(relpath), why


def _components(relpath) -> list[str]:
    text = os.fspath(relpath)
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if text.startswith("/") or ".." in parts or not parts:
        raise NotInside(relpath, "not a path inside the folder (absolute, '..' or empty); only files inside it are read")
    return parts


def open_fd_inside(root, relpath) -> int:
    """A read-only fd of the regular file `root/relpath`, opened component by component relative to `root`'s own
    directory fd with O_NOFOLLOW (a link anywhere on the way, `root` itself included, refuses: swapped in after any
    earlier check or not), checked with fstat after opening. Raises NotInside (an OSError); a missing file is FileNotFoundError."""
    parts = _components(relpath)
    flags_dir = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(os.fspath(root), flags_dir)
    except OSError as exc:
        raise NotInside(relpath, f"its folder cannot be opened without following a link ({exc.strerror or exc})")
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, flags_dir, dir_fd=fd)
            except OSError as exc:
                raise NotInside(relpath, f"folder {part!r} on the way is a symlink or not a folder "
                                         f"({exc.strerror or exc})")
            os.close(fd)
            fd = nxt
        try:
            leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0),
                           dir_fd=fd)
        except FileNotFoundError:
            raise                       # a missing file stays FileNotFoundError for callers that expect it
        except OSError as exc:
            raise NotInside(relpath, "is a symlink; only files inside the folder are read" if exc.errno == errno.ELOOP
                            else f"cannot be opened ({exc.strerror or exc})")
    finally:
        os.close(fd)
    import stat

    if not stat.S_ISREG(os.fstat(leaf).st_mode):
        os.close(leaf)
        raise NotInside(relpath, "is not a regular file (a folder, device, FIFO or socket)")
    os.set_blocking(leaf, True)
    return leaf


def open_inside(root, relpath, mode: str = "rb"):
    """open_fd_inside as a file object (`mode` "rb", or "r" for UTF-8 text with surrogateescape). Raises NotInside."""
    if mode not in ("rb", "r"):
        raise ValueError(f"open_inside reads only: mode {mode!r}")
    fd = open_fd_inside(root, relpath)
    if mode == "rb":
        return os.fdopen(fd, "rb")
    return os.fdopen(fd, "r", encoding="utf-8", errors="surrogateescape")


def relative_inside(root, path) -> str:
    """`path` (absolute, or relative to the cwd) as a path relative to `root`, lexically (no link followed), for
    open_inside. Raises NotInside when it is not below `root`."""
    try:
        return os.path.relpath(os.path.abspath(path), os.path.abspath(root)).replace(os.sep, "/")
    except ValueError as exc:
        raise NotInside(path, f"not below {root} ({exc})")
