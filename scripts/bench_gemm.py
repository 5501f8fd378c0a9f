"""Throughput of every CPU kernel on every matrix multiply of bert-base's linear layers, and cpu_gemm's choice.

For each GEMM shape of a bert-base layer (Q/K/V and attention output 768 -> 768, feed-forward
768 -> 3072 and 3072 -> 768, the MLM decoder 768 -> 30522) and each row count, times each
candidate kernel of `scratchbert/cpu_gemm.py` on each product a linear layer computes: the forward
in inference (where the prepacked weight is a candidate) and in training, grad_input = g·W and
grad_weight = gᵀ·x. Figures are GFLOP/s, best of --repeats calls (interleaved across kernels);
"chosen" is what cpu_gemm's own short measurement proposed in this process (it may differ where two
kernels are within noise; it keeps torch's own call unless another is `cpu_gemm.MARGIN` faster);
in a model, a proposal other than torch's own call is then confirmed or dropped on the real calls.
On CPUs with AMX, bf16 forwards inside `cpu_gemm.SLOW_ROW_WINDOWS` also show the same product
split into row chunks (*), the choice the model makes there.

    python scripts/bench_gemm.py                                # fp32 and bf16, 512 and 2048 rows
    python scripts/bench_gemm.py --dtype fp32 --rows 430 1024 2048 --repeats 10
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from scratchbert import cpu_gemm

# (in_features, out_features) of bert-base's linear layers ("attention": queries, keys, values and
# the attention output).
SHAPES = {"attention 768->768": (768, 768), "ffn-up 768->3072": (768, 3072),
          "ffn-down 3072->768": (3072, 768), "mlm-decoder 768->30522": (768, 30522)}
# (label, product, inference)
PRODUCTS = (("forward, inference", "forward", True), ("forward, training", "forward", False),
            ("grad_input g·W", "grad_input", False), ("grad_weight gᵀ·x", "grad_weight", False))
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def chunked_seconds(rows: int, k: int, n: int, chunks: int, repeats: int) -> float:
    """Best seconds of a bf16 forward split into `chunks` row chunks, each on cpu_gemm's chosen kernel."""
    layer = nn.Linear(k, n).to(torch.bfloat16)
    x = torch.randn(rows, k, dtype=torch.bfloat16)
    parts = x.chunk(chunks)
    with torch.no_grad():
        for part in parts:
            cpu_gemm.linear_weights(part, layer.weight, layer.bias)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.cat([cpu_gemm.linear_weights(part, layer.weight, layer.bias) for part in parts])
            best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=["fp32", "bf16", "both"], default="both")
    parser.add_argument("--rows", type=int, nargs="+", default=[512, 2048], help="row counts M (tokens in the batch)")
    parser.add_argument("--shapes", nargs="+", choices=[s.split()[0] for s in SHAPES], default=None,
                        help="only these shapes (default: all)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per kernel")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    for name in ("repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if min(args.rows) < 1:
        parser.error("--rows must all be at least 1")
    torch.set_num_threads(args.threads)
    dtypes = list(DTYPES) if args.dtype == "both" else [args.dtype]
    shapes = {name: shape for name, shape in SHAPES.items() if args.shapes is None or name.split()[0] in args.shapes}

    name = (cpu_gemm.CAPABILITIES or {}).get("cpu_name", "unknown CPU")
    units = {True: "bf16 units", False: "no bf16 units", None: "unknown bf16 support"}[cpu_gemm.BF16_UNITS]
    cannot = [f"{kernel} in {dtype_name}" for dtype_name in dtypes for kernel in cpu_gemm.KERNELS
              if kernel.startswith("onednn") and not cpu_gemm.runnable(kernel, DTYPES[dtype_name])]
    print(f"GFLOP/s, {args.threads} threads, best of {args.repeats}; {name}, {units}, "
          f"{'AMX: bf16 row chunks (*) inside SLOW_ROW_WINDOWS' if cpu_gemm.AMX_BF16 else 'no AMX'}, "
          f"oneDNN {'callable' if cpu_gemm.ONEDNN else 'not callable'}"
          + (f"; cannot run on this CPU ('–'): {', '.join(cannot)}" if cannot else ""))
    print("| dtype | shape | product | rows | " + " | ".join(cpu_gemm.KERNELS) + " | chosen |")
    print("|---|---|---|---|" + "---|" * len(cpu_gemm.KERNELS) + "---|")
    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]
        for shape_name, (k, n) in shapes.items():
            for label, product, inference in PRODUCTS:
                for rows in args.rows:
                    gemm = cpu_gemm.Gemm(product, cpu_gemm.bucket(rows), k, n, dtype, inference)
                    seconds = cpu_gemm.measure(gemm, rows=rows, rounds=args.repeats, budget_s=float("inf"))
                    cells = [f"{gemm.flops(rows) / seconds[kernel] / 1e9:,.0f}" if kernel in seconds else "–"
                             for kernel in cpu_gemm.KERNELS]
                    chosen = cpu_gemm.preferred(gemm)
                    if cpu_gemm.settled(gemm) is None:
                        chosen += " (proposed: real calls confirm it)"
                    chunks = cpu_gemm.row_chunks(rows, (k, n), torch.device("cpu"), dtype)
                    if product == "forward" and inference and chunks > 1:
                        split = chunked_seconds(rows, k, n, chunks, args.repeats)
                        chosen += f" / {gemm.flops(rows) / split / 1e9:,.0f} in {chunks} row chunks*"
                    print(f"| {dtype_name} | {shape_name} | {label} | {rows} | " + " | ".join(cells) + f" | {chosen} |",
                          flush=True)


if __name__ == "__main__":
    main()
