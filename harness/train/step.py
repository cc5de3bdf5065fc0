"""One training step of the reference trainer: Megatron-LM's --fp16 regime, written to run as one CUDA graph.

Megatron's --fp16: the model is a Float16Module (fp16 parameters and activations); backward accumulates the
micro-batches' gradients in an fp16 buffer (Megatron's DDP grad buffer: accumulate_allreduce_grads_in_fp32 is
off); Float16OptimizerWithFloat16Params copies them to fp32 main gradients, checks them for inf/NaN while
unscaling, skips the step on overflow (DynamicGradScaler: hysteresis, backoff), else clips the fp32 gradients
by their global norm, runs torch's AdamW (Megatron's fallback without Apex/TE) on fp32 main parameters with
its weight-decay groups, and copies the main parameters back into the fp16 model. Every skip decision is a
`torch.where` on device tensors: no host sync, so the eager step (~2300 kernels, launch-bound) can be
captured whole and replayed. --bf16 and fp32 keep fp32 parameters (bf16 under autocast).
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
    """The model's weights and grads as views of two flat buffers, plus fp32 main copies for fp16 models.

    One buffer turns the optimizer into a dozen element-wise kernels and makes "undo a skipped step"
    impossible to get wrong; backward accumulates into the grad views in place (fp16 for an fp16 model,
    as Megatron's DDP grad buffer does). For an fp32 model `main` is `model` and `main_grad` is `grad`.
    """

    params: list
    model: torch.Tensor      # the model's own parameters (fp16 or fp32)
    grad: torch.Tensor       # their gradients, same dtype
    data: torch.Tensor       # fp32 main parameters (Float16OptimizerWithFloat16Params' fp32_from_float16)
    main_grad: torch.Tensor  # fp32 main gradients
    decay_mask: torch.Tensor  # 1.0 where weight decay applies (Megatron: not biases, not 1-D tensors)
    norm_mask: torch.Tensor   # 1.0 where this rank counts the weight in the grad norm (no TP duplicates)

    @property
    def mixed(self) -> bool:
        """True when the model is fp16/bf16 and the optimizer keeps separate fp32 main copies."""
        return self.model.dtype != torch.float32

    @classmethod
    def adopt(cls, model: torch.nn.Module, tp_rank: int = 0) -> "FlatParameters":
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        total = sum(p.numel() for _, p in named)
        device, dtype = named[0][1].device, named[0][1].dtype
        flat = torch.empty(total, dtype=dtype, device=device)
        grad = torch.zeros(total, dtype=dtype, device=device)
        decay = torch.empty(total, dtype=torch.float32, device=device)
        counted = torch.empty(total, dtype=torch.float32, device=device)
        offset = 0
        for name, p in named:
            if p.dtype != dtype:
                raise TypeError(f"parameter {name} is {p.dtype}, the model's first parameter is {dtype}: "
                                "wrap the whole model in one precision (Float16Module)")
            n = p.numel()
            flat[offset:offset + n].copy_(p.detach().reshape(-1))
            p.data = flat[offset:offset + n].view_as(p)
            p.grad = grad[offset:offset + n].view_as(p)
            no_decay = name.endswith(".bias") or p.dim() == 1
            decay[offset:offset + n].fill_(0.0 if no_decay else 1.0)
            # Megatron's param_is_not_tensor_parallel_duplicate
            unique = getattr(p, "tensor_model_parallel", False) or tp_rank == 0
            counted[offset:offset + n].fill_(1.0 if unique else 0.0)
            offset += n
        if dtype == torch.float32:
            data, main_grad = flat, grad
        else:
            data, main_grad = flat.float(), torch.zeros(total, dtype=torch.float32, device=device)
        return cls([p for _, p in named], flat, grad, data, main_grad, decay, counted)

    def copy_main_to_model(self) -> None:
        """Megatron's _copy_main_params_to_model_params (fp32 -> fp16 rounding); nothing for an fp32 model."""
        if self.mixed:
            self.model.copy_(self.data)


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32)


