"""The CPU fast path, swapped into a model in place: the modeling file stays plain PyTorch.

`modeling_scratchbert.py` reads as the textbook has it: `self.dense(x)` is an `nn.Linear`,
queries, keys and values are three linear maps, "sdpa" is `F.scaled_dot_product_attention`.
`use_cpu_kernels(model)` (called by the model's `post_init` when `config.cpu_kernels` is on, the
default) changes the classes of the model's modules, keeping every parameter and buffer:

- `nn.Linear` -> `cpu_gemm.MeasuredLinear`: each matrix multiply on the kernel measured fastest
  for its shape on this CPU (`cpu_gemm.py`);
- `ScratchBertSelfAttention` -> `CpuSelfAttention`: where the model asks for "sdpa" (transformers'
  registry's `sdpa_attention_forward`) it runs
  `sdpa_or_bmm_attention` (SDPA, or for short sequences where two batched GEMMs, `bmm_attention`,
  measured faster on the first real calls; as SDPA itself chooses among its backends), and it stacks the Q/K/V
  projection into one GEMM where that measured faster (`cpu_gemm.stack_qkv`);
- `ScratchBertIntermediate` -> `CpuIntermediate` and `ScratchBertAddNorm` -> `CpuAddNorm`: in
  inference, where the GEMM runs on oneDNN, the GELU and the residual addition run as the
  GEMM's post-op instead of a second pass over its output (`cpu_gemm.linear_post_op`);
- the bucket planner of the padding-free path gets this path's cost of one attention call
  (`attention_call_cost`).

`use_cpu_kernels(model, enabled=False)` turns every module back into the plain one. Off the CPU,
under a tracer or compiler, for dtypes other than fp32/bf16 and where the CPU's capabilities are
unknown, the swapped modules run what the plain ones run. Outputs equal the plain model's to
floating-point rounding (tests/test_cpu_kernels.py); docs/performance.md has the measurements.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

# Names, not `from . import cpu_gemm`: a checkpoint saved with its code (trust_remote_code) carries
# the files its modules import as `from .module import name`, and only those.
from .bert_padding import CALL_COST, autocast_dtype, default_call_cost, is_tracing
from .cpu_gemm import MeasuredLinear, attention_kernel, bf16_in_fp32, linear_post_op, record_attention, stack_qkv
from .modeling_scratchbert import (
    ALL_ATTENTION_FUNCTIONS,
    ScratchBertAddNorm,
    ScratchBertIntermediate,
    ScratchBertModel,
    ScratchBertSelfAttention,
)

def bmm_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float,
) -> torch.Tensor:
    """`eager_attention`'s math as two batched GEMMs, the scale and mask folded into the first.

    `baddbmm(mask, Q, K^T, alpha=1/sqrt(D))` computes mask + Q K^T / sqrt(D) in one call, so the
    (S, S) scores are written once. Returns the context only. Shapes as in `eager_attention`:
    query, key, value (B, A, S, D), mask (B, 1, 1, S) additive or None -> (B, A, S, D).
    """
    batch, heads, seq, head_dim = query.shape
    q = query.reshape(batch * heads, seq, head_dim)  # (B*A, S, D): one GEMM per (sequence, head)
    k_t = key.reshape(batch * heads, seq, head_dim).transpose(1, 2)  # (B*A, D, S)
    v = value.reshape(batch * heads, seq, head_dim)  # (B*A, S, D)
    if mask is None:
        bias = q.new_zeros(()).expand(batch * heads, seq, seq)  # ignored: beta=0
        scores = torch.baddbmm(bias, q, k_t, beta=0, alpha=head_dim**-0.5)  # (B*A, S, S)
    else:
        bias = mask.to(q.dtype).expand(batch, heads, 1, seq).reshape(batch * heads, 1, seq)  # (B*A, 1, S)
        scores = torch.baddbmm(bias, q, k_t, alpha=head_dim**-0.5)  # (B*A, S, S)
    probs = F.dropout(scores.softmax(dim=-1), p=dropout_p)
    return torch.bmm(probs.to(v.dtype), v).view(batch, heads, seq, head_dim)  # (B, A, S, D)


def sdpa_attention(module: nn.Module, query, key, value, attention_mask, **kwargs) -> tuple[torch.Tensor, None]:
    """The registry's "sdpa" (transformers' `sdpa_attention_forward`), looked up per call. (B, A, S, D) -> (B, S, A, D)."""
    return ALL_ATTENTION_FUNCTIONS["sdpa"](module, query, key, value, attention_mask, **kwargs)


def sdpa_or_bmm_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The registry's "sdpa", or `bmm_attention` where it is a candidate and measured faster on real calls
    (`cpu_gemm.attention_kernel`). The registry's calling convention: q, k, v (B, A, S, D) -> (B, S, A, D).

    Never under a tracer: a recorded graph must serve every length, so it records SDPA.
    """
    if is_tracing():  # first: no guard on the length
        return sdpa_attention(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    kernel = attention_kernel(query)
    start = time.perf_counter()
    if kernel == "bmm":
        out = bmm_attention(query, key, value, attention_mask, dropout).transpose(1, 2).contiguous(), None  # (B, S, A, D)
    else:
        out = sdpa_attention(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    record_attention(query, kernel, time.perf_counter() - start)
    return out


class CpuSelfAttention(ScratchBertSelfAttention):
    """`ScratchBertSelfAttention` with the CPU fast path's attention and Q/K/V projection.

    The same parameters and state dict. Where the model asks for "sdpa" it runs
    `sdpa_or_bmm_attention`; "eager" (and a call that wants the probabilities) stays the
    written-out math, and every other implementation is the registry's.
    """

    def attention_function(self, output_attentions: bool):
        if not output_attentions and self.config._attn_implementation == "sdpa":
            return sdpa_or_bmm_attention
        return super().attention_function(output_attentions)

    def project(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values, from one stacked GEMM where that measured faster (`cpu_gemm.stack_qkv`).

        The three (H, H) weights stacked into one (3H, H) matrix: the input is read once and the
        machine runs one wide GEMM (3H outputs) instead of three narrow ones, the same numbers.
        Under autocast the weights are cast before stacking (half the bytes to copy).
        """
        if not stack_qkv(hidden_states):
            return super().project(hidden_states)
        weights = (self.query.weight, self.key.weight, self.value.weight)
        biases = (self.query.bias, self.key.bias, self.value.bias)
        dtype = autocast_dtype(hidden_states.device)
        if dtype is not None:
            weights, biases = [w.to(dtype) for w in weights], [b.to(dtype) for b in biases]
        projected = F.linear(hidden_states, torch.cat(weights), torch.cat(biases))  # (..., 3H)
        return projected.chunk(3, dim=-1)  # 3 x (..., H): views, no copy


class CpuIntermediate(ScratchBertIntermediate):
    """`ScratchBertIntermediate` with the GELU fused into oneDNN's GEMM in inference (`cpu_gemm.linear_post_op`)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if getattr(self.intermediate_act_fn, "act", None) is F.gelu:  # BERT's erf GELU, as oneDNN's "gelu"
            fused = linear_post_op(hidden_states, self.dense, "gelu")
            if fused is not None:
                return fused
        return super().forward(hidden_states)


class CpuAddNorm(ScratchBertAddNorm):
    """`ScratchBertAddNorm` with the residual addition fused into oneDNN's GEMM in inference (no dropout)."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        if not (self.training and self.dropout.p > 0):
            fused = linear_post_op(x, self.dense, "add", residual)
            if fused is not None:
                return self.LayerNorm(fused)
        return super().forward(x, residual)


# plain module class -> its CPU fast-path subclass (the same parameters, swapped by `__class__`)
FAST_MODULES: dict[type[nn.Module], type[nn.Module]] = {
    nn.Linear: MeasuredLinear,
    ScratchBertSelfAttention: CpuSelfAttention,
    ScratchBertIntermediate: CpuIntermediate,
    ScratchBertAddNorm: CpuAddNorm,
}


def attention_call_cost(dtype: torch.dtype, device: torch.device) -> float:
    """The bucket planner's fixed cost of one attention call on this path.

    As `bert_padding.default_call_cost`, except that bf16 whose matrix multiplies run on fp32
    kernels (CPUs without bf16 units, `cpu_gemm.bf16_in_fp32`) weighs calls as fp32 does.
    """
    if bf16_in_fp32(device, dtype):
        return CALL_COST
    return default_call_cost(dtype, device)


def use_cpu_kernels(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Swap the CPU fast path into `model` in place (enabled=False: swap the plain modules back).

    Classes change, objects stay: no parameter is copied or re-registered, the state dict and
    the optimizer's references are untouched, and it can be called any time, on any model
    holding scratchbert modules.
    """
    swaps = FAST_MODULES if enabled else {fast: plain for plain, fast in FAST_MODULES.items()}
    for module in model.modules():
        if type(module) in swaps:
            module.__class__ = swaps[type(module)]
        if isinstance(module, ScratchBertModel):
            module.attention_call_cost = attention_call_cost if enabled else default_call_cost
    return model
