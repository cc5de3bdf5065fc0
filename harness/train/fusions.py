"""Megatron-LM's fused bias-GELU without torch.compile: the same fp32 math, eager, CUDA-graph capturable.

Megatron-LM's default --bias-gelu-fusion makes the MLP call megatron.core.fusions.fused_bias_gelu.bias_gelu_impl:
the tanh approximation of GELU on (bias + y), compiled by torch.compile, which loads fp16 inputs, computes in
fp32 and rounds once. Compiling costs seconds in every process; this copy computes the same formulas in fp32
eagerly, forward and backward, and rounds the result to the input's dtype once.
"""

from __future__ import annotations

import torch


def bias_gelu(bias: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """fused_bias_gelu.bias_gelu in fp32."""
    x = bias.float() + y.float()
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


def bias_gelu_back(g: torch.Tensor, bias: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """fused_bias_gelu.bias_gelu_back in fp32."""
    x = bias.float() + y.float()
    tanh_out = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
    ff = 0.5 * x * ((1 - tanh_out * tanh_out) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + tanh_out)
    return ff * g.float()


class BiasGeLU(torch.autograd.Function):
    """fused_bias_gelu.GeLUFunction with one rounding to the input dtype per output."""

    @staticmethod
    def forward(ctx, input, bias):
        ctx.save_for_backward(input, bias)
        return bias_gelu(bias, input).to(input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        input, bias = ctx.saved_tensors
        tmp = bias_gelu_back(grad_output, bias, input).to(input.dtype)
        return tmp, tmp


def use_eager_bias_gelu() -> None:
    """Point megatron-core's MLP at BiasGeLU (it looks the function up in its module at call time)."""
    from megatron.core.transformer import mlp

    mlp.bias_gelu_impl = BiasGeLU.apply
