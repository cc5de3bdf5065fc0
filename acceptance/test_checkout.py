"""Grade a student's own Megatron-LM checkout (`pytest -m gpu --megatron-lm PATH [--train-script FILE]`).

The course's pipeline through the checkout's own tools: the course corpus (harness.data.corpus), the checkout's
tools/preprocess_data.py (run a second time when Megatron-LM issue #1052 leaves no .bin/.idx), then its BERT
script under torchrun, with exactly the adaptations harness.run.megatron_lm records. Then one test per criterion of
the `megatron-lm` profile (or --criteria), and tests that every adaptation is in the report. Without
--megatron-lm every test here is skipped. The student's files are never edited.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from harness.plugin.judging import judge_verdict
from harness.judge import criteria
from harness.report import session_report as report
from harness.run import megatron_lm
from harness.base import paths
from harness.cli.drift import record_verdict
from harness.run.no_te_launch import PATCHED as NO_TE_PATCHED
from harness.plugin.options import setting
from harness.base.errors import CriteriaError
from harness.judge.profiles import Profile, load_profile
from harness.run.checkout import (Checkout, CheckoutError, NO_TE_LAUNCHER, detect, probe_modules, python_too_old, select_adapters)

pytestmark = pytest.mark.gpu

RUN_NAME = "checkout"
NOT_GIVEN = "no --megatron-lm PATH given: grading a student's Megatron-LM checkout is opt-in"
NOT_TRAINED = "{criterion}: the checkout was not trained ({reason}); the fix: see test_checkout_can_train_here"
# Every criterion of the megatron-lm profile but resume-matches: checkout mode trains no resume run.
CRITERIA = ("recipe", "datasets-built", "training-started", "exit-code", "ran-on-gpu", "first-loss", "loss-decreases",
            "final-loss", "golden-final-loss", "golden-curve", "no-nan", "skips-early-only", "checkpoints-saved",
            "checkpoint-tracker", "checkpoint-loads", "gpu-memory")


@dataclass
class CheckoutRun:
    """What grading the checkout produced: the session, each step's result, every adaptation, matrix rows."""

    checkout: Checkout
    session: object
    preprocess: megatron_lm.PreprocessResult | None = None
    train_plan: megatron_lm.Plan | None = None
    reason: str | None = None                       # why training was not launched
    train_script: str | None = None                 # --train-script, when given
    adaptations: list = field(default_factory=list)
    rows: list = field(default_factory=list)


@pytest.fixture(scope="session")
def megatron_checkout(pytestconfig) -> Checkout:
    """The --megatron-lm checkout, with Transformer Engine/Apex probed in this Python (skip when not given)."""
    path = setting(pytestconfig, "megatron_lm")
    if not path:
        pytest.skip(NOT_GIVEN)
    found = probe_modules(("transformer_engine", "apex"))
    try:
        return detect(path, have_te=found["transformer_engine"], have_apex=found["apex"])
    except CheckoutError as exc:
        raise pytest.UsageError(f"--megatron-lm {path}: {exc}")


@pytest.fixture(scope="session")
def checkout_profile(pytestconfig) -> Profile:
    """--criteria, else the `megatron-lm` profile (Megatron's own golden curve)."""
    name = setting(pytestconfig, "criteria") or "megatron-lm"
    try:
        return load_profile(name)
    except CriteriaError as exc:
        raise pytest.UsageError(f"--criteria {name}: {exc}")


def _run_dir(settings) -> Path:
    """Its own folder: under --run-dir when given, else runs/<timestamp>-megatron-lm."""
    if settings.run_dir:
        return settings.run_dir / "megatron-lm"
    return paths.REPO / "runs" / (time.strftime("%Y%m%d-%H%M%S") + "-megatron-lm")


@pytest.fixture(scope="session")
def checkout_run(megatron_checkout, settings, pytestconfig, request):
    """Corpus, the checkout's preprocessing and training, each a logged stage (kept when a test fails)."""
    from harness.run.launch import progress_printer
    from harness.run.session import Session

    run_dir = _run_dir(settings)
    session = Session(run_dir, settings.vocab_file, settings.stage_timeout_s, on_line=progress_printer())
    run = CheckoutRun(megatron_checkout, session)
    run.reason = python_too_old(megatron_checkout)
    if run.reason is None:
        _prepare(run, settings)
    run.train_script = setting(pytestconfig, "train_script") or None
    if run.reason is None and run.preprocess is not None and run.preprocess.ok:
        _train(run, settings, run.train_script)
    _write_matrix(run)
    session.dump()
    yield run
    if not (settings.keep_run or settings.run_dir) and request.session.testsfailed == 0:
        shutil.rmtree(run_dir, ignore_errors=True)


