"""grade-checkouts keeps every task on a GPU slot of its own, on CPU with fake GPU lists.

The scheduler (checkouts.run_jobs) is driven by an in-process fake executor over hypothesis-generated GPU lists,
--parallelism, --tasks-per-gpu and free memory: never more tasks at once on a GPU than its slots, and every task
is given one. The local executor then runs the GPU-needing stub (checkout_stub.py STUB=gpu): more students than
GPUs all pass one after another, and a task that found no GPU is the grader's outcome (died, no-gpu, exit 3),
never the student's cannot-train.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.cli.cluster import checkouts, task
from harness.base.paths import REPO
from harness.judge.profiles import load_profile

from test_grade_checkouts import STUB_COMMAND, grade_checkouts, grades, make_students

GPU_IDS = st.lists(st.sampled_from([str(i) for i in range(8)]), unique=True, max_size=4)


class FakeJob:
    def __init__(self, spec, polls, log):
        self.spec, self.polls, self.log, self.job_id = spec, polls, log, f"job-{spec.student}"

    def done(self):
        self.polls -= 1
        if self.polls < 0:
            self.log.append(("end", self.spec.student, self.spec.env.get("CUDA_VISIBLE_DEVICES")))
            return True
        return False

    def result(self):
        return {"student": self.spec.student}


class FakeExecutor:
    cluster = "local"

    def __init__(self, polls):
        self.polls, self.log = polls, []

    def submit(self, fn, spec):
        self.log.append(("start", spec.student, spec.env.get("CUDA_VISIBLE_DEVICES")))
        return FakeJob(spec, self.polls.pop(0) if self.polls else 0, self.log)


@settings(max_examples=40, deadline=None)
@given(gpus=GPU_IDS, parallelism=st.one_of(st.none(), st.integers(1, 12)), per_gpu=st.integers(1, 3),
       free=st.floats(0, 40), students=st.integers(1, 9), polls=st.lists(st.integers(0, 3), max_size=9))
def test_never_more_tasks_on_a_gpu_than_its_slots(gpus, parallelism, per_gpu, free, students, polls, tmp_path_factory,
                                                   monkeypatch_module):
    out = tmp_path_factory.mktemp("out")
    specs = [task.TaskSpec(student=f"s{i}", checkout="-", task_dir="-", suite="-") for i in range(students)]
    state = {"students": {s.student: {} for s in specs}}
    executor = FakeExecutor(list(polls))
    args = SimpleNamespace(parallelism=parallelism, tasks_per_gpu=per_gpu, task_gpu_mem_gb=4.0)
    monkeypatch_module.setattr(checkouts, "gpu_free_memory_gb", lambda ids: dict.fromkeys(ids, free))
    checkouts.run_jobs(executor, specs, args, state, out, gpus)

    capacity, width, _ = checkouts.gpu_slots(gpus, parallelism, per_gpu, 4.0, dict.fromkeys(gpus, free))
    running: dict = {}
    for what, student, gpu in executor.log:
        if what == "start":
            assert (gpu in gpus) if gpus else gpu is None, (student, gpu)
            running[student] = gpu
            on_gpu = sum(1 for g in running.values() if g == gpu)
            assert not gpus or on_gpu <= capacity[gpu] <= per_gpu, (gpu, on_gpu, capacity)
            assert len(running) <= width
            assert not gpus or per_gpu > 1 or len(running) <= len(gpus)
        else:
            running.pop(student)
    assert all(e["status"] == checkouts.FINISHED for e in state["students"].values())


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkouts.time, "sleep", lambda s: None)
        yield mp


def test_slots_say_when_parallelism_is_capped_and_when_memory_limits_sharing():
    capacity, width, notes = checkouts.gpu_slots(["0"], 8)
    assert capacity == {"0": 1} and width == 1
    assert "--parallelism 8 capped at 1: 1 GPU(s) visible (0)" in notes[0] and "--tasks-per-gpu" in notes[0]
    capacity, width, notes = checkouts.gpu_slots(["0", "1"], None, per_gpu=4, need_gb=10, free_gb={"0": 25, "1": 139})
    assert capacity == {"0": 2, "1": 4} and width == 6
    assert any("GPU 0: 25.0 GB free holds 2 task(s) of 10 GB, not 4" in n for n in notes)


def _spans(path: Path) -> list[dict]:
    spans = Path(str(path) + ".spans")
    return [json.loads(line) for line in spans.read_text().splitlines()] if spans.is_file() else []


def test_more_students_than_gpus_run_one_per_gpu_and_all_pass(tmp_path, monkeypatch, capsys):
    runs = tmp_path / "runs.jsonl"
    monkeypatch.setenv("CHECKOUT_STUB_RUNS", str(runs))
    root = make_students(tmp_path / "class", {f"s{i}": "gpu" for i in range(3)})
    assert grade_checkouts(root, tmp_path / "out", "--cluster", "local", "--gpus", "0", "--parallelism", "8") == 0
    assert "--parallelism 8 capped at 1" in capsys.readouterr().out
    spans = sorted(_spans(runs), key=lambda s: s["start"])
    assert [s["gpu"] for s in spans] == ["0"] * 3
    assert all(a["end"] <= b["start"] for a, b in zip(spans, spans[1:]))     # one at a time on the one GPU
    assert all(g["verdict"] == "pass" for g in grades(tmp_path / "out").values())


def test_a_task_that_found_no_gpu_is_the_graders_outcome_not_the_students(tmp_path, monkeypatch):
    monkeypatch.setenv("CHECKOUT_STUB_RUNS", str(tmp_path / "runs.jsonl"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    root = make_students(tmp_path / "class", {"alice": "gpu", "bob": "gpu"})
    out = tmp_path / "out"
    assert grade_checkouts(root, out, "--cluster", "local", "--gpus", "none", "--parallelism", "2") == 3
    for name, grade in grades(out).items():
        assert grade["verdict"] == "died" and grade["diagnosis_id"] == "no-gpu", name
        assert "needs 1 CUDA GPU(s), found 0" in grade["diagnosis"] and "cannot-train" not in json.dumps(grade)
    assert "**DIED**" in (out / "grades.md").read_text()


def test_no_gpu_visible_runs_no_student(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CHECKOUT_STUB_RUNS", str(tmp_path / "runs.jsonl"))
    monkeypatch.setattr(checkouts, "local_gpus", lambda spec: [] if spec is None else checkouts.local_gpus(spec))
    root = make_students(tmp_path / "class", {"alice": "gpu"})
    assert grade_checkouts(root, tmp_path / "out", "--cluster", "local") == 3
    assert "shows no GPU" in capsys.readouterr().err and not (tmp_path / "runs.jsonl").exists()


def test_grade_from_task_reads_a_machine_fault_from_the_report_too(tmp_path, monkeypatch):
    monkeypatch.setenv("CHECKOUT_STUB_RUNS", str(tmp_path / "runs.jsonl"))
    checkout = make_students(tmp_path / "class", {"eve": "pass"}) / "eve" / "Megatron-LM"
    spec = task.TaskSpec(student="eve", checkout=str(checkout), task_dir=str(tmp_path / "t"), suite=str(REPO),
                         command=tuple(shlex.split(STUB_COMMAND)))
    result = task.run_task(spec)
    report = Path(result["report"])
    data = json.loads(report.read_text())
    data["runs"][0]["diagnosis"] = {"id": "no-gpu", "cause": "no usable CUDA GPU: torch cannot initialise CUDA",
                                    "remedy": "harness doctor"}
    report.write_text(json.dumps(data))
    grade = task.grade_from_task("eve", str(checkout), result, load_profile("megatron-lm")).to_dict()
    assert grade["verdict"] == "died" and grade["diagnosis_id"] == "no-gpu"
