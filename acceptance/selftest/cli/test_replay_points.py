"""harness.cli.replay.compare, point by point and field by field: every point type the log prints (training,
periodic validation, the final validation and test evaluations) at every iteration, each edited alone in the log and
in the replay; the final tolerance applies to the training loss at the last iteration only. Issue 43: a planted bug
that applied the final tolerance to the validation and test losses too got through the suite (its tests edited only
training points)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from harness.base.paths import REPO
from harness.cli import replay
from harness.evidence.logs import parse_log_file

MEGATRON = parse_log_file(REPO / "fixtures/logs/core_v0.16.1_h200_course_flags_binary_head.log")
TRAINER_A = parse_log_file(REPO / "results/gpu-acceptance/train-reference.log")   # seed 1234, recipe (a), H200
INTERVAL, FINAL = replay.tolerances("fp16")
POINTS = sorted(replay._points(MEGATRON), key=lambda k: (k[1], k[0]))
WHAT = {"periodic": "validation", "validation": "validation (validation)", "test": "validation (test)"}


def _edit(log, key, delta=None, value=None):
    """The log with the one point `key` ((what, iteration)) moved by delta (or set to value)."""
    what, it = key
    new = (lambda x: x + delta) if value is None else (lambda x: value)
    if what == "train":
        return replace(log, iterations=tuple(replace(r, lm_loss=new(r.lm_loss)) if r.iteration == it else r
                                             for r in log.iterations))
    return replace(log, validations=tuple(replace(v, lm_loss=new(v.lm_loss)) if (WHAT[v.split], v.iteration) == key
                                          else v for v in log.validations))


def test_the_points_are_every_type_at_every_iteration():
    assert (INTERVAL, FINAL) == (0.15, 0.01)
    assert len(POINTS) == 25 and set(replay._points(TRAINER_A)) >= set(POINTS)
    assert {w for w, _ in POINTS} == {"train", "validation", "validation (validation)", "validation (test)"}
    assert [k for k in POINTS if k[1] == 200] == [("train", 200), ("validation", 200), ("validation (test)", 200),
                                                  ("validation (validation)", 200)]
    base = replay.compare(MEGATRON, TRAINER_A)
    assert (base.reproduced, base.points, base.text) == (True, 25, "reproduced (max |d| 0.0051 over 25 points, fp16 "
                                                                   "tolerances)")
    assert base.worst == ("train", 20, 10.35269, 10.35779, INTERVAL)


def _message(key, a, b, tol):
    what, it = key
    where = f"iteration {it}" + ("" if what == "train" else f" ({what})")
    d = abs(a - b)
    return (f"not reproduced at {where}: {a:.6g} in the log, {b:.6g} from its flags and seed (|d| {d:.3g} > {tol:g}, "
            f"{d / tol:.3g}x the fp16 tolerance measured on honest runs)")


@pytest.mark.parametrize("side", ["log", "replay"])
@pytest.mark.parametrize("key", POINTS, ids=lambda k: f"{k[0]}-{k[1]}")
def test_between_the_two_tolerances_only_the_last_training_loss_fails(key, side):
    """0.05 off: within the interval tolerance (0.15), beyond the final one (0.01), which is the last training
    loss's alone: a validation or test loss at iteration 200 is judged by the interval tolerance."""
    log, rep = (_edit(MEGATRON, key, 0.05), TRAINER_A) if side == "log" else (MEGATRON, _edit(TRAINER_A, key, 0.05))
    result = replay.compare(log, rep)
    mine, theirs = replay._points(log)[key], replay._points(rep)[key]
    assert result.points == 25
    if key == ("train", 200):
        assert result.reproduced is False
        assert result.worst == (*key, mine, theirs, FINAL)
        assert result.text == _message(key, mine, theirs, FINAL)
        assert result.max_delta == pytest.approx(abs(mine - theirs))
    else:
        assert result.reproduced is True, result.text
        assert result.text.startswith("reproduced (max |d| ") and result.text.endswith(" over 25 points, fp16 tolerances)")
        assert result.max_delta == pytest.approx(max(0.0051, abs(mine - theirs)), abs=1e-6)


@pytest.mark.parametrize("key", POINTS, ids=lambda k: f"{k[0]}-{k[1]}")
def test_beyond_the_interval_tolerance_every_point_fails_naming_itself(key):
    log = _edit(MEGATRON, key, -0.2)
    result = replay.compare(log, TRAINER_A)
    mine, theirs = replay._points(log)[key], replay._points(TRAINER_A)[key]
    tol = FINAL if key == ("train", 200) else INTERVAL
    assert (result.reproduced, result.points) == (False, 25)
    assert result.worst == (*key, mine, theirs, tol)
    assert result.text == _message(key, mine, theirs, tol)
    assert result.max_delta == pytest.approx(abs(mine - theirs))


@pytest.mark.parametrize("delta, reproduced", [(0.009, True), (-0.009, True), (0.0115, False), (-0.0115, False)])
def test_the_final_tolerance_edge_on_the_last_training_loss(delta, reproduced):
    """The log's last training loss set to the replay's +- delta: within 0.01 reproduced, beyond it not."""
    theirs = replay._points(TRAINER_A)[("train", 200)]
    result = replay.compare(_edit(MEGATRON, ("train", 200), value=theirs + delta), TRAINER_A)
    assert result.reproduced is reproduced, result.text
    if not reproduced:
        assert "(|d| 0.0" in result.text and "> 0.01, " in result.text


@pytest.mark.parametrize("key", [k for k in POINTS if k[1] == 200 and k[0] != "train"], ids=lambda k: k[0])
def test_the_final_tolerance_never_reaches_a_validation_or_test_point(key):
    """At 0.14 off (just within the interval tolerance) a final evaluation's loss is reproduced; at 0.16 not."""
    assert replay.compare(_edit(MEGATRON, key, 0.14), TRAINER_A).reproduced is True
    result = replay.compare(_edit(MEGATRON, key, 0.16), TRAINER_A)
    assert result.reproduced is False and result.worst[4] == INTERVAL and "> 0.15, " in result.text


@pytest.mark.parametrize("key", POINTS[::4] + [("validation (test)", 200)], ids=lambda k: f"{k[0]}-{k[1]}")
def test_a_non_finite_point_in_one_of_the_two_is_not_reproduced(key):
    result = replay.compare(_edit(MEGATRON, key, value=math.nan), TRAINER_A)
    assert result.reproduced is False and result.max_delta == math.inf
    assert result.worst[:2] == key and math.isnan(result.worst[2])
    assert result.text.startswith(f"not reproduced at iteration {key[1]}")
    both = replay.compare(_edit(MEGATRON, key, value=math.inf), _edit(TRAINER_A, key, value=math.nan))
    assert both.reproduced is True, both.text            # non-finite in both: reproduced


@pytest.mark.xfail(strict=True, reason="bug (harness/cli/replay.py compare): a point non-finite in one log only is "
                   "judged by d = inf but its message prints abs(a - b): '|d| nan > 0.15, nanx the fp16 tolerance'")
def test_a_non_finite_points_message_says_what_was_judged():
    result = replay.compare(_edit(MEGATRON, ("validation (test)", 200), value=math.nan), TRAINER_A)
    assert "|d| nan" not in result.text and "nanx" not in result.text
