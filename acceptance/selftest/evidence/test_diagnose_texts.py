"""Exact values of the diagnosis machinery and the small judge helpers beside it (harness.evidence.diagnose, junit,
memory_golden), written against their mutation survivors: which line is quoted, which fields fill a template,
which conditions hold at their edges, and the exact texts of the GPU-kind fallback."""

from __future__ import annotations

import json

import pytest

from harness.evidence import diagnose as dg
from harness.report import junit
from harness.judge import memory_golden

TEMPLATE = "stage={stage} how={how} duration={duration} last={last_line} evidence={evidence} rc={returncode} msg={message}"


def _probe(pattern=None, condition=None, stages=None):
    return dg.Rule("probe", stages, pattern, condition, TEMPLATE, "fix {evidence} {unknown}")


# ---- which line is quoted -------------------------------------------------------------------------------------

def test_search_quotes_the_whole_matching_line_and_nothing_after_it():
    assert dg._search(r"Boom", "first line\n  x Boom y  \nnext line\n") == ("x Boom y", {})
    assert dg._search(r"Boom", "x Boom y") == ("x Boom y", {})                      # no newline after it
    assert dg._search(r"(?P<w>B\w+)", "a\nBoom\nBang") == ("Boom", {"w": "Boom"})    # the first hit
    assert dg._search(r"(?P<w>B\w+)|(?P<v>Q)", "Boom") == ("Boom", {"w": "Boom"})    # unmatched groups left out
    assert dg._search(r"Boom", "nothing\nhere") is None


def test_search_prefers_the_exception_line_to_the_source_line_that_raised_it():
    text = '  File "x.py", line 3\n    raise Boom("a")\nBoom: a\n'
    assert dg._search(r"Boom", text) == ("Boom: a", {})
    only_source = '  File "x.py", line 3\n    raise Boom("a")\n    raise Boom("b")\n'
    assert dg._search(r"Boom", only_source) == ('raise Boom("a")', {})               # the first source line


# ---- templates --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("timed_out, stalled, how", [(False, False, ""), (True, False, "(timed out)"),
                                                      (False, True, "(stalled: no output)"),
                                                      (True, True, "(stalled: no output)")])
def test_every_template_field_is_filled(timed_out, stalled, how):
    d = dg.diagnose("train-x", 3, "start\nBoom here\n\n", timed_out, stalled, duration_s=12.4,
                    rules=[_probe(pattern="Boom")])
    assert d == dg.Diagnosis("probe", f"stage=train-x how={how} duration=12 s last=Boom here evidence=Boom here "
                                      "rc=3 msg=Boom here", "fix Boom here ?", "Boom here")
    d = dg.diagnose("train", None, "Boom", rules=[_probe(pattern="Boom")])
    assert "duration=an unknown time" in d.cause and "rc=None" in d.cause and d.summary() == f"{d.cause}: {d.remedy}"


def test_fill_replaces_named_placeholders_only():
    assert dg._fill("a {x} {y} {{z}} {} {x-y}", {"x": 1}) == "a 1 ? {?} {} {x-y}"


def test_rules_apply_by_stage_prefix_and_conditions_and_patterns_both_must_hold():
    rule = _probe(pattern="Boom", condition=lambda o: "cond", stages=("preprocess",))
    assert dg.diagnose("train", 1, "Boom", rules=[rule]) is None
    assert dg.diagnose("preprocess-b", 1, "Boom", rules=[rule]).evidence == "Boom"       # the pattern's line
    assert dg.diagnose("preprocess", 1, "Bang", rules=[rule]) is None
    assert dg.diagnose("x", 1, "Bang", rules=[_probe(condition=lambda o: None)]) is None
    assert dg.diagnose("x", 1, "Bang", rules=[_probe(condition=lambda o: ("ev", {"evidence": "F"}))]).cause.startswith(
        "stage=x how= duration=an unknown time last=Bang evidence=F")
    assert dg.match(_probe(condition=lambda o: "plain"), dg.StageOutput("x", 1, "")) == ("plain", {})


# ---- conditions at their edges ------------------------------------------------------------------------------------

