"""Which fusion closes the gap to ONNX Runtime's fused BERT graph: eager post-ops or torch.compile?

bert-base geometry (12 layers, random weights), fp32 inference, 2 threads, interleaved, the median of
`--repeats`. Variants of the same scratchbert weights:

  plain            `cpu_kernels=False`: the model as modeling_scratchbert.py writes it
  fast, unfused    the CPU fast path (measured GEMM kernels, bmm attention) without post-ops
  fast             the CPU fast path as shipped: GELU and residual additions fused into oneDNN's
                   GEMM (`cpu_gemm.linear_post_op`)
  compiled         `torch.compile` of the plain model with inductor's freezing (constant weights,
                   oneDNN-packed linears and its own fusions), padded path, one graph per shape
  ONNX Runtime     transformers' BertModel exported and fused by onnxruntime's BERT optimizer (as
                   in scripts/bench.py), when onnxruntime is installed

    python scripts/bench_fusion.py                 # 3-6 minutes on 2 cores (compilation included)
    python scripts/bench_fusion.py --layers 2 --repeats 2
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402 -- the sibling script's batches, ONNX export and timing loop

from scratchbert.cpu_kernels import CpuAddNorm, CpuIntermediate  # noqa: E402


def unfused(model: torch.nn.Module) -> torch.nn.Module:
    """The fast path with its post-op modules turned back into the plain ones."""
    for module in model.modules():
        if type(module) in (CpuIntermediate, CpuAddNorm):
            module.__class__ = type(module).__bases__[0]
    return model


def compiled(model: torch.nn.Module, batch: dict[str, torch.Tensor]):
    """`torch.compile` with freezing, compiled on `batch` before timing; returns (runner, compile seconds)."""
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    fn = torch.compile(model, dynamic=False)
    started = time.perf_counter()
    with torch.no_grad():
        fn(**batch)
    return fn, time.perf_counter() - started


def runner(model, batch):
    def run():
        with torch.no_grad():
            model(**batch)
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=bench.NUM_THREADS)
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile column")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    geometry = dict(bench.BERT_BASE, num_hidden_layers=args.layers)
    print(f"bench_fusion: {args.layers} layers of bert-base width, fp32, {args.threads} threads, medians of {args.repeats}")
    print(f"  {bench.cpu_profile()}", flush=True)
    tokenizer = bench.bert_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        torch.manual_seed(0)
        transformers.BertForPreTraining(transformers.BertConfig(**geometry)).save_pretrained(workdir / "weights")
        ours, _ = bench.load_models(workdir / "weights", which="ours")
        fast = ours.bert.eval()
        variants = {
            "plain": copy.deepcopy(fast).use_cpu_kernels(False),
            "fast, unfused": unfused(copy.deepcopy(fast)),
            "fast": fast,
        }
        batches = {
            "full-length (16, 128)": bench.full_batch(16, 128, fast.config.vocab_size, seed=0),
            "novel sentences, padded to the longest": bench.padded_batch(
                tokenizer, bench.novel_sentences(32, seed=1), 128, longest=True),
        }
        session, note = None, bench.onnxruntime_missing()
        if note is None:
            session, note = bench.ort_encoder(workdir / "weights", workdir, fast.config, args.threads,
                                              batches["novel sentences, padded to the longest"])
        print(f"  ONNX Runtime: {note}", flush=True)

        names = [*variants, *([] if args.no_compile else ["compiled"]), *(["ONNX Runtime"] if session else [])]
        print()
        print("| batch | " + " | ".join(names) + " | fast vs ORT |")
        print("|---|" + "---|" * (len(names) + 1))
        for label, batch in batches.items():
            runners = [runner(model, batch) for model in variants.values()]
            compile_note = ""
            if not args.no_compile:
                fn, seconds = compiled(copy.deepcopy(variants["plain"]), batch)
                runners.append(runner(fn, batch))
                compile_note = f" (compiled in {seconds:.0f} s)"
            if session is not None:
                runners.append(bench.ort_runner(session, batch))
            times = bench.interleaved(runners, args.repeats)
            cells = [f"{t * 1e3:,.0f} ms" for t in times]
            vs_ort = f"{times[-1] / times[names.index('fast')]:.2f}x" if session is not None else "–"
            real = int(batch["attention_mask"].sum())
            print(f"| {label}, {real:,} real tokens{compile_note} | " + " | ".join(cells) + f" | {vs_ort} |", flush=True)
    print(f"\nCPU: {bench.cpu_profile()}; torch {torch.__version__}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
