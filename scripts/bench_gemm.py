"""Throughput of bert-base's matrix multiplies on this CPU, by row count: where is oneDNN slow?

For each GEMM shape of a bert-base layer (fused Q/K/V 768 -> 2304, attention output 768 -> 768,
feed-forward 768 -> 3072 and 3072 -> 768) and a sweep of row counts, prints TFLOP/s of a plain
`F.linear` and, inside `cpu_gemm.SLOW_ROW_WINDOWS`, of the same GEMM split into row chunks
(`cpu_gemm.linear_chunked`; the model splits only on CPUs with AMX, where the window was
measured); on a CPU without bf16 units, also of the fp32 kernel over bf16 values that the model
uses there (`cpu_gemm.linear_in_fp32`). Each figure is the median of several calls cycling through 6 weight matrices, as a
layer stack does. Run it to check whether a machine has the slow window (see
`scratchbert/cpu_gemm.py`).

    python scripts/bench_gemm.py                  # bf16, 256 to 2048 rows in steps of 64
    python scripts/bench_gemm.py --dtype fp32 --step 128
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from scratchbert import cpu_gemm

SHAPES = {"qkv 768->2304": (768, 2304), "attn-out 768->768": (768, 768), "ffn-up 768->3072": (768, 3072), "ffn-down 3072->768": (3072, 768)}


def tflops(fn, x: torch.Tensor, layers: list[nn.Linear], repeats: int) -> float:
    def run():
        for layer in layers:
            fn(x, layer)

    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    rows, k = x.shape
    return len(layers) * 2 * rows * k * layers[0].out_features / statistics.median(times) / 1e12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--start", type=int, default=256)
    parser.add_argument("--stop", type=int, default=2048)
    parser.add_argument("--step", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    for name in ("start", "step", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.stop < args.start:
        parser.error(f"--stop ({args.stop}) must not be below --start ({args.start})")
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    layers = {name: [nn.Linear(k, n).to(dtype) for _ in range(6)] for name, (k, n) in SHAPES.items()}

    applied = "applies it here" if cpu_gemm.AMX_BF16 and dtype == torch.bfloat16 else "does not apply it here"
    in_fp32 = cpu_gemm.bf16_in_fp32(torch.device("cpu"), dtype)
    units = ("; no bf16 units either: the model runs its bf16 layers on fp32 kernels, `cpu_gemm.linear_in_fp32` (+)"
             if in_fp32 else "")
    print(f"TFLOP/s, {args.dtype}, {args.threads} threads: plain F.linear / split into row chunks (*), inside "
          f"cpu_gemm.SLOW_ROW_WINDOWS; this CPU {'has' if cpu_gemm.AMX_BF16 else 'has no'} AMX bf16, so the model "
          f"{applied}{units}")
    print("| rows | " + " | ".join(SHAPES) + " |")
    print("|---|" + "---|" * len(SHAPES))
    with torch.inference_mode():
        for rows in range(args.start, args.stop + 1, args.step):
            cells = []
            for name, (k, n) in SHAPES.items():
                x = torch.randn(rows, k, dtype=dtype)
                plain = tflops(lambda x, layer: layer(x), x, layers[name], args.repeats)
                chunks = cpu_gemm.window_chunks(rows, (k, n))
                cell = f"{plain:.3f}"
                if chunks > 1:
                    split = tflops(lambda x, layer: cpu_gemm.linear_chunked(x, layer, chunks), x, layers[name], args.repeats)
                    cell += f" / {split:.3f}*"
                if in_fp32:
                    fp32_kernel = tflops(cpu_gemm.linear_in_fp32, x, layers[name], args.repeats)
                    cell += f" / {fp32_kernel:.3f}+"
                cells.append(cell)
            print(f"| {rows} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
