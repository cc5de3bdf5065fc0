"""Self-tests of harness.evidence.diagnose: each known failure text gets its cause, remedy and evidence line."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness.evidence.diagnose import COURSE_OOM_REMEDY, RULES, Diagnosis, diagnose, missing_files
from harness.base.paths import FIXTURES

DIAGNOSES = FIXTURES / "diagnoses"
PREPROCESS_OUTPUTS = ("data/sample_text_sentence.bin", "data/sample_text_sentence.idx")
PREPROCESS_ARGV = ("python", "tools/preprocess_data.py", "--input", "data/sample.jsonl", "--split-sentences")


@dataclass(frozen=True)
class Case:
    """One recorded failure text and how its stage ended."""

    file: str
    expect: str | None
    stage: str = "train"
    returncode: int | None = 1
    timed_out: bool = False
    stalled: bool = False
    missing_outputs: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()
    evidence: str = ""          # a substring of the evidence line


CASES = [
    Case("not-json.log", "not-json", stage="preprocess", returncode=-1, timed_out=True,
         evidence="json.decoder.JSONDecodeError: Expecting value"),
    Case("missing-text-key.log", "missing-text-key", stage="preprocess", returncode=0,
         missing_outputs=PREPROCESS_OUTPUTS, argv=PREPROCESS_ARGV, evidence="KeyError: 'text'"),
    Case("one-sentence-docs.log", "one-sentence-docs", returncode=-1, stalled=True,
         evidence="> building train, validation, and test datasets for BERT ..."),
    Case("one-sentence-docs.log", "one-sentence-docs", returncode=-1, timed_out=True),
    Case("empty-split.log", "empty-split", evidence="IndexError: index -1 is out of bounds"),
    Case("data-missing.log", "data-missing",
         evidence="One or both of the .idx and .bin files cannot be found at the path prefix data/corpus_text_sentence"),
    Case("vocab-missing.log", "vocab-missing", stage="preprocess",
         evidence="FileNotFoundError: [Errno 2] No such file or directory: 'data/bert-base-uncased-vocab.txt'"),
    Case("vocab-missing-harness.log", "vocab-missing", stage="preprocess",
         evidence="VocabError: /data/bert-vocab.txt: vocab file not found"),
    Case("vocab-wrong.log", "vocab-wrong", stage="corpus",
         evidence="VocabError: data/tiny-vocab.txt: wrong vocab size"),
    Case("vocab-wrong-padded.log", "vocab-wrong", evidence="padded vocab (size: 5)"),
    Case("missing-module.log", "missing-module", stage="preprocess", returncode=1,
         evidence="ModuleNotFoundError: No module named 'pydantic'"),
    Case("nan.log", "nan", returncode=0, evidence="non-finite loss on an iteration line that was not skipped"),
    Case("cuda-oom.log", "cuda-oom", evidence="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"),
    Case("no-gpu.log", "no-gpu", evidence="AssertionError: Torch not compiled with CUDA enabled"),
    Case("nccl.log", "no-gpu", evidence="DistBackendError: NCCL error in:"),
    Case("transformer-engine.log", "transformer-engine",
         evidence="ImportError: Transformer Engine is not installed."),
    Case("old-api.log", "old-api", evidence="No module named 'megatron.initialize'"),
    Case("megatron-core-missing.log", "megatron-core-missing", evidence="No module named 'megatron'"),
    Case("megatron-lm-missing.log", "megatron-lm-missing", evidence="No module named 'megatron.training'"),
    Case("psutil-missing.log", "psutil-missing", returncode=-1, timed_out=True,
         evidence="No module named 'psutil'"),
    Case("preprocess-split-sentences.log", "preprocess-split-sentences", stage="preprocess", returncode=0,
         missing_outputs=PREPROCESS_OUTPUTS, argv=PREPROCESS_ARGV, evidence="--split-sentences"),
    Case("preprocess-no-output.log", "preprocess-no-output", stage="preprocess", returncode=0,
         missing_outputs=PREPROCESS_OUTPUTS, evidence="data/sample_text_sentence.bin"),
    Case("preprocess-no-output.log", None, stage="preprocess", returncode=0),
    Case("timeout.log", "timeout", returncode=-1, timed_out=True, evidence="validation loss at iteration 150"),
    Case("nltk-punkt.log", "nltk-punkt", stage="preprocess", returncode=-1, timed_out=True,
         evidence="Resource punkt_tab not found"),
    Case("hf-hub-offline.log", "hf-hub-offline", stage="preprocess", evidence="couldn't connect"),
    Case("megatron-helpers.log", "megatron-helpers", returncode=1,
         evidence="helpers_cpp.cpython-312-x86_64-linux-gnu.so: file too short"),
    Case("healthy.log", None, returncode=1),
]


def read(name: str) -> str:
    """A recorded failure text."""
    return (DIAGNOSES / name).read_text(encoding="utf-8")


def run_case(case: Case, **overrides) -> Diagnosis | None:
    """diagnose() on a case's text and outcome."""
    kwargs = dict(timed_out=case.timed_out, stalled=case.stalled, missing_outputs=case.missing_outputs,
                  argv=case.argv, duration_s=300.0)
    kwargs.update(overrides)
    return diagnose(case.stage, case.returncode, read(case.file), **kwargs)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.file}->{c.expect}")
