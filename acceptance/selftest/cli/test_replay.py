"""Self-tests of harness.cli.replay: the log's arguments block -> the trainer's flags (an allowlist), the point by
point comparison, and a tiny replay on the CPU (its own log reproduced exactly, a seed edited everywhere it is
printed not reproduced)."""

from __future__ import annotations

import glob
import math
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.judge import consistency
from harness.evidence import logs
from harness.evidence.logs import parse_log_file
from harness.base.paths import FIXTURES, REPO, VOCAB_FILE
from harness.cli import replay
from harness.train.args import COURSE_FLAGS, parse_args

MEGATRON = parse_log_file(REPO / "fixtures/logs/core_v0.16.1_h200_course_flags_binary_head.log")
TRAINER_A = parse_log_file(REPO / "results/gpu-acceptance/train-reference.log")   # seed 1234, recipe (a), H200
TRAINER_B = parse_log_file(REPO / "fixtures/logs/reference_trainer_h200_recipe_b_seed1234.log")
REAL = [parse_log_file(p) for p in sorted(glob.glob(str(REPO / "fixtures/logs/runs-h200/*.log.gz")))]
DATA = ["--data-path", "x", "--vocab-file", "v"]


def test_the_course_logs_arguments_are_the_course_command():
    """Megatron-LM's arguments block of the course's run gives the trainer the course's command (the save interval
    aside: a replay writes no checkpoint)."""
    flags, problems = replay.trainer_flags(MEGATRON.arguments)
    assert problems == []
    mine, course = vars(parse_args(flags + DATA)), vars(parse_args(COURSE_FLAGS + DATA))
    assert {k for k in course if mine[k] != course[k]} == {"save_interval"}


@pytest.mark.parametrize("log", REAL, ids=lambda lg: str(lg.arguments.get("log_interval")) + "-"
                         + str(lg.arguments.get("hidden_size")) + "-" + str(lg.arguments.get("bert_binary_head")))
def test_every_real_logs_flags_parse_and_carry_its_values(log):
    """Every real Megatron-LM log (releases 0.16.1-main, log intervals 1-20, recipe b, hidden 64): its flags parse,
    and each mapped value is the block's."""
    flags, problems = replay.trainer_flags(log.arguments)
    assert problems == [], problems
    args = vars(parse_args(flags + DATA))
    for dest in replay._trainer_actions():
        raw = log.arguments.get(dest)
        if raw in (None, "None"):
            continue
        got = args[dest]
        assert (str(got) == raw or (isinstance(got, (int, float)) and not isinstance(got, bool)
                                    and math.isclose(got, float(raw)))
                or isinstance(got, bool) and str(got) == raw), (dest, raw, got)


def test_the_trainers_own_flags_are_never_taken_from_a_log():
    """A log may carry the trainer's suite flags (its arguments block does): none is replayed."""
    block = {**MEGATRON.arguments, "inject_nan_at": "5", "inject_crash_at": "3", "device": "cpu",
             "memory_cap_gb": "1", "save": "/tmp/x", "load": "/etc", "data_path": "['/etc/passwd']"}
    flags, problems = replay.trainer_flags(block)
    assert problems == []
    assert not [f for f in flags if f.startswith(("--inject", "--device", "--memory", "--save", "--load",
                                                  "--data-path"))]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dest=st.sampled_from(sorted(d for d, a in replay._trainer_actions().items() if a.nargs != 0)),
       value=st.sampled_from(["--inject-nan-at 5", "-1e-3x", "nan", "inf", "; rm -rf /", "$(id)", "0x10", "--save",
                              "1,2,x", "Linear"]))
def test_a_hostile_value_becomes_a_problem_never_an_option(dest, value):
    flags, problems = replay.trainer_flags({**MEGATRON.arguments, dest: value})
    assert value not in flags or not problems and not value.startswith("-"), (flags, problems)
    assert problems and any(p.startswith(dest) for p in problems), (dest, value, flags)


