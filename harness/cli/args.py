"""What every grading command shares on its command line: one spelling per option, one meaning per exit code.

Exit codes (grade, gradescope, replay, grade-checkouts, matrix; docs/commands.md has the one table), pytest's own
meanings for 2 and 4:

  0  all passed
  1  some failed
  2  interrupted (Ctrl-C, SIGTERM): what finished is written
  3  grader error: the grader or the machine could not judge something (never the student's fault)
  4  usage error: a bad option, DIR or OUT; one line naming it and the fix

Options: a time limit is `--time-limit S` (seconds) everywhere; `--jobs N` defaults to the machine's usable cores;
OUT defaults to DIR-<command> beside DIR. The old spellings (--timeout, --timeout-s, --time) still work, hidden from
--help, and print one line naming the new one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_PASSED, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_GRADER_ERROR, EXIT_USAGE = 0, 1, 2, 3, 4
EXIT_MEANINGS = {EXIT_PASSED: "all passed", EXIT_FAILED: "some failed", EXIT_INTERRUPTED: "interrupted",
                 EXIT_GRADER_ERROR: "grader error", EXIT_USAGE: "usage error"}


def exit_codes_help(**what: str) -> str:
    """The exit-code line of a command's --help: the shared meanings, each with what it means for this command
    (keyword names: passed, failed, interrupted, grader_error, usage)."""
    keys = {EXIT_PASSED: "passed", EXIT_FAILED: "failed", EXIT_INTERRUPTED: "interrupted",
            EXIT_GRADER_ERROR: "grader_error", EXIT_USAGE: "usage"}
    parts = []
    for code, meaning in EXIT_MEANINGS.items():
        detail = what.get(keys[code])
        if detail == "":
            continue        # a code this command never returns
        parts.append(f"{code} {meaning}" + (f" ({detail})" if detail else ""))
    return "exit codes: " + "; ".join(parts)


class Parser(argparse.ArgumentParser):
    """argparse with a usage error's exit code 4 (pytest's), not argparse's 2 (which means interrupted here)."""

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


class _Deprecated(argparse.Action):
    """An old spelling of an option: stores into the new option's dest (scaled: --time MIN into seconds) and prints
    one line naming the new spelling."""

    def __init__(self, option_strings, dest, new: str = "", scale: float = 1.0, **kwargs):
        self.new, self.scale = new, scale
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        unit = f" (minutes; --time-limit takes seconds: {values:g} min = {values * self.scale:g} s)" \
            if self.scale != 1.0 else ""
        print(f"note: {option_string} is deprecated: use {self.new}{unit}", file=sys.stderr)
        setattr(namespace, self.dest, values * self.scale)


def add_time_limit(parser, default: float, what: str, *, old: tuple[str, ...] = (), old_minutes: tuple[str, ...] = ()):
    """`--time-limit S` (seconds, > 0) for `what`; each of `old` a hidden deprecated alias in seconds, each of
    `old_minutes` one in minutes."""
    parser.add_argument("--time-limit", type=float, default=default, metavar="S", dest="time_limit",
                        help=f"{what} in seconds (default {default:g})")
    for flag in old:
        parser.add_argument(flag, type=float, dest="time_limit", action=_Deprecated, new="--time-limit",
                            help=argparse.SUPPRESS)
    for flag in old_minutes:
        parser.add_argument(flag, type=float, dest="time_limit", action=_Deprecated, new="--time-limit", scale=60.0,
                            help=argparse.SUPPRESS)


def add_jobs(parser, what: str) -> None:
    """`--jobs N`: `what` at once; 0 (the default): the machine's usable cores."""
    parser.add_argument("--jobs", type=int, default=0, metavar="N",
                        help=f"{what} at once (default: one per usable CPU core)")


def jobs(requested: int) -> int:
    """--jobs' value: N, or the machine's usable cores for 0."""
    from harness.base.proc import usable_cores

    return requested if requested > 0 else usable_cores()


def default_out(root: Path, command: str) -> Path:
    """OUT when none is given: DIR-<command> beside DIR (never inside it, where it would be taken for a
    submission)."""
    root = Path(root).expanduser()
    name = root.resolve().name or "submissions"
    return root.resolve().parent / f"{name}-{command}"


def not_a_folder(root: Path, what: str) -> str | None:
    """The usage error for a DIR argument that is not a folder, or None: a file says it is a file and how to grade
    one log; a missing path says so."""
    root = Path(root).expanduser()
    if root.is_dir():
        return None
    if root.exists():
        return (f"{root}: is a file, not a folder; {what} takes a folder with one sub-folder per submission. To grade "
                f"one log: put it in a folder of its own (mkdir -p batch/student && cp {root} batch/student/, then "
                f"give batch), or judge it alone with `pytest -m gpu --from-log {root}`")
    return f"{root}: no such folder; give a folder with one sub-folder per submission"
