"""`pytest -m gpu --from-log LOG [--checkpoint-dir SAVE]`: the log judged in the bounded worker `python -m harness
grade` uses for each submission (harness.base.sandbox), with the same link refusal (docs/untrusted.md)."""

from __future__ import annotations

import os
from pathlib import Path

from harness.base import sandbox
from harness.report import gradebook
from harness.judge.profiles import Profile


class NotJudged(Exception):
    """`pytest --from-log`: the log was not judged (a link, a budget, something it raised); the message says why."""


def judge_log_bounded(profile: Profile, log, save_dir=None, budget: sandbox.Budget | None = None) -> list:
    """The verdicts of `pytest -m gpu --from-log LOG [--checkpoint-dir SAVE]`, judged in a bounded worker exactly
    as `grade` judges a submission: a LOG or SAVE that is a symlink or holds one leading out of it is refused, a
    budget exceeded or anything raised while reading is NotJudged naming it, never a hang or a traceback."""
    from harness.cli.grade import refusal
    from harness.judge import submission  # imported before the fork
    from harness.judge.profiles import Verdict

    budget = budget or sandbox.Budget()
    for given in filter(None, (log, save_dir)):
        path = Path(given)
        if path.is_symlink():
            raise NotJudged(f"refused: {gradebook.visible(str(path))} is a symlink (to "
                            f"{gradebook.visible(os.readlink(path))}); give the file or folder itself")
        if path.is_dir():
            refused = refusal(path)
            if refused:
                raise NotJudged(gradebook.visible(f"{path}: {refused}"))

    def judge(_item):
        from dataclasses import asdict

        sandbox.phase(f"reading {log}" + (f" and {save_dir}" if save_dir else ""))
        j = submission.judge_submission(profile, Path(log), Path(save_dir) if save_dir else None)
        return [asdict(v) for v in j.verdicts]

    outcome = sandbox.run_one(0, judge, budget)
    if not outcome.ok:
        raise NotJudged(gradebook.visible(f"not judged: {outcome.text(budget)} ({budget.words()}; "
                                          f"docs/untrusted.md)"))
    return [Verdict(**v) for v in outcome.value]
