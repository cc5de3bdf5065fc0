"""Drop-in for Megatron-LM's tools/preprocess_data.py (core_v0.16.1) for BERT WordPiece, in one pass, offline.

Same flags, same output names (`{prefix}_{key}_sentence.bin/.idx` with --split-sentences, else `_document`),
written with megatron-core's `IndexedDatasetBuilder` the way the tool does it: per JSON line one
`add_document(ids, sentence_lengths)` (= one item per non-empty sentence, then end of document), dtype from
`DType.optimal_dtype(tokenizer.vocab_size)`, `--append-eod` adds [EOS] to the last sentence. Differences, on purpose:
- one invocation (Megatron's --split-sentences writes INPUT_ss.jsonl, exits 0 and must be run again);
- sentence splitting needs no nltk data: after . ! ? (optionally closed by a quote or bracket) followed by
  whitespace, and at every newline. Punkt knows abbreviations ("Dr. Smith" stays whole) and ignores newlines;
  this splitter does neither, but it is deterministic, offline and cuts the course corpus where punkt does;
- bad input raises `InputError` naming file, line and fix (CLI: exit 2, message on stderr) instead of hanging
  or exiting 0, and no .bin/.idx is left behind (temp names, renamed at the very end);
- streaming: at most 2 x workers batches of text in flight, so memory does not grow with the text; the index
  (a few bytes per sentence, in IndexedDatasetBuilder's lists, as in Megatron) is the only part that grows;
- blank lines are skipped; every --json-keys key is finalized (Megatron's tool finalizes only the last one).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import cache
from multiprocessing import get_context
from pathlib import Path
from typing import Iterator

import numpy
from tqdm import tqdm

from harness.base.errors import InputError
from harness.base.paths import VOCAB_FILE, write_text_atomic
from harness.data.tokenizer import TOKENIZER_TYPES, MegatronBertTokenizer

BATCH_LINES = 512
IGNORED_FLAGS = {"--partitions": int, "--log-interval": int, "--lang": str}
IGNORED_SWITCHES = ("--keep-newlines", "--legacy-tokenizer", "--keep-sequential-samples",
                    "--tokenizer-hf-no-include-special-tokens")
SENTENCE_END = re.compile(r"([.!?][\"'\u201d\u2019)\]]?)[^\S\n]+")  # . ! ? (+ a closing quote) + spaces
CONVERT_FIX = ("write JSON lines, one {\"text\": ...} object per line: generate the course corpus with "
               "`python -m harness corpus sample.json`, or convert a text file with `python -c \"import json,sys; "
               "[print(json.dumps({'text': l.rstrip()})) for l in sys.stdin if l.strip()]\" < sample.txt > sample.json`")
ONE_SENTENCE_WARNING = ("WARNING: {count} of {documents} documents have fewer than 2 sentences: documents need >= 2 "
                        "sentences for the binary (SOP) head: group lines into documents (python -m harness corpus "
                        "--layout grouped) or train with --bert-no-binary-head")


@dataclass
class PreprocessStats:
    """What one preprocessing run wrote (summed over --json-keys); also saved as `{prefix}_stats.json`."""

    documents: int = 0
    sentences: int = 0
    tokens: int = 0
    docs_with_one_sentence: int = 0
    outputs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Job:
    """Everything a worker needs to encode lines (picklable)."""

    input: str
    vocab_file: str
    tokenizer_type: str
    json_keys: tuple[str, ...]
    split_sentences: bool
    append_eod: bool


@dataclass
class Encoded:
    """One batch of documents for one key: flat ids, sentence lengths, sentences per document."""

    ids: numpy.ndarray
    sentence_lengths: numpy.ndarray
    doc_sentences: numpy.ndarray


def split_sentences(text: str) -> list[str]:
    """Sentences of a text: cut after . ! ? + whitespace and at newlines; blank pieces dropped."""
    pieces = SENTENCE_END.sub("\\1\n", text).split("\n")
    return [piece.strip() for piece in pieces if piece.strip()]


@cache
def _tokenizer(vocab_file: str, tokenizer_type: str) -> MegatronBertTokenizer:
    """One tokenizer per process (workers build their own)."""
    return MegatronBertTokenizer.from_type(tokenizer_type, vocab_file)


def parse_line(job: Job, raw: bytes, line: int, offset: int) -> dict | None:
    """Decode and check one input line; None for a blank line; InputError naming line and fix otherwise."""
    where = {"path": job.input, "line": line}
    try:
        text = raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise InputError(f"invalid UTF-8 at byte {offset + exc.start} of the file (byte {exc.start} of the line)",
                         fix="re-encode the file as UTF-8, e.g. `iconv -f latin1 -t utf-8 IN > OUT`",
                         **where) from None
    if not text.strip():
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if not text.lstrip().startswith(("{", "[", '"')):
            raise InputError("input must be JSON lines with a 'text' key, found plain text "
                             f"{text.strip()[:60]!r}", fix=CONVERT_FIX, **where) from None
        raise InputError(f"invalid JSON: {exc.msg} (column {exc.colno})",
                         fix="make every line one complete JSON object", **where) from None
    if not isinstance(data, dict):
        raise InputError(f"expected a JSON object, found {type(data).__name__}", fix=CONVERT_FIX, **where)
    return data


def document_sentences(job: Job, data: dict, key: str, line: int) -> list[str]:
    """The sentences of one key of one JSON object; InputError if the key is missing, not text or empty."""
    where = {"path": job.input, "line": line}
    if key not in data:
        found = ", ".join(repr(k) for k in list(data)[:5]) or "none"
        raise InputError(f"JSON object has no {key!r} key (keys: {found}); Megatron's tools/preprocess_data.py "
                         f"fails here with KeyError: {key!r} and hangs or exits 0",
                         fix=f"pass --json-keys with the key that holds the text, or rename the field to {key!r}",
                         **where)
    text = data[key]
    if not isinstance(text, str):
        raise InputError(f"{key!r} must be a string, found {type(text).__name__}",
                         fix=f"store each document's text as one string under {key!r}", **where)
    if not text.strip():
        raise InputError(f"empty document: {key!r} is empty", fix="drop documents without text from the input",
                         **where)
    return split_sentences(text) if job.split_sentences else [text]


def encode_lines(job: Job, first_line: int, first_offset: int, lines: list[bytes]) -> dict[str, Encoded]:
    """Encode a batch of input lines into per-key token arrays (runs in a worker)."""
    tokenizer = _tokenizer(job.vocab_file, job.tokenizer_type)
    docs: list[tuple[int, dict]] = []
    offset = first_offset
    for number, raw in enumerate(lines, start=first_line):
        data = parse_line(job, raw, number, offset)
        offset += len(raw)
        if data is not None:
            docs.append((number, data))
    return {key: _encode_key(job, tokenizer, docs, key) for key in job.json_keys}


def _encode_key(job: Job, tokenizer: MegatronBertTokenizer, docs: list[tuple[int, dict]], key: str) -> Encoded:
    """Tokenize one key of a batch of documents; drop empty sentences; append [EOS] like Megatron."""
    per_doc = [document_sentences(job, data, key, line) for line, data in docs]
    flat = tokenizer.tokenize_batch([sentence for sentences in per_doc for sentence in sentences])
    ids: list[int] = []
    lengths: list[int] = []
    counts: list[int] = []
    start = 0
    for (line, _), sentences in zip(docs, per_doc):
        kept = [sentence for sentence in flat[start:start + len(sentences)] if sentence]
        start += len(sentences)
        if not kept:
            raise InputError(f"empty document: {key!r} has no tokens (only whitespace or control characters)",
                             path=job.input, line=line, fix="drop documents without text from the input")
        if job.append_eod:
            kept[-1] = kept[-1] + [tokenizer.eod]
        for sentence in kept:
            ids.extend(sentence)
            lengths.append(len(sentence))
        counts.append(len(kept))
    return Encoded(numpy.array(ids, numpy.int32), numpy.array(lengths, numpy.int32), numpy.array(counts, numpy.int32))


def read_batches(path: str, batch_lines: int = BATCH_LINES) -> Iterator[tuple[int, int, list[bytes]]]:
    """Stream (first line number, first byte offset, raw lines) without reading the whole file."""
    with open(path, "rb") as handle:
        batch: list[bytes] = []
        first_line, first_offset, offset = 1, 0, 0
        for number, raw in enumerate(handle, start=1):
            if not batch:
                first_line, first_offset = number, offset
            batch.append(raw)
            offset += len(raw)
            if len(batch) == batch_lines:
                yield first_line, first_offset, batch
                batch = []
        if batch:
            yield first_line, first_offset, batch


def encoded_batches(job: Job, workers: int, progress: tqdm) -> Iterator[dict[str, Encoded]]:
    """Encoded batches in input order; with workers > 1 a process pool with a bounded queue (errors propagate)."""
    batches = read_batches(job.input)
    if workers <= 1:
        for first_line, first_offset, lines in batches:
            yield encode_lines(job, first_line, first_offset, lines)
            progress.update(sum(map(len, lines)))
        return
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        pending: deque = deque()
        try:
            for first_line, first_offset, lines in batches:
                pending.append((pool.submit(encode_lines, job, first_line, first_offset, lines),
                                sum(map(len, lines))))
                if len(pending) >= 2 * workers:
                    yield _next_result(pending, progress)
            while pending:
                yield _next_result(pending, progress)
        finally:
            for future, _ in pending:
                future.cancel()


def _next_result(pending: deque, progress: tqdm) -> dict[str, Encoded]:
    """Oldest pending batch's result (re-raises a worker's exception; BrokenProcessPool if a worker died)."""
    future, size = pending.popleft()
    result = future.result()
    progress.update(size)
    return result


class Writers:
    """One IndexedDatasetBuilder per key, writing temp files that become the real names only on commit()."""

    def __init__(self, job: Job, output_prefix: str, vocab_size: int) -> None:
        from harness.base.imports import collector_paused, import_megatron_core

        with collector_paused():
            import_megatron_core()   # without torch.compile's machinery (and its "Apex/TE not installed" noise)
            from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder  # still torch: ~2 s
        level = "sentence" if job.split_sentences else "document"
        self.final = {key: f"{output_prefix}_{key}_{level}" for key in job.json_keys}
        self.temp = {key: f"{name}.tmp{os.getpid()}" for key, name in self.final.items()}
        dtype = DType.optimal_dtype(vocab_size)
        self.builders = {key: IndexedDatasetBuilder(temp + ".bin", dtype=dtype) for key, temp in self.temp.items()}

    def add(self, batch: dict[str, Encoded], stats: PreprocessStats) -> None:
        """Add each document of a batch, as Megatron's tool does (add_document per JSON line)."""
        for key, encoded in batch.items():
            builder = self.builders[key]
            ids_at = sentence_at = 0
            for count in encoded.doc_sentences.tolist():
                lengths = encoded.sentence_lengths[sentence_at:sentence_at + count].tolist()
                size = sum(lengths)
                builder.add_document(encoded.ids[ids_at:ids_at + size], lengths)
                ids_at += size
                sentence_at += count
            stats.sentences += len(encoded.sentence_lengths)
            stats.tokens += len(encoded.ids)
            stats.docs_with_one_sentence += int((encoded.doc_sentences < 2).sum())
        stats.documents += len(next(iter(batch.values())).doc_sentences)

    def commit(self) -> list[str]:
        """Finalize every key, then rename temp files to the real names; return the written paths."""
        for key, builder in self.builders.items():
            builder.finalize(self.temp[key] + ".idx")
        written = []
        for key in self.builders:
            for suffix in (".bin", ".idx"):
                os.replace(self.temp[key] + suffix, self.final[key] + suffix)
                written.append(self.final[key] + suffix)
        return written

    def discard(self) -> None:
        """Close and delete every temp file (after any error)."""
        for key, builder in self.builders.items():
            builder.data_file.close()
            for suffix in (".bin", ".idx"):
                Path(self.temp[key] + suffix).unlink(missing_ok=True)


