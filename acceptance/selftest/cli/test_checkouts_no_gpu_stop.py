"""grade-checkouts and checkout mode that stops for want of a GPU: `pytest --megatron-lm PATH` on a machine without
a usable CUDA GPU now exits 3 before any test, with one line and a JUnit file of no test (conftest.py); the task is
still the grading machine's outcome (died, no-gpu), never the student's fail. The stub's gpu-stop behaviour
(checkout_stub.py) does what the suite does."""

from __future__ import annotations

import json

from test_grade_checkouts import grade_checkouts, grades, make_students


def test_a_task_stopped_for_want_of_a_gpu_is_the_graders_outcome(tmp_path, monkeypatch):
    monkeypatch.setenv("CHECKOUT_STUB_RUNS", str(tmp_path / "runs.jsonl"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    root = make_students(tmp_path / "class", {"alice": "gpu-stop", "bob": "pass"})
    out = tmp_path / "out"
    assert grade_checkouts(root, out, "--cluster", "local", "--gpus", "none", "--parallelism", "2") == 3
    by = grades(out)
    alice = by["alice"]
    assert alice["verdict"] == "died" and alice["diagnosis_id"] == "no-gpu", alice
    assert "no usable CUDA GPU on this machine" in alice["diagnosis"] and "fix:" in alice["diagnosis"], alice
    assert "no-criteria" not in json.dumps(alice) and by["bob"]["verdict"] == "pass", by


def test_exit_3_without_the_line_is_not_taken_for_a_missing_gpu():
    """Only the suite's own line with exit 3 is the machine's: another exit 3 stays a task error."""
    from harness.cli.cluster.task import _stopped_without_gpu

    line = "! _pytest.outcomes.Exit: bert-acceptance: `pytest -m gpu`: no usable CUDA GPU on this machine: gpu: x !"
    assert _stopped_without_gpu({"returncode": 3, "tail": "a\n" + line}).startswith("_pytest.outcomes.Exit")
    assert _stopped_without_gpu({"returncode": 3, "tail": "INTERNALERROR> boom"}) is None
    assert _stopped_without_gpu({"returncode": 1, "tail": line}) is None
