"""Session fixtures: one preprocessing and one set of training runs per pytest session, shared by all tests.

Three ways to get the evidence, chosen by options:
  (default)            train now: corpus -> preprocess -> reference + resume (+ live mutants), on the GPU
  --reuse-run DIR      judge a run directory a previous session kept (session.json), no training
  --from-log LOG       judge a submitted Megatron log [+ --checkpoint-dir DIR], no GPU needed
"""

from __future__ import annotations

import shutil
import time

import pytest

from harness.cli.drift import record_verdict
from harness.report import plot
from harness.report.session_verdicts import draw_loss_curves, judge_runs, write_report
from harness.plugin.judging import judge_verdict
from harness.plugin.options import Settings, settings_of
from harness.run.runs import session_runs
from harness.judge.profiles import Profile, load_profile


@pytest.fixture(scope="session")
def settings(pytestconfig) -> Settings:
    """The options, checked once at start-up by the root conftest (a bad value never reaches a test)."""
    return settings_of(pytestconfig)


@pytest.fixture(scope="session")
def profile(settings) -> Profile:
    return load_profile(settings.profile)


def _preflight(settings: Settings) -> None:
    """The doctor's hard requirements; one readable reason instead of twenty confusing errors."""
    from harness.cli import doctor

    checks = doctor.run_checks(cpu_only=False, vocab_file=settings.vocab_file)
    failures = doctor.hard_failures(checks)
    if failures:
        pytest.exit("environment preflight failed (python -m harness doctor):\n" + doctor.format_table(failures),
                    returncode=3)


@pytest.fixture(scope="session")
def gpu_session(settings, request):
    """The Session whose runs every GPU test judges (trained now, or reloaded with --reuse-run)."""
    from harness.plugin.options import EARLY_FORK_KEY, FAST_EXIT_KEY
    from harness.run.launch import progress_printer
    from harness.run.session import Session, default_run_dir

    if settings.from_log:
        pytest.skip("--from-log judges one log: only the reference-run criteria apply")
    if settings.megatron_lm:
        pytest.skip("--megatron-lm grades a checkout (acceptance/test_checkout.py), not the reference trainer")
    if settings.reuse_run:
        yield Session.load(settings.reuse_run)
        return
    # the fork server started at pytest start-up (root conftest) imports torch and megatron-core meanwhile
    early = request.config.stash.get(EARLY_FORK_KEY, None)
    run_dir = early.run_dir if early else settings.run_dir or default_run_dir()
    session = Session(run_dir, settings.vocab_file, settings.stage_timeout_s, on_line=progress_printer(),
                      fork_server=early.take() if early else settings.fork_server)
    try:
        _preflight(settings)
    except BaseException:
        session.close()
        raise
    started = time.monotonic()
    plot.preload_in_background()  # while the session waits for the fork server's imports
    prepared = session.run_all(session_runs(with_mutants=not settings.skip_mutants), prepare=True)
    session.wall_s = time.monotonic() - started
    request.config.stash[FAST_EXIT_KEY] = settings.fast_exit  # a trained session: end the process once pytest is done
    if not prepared.ok:
        pytest.fail("preprocessing failed, nothing was trained\n" + prepared.failure_message(), pytrace=False)
    session.dump()
    yield session
    if not (settings.keep_run or settings.run_dir) and request.session.testsfailed == 0:
        shutil.rmtree(run_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def judgements(gpu_session, profile, settings) -> dict:
    """Every graded run judged against its recipe's variant of the profile (a live run: unmeasured = failed);
    writes report.json / report.md and one loss-curve picture per run into the run directory."""
    judged = judge_runs(gpu_session, profile)
    write_report(gpu_session, settings.profile, judged, draw_loss_curves(gpu_session, profile, judged))
    return judged


@pytest.fixture(scope="session")
def verdicts_by_run(judgements) -> dict:
    """run name -> its verdicts, in profile order."""
    return {name: list(j.verdicts) for name, j in judgements.items()}


@pytest.fixture(scope="session")
def reference_verdicts(settings, profile, request) -> dict:
    """criterion id -> Verdict for the run being graded (the reference run, or a submitted log)."""
    if settings.from_log:
        from harness.plugin.from_log import NotJudged, judge_log_bounded

        try:   # in a bounded worker, no link followed (docs/untrusted.md)
            verdicts = judge_log_bounded(profile, settings.from_log, settings.checkpoint_dir)
        except NotJudged as exc:
            pytest.fail(f"--from-log {settings.from_log}: {exc}", pytrace=False)
    else:
        verdicts = request.getfixturevalue("verdicts_by_run")["reference"]
    return {v.criterion_id: v for v in verdicts}


@pytest.fixture
def judge(reference_verdicts, profile, record_property):
    """judge(criterion_id): pass, fail with the verdict's message, or skip when not measured (recorded runs).

    The verdict's status, measured and expected values go into the JUnit file as properties.
    """

    def _judge(criterion_id: str):
        record_verdict(record_property, reference_verdicts.get(criterion_id))
        return judge_verdict(reference_verdicts, profile.name, criterion_id)

    return _judge