def test_an_unsupported_argument_off_the_course_is_not_replayed():
    flags, problems = replay.trainer_flags({**MEGATRON.arguments, "swiglu": "True"})
    assert any(p.startswith("swiglu is True (the course's run: False)") for p in problems), problems
    flags, problems = replay.trainer_flags({**MEGATRON.arguments, "tensor_model_parallel_size": "2"})
    assert any("one GPU" in p for p in problems)


# ---------------------------------------------------------------- the comparison


def test_the_trainer_reproduces_megatron_and_not_the_other_recipe():
    """Seed 1234 and the course's flags: the trainer's H200 run against Megatron-LM's (docs/parity.md: 0.0051)."""
    same = replay.compare(MEGATRON, TRAINER_A)
    assert same.reproduced and same.points == 25 and same.text == "reproduced (max |d| 0.0051 over 25 points, fp16 tolerances)"
    other = replay.compare(MEGATRON, TRAINER_B)
    assert other.reproduced is False and other.text.startswith("not reproduced at iteration ")
    assert re.search(r": [\d.]+ in the log, [\d.]+ from its flags and seed \(\|d\| [\d.]+ > 0\.15, [\d.]+x the fp16 tolerance "
                     r"measured on honest runs\)", other.text)


def _edit_loss(log, iteration: int, delta: float):
    recs = tuple(replace(r, lm_loss=r.lm_loss + delta) if r.iteration == iteration else r for r in log.iterations)
    return replace(log, iterations=recs)


@pytest.mark.parametrize("iteration, delta, reproduced", [(50, 0.3, False), (50, -0.14, True), (200, 0.02, False),
                                                          (200, 0.007, True), (20, 0.16, False)])
def test_each_point_is_judged_by_its_iterations_tolerance(iteration, delta, reproduced):
    """Within 0.15 per interval, 0.01 at the last iteration of training (measured, with half again as margin); the H200 trainer
    run lies 0.0021 from Megatron-LM at 200 and 0.0051 at 20 before the edit."""
    result = replay.compare(_edit_loss(MEGATRON, iteration, delta), TRAINER_A)
    assert result.reproduced is reproduced, result.text
    if not reproduced:
        assert result.text.startswith(f"not reproduced at iteration {iteration}: ")


def test_nothing_in_common_is_not_a_verdict():
    empty = replace(TRAINER_A, iterations=(), validations=())
    result = replay.compare(MEGATRON, empty)
    assert result.reproduced is None and result.text.startswith("not compared")


def test_the_tolerances_are_the_files():
    assert replay.tolerances() == (0.15, 0.01) == replay.tolerances("fp16")


# ---------------------------------------------------------------- a tiny replay on the CPU

