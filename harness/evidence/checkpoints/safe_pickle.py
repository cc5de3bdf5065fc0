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
   ``megatron_classes.json`` (derived from each release's sources, harness.evidence.checkpoints.release_classes), numpy arrays
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

import enum
import functools
import io
import os
import pickle
import sys
import zipfile
from pathlib import Path
from typing import Any

from harness.evidence.checkpoints.pickle_scan import (MAX_PICKLE_BYTES, TooComplex, UnknownClass, UnsafeContent, open_regular,
                                      read_bounded, scan_pickle)

MSG_UNSAFE_CONTENT = ("{path}: refused: unsafe content: its pickle needs {name}, which no checkpoint written by "
                      "torch.distributed.checkpoint needs; the file was not loaded. Re-save the checkpoint with "
                      "Megatron (or torch.distributed.checkpoint) and submit that")
MSG_BAD_SHARD_NAME = ("{path}: refused: unsafe content: it points at shard file {name!r}, which is not a file name "
                      "inside the checkpoint folder; re-save the checkpoint with Megatron and submit that")

MAX_METADATA_BYTES = 64 << 20     # a real .metadata is ~52 KB for the course's model
MAX_ZIP_ENTRIES = 100_000
MAX_TORCH_FILE_BYTES = 8 << 30    # the course model's model_optim_rng.pt is ~60 MB
# kept for callers that named it; the allowlist is _TABLE now, names are never imported
SAFE_GLOBAL_MODULES = ("argparse", "numpy", "megatron.core")


_UnsafeGlobal = UnsafeContent   # the name checkpoints.py used for torch.save files' refusals


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
    from harness.evidence.checkpoints.release_classes import load_table

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
    from harness.evidence.checkpoints.release_classes import load_table

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

def check_directory_size(fh, file_size: int) -> None:
    """From the end-of-central-directory record (and its zip64 twin), before zipfile parses any entry: at most
    MAX_ZIP_ENTRIES entries and a directory that fits in the file (zipfile builds an object per entry: millions of
    46-byte entries would take gigabytes)."""
    import struct

    tail_len = min(file_size, 65_557)
    fh.seek(file_size - tail_len)
    tail = fh.read(tail_len)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < 22:
        raise pickle.UnpicklingError("not a zip archive (torch.save's format since torch 1.6)")
    entries, size = struct.unpack_from("<HL", tail, at + 10)
    if (entries == 0xFFFF or size == 0xFFFFFFFF) and at >= 20 and tail[at - 20:at - 16] == b"PK\x06\x07":
        record = struct.unpack_from("<Q", tail, at - 12)[0]
        if record + 56 > file_size:
            raise TooComplex("the zip64 directory record lies outside the file")
        fh.seek(record)
        head = fh.read(56)
        if head[:4] != b"PK\x06\x06":
            raise pickle.UnpicklingError("a zip64 archive without its directory record")
        entries, size = struct.unpack_from("<QQ", head, 32)
    if entries > MAX_ZIP_ENTRIES or size > file_size:
        raise TooComplex(f"the archive declares {entries:,} entries in a {size:,}-byte directory (at most "
                         f"{MAX_ZIP_ENTRIES:,} entries, inside the file's {file_size:,} bytes)")
    fh.seek(0)


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
        check_directory_size(fh, file_size)
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
    with open_regular(path, MAX_TORCH_FILE_BYTES, root) as fh:
        check_directory_size(fh, os.fstat(fh.fileno()).st_size)
        zf = zipfile.ZipFile(fh)
        check_torch_zip(zf, os.fstat(fh.fileno()).st_size)
        for info in zf.infolist():
            try:
                with zf.open(info) as entry:
                    while entry.read(1 << 20):
                        pass
            except zipfile.BadZipFile:
                return info.filename
    return None
