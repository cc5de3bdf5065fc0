"""Issue 42: the student's content decides the verdict, never the grader's error. Every arguments-block field the
criteria and the consistency checks read (found in the code, not listed by hand) given hostile values: the log is
judged (a verdict) within a budget, never an exception."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.base.paths import REPO, RECORDED_LOGS
from harness.evidence.logformat import COUNT_ARGUMENTS, OutOfRange, bounded_value, printed_value

COURSE_LOG = RECORDED_LOGS / "core_v0.16.1_h200_course_flags_binary_head.log"
READ = re.compile(r"""\.(?:argument|int_argument)\(\s*["']([a-z_0-9]+)["']""")


def fields_read() -> list:
    """Every name harness/judge and harness/evidence read from an arguments block (argument / int_argument)."""
    names = set()
    for folder in ("harness/judge", "harness/evidence"):
        for path in (REPO / folder).rglob("*.py"):
            names |= set(READ.findall(path.read_text()))
    return sorted(names)


FIELDS = fields_read()
COURSE_TEXT = COURSE_LOG.read_text()
PRINTED = {name for name in FIELDS if re.search(rf"(?m)^\s*{name} \.+ ", COURSE_TEXT)}

HOSTILE_NUMBERS = st.sampled_from(["0", "-1", "nan", "inf", "-inf", "1e20", "1e400", "-0.0", "100000000000000000000",
                                   str(2 ** 64), "9" * 39, "9" * 41, "1e-320", "True", "False", "None", "", "[]",
                                   "0x10", "1_000", "\u0661", "2.5", "-2147483649"])
VALUES = st.one_of(HOSTILE_NUMBERS, st.integers(-(10 ** 25), 10 ** 25).map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(max_size=30))


def test_the_field_list_comes_from_the_code():
    assert {"global_batch_size", "train_iters", "log_interval", "hysteresis", "loss_scale_window"} <= set(FIELDS)
    assert len(PRINTED) >= 20, PRINTED


def _edit(text: str, changes: dict) -> str:
    for name, value in changes.items():
        value = value.replace("\n", " ").replace("\r", " ")
        text = re.sub(rf"(?m)^(\s*{name} \.+ ).*$", lambda m: m.group(1) + value, text, count=1)
    return text


def _judge(text: str, tmp: Path):
    from harness.judge import consistency
    from harness.judge.profiles import load_profile
    from harness.judge.submission import evidence, judge_recorded

    path = tmp / "train.log"
    path.write_text(text, errors="surrogateescape")

    def over(*_):
        raise TimeoutError("over the 30 s budget")

    old = signal.signal(signal.SIGALRM, over)
    signal.alarm(30)
    try:
        ev = evidence(path)
        consistency.check_log(ev.log)
        return judge_recorded(load_profile("reference"), ev)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(changes=st.dictionaries(st.sampled_from(sorted(PRINTED)), VALUES, min_size=1, max_size=6))
def test_hostile_argument_values_are_a_verdict_never_an_exception(tmp_path_factory, changes):
    j = _judge(_edit(COURSE_TEXT, changes), tmp_path_factory.mktemp("v"))
    assert j.verdict in ("pass", "fail"), j.verdict


@pytest.mark.parametrize("name", sorted(PRINTED))
@pytest.mark.parametrize("value", ["0", "nan", "-inf", "1e20", "100000000000000000000"])
def test_each_field_alone_out_of_range(tmp_path, name, value):
    j = _judge(_edit(COURSE_TEXT, {name: value}), tmp_path)
    assert j.verdict in ("pass", "fail"), (name, value)


@given(name=st.sampled_from(sorted(set(FIELDS) | set(COUNT_ARGUMENTS))), text=VALUES)
def test_the_bounded_reader_returns_a_number_only_in_range(name, text):
    value = bounded_value(name, printed_value(text))
    if isinstance(value, float):
        assert value == value and abs(value) != float("inf")
    if isinstance(value, int) and not isinstance(value, bool):
        assert abs(value) <= 2 ** 63
        if name in COUNT_ARGUMENTS:
            assert COUNT_ARGUMENTS[name] <= value <= 10 ** 7
    if isinstance(value, OutOfRange):
        assert name in value.why
