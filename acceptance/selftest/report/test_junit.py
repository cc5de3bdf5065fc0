"""The one JUnit reader the drift job and the cluster grader share: outcomes, properties, and the failure text
both ways (the whole report for a grade, the first line for a drift table)."""

import pytest

from harness.base.errors import InputError
from harness.report import junit

XML = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="acceptance.test_course_checklist" name="test_criterion[final-loss]">
  <properties><property name="criterion" value="final-loss"/><property name="measured" value="8.84"/></properties>
</testcase>
<testcase classname="acceptance.test_course_checklist" name="test_criterion[no-nan]">
  <failure message="AssertionError: no-nan failed">line one
line two</failure></testcase>
<testcase classname="acceptance.test_course_checklist" name="test_criterion[recipe]"><error message="">  </error></testcase>
<testcase classname="b" name="test_gpu"><skipped message="needs 1 CUDA GPU"/></testcase>
</testsuite></testsuites>"""


def test_every_case_with_its_outcome_properties_and_text(tmp_path):
    (tmp_path / "j.xml").write_text(XML)
    cases = junit.read(tmp_path / "j.xml")
    assert [(c.name, c.outcome) for c in cases] == [("test_criterion[final-loss]", "passed"),
                                                  ("test_criterion[no-nan]", "failed"),
                                                  ("test_criterion[recipe]", "error"), ("test_gpu", "skipped")]
    ok, failed, error, skipped = cases
    assert ok.criterion == "final-loss" and ok.measured == "8.84" and ok.report == ""
    assert failed.report == "line one\nline two" and failed.message == "AssertionError: no-nan failed"
    assert failed.criterion == "acceptance.test_course_checklist::test_criterion[no-nan]"
    assert failed.measured == "AssertionError: no-nan failed"
    assert error.report == "" and error.message == "" and error.measured == "no measurement"
    assert skipped.report == "needs 1 CUDA GPU" and skipped.test == "b::test_gpu"
    assert list(junit.load(tmp_path / "j.xml")) == [c.test for c in cases]


def test_a_file_that_is_not_junit_names_itself_and_the_fix(tmp_path):
    (tmp_path / "j.xml").write_text("<testsuites><testcase")
    with pytest.raises(InputError) as err:
        junit.load(tmp_path / "j.xml")
    assert "j.xml" in str(err.value) and "--junitxml" in str(err.value)
