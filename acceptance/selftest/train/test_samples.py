"""The shared sample cache (harness.train.samples): the same samples as the dataset gives, each built once across
processes, a dead claimer's chunk taken over, and a new key when the data files change."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import pytest

from harness.train import samples
from harness.train.samples import CHUNK, SampleStore

KEYS = ("text", "is_random")


class FakeDataset:
    """Deterministic samples like Megatron's (RandomState(seed + i)); every build of a sample is logged."""

    def __init__(self, prefix: Path, n: int, log: Path, seed: int = 7):
        self.n, self.log, self.seed = n, log, seed
        self.unique_description_hash = f"fake-{n}-{seed}"
        self.dataset = type("Indexed", (), {"path_prefix": str(prefix)})()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        with open(self.log, "a") as fh:
            fh.write(f"{i}\n")
        rng = np.random.RandomState(self.seed + i)
        return {"text": rng.randint(0, 30000, size=16), "is_random": int(rng.random() < 0.5)}


@pytest.fixture
def data(tmp_path) -> Path:
    prefix = tmp_path / "corpus_text_sentence"
    for suffix in (".bin", ".idx"):
        Path(f"{prefix}{suffix}").write_bytes(b"x" * 10)
    return prefix


def built(log: Path) -> list[int]:
    return [int(x) for x in log.read_text().split()] if log.exists() else []


def test_samples_equal_the_dataset_and_wrap_around(tmp_path, data):
    ds = FakeDataset(data, 3 * CHUNK + 5, tmp_path / "log")
    store = SampleStore(ds, KEYS, tmp_path / "cache")
    indices = [0, 1, CHUNK + 3, 3 * CHUNK + 4, len(ds) + 2]  # the last one wraps to 2, as BatchSource does
    store.fill(indices, workers=2)
    got = store.take(indices)
    for row, i in enumerate(indices):
        want = ds[i % len(ds)]
        assert np.array_equal(got["text"][row], want["text"]) and got["is_random"][row] == want["is_random"]
    assert got["text"].dtype == np.int64 and got["text"].shape == (len(indices), 16)


def _fill(root: str, prefix: str, log: str, n: int) -> None:
    SampleStore(FakeDataset(Path(prefix), n, Path(log)), KEYS, root).fill(range(n), workers=2)


def test_each_sample_is_built_once_across_processes(tmp_path, data):
    """Three processes with two workers each fill the same store at once: every sample is masked exactly once."""
    n, log = 6 * CHUNK, tmp_path / "log"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_fill, args=(str(tmp_path / "cache"), str(data), str(log), n)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert sorted(built(log)) == list(range(n))
    store = SampleStore(FakeDataset(data, n, log), KEYS, tmp_path / "cache")
    assert np.array_equal(store.take([n - 1])["text"][0], FakeDataset(data, n, tmp_path / "log2")[n - 1]["text"])
    assert not list(store.dir.glob("*.claim")) and not list(store.dir.glob(".*.npz"))


def test_a_dead_claimers_chunk_is_taken_over(tmp_path, data):
    ds = FakeDataset(data, CHUNK, tmp_path / "log")
    store = SampleStore(ds, KEYS, tmp_path / "cache")
    child = multiprocessing.get_context("fork").Process(target=lambda: None)
    child.start()
    child.join()  # a pid that no longer runs
    store._claim_path(0).write_text(str(child.pid))
    store.fill(range(CHUNK))
    assert sorted(built(tmp_path / "log")) == list(range(CHUNK))


def test_a_zombie_claimers_chunk_is_taken_over(tmp_path, data):
    """A helper that died but was not reaped yet (a zombie) holds no claim: its chunk is built at once."""
    ds = FakeDataset(data, CHUNK, tmp_path / "log")
    store = SampleStore(ds, KEYS, tmp_path / "cache")
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        deadline = time.monotonic() + 10
        # the state is the first field after the command name in parentheses, which may hold spaces (pytest-xdist
        # retitles its workers "[pytest-xdist running] ...", and a fork keeps the title)
        while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", "the child never became a zombie"
        store._claim_path(0).write_text(str(pid))
        started = time.monotonic()
        store.fill(range(CHUNK))
        assert time.monotonic() - started < samples.WAIT_S / 2 and sorted(built(tmp_path / "log")) == list(range(CHUNK))
    finally:
        os.waitpid(pid, 0)


