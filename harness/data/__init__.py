"""Stage 1: the corpus, the WordPiece tokenizer and preprocessing into .bin/.idx."""

from __future__ import annotations

import sys
from pathlib import Path


def preprocess_argv(corpus: Path, prefix: Path, vocab_file: Path, workers: int = 1) -> list[str]:
    """`python -m harness preprocess` with the course's flags (BERT WordPiece, split sentences, key `text`)."""
    return [sys.executable, "-m", "harness.data.preprocess", "--input", str(corpus), "--output-prefix", str(prefix),
            "--vocab-file", str(vocab_file), "--tokenizer-type", "BertWordPieceLowerCase", "--split-sentences",
            "--json-keys", "text", "--workers", str(workers)]
