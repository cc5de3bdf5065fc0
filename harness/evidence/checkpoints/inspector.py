"""Checkpoint inspector: validates a Megatron ``--save`` directory on CPU and fills ``CheckpointReport``.

Layout: ``iter_NNNNNNN/`` directories plus ``latest_checkpointed_iteration.txt`` (an iteration or
``release``), which Megatron writes after a save finished. Formats:

- ``torch_dist``: ``metadata.json`` (``sharded_backend``), ``.metadata``, ``*.distcp`` and, at
  core_v0.16.1, ``common.pt``. Tensors are keyed by their ShardedTensor key, independent of the
  nesting under ``model``: per-layer weights are stacked over layers, e.g.
  ``encoder.layers.self_attention.linear_qkv.weight`` with shape ``(num_layers, 3h, h)``.
  Read with torch's own ``torch.distributed.checkpoint`` reader in no-process-group mode, except ``.metadata``:
  torch unpickles it with plain ``pickle.load``, so it is read with an allowlist (harness.evidence.checkpoints.safe_pickle).
- ``torch``: ``mp_rank_00/model_optim_rng.pt`` (``mp_rank_00_000`` with PP), a pickled dict whose
  ``model`` entry is a plain per-layer state dict. Read, as ``common.pt``, by harness.evidence.checkpoints.safe_pickle's vetted
  reader (tensors as shapes; the data read back with its CRC checked), never ``torch.load``.

Expected names and shapes come from building megatron-core's BertModel (local spec) on CPU.
Nothing here raises to the caller: every failure becomes a problem string naming the file and a fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from harness.base.paths import links_leaving, write_text_atomic
from harness.evidence.checkpoints.texts import (MSG_NO_SAVE_DIR, MSG_NO_ITERATIONS, MSG_NO_TRACKER,
    MSG_TRACKER_NOT_A_FILE, MSG_BAD_TRACKER, MSG_TRACKER_DANGLING, MSG_TRACKER_BEHIND, MSG_LINK_LEAVES,
    MSG_NO_SUCH_ITERATION, MSG_EMPTY_DIR, MSG_UNKNOWN_FORMAT, MSG_MISSING_FILE, MSG_UNREADABLE, MSG_TRUNCATED,
    MSG_UNSAFE_PICKLE, MSG_TOO_COMPLEX, MSG_SUITE_CANNOT_READ, MSG_MORE_PROBLEMS, MSG_MORE_ITER_DIRS,
    MSG_STORAGE_CORRUPT, MSG_NO_MODEL_KEY, MSG_PARALLEL_RANKS, MSG_MISSING_TENSOR, MSG_UNEXPECTED_TENSOR,
    MSG_WRONG_SHAPE, MSG_MORE_MISMATCHES, MSG_LOAD_FAILED, MSG_NO_EXPECTED, MSG_INTERNAL, MSG_OVER_BUDGET,
    _short, _unwrap)  # noqa: F401
from harness.evidence.records import CheckpointReport
# the model's shapes live in harness.evidence.checkpoints.model_shapes; importable from here too
from harness.evidence.checkpoints.model_shapes import (  # noqa: F401
    COURSE_MODEL, ModelShape, _is_extra_state, _local_name,
    course_model, expected_model_shapes, expected_sharded_shapes, model_from_args)
from harness.evidence.checkpoints.safe_pickle import (MSG_BAD_SHARD_NAME, MSG_UNSAFE_CONTENT, bad_shard_names, load_dcp_metadata, releases_read, safe_reader, safe_torch_load, storage_crc_ok)
from harness.evidence.checkpoints.pickle_scan import (TooComplex, UnknownClass, UnsafeContent, open_regular, regular_files_below)

TRACKER_FILE = "latest_checkpointed_iteration.txt"
TORCH_FILE = "model_optim_rng.pt"
ITER_DIR = re.compile(r"^iter_([0-9]{7})$", re.ASCII)    # ASCII digits only: iter_٠٠٠٠٠٠٥ is not iteration 5
RANK_DIR = re.compile(r"^mp_rank_[0-9]{2}(_[0-9]{3})?$", re.ASCII)
TRACKER_NUMBER = re.compile(r"[ \t\r\n]*([0-9]+)[ \t\r\n]*", re.ASCII)  # Megatron writes str(iteration)
OPTIMIZER_PREFIX = "optimizer."
REFUSED = "refused: unsafe content"  # in every problem about a file that was not read because of what it holds
MAX_LISTED = 12  # per kind of tensor mismatch; the rest is summarised in one line
MAX_PROBLEMS = 40  # in a report; the rest counted in one line (100,000 empty iter_ folders made a 32 MB grade)
MAX_ITER_DIRS = 2000  # iteration folders whose files are checked; a real --save folder has a few


@dataclass
class _Findings:
    """Mutable accumulator behind one CheckpointReport, plus informational notes."""

    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    iterations: tuple[int, ...] = ()
    tracker: int | None = None
    format: str | None = None
    loaded: bool = False
    shapes_ok: bool = False
    num_parameters: int = 0
    unreadable: str = ""
    root: Path | None = None      # the --save folder every file is opened relative to (no link followed)


# ---------------------------------------------------------------- public entry points

def inspect_save_dir(save_dir, shape: ModelShape | None = COURSE_MODEL, iteration: int | None = None,
                     load: bool = True) -> CheckpointReport:
    """Validate ``save_dir`` and load the chosen (default: tracker's, else newest) iteration on CPU.

    shape: the run's model (its recipe variant's); None: the dimensions common.pt's saved arguments hold, else the
    course's."""
    return inspect_with_notes(save_dir, shape, iteration, load)[0]


