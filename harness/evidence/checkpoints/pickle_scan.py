"""The first step of reading a submitted pickle: walking its opcodes without building anything (harness.judge.
safe_pickle's scan), and opening a submission's file without following links; the refusals both raise.

``scan_pickle`` collects the (module, name) globals a pickle names, as strings, and bounds its op count, memo,
nesting and the size of its structure with every shared reference copied. ``open_regular`` opens a file relative to
the submission's folder component by component (dir_fd, O_NOFOLLOW, fstat: a regular file).
"""

from __future__ import annotations

import os
import pickle
import pickletools
import stat
from pathlib import Path

from harness.base.paths import open_fd_inside, relative_inside

MAX_PICKLE_BYTES = 64 << 20       # a real common.pt's data.pkl is ~30 KB
MAX_OPS = 300_000                 # a real .metadata is ~22,000 ops; the scan walks ~250,000 ops a second
MAX_EXPANDED = 4_000_000          # nodes of the unpickled structure with every shared reference copied
MAX_DEPTH = 100                   # nesting; a real checkpoint's is < 10
MAX_MEMO_INDEX = 1 << 20          # the C unpickler sizes its memo array by the largest index


class UnsafeContent(pickle.UnpicklingError):
    """A pickle global outside the table; `name` is module.qualname as the pickle spelled it."""

    def __init__(self, name: str):
        super().__init__(f"refused: unsafe content: {name}")
        self.name = name


class TooComplex(pickle.UnpicklingError):
    """A pickle (or a torch.save archive) beyond a bound; `reason` says which, in words."""

    def __init__(self, reason: str):
        super().__init__(f"refused: unsafe content: {reason}")
        self.reason = reason
        self.name = reason


class UnknownClass(pickle.UnpicklingError):
    """A Megatron-LM class the table does not know: this suite cannot read that release's checkpoint yet."""

    def __init__(self, name: str, why: str = ""):
        super().__init__(f"unknown class {name}{': ' + why if why else ''}")
        self.name = name
        self.why = why


