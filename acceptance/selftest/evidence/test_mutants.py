"""Self-tests of the criteria on the recorded Megatron log and its mutants: each breakage fails exactly its criteria."""

from __future__ import annotations

import math

import pytest

from harness.evidence import logs, mutants
from harness.judge import mutant_matrix
from harness.judge.profiles import FAIL, load_profile, NOT_MEASURABLE, PASS, Profile

# Criteria that need more than a log (the run's exit code, device, --save dir, NVML, a resumed run).
# what a log cannot show (exit-code, ran-on-gpu, checkpoints-saved and gpu-memory are decided from the log itself)
NEEDS_THE_RUN = {"checkpoint-tracker", "checkpoint-loads", "resume-matches"}


@pytest.fixture(scope="module")
def profile() -> Profile:
    """The profile that judges a real Megatron-LM log."""
    return load_profile("megatron-lm")


@pytest.fixture(scope="module")
def good_text() -> str:
    """The recorded good log."""
    return mutants.RECORDED_LOG.read_text()


def _failed(profile, text: str) -> set:
    """Ids of the criteria that fail on a log text."""
    return {v.criterion_id for v in mutant_matrix.judge_text(profile, text) if v.status == FAIL}


def test_good_log_passes_every_log_criterion(profile, good_text):
    """The recorded run passes everything a log can show; the rest is not measurable, never passed."""
    statuses = {v.criterion_id: v.status for v in mutant_matrix.judge_text(profile, good_text)}
    assert {c for c, s in statuses.items() if s == NOT_MEASURABLE} == NEEDS_THE_RUN
    assert {c for c, s in statuses.items() if s == PASS} == set(profile.ids) - NEEDS_THE_RUN


def test_expected_failures_name_real_criteria(profile):
    """Every intended failure is a criterion of the profile and derivable from a log."""
    for m in mutants.MUTANTS:
        assert m.expected_failures and m.expected_failures <= set(profile.ids) - NEEDS_THE_RUN, m.name


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=lambda m: m.name)
def test_mutant_fails_exactly_its_criteria(profile, good_text, mutant):
    """No more, no fewer failures than intended."""
    assert _failed(profile, mutant.transform(good_text)) == set(mutant.expected_failures)


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=lambda m: m.name)
def test_mutant_is_pure_and_changes_the_log(good_text, mutant):
    """Same input, same output; the input is not the output."""
    once = mutant.transform(good_text)
    assert once == mutant.transform(good_text) and once != good_text


def test_rewrites_touch_only_iteration_lines(good_text):
    """lr_zero changes lm losses of iteration lines and nothing else."""
    before, after = good_text.split("\n"), mutants.lr_zero(good_text).split("\n")
    changed = [i + 1 for i, (a, b) in enumerate(zip(before, after)) if a != b]
    iteration_lines = {r.line_no for r in logs.parse_log(good_text).iterations}
    assert len(before) == len(after) and set(changed) <= iteration_lines and len(changed) == 18


def test_lr_zero_is_flat(good_text):
    """All lm losses within the noise of the first one."""
    losses = [v for _, v in logs.parse_log(mutants.lr_zero(good_text)).lm_losses]
    assert max(losses) - min(losses) <= 0.004 + 1e-9 and losses[0] == 10.35269


def test_nan_at_counts_one_nan(good_text):
    """nan_at(100): one nan iteration counted at 100, nan losses from there."""
    parsed = logs.parse_log(mutants.nan_at(100)(good_text))
    assert [r.iteration for r in parsed.iterations if r.nan] == [100]
    assert all(math.isnan(v) == (it >= 100) for it, v in parsed.lm_losses)


def test_truncations(good_text):
    """Cut before `training ...`: no iterations; cut mid-line: flagged, the partial line ignored."""
    before = logs.parse_log(mutants.truncated_before_marker("training")(good_text))
    assert "training" not in before.markers and before.iterations == () and "done_setup" in before.markers
    mid = logs.parse_log(mutants.truncated_mid_iteration(200)(good_text))
    assert mid.truncated_last_line and mid.last_iteration == 190


def test_stopped_at_drops_everything_after(good_text):
    """stopped_at(150) keeps nothing after the iteration 150 line."""
    parsed = logs.parse_log(mutants.stopped_at(150)(good_text))
    assert parsed.last_iteration == 150 and parsed.lines[-1] == parsed.lines[parsed.iterations[-1].line_no - 1]
    assert [v.iteration for v in parsed.validations] == [50, 100]
    assert [c.iteration for c in parsed.checkpoints] == [100, 100] and not parsed.truncated_last_line


def test_small_mutants(good_text):
    """no_dataset_lines, loss_too_high and skips_late change only what they say."""
    assert not {"building_datasets", "building_bert_datasets", "finished_datasets"} & set(
        logs.parse_log(mutants.no_dataset_lines(good_text)).markers)
    assert logs.parse_log(mutants.loss_too_high(good_text)).lm_losses[-1] == (200, pytest.approx(9.659132))
    late = {r.iteration: r.skipped for r in logs.parse_log(mutants.skips_late(120)(good_text)).iterations}
    assert all(late[it] == 5 for it in range(120, 201, 10)) and late[110] == 0


def test_matrix_rows_as_intended(profile, good_text):
    """The README matrix: good log first, every row as intended."""
    rows = mutant_matrix.mutant_matrix(profile, good_text)
    assert [r.name for r in rows] == ["good", *(m.name for m in mutants.MUTANTS)]
    assert all(r.as_intended for r in rows)
    assert list(rows[0].statuses) == profile.ids


def test_matrix_markdown_and_cli(capsys):
    """`python -m harness mutants` prints a markdown table and exits 0 when every row is as intended."""
    assert mutant_matrix.main(["--profile", "megatron-lm"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| log | recipe | datasets-built |") and "| skips_late |" in out and "| NO |" not in out


def test_matrix_flags_a_mutant_that_misses(profile, good_text):
    """A mutant whose intended failures are wrong shows up as not as intended."""
    wrong = mutants.Mutant("wrong", "claims the wrong criterion", mutants.no_dataset_lines, frozenset({"no-nan"}))
    rows = mutant_matrix.mutant_matrix(profile, good_text, [wrong])
    assert not rows[1].as_intended and "| wrong |" in mutant_matrix.matrix_markdown(rows)