def inspect_with_notes(save_dir, shape: ModelShape | None = COURSE_MODEL, iteration: int | None = None,
                       load: bool = True) -> tuple[CheckpointReport, tuple[str, ...]]:
    """Like inspect_save_dir, plus informational notes (optimizer state, common.pt, chosen iteration)."""
    root = Path(save_dir)
    found = _Findings(root=root)
    try:
        _inspect(root, shape, iteration, load, found)
    except MemoryError:   # the inspector's budget, not the submission's content: never a problem of the student's
        raise
    except Exception as exc:  # noqa: BLE001 - the report must never raise; the problem names the error
        found.problems.append(MSG_INTERNAL.format(path=root, error=_short(exc)))
        found.loaded = False
    problems = sorted(found.problems, key=lambda p: REFUSED not in p)  # a refusal first: it is the verdict
    if len(problems) > MAX_PROBLEMS:
        problems = problems[:MAX_PROBLEMS - 1] + [MSG_MORE_PROBLEMS.format(count=len(problems) - MAX_PROBLEMS + 1)]
    notes = found.notes if len(found.notes) <= MAX_PROBLEMS else \
        found.notes[:MAX_PROBLEMS - 1] + [f"... and {len(found.notes) - MAX_PROBLEMS + 1:,} more notes"]
    report = CheckpointReport(save_dir=str(root), iterations=found.iterations, tracker=found.tracker,
                              format=found.format, loaded=found.loaded, shapes_ok=found.shapes_ok,
                              num_parameters=found.num_parameters, problems=tuple(problems),
                              unreadable=found.unreadable)
    return report, tuple(notes)


# ---------------------------------------------------------------- layout and tracker

def _inspect(root: Path, shape: ModelShape, iteration: int | None, load: bool, found: _Findings) -> None:
    """Walk layout -> tracker -> every iteration's files -> the chosen iteration's tensors."""
    if not root.is_dir():
        found.problems.append(MSG_NO_SAVE_DIR.format(path=root))
        return
    leaving = links_leaving(root, limit=1)
    if leaving:
        found.problems.append(MSG_LINK_LEAVES.format(path=leaving[0][0], target=leaving[0][1], root=root))
        return
    dirs = _iteration_dirs(root)
    found.iterations = tuple(sorted(k for k in dirs if isinstance(k, int)))
    if not dirs:
        found.problems.append(MSG_NO_ITERATIONS.format(path=root))
        return
    tracker = _check_tracker(root, dirs, found)
    chosen = _choose(root, dirs, tracker, iteration, found)
    checked = list(dirs)[:MAX_ITER_DIRS]
    if len(dirs) > MAX_ITER_DIRS:
        found.problems.append(MSG_MORE_ITER_DIRS.format(path=root, count=len(dirs), checked=MAX_ITER_DIRS))
    if chosen is not None and chosen not in checked:
        checked.append(chosen)
    formats = {key: _check_layout(dirs[key], found) for key in checked}
    if chosen is None:
        return
    if any(REFUSED in p for p in found.problems):
        found.notes.append(f"{root}: not loaded: a file in it was refused as unsafe content")
        return
    if found.unreadable:
        found.notes.append(f"{root}: not loaded: {found.unreadable}")
        return
    found.format = formats[chosen]
    found.notes.append(f"inspected {dirs[chosen]} ({found.format or 'unknown format'})")
    if shape is None:
        shape = _shape_from_common(dirs[chosen], found)
    if found.format == "torch_dist":
        _inspect_torch_dist(dirs[chosen], shape, load, found)
    elif found.format == "torch":
        _inspect_torch(dirs[chosen], shape, load, found)


