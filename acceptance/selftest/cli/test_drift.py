"""Self-tests of the nightly drift job: JUnit properties, harness.cli.drift's comparison, and the workflow file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.cli import drift
from harness.base.paths import FIXTURES, REPO
from harness.judge.profiles import load_profile

WORKFLOW = REPO / ".github" / "workflows" / "gpu-nightly.yml"
RECORDED_LOG = FIXTURES / "logs" / "core_v0.16.1_h200_course_flags_binary_head.log"


def _junit(path: Path, cases: list[tuple[str, str, dict]]) -> Path:
    """A JUnit file as pytest writes it: (name, outcome, properties) per test case."""
    body = []
    for name, outcome, props in cases:
        inner = "".join(f'<property name="{k}" value="{v}"/>' for k, v in props.items())
        inner = f"<properties>{inner}</properties>" if inner else ""
        if outcome == "failed":
            inner += '<failure message="FAIL: final lm loss out of band">details</failure>'
        elif outcome == "skipped":
            inner += '<skipped message="not measurable here"/>'
        body.append(f'<testcase classname="acceptance.test_course_checklist" name="{name}">{inner}</testcase>')
    path.write_text('<?xml version="1.0"?><testsuites><testsuite name="pytest">' + "".join(body)
                    + "</testsuite></testsuites>")
    return path


def _verdict(criterion: str, measured: str) -> dict:
    return {"criterion": criterion, "status": "pass", "measured": measured, "expected": "[8.0, 8.3]"}


@pytest.fixture
def pinned_and_newest(tmp_path):
    """Two runs: final-loss moves out of its band in the newest; first-loss passes in both."""
    a = _junit(tmp_path / "a.xml", [("test_first", "passed", _verdict("first-loss", "10.35 at iteration 20")),
                                    ("test_final", "passed", _verdict("final-loss", "8.1591 at iteration 200"))])
    moved = dict(_verdict("final-loss", "8.4100 at iteration 200"), status="fail")
    b = _junit(tmp_path / "b.xml", [("test_first", "passed", _verdict("first-loss", "10.35 at iteration 20")),
                                    ("test_final", "failed", moved)])
    return a, b


def test_the_message_names_the_version_that_moved_the_criterion(pinned_and_newest):
    a, b = (drift.load_junit(p) for p in pinned_and_newest)
    lines = drift.compare("pinned (torch 2.11)", a, "newest (torch 2.13)", b)
    assert lines == [drift.MOVED.format(criterion="final-loss", bad="newest (torch 2.13)", outcome="failed",
                                        bad_measured="8.4100 at iteration 200", good="pinned (torch 2.11)",
                                        good_outcome="passed", good_measured="8.1591 at iteration 200",
                                        expected="[8.0, 8.3]")]


def test_a_criterion_failing_in_both_runs_is_not_called_drift(tmp_path):
    case = [("test_final", "failed", _verdict("final-loss", "9.0"))]
    a, b = drift.load_junit(_junit(tmp_path / "a.xml", case)), drift.load_junit(_junit(tmp_path / "b.xml", case))
    assert drift.compare("a", a, "b", b) == [drift.BOTH.format(criterion="final-loss", a_measured="9.0",
                                                               b_measured="9.0")]


def test_a_failure_without_properties_is_named_by_its_test(tmp_path):
    a = drift.load_junit(_junit(tmp_path / "a.xml", [("test_can_train_here", "passed", {})]))
    b = drift.load_junit(_junit(tmp_path / "b.xml", [("test_can_train_here", "failed", {})]))
    (line,) = drift.compare("a", a, "b", b)
    assert line.startswith("acceptance.test_course_checklist::test_can_train_here: b failed (FAIL: final lm loss")


def test_command_exits_1_with_error_lines_and_a_step_summary(pinned_and_newest, tmp_path, capsys, monkeypatch):
    a, b = pinned_and_newest
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    assert drift.main([f"pinned (x=1)={a}", f"newest={b}", "--markdown", str(tmp_path / "drift.md")]) == 1
    out = capsys.readouterr().out
    assert "::error title=bert-acceptance drift::final-loss: newest failed" in out
    assert "| final-loss | passed: 8.1591 at iteration 200 | failed: 8.4100 at iteration 200 |" in out
    assert (tmp_path / "drift.md").read_text() in out and "final-loss" in (tmp_path / "summary.md").read_text()


def test_command_exits_0_when_both_runs_pass(pinned_and_newest, capsys):
    a, _ = pinned_and_newest
    assert drift.main([f"a={a}", f"b={a}"]) == 0
    assert "every test passed in both runs" in capsys.readouterr().out


@pytest.mark.parametrize("make, problem", [
    (lambda tmp: [f"a={tmp / 'absent.xml'}", f"b={tmp / 'absent.xml'}"], "absent.xml: cannot read JUnit XML"),
    (lambda tmp: ["no-label", "b=x.xml"], "expected LABEL=JUNIT.xml, got 'no-label'"),
])
def test_bad_input_exits_2_naming_the_cause(tmp_path, capsys, make, problem):
    assert drift.main(make(tmp_path)) == 2
    assert problem in capsys.readouterr().err


def test_versions_label_names_torch_and_megatron_core():
    label = drift.versions_label("pinned")
    assert re.fullmatch(r"pinned \(torch \S+, megatron-core \S+\)", label) and "absent" not in label


@pytest.mark.slow
def test_checklist_tests_write_each_verdict_into_the_junit_xml(tmp_path):
    junit = tmp_path / "junit.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                           str(REPO / "acceptance" / "test_course_checklist.py"), "--from-log", str(RECORDED_LOG),
                           f"--junitxml={junit}"], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, done.stdout[-3000:]
    cases = [c for c in drift.load_junit(junit).values() if c.outcome == "passed"]
    from harness.judge.submission import judge_submission

    verdicts = {v.criterion_id: v for v in judge_submission(load_profile("reference"), RECORDED_LOG).verdicts}
    assert cases and all(set(drift.PROPERTIES[:4]) <= set(c.properties) <= set(drift.PROPERTIES) for c in cases)
    for case in cases:
        verdict = verdicts[case.criterion]
        assert (case.properties["status"], case.properties["measured"]) == (verdict.status, verdict.measured)
        number = drift.NUMBER.search(verdict.measured)
        assert case.properties.get("value") == (str(float(number[0])) if number else None), case.properties


# ---------------------------------------------------------------- the workflow file


@pytest.fixture(scope="module")
def workflow() -> dict:
    """.github/workflows/gpu-nightly.yml, parsed (YAML 1.1 reads the key `on` as True)."""
    doc = yaml.safe_load(WORKFLOW.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))
    return doc


def _steps(workflow) -> list[dict]:
    return workflow["jobs"]["drift"]["steps"]


def test_workflow_runs_nightly_and_on_demand_on_a_self_hosted_gpu_runner(workflow):
    assert set(workflow["on"]) == {"schedule", "workflow_dispatch"}
    assert len(workflow["on"]["schedule"][0]["cron"].split()) == 5
    runner = workflow["jobs"]["drift"]["runs-on"]
    assert "self-hosted" in runner and "gpu" in runner and workflow["jobs"]["drift"]["timeout-minutes"] <= 90


def test_workflow_runs_pytest_gpu_pinned_then_newest_with_junit(workflow):
    runs = [s.get("run", "") for s in _steps(workflow)]
    gpu = [r for r in runs if "pytest -m gpu" in r]
    assert len(gpu) == 2 and all("--junitxml=runs/" in r and "--keep-run" in r for r in gpu)
    assert "$PINNED" in gpu[0] and "megatron-core==0.16.1" in workflow["env"]["PINNED"]
    assert "--upgrade --upgrade-strategy eager -e \".[test]\"" in gpu[1]
    assert all(s.get("continue-on-error") for s in _steps(workflow) if "pytest -m gpu" in s.get("run", ""))


def test_workflow_compares_the_two_runs_and_uploads_the_evidence(workflow):
    steps = _steps(workflow)
    compare = next(s for s in steps if "python -m harness drift \"$PINNED_LABEL=" in s.get("run", ""))
    upload = next(s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert compare["if"] == "always()" and upload["if"] == "always()"
    paths = upload["with"]["path"].split()
    assert {"runs/*/junit.xml", "runs/*/report.md", "runs/*/report.json", "runs/**/*.png", "runs/drift.md"} <= set(
        paths)
    for name in ("runs/pinned/junit.xml", "runs/newest/junit.xml"):
        assert name in compare["run"] and any(name in s.get("run", "") for s in steps if s is not compare)


def test_workflow_runs_the_release_matrix_and_compares_it_with_the_committed_one(workflow):
    steps = _steps(workflow)
    step = next(s for s in steps if "python -m harness matrix" in s.get("run", ""))
    assert step["if"] == "always()" and "--checkouts .megatron --out runs/matrix" in step["run"]
    assert "--compare results/matrix/matrix.json" in step["run"] and "core_v0\\.(1[6-9]" in step["run"]
    paths = next(s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact"))["with"]["path"]
    assert {"runs/matrix/matrix.md", "runs/matrix/matrix.json", "runs/matrix/artifacts/**"} <= set(paths.split())
    from harness.__main__ import SUBCOMMANDS

    assert SUBCOMMANDS["matrix"][0] == "harness.cli.matrix"
