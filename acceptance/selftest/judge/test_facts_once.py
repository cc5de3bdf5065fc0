"""Each fact about a log is computed once per judged log and carried on it (ParsedLog.fact): the recipe it ran, its
run's end, whether it diverged, its failure events, each argument's printed value; its wrapping once per file read.
Counted by patching each computation with a counter while a real log is read and judged, under every profile."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest

from harness.base.paths import FIXTURES
from harness.evidence import failure_events, fp16, logformat, logread, logs, recipe
from harness.evidence.logformat import printed_value
from harness.judge.profiles import load_profile
from harness.judge.submission import evidence, judge_recorded

PROFILES = ("reference", "course", "megatron-lm")
PLAIN = FIXTURES / "logs" / "runs-h200" / "core_v0.16.1-plain-s1234.log.gz"
KILLED = FIXTURES / "failures" / "real-h200" / "core_v0.16.1-kill-it130-s1234.log.gz"
CASES = {  # name: (log, --save folder, whether the run failed: its failure events are read)
    "complete": (PLAIN, None, False),
    "complete with its --save folder": (PLAIN, FIXTURES / "checkpoints" / "core_v0.16.1", False),
    "killed at iteration 130": (KILLED, None, True),
}
# what is computed -> (module, the function that computes it)
COMPUTED = {
    "recipe": (recipe, "_detect_recipe"),
    "run end": (logs, "_run_end"),
    "divergence": (fp16, "divergence"),
    "failure events": (failure_events, "events"),
    "wrapping": (logread, "detect_wrappers"),
}


def _counted(monkeypatch) -> Counter:
    calls = Counter()
    for what, (module, name) in COMPUTED.items():
        real = getattr(module, name)

        def counting(*args, _real=real, _what=what, **kwargs):
            calls[_what] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counting)
    return calls


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("case", CASES)
def test_each_fact_is_computed_once_per_judged_log(monkeypatch, case, profile):
    log, save, failed = CASES[case]
    prof = load_profile(profile)
    calls = _counted(monkeypatch)
    judged = judge_recorded(prof, evidence(log, save))
    assert (judged.diagnosis is not None) == (judged.verdict == "fail")    # no FAIL without a root cause
    assert failed <= (judged.verdict == "fail")
    assert dict(calls) == {"recipe": 1, "run end": 1, "divergence": 1, "wrapping": 1,
                           **({"failure events": 1} if failed else {})}


def test_each_argument_is_read_once_per_log(monkeypatch):
    """The arguments block's values are read through one parser (printed_value), once per name and log, however
    many readers (the recipe detection, the consistency checks, the log's evidence) ask."""
    names = Counter()
    real = logformat.printed_value
    monkeypatch.setattr(logformat, "printed_value", lambda text: (names.update([text]), real(text))[1])
    ev = evidence(PLAIN)
    judge_recorded(load_profile("megatron-lm"), ev)
    read = {key[1] for key in ev.log.__dict__["_facts"] if key[0] == "argument"}   # names asked for, printed or not
    assert {"global_batch_size", "lr", "hidden_size", "micro_batch_size", "log_interval", "fp16"} <= read
    assert sum(names.values()) == len(read)
    again = ev.log.argument("global_batch_size")
    assert again == 16 and sum(names.values()) == len(read)


def test_an_edited_log_starts_with_no_facts():
    """A log changed with dataclasses.replace is another log: its facts are its own, computed again."""
    log = evidence(PLAIN).log
    assert logs.run_end(log).complete and logs.run_end(log) is logs.run_end(log)
    cut = replace(log, iterations=log.iterations[:5], validations=(), checkpoints=())   # stopped after 5 lines
    assert not logs.run_end(cut).complete
    assert logs.run_end(log).complete and log == evidence(PLAIN).log      # the facts are no part of equality


@pytest.mark.parametrize("text, value", [
    ("True", True), ("False", False), ("None", None), (None, None), ("16", 16), ("-3", -3), ("1e-4", 1e-4),
    ("0.0001", 1e-4), ("nan", math.nan), (" 4 ", 4), ("linear", "linear"), ("true", "true"), ("", ""),
    ("[0.9, 0.999]", "[0.9, 0.999]"), ("1" * 41, "1" * 41), ("1" * 40, int("1" * 40)),
])
def test_printed_values(text, value):
    got = printed_value(text)
    assert type(got) is type(value)
    assert got == value or (isinstance(value, float) and math.isnan(value) and math.isnan(got))
