"""One training step of the reference trainer: micro-batch loop, fp16 loss scaling, clip, AdamW.

The step is written without host syncs (skip decisions are `torch.where` on device tensors) so it can be
captured whole in one CUDA graph: the eager step is launch-bound (~2300 kernels, ~100 ms), the replayed
graph is not. Semantics follow Megatron's MixedPrecisionOptimizer: a step whose gradients overflow changes
nothing (weights, Adam moments and step count, LR schedule) except the loss scale.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from harness.train.schedule import LossScaler, LrSchedule

BATCH_KEYS = ("text", "types", "labels", "is_random", "padding_mask", "loss_mask")


@dataclass
class FlatParameters:
    """All trainable weights as views of one fp32 buffer, their grads as views of another.

    One buffer turns the optimizer into a dozen element-wise kernels and makes "undo a skipped step"
    impossible to get wrong; backward accumulates into the grad views in place.
    """

    params: list
    data: torch.Tensor
    grad: torch.Tensor
    decay_mask: torch.Tensor  # 1.0 where weight decay applies (Megatron: not biases, not 1-D tensors)
    norm_mask: torch.Tensor   # 1.0 where this rank counts the weight in the grad norm (no TP duplicates)

    @classmethod
    def adopt(cls, model: torch.nn.Module, tp_rank: int = 0) -> "FlatParameters":
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        total = sum(p.numel() for _, p in named)
        device = named[0][1].device
        data = torch.empty(total, dtype=torch.float32, device=device)
        grad = torch.zeros(total, dtype=torch.float32, device=device)
        decay = torch.empty(total, dtype=torch.float32, device=device)
        counted = torch.empty(total, dtype=torch.float32, device=device)
        offset = 0
        for name, p in named:
            n = p.numel()
            data[offset:offset + n].copy_(p.detach().reshape(-1))
            p.data = data[offset:offset + n].view_as(p)
            p.grad = grad[offset:offset + n].view_as(p)
            no_decay = name.endswith(".bias") or p.dim() == 1
            decay[offset:offset + n].fill_(0.0 if no_decay else 1.0)
            # Megatron's param_is_not_tensor_parallel_duplicate
            unique = getattr(p, "tensor_model_parallel", False) or tp_rank == 0
            counted[offset:offset + n].fill_(1.0 if unique else 0.0)
            offset += n
        return cls([p for _, p in named], data, grad, decay, counted)


class AdamW:
    """Decoupled-weight-decay Adam over the flat buffer, committing only when `ok` (Megatron's 'adam')."""

    def __init__(self, flat: FlatParameters, args):
        self.flat = flat
        self.beta1, self.beta2, self.eps = args.adam_beta1, args.adam_beta2, args.adam_eps
        self.weight_decay = args.weight_decay
        self.exp_avg = torch.zeros_like(flat.data)
        self.exp_avg_sq = torch.zeros_like(flat.data)
        self.step = torch.zeros((), dtype=torch.float32, device=flat.data.device)

    def update(self, grad: torch.Tensor, lr: torch.Tensor, ok: torch.Tensor) -> None:
        step = self.step + 1.0
        m = self.exp_avg * self.beta1 + grad * (1.0 - self.beta1)
        v = self.exp_avg_sq * self.beta2 + grad * grad * (1.0 - self.beta2)
        bias1 = 1.0 - torch.pow(self.beta1, step)
        bias2 = 1.0 - torch.pow(self.beta2, step)
        denom = (v / bias2).sqrt_().add_(self.eps)
        update = (m / bias1) / denom + self.flat.decay_mask * (self.weight_decay * self.flat.data)
        keep = ok.to(torch.float32)
        # lerp with weight 0 returns its start exactly: a skipped step leaves every tensor bit-identical.
        self.flat.data.lerp_(self.flat.data - lr * update, keep)
        self.exp_avg.lerp_(m, keep)
        self.exp_avg_sq.lerp_(v, keep)
        self.step.add_(keep)

    def state_dict(self) -> dict:
        return {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "step": float(self.step)}


def _group_size(group) -> int:
    if group is None or not torch.distributed.is_initialized():
        return 1
    return torch.distributed.get_world_size(group)


@dataclass
class Counters:
    """Device-side accumulators between two log lines (Megatron's total_loss_dict)."""

    lm_sum: torch.Tensor
    sop_sum: torch.Tensor
    advanced: torch.Tensor
    skipped: torch.Tensor
    nan: torch.Tensor
    grad_norm: torch.Tensor
    last_ok: torch.Tensor

    @classmethod
    def zeros(cls, device) -> "Counters":
        z = lambda: torch.zeros((), dtype=torch.float32, device=device)  # noqa: E731
        return cls(z(), z(), z(), z(), z(), z(), z())

    def reset(self) -> None:
        for t in (self.lm_sum, self.sop_sum, self.advanced, self.skipped, self.nan):
            t.zero_()

    def read(self) -> dict:
        """One host sync per log interval."""
        vals = torch.stack([self.lm_sum, self.sop_sum, self.advanced, self.skipped, self.nan,
                            self.grad_norm, self.last_ok]).tolist()
        keys = ("lm_sum", "sop_sum", "advanced", "skipped", "nan", "grad_norm", "last_ok")
        return dict(zip(keys, vals))


class StepEngine:
    """Static input buffers + the step and eval functions, optionally replayed as CUDA graphs."""

    def __init__(self, model, args, num_microbatches: int, device: torch.device, dp_group=None, tp_group=None):
        self.model = model
        self.args = args
        self.device = device
        self.m = num_microbatches
        self.dp_group, self.tp_group = dp_group, tp_group
        self.dp_size = _group_size(dp_group)
        self.tp_size = _group_size(tp_group)
        tp_rank = torch.distributed.get_rank(tp_group) if self.tp_size > 1 else 0
        self.flat = FlatParameters.adopt(model, tp_rank)
        self.adam = AdamW(self.flat, args)
        self.schedule = LrSchedule.from_args(args)
        self.scaler = LossScaler(args, device)
        self.sched_steps = torch.zeros((), dtype=torch.float32, device=device)
        self.counters = Counters.zeros(device)
        self.eval_sums = torch.zeros(2, dtype=torch.float32, device=device)
        self.nan_flag = torch.zeros((), dtype=torch.float32, device=device)
        shape = (self.m, args.micro_batch_size, args.seq_length)
        self.inputs = {k: torch.zeros(shape, dtype=torch.int64, device=device) for k in BATCH_KEYS if k != "is_random"}
        self.inputs["is_random"] = torch.zeros(self.m, args.micro_batch_size, dtype=torch.int64, device=device)
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self.graph_error: str | None = None
        if device.type != "cuda":  # CPU smoke mode computes in fp32; the loss scaler still runs
            self.autocast_dtype = None
        elif args.fp16:
            self.autocast_dtype = torch.float16
        elif args.bf16:
            self.autocast_dtype = torch.bfloat16
        else:
            self.autocast_dtype = None

    # ---- the computations -------------------------------------------------------------------------
    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        # cache_enabled=False: the autocast weight cache is not allowed inside a CUDA graph capture.
        return torch.autocast(self.device.type, dtype=self.autocast_dtype, cache_enabled=False)

    def _losses(self, i: int):
        """Megatron's pretrain_bert loss_func for micro-batch i: masked-mean lm loss, SOP cross-entropy."""
        x = self.inputs
        types = x["types"][i] if self.args.bert_binary_head else None
        with self._autocast():
            lm_tok, sop_logits = self.model(x["text"][i], x["padding_mask"][i], tokentype_ids=types,
                                            lm_labels=x["labels"][i])
        mask = x["loss_mask"][i].float().reshape(-1)
        lm = (lm_tok.float().reshape(-1) * mask).sum() / mask.sum()
        if sop_logits is None:
            return lm, torch.zeros_like(lm)
        sop = F.cross_entropy(sop_logits.reshape(-1, 2).float(), x["is_random"][i].reshape(-1), ignore_index=-1)
        return lm, sop

    def _train_step(self) -> None:
        self.flat.grad.zero_()
        lm_acc = torch.zeros((), dtype=torch.float32, device=self.device)
        sop_acc = torch.zeros((), dtype=torch.float32, device=self.device)
        for i in range(self.m):
            lm, sop = self._losses(i)
            if i == 0:  # the NaN mutant: poison one micro-batch's loss when nan_flag is set
                lm = lm * torch.where(self.nan_flag > 0, float("nan"), 1.0)
            (((lm + sop) / self.m) * self.scaler.scale).backward()
            lm_acc = lm_acc + lm.detach()
            sop_acc = sop_acc + sop.detach()
        lm_avg, sop_avg = lm_acc / self.m, sop_acc / self.m
        grad = self.flat.grad
        if self.dp_size > 1:  # Megatron's DDP: average gradients over the data-parallel group
            torch.distributed.all_reduce(grad, group=self.dp_group)
            grad.div_(self.dp_size)
        grad.mul_(1.0 / self.scaler.scale)
        inf_flag = (~torch.isfinite(grad).all()).to(torch.float32)
        if self.tp_size > 1:  # one rank's overflow skips the step on every rank of the model
            torch.distributed.all_reduce(inf_flag, op=torch.distributed.ReduceOp.MAX, group=self.tp_group)
        found_inf = inf_flag > 0
        grad.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
        squares = (grad * grad * self.flat.norm_mask).sum()
        if self.tp_size > 1:
            torch.distributed.all_reduce(squares, group=self.tp_group)
        norm = squares.sqrt()
        if self.args.clip_grad > 0:
            grad.mul_(torch.clamp(self.args.clip_grad / (norm + 1e-6), max=1.0))
        ok = ~found_inf
        lr = self.schedule.lr(self.sched_steps)
        self.adam.update(grad, lr, ok)
        self.sched_steps.add_(ok.to(torch.float32))
        self.scaler.update(found_inf)
        c = self.counters
        okf = ok.to(torch.float32)
        c.lm_sum.add_(torch.where(ok, lm_avg, 0.0))
        c.sop_sum.add_(torch.where(ok, sop_avg, 0.0))
        c.advanced.add_(okf)
        c.skipped.add_(1.0 - okf)
        c.nan.add_((found_inf & ~torch.isfinite(lm_avg + sop_avg)).to(torch.float32))
        c.grad_norm.copy_(torch.where(ok, norm, c.grad_norm))
        c.last_ok.copy_(okf)

    def _eval_step(self) -> None:
        lm_acc = torch.zeros((), dtype=torch.float32, device=self.device)
        sop_acc = torch.zeros((), dtype=torch.float32, device=self.device)
        with torch.no_grad():
            for i in range(self.m):
                lm, sop = self._losses(i)
                lm_acc = lm_acc + lm
                sop_acc = sop_acc + sop
        self.eval_sums[0].add_(lm_acc / self.m)
        self.eval_sums[1].add_(sop_acc / self.m)

    # ---- running them ----------------------------------------------------------------------------
    def load_batch(self, batch: dict) -> None:
        for k in BATCH_KEYS:
            self.inputs[k].copy_(batch[k], non_blocking=True)

    def train_step(self, batch: dict) -> None:
        self.load_batch(batch)
        self.model.train()
        if "train" in self.graphs:
            self.graphs["train"].replay()
        else:
            self._train_step()

    def eval_step(self, batch: dict) -> None:
        self.load_batch(batch)
        self.model.eval()
        if "eval" in self.graphs:
            self.graphs["eval"].replay()
        else:
            self._eval_step()
        self.model.train()

    def _mutable_state(self) -> list[torch.Tensor]:
        s = self.scaler
        c = self.counters
        return [self.flat.data, self.adam.exp_avg, self.adam.exp_avg_sq, self.adam.step, self.sched_steps,
                s.scale, s.growth_tracker, s.hysteresis_tracker, c.lm_sum, c.sop_sum, c.advanced, c.skipped,
                c.nan, c.grad_norm, c.last_ok, self.eval_sums]

    def capture(self, sample_batch: dict, rng_states: list) -> bool:
        """Warm up eagerly, restore the state, then capture train and eval steps as CUDA graphs.

        Returns False (and keeps the eager path) if capture fails; the reason is in `graph_error`.
        """
        if self.device.type != "cuda":
            return False
        saved = [t.clone() for t in self._mutable_state()]
        try:
            self.load_batch(sample_batch)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    self.model.train()
                    self._train_step()
                self.model.eval()
                self._eval_step()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            for name, fn, train in (("train", self._train_step, True), ("eval", self._eval_step, False)):
                graph = torch.cuda.CUDAGraph()
                for state in rng_states:
                    graph.register_generator_state(state)
                self.model.train(train)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    with torch.cuda.graph(graph):
                        fn()
                self.graphs[name] = graph
            if getattr(self.args, "inject_capture_failure", False):
                raise RuntimeError("--inject-capture-failure: capture fails here on purpose (mutant)")
            self.model.train()
        except Exception as exc:  # noqa: BLE001 - any capture failure falls back to the eager step
            self.graphs.clear()
            self.graph_error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            torch.cuda.synchronize()
        finally:
            for tensor, copy in zip(self._mutable_state(), saved):
                tensor.copy_(copy)
            self.flat.grad.zero_()
            self.model.train()
        return bool(self.graphs)
