"""Masked BERT samples built once and shared: every run of a session with the same dataset reads the same samples.

Megatron's BERTMaskedWordPieceDataset draws sample i from a RandomState seeded with (seed + i), so sample i is the
same in every run that builds the dataset with the same config. A session trains a dozen runs on one corpus; each
used to mask the same ~4000 samples itself (seconds of Python per run, all runs at once). Here the samples live in
chunks of CHUNK consecutive indices under DIR/<dataset key>/, built by whichever process claims a chunk first
(an O_EXCL claim file with its pid), so the runs of a session, and `workers` forked helpers of one run, build
disjoint chunks in parallel. A chunk is written to a temporary name and renamed, so a reader never sees half of
one; a claim whose process died is taken over. The key is Megatron's own unique_description_hash of the dataset
(prefix, split, sizes, seed, sequence length, masking settings) plus the .bin/.idx sizes and modification times.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import numpy as np

from harness.base.proc import pid_alive

CHUNK = 64
WAIT_S = 120.0  # a chunk claimed by a live process that takes longer than this is built here as well


def default_workers() -> int:
    """Forked helpers per run: a quarter of the host's cores, 1 to 4."""
    return max(1, min(4, (os.cpu_count() or 1) // 4))


def samples_stage_workers() -> int:
    """Processes of a --samples-only run (the session's one build per corpus): half the host's cores, 1 to 8."""
    return max(1, min(8, (os.cpu_count() or 1) // 2))


def dataset_key(dataset) -> str:
    """Megatron's hash of the dataset's description, plus the identity of the .bin/.idx it reads."""
    parts = [dataset.unique_description_hash]
    prefix = getattr(dataset.dataset, "path_prefix", None) or getattr(dataset.config, "blend", "")
    for suffix in (".bin", ".idx"):
        try:
            st = os.stat(f"{prefix}{suffix}")
            parts.append(f"{st.st_size}:{st.st_mtime_ns}")
        except (OSError, TypeError):
            parts.append("?")
    return hashlib.md5("|".join(map(str, parts)).encode()).hexdigest()


class SampleStore:
    """Samples of one dataset split by index, from the shared chunk files (built on demand)."""

    def __init__(self, dataset, keys: tuple[str, ...], root: str | os.PathLike):
        self.dataset, self.keys = dataset, keys
        self.dir = Path(root) / dataset_key(dataset)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.chunks: dict[int, dict[str, np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self.dataset)

    # -- one chunk
    def _path(self, chunk: int) -> Path:
        return self.dir / f"{chunk:07d}.npz"

    def _claim_path(self, chunk: int) -> Path:
        return self.dir / f"{chunk:07d}.claim"

    def _build(self, chunk: int) -> None:
        """Mask the chunk's samples the way dataset[i] does and write them (temp name, then rename)."""
        lo, hi = chunk * CHUNK, min(len(self.dataset), (chunk + 1) * CHUNK)
        samples = [self.dataset[i] for i in range(lo, hi)]
        arrays = {k: np.asarray([np.asarray(s[k]) for s in samples], dtype=np.int64) for k in self.keys}
        tmp = self.dir / f".{chunk:07d}.{os.getpid()}.npz"
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
        os.replace(tmp, self._path(chunk))

    def _try_build(self, chunk: int) -> bool:
        """Build `chunk` unless it exists or another live process claimed it; True when it exists now."""
        if self._path(chunk).exists():
            return True
        claim = self._claim_path(chunk)
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if _claimer_alive(claim) or self._path(chunk).exists():
                return self._path(chunk).exists()
            _unlink(claim)  # its process died before writing the chunk: take it over
            return self._try_build(chunk)
        try:
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            if not self._path(chunk).exists():
                self._build(chunk)
        finally:
            _unlink(claim)
        return True

    # -- many chunks
    def chunks_of(self, indices) -> list[int]:
        """The chunks holding `indices` (modulo the split's length), in order."""
        return sorted({int(i) % len(self.dataset) // CHUNK for i in indices})

    def ready(self, indices) -> bool:
        """Every chunk holding one of `indices` exists (no waiting, no building)."""
        return all(self._path(c).exists() for c in self.chunks_of(indices))

    def fill(self, indices, workers: int = 1) -> None:
        """Make sure every chunk holding one of `indices` exists: build what nobody claimed (with `workers`
        processes in all, forked from this one), then wait for chunks that other processes are building.

        Process k of n builds chunks k, k+n, k+2n, ... first (then helps with the rest), so the chunks appear
        in order: a run reading them as they come (harness.train.data.LazyBatches) rarely waits."""
        missing = [c for c in self.chunks_of(indices) if not self._path(c).exists()]
        helpers = []
        n = min(workers, len(missing))
        for k in range(1, n):
            pid = os.fork()
            if pid == 0:  # a helper: numpy only (no CUDA, no collectives), then leave without running finalizers
                code = 0
                try:
                    for c in missing[k::n] + missing:
                        self._try_build(c)
                except BaseException:  # noqa: BLE001 - the parent builds whatever a helper left undone
                    code = 1
                os._exit(code)
            helpers.append(pid)
        try:
            for c in missing[::max(n, 1)] + missing:
                self._try_build(c)
        finally:
            for pid in helpers:
                os.waitpid(pid, 0)
        self._await(missing)

    def _await(self, chunks: list[int]) -> None:
        deadline = time.monotonic() + WAIT_S
        for c in chunks:
            while not self._path(c).exists():
                if time.monotonic() > deadline:
                    self._build(c)  # a slow claimer: build it here too (the same bytes, renamed atomically)
                elif not _claimer_alive(self._claim_path(c)):
                    self._try_build(c)
                else:
                    time.sleep(0.02)

    def take(self, indices) -> dict[str, np.ndarray]:
        """The samples at `indices` (taken modulo the split's length), stacked per key."""
        rows = [int(i) % len(self.dataset) for i in indices]
        out = {k: [] for k in self.keys}
        for i in rows:
            chunk = self._load(i // CHUNK)
            for k in self.keys:
                out[k].append(chunk[k][i % CHUNK])
        return {k: np.stack(v) for k, v in out.items()}

    def _load(self, chunk: int) -> dict[str, np.ndarray]:
        if chunk not in self.chunks:
            if not self._path(chunk).exists():
                self.fill([chunk * CHUNK])
            with np.load(self._path(chunk)) as data:
                self.chunks[chunk] = {k: data[k] for k in self.keys}
        return self.chunks[chunk]


def _claimer_alive(claim: Path) -> bool:
    """The claim file's process still runs (a claim being written, with no pid yet, counts as alive)."""
    try:
        text = claim.read_text().strip()
    except FileNotFoundError:
        return False
    if not text:
        try:
            return time.time() - claim.stat().st_mtime < 5.0
        except FileNotFoundError:
            return False
    try:
        return pid_alive(int(text))
    except ValueError:
        return True


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