def test_conditions():
    o = lambda text="", **kw: dg.StageOutput(kw.pop("stage", "train"), kw.pop("rc", 1), text, **kw)  # noqa: E731
    assert dg._in_preprocess(o(stage="preprocess-b")) == "preprocess"
    assert dg._in_preprocess(o("tools/preprocess_data.py line 3")) == "preprocess"
    assert dg._in_preprocess(o("train.py")) is None
    assert dg.first_python_error("x\n[rank0]: ChildFailedError: y\nValueError: bad\nKeyError: k") == "ValueError: bad"
    assert dg.first_python_error("torch.distributed.elastic.ChildFailedError: z") is None
    assert dg.first_python_error("[rank1]:  RuntimeError") == "RuntimeError"
    assert dg._exit_zero_without_outputs(o(rc=0, missing_outputs=("a.bin", "a.idx"))) == "missing after exit 0: a.bin, a.idx"
    assert dg._exit_zero_without_outputs(o(rc=1, missing_outputs=("a.bin",))) is None
    assert dg._exit_zero_without_outputs(o(rc=0)) is None
    assert dg._split_sentence_files(o(argv=("tool", "--split-sentences"))) == "--split-sentences in: tool --split-sentences"
    assert dg._split_sentence_files(o("wrote corpus_ss_3.jsonl done")) == "corpus_ss_3.jsonl"
    assert dg._split_sentence_files(o("corpus.jsonl")) is None
    both = dg._all(lambda _: "first", lambda _: "second")
    assert both(o()) == "second" and dg._all(lambda _: "first", lambda _: None)(o()) is None
    assert dg._all(lambda _: "", lambda _: "x")(o()) is None


def test_vocab_file_not_found_needs_a_vocab_path_or_a_tokenizer_in_the_traceback():
    """A vocab path, a tokenizer frame of the traceback, load_vocab named, or a preprocessing stage that builds a
    tokenizer."""
    line = "FileNotFoundError: [Errno 2] No such file or directory: '/data/my-VOCAB.txt' (x)"
    o = lambda text: dg.StageOutput("train", 1, text)  # noqa: E731
    assert dg._vocab_file_not_found(o(f"a\n  {line}  \nb")) == (line, {"path": "/data/my-VOCAB.txt"})
    other = "FileNotFoundError: [Errno 2] No such file or directory: '/data/corpus.bin'"
    assert dg._vocab_file_not_found(o(other)) is None
    assert dg._vocab_file_not_found(o(f"in load_vocab\n{other}")) == (other, {"path": "/data/corpus.bin"})
    # every training log says `> building ... tokenizer`: that alone does not make a missing file a vocab file
    assert dg._vocab_file_not_found(o(f"> building BertWordPieceLowerCase tokenizer ...\n{other}")) is None
    pre = dg.StageOutput("preprocess", 1, f"building Tokenizer\n{other}")
    assert dg._vocab_file_not_found(pre) == (other, {"path": "/data/corpus.bin"})
    # with a traceback, its frames decide: a tokenizer frame is a vocab load, a save is not
    frame = 'Traceback (most recent call last):\n  File "/m/megatron/training/{}", line 3, in {}\n    open(p)\n'
    assert dg._vocab_file_not_found(o(frame.format("tokenizer/bert_tokenization.py", "load") + other))
    assert dg._vocab_file_not_found(o(frame.format("training.py", "save") + other)) is None
    first_other_then_vocab = f"{other}\n{line}"
    assert dg._vocab_file_not_found(o(first_other_then_vocab))[1] == {"path": "/data/my-VOCAB.txt"}


