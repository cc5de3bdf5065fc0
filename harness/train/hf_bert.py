"""The course's BERT trained with Hugging Face Transformers: a plain PyTorch loop around BertForPreTraining.

`python -m harness compare-hf` runs this beside the reference trainer. It takes the reference trainer's own
command line (harness.train.args: Megatron-LM's flag names, the course's values), so both sides read every size,
batch and schedule number from one parser, plus a few flags of its own (--corpus, --out, --binary-task). What it
does, in a Transformers script's terms (no HF Trainer, so no accelerate dependency; each part is what the Trainer
does by default):
- the model: BertConfig with the course's sizes and dropout, the vocab as the tokenizer has it (no padding to a
  multiple of 128), tanh GELU and LayerNorm eps 1e-5 as Megatron's BERT uses (set equal); BertForPreTraining's own
  layer order (post-LayerNorm) and initialisation, which have no switch;
- the data: harness.train.hf_data (tokenized in process, pairs built once, dynamic masking in the collator);
- micro-batches of --micro-batch-size, gradients accumulated over --global-batch-size / --micro-batch-size of them
  (the Trainer's gradient_accumulation_steps), each micro-batch's loss divided by their number;
- fp16: torch.autocast + torch.amp.GradScaler (its defaults, as accelerate creates it); a step whose gradients
  overflow is skipped by scaler.step and recognised as accelerate does (the scale went down); the learning-rate
  scheduler steps only after a step that was not skipped (the Trainer's rule, and Megatron's);
- AdamW (torch.optim.AdamW) with the flags' betas, eps and weight decay, biases and LayerNorm weights without decay
  (the Trainer's get_decay_parameter_names); gradients unscaled, then clipped to --clip-grad;
- the schedule: a LambdaLR whose factor is Megatron's OptimizerParamScheduler.get_lr (linear warmup from 0 over
  --lr-warmup-fraction of --lr-decay-iters, then the --lr-decay-style decay to --min-lr), written out below;
- logging: one JSON object per --log-interval (the Trainer's log_history), losses averaged over the interval's
  steps that were not skipped (Megatron's rule, so the curves compare point by point);
- checkpoints every --save-interval: checkpoint-N/ with model.safetensors + config.json (save_pretrained) and
  optimizer.pt, scheduler.pt, scaler.pt, rng_state.pth, as the Trainer's checkpoint-N holds.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from harness.train import hf_data

LAYERNORM_NAMES = ("LayerNorm", "layer_norm", "layernorm")


def build_parser():
    """The reference trainer's parser with the Hugging Face side's own flags added."""
    from harness.train.args import build_parser as trainer_parser

    p = trainer_parser()
    p.prog = "python -m harness.train.hf_bert"
    p.description = __doc__.splitlines()[0]
    hf = p.add_argument_group("the Hugging Face side")
    hf.add_argument("--corpus", default=None, help="the course corpus as JSON lines (python -m harness corpus)")
    hf.add_argument("--out", default=None, help="log_history.jsonl, summary.json and checkpoint-N/ go here")
    hf.add_argument("--binary-task", default="nsp", choices=hf_data.TASKS,
                    help="nsp: BertForPreTraining's next-sentence prediction (default); sop: Megatron's sentence order")
    hf.add_argument("--attn-implementation", default=None, help="transformers' attention kernel (default: its own)")
    return p


def parse_args(argv=None):
    """Parsed and completed the way harness.train.args.parse_args completes the trainer's (same defaults)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.corpus is None or args.out is None:
        parser.error("--corpus FILE and --out DIR are required (python -m harness compare-hf passes them)")
    if args.vocab_file is None:
        parser.error("--vocab-file is required (fixtures/vocab/bert-base-uncased-vocab.txt)")
    if args.fp16 and args.bf16:
        parser.error("--fp16 and --bf16 are exclusive")
    if not args.bert_binary_head:
        parser.error("--bert-no-binary-head: BertForPreTraining always has its binary head; compare recipe (a)")
    if args.hidden_size % args.num_attention_heads:
        parser.error("--hidden-size must be divisible by --num-attention-heads")
    if args.global_batch_size % args.micro_batch_size:
        parser.error(f"--global-batch-size {args.global_batch_size} is not a multiple of --micro-batch-size "
                     f"{args.micro_batch_size}")
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = 4 * args.hidden_size
    if args.lr_decay_iters is None:
        args.lr_decay_iters = args.train_iters
    return args


