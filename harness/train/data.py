"""Datasets of the reference trainer: megatron-core's BERTMaskedWordPieceDataset, as Megatron builds it.

Samples are drawn in Megatron's order (MegatronPretrainingSampler: sequential, consumed-samples offset,
each data-parallel rank its slice of every global batch) and stacked up front, so the step loop never
waits on Python data code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from harness.train.step import BATCH_KEYS


@dataclass(frozen=True)
class SampleCounts:
    """Megatron's train_val_test_num_samples for the given schedule."""

    train: int
    valid: int
    test: int

    @classmethod
    def from_args(cls, args) -> "SampleCounts":
        gbs = args.global_batch_size
        evals = args.train_iters // args.eval_interval + 1
        return cls(args.train_iters * gbs, evals * args.eval_iters * gbs, args.eval_iters * gbs)


def check_sentences_per_document(prefix: str, binary_head: bool) -> None:
    """Fail fast where Megatron would hang: the binary head needs documents of >= 2 sentences.

    With none, megatron-core's sample-index build loops over ~2^31 epochs without an error (docs/MEASURED.md).
    """
    if not binary_head:
        return
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dataset = IndexedDataset(prefix)  # keep it alive: document_indices is a view into its memory map
    sentences = np.diff(np.array(dataset.document_indices))
    del dataset
    if sentences.size and int(sentences.max()) < 2:
        raise SystemExit(
            f"{prefix}: all {sentences.size} documents have fewer than 2 sentences, so the binary (sentence-order) "
            "head has nothing to sample and Megatron's dataset build would hang. Fix: documents need >= 2 "
            "sentences: split sentences / group lines (python -m harness corpus --layout grouped, then preprocess "
            "with --split-sentences), or train with --bert-no-binary-head")


def wait_for_data(prefixes: list[str], seconds: float) -> None:
    """Let the trainer start while preprocessing finishes: wait for PREFIX.bin/.idx (renamed in place last)."""
    import time
    from pathlib import Path

    deadline = time.monotonic() + seconds
    for prefix in prefixes:
        files = [Path(prefix + ".bin"), Path(prefix + ".idx")]
        while not all(f.is_file() for f in files):
            if Path(prefix + ".failed").exists():
                raise SystemExit(f"preprocessing of {prefix} failed ({prefix}.failed): nothing to train on")
            if time.monotonic() > deadline:
                waited = f" (waited {seconds:g} s)" if seconds else ""
                raise SystemExit(f"{prefix}.bin/.idx not found{waited}: --data-path must be the prefix preprocessing "
                                 "wrote, without .bin/.idx (python -m harness preprocess ... --output-prefix ...)")
            time.sleep(0.1)


def build_datasets(args, tokenizer, counts: SampleCounts, log):
    """Build the three splits with BlendedMegatronDatasetBuilder, printing Megatron's lines."""
    from megatron.core.datasets.bert_dataset import BERTMaskedWordPieceDataset, BERTMaskedWordPieceDatasetConfig
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.utils import get_blend_from_list

    log("> building train, validation, and test datasets ...")
    log(" > datasets target sizes (minimum size):")
    log(f"    train:      {counts.train}")
    log(f"    validation: {counts.valid}")
    log(f"    test:       {counts.test}")
    config = BERTMaskedWordPieceDatasetConfig(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        blend=get_blend_from_list(args.data_path),
        split=args.split,
        path_to_cache=args.data_cache_path,
        tokenizer=tokenizer,
        masking_probability=args.mask_prob,
        short_sequence_probability=args.short_seq_prob,
        masking_max_ngram=3,
        masking_do_full_word=True,
        masking_do_permutation=False,
        masking_use_longer_ngrams=False,
        masking_use_geometric_distribution=False,
        classification_head=args.bert_binary_head,
    )
    log("> building train, validation, and test datasets for BERT ...")
    prefixes = [p for p in args.data_path if not p.replace(".", "", 1).isdigit()]  # skip blend weights
    wait_for_data(prefixes, args.wait_for_data)
    for prefix in prefixes:
        check_sentences_per_document(prefix, args.bert_binary_head)
    train, valid, test = BlendedMegatronDatasetBuilder(
        BERTMaskedWordPieceDataset, [counts.train, counts.valid, counts.test], lambda: True, config
    ).build()
    log("> finished creating BERT datasets ...")
    return train, valid, test