def test_a_live_claim_is_waited_for(tmp_path, data, monkeypatch):
    """A chunk claimed by a live process is not built twice: the reader waits until it appears."""
    ds = FakeDataset(data, CHUNK, tmp_path / "log")
    store = SampleStore(ds, KEYS, tmp_path / "cache")
    store._claim_path(0).write_text(str(os.getpid()))  # "someone" (alive) is building it
    other = SampleStore(FakeDataset(data, CHUNK, tmp_path / "log-other"), KEYS, tmp_path / "cache")
    pid = os.fork()
    if pid == 0:
        time.sleep(0.5)
        other._build(0)  # the claimer finishes its chunk a moment later
        os._exit(0)
    try:
        store.fill(range(CHUNK))
    finally:
        os.waitpid(pid, 0)
    assert built(tmp_path / "log") == [] and len(built(tmp_path / "log-other")) == CHUNK


def test_changed_data_files_get_a_new_key(tmp_path, data):
    ds = FakeDataset(data, CHUNK, tmp_path / "log")
    before = samples.dataset_key(ds)
    Path(f"{data}.bin").write_bytes(b"y" * 11)
    assert samples.dataset_key(ds) != before


class FullFakeDataset(FakeDataset):
    """FakeDataset with every key a training batch has."""

    def __getitem__(self, i: int) -> dict:
        from harness.train.step import BATCH_KEYS

        base = super().__getitem__(i)
        return {k: base["is_random"] if k == "is_random" else (base["text"] + j) for j, k in enumerate(BATCH_KEYS)}


def _builder(root: Path, data: Path, n: int, log: Path, workers: int) -> None:
    """Another process (the session's samples stage) building every chunk, slowly."""
    from harness.train.step import BATCH_KEYS

    ds = FullFakeDataset(data, n, log)
    real = SampleStore._build

    def slow(self, chunk):
        time.sleep(0.05)
        real(self, chunk)
    SampleStore._build = slow
    SampleStore(ds, BATCH_KEYS, root).fill(range(n), workers=workers)


def test_workers_build_the_chunks_in_order_round_robin(tmp_path, data, monkeypatch):
    """Process k of n starts at chunk k, then k+n, k+2n, ...: the first chunks are built first, not one per n-th of
    the range. Each process logs the chunks it goes for, in its order (not the files' times: a helper that a loaded
    machine starts late would reorder those without any bug)."""
    n_chunks, workers = 12, 4
    ds = FakeDataset(data, n_chunks * CHUNK, tmp_path / "log")
    store = SampleStore(ds, KEYS, tmp_path / "cache")
    attempts = tmp_path / "attempts"
    real = SampleStore._try_build

    def logged(self, chunk):
        with open(attempts, "a") as fh:   # one short line per write: appends of the processes do not interleave
            fh.write(f"{os.getpid()} {chunk}\n")
        time.sleep(0.02)
        return real(self, chunk)
    monkeypatch.setattr(SampleStore, "_try_build", logged)
    store.fill(range(len(ds)), workers=workers)
    order: dict = {}
    for pid, chunk in (line.split() for line in attempts.read_text().splitlines()):
        order.setdefault(pid, []).append(int(chunk))
    assert len(order) == workers, order
    firsts = sorted(chunks[:n_chunks // workers] for chunks in order.values())
    assert firsts == [list(range(k, n_chunks, workers)) for k in range(workers)], order
    assert all(store._path(c).exists() for c in range(n_chunks))


def test_lazy_batches_read_chunks_as_another_process_builds_them(tmp_path, data):
    """A streaming run (--stream-samples) starts once its first batch exists and gets exactly the dataset's
    samples for every batch, while the builder is still writing the later chunks."""
    import torch

    from harness.train.step import BATCH_KEYS
    from harness.train.data import BatchSource, LazyBatches

    n = 6 * CHUNK
    ctx = multiprocessing.get_context("fork")
    builder = ctx.Process(target=_builder, args=(tmp_path / "cache", data, n, tmp_path / "log-builder", 2))
    builder.start()
    ds = FullFakeDataset(data, n, tmp_path / "log-run")
    store = SampleStore(ds, BATCH_KEYS, tmp_path / "cache")
    args = type("Args", (), {"micro_batch_size": 4, "global_batch_size": 16})()
    source = BatchSource(ds, args, 0, 1, torch.device("cpu"), store)
    batches = source.batches(0, n // 16)
    assert isinstance(batches, LazyBatches) and len(batches) == n // 16
    first = batches[0]
    still_building = builder.is_alive()
    got = [first] + [batches[i] for i in range(1, len(batches))]
    builder.join(30)
    assert still_building, "the builder had finished before the first batch was read: nothing was streamed"
    for b, batch in enumerate(got):
        rows = [i for micro in source.indices(b) for i in micro]
        for key in BATCH_KEYS:
            want = np.stack([np.asarray(ds[i][key]) for i in rows])
            assert np.array_equal(batch[key].reshape(want.shape).numpy(), want), (b, key)
    with pytest.raises(IndexError):
        batches[len(batches)]
