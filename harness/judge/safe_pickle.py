"""Reading a submitted checkpoint's pickles without running anything from them, in bounded time and memory.

Every pickle a submission holds (``.metadata``, ``common.pt``, ``model_optim_rng.pt``) goes through two steps:

1. ``scan_pickle``: its opcodes are walked with ``pickletools.genops`` without building anything. The globals it
   names are collected as (module, name) strings and each is checked against a fixed table before anything is
   resolved; the walk also bounds the op count, the memo, the nesting depth and the size of the structure once
   every shared reference is copied (a 412-byte DAG of shared tuples is 2^100 nodes expanded: hashing it as a dict
   key never ends). Any excess is refused (``TooComplex``), before unpickling.
2. ``_TableUnpickler``: ``find_class`` looks the (module, name) pair up in the same table; a pair is resolved only
   from ``sys.modules`` (modules the suite itself imported: torch, argparse, signal ...), never by importing it,
   or is one of the stand-ins here: Megatron-LM's enums and dataclasses rebuilt by value from
   ``megatron_classes.json`` (derived from each release's sources, harness.judge.release_classes), numpy arrays
   and tensors as shape-only records. A name under ``megatron.`` that the table lacks is ``UnknownClass``: this
   suite cannot read that release's checkpoint yet (the grader's limitation, not the student's); any other name is
   ``UnsafeContent``.

``torch.save`` files are zip archives: ``check_torch_zip`` reads the central directory first and refuses
compressed entries (torch writes them stored), overlapping entries and declared sizes that do not fit in the file,
so what is read is bounded by the file's own size. Tensors are rebuilt on the ``meta`` device after checking that
their storage records exist and are long enough: nothing of a submission's declared sizes is allocated.
``safe_reader`` is torch's DCP reader with the vetted metadata reader and shards opened without following links.
"""

from __future__ import annotations

import argparse
import enum
import functools
import io
import json
import math
import os
import pickle
import pickletools
import stat
import sys
import zipfile
from pathlib import Path
from typing import Any

MSG_UNSAFE_CONTENT = ("{path}: refused: unsafe content: its pickle needs {name}, which no checkpoint written by "
                      "torch.distributed.checkpoint needs; the file was not loaded. Re-save the checkpoint with "
                      "Megatron (or torch.distributed.checkpoint) and submit that")
MSG_BAD_SHARD_NAME = ("{path}: refused: unsafe content: it points at shard file {name!r}, which is not a file name "
                      "inside the checkpoint folder; re-save the checkpoint with Megatron and submit that")

MAX_METADATA_BYTES = 64 << 20     # a real .metadata is ~52 KB for the course's model
MAX_PICKLE_BYTES = 64 << 20       # a real common.pt's data.pkl is ~30 KB
MAX_OPS = 300_000                 # a real .metadata is ~22,000 ops; the scan walks ~250,000 ops a second
MAX_EXPANDED = 4_000_000          # nodes of the unpickled structure with every shared reference copied
MAX_DEPTH = 100                   # nesting; a real checkpoint's is < 10
MAX_MEMO_INDEX = 1 << 20          # the C unpickler sizes its memo array by the largest index
MAX_ZIP_ENTRIES = 100_000
MAX_TORCH_FILE_BYTES = 8 << 30    # the course model's model_optim_rng.pt is ~60 MB
# kept for callers that named it; the allowlist is _TABLE now, names are never imported
SAFE_GLOBAL_MODULES = ("argparse", "numpy", "megatron.core")


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


_UnsafeGlobal = UnsafeContent   # the name checkpoints.py used for torch.save files' refusals


