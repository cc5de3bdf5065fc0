"""Where the suite's committed data lives, so no module hard-codes a path; and how a file is written whole."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
VOCAB_FILE = FIXTURES / "vocab" / "bert-base-uncased-vocab.txt"
CRITERIA_DIR = FIXTURES / "criteria"
GOLDEN_DIR = FIXTURES / "golden"
RECORDED_LOGS = FIXTURES / "logs"
BROKEN_INPUTS = FIXTURES / "broken"
RESULTS_DIR = REPO / "results"


def write_text_atomic(path, text: str) -> Path:
    """Write `text` to a temporary name beside `path`, then rename it over `path`: a reader sees the old file or the
    whole new one, never half of it."""
    path = Path(path)
    temp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    temp.write_text(text, encoding="utf-8")
    os.replace(temp, path)
    return path
