"""The session plumbing on CPU, through the fork server and the shared sample cache as `pytest -m gpu` runs it:
preprocessing beside training, resume after the source's save, derived mutants,
broken resumes, evidence, report files and the --reuse-run round trip (session.json).

Dropout stays on (0.1, the course's): the exact resume below holds because the RNG state is checkpointed."""

from __future__ import annotations

import json

import pytest

from harness.judge import criteria
from harness.report import session_report as report
from harness.run.runs import RunSpec
from harness.run.session import Session
from harness.judge.profiles import FAIL, PASS, load_profile

# Batches of 2 in micro-batches of 1: the smallest that still accumulates two micro-batches, and a fifth less CPU
# for this file than batches of 4 in 2 (with test_bench_suite: 32-36 s against 41-42 s, two interleaved pairs).
TINY = ("--device", "cpu", "--train-iters", "4", "--log-interval", "2", "--eval-interval", "2", "--eval-iters", "1",
        "--save-interval", "2", "--global-batch-size", "2", "--micro-batch-size", "1")
RESUME_AT_2 = TINY + ("--ckpt-step", "2", "--exit-interval", "2")
pytestmark = pytest.mark.slow   # one module fixture trains five tiny runs on CPU

RUNS = (
    RunSpec("reference", "tiny CPU run", extra_args=TINY),
    RunSpec("resume", "tiny CPU resume from iteration 2", extra_args=RESUME_AT_2, resume_from="reference"),
    RunSpec("mutant-resume-data-restart", "resume reading the data from sample 0",
            extra_args=RESUME_AT_2 + ("--inject-data-restart",), resume_from="reference", save=False,
            expected_failures=frozenset({"resume-matches"})),
    # control, not graded: without the RNG state other dropout masks move the resumed loss (4e-3 here, where a
    # batch of two sequences averages few tokens; ~5e-4 with batches of four): it shows the RNG state matters
    RunSpec("resume-no-rng", "resume without the RNG state (--no-load-rng): other dropout masks",
            extra_args=RESUME_AT_2 + ("--no-load-rng",), resume_from="reference", save=False, graded=False),
    RunSpec("reference-b", "tiny CPU run of recipe (b): one-line documents, --bert-no-binary-head", extra_args=TINY,
            save=False, recipe="b"),
    RunSpec("mutant-truncated-log", "reference log cut before `training ...`", derived_from="reference",
            derivation="truncate-log", expected_failures=frozenset({"training-started"})),
)


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> Session:
    s = Session(tmp_path_factory.mktemp("session"), stage_timeout_s=300, fork_server=True)  # as pytest -m gpu runs
    prepared = s.run_all(RUNS, prepare=True)
    assert prepared.ok, prepared.failure_message()
    return s


def test_every_trained_run_exits_0(session):
    for name in ("reference", "resume"):
        stage = session.outcomes[name].stage
        assert stage is not None and stage.ok, stage.failure_message() if stage else f"{name} never ran"


def test_resume_continues_the_reference_run(session):
    """The resumed run's first loss matches the uninterrupted run at iteration 4 (same data order, CPU)."""
    verdicts = {v.criterion_id: v for v in criteria.evaluate(load_profile("reference"),
                                                             session.evidence("reference"))}
    assert verdicts["resume-matches"].status == PASS, verdicts["resume-matches"].message


def test_resume_is_bit_identical_with_dropout(session):
    """RNG, optimizer, scaler, schedule and data position restored: iteration 4 repeats to the last printed digit;
    the same resume without the RNG state draws other dropout masks and does not."""
    reference, resumed, no_rng = (session.evidence(n).log for n in ("reference", "resume", "resume-no-rng"))
    fields = lambda log: [(r.iteration, r.lm_loss, r.sop_loss, r.grad_norm) for r in log.iterations  # noqa: E731
                          if r.iteration == 4]
    assert fields(resumed) == fields(reference) and fields(reference), (fields(reference), fields(resumed))
    assert fields(no_rng) and fields(no_rng) != fields(reference), (fields(reference), fields(no_rng))


@pytest.mark.parametrize("name", ["mutant-resume-data-restart"])
def test_broken_resume_fails_only_resume_matches(session, name):
    """A broken resume is judged as the reference run resumed by it: resume-matches is the one new failure."""
    profile = load_profile("reference")
    failed = lambda run: {v.criterion_id for v in criteria.evaluate(profile, session.evidence(run))  # noqa: E731
                          if v.status == FAIL}
    verdict = {v.criterion_id: v for v in criteria.evaluate(profile, session.evidence(name))}["resume-matches"]
    assert failed(name) - failed("reference") == {"resume-matches"}, verdict.message
    assert "off by" in verdict.measured
    # the reference keeps the good resume as its own resumed log, whatever order the runs are listed in
    assert session.evidence("reference").resume_log.lm_losses == session.evidence("resume").log.lm_losses


def test_evidence_records_device_and_checkpoints(session):
    ev = session.evidence("reference")
    assert ev.device == "cpu" and ev.exit_code == 0
    assert ev.checkpoints.iterations == (2, 4) and ev.checkpoints.loaded and ev.checkpoints.shapes_ok


def test_derived_truncated_log_fails_the_start_line(session):
    verdicts = criteria.evaluate(load_profile("reference"), session.evidence("mutant-truncated-log"))
    failed = {v.criterion_id for v in verdicts if v.status == FAIL}
    assert "training-started" in failed and "datasets-built" not in failed