# ---------------------------------------------------------------- opening a submission's file

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def open_regular(path, limit: int | None = None, root=None):
    """Open `path` for reading, refusing links and anything fstat does not call a regular file; a binary file.

    With `root` (a folder `path` lies in), every component below `root` is opened relative to its parent's file
    descriptor (dir_fd) with O_NOFOLLOW, so a component swapped for a symlink after a check is refused at open
    time, not read through. Without it only the last component is opened with O_NOFOLLOW. O_NONBLOCK: a FIFO
    planted as a file never blocks the open. `limit`: refuse a larger file (TooComplex)."""
    path = Path(path)
    flags = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
    if root is None:
        fd = os.open(path, flags)
    else:
        parts = path.relative_to(root).parts
        if not parts or any(p in ("..", ".") for p in parts):
            raise OSError(f"{path}: not a file inside {root}")
        dir_fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            for part in parts[:-1]:
                next_fd = os.open(part, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW, dir_fd=dir_fd)
                os.close(dir_fd)
                dir_fd = next_fd
            fd = os.open(parts[-1], flags, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
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


# ---------------------------------------------------------------- step 2: the table and its stand-ins

class _Record:
    """A stand-in instance: keeps the state pickle gives it (BUILD), runs nothing."""

    _fields: frozenset | None = None

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:          # (dict state, slot state)
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            if self._fields is not None and not set(state) <= self._fields:
                extra = sorted(map(str, set(state) - self._fields))[:3]
                raise UnknownClass(f"{type(self).__module__}.{type(self).__qualname__}",
                                   f"fields {extra} are in no release's sources")
            self.__dict__.update(state)
        else:
            self.__dict__["_state"] = state

    def __repr__(self):
        return f"<{type(self).__module__}.{type(self).__qualname__} {self.__dict__!r}>"[:200]


def _record_class(module: str, qual: str, fields=None) -> type:
    cls = type(qual.rpartition(".")[2], (_Record,), {"__module__": module, "__qualname__": qual,
                                                      "_fields": None if fields is None else frozenset(fields)})
    return cls


def _enum_class(module: str, qual: str, kind: str, members: dict) -> type:
    """A real Enum with the release's members and values, named as Megatron names it (never imported)."""
    base = {"IntEnum": enum.IntEnum, "IntFlag": enum.IntFlag, "Flag": enum.Flag}.get(kind, enum.Enum)
    mixin = str if kind == "StrEnum" else None
    if not members:
        return _record_class(module, qual)
    return base(qual.rpartition(".")[2], list(members.items()), module=module, qualname=qual,
                **({"type": mixin} if mixin else {}))


class _ArrayStub(_Record):
    """A numpy array (a numpy RNG state in model_optim_rng.pt), kept as its pickled state, never built."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)


def _array_reconstruct(*args):
    return _ArrayStub()


class _DtypeStub(_Record):
    def __new__(cls, *args, **kwargs):
        self = object.__new__(cls)
        self.__dict__["args"] = args[:4]
        return self


class _StorageStub:
    """A storage a tensor points into: its record in the archive, dtype and element count (data not read)."""

    def __init__(self, key: str, dtype, numel: int):
        self.key, self.dtype, self.numel = key, dtype, numel


def _storage_dtype(storage_type):
    import torch

    return storage_type if isinstance(storage_type, torch.dtype) else None


def _rebuild_tensor(storage, storage_offset, size, stride, *rest):
    """torch._utils._rebuild_tensor_v2's stand-in: a tensor on the meta device of the declared shape, after checking
    that the view stays inside its storage (nothing is allocated)."""
    import torch

    if not isinstance(storage, _StorageStub):
        raise pickle.UnpicklingError("a tensor without a storage record")
    ints = (tuple(size) if isinstance(size, (tuple, list, torch.Size)) else None,
            tuple(stride) if isinstance(stride, (tuple, list)) else None)
    if ints[0] is None or ints[1] is None or len(ints[0]) != len(ints[1]) or len(ints[0]) > 64 \
            or not all(isinstance(v, int) and v >= 0 for v in (*ints[0], *ints[1], storage_offset)):
        raise pickle.UnpicklingError("a tensor with a malformed size or stride")
    extent = 0 if 0 in ints[0] else storage_offset + 1 + sum((n - 1) * s for n, s in zip(*ints))
    if extent > storage.numel:
        raise pickle.UnpicklingError(f"a tensor of shape {ints[0]} reaches element {extent} of a storage of "
                                     f"{storage.numel}")
    return torch.empty(ints[0], dtype=storage.dtype, device="meta")


def _torch_names() -> dict:
    """torch's own (module, name) pairs that checkpoints pickle: dtypes, storage types, Size, layouts."""
    import torch

    table: dict = {("torch", name): ("sys", "torch", name) for name in dir(torch)
                   if not name.startswith("_") and isinstance(getattr(torch, name, None), torch.dtype)}
    storage_dtypes = {"Float": torch.float32, "Half": torch.float16, "BFloat16": torch.bfloat16,
                      "Double": torch.float64, "Long": torch.int64, "Int": torch.int32, "Short": torch.int16,
                      "Char": torch.int8, "Byte": torch.uint8, "Bool": torch.bool}
    for name, dtype in storage_dtypes.items():   # a storage type stands for its dtype (TypedStorage is deprecated)
        table[("torch", f"{name}Storage")] = ("stand-in", dtype)
    table[("torch", "Size")] = ("sys", "torch", "Size")
    table[("torch.serialization", "_get_layout")] = ("sys", "torch.serialization", "_get_layout")
    table[("torch._utils", "_rebuild_tensor_v2")] = ("stand-in", _rebuild_tensor)
    return table


_DCP = {
    "torch.distributed.checkpoint.metadata": ("BytesStorageMetadata", "ChunkStorageMetadata", "Metadata",
                                              "MetadataIndex", "StorageMeta", "TensorProperties",
                                              "TensorStorageMetadata", "_MEM_FORMAT_ENCODING"),
    # megatron-core's save may keep its plans in the metadata (seen on CPU saves): plain dataclasses and enums
    "torch.distributed.checkpoint.planner": ("BytesIOWriteData", "LoadItemType", "LoadPlan", "ReadItem", "SavePlan",
                                             "TensorWriteData", "WriteItem", "WriteItemType"),
    "torch.distributed.checkpoint.filesystem": ("_StorageInfo", "_StoragePrefix"),
}
_STDLIB = {
    ("collections", "OrderedDict"), ("argparse", "Namespace"), ("signal", "Signals"), ("builtins", "set"),
    ("builtins", "frozenset"), ("builtins", "slice"), ("builtins", "complex"), ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
    ("datetime", "datetime"), ("datetime", "timedelta"),
}
def _latin1_encode(text, encoding="latin1", errors="strict"):
    """_codecs.encode's stand-in: protocol 2 pickles bytes as encode(str, 'latin1'); nothing else is accepted."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1") or errors != "strict":
        raise pickle.UnpicklingError("_codecs.encode outside the bytes-as-latin1 form pickle protocol 2 writes")
    return text.encode("latin1")


_NUMPY = {("_codecs", "encode"): ("stand-in", _latin1_encode),("numpy.core.multiarray", "_reconstruct"): ("stand-in", _array_reconstruct),
          ("numpy._core.multiarray", "_reconstruct"): ("stand-in", _array_reconstruct),
          ("numpy", "ndarray"): ("stand-in", _ArrayStub), ("numpy", "dtype"): ("stand-in", _DtypeStub),
          ("numpy.core.multiarray", "scalar"): ("stand-in", _DtypeStub),
          ("numpy._core.multiarray", "scalar"): ("stand-in", _DtypeStub)}


@functools.lru_cache(maxsize=1)
def megatron_table() -> dict:
    """(module, qualname) -> stand-in for every enum and dataclass of the releases in megatron_classes.json."""
    from harness.judge.release_classes import load_table

    table = load_table()
    out: dict = {}
    for dotted, info in table["enums"].items():
        module, qual = _split_known(dotted, table)
        out[(module, qual)] = _enum_class(module, qual, info["kind"], info["members"])
    for dotted, info in table["dataclasses"].items():
        module, qual = _split_known(dotted, table)
        out.setdefault((module, qual), _record_class(module, qual, info["fields"]))
    return out


def _split_known(dotted: str, table: dict) -> tuple[str, str]:
    """megatron.core.x.Outer.Inner -> (megatron.core.x, Outer.Inner): the module is the longest dotted prefix
    that is a module path of the table's sources (classes start with a capital or underscore by convention)."""
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        if parts[i][:1].isupper() or parts[i][:1] == "_" and parts[i][1:2].isupper():
            return ".".join(parts[:i]), ".".join(parts[i:])
    return ".".join(parts[:-1]), parts[-1]


def releases_read() -> str:
    """The refs megatron_classes.json was derived from, for messages."""
    from harness.judge.release_classes import load_table

    return ", ".join(load_table()["derived_from"])


@functools.lru_cache(maxsize=1)
def _table() -> dict:
    table: dict = dict(_torch_names())
    for module, names in _DCP.items():
        for name in names:
            table[(module, name)] = ("sys", module, name)
    for module, name in _STDLIB:
        table[(module, name)] = ("sys", module, name)
    table.update(_NUMPY)
    for key, cls in megatron_table().items():
        table[key] = ("stand-in", cls)
    return table


def vet_globals(names, allowed_prefixes=None) -> None:
    """Every (module, name) is in the table (as strings, nothing resolved); UnknownClass for a Megatron name the
    table lacks, UnsafeContent for any other. `allowed_prefixes` narrows the table (the .metadata readers)."""
    table = _table()
    for module, name in names:
        key = (module, name)
        if key in table and (allowed_prefixes is None or module.startswith(allowed_prefixes)):
            continue
        if module == "megatron" or module.startswith("megatron."):
            raise UnknownClass(f"{module}.{name}")
        raise UnsafeContent(f"{module}.{name}")


def _resolve(module: str, name: str):
    """The object for a vetted pair: from sys.modules (never imported here) or a stand-in."""
    entry = _table().get((module, name))
    if entry is None:
        raise UnsafeContent(f"{module}.{name}")
    if entry[0] == "stand-in":
        return entry[1]
    _, mod_name, attr = entry
    mod = sys.modules.get(mod_name)
    if mod is None:    # the suite did not import it: never imported for a pickle's sake
        raise UnsafeContent(f"{module}.{name} (module not loaded by the suite)")
    return getattr(mod, attr)


class _TableUnpickler(pickle.Unpickler):
    """find_class only through the table; persistent ids only for torch.save storage records."""

    def __init__(self, file, storages: dict | None = None, allowed_prefixes=None):
        super().__init__(file)
        self._storages = storages
        self._prefixes = allowed_prefixes

    def find_class(self, module: str, name: str):
        vet_globals([(module, name)], self._prefixes)
        return _resolve(module, name)

    def persistent_load(self, pid):
        if self._storages is None or not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"unsupported persistent id {str(pid)[:80]}")
        _, storage_type, key, _location, numel = pid
        dtype = _storage_dtype(storage_type)
        if dtype is None or not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
            raise pickle.UnpicklingError("a malformed storage record")
        record = self._storages.get(key)
        if record is None:
            raise pickle.UnpicklingError(f"storage record data/{key} is missing from the archive")
        if record < numel * dtype.itemsize:
            raise pickle.UnpicklingError(f"storage record data/{key} holds {record} bytes, its tensor needs "
                                         f"{numel * dtype.itemsize}")
        return _StorageStub(key, dtype, numel)


