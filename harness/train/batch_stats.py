"""What the reference trainer's batches hold, counted: `python -m harness.train.batch_stats TRAINER_FLAGS --json-out F`.

The same datasets and the same batches, in the same order, as `python -m harness train` with these flags reads them
(harness.train.data: megatron-core's BERTMaskedWordPieceDataset, MegatronPretrainingSampler's order; with
--sample-cache the session's shared samples), counted on the CPU without training: per optimizer step the token
positions, the real (not padding) tokens, the predicted (masked) tokens and how they are shown (as [MASK], as the
original token, as a random one), and the share of binary-head labels that are 1. `python -m harness compare-hf`
puts these beside the Hugging Face side's counts (harness.train.hf_data.BatchStats) to show what "the same tokens per
step" and "the same masking rate" really are on both sides.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def count(batches, mask_id: int, cls_id: int, sep_id: int) -> dict:
    """Totals over an iterable of global batches (dicts of arrays shaped [micro-batches, micro-batch, seq])."""
    import numpy as np

    steps = positions = real = predicted = maskable = as_mask = as_kept = ones = sequences = 0
    for batch in batches:
        text, labels = np.asarray(batch["text"]), np.asarray(batch["labels"])
        loss_mask, padding = np.asarray(batch["loss_mask"]) > 0, np.asarray(batch["padding_mask"]) > 0
        steps += 1
        positions += text.size
        real += int(padding.sum())
        predicted += int(loss_mask.sum())
        # the ids before masking: the labels where a token is predicted
        original = np.where(loss_mask, labels, text)
        maskable += int((padding & (original != cls_id) & (original != sep_id)).sum())
        as_mask += int((loss_mask & (text == mask_id)).sum())
        as_kept += int((loss_mask & (text == labels)).sum())
        ones += int(np.asarray(batch["is_random"]).sum())
        sequences += int(np.asarray(batch["is_random"]).size)
    n, p = max(steps, 1), max(predicted, 1)
    return {"steps": steps, "positions_per_step": positions / n, "real_tokens_per_step": real / n,
            "predicted_per_step": predicted / n, "predicted_fraction_of_maskable": predicted / max(maskable, 1),
            "shown_as_mask": as_mask / p, "shown_as_original": as_kept / p,
            "shown_as_random": (predicted - as_mask - as_kept) / p, "binary_label_ones": ones / max(sequences, 1)}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--json-out", required=True)
    mine, rest = own.parse_known_args(argv)
    from harness.base.imports import import_megatron_core
    from harness.train.args import parse_args

    args = parse_args(rest)
    import_megatron_core()
    import torch

    from harness.data.tokenizer import MegatronBertTokenizer
    from harness.train.data import BatchSource, SampleCounts, build_datasets
    from harness.train.step import BATCH_KEYS

    if not torch.distributed.is_initialized():  # megatron-core's dataset builder asks for the rank
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    tokenizer = MegatronBertTokenizer.from_type(args.tokenizer_type, args.vocab_file)
    counts = SampleCounts.from_args(args)
    train, _, _ = build_datasets(args, tokenizer, counts, lambda line: None)
    store = None
    if args.sample_cache:
        from harness.train.samples import SampleStore

        store = SampleStore(train, BATCH_KEYS, args.sample_cache)
    source = BatchSource(train, args, 0, 1, torch.device("cpu"), store)
    stats = count((source.batch(i) for i in range(args.train_iters)), tokenizer.mask, tokenizer.cls, tokenizer.sep)
    stats["samples_in_index"] = len(train)
    Path(mine.json_out).write_text(json.dumps(stats, indent=1) + "\n")
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
