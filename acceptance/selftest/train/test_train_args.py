"""The trainer's command line refuses what it cannot run, naming why and the fix."""

from __future__ import annotations

import pytest

from harness.train.args import COURSE_FLAGS, parse_args

BASE = [*COURSE_FLAGS, "--data-path", "d", "--vocab-file", "v"]


@pytest.mark.parametrize("size", ["2", "4", "0"])
def test_pipeline_parallelism_is_refused_with_reason_and_fix(capsys, size):
    """--pipeline-model-parallel-size other than 1 exits 2 (argparse), saying it needs a pipeline schedule."""
    with pytest.raises(SystemExit) as exit_info:
        parse_args([*BASE, "--pipeline-model-parallel-size", size])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert f"--pipeline-model-parallel-size {size}: this trainer supports only 1" in err, err
    assert "pipeline schedule" in err and "Fix: split the model with --tensor-model-parallel-size" in err, err


def test_course_flags_keep_pipeline_size_1():
    """The course's own --pipeline-model-parallel-size 1 is accepted."""
    assert parse_args(BASE).pipeline_model_parallel_size == 1


def test_tensor_parallel_size_below_1_is_refused(capsys):
    """--tensor-model-parallel-size 0 is refused by the parser, not by megatron-core later."""
    with pytest.raises(SystemExit):
        parse_args([*BASE, "--tensor-model-parallel-size", "0"])
    assert "--tensor-model-parallel-size must be at least 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("extra, needs", [
    (["--wait-for-load", "30", "--load", "ckpt"], "--wait-for-load needs --ckpt-step N"),
    (["--wait-for-load", "30", "--ckpt-step", "100"], "--wait-for-load needs --load DIR"),
    (["--wait-for-load", "-1", "--load", "ckpt", "--ckpt-step", "100"], "--wait-for-load must be at least 0"),
], ids=["no-ckpt-step", "no-load", "negative"])
def test_wait_for_load_usage_errors(capsys, extra, needs):
    """--wait-for-load without the iteration to wait for, or the directory, is a usage error (exit 2)."""
    with pytest.raises(SystemExit) as exit_info:
        parse_args([*BASE, *extra])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and needs in err, err


def test_wait_for_load_defaults_to_no_wait():
    """Without the flag a --load run loads first, as before (0: no wait)."""
    assert parse_args([*BASE, "--load", "ckpt"]).wait_for_load == 0
    assert parse_args([*BASE, "--load", "ckpt", "--ckpt-step", "100", "--wait-for-load", "30"]).wait_for_load == 30
