"""The trainer's device-side copies of Megatron's fp16 machinery, checked against megatron-core's own classes.

The CUDA-graph step cannot call DynamicGradScaler (host-side Python branches), OptimizerParamScheduler (Python
floats) or Float16OptimizerWithFloat16Params (a host sync per step); it reproduces their math on device tensors.
These tests drive both with the same events on the CPU and require the same decisions and numbers.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from harness.evidence import logs
from harness.tools import parity
from harness.train.args import COURSE_FLAGS, parse_args
from harness.train.schedule import LossScaler, LrSchedule
from harness.train.step import AdamW, FlatParameters

ARGS = parse_args([*COURSE_FLAGS, "--data-path", "d", "--vocab-file", "v"])


@pytest.fixture
def megatron_scaler(monkeypatch):
    """megatron-core's DynamicGradScaler with its hard-coded device='cuda' tensors made on the CPU."""
    from megatron.core.optimizer import grad_scaler

    def cpu_tensor(*a, device=None, **k):
        return torch.tensor(*a, **k)

    monkeypatch.setattr(grad_scaler, "torch", SimpleNamespace(tensor=cpu_tensor, max=torch.max, float=torch.float))
    return grad_scaler.DynamicGradScaler(
        initial_scale=ARGS.initial_loss_scale, min_scale=ARGS.min_loss_scale, growth_factor=2.0, backoff_factor=0.5,
        growth_interval=ARGS.loss_scale_window, hysteresis=ARGS.hysteresis)


def _events(seed: int, n: int = 3000) -> list[bool]:
    """The fp16 start (17 overflows), then bursts of overflows and long clean runs (growth needs 1000)."""
    rng = random.Random(seed)
    out = [True] * 17
    while len(out) < n:
        out += [False] * rng.choice([1, 3, 999, 1000, 1200]) + [True] * rng.choice([1, 2, 3])
    return out[:n]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_scaler_follows_dynamic_grad_scaler(megatron_scaler, seed):
    """Same overflow sequence -> same scale, growth and hysteresis trackers after every step."""
    ours = LossScaler(ARGS, torch.device("cpu"))
    for step, found_inf in enumerate(_events(seed)):
        ours.update(torch.tensor(found_inf))
        megatron_scaler.update(found_inf)
        theirs = (float(megatron_scaler.scale), megatron_scaler._growth_tracker, megatron_scaler._hysteresis_tracker)
        mine = (float(ours.scale), int(ours.growth_tracker), int(ours.hysteresis_tracker))
        assert mine == theirs, f"step {step} (found_inf={found_inf}): trainer {mine}, DynamicGradScaler {theirs}"
        assert float(ours.inv_scale()) == float(megatron_scaler.inv_scale), step


def test_course_start_reaches_65536_after_17_skips():
    """The recorded run's loss scales: 2^23 at iteration 10 (10 overflows, hysteresis 2), 2^16 after 17."""
    scaler = LossScaler(ARGS, torch.device("cpu"))
    seen = {}
    for it in range(1, 18):
        scaler.update(torch.tensor(True))
        seen[it] = float(scaler.scale)
    recorded = {r.iteration: r.loss_scale for r in logs.parse_log_file(parity.load_spec().reference_log).iterations}
    assert (seen[10], seen[17]) == (recorded[10], recorded[20]), (seen, recorded)


