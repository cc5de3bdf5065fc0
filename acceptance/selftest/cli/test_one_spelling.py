"""One spelling per option and one meaning per exit code across the grading commands (harness.cli.args).

For each of grade, gradescope, replay, grade-checkouts and matrix: its --help shows `--time-limit` and none of the
old spellings (--timeout, --timeout-s, --time, --stage-timeout), and the exit-code line with 2 interrupted and 4
usage error (pytest's meanings); an old spelling still works, stores seconds, and prints one line naming the new
one; a usage error exits 4. `--jobs` defaults to the machine's usable cores; replay's OUT defaults like grade's;
`grade FILE` says it is a file and how to grade one log.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from harness.__main__ import build_parser
from harness.base.paths import REPO
from harness.base.proc import usable_cores
from harness.cli import args as cli_args

COMMANDS = ("grade", "gradescope", "replay", "grade-checkouts", "matrix")
OLD_SPELLINGS = ("--timeout", "--timeout-s", "--time", "--stage-timeout")
# what each command needs on its command line besides the option under test
REQUIRED = {"grade": ["DIR"], "gradescope": [], "replay": ["DIR"], "grade-checkouts": ["DIR"],
            "matrix": ["--from-runs", "X", "--out", "Y"]}
OLD = {"grade": ("--timeout", 1.0), "gradescope": ("--timeout", 1.0), "replay": ("--timeout-s", 1.0),
       "grade-checkouts": ("--time", 60.0), "matrix": ("--timeout", 1.0)}


def _help(command: str) -> str:
    done = subprocess.run([sys.executable, "-m", "harness", command, "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_the_one_spelling_and_the_exit_codes(command):
    text = _help(command)
    assert re.search(r"^\s+--time-limit S\b", text, re.M), text
    for old in OLD_SPELLINGS:
        assert not re.search(rf"{re.escape(old)}(?![-\w])", text), (command, old, text)
    codes = " ".join(text[text.index("exit codes:"):].split())
    assert "3 grader error" in codes and "4 usage error" in codes, codes
    if command != "gradescope":      # Gradescope reads the verdict from results.json: 0 once it is written
        assert "0 all passed" in codes and "1 some failed" in codes and "2 interrupted" in codes, codes


@pytest.mark.parametrize("command", COMMANDS)
def test_an_old_spelling_still_works_in_seconds_with_one_line_naming_the_new_one(command, capsys):
    old, scale = OLD[command]
    parsed = build_parser().parse_args([command, *REQUIRED[command], old, "7"])
    assert parsed.time_limit == 7 * scale
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [next(line for line in err.splitlines() if line)], err
    assert f"{old} is deprecated: use --time-limit" in err, err
    new = build_parser().parse_args([command, *REQUIRED[command], "--time-limit", "7"])
    assert new.time_limit == 7 and capsys.readouterr().err == ""


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_option_is_a_usage_error_exit_4(command):
    done = subprocess.run([sys.executable, "-m", "harness", command, *REQUIRED[command], "--no-such-option"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == cli_args.EXIT_USAGE == 4 and "--no-such-option" in done.stderr, done.stderr[-2000:]


def test_exit_codes_are_pytests_meanings():
    from harness.cli import grade

    assert (cli_args.EXIT_PASSED, cli_args.EXIT_FAILED, cli_args.EXIT_INTERRUPTED, cli_args.EXIT_GRADER_ERROR,
            cli_args.EXIT_USAGE) == (0, 1, 2, 3, 4)
    assert (grade.EXIT_INTERRUPTED, grade.EXIT_USAGE) == (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.USAGE_ERROR)


@pytest.mark.parametrize("command", ("grade", "replay"))
def test_jobs_default_to_the_usable_cores(command):
    parsed = build_parser().parse_args([command, "DIR"])
    assert parsed.jobs == 0 and cli_args.jobs(parsed.jobs) == usable_cores() and cli_args.jobs(3) == 3


def test_replay_out_defaults_beside_dir_like_grade(tmp_path):
    from harness.cli import grade

    subs = tmp_path / "subs"
    subs.mkdir()
    assert cli_args.default_out(subs, "replay") == tmp_path / "subs-replay"
    assert grade.default_out(subs) == cli_args.default_out(subs, "grades")
    assert build_parser().parse_args(["replay", str(subs)]).out is None     # no longer required


@pytest.mark.parametrize("command", ("grade", "replay"))
def test_a_file_for_dir_says_it_is_a_file_and_how_to_grade_one_log(command, tmp_path):
    log = tmp_path / "train.log"
    log.write_text("iteration 1/ 200 | lm loss: 1.0E+01 |\n")
    done = subprocess.run([sys.executable, "-m", "harness", command, str(log), "--out", str(tmp_path / "o")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 4, (done.stdout[-2000:], done.stderr[-2000:])
    assert "is a file, not a folder" in done.stderr and f"--from-log {log}" in done.stderr, done.stderr
    assert "no such folder" not in done.stderr
    missing = subprocess.run([sys.executable, "-m", "harness", command, str(tmp_path / "none"), "--out",
                              str(tmp_path / "o")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 4 and "no such folder" in missing.stderr, missing.stderr[-2000:]


def test_replay_out_inside_dir_is_refused(tmp_path):
    (tmp_path / "subs" / "alice").mkdir(parents=True)
    done = subprocess.run([sys.executable, "-m", "harness", "replay", str(tmp_path / "subs"), "--out",
                           str(tmp_path / "subs" / "out")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 4 and "is inside DIR" in done.stderr, done.stderr[-2000:]


def test_pytest_help_shows_time_limit_and_hides_stage_timeout():
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert "--time-limit=S" in done.stdout and "--stage-timeout" not in done.stdout, done.stdout[-3000:]


def test_doctor_help_shows_its_exit_codes():
    text = " ".join(_help("doctor").split())
    assert "exit codes: 0 ready" in text and "1 not ready" in text and "4 usage error" in text, text


def test_doctor_python_row_reads_requires_python():
    """The doctor's Python check is the package's requires-python (installed metadata, else pyproject.toml)."""
    import tomllib

    from harness.cli import doctor

    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert doctor.requires_python().replace(" ", "") == declared.replace(" ", "") == ">=3.11"
    low = tuple(int(x) for x in declared.lstrip(">=").split("."))
    assert doctor.check_python(low + (0,)).status == "ok"
    below = (low[0], low[1] - 1, 9)
    row = doctor.check_python(below)
    assert row.status == "fail" and ">= 3.11" in row.requirement and "3.11 or newer" in row.fix, row
    assert doctor.check_python((3, 12, 1), spec=">=3.12").status == "ok"
    assert doctor.check_python((3, 11, 9), spec=">=3.12").status == "fail"


def test_doctor_reads_pyproject_where_the_package_is_not_installed(monkeypatch):
    import importlib.metadata

    from harness.cli import doctor

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "metadata", not_installed)
    assert doctor.requires_python() == ">=3.11"
