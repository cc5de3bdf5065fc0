"""The suite's pytest settings: each one a command-line flag and an ini key sharing one help text."""

from __future__ import annotations

# One help text per setting, shared by the command-line flag and the ini key (the pytest-timeout way).
OPTIONS = {
    "run_dir": ("--run-dir", "bert_run_dir", "directory for this session's run (default: a fresh runs/<timestamp>)"),
    "keep_run": ("--keep-run", "bert_keep_run", "keep the run directory even when every test passed"),
    "criteria": ("--criteria", "bert_criteria", "criteria profile: reference (default), course, or a path to a .toml"),
    "vocab_file": ("--vocab-file", "bert_vocab_file", "WordPiece vocab (default: fixtures/vocab/bert-base-uncased-vocab.txt)"),
    "reuse_run": ("--reuse-run", "bert_reuse_run", "judge an existing run directory instead of training again"),
    "from_log": ("--from-log", "bert_from_log", "judge a submitted Megatron training log (no GPU needed)"),
    "checkpoint_dir": ("--checkpoint-dir", "bert_checkpoint_dir", "with --from-log: the run's --save directory"),
    "stage_timeout": ("--stage-timeout", "bert_stage_timeout", "wall-clock limit per stage in seconds (default 300)"),
    "megatron_lm": ("--megatron-lm", "bert_megatron_lm", "grade a Megatron-LM checkout at PATH instead of the reference trainer"),
    "train_script": ("--train-script", "bert_train_script", "with --megatron-lm: the student's training script"),
    "skip_mutants": ("--skip-mutants", "bert_skip_mutants",
                     "do not train the live mutants (faster; the verdict on the course's criteria is the same)"),
}
FLAGS = {"keep_run", "skip_mutants"}


def setting(config, dest):
    """Effective value of a setting: command line wins over the ini key."""
    value = config.getoption(dest)
    if value is None:
        value = config.getini(OPTIONS[dest][1])
    return value
