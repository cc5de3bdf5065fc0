"""The reference trainer: the course's BERT recipe on pip megatron-core, with Megatron-LM's log lines.

Replaces the course's broken `pretrain_bert_single_gpu.py`. Run with the course's flags:
    python -m harness train $(course flags) --data-path PREFIX --vocab-file VOCAB --save DIR
or under `torchrun --nproc-per-node N` for data/tensor parallelism. `--device cpu` is the CI smoke mode.

This module stays import-light on purpose: dist_checkpointing spawns helper interpreters that re-import
the main module, and importing torch there would cost seconds per checkpoint save.
"""

import sys


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if "-h" in args or "--help" in args:   # the help needs no torch (1.5-2 s to import)
        from harness.train.args import build_parser

        build_parser().print_help()
        return 0
    from harness.base.imports import collector_paused

    with collector_paused():   # torch; megatron-core follows once the arguments are read (run_training)
        from harness.train.trainer import run_training
    return run_training(argv)


if __name__ == "__main__":
    sys.exit(main())
