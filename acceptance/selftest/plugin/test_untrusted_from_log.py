"""`pytest -m gpu --from-log DIR` judges in the bounded worker `grade` uses: a link out of DIR is refused with a
clear error (the outside file is never printed), a log that hangs or raises is a clear `not judged`, never a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from harness.plugin import from_log
from harness.base import sandbox
from harness.judge import submission
from harness.base.paths import REPO
from harness.judge.profiles import load_profile

SECRET = "TOP-SECRET-OUTSIDE-THE-FOLDER"


def test_from_log_refuses_a_folder_with_a_link_leading_out(tmp_path):
    (tmp_path / "secret.txt").write_text(SECRET + "\n")
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "train.log").symlink_to(tmp_path / "secret.txt")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-m", "gpu",
                           "--from-log", str(tmp_path / "s")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "refused: train.log is a symlink" in done.stdout, done.stdout[-2000:]
    assert SECRET not in done.stdout + done.stderr


@pytest.mark.parametrize("what,expect", [("hang", "exceeded 1.5 s"), ("exit", "raised SystemExit"),
                                         ("ctrlc", "raised KeyboardInterrupt")])
def test_from_log_bounded_outcomes_are_clear_errors(tmp_path, monkeypatch, what, expect):
    log = tmp_path / "train.log"
    log.write_text("junk\n")

    def hostile(profile, log, save_dir=None):
        if what == "hang":
            while True:
                pass
        raise SystemExit(0) if what == "exit" else KeyboardInterrupt

    monkeypatch.setattr(submission, "judge_submission", hostile)
    started = time.monotonic()
    with pytest.raises(from_log.NotJudged, match=expect):
        from_log.judge_log_bounded(load_profile("reference"), log, None, sandbox.Budget(1.5, 1024))
    assert time.monotonic() - started < 10


def test_from_log_link_swapped_in_after_the_check_is_not_followed(tmp_path):
    """The file is opened without following links at the moment of opening (paths.open_inside): a train.log that
    becomes a symlink after any earlier check is refused, not read."""
    from harness.evidence import logread
    from harness.base.paths import NotInside

    (tmp_path / "secret.txt").write_text(SECRET + "\n")
    log = tmp_path / "train.log"
    log.write_text("ok\n")
    assert list(logread.read_lines(log)) == ["ok"]
    os.unlink(log)
    log.symlink_to(tmp_path / "secret.txt")          # the swap: same name, now a link
    with pytest.raises(NotInside, match="symlink"):
        list(logread.read_lines(log))