def test_divergence_from_the_text_or_from_records_given():
    from harness.evidence import mutants
    from harness.evidence.logs import parse_log
    from harness.base.paths import RECORDED_LOGS

    healthy = (RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log").read_text()
    assert dg._diverged(dg.StageOutput("train", 0, healthy)) is None
    diverged = mutants.nan_at(120)(healthy)
    found = dg._diverged(dg.StageOutput("train", 0, diverged))
    assert found is not None and "iteration 1" in found, found
    given = tuple(parse_log(diverged).iterations)
    assert dg._diverged(dg.StageOutput("train", 0, "", iterations=given)) == found
    assert dg._diverged(dg.StageOutput("train", 0, "", iterations=())) is None
    assert dg._diverged(dg.StageOutput("train", 0, "no iteration lines")) is None


# ---- the JUnit reader --------------------------------------------------------------------------------------------

def test_junit_cases_without_classname_name_or_properties(tmp_path):
    (tmp_path / "j.xml").write_text('<testsuite><testcase><failure message="m">t</failure></testcase>'
                                    '<testcase classname="c" name="n"/></testsuite>')
    bare, named = junit.read(tmp_path / "j.xml")
    assert (bare.classname, bare.name, bare.properties, bare.test) == ("", "", {}, "::")
    assert (named.classname, named.name, named.test, named.outcome) == ("c", "n", "c::n", "passed")
    assert list(junit.load(tmp_path / "j.xml")) == ["::", "c::n"]


# ---- the GPU-kind fallback ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, slug", [("NVIDIA H200", "nvidia-h200"), (" -NVIDIA A100-SXM4-80GB- ", "nvidia-a100-sxm4-80gb"),
                                        (None, "unknown"), ("", "unknown"), ("--", "unknown")])
def test_slug(name, slug):
    assert memory_golden.slug(name) == slug


def test_select_texts_exactly(tmp_path):
    doc = {"own_band_mib": {"lo": 1, "hi": 2}}                     # no "gpu": the fallback's file name is named
    (tmp_path / f"{memory_golden.FALLBACK}.json").write_text(json.dumps(doc))
    got, why = memory_golden.select(None, folder=tmp_path)
    assert got == doc and why == (f"no calibration for this GPU (unknown.json absent): judged by the portable band "
                                  f"calibrated on {memory_golden.FALLBACK} ({memory_golden.FALLBACK}.json); run "
                                  "`python -m harness calibrate` once on this GPU kind to calibrate it")
    (tmp_path / "tesla-t4.json").write_text(json.dumps({"gpu": "Tesla T4", "own_band_mib": {"lo": 3, "hi": 4}}))
    got, why = memory_golden.select("Tesla T4", folder=tmp_path)
    assert got["own_band_mib"] == {"lo": 3, "hi": 4} and why == "calibrated on this GPU kind (tesla-t4.json)"
    assert memory_golden.select("X", folder=tmp_path / "none") == (
        None, f"no memory calibration in {tmp_path / 'none'} (neither x.json nor {memory_golden.FALLBACK}.json)")


def test_header_line_texts(monkeypatch):
    monkeypatch.setattr(memory_golden, "visible_gpu_name", lambda: None)
    assert memory_golden.header_line() == "memory band: no NVIDIA GPU visible (judged only in GPU runs)"
    monkeypatch.setattr(memory_golden, "select", lambda name: (None, "why not"))
    assert memory_golden.header_line("G") == "memory band for G: none (why not)"
    monkeypatch.setattr(memory_golden, "select", lambda name: ({"own_band_mib": {"lo": 5, "hi": 9}}, "why"))
    assert memory_golden.header_line("G") == "memory band for G: own memory [5, 9] MiB, why"


def test_version_note_names_only_what_differs():
    doc = {"provenance": {"versions": {"torch": "2.11", "cuda": "13.0"}}}
    assert memory_golden.version_note(doc, {"torch": "2.11", "cuda": "13.0"}) == ""
    assert memory_golden.version_note(doc, None) == "" and memory_golden.version_note({}, {"torch": "2.6"}) == ""
    assert memory_golden.version_note(doc, {"torch": "2.6", "cuda": "13.0"}) == (
        "; calibrated with other versions (torch 2.11 there, 2.6 here): the same band applies, and if a healthy run "
        "leaves it, run `python -m harness calibrate` on this machine")


# ---- written against the second run's survivors -------------------------------------------------------------------

def test_a_hang_in_the_second_dataset_build_after_a_first_one_finished():
    """A resumed run builds its datasets again: the hang is judged after the last marker, not the first."""
    text = f"{dg.DATASET_MARKER}\n{dg.DATASETS_DONE}\ntraining ...\n{dg.DATASET_MARKER}\nbuilding sample index\n"
    assert dg._hung_building_bert_datasets(dg.StageOutput("train", -1, text, timed_out=True)) == dg.DATASET_MARKER
    done = f"{dg.DATASET_MARKER}\nbuilding\n{dg.DATASET_MARKER}\n{dg.DATASETS_DONE}\n"
    assert dg._hung_building_bert_datasets(dg.StageOutput("train", -1, done, timed_out=True)) is None


