"""Side-by-side speed and memory of scratchbert and transformers' BERT on a CUDA GPU.

The CPU's benchmark is scripts/bench.py; this is its GPU counterpart, small enough for a short
lease of a GPU machine. The same random bert-base weights go into scratchbert's and transformers'
`BertForPreTraining` (sdpa attention on both), and the two run interleaved in one process:

  inference  the encoder (`.bert`) on a full batch (64 x 128 tokens, no padding) and on a padded
             one (64 rows of 16 to 128 real tokens, padded to 128: scratchbert's padding-free path
             against transformers' padded attention), in fp32, under bf16 autocast, and with bf16
             weights;
  training   a pretraining step (MLM + NSP loss, backward, fused AdamW) on 32 x 128 and 8 x 512,
             fp32 and bf16 autocast, with the peak GPU memory of each side.

Each figure is the median of `--repeats` timings (CUDA events) after warm-up calls; ratios above 1
mean scratchbert is faster. fp32 matrix products use TF32 only if `--tf32` is given (torch's
default is full fp32).

    python scripts/bench_gpu.py --repeats 10 # about half a minute on an H200
    python scripts/bench_gpu.py --repeats 50 --tf32
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
import transformers

import scratchbert

BERT_BASE = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
MODES = {  # name: (autocast dtype or None, weights' dtype)
    "fp32": (None, torch.float32),
    "bf16 autocast": (torch.bfloat16, torch.float32),
    "bf16 weights": (None, torch.bfloat16),
}


def batch_of(lengths: list[int], width: int, vocab_size: int, seed: int) -> dict[str, torch.Tensor]:
    """Random ids with `lengths` real tokens per row, right-padded to `width`; sentence-pair token types."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1000, vocab_size, (len(lengths), width), generator=gen)
    attention_mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()  # (B, S)
    token_type_ids = (torch.arange(width)[None, :] >= torch.tensor(lengths)[:, None] // 2).long() * attention_mask
    return {"input_ids": input_ids * attention_mask, "attention_mask": attention_mask, "token_type_ids": token_type_ids}


def pretraining_labels(batch: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """15% of the real tokens as MLM labels, and an NSP label per row."""
    gen = torch.Generator().manual_seed(seed)
    chosen = (torch.rand(batch["input_ids"].shape, generator=gen) < 0.15) & batch["attention_mask"].bool()
    labels = torch.where(chosen, batch["input_ids"], torch.full_like(batch["input_ids"], -100))
    return {**batch, "labels": labels, "next_sentence_label": torch.randint(0, 2, (len(labels),), generator=gen)}


def median_ms(fn, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def autocast(dtype: torch.dtype | None):
    """Autocast to `dtype` on the GPU; no autocast for None."""
    return torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None)


def inference_call(model, batch, autocast_dtype):
    def run():
        with torch.inference_mode(), autocast(autocast_dtype):
            model.bert(**batch)

    return run


def training_call(model, batch, autocast_dtype):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    def step():
        with autocast(autocast_dtype):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def peak_memory_mib(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**20


def load(directory: Path, weights_dtype: torch.dtype, train: bool):
    """(scratchbert, transformers) BertForPreTraining from `directory` on the GPU, sdpa attention."""
    ours = scratchbert.ScratchBertForPreTraining.from_pretrained(directory, attn_implementation="sdpa")
    theirs = transformers.BertForPreTraining.from_pretrained(directory, attn_implementation="sdpa")
    return [m.to("cuda", weights_dtype).train(train) for m in (ours, theirs)]


def inference_rows(directory: Path, repeats: int) -> list[str]:
    full = batch_of([128] * 64, 128, BERT_BASE["vocab_size"], seed=0)
    lengths = torch.randint(16, 129, (64,), generator=torch.Generator().manual_seed(1)).tolist()
    padded = batch_of(lengths, 128, BERT_BASE["vocab_size"], seed=1)
    rows = []
    for mode, (autocast_dtype, weights_dtype) in MODES.items():
        ours, theirs = load(directory, weights_dtype, train=False)
        for name, batch in (("64 x 128 full", full), (f"64 x 128 padded ({sum(lengths)} real tokens)", padded)):
            batch = {k: v.cuda() for k, v in batch.items()}
            ours_ms = median_ms(inference_call(ours, batch, autocast_dtype), repeats)
            theirs_ms = median_ms(inference_call(theirs, batch, autocast_dtype), repeats)
            rows.append(f"| inference, {name} | {mode} | {ours_ms:.2f} | {theirs_ms:.2f} | {theirs_ms / ours_ms:.2f} | |")
        del ours, theirs
        torch.cuda.empty_cache()
    return rows


def training_rows(directory: Path, repeats: int) -> list[str]:
    rows = []
    for shape in ((32, 128), (8, 512)):
        batch = {k: v.cuda() for k, v in pretraining_labels(batch_of([shape[1]] * shape[0], shape[1], BERT_BASE["vocab_size"], 2), 3).items()}
        for mode in ("fp32", "bf16 autocast"):
            autocast_dtype, weights_dtype = MODES[mode]
            ours, theirs = load(directory, weights_dtype, train=True)
            ours_step, theirs_step = training_call(ours, batch, autocast_dtype), training_call(theirs, batch, autocast_dtype)
            memory = (peak_memory_mib(ours_step), peak_memory_mib(theirs_step))
            ours_ms, theirs_ms = median_ms(ours_step, repeats), median_ms(theirs_step, repeats)
            rows.append(
                f"| training step, {shape[0]} x {shape[1]} | {mode} | {ours_ms:.2f} | {theirs_ms:.2f} | {theirs_ms / ours_ms:.2f} "
                f"| {memory[0]:.0f} / {memory[1]:.0f} |"
            )
            del ours, theirs, ours_step, theirs_step
            torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=20, help="timed calls per side and row (median reported)")
    parser.add_argument("--tf32", action="store_true", help="let fp32 matrix products use TF32 tensor cores")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("no CUDA device: this benchmark times the GPU path (scripts/bench.py times the CPU)")
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    with tempfile.TemporaryDirectory() as workdir:
        torch.manual_seed(0)
        transformers.BertForPreTraining(transformers.BertConfig(**BERT_BASE)).save_pretrained(workdir)
        rows = inference_rows(Path(workdir), args.repeats) + training_rows(Path(workdir), args.repeats)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"bert-base geometry, random weights, TF32 {'on' if args.tf32 else 'off'}, median of {args.repeats}")
    print("| case | precision | scratchbert ms | transformers ms | speed-up | peak MiB (ours / theirs) |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
