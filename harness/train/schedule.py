"""Megatron's learning-rate schedule and dynamic loss scaler, as tensor arithmetic.

Both live on the device so the whole training step can run as one CUDA graph with no host sync;
the formulas are Megatron's (OptimizerParamScheduler.get_lr, DynamicGradScaler.update).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LrSchedule:
    """OptimizerParamScheduler.get_lr with Megatron-LM's arguments: init lr 0, steps counted in samples."""

    max_lr: float
    min_lr: float
    warmup_steps: float  # samples, as Megatron-LM's get_optimizer_param_scheduler passes them
    decay_steps: float
    style: str = "linear"
    samples_per_step: int = 1

    @classmethod
    def from_args(cls, args) -> "LrSchedule":
        gbs = args.global_batch_size
        decay = args.lr_decay_iters * gbs
        if args.lr_warmup_fraction is not None:
            warmup = args.lr_warmup_fraction * decay
        else:
            warmup = args.lr_warmup_iters * gbs
        return cls(args.lr, args.min_lr, warmup, decay, args.lr_decay_style, gbs)

    def lr(self, steps: torch.Tensor) -> torch.Tensor:
        """Learning rate after `steps` successful optimizer steps, in float64 like Megatron's Python floats."""
        n = steps.to(torch.float64) * self.samples_per_step
        if self.style == "constant":
            after_warmup = torch.full_like(n, self.max_lr)
        else:
            ratio = ((n - self.warmup_steps) / max(float(self.decay_steps - self.warmup_steps), 1e-12)).clamp(0, 1)
            if self.style == "linear":
                coeff = 1.0 - ratio
            else:
                coeff = 0.5 * (torch.cos(math.pi * ratio) + 1.0)
            after_warmup = self.min_lr + coeff * (self.max_lr - self.min_lr)
            after_warmup = torch.where(n > self.decay_steps, torch.full_like(n, self.min_lr), after_warmup)
        if self.warmup_steps > 0:
            warm = 0.0 + (self.max_lr - 0.0) * n / float(self.warmup_steps)
            return torch.where(n <= self.warmup_steps, warm, after_warmup)
        return after_warmup

    def lr_host(self, steps: int) -> float:
        """Same formula on the host, for logging."""
        return float(self.lr(torch.tensor(float(steps))))


class LossScaler:
    """Megatron's DynamicGradScaler (or a constant scale), with its state in device tensors."""

    def __init__(self, args, device):
        self.dynamic = args.fp16 and args.loss_scale is None
        initial = args.loss_scale if args.loss_scale is not None else (args.initial_loss_scale if args.fp16 else 1.0)
        self.min_scale = float(args.min_loss_scale)
        self.window = int(args.loss_scale_window)
        self.hysteresis = int(args.hysteresis)
        self.scale = torch.tensor(float(initial), dtype=torch.float32, device=device)
        self.growth_tracker = torch.zeros((), dtype=torch.int32, device=device)
        self.hysteresis_tracker = torch.full((), self.hysteresis, dtype=torch.int32, device=device)

    def inv_scale(self) -> torch.Tensor:
        """MegatronGradScaler.inv_scale: 1/scale computed in float64, used in fp32."""
        return self.scale.double().reciprocal().float()

    def update(self, found_inf: torch.Tensor) -> None:
        """DynamicGradScaler.update, branch-free."""
        if not self.dynamic:
            return
        hyst = torch.where(found_inf, self.hysteresis_tracker - 1, self.hysteresis_tracker)
        growth = torch.where(found_inf, torch.zeros_like(self.growth_tracker), self.growth_tracker + 1)
        backoff = found_inf & (hyst <= 0)
        grow = (~found_inf) & (growth == self.window)
        scale = torch.where(backoff, torch.clamp(self.scale * 0.5, min=self.min_scale), self.scale)
        scale = torch.where(grow, scale * 2.0, scale)
        growth = torch.where(grow, torch.zeros_like(growth), growth)
        hyst = torch.where(grow, torch.full_like(hyst, self.hysteresis), hyst)
        self.scale.copy_(scale)
        self.growth_tracker.copy_(growth)
        self.hysteresis_tracker.copy_(hyst)

    def state_dict(self) -> dict:
        return {"scale": float(self.scale), "growth_tracker": int(self.growth_tracker),
                "hysteresis_tracker": int(self.hysteresis_tracker)}

    def load_state_dict(self, state: dict) -> None:
        self.scale.fill_(float(state["scale"]))
        self.growth_tracker.fill_(int(state["growth_tracker"]))
        self.hysteresis_tracker.fill_(int(state["hysteresis_tracker"]))
