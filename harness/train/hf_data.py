"""The Hugging Face side's data: the course corpus read, tokenized and masked the way a Transformers script does it.

The same corpus file and the same WordPiece vocab as the Megatron side, but the Hugging Face pipeline:
- the JSON lines are read and tokenized in the training process at start-up, by transformers' BertTokenizerFast
  loaded from a folder holding the vocab as vocab.txt (no .bin/.idx, no preprocessing step); the sentences are cut
  by the same splitter as `python -m harness preprocess`, and every sentence's ids are compared with the suite's
  Megatron tokenizer (the count of identical sentences is reported);
- sentence pairs are built once, before training, from the training documents (Megatron's split of the documents,
  980,10,10), in the shape of Google's create_instances_from_document that transformers' old
  TextDatasetForNextSentencePrediction ported: target length seq-3 (a shorter one with --short-seq-prob), segment
  A a random number of leading sentences, truncation from a random end of the longer segment. The binary head's
  task decides segment B: `nsp` (next-sentence prediction, BERT's and BertForPreTraining's): half the time the real
  continuation (label 0), half the time sentences of another random document (label 1, the unused sentences are put
  back); `sop` (sentence-order prediction, Megatron's and ALBERT's): B is always the real continuation and half the
  time A and B are swapped (label 1). A chunk of one sentence makes no SOP pair (Megatron's samples hold >= 2);
- masking happens when a batch is formed (dynamic masking): transformers' DataCollatorForLanguageModeling, 15% of
  the non-special tokens each drawn independently, 80% [MASK] / 10% random / 10% kept, new masks at every epoch.
  Megatron's masks are fixed per sample index (static) and cover whole words in n-grams of up to 3.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.data.preprocess import split_sentences

TASKS = ("nsp", "sop")


def read_documents(corpus: str | Path) -> list[str]:
    """The texts of a JSON-lines corpus (`{"text": ...}` per line; blank lines skipped), in file order."""
    texts = []
    with open(corpus, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SystemExit(f"{corpus}:{number}: not JSON ({exc.msg}); the corpus is the file "
                                 "`python -m harness corpus` writes") from None
            if not isinstance(data, dict) or not isinstance(data.get("text"), str):
                raise SystemExit(f"{corpus}:{number}: no 'text' string; the corpus is the file "
                                 "`python -m harness corpus` writes")
            texts.append(data["text"])
    if not texts:
        raise SystemExit(f"{corpus}: no documents; write the course corpus with `python -m harness corpus FILE`")
    return texts


def split_ranges(split: str, n: int) -> list[tuple[int, int]]:
    """megatron-core's split of n documents (parse_and_normalize_split, convert_split_vector_to_split_matrix and
    BlendedMegatronDatasetBuilder._build_megatron_dataset_splits): normalized shares, cumulative book-ends, each
    bound int(round(fraction * n))."""
    weights = [float(w) for w in re.findall(r"[.0-9]+", split)]
    weights += [0.0] * (3 - len(weights))
    total = sum(weights)
    ends = [0.0]
    for w in weights:
        ends.append(ends[-1] + w / total)
    return [(int(round(lo * float(n))), int(round(hi * float(n)))) for lo, hi in zip(ends[:-1], ends[1:])]


def hf_tokenizer(vocab_file: str | Path, folder: str | Path, lower_case: bool = True):
    """transformers' BertTokenizerFast from a folder holding the vocab as vocab.txt: the same call on transformers
    4.x (vocab_file=) and 5.x (vocab=) and offline; refuses a tokenizer that did not load every vocab line."""
    from transformers import BertTokenizerFast

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(vocab_file, folder / "vocab.txt")
    tokenizer = BertTokenizerFast.from_pretrained(str(folder), do_lower_case=lower_case, local_files_only=True)
    with open(vocab_file, encoding="utf-8") as handle:
        lines = sum(1 for _ in handle)
    if len(tokenizer) != lines:
        raise SystemExit(f"transformers' BertTokenizerFast loaded {len(tokenizer)} tokens from {vocab_file}, which "
                         f"has {lines} lines: this transformers version reads the vocab differently; fix: install "
                         "transformers >= 4.40 (pip install -e '.[compare]')")
    return tokenizer


@dataclass
class Tokenized:
    """The documents as lists of sentences of token ids, and how they compare with the Megatron tokenizer's."""

    documents: list = field(default_factory=list)   # [[ids of sentence, ...], ...]
    sentences: int = 0
    tokens: int = 0
    identical: int = 0                               # sentences whose ids equal the Megatron tokenizer's
    first_difference: str | None = None

    def summary(self) -> dict:
        return {"documents": len(self.documents), "sentences": self.sentences, "tokens": self.tokens,
                "identical_to_megatron_tokenizer": self.identical, "first_difference": self.first_difference}


