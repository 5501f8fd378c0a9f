"""Splitting the rows of a bf16 matrix multiply that oneDNN would run slowly on CPU.

Measured on this project's machine (2 cores with AVX-512 BF16 / AMX, torch 2.13, oneDNN 3.12;
`python scripts/bench_gemm.py` prints the sweep): a bf16 `F.linear` with 768 outputs, bert-base's
hidden size, runs at about half its usual throughput when its input has between roughly 700 and
1500 rows. (M, 768) @ (768, 768): 1.2 TFLOP/s at 640 rows, 0.7 from 768 to 1472, 1.3-1.5 from
1536 on; (M, 3072) @ (3072, 768) drops the same way from 704 to 1,280 rows. There, two threads
do worse than one: oneDNN's split of the work between them, not the arithmetic, is at fault. Wider
outputs (the fused Q/K/V projection's 2304, the feed-forward's 3072) and fp32 (MKL's GEMM) show
no such window.

BERT meets these row counts all the time: 8 x 128 tokens is 1,024 rows, and the padding-free path
packs batches to whatever count of real tokens they hold. Multiplying those rows in chunks of at
most 640 puts every call back in the fast range; each row is the same dot products as before
(equal up to bf16 rounding, where the kernel blocks the sum differently). On bert-base in bf16 this made the encoder 10-14% faster on 1,024- and 1,205-row batches
and changed nothing elsewhere.

This is a workaround for one library on one kind of CPU, kept small and switchable: another
machine may have its slow window elsewhere or none (check with the script), and
`SLOW_ROW_WINDOWS.clear()` turns the split off.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# (in_features, out_features) -> (low, high): a bf16 CPU GEMM of that shape with low < rows < high
# is split into chunks of at most `low` rows. Measured for bert-base's two 768-output projections
# (see the module docstring); fp16 was not measured.
SLOW_ROW_WINDOWS: dict[tuple[int, int], tuple[int, int]] = {(768, 768): (640, 1536), (3072, 768): (640, 1344)}


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the matrix multiply will run in: the autocast dtype when autocast is on."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.get_autocast_dtype(x.device.type)
    return x.dtype


def row_chunks(rows: int, shape: tuple[int, int], device: torch.device, dtype: torch.dtype) -> int:
    """How many chunks to split `rows` into (1 = no split) for a GEMM of shape (in_features, out_features)."""
    window = SLOW_ROW_WINDOWS.get(shape)
    if window is None or device.type != "cpu" or dtype != torch.bfloat16:
        return 1
    low, high = window
    return math.ceil(rows / low) if low < rows < high else 1


def linear_in_row_chunks(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """`layer(x)` for x (..., in_features) -> (..., out_features), in row chunks where oneDNN is slow.

    Differentiable (each chunk is an ordinary `F.linear`; the chunks are concatenated).
    """
    rows = x.numel() // x.size(-1)
    chunks = row_chunks(rows, (layer.in_features, layer.out_features), x.device, _compute_dtype(x))
    if chunks == 1:
        return layer(x)
    flat = x.reshape(rows, x.size(-1))  # (M, in)
    out = torch.cat([F.linear(part, layer.weight, layer.bias) for part in flat.chunk(chunks)])  # (M, out)
    return out.view(*x.shape[:-1], layer.out_features)