class AdamW:
    """torch.optim.AdamW's foreach step (Megatron's Adam without Apex/TE) over the flat buffer, kept only when `ok`.

    Scalars (lr, bias corrections, decay factor) are float64 like torch's Python floats and enter the fp32
    element-wise math as fp32, in the order torch's _multi_tensor_adam applies them.
    """

    def __init__(self, flat: FlatParameters, args):
        self.flat = flat
        self.beta1, self.beta2, self.eps = args.adam_beta1, args.adam_beta2, args.adam_eps
        self.weight_decay = args.weight_decay
        self.exp_avg = torch.zeros_like(flat.data)
        self.exp_avg_sq = torch.zeros_like(flat.data)
        self.step = torch.zeros((), dtype=torch.float32, device=flat.data.device)

    def update(self, grad: torch.Tensor, lr: torch.Tensor, ok: torch.Tensor) -> None:
        p = self.flat.data
        lr = lr.to(torch.float64)
        step = self.step.to(torch.float64) + 1.0
        decay = _f32(1.0 - lr * self.weight_decay)  # no-decay group: weight_decay 0, factor exactly 1
        new_p = p * torch.where(self.flat.decay_mask > 0, decay, torch.ones_like(decay))
        m = self.exp_avg.lerp(grad, 1.0 - self.beta1)
        v = (self.exp_avg_sq * self.beta2).addcmul_(grad, grad, value=1.0 - self.beta2)
        bias1 = 1.0 - torch.pow(torch.full_like(step, self.beta1), step)
        bias2 = 1.0 - torch.pow(torch.full_like(step, self.beta2), step)
        step_size = _f32(-(lr / bias1))
        denom = (v.sqrt() / _f32(bias2.sqrt())).add_(self.eps)
        new_p.add_(step_size * (m / denom))
        # torch.where keeps every tensor bit-identical on a skipped step (and ignores NaN in the update).
        p.copy_(torch.where(ok, new_p, p))
        self.exp_avg.copy_(torch.where(ok, m, self.exp_avg))
        self.exp_avg_sq.copy_(torch.where(ok, v, self.exp_avg_sq))
        self.step.add_(ok.to(torch.float32))

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
        if device.type != "cuda" or self.flat.mixed:  # Float16Module casts itself; CPU smoke mode is fp32
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
        self.flat.grad.zero_()  # Megatron's zero_grad_buffer
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
        flat = self.flat
        if self.dp_size > 1:  # Megatron's DDP: average the gradient buffer over the data-parallel group
            torch.distributed.all_reduce(flat.grad, group=self.dp_group)
            flat.grad.div_(self.dp_size)
        grad = flat.main_grad
        if flat.mixed:  # Float16OptimizerWithFloat16Params._copy_model_grads_to_main_grads
            grad.copy_(flat.grad)
        # _unscale_main_grads_and_check_for_nan: inf/NaN check on the fp32 main grads, times 1/scale
        inf_flag = (~torch.isfinite(grad).all()).to(torch.float32)
        grad.mul_(self.scaler.inv_scale())
        if self.tp_size > 1:  # one rank's overflow skips the step on every rank of the model
            torch.distributed.all_reduce(inf_flag, op=torch.distributed.ReduceOp.MAX, group=self.tp_group)
        found_inf = inf_flag > 0
        grad.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)  # a skipped step's grads feed no kept value
        squares = (grad * grad * flat.norm_mask).sum()
        if self.tp_size > 1:
            torch.distributed.all_reduce(squares, group=self.tp_group)
        # clip_grad_norm_fp32: total_norm is a Python float (float64) and so is the clip coefficient
        norm = squares.to(torch.float64).sqrt()
        if self.args.clip_grad > 0:
            coeff = self.args.clip_grad / (norm + 1.0e-6)
            grad.mul_(torch.where(coeff < 1.0, coeff, torch.ones_like(coeff)).to(torch.float32))
        ok = ~found_inf
        lr = self.schedule.lr(self.sched_steps)
        self.adam.update(grad, lr, ok)
        flat.copy_main_to_model()
        self.sched_steps.add_(ok.to(torch.float32))
        self.scaler.update(found_inf)
        c = self.counters
        okf = ok.to(torch.float32)
        c.lm_sum.add_(torch.where(ok, lm_avg, 0.0))
        c.sop_sum.add_(torch.where(ok, sop_avg, 0.0))
        c.advanced.add_(okf)
        c.skipped.add_(1.0 - okf)
        c.nan.add_((found_inf & ~torch.isfinite(lm_avg + sop_avg)).to(torch.float32))
        c.grad_norm.copy_(torch.where(ok, norm.to(torch.float32), c.grad_norm))
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
        return [self.flat.model, self.flat.data, self.adam.exp_avg, self.adam.exp_avg_sq, self.adam.step,
                self.sched_steps, s.scale, s.growth_tracker, s.hysteresis_tracker, c.lm_sum, c.sop_sum,
                c.advanced, c.skipped, c.nan, c.grad_norm, c.last_ok, self.eval_sums]

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