def _prepare(run: CheckoutRun, settings) -> None:
    """The course corpus, then the checkout's preprocess plan (twice if #1052 bites); fail loudly if it breaks."""
    session, checkout = run.session, run.checkout
    corpus = session.run_dir / "corpus.json"
    made = session.stage("corpus", [sys.executable, "-m", "harness.data.corpus", str(corpus), "--layout", "grouped"])
    if not made.ok:
        pytest.fail("making the course corpus failed\n" + made.failure_message(), pytrace=False)
    (session.run_dir / "data").mkdir(exist_ok=True)
    plan = megatron_lm.plan_preprocess(checkout, corpus, session.run_dir / "data" / "corpus", settings.vocab_file,
                                       session.run_dir / "work", timeout_s=settings.stage_timeout_s)
    run.preprocess = megatron_lm.run_preprocess(plan, session.run_dir, on_line=session.on_line)
    session.stages.update({r.name: r for r in run.preprocess.results})
    run.adaptations += run.preprocess.adaptations
    run.rows.append(megatron_lm.row_from_result(checkout, run.preprocess, "preprocess", run.preprocess.adaptations))
    if run.preprocess.ok:
        session.data_prefix = run.preprocess.data_prefix
    else:
        run.reason = "preprocessing failed: " + run.preprocess.failure_message().splitlines()[0]


def _train(run: CheckoutRun, settings, train_script: str | None) -> None:
    """The pre-check, then the checkout's BERT script under torchrun, followed by an NVML sampler."""
    from harness.run.gpumem import NvmlSampler
    from harness.run.launch import run_stage
    from harness.run.runs import RunSpec
    from harness.run.outcomes import RunOutcome

    session, checkout = run.session, run.checkout
    spec = RunSpec(RUN_NAME, f"the student's checkout: {checkout.describe()}")
    outcome = session.outcomes.setdefault(RUN_NAME, RunOutcome(spec))
    run.reason = megatron_lm.cannot_run_reason(checkout, train_script=train_script)
    if run.reason:
        run.rows.append(megatron_lm.row_from_result(checkout, None, "train", reason=run.reason))
        return
    run.train_plan = megatron_lm.plan_train(checkout, session.data_prefix, settings.vocab_file,
                                            session.save_dir(spec), train_script, workdir=session.run_dir / "work",
                                            timeout_s=settings.stage_timeout_s)
    run.adaptations += run.train_plan.adaptations
    started: dict = {}
    t0 = time.monotonic()
    with NvmlSampler(lambda: started.get("pid")) as sampler:
        outcome.stage = run_stage(run.train_plan.stages[0], session.run_dir, on_line=session.on_line,
                                  on_start=lambda popen: started.update(pid=popen.pid))
    outcome.seconds, outcome.memory = time.monotonic() - t0, sampler.report()
    outcome.save_dir = session.save_dir(spec)
    outcome.summary = megatron_lm.run_summary(checkout, outcome.stage.log_path, outcome.memory)
    run.rows.append(megatron_lm.row_from_result(checkout, outcome.stage, "train", run.train_plan.adaptations))


def _write_matrix(run: CheckoutRun) -> None:
    """checkout-matrix.json / .md: this version's row per stage."""
    megatron_lm.write_matrix(run.rows, run.session.run_dir / "checkout-matrix.json",
                             run.session.run_dir / "checkout-matrix.md")


@pytest.fixture(scope="session")
def checkout_verdicts(checkout_run, checkout_profile) -> dict:
    """criterion id -> Verdict of the checkout's run; writes report.json / report.md with the adaptations."""
    session = checkout_run.session
    if RUN_NAME not in session.outcomes or session.outcomes[RUN_NAME].stage is None:
        return {}
    # a live run: every criterion must be measured; checkout mode trains no resume run, so that one does not apply
    judged = criteria.judge(checkout_profile, session.evidence(RUN_NAME), live=True, exclude={"resume_matches"})
    verdicts = list(judged.verdicts)
    extra = {"checkout": megatron_lm.describe(checkout_run.checkout)["checkout"],
             "adaptations": [asdict(a) for a in checkout_run.adaptations], "matrix": checkout_run.rows,
             "stages": {n: round(s.duration_s, 2) for n, s in session.stages.items()}}
    json_path, md_path = report.write(session.run_dir, report.build(checkout_profile.name, session.outcomes,
                                                                    {RUN_NAME: judged}, extra))
    md_path.write_text(md_path.read_text() + adaptations_markdown(checkout_run))
    return {v.criterion_id: v for v in verdicts}