def _iteration_dirs(root: Path) -> dict[int | str, Path]:
    """iter_NNNNNNN directories by iteration, plus ``release`` when present."""
    dirs: dict[int | str, Path] = {}
    with os.scandir(root) as entries:
        for entry in entries:
            match = ITER_DIR.match(entry.name)
            if match and entry.is_dir(follow_symlinks=False):
                dirs[int(match.group(1))] = root / entry.name
    if (root / "release").is_dir() and not (root / "release").is_symlink():
        dirs["release"] = root / "release"
    return dict(sorted(dirs.items(), key=lambda kv: (isinstance(kv[0], str), kv[0])))


def _read_text(path: Path, root: Path | None, limit: int) -> str:
    """At most `limit` bytes of a small text file of the submission, opened without following links."""
    with open_regular(path, None, root) as fh:
        return fh.read(limit).decode("utf-8", "replace")


def _parse_tracker(content: str) -> int | str | None:
    """The tracker's iteration (ASCII digits, surrounding whitespace as Megatron's int(f.read().strip()) allows),
    'release', or None."""
    if content.strip(" \t\r\n") == "release":
        return "release"
    match = TRACKER_NUMBER.fullmatch(content)
    return int(match.group(1)) if match else None


def tracker_iteration(save_dir) -> int | None:
    """The iteration a --save directory's tracker names; None while there is none (or no number in it)."""
    try:
        value = _parse_tracker(_read_text(Path(save_dir) / TRACKER_FILE, Path(save_dir), 4096))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, int) else None


def failed_marker(save_dir) -> Path:
    """`SAVE_DIR.failed`: written (one line, the reason) by the session when the run saving to SAVE_DIR ended
    without the checkpoint another run waits for (--wait-for-load)."""
    return Path(f"{Path(save_dir)}.failed")


def _check_tracker(root: Path, dirs: dict, found: _Findings) -> int | str | None:
    """Read latest_checkpointed_iteration.txt and check it names a saved, newest iteration."""
    path = root / TRACKER_FILE
    if not path.is_file() or path.is_symlink():
        there = path.exists() or path.is_symlink()   # never opened: a pipe would block the read
        found.problems.append((MSG_TRACKER_NOT_A_FILE if there else MSG_NO_TRACKER).format(path=path))
        return None
    try:
        raw = _read_text(path, root, 4096)  # a tracker holds a number; a submitted one may hold anything
    except OSError:   # swapped for a link or a pipe after the check above: refused at open time
        found.problems.append(MSG_TRACKER_NOT_A_FILE.format(path=path))
        return None
    content = raw.strip()
    value = _parse_tracker(raw)
    if value == "release":
        if "release" not in dirs:
            found.problems.append(MSG_TRACKER_DANGLING.format(path=path, iteration="release", missing=root / "release"))
            return None
        return "release"
    if value is None:
        found.problems.append(MSG_BAD_TRACKER.format(path=path, content=content[:40]))
        return None
    found.tracker = value
    if found.tracker not in dirs:
        missing = root / f"iter_{found.tracker:07d}"
        found.problems.append(MSG_TRACKER_DANGLING.format(path=path, iteration=found.tracker, missing=missing))
        return None
    newer = [dirs[k].name for k in found.iterations if k > found.tracker]
    if newer:
        found.problems.append(MSG_TRACKER_BEHIND.format(path=path, tracker=found.tracker, newer=", ".join(newer)))
    return found.tracker