# ---- the schedule ----------------------------------------------------------------------------------------
def megatron_lr(steps: int, args) -> float:
    """Megatron's OptimizerParamScheduler.get_lr after `steps` optimizer steps (counted in samples, init lr 0)."""
    gbs = args.global_batch_size
    n = steps * gbs
    decay = args.lr_decay_iters * gbs
    warmup = args.lr_warmup_fraction * decay if args.lr_warmup_fraction is not None else args.lr_warmup_iters * gbs
    if warmup > 0 and n <= warmup:
        return args.lr * float(n) / float(warmup)
    if args.lr_decay_style == "constant":
        return args.lr
    if n > decay:
        return args.min_lr
    ratio = float(n - warmup) / float(decay - warmup)
    coeff = 1.0 - ratio if args.lr_decay_style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
    return args.min_lr + coeff * (args.lr - args.min_lr)


def lr_scheduler(optimizer, args):
    """LambdaLR over the optimizer's base lr (--lr): factor megatron_lr(steps) / --lr."""
    from torch.optim.lr_scheduler import LambdaLR

    return LambdaLR(optimizer, lambda steps: megatron_lr(steps, args) / args.lr if args.lr else 0.0)


# ---- the model -------------------------------------------------------------------------------------------
def bert_config(args, vocab_size: int):
    from transformers import BertConfig

    kwargs = {}
    if args.attn_implementation:
        kwargs["attn_implementation"] = args.attn_implementation
    return BertConfig(vocab_size=vocab_size, hidden_size=args.hidden_size, num_hidden_layers=args.num_layers,
                      num_attention_heads=args.num_attention_heads, intermediate_size=args.ffn_hidden_size,
                      hidden_act="gelu_new", hidden_dropout_prob=args.hidden_dropout,
                      attention_probs_dropout_prob=args.attention_dropout,
                      max_position_embeddings=args.max_position_embeddings, type_vocab_size=2,
                      initializer_range=args.init_method_std, layer_norm_eps=1e-5, pad_token_id=0, **kwargs)


