"""`python -m harness SUBCOMMAND`: the harness's command line (one table entry per subcommand)."""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module with add_arguments(parser) and main(args) -> int, one-line help)
SUBCOMMANDS = {
    "doctor": ("harness.doctor", "check this machine against the course's requirements (GPU, torch, "
                                 "megatron-core, vocab, disk)"),
    "grade": ("harness.grade", "judge a folder of student submissions (one sub-folder each: *.log, optionally "
                               "the --save folder); writes grades.json/.md/.csv, JUnit and loss-curve pictures"),
    "gradescope": ("harness.gradescope", "Gradescope autograder: grade /autograder/submission, write "
                                         "/autograder/results/results.json (paths configurable)"),
    "grade-checkouts": ("harness.cluster.checkouts", "re-run every student's Megatron-LM checkout (checkout mode, one "
                                                     "GPU each) through submitit: a Slurm job array, or locally"),
    "matrix": ("harness.matrix", "checkout mode over every Megatron-LM release at once: one release x stage table "
                                 "(matrix.md/.json) with adaptations, final loss, curve drift, wall time; --compare"),
    "replay": ("harness.run.replay", "re-run each submission's own flags and seed with the reference trainer and "
                                     "compare every printed lm loss (docs/trust.md)"),
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per SUBCOMMANDS entry."""
    parser = argparse.ArgumentParser(prog="python -m harness",
                                     description="bert-acceptance harness: train-a-small-BERT course checks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        module.add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand; its return value is the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    return module.main(args)


if __name__ == "__main__":
    sys.exit(main())
