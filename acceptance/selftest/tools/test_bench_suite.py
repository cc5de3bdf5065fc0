"""`python -m harness bench suite` on a tiny CPU session: the timeline, the waits, the reference run's parts, the
judging and the floor are all in its JSON."""

from __future__ import annotations

import io
import json

import pytest

from harness.tools import bench
from harness.run.runs import RunSpec

TINY = ("--device", "cpu", "--train-iters", "4", "--log-interval", "2", "--eval-interval", "2", "--eval-iters", "1",
        "--save-interval", "2", "--global-batch-size", "2", "--micro-batch-size", "1",
        "--seq-length", "128", "--max-position-embeddings", "128")  # short sequences, batches of 2: a quick CPU step
RUNS = (
    RunSpec("reference", "tiny CPU run", extra_args=TINY),
    RunSpec("resume", "tiny CPU resume from iteration 2", resume_from="reference",
            extra_args=TINY + ("--ckpt-step", "2", "--exit-interval", "2")),
    RunSpec("mutant-truncated-log", "reference log cut before `training ...`", derived_from="reference",
            derivation="truncate-log", expected_failures=frozenset({"training-started"})),
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = bench.suite(tmp_path_factory.mktemp("bench-suite"), specs=RUNS, stage_timeout_s=300, stream=io.StringIO(),
                      floor_probes=1)
    return json.loads(json.dumps(out))  # what the command writes: plain JSON


def test_wall_and_one_timeline_entry_per_stage(result):
    assert result["wall_s"] > 0
    assert 0 <= result["before_first_stage_s"] and result["session_s"] <= result["wall_s"]
    stages = [e["stage"] for e in result["timeline"]]
    assert sorted(stages) == sorted(["corpus", "preprocess", "samples", "train-reference", "train-resume",
                                     "inspect-reference", "inspect-resume"]), stages  # checkpoints: forked too
    for e in result["timeline"]:
        assert 0 <= e["start_s"] <= e["end_s"] <= result["wall_s"], e
        # an inspection exits 1 when it found problems (here: the tiny runs' 128 positions are not the course's 512)
        assert e["exit_code"] in ((0, 1) if e["stage"].startswith("inspect-") else (0,)), e


def test_waits_name_the_stage_waited_for(result):
    by = {e["stage"]: e for e in result["timeline"]}
    assert [w["on"] for w in by["preprocess"]["waits"]] == ["corpus"]
    assert [w["on"] for w in by["train-reference"]["waits"]] == ["preprocess"]
    assert [w["on"] for w in by["train-resume"]["waits"]] == ["preprocess", "train-reference"]
    resume_wait = by["train-resume"]["waits"][1]
    # the resume starts with the reference, sets up, then waits inside its stage for the reference's save
    assert by["train-resume"]["start_s"] < by["train-reference"]["end_s"]
    assert resume_wait["waited_s"] is not None and resume_wait["waited_s"] >= 0, resume_wait
    assert by["train-resume"]["start_s"] + resume_wait["waited_s"] <= resume_wait["ended_s"], resume_wait
    assert resume_wait["ended_s"] <= by["train-resume"]["end_s"], resume_wait


def test_reference_parts_add_up_to_at_most_its_stage(result):
    ref = result["reference"]
    parts = ref["parts_s"]
    assert parts is not None, ref.get("why_no_parts")
    assert all(v >= 0 for v in parts.values()), parts
    assert parts["interpreter_start_and_imports"] > 0 and parts["training"] > 0 and parts["saving"] > 0, parts
    assert parts["cuda_graph_capture"] == 0  # a CPU run captures nothing
    assert sum(parts.values()) <= ref["duration_s"] + 0.01, (sum(parts.values()), ref["duration_s"])
    assert 0 < ref["first_line_after_s"] <= ref["duration_s"]


def test_judging_is_timed_and_every_graded_run_judged(result):
    judging = result["judging_s"]
    assert 0 < judging["total_s"] <= result["wall_s"]
    assert judging["judge_s"] + judging["loss_curves_s"] + judging["report_s"] <= judging["total_s"] + 0.01
    assert set(result["verdicts"]) == {"reference", "mutant-truncated-log"}
    assert "training-started" in result["verdicts"]["mutant-truncated-log"]["failed"]


def test_floor_and_ratio(result):
    floor = result["floor"]
    assert floor["interpreter_imports_s"] > 0 and len(floor["probes_s"]) == 1 and floor["cuda_init_included"] is False
    assert floor["reference_iterations"] == 4 and floor["reference_ms_per_iter_median"] > 0
    # on the CPU no run is graphed, so the GPU compute is 0; the resume run's trained iterations are its own
    assert floor["graphed_iterations_total"] == sum(floor["graphed_iterations"].values())
    assert floor["gpu_compute_s"] == pytest.approx(
        floor["graphed_iterations_total"] * floor["step_ms_counted"] / 1000.0, abs=0.002)
    assert floor["floor_s"] == pytest.approx(floor["interpreter_imports_s"] + floor["gpu_compute_s"], abs=0.002)
    # the JSON rounds the ratio to 2 decimals: half a unit of that, whatever the ratio's size (0.37 against
    # 0.3662 failed a relative 1 %)
    assert result["wall_over_floor"] == pytest.approx(result["wall_s"] / result["floor_s"], abs=0.005 + 1e-9)
    # Not asserted: wall_over_floor > 1. The probe runs after the session, alone in its own interpreter, and on a
    # loaded 2-core machine one probe was measured slower than the whole forked session (0.39 in CI's script at
    # 2d5e498, while the torchrun self-tests ran): a statement about the machine's load, not about the code.
    assert result["wall_over_floor"] > 0


def test_human_table_names_every_stage_and_the_ratio(result):
    table = bench.format_suite(result)
    assert all(e["stage"] in table for e in result["timeline"])
    assert f"{result['wall_over_floor']}x" in table


def test_gpu_compute_counts_every_graphed_runs_trained_iterations_at_the_sessions_fastest_interval():
    from types import SimpleNamespace

    from harness.tools.bench import gpu_compute

    def outcome(summary, derived=None):
        return SimpleNamespace(summary=summary, spec=SimpleNamespace(derived_from=derived))

    ref = outcome({"cuda_graphs": True, "iterations": 200, "ms_per_iter_median": 9.0,
                   "ms_per_iter_intervals": [9.5, 9.0, 6.8]})
    session = SimpleNamespace(outcomes={
        "reference": ref,
        "resume": outcome({"cuda_graphs": True, "iterations": 110, "start_iteration": 100,
                           "ms_per_iter_intervals": [6.5]}),  # the fastest interval of the session
        "eager": outcome({"cuda_graphs": False, "iterations": 50}),
        "mutant-truncated-log": outcome(ref.summary, derived="reference")})
    got = gpu_compute(session, ref)
    assert got["graphed_iterations"] == {"reference": 200, "resume": 10}
    assert got["gpu_compute_s"] == pytest.approx(210 * 6.5 / 1000.0) and got["fastest_interval_ms"] == 6.5
    assert got["alone_ms_per_iter"] is None and got["step_ms_counted"] == 6.5


def test_gpu_compute_counts_at_the_solo_steps_time_when_there_is_one():
    """A full session shares the GPU all along (its fastest interval was 15 ms on the H200, twice the step alone):
    the solo-step run's median is the step time the floor counts."""
    from types import SimpleNamespace

    from harness.tools.bench import SOLO, gpu_compute

    def outcome(summary):
        return SimpleNamespace(summary=summary, spec=SimpleNamespace(derived_from=None))

    ref = outcome({"cuda_graphs": True, "iterations": 200, "ms_per_iter_median": 40.0, "ms_per_iter_intervals": [15.0]})
    solo = outcome({"cuda_graphs": True, "iterations": 60, "ms_per_iter_intervals": [7.0]})
    got = gpu_compute(SimpleNamespace(outcomes={"reference": ref, SOLO.name: solo}), ref, alone_ms=7.5)
    assert got["graphed_iterations"] == {"reference": 200}  # the solo run itself is not part of the session
    assert got["gpu_compute_s"] == pytest.approx(200 * 7.5 / 1000.0) and got["step_ms_counted"] == 7.5
    assert "solo" in got["step_from"]