def test_report_files_are_written(session):
    verdicts = {n: criteria.evaluate(load_profile("reference"), session.evidence(n))
                for n in ("reference", "mutant-truncated-log")}
    json_path, md_path = report.write(session.run_dir, report.build("reference", session.outcomes, verdicts))
    data = json.loads(json_path.read_text())
    assert [r["name"] for r in data["runs"]] == ["reference", "mutant-truncated-log"]
    assert "| resume-matches | pass |" in md_path.read_text()


def test_reuse_run_round_trip(session):
    """session.json reloads into the same evidence (what --reuse-run judges)."""
    session.dump()
    again = Session.load(session.run_dir)
    before, after = session.evidence("reference"), again.evidence("reference")
    assert after.exit_code == before.exit_code and after.device == before.device
    assert after.log.lm_losses == before.log.lm_losses and after.resume_log is not None


def test_corrupt_checkpoint_derivation_breaks_a_copy(session, tmp_path):
    """The corrupt-checkpoint mutant cuts a shard of the last iteration in a copy; the original stays loadable."""
    from harness.run.outcomes import DERIVATIONS, RunOutcome

    base = session.outcomes["reference"]
    outcome = RunOutcome(RunSpec("mutant-corrupt-checkpoint", "test", derived_from="reference",
                                 derivation="corrupt-checkpoint"))
    DERIVATIONS["corrupt-checkpoint"](base, outcome, tmp_path)
    broken, original = session.checkpoints(outcome), session.checkpoints(base)
    assert not broken.loaded and broken.problems and original.loaded


def test_recipe_b_trains_on_its_own_one_line_corpus(session):
    """Recipe (b) gets its own corpus and .bin/.idx, its log says --bert-no-binary-head, and the judge sees (b)."""
    outcome = session.outcomes["reference-b"]
    assert outcome.stage is not None and outcome.stage.ok, outcome.stage.failure_message() if outcome.stage else ""
    assert "--bert-no-binary-head" in outcome.stage.argv
    assert str(session.data_prefix_for("b")) in outcome.stage.argv and session.data_prefix_for("b") != session.data_prefix
    judged = criteria.judge(load_profile("reference"), session.evidence("reference-b"))
    assert judged.recipe == "b", judged.recipe_how


def test_checkpoints_are_inspected_in_a_fork_of_the_server(session):
    """The inspection runs as its own stage (megatron-core stays out of the session's process) and reports what
    inspecting in this process reports."""
    from harness.evidence.checkpoints.model_shapes import course_model
    from harness.evidence.checkpoints.inspector import inspect_save_dir

    stage = session.stages.get("inspect-reference")
    assert stage is not None and stage.ok, stage.failure_message() if stage else "no inspect-reference stage"
    outcome = session.outcomes["reference"]
    assert outcome.checkpoint_report == inspect_save_dir(outcome.save_dir, course_model())


def test_checkpoints_are_inspected_once_the_last_iteration_is_saved(tmp_path, monkeypatch):
    """The inspection starts when the tracker names --train-iters, before the run ends; a run that ends first
    (stopped early: the tracker never gets there) gets None, and is inspected after it ended."""
    import threading
    import time

    s = Session(tmp_path)
    spec = RunSpec("reference", "tiny", extra_args=TINY)  # --train-iters 4
    monkeypatch.setattr(Session, "_inspect", lambda self, spec, save_dir: ("inspected", save_dir))
    ended = threading.Event()
    early = s._inspect_when_saved(spec, ended)
    s.save_dir(spec).mkdir(parents=True)
    tracker = s.save_dir(spec) / "latest_checkpointed_iteration.txt"
    tracker.write_text("2")
    time.sleep(0.3)  # six polls of the tracker
    assert not early.done(), "inspected before the last save"
    tracker.write_text("4")
    assert early.result(timeout=10) == ("inspected", s.save_dir(spec))
    assert not ended.is_set()

    stopped = s._inspect_when_saved(RunSpec("mutant-stopped", "stops at 2", extra_args=TINY), ended)
    ended.set()
    assert stopped.result(timeout=10) is None


def test_no_save_mutant_is_the_reference_without_its_checkpoints(session, tmp_path):
    """mutant-no-save, derived: the reference's log without its save lines and with `save` None in the
    arguments block, and no checkpoint folder, so exactly the checkpoint criteria fail."""
    from harness.evidence.logs import parse_log_file
    from harness.run.runs import CHECKPOINTS
    from harness.run.outcomes import RunOutcome, _without_save

    base = session.outcomes["reference"]
    outcome = RunOutcome(RunSpec("mutant-no-save", "derived", derived_from="reference", derivation="no-save",
                                 expected_failures=CHECKPOINTS))
    outcome.save_dir = base.save_dir
    text = _without_save(base, outcome, tmp_path)
    original = base.stage.log_path.read_text()
    assert "saving checkpoint at iteration" in original and "saving checkpoint" not in text
    assert "successfully saved checkpoint" not in text
    assert outcome.save_dir is None
    (tmp_path / "derived.log").write_text(text)
    before, after = parse_log_file(base.stage.log_path), parse_log_file(tmp_path / "derived.log")
    assert before.checkpoints and not after.checkpoints
    assert before.arguments["save"] == str(base.save_dir) and after.arguments["save"] == "None"
    assert len(after.iterations) == len(before.iterations) and after.lines_total == before.lines_total - len(
        before.checkpoints)  # a saving line and a saved line per save
    report = session.checkpoints(outcome)
    assert report.problems and "no --save" in report.problems[0]