def test_all_hands_the_outcome_to_every_condition():
    both = dg._all(lambda o: o.stage, lambda o: f"{o.returncode}")
    assert both(dg.StageOutput("train", 7, "")) == "7"


def test_a_rule_that_asks_nothing_quotes_the_last_line_and_the_table_refuses_one():
    assert dg.match(_probe(), dg.StageOutput("x", 1, "first\ntext\n")) == ("text", {})
    with pytest.raises(ValueError, match="nothing to match"):
        dg.rule_of({"id": "probe", "cause": "c", "remedy": "r"})


def test_an_optional_segment_is_kept_only_when_all_its_fields_are_known():
    assert dg._fill("a<< b {x}>><< c {y} {x}>> d", {"x": 1}) == "a b 1 d"
    assert dg._fill("<<{x}>>", {"x": ""}) == "" and dg._fill("<<plain>>", {}) == "plain"


def test_diagnose_judges_the_iterations_given_not_the_text():
    from harness.evidence import mutants
    from harness.evidence.logs import parse_log
    from harness.base.paths import RECORDED_LOGS

    healthy = (RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log").read_text()
    diverged = tuple(parse_log(mutants.nan_at(120)(healthy)).iterations)
    nan_rule = next(r for r in dg.RULES if r.id == "nan")
    assert dg.diagnose("train", 0, healthy, iterations=diverged, rules=[nan_rule]).cause_id == "nan"
    assert dg.diagnose("train", 0, healthy, rules=[nan_rule]) is None


def test_no_output_at_all_is_named_so():
    d = dg.diagnose("train", 1, "", rules=[_probe(condition=lambda o: o.last_line)])
    assert d.evidence == "(no output)" and "last=(no output)" in d.cause
    assert dg.diagnose("train", 1, None, rules=[_probe(condition=lambda o: o.last_line)]).evidence == "(no output)"


def test_the_fallback_names_the_gpu_it_was_calibrated_on(tmp_path):
    (tmp_path / f"{memory_golden.FALLBACK}.json").write_text(json.dumps({"gpu": "NVIDIA H200"}))
    assert "judged by the portable band calibrated on NVIDIA H200 (" in memory_golden.select("T4", folder=tmp_path)[1]


def test_junit_load_error_says_exactly_how_to_fix_it(tmp_path):
    from harness.base.errors import InputError

    with pytest.raises(InputError) as err:
        junit.load(tmp_path / "absent.xml")
    assert err.value.fix == "pass the file pytest --junitxml wrote" and err.value.path == str(tmp_path / "absent.xml")


def test_memory_golden_document_holds_what_calibration_measured():
    doc = memory_golden.document("NVIDIA H200", "9.0", {"1234": {"own": 1}}, {"lo": 1, "hi": 2}, {"date": "d"})
    assert doc == {"schema": 1, "gpu": "NVIDIA H200", "capability": "9.0", "own_band_mib": {"lo": 1, "hi": 2},
                   "samples": {"1234": {"own": 1}}, "provenance": {"date": "d"}}


class _FakeNvml:
    def __init__(self, count=1, name=b"NVIDIA H200", fail=False):
        self.count, self.name, self.fail, self.shut = count, name, fail, 0

    def nvmlInit(self):
        if self.fail:
            raise RuntimeError("no driver")

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i):
        assert i == 0
        return "h0"

    def nvmlDeviceGetName(self, handle):
        assert handle == "h0"
        return self.name

    def nvmlShutdown(self):
        self.shut += 1


@pytest.mark.parametrize("kwargs, name", [({}, "NVIDIA H200"), ({"name": "Tesla T4"}, "Tesla T4"),
                                          ({"count": 0}, None), ({"fail": True}, None)])
def test_visible_gpu_name_through_nvml(monkeypatch, kwargs, name):
    import sys

    fake = _FakeNvml(**kwargs)      # a fresh one per run: a test may run twice in one process (mutmut does)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert memory_golden.visible_gpu_name() == name
    assert fake.shut == (0 if fake.fail else 1)
