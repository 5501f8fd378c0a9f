"""int8 inference on a CPU: `quantize_dynamic(model)`, named after the call users know from torch and ONNX Runtime.

    model = quantize_dynamic(AutoModel.from_pretrained(folder))   # in place; returned in eval mode

Every Linear of the encoder (query, key, value, attention output, intermediate, output) becomes
int8: weights with one scale per output channel, fixed once, and activations quantized at run
time with one scale per token (row), multiplied by `torch._int_mm` (int8 x int8 -> int32,
oneDNN's kernel; on a CPU with AVX-512 VNNI or AMX-INT8 it uses them):

    x (N, K) fp32  ->  q = round(x / s) int8, s = max|x_n| / 127 per row   (N, K), (N, 1)
    acc = q · W_q (K, O) int32                                             (N, O)
    y = acc * w_scale (1, O) * s (N, 1) + bias                             (N, O) fp32

Why one scale per token: BERT models have a few tokens ([SEP], punctuation) whose vectors are
many times larger than the rest; one scale for the whole batch (torch's `quantize_dynamic`,
ONNX Runtime's `DynamicQuantizeLinear`) rounds every other token coarsely. docs/deployment.md
has the measured accuracy of both.

The three projections of a self-attention layer become one stacked (K, 3H) int8 GEMM on one
quantized input (`Int8SelfAttention`), and the GELU and the residual addition run in place on the
GEMM's fp32 output (`Int8Intermediate`, `Int8AddNorm`): every temporary of the size of a layer's
output is a fresh allocation that the OS maps in page by page. Attention itself, LayerNorm, the
embeddings, the pooler and the heads stay fp32, on the CPU fast path (`cpu_kernels.py`). The
padding-free path runs as before: the int8 layers see the packed rows.

Inference only: the int8 layers have no gradient, and the model is changed in place. Nothing
quantized is saved: quantize after loading instead (the one-liner above). docs/performance.md
records the kernel choice and its measurements.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .cpu_kernels import CpuAddNorm, CpuIntermediate, CpuSelfAttention
from .errors import ScratchBertError
from .modeling_scratchbert import ScratchBertPreTrainedModel

INT8_MAX = 127  # symmetric int8: [-127, 127], so that -q is representable and zero is exact


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of `x` (N, K) as int8 and its scale (N, 1) fp32: x ~ q * scale.

    amax and amin instead of abs().amax(): two reductions and no (N, K) temporary.
    """
    absmax = torch.maximum(x.amax(dim=1, keepdim=True), x.amin(dim=1, keepdim=True).neg_())  # (N, 1)
    scale = absmax.clamp_(min=torch.finfo(torch.float32).tiny).div_(INT8_MAX)  # (N, 1)
    return torch.mul(x, scale.reciprocal()).round_().to(torch.int8), scale  # (N, K) int8


class Int8Linear(nn.Module):
    """y = x · Wᵀ + b for inference, with W int8 (a scale per output channel) and x int8 (a scale per row).

    x (..., in_features), any float dtype -> (..., out_features) in x's dtype; the products in
    int32, everything else in fp32. Built from an `nn.Linear` (or several stacked: `from_linears`).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        weight = weight.detach().float()  # (O, I)
        self.out_features, self.in_features = weight.shape
        scale = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / INT8_MAX  # (O,)
        quantized = torch.round(weight / scale[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)  # (O, I)
        self.register_buffer("weight_t", quantized.t().contiguous())  # (I, O): the layout `_int_mm` takes
        self.register_buffer("weight_scale", scale)  # (O,)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())  # (O,)

    @classmethod
    def from_linears(cls, *linears: nn.Linear) -> "Int8Linear":
        """One int8 layer computing `linears` side by side on the same input: outputs concatenated."""
        biases = [layer.bias for layer in linears]
        bias = None if any(b is None for b in biases) else torch.cat([b.detach() for b in biases])
        return cls(torch.cat([layer.weight.detach() for layer in linears]), bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Inference only: rounding has no gradient, so none flows back (and grad mode needs no no_grad()).
        rows = x.detach().reshape(-1, self.in_features).float()  # (N, I): every token, packed or padded
        quantized, scale = quantize_rows(rows)  # (N, I) int8, (N, 1)
        # int32 -> fp32 first, then the scales in place: torch.mul(int32, fp32) measured many times slower.
        out = torch._int_mm(quantized, self.weight_t).float().mul_(self.weight_scale)  # (N, O)
        if self.bias is None:
            out.mul_(scale)
        else:
            torch.addcmul(self.bias, out, scale, out=out)  # bias + out * scale, in place
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                "int8 weights per channel x int8 activations per token (torch._int_mm)")


class Int8SelfAttention(CpuSelfAttention):
    """Self-attention whose Q/K/V projection is one int8 GEMM (`qkv`, (H, 3H)); attention as the fast path's."""

    def project(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.qkv(hidden_states).chunk(3, dim=-1)  # 3 x (..., H): views of one (..., 3H) output


class Int8Intermediate(CpuIntermediate):
    """dense -> GELU, the GELU in place on the int8 layer's fresh output (erf GELU; other activations as written)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if getattr(self.intermediate_act_fn, "act", None) is F.gelu:
            return torch.ops.aten.gelu_(self.dense(hidden_states))
        return self.intermediate_act_fn(self.dense(hidden_states))


class Int8AddNorm(CpuAddNorm):
    """LayerNorm(residual + dropout(dense(x))), the residual added in place on the int8 layer's output."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)).add_(residual))


def quantize_dynamic(model: ScratchBertPreTrainedModel) -> ScratchBertPreTrainedModel:
    """The encoder's Linears as int8 layers (`Int8Linear`), in place; returns the model in eval mode.

    Raises a one-line `ScratchBertError` for a model that is not scratchbert's, one already
    quantized, or one not on the CPU.
    """
    if not isinstance(model, ScratchBertPreTrainedModel):
        raise ScratchBertError(
            f"quantize_dynamic takes a scratchbert model, not {type(model).__name__}: load one with "
            "AutoModel.from_pretrained(folder) after `import scratchbert` (or a ScratchBert* class), then quantize it."
        )
    if is_quantized(model):
        raise ScratchBertError("this model is already quantized: quantize_dynamic changes a model in place, once.")
    devices = {p.device.type for p in model.parameters()}
    if devices != {"cpu"}:
        raise ScratchBertError(f"quantize_dynamic is for CPU inference; this model is on {', '.join(sorted(devices))}: "
                               "call model.to('cpu') first.")
    model.eval()
    model.use_cpu_kernels()  # attention, LayerNorm and the heads on the fp32 fast path
    for layer in model.base_model.encoder.layer:
        attention = layer.attention.self
        attention.qkv = Int8Linear.from_linears(attention.query, attention.key, attention.value)
        del attention.query, attention.key, attention.value
        attention.__class__ = Int8SelfAttention
        for block, int8_class in ((layer.attention.output, Int8AddNorm), (layer.intermediate, Int8Intermediate),
                                  (layer.output, Int8AddNorm)):
            block.dense = Int8Linear(block.dense.weight, block.dense.bias)
            block.__class__ = int8_class
    return model


def is_quantized(model: nn.Module) -> bool:
    """Whether `quantize_dynamic` has run on `model` (it holds `Int8Linear`s)."""
    return any(isinstance(module, Int8Linear) for module in model.modules())


__all__ = ["Int8Linear", "is_quantized", "quantize_dynamic", "quantize_rows"]
