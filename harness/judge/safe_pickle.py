"""Reading a submitted checkpoint's pickles without running anything from them.

torch's ``FileSystemReader.read_metadata`` is a plain ``pickle.load``: a ``.metadata`` whose pickle names
``os.system`` runs a command as the grader. ``load_dcp_metadata`` unpickles with an allowlist instead: the classes
torch.distributed.checkpoint itself writes there (its metadata, planner and filesystem dataclasses and enums),
``torch.Size``, the torch dtypes, torch's layout lookup and pathlib paths; any other global is refused with its
name, before its module is imported. ``safe_reader`` is torch's reader with that metadata reader, for
``dcp.load``, whose tensor data torch reads with ``weights_only=True``. ``safe_torch_load`` reads torch.save files
(common.pt, model_optim_rng.pt) with torch's ``weights_only=True`` allowlist, grown only by vetted
Namespace/enum/numpy globals.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import io
import pickle
import re
from pathlib import Path
from typing import Any

MSG_UNSAFE_CONTENT = ("{path}: refused: unsafe content: its pickle needs {name}, which no checkpoint written by "
                      "torch.distributed.checkpoint needs; the file was not loaded. Re-save the checkpoint with "
                      "Megatron (or torch.distributed.checkpoint) and submit that")
MSG_BAD_SHARD_NAME = ("{path}: refused: unsafe content: it points at shard file {name!r}, which is not a file name "
                      "inside the checkpoint folder; re-save the checkpoint with Megatron and submit that")

# (module, names) that a .metadata written by torch.distributed.checkpoint refers to (torch 2.x).
_DCP_MODULES = {
    "torch.distributed.checkpoint.metadata": None,       # None: any class defined there (dataclasses, enums)
    "torch.distributed.checkpoint.planner": None,
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo", "_StoragePrefix"}),
    "torch.serialization": frozenset({"_get_layout"}),   # layout by name: torch.strided ...
    "torch": frozenset({"Size"}),                        # plus the dtypes, checked by type below
    "collections": frozenset({"OrderedDict"}),
    "pathlib": frozenset({"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}),  # StorageMeta's id
    "builtins": frozenset({"set", "frozenset", "slice"}),
}
MAX_METADATA_BYTES = 256 << 20    # a real one is ~25 KB for the course's model
# Modules whose enum classes / Namespace / numpy RNG state torch.load(weights_only=True) may rebuild (common.pt,
# model_optim_rng.pt).
SAFE_GLOBAL_MODULES = ("argparse", "numpy", "megatron.core")
_UNSUPPORTED_GLOBAL = re.compile(r"unsupported global:? (?:GLOBAL )?([\w.]+)", re.IGNORECASE)  # or "... is blocked"


class UnsafeContent(pickle.UnpicklingError):
    """A pickle global outside the allowlist; `name` is module.qualname as the pickle spelled it."""

    def __init__(self, name: str):
        super().__init__(f"refused: unsafe content: {name}")
        self.name = name


class _AllowlistUnpickler(pickle.Unpickler):
    """find_class only for the DCP metadata classes; the module of a refused name is never imported."""

    def find_class(self, module: str, name: str):
        allowed = _DCP_MODULES.get(module, frozenset())
        if "." in name or name.startswith("__") or (allowed is not None and name not in allowed
                                                    and not (module == "torch" and _is_dtype(name))):
            raise UnsafeContent(f"{module}.{name}")
        obj = super().find_class(module, name)
        if allowed is None and (not isinstance(obj, type) or obj.__module__ != module):
            raise UnsafeContent(f"{module}.{name}")     # a function, or a name imported into that module
        return obj


def _is_dtype(name: str) -> bool:
    """torch.<name> is a torch.dtype (torch.float16, torch.bfloat16 ...)."""
    import torch

    return name.isidentifier() and not name.startswith("_") and isinstance(getattr(torch, name, None), torch.dtype)


def loads_dcp_metadata(data: bytes):
    """Unpickle .metadata bytes with the allowlist; raises UnsafeContent naming the refused global."""
    return _AllowlistUnpickler(io.BytesIO(data)).load()


def load_dcp_metadata(path) -> object:
    """The Metadata object of an iteration folder's .metadata (path: the folder or the file)."""
    path = Path(path)
    file = path / ".metadata" if path.is_dir() else path
    with file.open("rb") as fh:
        data = fh.read(MAX_METADATA_BYTES + 1)
    if len(data) > MAX_METADATA_BYTES:
        raise ValueError(f"{file}: more than {MAX_METADATA_BYTES >> 20} MiB; not a checkpoint's .metadata")
    return loads_dcp_metadata(data)


def bad_shard_names(metadata) -> list[str]:
    """Shard file names in the metadata that are not plain names of files in the checkpoint folder."""
    names = {getattr(info, "relative_path", None) for info in getattr(metadata, "storage_data", {}).values()}
    return sorted(str(n) for n in names if not isinstance(n, str) or not n or "/" in n or "\\" in n
                  or n in (".", "..") or "\0" in n)


def safe_reader(path):
    """torch's FileSystemReader whose read_metadata uses the allowlist (for dcp.load)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            metadata = load_dcp_metadata(Path(str(self.path)))
            bad = bad_shard_names(metadata)
            if bad:
                raise UnsafeContent(f"shard name {bad[0]!r}")
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeFileSystemReader(str(path))


# ---------------------------------------------------------------- torch.save files (common.pt, model_optim_rng.pt)

class _UnsafeGlobal(Exception):
    """A pickle global outside the allowlist; carries its dotted name."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def safe_torch_load(path) -> Any:
    """torch.load(weights_only=True) with an allowlist grown only by Namespace, enums and numpy RNG state."""
    import torch

    allowed: list = [argparse.Namespace]
    for _ in range(64):  # each round admits one more vetted global
        try:
            with torch.serialization.safe_globals(allowed):
                return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            match = _UNSUPPORTED_GLOBAL.search(str(exc))
            if not match:
                raise
            obj = _vetted_global(match.group(1))
            if obj is None or obj in allowed:
                raise _UnsafeGlobal(match.group(1)) from None
            allowed.append(obj)
    raise _UnsafeGlobal("too many globals")


def _vetted_global(dotted: str):
    """Resolve a pickle global if it is argparse.Namespace, an Enum class, or numpy array/dtype rebuilding."""
    module_name, _, attr = dotted.rpartition(".")
    if not any(module_name == m or module_name.startswith(m + ".") for m in SAFE_GLOBAL_MODULES):
        return None
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError):
        return None
    if obj is argparse.Namespace or (isinstance(obj, type) and issubclass(obj, enum.Enum)):
        return obj
    if module_name.split(".")[0] == "numpy" and (attr in {"_reconstruct", "ndarray", "dtype", "scalar"}
                                       or (isinstance(obj, type) and attr.endswith("DType"))):
        return obj
    return None