def loads_vetted(data: bytes, what: str = "pickle", storages: dict | None = None, allowed_prefixes=None):
    """Scan, vet every global as a string, then unpickle through the table."""
    vet_globals(scan_pickle(data, what), allowed_prefixes)
    return _TableUnpickler(io.BytesIO(data), storages, allowed_prefixes).load()


# ---------------------------------------------------------------- .metadata (torch.distributed.checkpoint)

_DCP_PREFIXES = ("torch", "collections", "pathlib", "builtins")


def loads_dcp_metadata(data: bytes):
    """Unpickle .metadata bytes through the scan and the table (torch's and the stdlib's names only)."""
    import torch.distributed.checkpoint.filesystem  # noqa: F401 - the suite's own import: its classes resolve
    import torch.distributed.checkpoint.metadata  # noqa: F401
    import torch.distributed.checkpoint.planner  # noqa: F401

    return loads_vetted(data, ".metadata", None, _DCP_PREFIXES)


def load_dcp_metadata(path, root=None) -> object:
    """The Metadata object of an iteration folder's .metadata (path: the folder or the file; root: see
    open_regular)."""
    path = Path(path)
    file = path / ".metadata" if path.is_dir() else path
    return loads_dcp_metadata(read_bounded(file, MAX_METADATA_BYTES, root))