class BatchSource:
    """Global batches of one split for one data-parallel rank, stacked as [micro-batches, mbs, seq].

    With a `store` (harness.train.samples.SampleStore) the samples come from the session's shared chunks.
    """

    def __init__(self, dataset, args, dp_rank: int, dp_size: int, device, store=None):
        self.dataset = dataset
        self.store = store
        self.mbs = args.micro_batch_size
        self.gbs = args.global_batch_size
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.m = self.gbs // (self.mbs * dp_size)
        self.device = device

    def indices(self, batch_index: int) -> list[list[int]]:
        """Sample indices of global batch `batch_index`, per micro-batch, for this rank."""
        start = batch_index * self.gbs
        out = []
        for j in range(self.m):
            base = start + j * self.mbs * self.dp_size + self.dp_rank * self.mbs
            out.append([(base + k) % len(self.dataset) for k in range(self.mbs)])
        return out

    def batch(self, batch_index: int) -> dict:
        if self.store is not None:
            micro = [self.store.take(m) for m in self.indices(batch_index)]
            return {key: torch.from_numpy(np.stack([t[key] for t in micro])) for key in BATCH_KEYS}
        samples = [[self.dataset[i] for i in micro] for micro in self.indices(batch_index)]
        return {key: self._stack(samples, key) for key in BATCH_KEYS}

    def fill(self, first: int, count: int, workers: int) -> None:
        """Build (or wait for) the shared chunks of batches first .. first+count-1 of this rank."""
        if self.store is not None and count > 0:
            self.store.fill([i for b in range(first, first + count) for m in self.indices(b) for i in m], workers)

    def _stack(self, samples, key) -> torch.Tensor:
        arr = np.asarray([[np.asarray(s[key]) for s in micro] for micro in samples], dtype=np.int64)
        return torch.from_numpy(arr)

    def preload(self, first: int, count: int) -> list[dict]:
        """`count` batches from `first`, pinned in host memory or on the device, ready to copy."""
        batches = [self.batch(first + i) for i in range(count)]
        if self.device.type == "cuda":
            return [{k: v.to(self.device, non_blocking=True) for k, v in b.items()} for b in batches]
        return batches

    def ready(self, batch_index: int) -> bool:
        """The batch's samples can be read without waiting (always, without a shared store)."""
        return self.store is None or self.store.ready([i for m in self.indices(batch_index) for i in m])

    def batches(self, first: int, count: int) -> "list[dict] | LazyBatches":
        """Batches first .. first+count-1: with a shared store, read as its chunks appear (LazyBatches), so a run
        starts training while the session's samples stage is still building the later chunks; else preloaded."""
        return self.preload(first, count) if self.store is None else LazyBatches(self, first, count)


class LazyBatches:
    """A run's training batches, loaded in order as their shared chunks exist: batch i waits (or builds) only when
    it is needed and not ready; every ready batch after it is loaded with it. Batches already used are dropped."""

    def __init__(self, source: BatchSource, first: int, count: int):
        self.source, self.first, self.count = source, first, count
        self.loaded: dict[int, dict] = {}

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self.count:
            raise IndexError(i)
        if i not in self.loaded:
            end = i + 1  # batch i, waited for if need be, then every following batch that is ready now
            while end < self.count and self.source.ready(self.first + end):
                end += 1
            for k, batch in enumerate(self.source.preload(self.first + i, end - i)):
                self.loaded[i + k] = batch
            for old in [k for k in self.loaded if k < i - 1]:
                del self.loaded[old]
        return self.loaded[i]
