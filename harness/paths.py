"""Where the suite's committed data lives, so no module hard-codes a path."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"
VOCAB_FILE = FIXTURES / "vocab" / "bert-base-uncased-vocab.txt"
CRITERIA_DIR = FIXTURES / "criteria"
GOLDEN_DIR = FIXTURES / "golden"
RECORDED_LOGS = FIXTURES / "logs"
BROKEN_INPUTS = FIXTURES / "broken"
RESULTS_DIR = REPO / "results"