def check_paths(job: Job, output_prefix: str) -> int:
    """Fail fast on a missing input, a bad vocab or a missing output directory; return Megatron's vocab size."""
    if not (Path(job.input).is_file() and os.access(job.input, os.R_OK)):
        problem = "input is not a readable file" if Path(job.input).exists() else "input file not found"
        raise InputError(problem, path=job.input, fix="pass --input with a JSON-lines file (python -m harness corpus OUT.json)")
    vocab_size = _tokenizer(job.vocab_file, job.tokenizer_type).vocab_size  # validates the vocab
    out_dir = Path(output_prefix).parent
    if not out_dir.is_dir():
        raise InputError("output directory does not exist", path=out_dir, fix=f"mkdir -p {out_dir}")
    return vocab_size


def preprocess(input: str | Path, output_prefix: str | Path, vocab_file: str | Path = VOCAB_FILE,
               tokenizer_type: str = "BertWordPieceLowerCase", json_keys: tuple[str, ...] = ("text",),
               split_sentences: bool = False, append_eod: bool = False, workers: int = 1,
               progress: bool = False) -> PreprocessStats:
    """Tokenize a JSON-lines corpus into Megatron .bin/.idx files plus `{prefix}_stats.json`; return the stats."""
    job = Job(str(input), str(vocab_file), tokenizer_type, tuple(json_keys), split_sentences, append_eod)
    output_prefix = str(output_prefix)
    vocab_size = check_paths(job, output_prefix)
    stats = PreprocessStats()
    writers = None
    size = Path(job.input).stat().st_size
    with tqdm(total=size, unit="B", unit_scale=True, desc="preprocess", disable=not progress,
              file=sys.stderr) as bar:
        try:
            for batch in encoded_batches(job, workers, bar):
                if writers is None:  # opened on the first good batch: early bad input never imports torch
                    writers = Writers(job, output_prefix, vocab_size)
                writers.add(batch, stats)
            if not stats.documents:
                raise InputError("input has no documents", path=job.input, fix=CONVERT_FIX)
            stats.outputs = writers.commit()
        except BaseException:
            if writers is not None:
                writers.discard()
            raise
    _write_stats(stats, output_prefix)
    if stats.docs_with_one_sentence:
        print(ONE_SENTENCE_WARNING.format(count=stats.docs_with_one_sentence, documents=stats.documents),
              file=sys.stderr)
    return stats


