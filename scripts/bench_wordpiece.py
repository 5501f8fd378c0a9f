"""scratchbert's deterministic WordPiece trainer against the `tokenizers` library's, on this CPU.

Not a test. For each corpus, both trainers (`train_tokenizer(deterministic=True)` and
`deterministic=False`) learn a vocabulary from the same texts, twice, and the script prints:

  time      seconds per training, the median of the runs (alternating the two trainers);
  same      whether the trainer's two runs gave byte-identical vocabularies;
  only here tokens of the vocabulary that the other trainer's lacks (and, for scale, how
            many tokens two runs of the `tokenizers` trainer differ by);
  tok/word  WordPiece tokens per word on held-out text (lower is better) and the share of
            [UNK] tokens there (`tokenization.segmentation_stats`).

The corpora: the embedded default corpus (CPython's documentation, `pretrain`'s default,
4,096 tokens) and a larger real one, by default the 25,000 IMDB training reviews (32 MB,
../shared/data/imdb, BERT's 30,522 tokens), held-out text being the IMDB test reviews.

    python scripts/bench_wordpiece.py                       # both corpora: a few minutes
    python scripts/bench_wordpiece.py --quick               # default corpus + 5,000 reviews
    python scripts/bench_wordpiece.py --corpus 'corpus/*.txt' --vocab-size 8192

The `tokenizers` trainer uses every core it is given; scratchbert's is one Python thread.
Timings are noisy on a shared machine: compare figures from the same run.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

from scratchbert import ingestion
from scratchbert.tokenization import train_tokenizer
from scratchbert.training.pretraining.config import DEFAULT_VOCAB_SIZE
from scratchbert.tokenization import segmentation_stats

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TRAINERS = {"scratchbert": True, "tokenizers": False}  # name -> train_tokenizer(deterministic=...)


def cpu_name() -> str:
    """The CPU model as `lscpu` names it (platform.processor() is often empty on Linux)."""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown CPU"


def read_texts(source: str, limit: int | None) -> list[str]:
    """The documents of `source` (any form `ingestion.load_documents` reads), at most `limit`."""
    texts = []
    for row in ingestion.load_documents(source, streaming=True):
        texts.append(row["text"])
        if limit is not None and len(texts) == limit:
            break
    return texts


def bench(name: str, texts: list[str], held_out: list[str], vocab_size: int, runs: int) -> None:
    print(f"\n{name}: {len(texts):,} texts, {sum(map(len, texts)) / 1e6:.1f} M characters, vocab_size {vocab_size:,}")
    times: dict[str, list[float]] = {trainer: [] for trainer in TRAINERS}
    vocabs: dict[str, list[list[str]]] = {trainer: [] for trainer in TRAINERS}
    tokenizers = {}
    for _ in range(runs):
        for trainer, deterministic in TRAINERS.items():
            start = time.perf_counter()
            tokenizer = train_tokenizer(texts, vocab_size=vocab_size, show_progress=False, deterministic=deterministic)
            times[trainer].append(time.perf_counter() - start)
            vocab = tokenizer.get_vocab()
            vocabs[trainer].append(sorted(vocab, key=vocab.get))
            tokenizers[trainer] = tokenizer
    print(f"{'trainer':<12} {'time (s)':>9} {'tokens':>7} {'same':>5} {'only here':>10} {'tok/word':>9} {'[UNK]':>7}")
    for trainer, other in zip(TRAINERS, reversed(TRAINERS)):
        first = vocabs[trainer][0]
        same = all(vocab == first for vocab in vocabs[trainer])
        only_here = len(set(first) - set(vocabs[other][0]))
        stats = segmentation_stats(tokenizers[trainer], held_out)
        print(
            f"{trainer:<12} {statistics.median(times[trainer]):>9.2f} {len(first):>7,} {str(same):>5} "
            f"{only_here:>10,} {stats['tokens_per_word']:>9.4f} {stats['unknown_share']:>7.3%}"
        )
    if runs > 1:
        first, second = (set(vocab) for vocab in vocabs["tokenizers"][:2])
        print(f"two runs of the tokenizers trainer differ by {len(first - second):,} tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(SHARED_DATA / "imdb" / "train.jsonl.gz"), help="the larger corpus (default: IMDB train)")
    parser.add_argument("--held-out", default=str(SHARED_DATA / "imdb" / "test.jsonl.gz"), help="text to measure tokens per word on")
    parser.add_argument("--vocab-size", type=int, default=30522, help="vocabulary of the larger corpus (default: 30522, BERT's)")
    parser.add_argument("--held-out-texts", type=int, default=5000, help="held-out documents to tokenize (default: 5000)")
    parser.add_argument("--runs", type=int, default=2, help="trainings per trainer and corpus (default: 2)")
    parser.add_argument("--quick", action="store_true", help="only the first 5,000 documents of --corpus")
    args = parser.parse_args()

    print(f"CPU: {cpu_name()}, {len(os.sched_getaffinity(0))} cores available; shared machines give noisy times")
    held_out = read_texts(args.held_out, args.held_out_texts)
    bench("default corpus (CPython docs)", ingestion.default_corpus_documents(), held_out, DEFAULT_VOCAB_SIZE, args.runs)
    texts = read_texts(args.corpus, 5000 if args.quick else None)
    bench(args.corpus, texts, held_out, args.vocab_size, args.runs)


if __name__ == "__main__":
    main()
