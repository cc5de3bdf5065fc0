"""Session fixtures: one preprocessing and one set of training runs per pytest session, shared by all tests.

Three ways to get the evidence, chosen by options:
  (default)            train now: corpus -> preprocess -> reference + resume (+ live mutants), on the GPU
  --reuse-run DIR      judge a run directory a previous session kept (session.json), no training
  --from-log LOG       judge a submitted Megatron log [+ --checkpoint-dir DIR], no GPU needed
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.judge import criteria, report

from harness import paths
from harness.drift import record_verdict
from harness.judge.judging import judge_verdict
from harness.options import setting
from harness.run.runs import session_runs


@dataclass(frozen=True)
class Settings:
    """The effective bert-acceptance settings of this pytest session."""

    run_dir: Path | None
    keep_run: bool
    profile: str
    vocab_file: Path
    reuse_run: Path | None
    from_log: Path | None
    checkpoint_dir: Path | None
    stage_timeout_s: float
    skip_mutants: bool


def _path(value) -> Path | None:
    return Path(value).expanduser().resolve() if value else None


@pytest.fixture(scope="session")
def settings(pytestconfig) -> Settings:
    get = lambda dest: setting(pytestconfig, dest)  # noqa: E731
    timeout = get("stage_timeout") or 300
    try:
        timeout = float(timeout)
    except ValueError:
        raise pytest.UsageError(f"Invalid --stage-timeout {timeout!r}: give seconds, e.g. --stage-timeout 300")
    return Settings(
        run_dir=_path(get("run_dir")), keep_run=bool(get("keep_run")), profile=get("criteria") or "reference",
        vocab_file=_path(get("vocab_file")) or paths.VOCAB_FILE, reuse_run=_path(get("reuse_run")),
        from_log=_path(get("from_log")), checkpoint_dir=_path(get("checkpoint_dir")), stage_timeout_s=timeout,
        skip_mutants=bool(get("skip_mutants")))


@pytest.fixture(scope="session")
def profile(settings) -> criteria.Profile:
    try:
        return criteria.load_profile(settings.profile)
    except criteria.CriteriaError as exc:
        raise pytest.UsageError(f"--criteria {settings.profile}: {exc}")


def _preflight(settings: Settings) -> None:
    """The doctor's hard requirements; one readable reason instead of twenty confusing errors."""
    from harness import doctor

    checks = doctor.run_checks(cpu_only=False, vocab_file=settings.vocab_file)
    failures = doctor.hard_failures(checks)
    if failures:
        pytest.exit("environment preflight failed (python -m harness doctor):\n" + doctor.format_table(failures),
                    returncode=3)


@pytest.fixture(scope="session")
def gpu_session(settings, request):
    """The Session whose runs every GPU test judges (trained now, or reloaded with --reuse-run)."""
    from harness.run.launch import progress_printer
    from harness.run.session import Session

    if settings.from_log:
        pytest.skip("--from-log judges one log: only the reference-run criteria apply")
    if setting(request.config, "megatron_lm"):
        pytest.skip("--megatron-lm grades a checkout (acceptance/test_checkout.py), not the reference trainer")
    if settings.reuse_run:
        return Session.load(settings.reuse_run)
    _preflight(settings)
    run_dir = settings.run_dir or paths.REPO / "runs" / time.strftime("%Y%m%d-%H%M%S")
    session = Session(run_dir, settings.vocab_file, settings.stage_timeout_s, on_line=progress_printer())
    started = time.monotonic()
    prepared = session.run_all(session_runs(with_mutants=not settings.skip_mutants), prepare=True)
    session.wall_s = time.monotonic() - started
    if not prepared.ok:
        pytest.fail("preprocessing failed, nothing was trained\n" + prepared.failure_message(), pytrace=False)
    session.dump()
    yield session
    if not (settings.keep_run or settings.run_dir) and request.session.testsfailed == 0:
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def verdicts_by_run(gpu_session, profile, settings) -> dict:
    """Every run judged against the profile; writes report.json / report.md into the run directory."""
    verdicts = {name: criteria.evaluate(profile, gpu_session.evidence(name))
                for name, outcome in gpu_session.outcomes.items() if name != "resume" and outcome.spec.graded}
    extra = {"wall_s": getattr(gpu_session, "wall_s", None),
             "stages": {n: round(s.duration_s, 2) for n, s in gpu_session.stages.items()}}
    report.write(gpu_session.run_dir, report.build(settings.profile, gpu_session.outcomes, verdicts, extra))
    return verdicts


@pytest.fixture(scope="session")
def reference_verdicts(settings, profile, request) -> dict:
    """criterion id -> Verdict for the run being graded (the reference run, or a submitted log)."""
    if settings.from_log:
        from harness.judge.checkpoints import inspect_save_dir

        evidence = criteria.evidence_from_log_file(settings.from_log)
        if settings.checkpoint_dir:
            from dataclasses import replace

            evidence = replace(evidence, checkpoints=inspect_save_dir(settings.checkpoint_dir))
        verdicts = criteria.evaluate(profile, evidence)
    else:
        verdicts = request.getfixturevalue("verdicts_by_run")["reference"]
    return {v.criterion_id: v for v in verdicts}


@pytest.fixture
def judge(reference_verdicts, profile, record_property):
    """judge(criterion_id): pass, fail with the verdict's message, or skip; the verdict goes into the JUnit XML."""

    def _judge(criterion_id: str):
        record_verdict(record_property, reference_verdicts.get(criterion_id))
        return judge_verdict(reference_verdicts, profile.name, criterion_id)

    return _judge
