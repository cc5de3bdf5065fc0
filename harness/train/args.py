"""Command line of the reference trainer: Megatron-LM's flag names, so the course's command runs unchanged."""

from __future__ import annotations

import argparse

# The course's command (docs/MEASURED.md "The course's flags"), minus data paths: the suite's default recipe.
COURSE_FLAGS = [
    "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1",
    "--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "8",
    "--seq-length", "128", "--max-position-embeddings", "512",
    "--micro-batch-size", "4", "--global-batch-size", "16", "--train-iters", "200",
    "--lr", "1e-4", "--lr-decay-iters", "100", "--lr-warmup-fraction", "0.1", "--min-lr", "1e-5",
    "--optimizer", "adam", "--tokenizer-type", "BertWordPieceLowerCase", "--split", "980,10,10",
    "--distributed-backend", "nccl", "--init-method-std", "0.02",
    "--attention-dropout", "0.1", "--hidden-dropout", "0.1", "--weight-decay", "0.01",
    "--clip-grad", "1.0", "--log-interval", "10", "--save-interval", "100",
    "--eval-interval", "50", "--eval-iters", "10", "--fp16",
]

# Megatron-LM flags that select kernels or implementations this trainer always uses; accepted and ignored.
IGNORED_SWITCHES = [
    "--no-persist-layer-norm", "--no-masked-softmax-fusion", "--no-gradient-accumulation-fusion",
    "--no-bias-gelu-fusion", "--no-bias-dropout-fusion", "--legacy-tokenizer", "--use-mcore-models",
    "--no-async-tensor-model-parallel-allreduce", "--use-cpu-initialization", "--bf16-no",
]
IGNORED_VALUED = ["--spec", "--attention-backend", "--num-workers", "--dataloader-type", "--partitions"]