def adaptations_markdown(run: CheckoutRun) -> str:
    """The report's section listing everything the suite added to the course's commands."""
    lines = ["", f"## What the suite added to the course's commands ({run.checkout.describe()})", ""]
    lines += [f"- {a.stage or 'run'}: `{a.what}`: {a.why}" for a in run.adaptations]
    return "\n".join(lines) + "\n"


@pytest.fixture
def checkout_judge(checkout_run, checkout_verdicts, checkout_profile, record_property):
    """checkout_judge(criterion_id): pass, fail with the verdict's message (or why nothing ran), or skip."""

    def _judge(criterion_id: str):
        if checkout_run.reason and not checkout_verdicts:
            reason = checkout_run.reason.split(". Fix:")[0]
            pytest.fail(NOT_TRAINED.format(criterion=criterion_id, reason=reason), pytrace=False)
        record_verdict(record_property, checkout_verdicts.get(criterion_id))
        return judge_verdict(checkout_verdicts, checkout_profile.name, criterion_id)

    return _judge


# ---------------------------------------------------------------- the checkout runs at all


def test_checkout_can_train_here(checkout_run):
    if checkout_run.reason:
        pytest.fail(checkout_run.reason, pytrace=False)


def test_checkout_preprocessing_writes_bin_and_idx(checkout_run):
    done = checkout_run.preprocess
    if done is None:
        pytest.fail(f"preprocessing did not run: {checkout_run.reason}", pytrace=False)
    if not done.ok:
        pytest.fail(done.failure_message(), pytrace=False)


# ---------------------------------------------------------------- one test per criterion


@pytest.mark.parametrize("criterion_id", CRITERIA)
def test_checkout_meets_criterion(checkout_judge, criterion_id):
    checkout_judge(criterion_id)


# ---------------------------------------------------------------- adaptations are reported


def _recorded(checkout_run) -> list[str]:
    """The `what` of every adaptation recorded for this run."""
    return [a.what for a in checkout_run.adaptations]


def test_every_version_adapter_is_recorded(checkout_run):
    checkout, recorded = checkout_run.checkout, " | ".join(_recorded(checkout_run))
    stages = ["preprocess"] + (["train"] if checkout_run.train_plan else [])
    train = megatron_lm.train_context(checkout, checkout_run.train_script)
    missing = [f"{stage}:{a.id}" for stage in stages
               for a in select_adapters(checkout, stage, train if stage == "train" else None)
               if f"[{a.id}]" not in recorded]
    assert not missing, f"adapters applied but not recorded: {missing}; recorded: {recorded}"


def test_train_command_carries_every_recorded_flag(checkout_run):
    if checkout_run.train_plan is None:
        pytest.skip(f"not trained: {checkout_run.reason}")
    argv = checkout_run.train_plan.stages[0].argv
    ctx = megatron_lm.train_context(checkout_run.checkout, checkout_run.train_script)
    for adapter in select_adapters(checkout_run.checkout, "train", ctx):
        flags = list(adapter.flags)
        assert not flags or any(list(argv[i:i + len(flags)]) == flags for i in range(len(argv))), (
            f"{adapter.id}: {' '.join(flags)} missing from the command: {' '.join(argv)}")


def test_adaptations_are_in_the_report(checkout_run, checkout_verdicts):
    if not checkout_verdicts:
        pytest.skip(f"no report: the checkout was not trained ({checkout_run.reason})")
    run_dir = checkout_run.session.run_dir
    written = json.loads((run_dir / "report.json").read_text())["adaptations"]
    assert written == [asdict(a) for a in checkout_run.adaptations] and all(a["why"] for a in written)
    text = (run_dir / "report.md").read_text()
    absent = [what for what in _recorded(checkout_run) if f"`{what}`" not in text]
    assert not absent, f"adaptations missing from {run_dir / 'report.md'}: {absent}"


def test_compatibility_row_is_written(checkout_run):
    rows = json.loads((checkout_run.session.run_dir / "checkout-matrix.json").read_text())["rows"]
    assert [r["stage"] for r in rows][:1] == ["preprocess"]
    assert all(r["version"] == str(checkout_run.checkout.version) for r in rows)


def test_no_te_launcher_ran_exactly_when_recorded(checkout_run):
    if checkout_run.train_plan is None:
        pytest.skip(f"not trained: {checkout_run.reason}")
    stage = checkout_run.session.outcomes[RUN_NAME].stage
    log = stage.log_path.read_text(errors="replace") if stage.log_path.is_file() else ""
    recorded = any(what.startswith("[no-te-launcher]") for what in _recorded(checkout_run))
    launched = str(NO_TE_LAUNCHER) in stage.argv
    assert recorded == launched == (NO_TE_PATCHED in log), (
        f"no-te-launcher recorded={recorded}, in the command={launched}, patched in {stage.log_path}="
        f"{NO_TE_PATCHED in log}: all three must agree")