def padded(size: int, multiple: int) -> int:
    """Megatron's vocab padding (--make-vocab-size-divisible-by x tensor-parallel size)."""
    return ((size + multiple - 1) // multiple) * multiple


def parameter_count(args, vocab_size: int) -> int:
    """BertForPreTraining's parameters at `vocab_size`, counted on the meta device (nothing allocated)."""
    from transformers import BertForPreTraining

    with torch.device("meta"):
        model = BertForPreTraining(bert_config(args, vocab_size))
    return sum(p.numel() for p in model.parameters())


def decay_groups(model, weight_decay: float) -> list[dict]:
    """The Trainer's two groups: no weight decay on biases and LayerNorm weights."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if name.endswith("bias") or any(k in name for k in LAYERNORM_NAMES) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# ---- the loop ---------------------------------------------------------------------------------------------
def _sync(device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def _mean(values: list) -> float | None:
    return sum(values) / len(values) if values else None


class HfRun:
    """One training run; `summary` is what summary.json holds."""

    def __init__(self, args):
        self.args = args
        self.t0 = time.perf_counter()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.summary: dict = {"framework": "transformers", "binary_task": args.binary_task}
        random.seed(args.seed)
        torch.manual_seed(args.seed)
        if args.device == "cuda":
            if not torch.cuda.is_available():
                raise SystemExit("CUDA is not available: no GPU visible to torch; use --device cpu for the smoke mode")
            self.device = torch.device("cuda", 0)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        self.amp_dtype = None
        if self.device.type == "cuda" and (args.fp16 or args.bf16):
            self.amp_dtype = torch.float16 if args.fp16 else torch.bfloat16
        self._data()
        self._model()
        self.summary["setup_s"] = round(time.perf_counter() - self.t0, 3)

    def _data(self) -> None:
        from harness.data.tokenizer import MegatronBertTokenizer

        args = self.args
        t = time.perf_counter()
        self.tokenizer = hf_data.hf_tokenizer(args.vocab_file, self.out / "tokenizer",
                                              lower_case=args.tokenizer_type == "BertWordPieceLowerCase")
        texts = hf_data.read_documents(args.corpus)
        lo, hi = hf_data.split_ranges(args.split, len(texts))[0]
        reference = self.reference = MegatronBertTokenizer.from_type(args.tokenizer_type, args.vocab_file)
        tokenized = hf_data.tokenize_documents(texts[lo:hi], self.tokenizer, reference)
        self.specials = hf_data.specials_of(self.tokenizer)
        examples = hf_data.build_examples(tokenized.documents, args.seq_length, args.short_seq_prob,
                                          args.binary_task, args.seed, self.specials)
        self.batches = hf_data.Batches(examples, args.micro_batch_size, hf_data.collator(self.tokenizer, args.mask_prob),
                                       args.seed)
        self.stats = hf_data.BatchStats()
        self.summary["tokenization"] = tokenized.summary()
        self.summary["data"] = {"documents_total": len(texts), "documents_train": hi - lo, "examples": len(examples),
                                "micro_batches_per_epoch": len(self.batches.loader),
                                "build_s": round(time.perf_counter() - t, 3)}

    def _model(self) -> None:
        from transformers import BertForPreTraining

        args = self.args
        vocab = len(self.tokenizer)
        self.model = BertForPreTraining(bert_config(args, vocab)).to(self.device)
        self.model.train()
        groups = decay_groups(self.model, args.weight_decay)
        self.optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(args.adam_beta1, args.adam_beta2),
                                           eps=args.adam_eps)
        self.scheduler = lr_scheduler(self.optimizer, args)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.amp_dtype == torch.float16)
        multiple = args.make_vocab_size_divisible_by * args.tensor_model_parallel_size
        megatron_vocab = self.reference.vocab_size   # the WordPiece file plus Megatron's [BOS]/[EOS]
        self.summary["parameters"] = {
            "count": sum(p.numel() for p in self.model.parameters()), "vocab_size": vocab,
            "count_at_megatron_vocab": parameter_count(args, padded(megatron_vocab, multiple)),
            "megatron_vocab_size": padded(megatron_vocab, multiple),
            "with_weight_decay": sum(p.numel() for p in groups[0]["params"]),
            "without_weight_decay": sum(p.numel() for p in groups[1]["params"]),
            "tensors_without_weight_decay": len(groups[1]["params"])}
        self.summary["model"] = {"class": type(self.model).__name__,
                                 "attn_implementation": getattr(self.model.config, "_attn_implementation", None),
                                 "hidden_act": self.model.config.hidden_act,
                                 "layer_norm_eps": self.model.config.layer_norm_eps,
                                 "layernorm_weights": [n for n, _ in self.model.named_parameters()
                                                       if "LayerNorm.weight" in n]}
        self.summary["precision"] = {"autocast": str(self.amp_dtype).replace("torch.", "") if self.amp_dtype else None,
                                     "grad_scaler": self.scaler.is_enabled(),
                                     "init_scale": self.scaler.get_scale() if self.scaler.is_enabled() else None,
                                     "growth_interval": self.scaler.get_growth_interval()
                                     if self.scaler.is_enabled() else None,
                                     "parameters_dtype": str(next(self.model.parameters()).dtype).replace("torch.", "")}
        self.accumulation = args.global_batch_size // args.micro_batch_size
        self.untimed_s = 0.0     # seconds inside the timed interval spent counting the batches (taken off)

    def _autocast(self):
        import contextlib

        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def _micro_batch(self) -> tuple[dict, float]:
        """The next micro-batch on the device, and the seconds it took to draw, mask and copy it."""
        t = time.perf_counter()
        batch = next(self.batches)
        t_masked = time.perf_counter()
        # the ids before masking, for the counts only (their time is taken off the step's): labels hold them where a
        # token is predicted
        original = torch.where(batch["labels"] != -100, batch["labels"], batch["input_ids"])
        special = (original == self.specials.cls) | (original == self.specials.sep) | (batch["attention_mask"] == 0)
        self.stats.add(batch, original, special.long(), self.specials.mask)
        t_stats = time.perf_counter()
        self.untimed_s += t_stats - t_masked
        on_device = {k: v.to(self.device, non_blocking=False) for k, v in batch.items()}
        return on_device, (t_masked - t) + (time.perf_counter() - t_stats)

    def _losses(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """BertForPreTraining's two losses, kept apart for the log (the model's own `loss` is their sum)."""
        with self._autocast():
            out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             token_type_ids=batch["token_type_ids"])
        vocab = out.prediction_logits.shape[-1]
        mlm = F.cross_entropy(out.prediction_logits.float().reshape(-1, vocab), batch["labels"].reshape(-1),
                              ignore_index=-100)
        binary = F.cross_entropy(out.seq_relationship_logits.float().reshape(-1, 2),
                                 batch["next_sentence_label"].reshape(-1))
        return mlm, binary

    def _step(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool, float]:
        """One optimizer step over the accumulated micro-batches: (mlm, binary, grad norm, skipped, data seconds)."""
        self.optimizer.zero_grad(set_to_none=True)
        mlm_sum = torch.zeros((), device=self.device)
        bin_sum = torch.zeros((), device=self.device)
        data_s = 0.0
        for _ in range(self.accumulation):
            batch, seconds = self._micro_batch()
            data_s += seconds
            mlm, binary = self._losses(batch)
            self.scaler.scale((mlm + binary) / self.accumulation).backward()
            mlm_sum += mlm.detach()
            bin_sum += binary.detach()
        self.stats.steps += 1
        self.scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.clip_grad) \
            if self.args.clip_grad > 0 else torch.zeros((), device=self.device)
        skipped = False
        if self.scaler.is_enabled():
            before = self.scaler.get_scale()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            skipped = self.scaler.get_scale() < before   # accelerate's optimizer_step_was_skipped
        else:
            self.optimizer.step()
        if not skipped:
            self.scheduler.step()
        return mlm_sum / self.accumulation, bin_sum / self.accumulation, norm.detach(), skipped, data_s

    def train(self) -> None:
        args = self.args
        log_path = self.out / "log_history.jsonl"
        log_path.unlink(missing_ok=True)
        pending: list = []          # (iteration, mlm, binary, norm, skipped) since the last log line
        kept = {"mlm": [], "binary": []}
        steps = {"mlm": [], "binary": [], "skipped": []}
        intervals: list[float] = []
        data_ms: list[float] = []
        save_s: dict = {}
        interval_start, interval_iters = _sync(self.device), 0
        last_norm = None
        skipped_since_reset = 0
        t_train = time.perf_counter()
        for iteration in range(1, args.train_iters + 1):
            mlm, binary, norm, skipped, data_s = self._step()
            pending.append((mlm, binary, norm, skipped))
            skipped_since_reset += int(skipped)
            data_ms.append(data_s * 1000.0)
            interval_iters += 1
            if iteration % args.log_interval == 0 or iteration == 1:   # Megatron's lines
                ms = (_sync(self.device) - interval_start - self.untimed_s) * 1000.0 / interval_iters
                last_norm = self._collect(pending, kept, steps, last_norm)
                line = {"iteration": iteration, "mlm_loss": _mean(kept["mlm"]), "binary_loss": _mean(kept["binary"]),
                        "learning_rate": self.optimizer.param_groups[0]["lr"],
                        "loss_scale": self.scaler.get_scale() if self.scaler.is_enabled() else 1.0,
                        "grad_norm": last_norm, "skipped": skipped_since_reset, "ms_per_iter": ms}
                if iteration > 1:
                    intervals.append(ms)
                with open(log_path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(line) + "\n")
                print(json.dumps(line), flush=True)
                pending = []
                if iteration % args.log_interval == 0:   # Megatron keeps counting across the iteration-1 line
                    kept = {"mlm": [], "binary": []}
                    skipped_since_reset = 0
                interval_iters = 0
                interval_start, self.untimed_s = _sync(self.device), 0.0
            if args.save_interval and iteration % args.save_interval == 0:
                t = _sync(self.device)
                self.save(iteration)
                save_s[str(iteration)] = round(_sync(self.device) - t, 3)
                interval_start, self.untimed_s = _sync(self.device), 0.0
        self._collect(pending, kept, steps, last_norm)   # steps after the last line: in the per-step record only
        steady = intervals[1:] or intervals
        self.summary.update({
            "iterations": args.train_iters, "device": self.device.type,
            "gpu": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None,
            "train_s": round(time.perf_counter() - t_train, 3), "steps": steps,
            "skipped_steps": int(sum(steps["skipped"])), "ms_per_iter_intervals": intervals,
            "ms_per_iter_median": statistics.median(steady) if steady else None,
            "data_ms_per_iter_median": statistics.median(data_ms[1:] or data_ms) if data_ms else None,
            "save_s": save_s, "batches": self.stats.summary(), "epochs_started": self.batches.epochs})

    @staticmethod
    def _collect(pending: list, kept: dict, steps: dict, last_norm):
        """The pending steps' losses read from the device in one sync, appended to the per-step record and, for the
        steps that were not skipped, to the interval's; returns the last kept step's grad norm."""
        if not pending:
            return last_norm
        values = torch.stack([torch.stack([m.float(), b.float(), n.float()]) for m, b, n, _ in pending]).tolist()
        for (m, b, n), (*_, skipped) in zip(values, pending):
            steps["mlm"].append(m)
            steps["binary"].append(b)
            steps["skipped"].append(skipped)
            if not skipped:
                kept["mlm"].append(m)
                kept["binary"].append(b)
                last_norm = n
        return last_norm

    def save(self, iteration: int) -> None:
        """checkpoint-N/ as the Trainer writes it: weights through save_pretrained (safetensors), the rest torch.save."""
        import numpy as np

        folder = self.out / f"checkpoint-{iteration}"
        self.model.save_pretrained(str(folder), safe_serialization=True)
        torch.save(self.optimizer.state_dict(), folder / "optimizer.pt")
        torch.save(self.scheduler.state_dict(), folder / "scheduler.pt")
        torch.save(self.scaler.state_dict(), folder / "scaler.pt")
        torch.save({"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else None},
                   folder / "rng_state.pth")

    def finish(self) -> dict:
        import transformers

        if self.device.type == "cuda":
            self.summary["torch_max_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
            self.summary["torch_max_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
        self.summary["total_s"] = round(time.perf_counter() - self.t0, 3)
        self.summary["versions"] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                                    "transformers": transformers.__version__, "python": sys.version.split()[0]}
        return self.summary


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    run = HfRun(args)
    run.train()
    summary = run.finish()
    (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"done: {args.train_iters} iterations, {summary['skipped_steps']} skipped, "
          f"{summary['ms_per_iter_median']} ms per iteration (median)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