# Why PP > 1 is refused: README "Beyond one GPU" has the details.
PIPELINE_REFUSED = (
    "--pipeline-model-parallel-size {size}: this trainer supports only 1. Its step is one forward and backward of "
    "the whole model per micro-batch, captured as one CUDA graph, with no pipeline schedule: pipeline stages need "
    "Megatron's schedule (activations and their gradients sent between stages each micro-batch, the loss only on "
    "the last stage, BERT's tied word embeddings all-reduced between first and last stage). Fix: split the model "
    "with --tensor-model-parallel-size, add data parallelism with torchrun --nproc-per-node, or train with "
    "Megatron-LM's pretrain_bert.py, which has the pipeline schedule."
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness train", description=__doc__, allow_abbrev=False)
    model = p.add_argument_group("model")
    model.add_argument("--num-layers", type=int, default=4)
    model.add_argument("--hidden-size", type=int, default=128)
    model.add_argument("--ffn-hidden-size", type=int, default=None)
    model.add_argument("--num-attention-heads", type=int, default=8)
    model.add_argument("--seq-length", type=int, default=128)
    model.add_argument("--max-position-embeddings", type=int, default=512)
    model.add_argument("--init-method-std", type=float, default=0.02)
    model.add_argument("--attention-dropout", type=float, default=0.1)
    model.add_argument("--hidden-dropout", type=float, default=0.1)
    model.add_argument("--bert-no-binary-head", dest="bert_binary_head", action="store_false")
    model.add_argument("--make-vocab-size-divisible-by", type=int, default=128)

    par = p.add_argument_group("parallelism")
    par.add_argument("--tensor-model-parallel-size", type=int, default=1)
    par.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    par.add_argument("--distributed-backend", default="nccl", choices=["nccl", "gloo"])

    opt = p.add_argument_group("optimisation")
    opt.add_argument("--micro-batch-size", type=int, default=4)
    opt.add_argument("--global-batch-size", type=int, default=16)
    opt.add_argument("--train-iters", type=int, default=200)
    opt.add_argument("--lr", type=float, default=1e-4)
    opt.add_argument("--min-lr", type=float, default=0.0)
    opt.add_argument("--lr-decay-iters", type=int, default=None)
    opt.add_argument("--lr-decay-style", default="linear", choices=["linear", "cosine", "constant"])
    opt.add_argument("--lr-warmup-fraction", type=float, default=None)
    opt.add_argument("--lr-warmup-iters", type=int, default=0)
    opt.add_argument("--optimizer", default="adam", choices=["adam"])
    opt.add_argument("--adam-beta1", type=float, default=0.9)
    opt.add_argument("--adam-beta2", type=float, default=0.999)
    opt.add_argument("--adam-eps", type=float, default=1e-8)
    opt.add_argument("--weight-decay", type=float, default=0.01)
    opt.add_argument("--clip-grad", type=float, default=1.0)
    opt.add_argument("--fp16", action="store_true")
    opt.add_argument("--bf16", action="store_true")
    opt.add_argument("--loss-scale", type=float, default=None, help="static loss scale (default: dynamic)")
    opt.add_argument("--initial-loss-scale", type=float, default=2.0 ** 32)
    opt.add_argument("--min-loss-scale", type=float, default=1.0)
    opt.add_argument("--loss-scale-window", type=int, default=1000)
    opt.add_argument("--hysteresis", type=int, default=2)
    opt.add_argument("--seed", type=int, default=1234)

    data = p.add_argument_group("data")
    data.add_argument("--data-path", nargs="+", default=None)
    data.add_argument("--vocab-file", default=None)
    data.add_argument("--tokenizer-type", default="BertWordPieceLowerCase",
                      choices=["BertWordPieceLowerCase", "BertWordPieceCase"])
    data.add_argument("--split", default="980,10,10")
    data.add_argument("--mask-prob", type=float, default=0.15)
    data.add_argument("--short-seq-prob", type=float, default=0.1)
    data.add_argument("--data-cache-path", default=None)

    io = p.add_argument_group("logging and checkpoints")
    io.add_argument("--log-interval", type=int, default=100)
    io.add_argument("--eval-interval", type=int, default=1000)
    io.add_argument("--eval-iters", type=int, default=100)
    io.add_argument("--save", default=None)
    io.add_argument("--load", default=None)
    io.add_argument("--save-interval", type=int, default=None)
    io.add_argument("--ckpt-format", default="torch_dist", choices=["torch_dist", "torch"])
    io.add_argument("--exit-interval", type=int, default=None)
    io.add_argument("--ckpt-step", type=int, default=None, help="with --load: this iteration, not the tracker's")
    io.add_argument("--no-load-optim", action="store_true")
    io.add_argument("--no-load-rng", action="store_true")

    suite = p.add_argument_group("bert-acceptance (not Megatron flags)")
    suite.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                       help="cpu: the CI smoke mode (gloo, fp32, eager)")
    suite.add_argument("--cuda-graph", default="auto", choices=["auto", "off"],
                       help="auto: capture the whole step in one CUDA graph, falling back to eager on failure "
                            "(the summary records why); off: the eager step")
    suite.add_argument("--inject-nan-at", type=int, default=None,
                       help="mutant: make the loss NaN from this iteration on (a diverged run: proves the divergence "
                            "criteria can fail)")
    suite.add_argument("--inject-leak-mib", type=int, default=0,
                       help="mutant: hold this many MiB more on the GPU through the allocator for the whole run (the "
                            "training's own memory grows: proves the memory criterion can fail)")
    suite.add_argument("--inject-crash-at", type=int, default=None,
                       help="mutant: raise an error after this iteration (proves the exit-code criterion can fail)")
    suite.add_argument("--inject-data-restart", action="store_true",
                       help="mutant: after --load, read the training data from sample 0 "
                            "(consumed samples not restored)")
    suite.add_argument("--inject-capture-failure", action="store_true",
                       help="mutant: make CUDA graph capture raise, so the trainer falls back to the eager step")
    suite.add_argument("--memory-cap-gb", type=float, default=None,
                       help="cap this process's CUDA memory (emulates a smaller card, e.g. 8 for the course's minimum)")
    suite.add_argument("--summary-json", default=None, help="write timings and versions here at exit")
    suite.add_argument("--wait-for-data", type=float, default=0.0, metavar="SECONDS",
                       help="wait this long for --data-path to appear (preprocessing still running); "
                            "PREFIX.failed appearing aborts the wait")
    suite.add_argument("--wait-for-load", type=float, default=0.0, metavar="SECONDS",
                       help="with --load and --ckpt-step N: set up (model, data, CUDA graphs) first, then wait this "
                            "long for the --load directory's tracker to name iteration N or later (the run saving it "
                            "is still training); LOAD.failed appearing aborts the wait")
    suite.add_argument("--sample-cache", default=None, metavar="DIR",
                       help="share the masked samples with other runs through DIR (harness.train.samples): each "
                            "sample is built once per dataset, by whichever run gets to it first")
    suite.add_argument("--sample-workers", type=int, default=None, metavar="N",
                       help="with --sample-cache: processes that build this run's missing samples (default: a "
                            "quarter of the cores, 1 to 4)")
    suite.add_argument("--stream-samples", action="store_true",
                       help="with --sample-cache: wait only for the first batch's samples, and read the others as "
                            "training reaches them (another process, the session's samples stage, builds them)")
    suite.add_argument("--samples-only", action="store_true",
                       help="with --sample-cache: build this command's datasets on the CPU, fill the cache with "
                            "--sample-workers processes and exit, without training (the session runs it once per "
                            "corpus, beside the trainers' start-up)")

    for flag in IGNORED_SWITCHES:
        p.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    for flag in IGNORED_VALUED:
        p.add_argument(flag, default=None, help=argparse.SUPPRESS)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and validate; errors name the flag and the fix, as argparse does."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.data_path is None:
        parser.error("--data-path is required (the prefix preprocessing wrote, e.g. data/corpus_text_sentence)")
    if args.vocab_file is None:
        parser.error("--vocab-file is required (fixtures/vocab/bert-base-uncased-vocab.txt)")
    if args.fp16 and args.bf16:
        parser.error("--fp16 and --bf16 are exclusive")
    if args.pipeline_model_parallel_size != 1:
        parser.error(PIPELINE_REFUSED.format(size=args.pipeline_model_parallel_size))
    if args.tensor_model_parallel_size < 1:
        parser.error(f"--tensor-model-parallel-size must be at least 1, got {args.tensor_model_parallel_size}")
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = 4 * args.hidden_size
    if args.lr_decay_iters is None:
        args.lr_decay_iters = args.train_iters
    if args.hidden_size % args.num_attention_heads:
        parser.error("--hidden-size must be divisible by --num-attention-heads")
    if args.save_interval is None and args.save:
        args.save_interval = args.train_iters
    if args.wait_for_load < 0:
        parser.error(f"--wait-for-load must be at least 0 seconds, got {args.wait_for_load:g}")
    if args.wait_for_load and args.load is None:
        parser.error("--wait-for-load needs --load DIR: the checkpoint directory to wait for")
    if args.wait_for_load and args.ckpt_step is None:
        parser.error("--wait-for-load needs --ckpt-step N: the iteration to wait for and load (the tracker may "
                     "still name an earlier save while the other run trains)")
    if args.device == "cpu":
        args.distributed_backend = "gloo"
    return args