def _choose(root: Path, dirs: dict, tracker, iteration: int | None, found: _Findings):
    """The iteration to load: the requested one, else the tracker's, else the newest directory."""
    if iteration is not None:
        if iteration not in dirs:
            saved = ", ".join(str(k) for k in found.iterations) or "none"
            found.problems.append(MSG_NO_SUCH_ITERATION.format(path=root, iteration=iteration, saved=saved))
            return None
        return iteration
    if tracker is not None:
        return tracker
    return found.iterations[-1] if found.iterations else "release"


def _check_layout(path: Path, found: _Findings) -> str | None:
    """Detect the format of one iteration directory and check its files exist and are not empty."""
    files = regular_files_below(path, 64)
    if not files:
        found.problems.append(MSG_EMPTY_DIR.format(path=path))
        return None
    fmt = _detect_format(path, found)
    if fmt == "torch_dist":
        _check_torch_dist_files(path, found)
    elif fmt == "torch":
        _check_torch_files(path, found)
    else:
        listing = ", ".join(str(p.relative_to(path)) for p in files[:8])
        found.problems.append(MSG_UNKNOWN_FORMAT.format(path=path, found=listing))
    return fmt


def _detect_format(path: Path, found: _Findings) -> str | None:
    """metadata.json's sharded_backend when readable, else the files present."""
    meta = path / "metadata.json"
    if meta.is_file():
        try:
            backend = json.loads(_read_text(meta, found.root, 1 << 20)).get("sharded_backend")  # real: ~120 bytes
            if backend:
                return str(backend)
        except (ValueError, AttributeError, OSError) as exc:
            found.problems.append(MSG_UNREADABLE.format(path=meta, error=_short(exc)))
    if (path / ".metadata").exists() or any(path.glob("*.distcp")):
        return "torch_dist"
    if _rank_dirs(path):
        return "torch"
    return None


def _rank_dirs(path: Path) -> list[Path]:
    """mp_rank_XX (TP) or mp_rank_XX_YYY (TP+PP) directories of a torch-format checkpoint."""
    with os.scandir(path) as entries:
        return sorted(path / e.name for e in entries if e.is_dir(follow_symlinks=False) and RANK_DIR.match(e.name))


# ---------------------------------------------------------------- torch_dist

def _check_torch_dist_files(path: Path, found: _Findings) -> None:
    """metadata.json, .metadata and shards present; shards as long as .metadata says."""
    for name in ("metadata.json", ".metadata"):
        if not (path / name).is_file():
            found.problems.append(MSG_MISSING_FILE.format(path=path / name))
    if not any(path.glob("*.distcp")):
        found.problems.append(MSG_MISSING_FILE.format(path=path / "*.distcp"))
    metadata = _read_dcp_metadata(path, found)
    if metadata is not None:
        _check_shard_sizes(path, metadata, found)
    common = path / "common.pt"
    if common.exists():
        _load_pickled_dict(common, found)


def _read_dcp_metadata(path: Path, found: _Findings | None):
    """Parse .metadata with the allowlisting unpickler (no tensor data read); None and a problem if it fails."""
    if not (path / ".metadata").is_file():
        return None
    try:
        metadata = load_dcp_metadata(path, found.root if found is not None else None)
        bad = bad_shard_names(metadata)
    except UnsafeContent as exc:
        if found is not None:
            found.problems.append(MSG_UNSAFE_CONTENT.format(path=path / ".metadata", name=exc.name))
        return None
    except TooComplex as exc:
        if found is not None:
            found.problems.append(MSG_TOO_COMPLEX.format(path=path / ".metadata", reason=exc.reason))
        return None
    except UnknownClass as exc:
        if found is not None:
            _cannot_read(path / ".metadata", exc, found)
        return None
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - any parse error means a corrupt file
        if found is not None:
            found.problems.append(MSG_UNREADABLE.format(path=path / ".metadata", error=_short(exc)))
        return None
    if bad:
        if found is not None:
            found.problems.append(MSG_BAD_SHARD_NAME.format(path=path / ".metadata", name=bad[0]))
        return None
    return metadata


def _check_shard_sizes(path: Path, metadata, found: _Findings) -> None:
    """Every shard file that .metadata points into must exist and be at least as long as its last item."""
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, size_needed in sorted(needed.items()):
        shard = path / name
        try:
            with open_regular(shard, None, found.root) as fh:   # what is measured is what would be read
                size = os.fstat(fh.fileno()).st_size
        except OSError:
            found.problems.append(MSG_MISSING_FILE.format(path=shard))
            continue
        if size < size_needed:
            found.problems.append(MSG_TRUNCATED.format(path=shard, size=size, needed=size_needed))