def bad_shard_names(metadata) -> list[str]:
    """Shard file names in the metadata that are not plain names of files in the checkpoint folder."""
    names = {getattr(info, "relative_path", None) for info in getattr(metadata, "storage_data", {}).values()}
    return sorted(str(n) for n in names if not isinstance(n, str) or not n or "/" in n or "\\" in n
                  or n in (".", "..") or "\0" in n)


def safe_reader(path, root=None):
    """torch's FileSystemReader whose read_metadata uses the table and whose shards are opened without following
    links (for dcp.load)."""
    import contextlib

    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.filesystem import FileSystem
    from torch.distributed.checkpoint.metadata import StorageMeta

    class NoFollowFileSystem(FileSystem):
        @contextlib.contextmanager
        def create_stream(self, path, mode):
            if "r" not in mode or "+" in mode:
                raise OSError(f"{path}: the checkpoint inspector only reads")
            with open_regular(path, None, root) as stream:
                yield stream

    class SafeFileSystemReader(FileSystemReader):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.fs = NoFollowFileSystem()

        def read_metadata(self, *args, **kwargs):
            metadata = load_dcp_metadata(Path(str(self.path)), root)
            bad = bad_shard_names(metadata)
            if bad:
                raise UnsafeContent(f"shard name {bad[0]!r}")
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeFileSystemReader(str(path))