def _write_stats(stats: PreprocessStats, output_prefix: str) -> None:
    """Write `{prefix}_stats.json` atomically."""
    write_text_atomic(f"{output_prefix}_stats.json", json.dumps(asdict(stats), indent=2) + "\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Megatron's tools/preprocess_data.py flags (BERT WordPiece subset); Megatron-only knobs accepted, ignored."""
    parser = argparse.ArgumentParser(prog="python -m harness preprocess", description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="JSON-lines file, one document per line")
    parser.add_argument("--output-prefix", required=True, help="path prefix of the .bin/.idx files")
    parser.add_argument("--vocab-file", default=str(VOCAB_FILE), help="BERT WordPiece vocab (one token a line)")
    parser.add_argument("--tokenizer-type", choices=sorted(TOKENIZER_TYPES), default="BertWordPieceLowerCase")
    parser.add_argument("--json-keys", nargs="+", default=["text"], help="keys to extract (default: text)")
    parser.add_argument("--split-sentences", action="store_true", help="one item per sentence (BERT needs it)")
    parser.add_argument("--append-eod", action="store_true", help="append [EOS] to every document")
    parser.add_argument("--workers", type=int, default=1, help="encoding processes (default 1)")
    for flag, kind in IGNORED_FLAGS.items():
        parser.add_argument(flag, type=kind, help="accepted for Megatron compatibility, ignored")
    for flag in IGNORED_SWITCHES:
        parser.add_argument(flag, action="store_true", help="accepted for Megatron compatibility, ignored")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """CLI: exit 0 on success, 2 with the InputError on stderr for bad input."""
    args = parse_args(argv)
    try:
        stats = preprocess(args.input, args.output_prefix, args.vocab_file, args.tokenizer_type,
                           tuple(args.json_keys), args.split_sentences, args.append_eod, args.workers,
                           progress=True)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(asdict(stats)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