def _load_pickled_dict(path: Path, found: _Findings) -> dict | None:
    """Load a torch.save file (common.pt, model_optim_rng.pt) safely; a problem when it is empty or corrupt."""
    try:
        common = safe_torch_load(path, found.root)
    except UnsafeContent as exc:
        found.problems.append(MSG_UNSAFE_PICKLE.format(path=path, name=exc.name))
        return None
    except TooComplex as exc:
        found.problems.append(MSG_TOO_COMPLEX.format(path=path, reason=exc.reason))
        return None
    except UnknownClass as exc:
        _cannot_read(path, exc, found)
        return None
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - EOFError, zip errors, unpickling errors: all corruption
        found.problems.append(MSG_UNREADABLE.format(path=path, error=_short(exc)))
        return None
    return common if isinstance(common, dict) else None


def _cannot_read(path: Path, exc: UnknownClass, found: _Findings) -> None:
    """The suite's limitation: recorded as unreadable (not judged), never as the student's problem."""
    why = f" ({exc.why})" if exc.why else ""
    found.unreadable = found.unreadable or MSG_SUITE_CANNOT_READ.format(path=path, name=exc.name, why=why,
                                                                        releases=releases_read())


def _shape_from_common(path: Path, found: _Findings) -> ModelShape:
    """The model common.pt's (or model_optim_rng.pt's) saved arguments describe; the course's without them."""
    ranks = [] if (path / "common.pt").exists() else _rank_dirs(path)
    target = path / "common.pt" if not ranks else ranks[0] / TORCH_FILE
    if not target.exists():
        return COURSE_MODEL
    try:
        state = safe_torch_load(target, found.root)
    except Exception:  # noqa: BLE001 - reported when the file itself is judged
        return COURSE_MODEL
    args = state.get("args") if isinstance(state, dict) else None
    shape = model_from_args(args) if isinstance(args, argparse.Namespace) else COURSE_MODEL
    found.notes.append(f"{target}: model dimensions from its saved arguments: {shape.flags()}")
    return shape


def _inspect_torch_dist(path: Path, shape: ModelShape, load: bool, found: _Findings) -> None:
    """Shapes from .metadata against the sharded table; then a real load of the model tensors."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if not (path / "common.pt").exists():
        found.notes.append(f"{path}: no common.pt (Megatron-LM main layout)")
    metadata = _read_dcp_metadata(path, None)
    if metadata is None:
        return
    tensors = {key: meta for key, meta in metadata.state_dict_metadata.items()
               if isinstance(meta, TensorStorageMetadata)}
    model = {key: tuple(meta.size) for key, meta in tensors.items()
             if not key.startswith(OPTIMIZER_PREFIX) and not _is_extra_state(key)}
    _note_optimizer(path, sum(key.startswith(OPTIMIZER_PREFIX) for key in tensors), found)
    _judge_shapes(path, model, shape, sharded=True, found=found)
    found.num_parameters = sum(math.prod(size) for size in model.values())
    if load and model and found.shapes_ok:  # only the course model's sizes are allocated, whatever .metadata says
        _load_dcp_model(path, {key: tensors[key] for key in model}, found)


def _load_dcp_model(path: Path, tensors: dict, found: _Findings) -> None:
    """Read the model tensors' data with torch.distributed.checkpoint, no process group, on CPU."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    state = {key: torch.empty(tuple(meta.size), dtype=meta.properties.dtype) for key, meta in tensors.items()}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process"
            dcp.load(state, storage_reader=safe_reader(path, found.root), no_dist=True)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - CheckpointException is a BaseException
        found.problems.append(MSG_LOAD_FAILED.format(path=path, error=_short(_unwrap(exc))))
        return
    found.loaded = True
    found.num_parameters = sum(t.numel() for t in state.values())


# ---------------------------------------------------------------- torch (legacy) format

def _check_torch_files(path: Path, found: _Findings) -> None:
    """One rank directory (TP=1, PP=1) holding a non-empty model_optim_rng.pt."""
    ranks = _rank_dirs(path)
    if len(ranks) > 1:
        names = ", ".join(p.name for p in ranks)
        found.problems.append(MSG_PARALLEL_RANKS.format(path=path, count=len(ranks), names=names))
    for rank in ranks[:1]:
        target = rank / TORCH_FILE
        if not target.is_file() or target.is_symlink():
            found.problems.append(MSG_MISSING_FILE.format(path=target))
        elif target.lstat().st_size == 0:
            found.problems.append(MSG_UNREADABLE.format(path=target, error="empty file"))