def tokenize_documents(texts: list[str], tokenizer, megatron_tokenizer=None) -> Tokenized:
    """Each text cut into sentences (the preprocessing step's splitter) and tokenized by the HF tokenizer, each
    sentence's ids compared with `megatron_tokenizer`'s (harness.data.tokenizer.MegatronBertTokenizer) when given."""
    out = Tokenized()
    per_doc = [split_sentences(text) for text in texts]
    flat = [s for sentences in per_doc for s in sentences]
    ids = tokenizer(flat, add_special_tokens=False)["input_ids"] if flat else []
    reference = megatron_tokenizer.tokenize_batch(flat) if megatron_tokenizer is not None and flat else None
    at = 0
    for sentences in per_doc:
        doc = [list(x) for x in ids[at:at + len(sentences)] if len(x)]
        if reference is not None:
            for k, (mine, theirs) in enumerate(zip(ids[at:at + len(sentences)], reference[at:at + len(sentences)])):
                if list(mine) == list(theirs):
                    out.identical += 1
                elif out.first_difference is None:
                    out.first_difference = (f"{sentences[k][:80]!r}: transformers {list(mine)[:12]}, "
                                            f"Megatron {list(theirs)[:12]}")
        at += len(sentences)
        out.sentences += len(sentences)
        out.tokens += sum(len(x) for x in doc)
        if doc:
            out.documents.append(doc)
    return out


def _truncate(a: list, b: list, max_tokens: int, rng: random.Random) -> None:
    """Google's truncate_seq_pair: one token at a time off a random end of the longer segment."""
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def document_pairs(documents: list, index: int, max_tokens: int, short_seq_prob: float, task: str,
                   rng: random.Random) -> list[tuple[list, list, int]]:
    """(segment A, segment B, label) pairs of one document (create_instances_from_document's shape)."""
    document = documents[index]
    target = max_tokens if rng.random() >= short_seq_prob else rng.randint(2, max_tokens)
    pairs, chunk, length, i = [], [], 0, 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            a = [t for s in chunk[:a_end] for t in s]
            b: list = []
            label = 0
            if task == "nsp" and (len(chunk) == 1 or rng.random() < 0.5) and len(documents) > 1:
                label = 1
                other = index
                for _ in range(10):
                    other = rng.randint(0, len(documents) - 1)
                    if other != index:
                        break
                source = documents[other]
                for sentence in source[rng.randint(0, len(source) - 1):]:
                    b.extend(sentence)
                    if len(b) >= target - len(a):
                        break
                i -= len(chunk) - a_end     # the unused sentences of this chunk start the next one
            else:
                b = [t for s in chunk[a_end:] for t in s]
                if task == "sop" and rng.random() < 0.5:
                    a, b, label = b, a, 1
            _truncate(a, b, max_tokens, rng)
            if a and b:
                pairs.append((a, b, label))
            chunk, length = [], 0
        i += 1
    return pairs


@dataclass(frozen=True)
class Specials:
    cls: int
    sep: int
    pad: int
    mask: int


def specials_of(tokenizer) -> Specials:
    return Specials(tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id, tokenizer.mask_token_id)