def test_recorded_failures_are_diagnosed(case):
    """Each failure text maps to its rule, with the proving line as evidence."""
    found = run_case(case)
    if case.expect is None:
        assert found is None, f"{case.file}: expected no diagnosis, got {found}"
        return
    assert found is not None, f"{case.file}: no rule matched (expected {case.expect})"
    assert found.cause_id == case.expect, f"{case.file}: got {found.cause_id}, expected {case.expect}"
    assert case.evidence in found.evidence, f"{case.file}: evidence {found.evidence!r} lacks {case.evidence!r}"
    assert found.cause and found.remedy and "?" not in found.cause.split(":")[0]


def test_every_failure_mode_of_the_measured_runs_has_a_recorded_case():
    """No entry of the table that reads the whole log or how the stage ended (docs/MEASURED.md's failure modes) goes
    untested here (the entries that read an error event or its structure are tested on the catalogue's real failures
    and on samples of their class: test_failure_causes.py)."""
    tested = {c.expect for c in CASES}
    modes = {r.id for r in RULES if "docs/MEASURED.md" in r.sources or (r.condition is not None and not r.structure)}
    assert len(modes) >= 20 and modes <= tested, modes - tested


def test_oom_uses_the_course_wording_verbatim():
    """The course's OOM remedy is quoted word for word."""
    found = diagnose("train", 1, read("cuda-oom.log"))
    assert found.summary() == "CUDA out of memory: lower --micro-batch-size to 2 or 1, or --hidden-size to 64"
    assert found.remedy == COURSE_OOM_REMEDY


def test_missing_text_key_wording_and_conversion():
    """The missing-key cause reads as the course says and the remedy shows a json.dumps one-liner."""
    found = diagnose("preprocess", 0, read("missing-text-key.log"))
    assert found.cause == "input must be JSON lines with a 'text' key (KeyError: 'text')"
    assert "json.dumps" in found.remedy and "harness.data.corpus" in found.remedy
    assert diagnose("preprocess", 1, "KeyError: 'content'").cause.endswith("(KeyError: 'content')")


def test_json_errors_outside_preprocessing_are_not_blamed_on_the_corpus():
    """A JSONDecodeError in training (say, a broken metadata.json) is not the corpus rule."""
    text = "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)"
    assert diagnose("train", 1, text) is None
    assert diagnose("preprocess", 1, text).cause_id == "not-json"


