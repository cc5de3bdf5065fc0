"""`python -m harness COMMAND`: every user command of the harness, one table (docs/commands.md lists the same rows).

A command's module has either add_arguments(parser) and main(args) (its options are parsed here), or main(argv)
(it parses its own options: the rest of the command line is handed to it). `python -m harness --version` prints
the harness's version with the torch and megatron-core it finds.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help); grouped as docs/commands.md groups them
SUBCOMMANDS = {
    # grading
    "grade": ("harness.cli.grade", "judge a folder of student submissions (one sub-folder each: *.log, optionally "
                                   "the --save folder); writes grades.json/.md/.csv, JUnit and loss-curve pictures"),
    "gradescope": ("harness.cli.gradescope", "Gradescope autograder: grade /autograder/submission, write "
                                             "/autograder/results/results.json (paths configurable)"),
    "grade-checkouts": ("harness.cli.cluster.checkouts", "re-run every student's Megatron-LM checkout (checkout mode, "
                                                         "one GPU each) through submitit: a Slurm job array, or locally"),
    "replay": ("harness.cli.replay", "re-run each submission's own flags and seed with the reference trainer and "
                                     "compare every printed lm loss (docs/trust.md)"),
    "inspect": ("harness.evidence.checkpoints.inspector", "inspect one --save folder on the CPU (never unpickling "
                                                          "code): layout, tracker, shapes, loadable weights"),
    "log": ("harness.evidence.logs", "parse one Megatron-LM training log and print its records"),
    "log-evidence": ("harness.judge.log_evidence", "what one log proves about its device, memory and checkpoints"),
    # the machine and the releases
    "doctor": ("harness.cli.doctor", "check this machine against the course's requirements (GPU, torch, "
                                     "megatron-core, vocab, disk)"),
    "matrix": ("harness.cli.matrix", "checkout mode over every Megatron-LM release at once: one release x stage "
                                     "table (matrix.md/.json) with adaptations, final loss, curve drift, wall time"),
    "drift": ("harness.cli.drift", "compare two `pytest -m gpu` JUnit files: which version moved which criterion"),
    "checkout": ("harness.run.megatron_lm", "what a Megatron-LM checkout is and which adapters it needs"),
    # the pipeline's stages, by hand
    "corpus": ("harness.data.corpus", "write the course's toy corpus (loose JSON, one document per line)"),
    "preprocess": ("harness.data.preprocess", "Megatron's tools/preprocess_data.py for BERT WordPiece, offline"),
    "train": ("harness.train.__main__", "the reference trainer: the course's BERT recipe on pip megatron-core"),
    "nodes": ("harness.run.nodes", "several torchrun agents on one host standing in for several nodes"),
    # maintainers' tools
    "calibrate": ("harness.cli.calibrate", "measure golden values and run / derive the population of real runs"),
    "criteria": ("harness.judge.criteria", "judge one log against a criteria profile and print the verdicts"),
    "mutants": ("harness.judge.mutant_matrix", "the recorded log and each mutant judged by every criterion"),
    "catalogue": ("harness.tools.failure_catalogue", "the catalogue of real failures: fixture logs and hit rate"),
    "parity": ("harness.tools.parity", "a training log against Megatron-LM's recorded run, interval by interval"),
    "release-classes": ("harness.evidence.checkpoints.release_classes", "the classes each Megatron-LM release can "
                                                                        "pickle, read from its sources"),
    "bench": ("harness.tools.bench", "time the trainer, the gpu session, grading or preprocessing"),
    "replay-tolerance": ("harness.tools.replay_tolerance", "replay tolerances per precision from replays of honest "
                                                           "real runs (rule, held-out false alarms, forgery margin)"),
    # the chapter's learning goal
    "compare-hf": ("harness.cli.compare_hf", "the course's BERT trained with Megatron-LM and with Hugging Face "
                                             "Transformers on one GPU, side by side: compare.json/.md/.png and the "
                                             "student page"),
}


def version() -> str:
    """The harness's version and the versions of what it runs on (none imported: read from the installed metadata)."""
    from importlib import metadata

    from harness import __version__

    found = []
    for dist in ("torch", "megatron-core"):
        try:
            found.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            found.append(f"{dist} not installed")
    return f"bert-acceptance {__version__} (Python {sys.version.split()[0]}; {', '.join(found)})"


def _parses_own_argv(module) -> bool:
    return not hasattr(module, "add_arguments")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: one subparser per SUBCOMMANDS entry (a command that parses its own options gets one
    that hands it the rest of the line)."""
    from harness.cli.args import Parser, exit_codes_help

    parser = Parser(prog="python -m harness", description="bert-acceptance: train-a-small-BERT course checks and "
                                                          "grading", epilog=exit_codes_help())
    parser.add_argument("--version", action="version", version=version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        if name in _OWN_ARGV:
            sub.add_parser(name, help=help_text, add_help=False)
            continue
        module = importlib.import_module(module_name)
        module.add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    return parser


# commands whose module parses its own argv (no add_arguments): known without importing them
_OWN_ARGV = {"inspect", "log", "log-evidence", "drift", "checkout", "corpus", "preprocess", "train", "nodes", "calibrate",
             "criteria", "catalogue", "parity", "release-classes", "bench",
             "replay-tolerance"}


def main(argv: list[str] | None = None) -> int:
    """Run one command; its return value is the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in _OWN_ARGV:
        module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
        sys.argv[0] = f"python -m harness {argv[0]}"
        return module.main(argv[1:]) or 0
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 4   # usage error (harness.cli.args)
    module = importlib.import_module(SUBCOMMANDS[args.command][0])
    return module.main(args)


if __name__ == "__main__":
    sys.exit(main())