def encode_pair(a: list, b: list, label: int, seq_length: int, sp: Specials) -> dict:
    """[CLS] A [SEP] B [SEP], padded to seq_length: the features DataCollatorForLanguageModeling takes."""
    ids = [sp.cls, *a, sp.sep, *b, sp.sep]
    types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
    pad = seq_length - len(ids)
    special = [1] + [0] * len(a) + [1] + [0] * len(b) + [1] + [1] * pad
    return {"input_ids": torch.tensor(ids + [sp.pad] * pad), "token_type_ids": torch.tensor(types + [0] * pad),
            "attention_mask": torch.tensor([1] * len(ids) + [0] * pad),
            "special_tokens_mask": torch.tensor(special), "next_sentence_label": torch.tensor(label)}


def build_examples(documents: list, seq_length: int, short_seq_prob: float, task: str, seed: int,
                   sp: Specials) -> list[dict]:
    """Every training document's pairs, built once (as TextDatasetForNextSentencePrediction did)."""
    if task not in TASKS:
        raise ValueError(f"binary task {task!r}: expected one of {', '.join(TASKS)}")
    rng = random.Random(seed)
    examples = []
    for index in range(len(documents)):
        for a, b, label in document_pairs(documents, index, seq_length - 3, short_seq_prob, task, rng):
            examples.append(encode_pair(a, b, label, seq_length, sp))
    if not examples:
        raise SystemExit("no sentence pairs: the training documents are too short for the binary head "
                         "(documents need >= 2 sentences: python -m harness corpus --layout grouped)")
    return examples


def collator(tokenizer, mask_prob: float):
    """transformers' own masking collator: 15% of non-special tokens, 80/10/10 (its defaults), at batch time."""
    from transformers import DataCollatorForLanguageModeling

    return DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=True, mlm_probability=mask_prob)


class Batches:
    """Micro-batches forever: a DataLoader over the examples, reshuffled each epoch, masked by the collator."""

    def __init__(self, examples: list, micro_batch: int, collate, seed: int):
        from torch.utils.data import DataLoader

        generator = torch.Generator().manual_seed(seed)
        self.loader = DataLoader(examples, batch_size=micro_batch, shuffle=True, drop_last=True, collate_fn=collate,
                                 generator=generator, num_workers=0)
        if len(self.loader) == 0:
            raise SystemExit(f"{len(examples)} sentence pairs make no micro-batch of {micro_batch}: use more "
                             "documents or a smaller --micro-batch-size")
        self.epochs = 0
        self._it = None

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        while True:
            if self._it is None:
                self._it = iter(self.loader)
                self.epochs += 1
            try:
                return next(self._it)
            except StopIteration:
                self._it = None


@dataclass
class BatchStats:
    """What the model was fed per optimizer step: positions, real tokens, predicted tokens, how they were masked."""

    steps: int = 0
    positions: int = 0
    real: int = 0
    predicted: int = 0
    maskable: int = 0           # real tokens that are not [CLS]/[SEP]
    as_mask: int = 0            # predicted positions shown as [MASK]
    as_kept: int = 0            # ... shown as the original token
    binary_ones: int = 0
    sequences: int = 0

    def add(self, batch: dict, original: torch.Tensor, special: torch.Tensor, mask_id: int) -> None:
        """One micro-batch: `original` holds the ids before masking, `special` its special-tokens mask."""
        labels, ids = batch["labels"], batch["input_ids"]
        predicted = labels != -100
        self.positions += ids.numel()
        self.real += int(batch["attention_mask"].sum())
        self.predicted += int(predicted.sum())
        self.maskable += int((special == 0).sum())
        self.as_mask += int((predicted & (ids == mask_id)).sum())
        self.as_kept += int((predicted & (ids == original)).sum())
        self.binary_ones += int(batch["next_sentence_label"].sum())
        self.sequences += ids.shape[0]

    def summary(self) -> dict:
        steps = max(self.steps, 1)
        predicted = max(self.predicted, 1)
        return {"steps": self.steps, "positions_per_step": self.positions / steps,
                "real_tokens_per_step": self.real / steps, "predicted_per_step": self.predicted / steps,
                "predicted_fraction_of_maskable": self.predicted / max(self.maskable, 1),
                "shown_as_mask": self.as_mask / predicted, "shown_as_original": self.as_kept / predicted,
                "shown_as_random": (self.predicted - self.as_mask - self.as_kept) / predicted,
                "binary_label_ones": self.binary_ones / max(self.sequences, 1)}