# ---------------------------------------------------------------- torch.save files (common.pt, model_optim_rng.pt)

def check_torch_zip(zf: zipfile.ZipFile, file_size: int) -> tuple[str, dict[str, int]]:
    """The archive's data.pkl name and {storage key: bytes}, from the central directory; TooComplex for compressed
    entries, entries that overlap or pass the central directory, or more entries than a bound."""
    infos = zf.infolist()
    if len(infos) > MAX_ZIP_ENTRIES:
        raise TooComplex(f"the archive has {len(infos):,} entries, more than {MAX_ZIP_ENTRIES:,}")
    end = getattr(zf, "start_dir", file_size)
    spans = []
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED:
            raise TooComplex(f"entry {info.filename[:80]!r} is compressed; torch.save writes every entry stored "
                             "(a compressed entry inflates to sizes its file does not show)")
        if info.file_size != info.compress_size:
            raise TooComplex(f"entry {info.filename[:80]!r} declares {info.file_size} bytes but stores "
                             f"{info.compress_size}")
        start = info.header_offset
        spans.append((start, start + 30 + len(info.filename.encode("utf-8", "surrogateescape")) + info.compress_size,
                      info.filename))
    spans.sort()
    previous = 0
    for start, stop, name in spans:
        if start < previous or stop > end:
            raise TooComplex(f"entry {name[:80]!r} overlaps another entry or the directory (bytes {start}-{stop}); "
                             "torch.save writes each entry once")
        previous = stop
    pickles = [i.filename for i in infos if i.filename.endswith("/data.pkl") and i.filename.count("/") == 1]
    if len(pickles) != 1:
        raise pickle.UnpicklingError(f"not a torch.save archive ({len(pickles)} data.pkl entries)")
    prefix = pickles[0][: -len("data.pkl")] + "data/"
    storages = {i.filename[len(prefix):]: i.file_size for i in infos if i.filename.startswith(prefix)}
    return pickles[0], storages


def safe_torch_load(path, root=None) -> Any:
    """A torch.save file's object, with tensors on the meta device (shapes and dtypes; storages checked present and
    long enough, their data not read), through the central-directory check, the scan and the table."""
    import torch  # noqa: F401 - the suite's own import: torch's dtypes and storage types resolve

    with open_regular(path, MAX_TORCH_FILE_BYTES, root) as fh:
        file_size = os.fstat(fh.fileno()).st_size
        try:
            zf = zipfile.ZipFile(fh)
        except zipfile.BadZipFile:
            raise pickle.UnpicklingError("not a zip archive (torch.save's format since torch 1.6)") from None
        with zf:
            name, storages = check_torch_zip(zf, file_size)
            info = zf.getinfo(name)
            if info.file_size > MAX_PICKLE_BYTES:
                raise TooComplex(f"{name} is {info.file_size} bytes, more than {MAX_PICKLE_BYTES >> 20} MiB")
            data = zf.read(name)
    return loads_vetted(data, Path(str(path)).name, storages)


def storage_crc_ok(path, root=None) -> str | None:
    """Read every entry of a torch.save archive in 1 MiB chunks, checking its CRC; the first bad entry's name (or
    None). Bounded by the file's size: the entries are stored, checked by check_torch_zip."""
    with open_regular(path, MAX_TORCH_FILE_BYTES, root) as fh, zipfile.ZipFile(fh) as zf:
        check_torch_zip(zf, os.fstat(fh.fileno()).st_size)
        for info in zf.infolist():
            try:
                with zf.open(info) as entry:
                    while entry.read(1 << 20):
                        pass
            except zipfile.BadZipFile:
                return info.filename
    return None