def _inspect_torch(path: Path, shape: ModelShape, load: bool, found: _Findings) -> None:
    """torch.load the first rank's file (it carries the weights, so shapes need a load)."""
    import torch

    ranks = _rank_dirs(path)
    target = ranks[0] / TORCH_FILE
    if not target.is_file() or target.stat().st_size == 0:
        return  # already reported by _check_torch_files
    if not load:
        found.notes.append(f"{target}: not loaded (load=False); the torch format has no separate shape index")
        return
    state = _load_pickled_dict(target, found)
    if state is None:
        return
    model = state.get("model")
    if not isinstance(model, dict):
        found.problems.append(MSG_NO_MODEL_KEY.format(path=target, keys=", ".join(map(str, list(state)[:10]))))
        return
    tensors = {_local_name(k): v for k, v in model.items() if isinstance(v, torch.Tensor) and not _is_extra_state(k)}
    _note_optimizer(target, 1 if state.get("optimizer") else 0, found)
    _judge_shapes(target, {k: tuple(v.shape) for k, v in tensors.items()}, shape, sharded=False, found=found)
    found.num_parameters = sum(v.numel() for v in tensors.values())
    try:
        corrupt = storage_crc_ok(target, found.root)   # the tensors' data: every stored entry read, CRC checked
    except Exception as exc:  # noqa: BLE001 - any read error means a corrupt file
        found.problems.append(MSG_UNREADABLE.format(path=target, error=_short(exc)))
        return
    if corrupt:
        found.problems.append(MSG_STORAGE_CORRUPT.format(path=target, entry=corrupt))
        return
    found.loaded = True


# ---------------------------------------------------------------- shape judgement

def _judge_shapes(path: Path, actual: dict[str, tuple], shape: ModelShape, sharded: bool, found: _Findings) -> None:
    """Compare model tensor names/shapes with megatron-core's; list missing, unexpected and wrong ones."""
    try:
        expected = expected_sharded_shapes(shape) if sharded else expected_model_shapes(shape)
    except Exception as exc:  # noqa: BLE001 - megatron-core missing or broken: not measurable, say why
        found.problems.append(MSG_NO_EXPECTED.format(error=_short(exc)))
        return
    flags = shape.flags()
    missing = [MSG_MISSING_TENSOR.format(path=path, name=n, expected=expected[n], flags=flags)
               for n in sorted(expected) if n not in actual]
    unexpected = [MSG_UNEXPECTED_TENSOR.format(path=path, name=n, actual=actual[n], flags=flags)
                  for n in sorted(actual) if n not in expected]
    wrong = [MSG_WRONG_SHAPE.format(path=path, name=n, actual=actual[n], expected=expected[n], flags=flags)
             for n in sorted(actual) if n in expected and tuple(actual[n]) != tuple(expected[n])]
    for kind, messages in (("wrong-shape", wrong), ("missing", missing), ("unexpected", unexpected)):
        found.problems.extend(messages[:MAX_LISTED])
        if len(messages) > MAX_LISTED:
            found.problems.append(MSG_MORE_MISMATCHES.format(path=path, count=len(messages) - MAX_LISTED,
                                                             kind=kind, flags=flags))
    found.shapes_ok = not (missing or unexpected or wrong)


def _note_optimizer(path: Path, count: int, found: _Findings) -> None:
    """Optimizer state is informational: --no-save-optim checkpoints are valid too."""
    found.notes.append(f"{path}: optimizer state present ({count} entries)" if count
                       else f"{path}: no optimizer state (saved with --no-save-optim?)")


# ---------------------------------------------------------------- CLI

BUDGET_S = 300          # wall clock for one inspection (a real one: ~10 s with the weights)
BUDGET_MB = 4096        # address space of the inspecting process (a real one peaks at ~1.5 GB virtual)


