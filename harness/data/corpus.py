"""The course's toy corpus, reproduced exactly, written as loose JSON (`{"text": ...}` per line).

Recipe (course chapter): `random.seed(42)`; 2000 lines; each line is
`(['the','model','train','data','gpu','batch','layer','attention'] * random.randint(3, 8))[:random.randint(10, 30)]`
joined by spaces: the list multiplication's randint is drawn before the slice's.

Layouts:
- `grouped` (default): `lines_per_doc` lines per document, each line one sentence ending in "." and joined by a
  space ("the model train. the gpu batch."). Both punkt (Megatron's splitter) and harness.data.preprocess's splitter cut
  there, so every document has >= 2 sentences, which the binary (SOP) head needs. BERT tokenizes "train." and
  "train ." alike: each sentence is the course line's tokens plus "." (id 1012).
- `one-per-doc`: the course's literal layout, one line per document (one sentence: binary head hangs, see
  docs/MEASURED.md "Failure modes"; train it with --bert-no-binary-head).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

WORDS = ["the", "model", "train", "data", "gpu", "batch", "layer", "attention"]
LAYOUTS = ("grouped", "one-per-doc")


def course_lines(lines: int = 2000, seed: int = 42) -> list[str]:
    """The course's lines, in the course's random-call order (same stream as `random.seed(seed)`)."""
    rng = random.Random(seed)
    return [" ".join((WORDS * rng.randint(3, 8))[: rng.randint(10, 30)]) for _ in range(lines)]


def documents(lines: list[str], layout: str = "grouped", lines_per_doc: int = 10) -> list[str]:
    """Document texts for a layout: sentences grouped with a final '.', or one course line each."""
    if layout == "one-per-doc":
        return list(lines)
    if layout != "grouped":
        raise ValueError(f"unknown layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    if lines_per_doc < 1:
        raise ValueError(f"lines_per_doc must be >= 1, got {lines_per_doc}")
    chunks = [lines[i:i + lines_per_doc] for i in range(0, len(lines), lines_per_doc)]
    return [" ".join(f"{line}." for line in chunk) for chunk in chunks]


def write_corpus(path: str | Path, layout: str = "grouped", lines: int = 2000, seed: int = 42,
                 lines_per_doc: int = 10) -> Path:
    """Write the corpus as loose JSON, byte-for-byte the same on every run; return the path."""
    texts = documents(course_lines(lines, seed), layout, lines_per_doc)
    path = Path(path)
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        for text in texts:
            handle.write(json.dumps({"text": text}) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    """CLI: python -m harness corpus OUT.json [--layout grouped|one-per-doc] [--lines N] [--seed S]."""
    parser = argparse.ArgumentParser(prog="python -m harness corpus", description=__doc__.splitlines()[0])
    parser.add_argument("out", help="output .json (loose JSON, one {\"text\": ...} per line)")
    parser.add_argument("--layout", choices=LAYOUTS, default="grouped")
    parser.add_argument("--lines", type=int, default=2000, help="course lines to draw (default 2000)")
    parser.add_argument("--seed", type=int, default=42, help="random.seed of the recipe (default 42)")
    parser.add_argument("--lines-per-doc", type=int, default=10, help="sentences per document when grouped")
    args = parser.parse_args(argv)
    path = write_corpus(args.out, args.layout, args.lines, args.seed, args.lines_per_doc)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