TINY = ("--train-iters", "4", "--global-batch-size", "4", "--micro-batch-size", "2", "--log-interval", "2",
        "--eval-interval", "2", "--eval-iters", "1", "--attention-dropout", "0", "--hidden-dropout", "0")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A CPU trainer run on the course's corpus (the data a replay uses) handed in by alice; bob hands in the same
    log with its seed changed everywhere it is printed (a consistent forgery: only a replay can tell)."""
    out = tmp_path_factory.mktemp("replay")
    data = replay._data(out, "a")
    argv, problems = replay.replay_argv(MEGATRON.arguments, data, VOCAB_FILE, out / "own-cache", "cpu", TINY)
    assert problems == []
    own = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert own.returncode == 0, own.stderr[-3000:]
    text = own.stdout
    assert consistency.check_log(logs.parse_log(text)).ok
    forged = (text.replace("  seed ............................................ 1234",
                           "  seed ............................................ 77")
              .replace("> setting random seeds to 1234 ...", "> setting random seeds to 77 ..."))
    for who, body in (("alice", text), ("bob", forged)):
        (out / "subs" / who).mkdir(parents=True)
        (out / "subs" / who / "train.log").write_text(body)
    with ThreadPoolExecutor(2) as pool:
        rows = dict(zip(("alice", "bob"), pool.map(
            lambda who: replay.replay_one(who, out / "subs" / who, out, "cpu", 600, TINY), ("alice", "bob"))))
    return rows, forged


@pytest.mark.slow
def test_a_tiny_replay_reproduces_its_own_log_exactly(tiny):
    rows, _ = tiny
    assert rows["alice"]["status"] == "reproduced", rows["alice"]
    assert rows["alice"]["max_delta"] == 0 and re.fullmatch(r"reproduced \(max \|d\| 0 over \d+ points, fp16 tolerances\)",
                                                            rows["alice"]["text"])


@pytest.mark.slow
def test_a_log_whose_seed_was_edited_is_not_reproduced(tiny):
    rows, forged = tiny
    assert consistency.check_log(logs.parse_log(forged)).ok       # consistent: the log alone cannot tell
    assert rows["bob"]["status"] == "not-reproduced", rows["bob"]
    assert rows["bob"]["text"].startswith("not reproduced at iteration ")
    assert "--seed" in rows["bob"]["argv"] and rows["bob"]["argv"][rows["bob"]["argv"].index("--seed") + 1] == "77"


def test_a_run_that_stopped_early_gets_the_interval_tolerance_at_its_last_line():
    """The final tolerance is measured at the end of training: a log that stops at 130 is judged there by 0.15."""
    cut = replace(MEGATRON, iterations=tuple(r for r in MEGATRON.iterations if r.iteration <= 130), validations=())
    assert replay.compare(_edit_loss(cut, 130, 0.05), TRAINER_A).reproduced is True
    assert replay.compare(_edit_loss(MEGATRON, 200, 0.05), TRAINER_A).reproduced is False


@pytest.mark.parametrize("name", ["core_v0.16.1-mbs-over-gbs-s1234", "core_v0.16.1-kill-datasets-s1234",
                                  "core_v0.16.1-vocab-missing-s1234"])
def test_a_log_that_never_logged_a_loss_is_not_replayed_and_nothing_runs(tmp_path, monkeypatch, name):
    """A real run that stopped before its first lm loss (invalid flags, killed while building data, a missing
    vocab) has nothing to compare: no replay is started, and it is never called the grader's fault."""
    from harness.cli import replay as rp

    folder = tmp_path / "sub" / name
    folder.mkdir(parents=True)
    shutil.copy(FIXTURES / "failures" / "real-h200" / f"{name}.log.gz", folder / "train.log.gz")
    monkeypatch.setattr("harness.run.launch.run_stage", lambda *a, **k: pytest.fail("a replay was started"))
    got = rp.replay_one(name, folder, tmp_path / "out", "cpu", 60.0)
    assert got["status"] == "not-replayed" and "no lm loss" in got["text"], got
    assert "grader" not in got["text"]


def _with_precision(log, fp16: str, bf16: str):
    from dataclasses import replace as _replace

    return _replace(log, arguments={**(log.arguments or {}), "fp16": fp16, "bf16": bf16})


@pytest.mark.parametrize("fp16, bf16, precision", [("True", "False", "fp16"), ("False", "True", "bf16"),
                                                   ("False", "False", "fp32")])
def test_each_precision_is_judged_by_its_own_measured_tolerance_or_not_at_all(fp16, bf16, precision):
    """A log is compared with the tolerance measured for its own precision (its arguments block); a precision
    with no measured tolerance is 'not judged', never accused by fp16's numbers (a real bf16 run lies 0.013 from
    its replay at iteration 200, over fp16's 0.01)."""
    log = _with_precision(_edit_loss(MEGATRON, 200, 0.013), fp16, bf16)
    assert replay.precision_of(log.arguments) == precision
    measured = replay.tolerances(precision)
    result = replay.compare(log, TRAINER_A)
    if measured is None:
        assert result.reproduced is None and result.text.startswith(f"not judged: no replay tolerance was measured "
                                                                    f"for {precision} runs")
    else:
        _, final_tol = measured
        d200 = abs(log.iterations[-1].lm_loss - TRAINER_A.iterations[-1].lm_loss)
        assert result.reproduced is (d200 <= final_tol), result.text
        assert f"{precision} tolerance" in result.text
