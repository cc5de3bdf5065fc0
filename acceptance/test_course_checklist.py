"""The course's checklist, one test per criterion, judged on one real training run (see conftest.py).

Numbers live in fixtures/criteria/<profile>.toml and fixtures/golden/, never here: `--criteria course`
grades against the course's own text, the default `reference` against measured golden values.
"""

import pytest

pytestmark = pytest.mark.gpu


def test_training_used_the_course_recipe(judge):
    judge("recipe")


def test_dataset_building_lines_are_printed(judge):
    judge("datasets-built")


def test_training_start_line_is_printed(judge):
    judge("training-started")


def test_trainer_exits_with_code_0(judge):
    judge("exit-code")


def test_training_ran_on_the_gpu(judge):
    judge("ran-on-gpu")


def test_first_logged_lm_loss_is_in_band(judge):
    judge("first-loss")


def test_loss_decreases(judge):
    judge("loss-decreases")


def test_final_lm_loss_is_in_band(judge):
    judge("final-loss")


def test_final_lm_loss_matches_golden_value(judge):
    judge("golden-final-loss")


def test_loss_curve_follows_golden_curve(judge):
    judge("golden-curve")


def test_no_nan_iterations(judge):
    judge("no-nan")


def test_skipped_iterations_only_during_loss_scale_search(judge):
    judge("skips-early-only")


def test_checkpoints_iter_100_and_200_are_written(judge):
    judge("checkpoints-saved")


def test_tracker_names_the_last_iteration(judge):
    judge("checkpoint-tracker")


def test_checkpoint_weights_load_and_match_the_model(judge):
    judge("checkpoint-loads")


def test_resuming_from_iter_100_continues_the_run(judge):
    judge("resume-matches")


def test_peak_gpu_memory_is_in_band(judge):
    judge("gpu-memory")


def test_step_ran_as_a_cuda_graph(judge):
    judge("cuda-graph")


@pytest.mark.submitted_logs
def test_submitted_logs_are_one_run(judge):
    """--from-log only (deselected in a live run): which log(s) were judged and how they were read; fails when
    several logs are not one run (a resume from another run's checkpoint, a gap, overlapping iterations that
    disagree)."""
    judge("log-provenance")


@pytest.mark.submitted_logs
def test_submitted_log_is_consistent_with_itself(judge):
    """--from-log only: the log's printed values agree with each other (harness.judge.consistency); an edited log
    fails naming the line that breaks."""
    judge("log-consistent")