# ---------------------------------------------------------------- opening a submission's file

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def open_regular(path, limit: int | None = None, root=None):
    """Open `path` for reading, refusing links and anything fstat does not call a regular file; a binary file.

    With `root` (a folder `path` lies in), every component below `root` is opened relative to its parent's file
    descriptor (dir_fd) with O_NOFOLLOW, so a component swapped for a symlink after a check is refused at open
    time, not read through. Without it only the last component is opened with O_NOFOLLOW. O_NONBLOCK: a FIFO
    planted as a file never blocks the open. `limit`: refuse a larger file (TooComplex)."""
    path = Path(path)
    if root is not None:   # harness.base.paths' one mechanism: dir_fd walk, O_NOFOLLOW, fstat (root itself no link)
        fd = open_fd_inside(root, relative_inside(root, path))
    else:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path}: not a regular file")
        if limit is not None and st.st_size > limit:
            raise TooComplex(f"{st.st_size} bytes, more than the {limit >> 20} MiB bound for this file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path, limit: int, root=None) -> bytes:
    """The whole of a regular file of at most `limit` bytes (opened as open_regular does)."""
    with open_regular(path, limit, root) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise TooComplex(f"more than the {limit >> 20} MiB bound for this file")
    return data


# ---------------------------------------------------------------- step 1: the opcode scan

_MARK = object()
# ops that add to the container below them and leave it on the stack (the same object: memo refs see it grow)
_IN_PLACE = {"APPEND", "APPENDS", "SETITEM", "SETITEMS", "ADDITEMS", "BUILD"}
_STRING_OPS = {"UNICODE", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "STRING", "BINSTRING",
               "SHORT_BINSTRING"}


def scan_pickle(data: bytes, what: str = "pickle") -> tuple[tuple[str, str], ...]:
    """The (module, name) globals a pickle names, in order, found without unpickling it; TooComplex when its
    op count, memo, nesting or expanded size passes a bound, or it uses the extension registry."""
    if len(data) > MAX_PICKLE_BYTES:
        raise TooComplex(f"{what} is {len(data)} bytes, more than {MAX_PICKLE_BYTES >> 20} MiB")
    size: list[int] = []       # per node: expanded size (capped)
    depth: list[int] = []
    text: dict[int, str] = {}  # string constants, for STACK_GLOBAL
    stack: list = []
    memo: dict[int, int] = {}
    found: list[tuple[str, str]] = []
    cap = MAX_EXPANDED + 1

    def new(children=(), value=None) -> int:
        node = len(size)
        size.append(min(cap, 1 + sum(size[c] for c in children)))
        depth.append(1 + max((depth[c] for c in children), default=0))
        if value is not None:
            text[node] = value
        check(node)
        return node

    def grow(node: int, children) -> None:
        size[node] = min(cap, size[node] + sum(size[c] for c in children))
        depth[node] = max(depth[node], 1 + max((depth[c] for c in children), default=0))
        check(node)

    def check(node: int) -> None:
        if size[node] > MAX_EXPANDED:
            raise TooComplex(f"{what}'s structure is more than {MAX_EXPANDED:,} objects once its shared "
                             "references are expanded (a DAG of shared containers: hashing it never ends)")
        if depth[node] > MAX_DEPTH:
            raise TooComplex(f"{what} nests deeper than {MAX_DEPTH} levels")

    def pop_to_mark() -> list[int]:
        items = []
        while stack:
            item = stack.pop()
            if item is _MARK:
                return items[::-1]
            items.append(item)
        raise TooComplex(f"{what} is malformed: no MARK")

    def pop() -> int:
        if not stack or stack[-1] is _MARK:
            raise TooComplex(f"{what} is malformed: stack underflow")
        return stack.pop()

    try:
        for count, (op, arg, _pos) in enumerate(pickletools.genops(data), 1):
            if count > MAX_OPS:
                raise TooComplex(f"{what} has more than {MAX_OPS:,} pickle ops")
            name = op.name
            if name in ("PROTO", "FRAME", "STOP"):
                continue
            if name == "MARK":
                stack.append(_MARK)
            elif name in ("POP",):
                pop()
            elif name == "POP_MARK":
                pop_to_mark()
            elif name == "DUP":
                stack.append(stack[-1] if stack else pop())
            elif name in ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE"):
                index = len(memo) if name == "MEMOIZE" else int(arg)
                if index > MAX_MEMO_INDEX or index < 0:
                    raise TooComplex(f"{what}'s memo index {index} is beyond {MAX_MEMO_INDEX:,}")
                memo[index] = stack[-1] if stack and stack[-1] is not _MARK else pop()
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                if int(arg) not in memo:
                    raise TooComplex(f"{what} is malformed: memo {arg} read before it is written")
                stack.append(memo[int(arg)])
            elif name in ("GLOBAL", "INST"):
                module, _, qual = str(arg).partition(" ")
                found.append((module, qual))
                if name == "INST":
                    stack.append(new(pop_to_mark()))
                else:
                    stack.append(new())
            elif name == "STACK_GLOBAL":
                qual_node, module_node = pop(), pop()
                if qual_node not in text or module_node not in text:
                    raise TooComplex(f"{what} names a global with strings it computes")
                found.append((text[module_node], text[qual_node]))
                stack.append(new())
            elif name.startswith("EXT"):
                raise UnsafeContent(f"copyreg extension code {arg}")
            elif name in _IN_PLACE:
                children = pop_to_mark() if pickletools.markobject in op.stack_before else \
                    [pop() for _ in range(len(op.stack_before) - 1)]
                target = pop()
                grow(target, children)
                stack.append(target)
            else:
                before = op.stack_before
                children = pop_to_mark() if pickletools.markobject in before else []
                for _ in range(len(before) - (2 if pickletools.markobject in before else 0)):
                    children.append(pop())
                pushes = len(op.stack_after)
                if pushes:
                    stack.append(new(children, arg if name in _STRING_OPS and isinstance(arg, str) else None))
    except TooComplex:
        raise
    except UnsafeContent:
        raise
    except (ValueError, IndexError, KeyError, TypeError) as exc:   # genops on a malformed or truncated pickle
        raise pickle.UnpicklingError(f"{what} is not a valid pickle ({type(exc).__name__}: {exc})"[:200]) from None
    return tuple(found)


def regular_files_below(path: Path, limit: int) -> list[Path]:
    """Up to `limit` regular files under `path` (links not followed, two levels: mp_rank_00/), sorted."""
    files: list[Path] = []
    stack = [path]
    while stack and len(files) < limit:
        folder = stack.pop()
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if entry.is_file(follow_symlinks=False):
                        files.append(folder / entry.name)
                    elif entry.is_dir(follow_symlinks=False) and folder == path:
                        stack.append(folder / entry.name)
                    if len(files) >= limit:
                        break
        except OSError:
            continue
    return sorted(files)