def _megatron_scheduler(args):
    """OptimizerParamScheduler as Megatron-LM's get_optimizer_param_scheduler builds it (steps in samples)."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    gbs = args.global_batch_size
    decay = args.lr_decay_iters * gbs
    optimizer = SimpleNamespace(param_groups=[{"params": [], "wd_mult": 1.0}, {"params": [], "wd_mult": 0.0}])
    return OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=args.lr, min_lr=args.min_lr, lr_warmup_steps=args.lr_warmup_fraction * decay,
        lr_decay_steps=decay, lr_decay_style=args.lr_decay_style, start_wd=args.weight_decay,
        end_wd=args.weight_decay, wd_incr_steps=args.train_iters * gbs, wd_incr_style="constant"), optimizer


@pytest.mark.parametrize("extra", [(), ("--lr-decay-style", "cosine"), ("--lr-warmup-fraction", "0.25")])
def test_lr_schedule_equals_optimizer_param_scheduler(extra):
    """Course flags (and variants), 17 skipped steps then random skips: bit-equal lr at every iteration."""
    args = parse_args([*COURSE_FLAGS, "--data-path", "d", "--vocab-file", "v", *extra])
    scheduler, optimizer = _megatron_scheduler(args)
    ours, steps = LrSchedule.from_args(args), 0
    rng = random.Random(7)
    for it in range(1, args.train_iters + 1):
        skipped = it <= 17 or rng.random() < 0.05
        lr_used = float(ours.lr(torch.tensor(float(steps))))
        assert lr_used == optimizer.param_groups[0]["lr"], f"iteration {it}: lr used by the step"
        if not skipped:  # Megatron: opt_param_scheduler.step only when update_successful
            steps += 1
            scheduler.step(increment=args.global_batch_size)
        assert ours.lr_host(steps) == optimizer.param_groups[0]["lr"], f"iteration {it}: lr logged after it"


def test_lr_schedule_gives_the_recorded_learning_rates():
    """Every lr Megatron-LM printed, from the number of steps that were not skipped before that line."""
    records = logs.parse_log_file(parity.load_spec().reference_log).iterations
    ours = LrSchedule.from_args(ARGS)
    skipped = sum(r.skipped for r in records if r.iteration % 10 == 0 and r.iteration <= 20)  # 10 + 7
    for r in records:
        steps = max(0, r.iteration - skipped) if r.iteration >= 20 else 0
        assert f"{ours.lr_host(steps):.6E}" == f"{r.learning_rate:.6E}", r.iteration


class _Tiny(torch.nn.Module):
    """Weights, biases and a norm: both weight-decay groups."""

    def __init__(self):
        super().__init__()
        self.dense = torch.nn.Linear(6, 5)
        self.norm = torch.nn.LayerNorm(5)
        self.out = torch.nn.Linear(5, 3, bias=False)


def test_adamw_equals_torch_adamw_with_megatron_param_groups():
    """Our flat AdamW = torch.optim.AdamW (Megatron's fallback) with wd 0 on biases and 1-D params, skips kept."""
    torch.manual_seed(0)
    model, twin = _Tiny(), _Tiny()
    twin.load_state_dict(model.state_dict())
    decay = [p for n, p in twin.named_parameters() if not (n.endswith(".bias") or p.dim() == 1)]
    no_decay = [p for n, p in twin.named_parameters() if n.endswith(".bias") or p.dim() == 1]
    torch_opt = torch.optim.AdamW([{"params": decay, "weight_decay": ARGS.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=1e-3, foreach=True,
                                  betas=(ARGS.adam_beta1, ARGS.adam_beta2), eps=ARGS.adam_eps)
    flat = FlatParameters.adopt(model)
    adam = AdamW(flat, ARGS)
    for step in range(12):
        grads = [torch.randn_like(p) for p in twin.parameters()]
        ok = step % 4 != 3
        lr = 1e-3 * (1 + step % 3)
        if ok:
            for p, g in zip(twin.parameters(), grads):
                p.grad = g.clone()
            for group in torch_opt.param_groups:
                group["lr"] = lr
            torch_opt.step()
        flat.grad.copy_(torch.cat([g.reshape(-1) for g in grads]))
        adam.update(flat.grad, torch.tensor(lr, dtype=torch.float64), torch.tensor(ok))
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=2e-6, atol=1e-7, msg=f"step {step}: {name}")
    assert float(adam.step) == sum(1 for s in range(12) if s % 4 != 3)


def test_fp16_model_gets_fp32_main_params_and_fp16_grads():
    """An fp16 model: fp16 weight and grad views, fp32 main copy equal to it; the copy back rounds to fp16."""
    torch.manual_seed(0)
    model = _Tiny().half()
    flat = FlatParameters.adopt(model)
    assert flat.mixed and flat.model.dtype == flat.grad.dtype == torch.float16
    assert flat.data.dtype == flat.main_grad.dtype == torch.float32
    assert torch.equal(flat.data, flat.model.float())
    assert all(p.data.data_ptr() >= flat.model.data_ptr() for p in model.parameters())
    flat.data.add_(1e-4)  # below fp16 resolution for most weights: the fp16 model must show the rounding
    flat.copy_main_to_model()
    assert torch.equal(flat.model, flat.data.half()) and torch.equal(model.dense.weight.reshape(-1),
                                                                     flat.data[:30].half())


def test_mixed_precision_model_is_refused():
    """Parameters of two dtypes cannot share one flat buffer: the error says to wrap the whole model."""
    model = _Tiny()
    model.out.half()
    with pytest.raises(TypeError, match="Float16Module"):
        FlatParameters.adopt(model)


def test_eager_bias_gelu_is_megatrons_fused_bias_gelu(monkeypatch):
    """BiasGeLU computes megatron-core's (uncompiled) bias_gelu / bias_gelu_back formulas, rounded once to fp16."""
    from megatron.core.fusions import fused_bias_gelu as megatron
    from megatron.core.transformer import mlp

    from harness.train.fusions import BiasGeLU, use_eager_bias_gelu

    forward, backward = megatron.bias_gelu.__wrapped__, megatron.bias_gelu_back.__wrapped__
    torch.manual_seed(0)
    y, bias, g = torch.randn(64, 32) * 3, torch.randn(32), torch.randn(64, 32)
    y16 = y.half().requires_grad_()
    out = BiasGeLU.apply(y16, bias.half())
    out.backward(g.half())
    expected = forward(bias.half().float(), y16.detach().float()).half()
    expected_grad = backward(g.half().float(), bias.half().float(), y16.detach().float()).half()
    assert torch.equal(out, expected) and torch.equal(y16.grad, expected_grad)
    assert not torch.equal(out, torch.nn.functional.gelu(y16.detach().float() + bias.half().float()).half())
    monkeypatch.setattr(mlp, "bias_gelu_impl", mlp.bias_gelu_impl)  # restored after the test
    use_eager_bias_gelu()
    assert mlp.bias_gelu_impl == BiasGeLU.apply


def _float16_module(module: torch.nn.Module):
    """megatron-core's Float16Module around `module` (fp16 weights), as the trainer wraps BertModel."""
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1, fp16=True, cuda_graph_scope=[])
    return Float16Module(config, module)


def test_checkpoint_weights_load_into_a_float16_module():
    """Float16Module.load_state_dict returns None: load_weights loads the wrapped module and still checks keys."""
    from harness.train.ckpt import load_weights

    torch.manual_seed(0)
    source, target = _float16_module(_Tiny()), _float16_module(_Tiny())
    load_weights(target, source.state_dict(), "ckpt")
    assert all(torch.equal(a, b) for a, b in zip(source.state_dict().values(), target.state_dict().values()))
    partial = {k: v for k, v in source.state_dict().items() if not k.startswith("out.")}
    with pytest.raises(RuntimeError, match=r"ckpt does not fit the model: missing \['out.weight'\]"):
        load_weights(target, partial, "ckpt")
