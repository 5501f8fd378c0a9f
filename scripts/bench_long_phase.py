"""What `--long-phase` buys: masked-token accuracy at positions past the pretraining length.

Not a test. Two pretraining runs of the same model on the same text and steps, one on
--max-seq-length blocks throughout, one whose last --long-phase of the steps uses blocks of
--long-seq-length tokens. Each saved model then fills in BERT's 15% masks on held-out text packed
to --long-seq-length tokens (the same blocks and masks for both), and the accuracy is reported
per position range: below --max-seq-length both models were trained there; above it only the
long phase trained the position table.

    python scripts/bench_long_phase.py --text runs/imdb.txt --max-steps 1500 --out runs/long-phase

--text is a pretraining corpus (blank-line separated documents; e.g. `python scripts/bench_finetune.py
defaults --set imdb --write-corpus runs/imdb.txt`); its last --eval-documents documents are held out
of both runs. Name the CPU with the figures.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch

from scratchbert.inspection import load_masked_lm
from scratchbert.tokenization import train_tokenizer
from scratchbert.training.pretraining.examples import build_packed_dataset
from scratchbert.training.pretraining.masking import DataCollatorForPretraining


def split_corpus(text: Path, out: Path, eval_documents: int) -> tuple[Path, list[str]]:
    documents = [d for d in text.read_text(encoding="utf-8").split("\n\n") if d.strip()]
    train = out / "train.txt"
    train.write_text("\n\n".join(documents[:-eval_documents]) + "\n", encoding="utf-8")
    return train, documents[-eval_documents:]


def pretrain(args, train: Path, out: Path, long_phase: float) -> Path:
    run = out / f"long-{long_phase:g}"
    if not (run / "model.safetensors").exists():
        command = [
            sys.executable, "-m", "scratchbert", "pretrain", "--train-files", str(train), "--preset", args.preset,
            "--max-seq-length", str(args.max_seq_length), "--max-steps", str(args.max_steps),
            "--long-phase", str(long_phase), "--long-seq-length", str(args.long_seq_length), "--output-dir", str(run),
            "--report-to", "none", "--no-progress-bar", "--overwrite", "--seed", str(args.seed), "--tokenizer", str(args.tokenizer),
        ]  # fmt: skip
        subprocess.run(command, check=True)
    return run


@torch.no_grad()
def accuracy_by_position(model_dir: Path, documents: list[str], length: int, boundary: int, seed: int) -> dict[str, float]:
    model, tokenizer = load_masked_lm(model_dir)
    blocks = build_packed_dataset(documents, tokenizer, max_seq_length=length)
    collator = DataCollatorForPretraining(tokenizer, mlm_probability=0.15)
    collator.generator = torch.Generator().manual_seed(seed)  # the same masks for every model
    hits = {"below": [0, 0], "above": [0, 0]}
    for start in range(0, len(blocks), 16):
        batch = collator([blocks[i] for i in range(start, min(start + 16, len(blocks)))])
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # (B, S, V)
        masked = batch["labels"] != -100  # (B, S)
        correct = (logits.argmax(-1) == batch["labels"]) & masked
        below = torch.arange(length) < boundary  # (S,)
        for name, where in (("below", below), ("above", ~below)):
            hits[name][0] += int(correct[:, where].sum())
            hits[name][1] += int(masked[:, where].sum())
    return {name: right / max(total, 1) for name, (right, total) in hits.items()} | {"blocks": len(blocks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("runs/long-phase"))
    parser.add_argument("--tokenizer", type=Path, help="a saved tokenizer (default: one trained on the training text, shared by both runs)")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--max-steps", type=int, default=1500, help="steps of each run (steps, not minutes: the runs may share the CPU unevenly)")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--long-seq-length", type=int, default=256)
    parser.add_argument("--long-phase", type=float, default=0.1)
    parser.add_argument("--eval-documents", type=int, default=400)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    train, held_out = split_corpus(args.text, args.out, args.eval_documents)
    if args.tokenizer is None:
        args.tokenizer = args.out / "tokenizer"
        if not args.tokenizer.exists():
            train_tokenizer([str(train)], vocab_size=args.vocab_size, show_progress=False).save_pretrained(args.tokenizer)
    print(f"| --long-phase | held-out blocks of {args.long_seq_length} | MLM accuracy, positions < {args.max_seq_length} | positions >= {args.max_seq_length} |")
    print("|---|---|---|---|")
    for long_phase in (0.0, args.long_phase):
        scores = accuracy_by_position(pretrain(args, train, args.out, long_phase), held_out, args.long_seq_length, args.max_seq_length, args.seed)
        print(f"| {long_phase:g} | {scores['blocks']} | {scores['below']:.3f} | {scores['above']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