def main(argv: list[str] | None = None) -> int:
    """``python -m harness inspect SAVE_DIR``: print the report as JSON; exit 1 on problems.

    The inspection runs in a child process with rlimits (address space --budget-mb, CPU time) and a wall-clock
    budget (--budget-s) enforced from here by killing its process group; Ctrl-C and SIGTERM stop it too."""
    parser = argparse.ArgumentParser(prog="python -m harness inspect", description=main.__doc__)
    parser.add_argument("save_dir", help="the training run's --save directory")
    parser.add_argument("--iteration", type=int, default=None, help="iteration to load (default: tracker's)")
    parser.add_argument("--no-load", action="store_true", help="check layout and shapes without reading weights")
    parser.add_argument("--no-binary-head", action="store_true",
                        help="the model has no binary (SOP) head: recipe (b), --bert-no-binary-head")
    parser.add_argument("--hidden-size", type=int, default=None, help="the run's --hidden-size (the FAQ's 64)")
    parser.add_argument("--ffn-hidden-size", type=int, default=None, help="the run's --ffn-hidden-size")
    parser.add_argument("--num-layers", type=int, default=None, help="the run's --num-layers")
    parser.add_argument("--json-out", default=None, metavar="FILE",
                        help="also write the report there (renamed into place when complete)")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help=f"wall-clock budget (default {BUDGET_S})")
    parser.add_argument("--budget-mb", type=int, default=BUDGET_MB,
                        help=f"address-space budget of the inspecting process (default {BUDGET_MB})")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)  # the bounded child itself
    # the bounded child a fork of this process, not a fresh interpreter (a fork of the session's server: imported)
    parser.add_argument("--bounded-fork", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.in_process:
        from harness.base.bounded import fork_bounded, python_module, run_bounded

        if args.bounded_fork and hasattr(os, "fork") and threading.active_count() == 1:   # a fork copies one thread
            done = fork_bounded(lambda: _inspect_here(args), args.budget_s, args.budget_mb)
        else:
            if args.bounded_fork:   # slower, never different: said in the stage's log
                print("--bounded-fork: other threads run here; the bounded child is a fresh interpreter", file=sys.stderr)
            done = run_bounded(python_module("harness.evidence.checkpoints.inspector", [
                *(sys.argv[1:] if argv is None else argv), "--in-process"]), args.budget_s, args.budget_mb)
        if done.stopped_by is not None:
            print("interrupted: the inspection was stopped", file=sys.stderr)
            return 128 + done.stopped_by
        if done.over:
            report = CheckpointReport(save_dir=str(args.save_dir),
                                      problems=(MSG_OVER_BUDGET.format(path=args.save_dir, what=done.over),))
            _emit(report, (), args.json_out)
            return 1
        sys.stdout.write(done.out)
        sys.stderr.write(done.err[-20000:])
        return done.returncode
    return _inspect_here(args)


def _inspect_here(args) -> int:
    """main's inspection in this process (the bounded child): the report on stdout (and --json-out); 0, 1 or 3."""
    if args.hidden_size or args.ffn_hidden_size or args.num_layers or args.no_binary_head:
        shape = course_model(not args.no_binary_head, hidden_size=args.hidden_size,
                             ffn_hidden_size=args.ffn_hidden_size, num_layers=args.num_layers)
    else:
        shape = None   # the dimensions the checkpoint's saved arguments hold (the course's without them)
    try:
        import torch.distributed.checkpoint  # noqa: F401 - what the inspection needs, imported under the budget
        from harness.evidence.checkpoints.safe_pickle import _table
        _table()
        report, notes = inspect_with_notes(args.save_dir, shape, iteration=args.iteration, load=not args.no_load)
    except (MemoryError, ImportError) as exc:   # the budget (an import fails to map its library): not a problem
        print(f"the inspector ran out of its memory budget: {_short(exc)}", file=sys.stderr)
        return 3
    _emit(report, notes, args.json_out)
    return 1 if report.problems else 0


def _emit(report: CheckpointReport, notes, json_out) -> None:
    text = json.dumps({**dataclasses.asdict(report), "notes": list(notes)}, indent=2)
    print(text)
    if json_out:
        write_text_atomic(json_out, text)


def report_from_json(path) -> CheckpointReport:
    """The CheckpointReport that `main --json-out` wrote."""
    data = json.loads(Path(path).read_text())
    fields = {f.name for f in dataclasses.fields(CheckpointReport)}
    data = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in fields}
    return CheckpointReport(**data)


if __name__ == "__main__":
    sys.exit(main())