def test_vocab_missing_names_the_path():
    """The cause names the vocab path that was not found."""
    found = diagnose("train", 1, read("vocab-missing.log"))
    assert found.cause == ("tokenizer initialisation failed: vocab file not found: "
                           "data/bert-base-uncased-vocab.txt")
    assert "--vocab-file" in found.remedy
    ours = diagnose("preprocess", 1, read("vocab-missing-harness.log"))
    assert ours.cause == "tokenizer initialisation failed: vocab file not found: /data/bert-vocab.txt"


def test_one_sentence_docs_needs_the_hang_and_an_unfinished_build():
    """The dataset marker alone is not a diagnosis; once datasets finished, a later hang is generic."""
    text = read("one-sentence-docs.log")
    assert diagnose("train", 1, text) is None
    later = text + "> finished creating BERT datasets ...\ntraining ...\n"
    assert diagnose("train", -1, later, stalled=True).cause_id == "timeout"
    found = diagnose("train", -1, text, stalled=True)
    assert "documents need >= 2 sentences" in found.remedy and "--bert-no-binary-head" in found.remedy


def test_preprocess_warning_line_flags_one_sentence_docs():
    """A preprocess warning about single-sentence documents is enough, before any hang."""
    text = "WARNING: 2000 of 2000 documents have fewer than 2 sentences (binary head needs 2)"
    assert diagnose("preprocess", 0, text).cause_id == "one-sentence-docs"


def test_generic_timeout_says_stage_duration_and_last_line():
    """An unknown hang still names the stage, how long it ran and where it stopped."""
    found = diagnose("resume", -1, "a\nstill working\n\n", timed_out=True, duration_s=120.4)
    assert found.cause_id == "timeout"
    assert found.cause == "stage 'resume' hung (timed out) after 120 s with no known cause; last line: still working"
    assert found.evidence == "still working"


def test_first_match_wins_oom_over_nccl():
    """An OOM that NCCL reports afterwards is still an OOM (order matters)."""
    text = read("nccl.log") + read("cuda-oom.log")
    assert diagnose("train", 1, text).cause_id == "cuda-oom"


def test_split_sentence_issue_needs_the_flag_or_ss_file():
    """Without --split-sentences or a *_ss.jsonl, a missing output is the generic no-output rule."""
    text = read("preprocess-split-sentences.log")
    assert diagnose("preprocess", 0, text, missing_outputs=PREPROCESS_OUTPUTS).cause_id == "preprocess-no-output"
    with_file = text + "wrote data/sample_ss.jsonl\n"
    assert diagnose("preprocess", 0, with_file, missing_outputs=PREPROCESS_OUTPUTS).cause_id == \
        "preprocess-split-sentences"


def test_missing_files_lists_only_absent_paths(tmp_path):
    """missing_files feeds diagnose the outputs that are not there."""
    present = tmp_path / "x.bin"
    present.write_bytes(b"")
    assert missing_files([present, tmp_path / "x.idx"]) == [str(tmp_path / "x.idx")]


def test_empty_and_unknown_texts_give_none():
    """No text, or an unknown error, is no diagnosis (never a guess)."""
    assert diagnose("train", 1, "") is None
    assert diagnose("train", 1, "ValueError: something new") is None



def test_every_rule_scans_a_long_hostile_log_in_linear_time():
    """A log of 20,000 iteration lines and a 2 MB line without a space (a hostile or corrupt submission): every
    rule's pattern runs over it in seconds. `^.*(?:...)` and `\\S+\\.bin` patterns backtracked over every position
    of every line: 13 s for 16,000 ordinary lines, and no end in sight on one long line."""
    import time

    from harness.base.paths import RECORDED_LOGS

    log = (RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log").read_text()
    line = next(li for li in log.splitlines() if " iteration " in li and "lm loss" in li)
    text = log + "x" * (2 << 20) + "\n" + (line + "\n") * 20_000 + "Error: training ended\n"
    started = time.monotonic()
    found = diagnose("train", 1, text)
    took = time.monotonic() - started
    assert took < 20, f"diagnosing a {len(text) >> 20} MB log took {took:.0f} s: a rule's pattern backtracks"
    assert found is None or found.id != "data-missing", found
