"""The failure reader on real failing runs made on an H200 (fixtures/failures/real-h200/, made by another session and
not used to write the rules; their first reading is results/failures/real-h200-first-reading.json): each run whose
failure is an error (not a kill or a missing save) gets its cause first, through the grader's own path."""

from __future__ import annotations

import pytest

from harness.judge import criteria
from harness.evidence import logread
from harness.base.paths import FIXTURES

REAL = FIXTURES / "failures" / "real-h200"
EXPECTED = {
    "core_v0.15.3-te-import-s1234": ("transformer-engine", ["pretrain_bert.py", "core_v0.15.x"]),
    "core_v0.16.1-checkout-without-megatron-rl-s1234": ("project-module-missing", ["rl", "incomplete"]),
    "core_v0.16.1-idx-mismatch-s1234": ("one-sentence-docs", ["sample-index"]),
    "core_v0.16.1-mbs-over-gbs-s1234": ("invalid-arguments", ["micro batch size (32)"]),
    "core_v0.16.1-tp2-one-gpu-s1234": ("invalid-arguments", ["total_model_size"]),
    "core_v0.16.1-port-in-use-s1234": ("port-in-use", ["port"]),
    "core_v0.16.1-unknown-flag-s1234": ("unrecognized-argument", ["--data-impl", "pretrain_bert.py"]),
    "core_v0.16.1-vocab-missing-s1234": ("vocab-missing", ["/nonexistent/bert-vocab.txt"]),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_real_failing_run_gets_its_cause_first(name):
    path = REAL / f"{name}.log.gz"
    if not path.is_file():
        pytest.skip(f"{path.name} is not in this checkout")
    text = "\n".join(logread.read_lines(path))
    cause = criteria.root_cause(criteria.evidence_from_log_text(text))
    expect, words = EXPECTED[name]
    assert cause is not None and cause.cause_id == expect, (name, cause)
    for word in words:
        assert word in cause.cause, (name, word, cause.cause)
